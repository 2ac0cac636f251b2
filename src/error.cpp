#include "tandem/error.h"

#include <c10/util/Exception.h>

namespace tandem {

std::string one_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  auto start = text.find_first_not_of(" \n");
  if (start == std::string::npos) return "unknown error";
  auto end = text.find('\n', start);
  return text.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace tandem
