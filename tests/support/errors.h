#pragma once
// Capturing the error a statement throws, to compare its message word for word.
#include <exception>
#include <string>

#include "tandem/error.h"

namespace tandem::test {

/// The one-line message of what `fn` throws; "(nothing thrown)" when it returns.
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return one_line(e);
  }
  return "(nothing thrown)";
}

}  // namespace tandem::test

/// EXPECT_ERROR(statement, "exact message"): the statement throws, with exactly this message.
#define EXPECT_ERROR(statement, expected) EXPECT_EQ(::tandem::test::error_of([&] { statement; }), expected)
/// EXPECT_ERROR_HAS(statement, "part"): the statement throws, and the message contains the part.
#define EXPECT_ERROR_HAS(statement, part) \
  EXPECT_THAT(::tandem::test::error_of([&] { statement; }), ::testing::HasSubstr(part))
