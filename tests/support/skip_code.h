#pragma once
// Skips decided by return code, not by matching output: with TANDEM_TEST_SKIP_CODE=N in the
// environment (tandem_gpu_test sets 77, ctest's SKIP_RETURN_CODE), a test binary whose selected
// tests all passed or skipped, at least one skipped, exits N. A failure keeps its own code, so a
// skip can never hide one.
namespace tandem::test {

/// RUN_ALL_TESTS()'s result, turned into the skip code where the rule above says so.
int with_skip_code(int run_all_tests_result);

}  // namespace tandem::test
