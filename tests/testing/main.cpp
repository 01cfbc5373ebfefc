// The doctest runner of the chaos test kit's tests (the test cases live in the *_test.cpp files).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
