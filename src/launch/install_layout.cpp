#include "launch/install_layout.h"

#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tandem/error.h"

namespace tandem::launch {

std::string install_path(const std::string& relative) {
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  TANDEM_CHECK(n > 0, "cannot read /proc/self/exe: ", std::strerror(errno));
  std::string dir(self, static_cast<size_t>(n));
  dir = dir.substr(0, dir.rfind('/'));
  return dir + "/../" + relative;
}

}  // namespace tandem::launch
