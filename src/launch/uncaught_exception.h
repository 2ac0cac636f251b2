#pragma once
// What a worker that died of SIGABRT said before: a C++ program whose exception nothing caught
// ends in std::terminate, which prints "terminate called after throwing an instance of 'T'" and
// "  what():  MESSAGE" (libstdc++'s verbose handler) and aborts. The launcher quotes MESSAGE in
// its failure line, so that "signal 6" is not all a user reads.
#include <optional>
#include <string>

namespace tandem::launch {

/// The message of the last uncaught exception reported in the log file `path` (its last 64 KiB);
/// nothing when there is none, or the file cannot be read.
std::optional<std::string> uncaught_exception_message(const std::string& path);

}  // namespace tandem::launch
