// The doctest runner of the HTTP source's unit tests (signature_test.cpp, ingest is covered end to end).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
