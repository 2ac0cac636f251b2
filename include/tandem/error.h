#pragma once
// The one exception type Tandem's library code throws. Messages are one line, name the input
// that is wrong, and say what was expected: binaries print them and exit non-zero.
#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace tandem
