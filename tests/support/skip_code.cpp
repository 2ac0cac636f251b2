#include "support/skip_code.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace tandem::test {

int with_skip_code(int run_all_tests_result) {
  const char* code = std::getenv("TANDEM_TEST_SKIP_CODE");
  if (!code || !*code || run_all_tests_result != 0) return run_all_tests_result;
  const auto* unit = ::testing::UnitTest::GetInstance();
  if (unit->failed_test_count() > 0 || unit->skipped_test_count() == 0) return run_all_tests_result;
  return std::atoi(code);
}

}  // namespace tandem::test
