#include "launch/uncaught_exception.h"

#include <fstream>
#include <sstream>

namespace tandem::launch {

std::optional<std::string> uncaught_exception_message(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  constexpr std::streamoff kTail = 64 * 1024;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(size > kTail ? size - kTail : 0);
  std::ostringstream text;
  text << in.rdbuf();
  const std::string tail = text.str();
  const auto terminate = tail.rfind("terminate called after throwing an instance of");
  if (terminate == std::string::npos) return std::nullopt;
  static const std::string kWhat = "  what():  ";
  const auto what = tail.find(kWhat, terminate);
  if (what == std::string::npos) return std::nullopt;
  const auto begin = what + kWhat.size();
  const auto end = tail.find('\n', begin);
  std::string message = tail.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  if (message.empty()) return std::nullopt;
  return message;
}

}  // namespace tandem::launch
