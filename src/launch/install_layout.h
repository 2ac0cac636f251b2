#pragma once
// Where the parts of an installation are, found from the running `tandem` binary: bin/tandem
// beside libexec/tandem/ and share/tandem/, in the build tree and in an installed prefix alike.
#include <string>

namespace tandem::launch {

/// `relative` resolved against the directory above the running executable's ("bin/.."), e.g.
/// "libexec/tandem/tandem-torch". Throws tandem::Error when /proc/self/exe cannot be read.
std::string install_path(const std::string& relative);

}  // namespace tandem::launch
