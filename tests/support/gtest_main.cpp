// main() of the single-process GoogleTest binaries: GoogleTest's own, plus the skip code.
#include <gtest/gtest.h>

#include "support/skip_code.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return tandem::test::with_skip_code(RUN_ALL_TESTS());
}
