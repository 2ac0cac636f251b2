#pragma once
// The one exception type Tandem's library code throws, and the helpers that build its messages.
// Messages are one line, name the input that is wrong, and say what was expected: binaries print
// them and exit non-zero.
//
// Example:
//   TANDEM_CHECK(rank < world_size, "RANK=", rank, " must be less than WORLD_SIZE=", world_size);
//   try { ... } catch (const std::exception& e) { std::fprintf(stderr, "%s\n", tandem::one_line(e).c_str()); }
#include <sstream>
#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The first line of any exception's message, without c10::Error's C++ backtrace.
std::string one_line(const std::exception& e);

/// The arguments streamed into one string: the message of TANDEM_CHECK.
template <typename... Args>
std::string message(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace tandem

/// Throws tandem::Error with the streamed arguments as its message when `condition` is false.
#define TANDEM_CHECK(condition, ...)                          \
  do {                                                        \
    if (!(condition)) throw ::tandem::Error(::tandem::message(__VA_ARGS__)); \
  } while (false)
