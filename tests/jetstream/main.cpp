// The doctest runner of the JetStream source tests (the test cases live in source_test.cpp).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
