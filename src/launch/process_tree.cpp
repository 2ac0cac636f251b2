#include "launch/process_tree.h"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "tandem/error.h"

namespace tandem::launch {
namespace {

struct Proc {
  pid_t pid;
  bool zombie;
};

// parent pid -> its children, zombies included (they still need reaping).
std::multimap<pid_t, Proc> children_by_parent() {
  std::multimap<pid_t, Proc> tree;
  DIR* proc = ::opendir("/proc");
  if (!proc) return tree;
  while (dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end) continue;
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    std::FILE* f = std::fopen(path, "r");
    if (!f) continue;  // gone meanwhile
    char buffer[1024];
    const size_t n = std::fread(buffer, 1, sizeof(buffer) - 1, f);
    std::fclose(f);
    buffer[n] = '\0';
    // "pid (comm) state ppid ...": comm may hold spaces and ')', so read after the last ')'.
    const char* close = std::strrchr(buffer, ')');
    char state = 0;
    long ppid = 0;
    if (close && std::sscanf(close + 1, " %c %ld", &state, &ppid) == 2) {
      tree.emplace(static_cast<pid_t>(ppid), Proc{static_cast<pid_t>(pid), state == 'Z'});
    }
  }
  ::closedir(proc);
  return tree;
}

}  // namespace

void become_subreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    throw Error(std::string("cannot become a child subreaper (prctl): ") + std::strerror(errno));
  }
}

// The descendants of root, parents first.
std::vector<Proc> below(pid_t root) {
  const auto tree = children_by_parent();
  std::vector<Proc> out{Proc{root, false}};
  for (size_t i = 0; i < out.size(); ++i) {
    auto [a, b] = tree.equal_range(out[i].pid);
    for (auto it = a; it != b; ++it) out.push_back(it->second);
  }
  out.erase(out.begin());
  return out;
}

std::vector<pid_t> descendants_of(pid_t root) {
  std::vector<pid_t> out;
  for (const Proc& p : below(root)) {
    if (!p.zombie) out.push_back(p.pid);
  }
  return out;
}

std::vector<pid_t> children_of(pid_t root) {
  const auto tree = children_by_parent();
  std::vector<pid_t> out;
  auto [a, b] = tree.equal_range(root);
  for (auto it = a; it != b; ++it) {
    if (!it->second.zombie) out.push_back(it->second.pid);
  }
  return out;
}

void reap_children_except(pid_t keep) {
  const auto tree = children_by_parent();
  auto [a, b] = tree.equal_range(::getpid());
  for (auto it = a; it != b; ++it) {
    if (it->second.pid == keep || !it->second.zombie) continue;
    int status = 0;
    ::waitpid(it->second.pid, &status, WNOHANG);
  }
}

int kill_descendants_except(pid_t keep, int limit_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
  int killed = 0;
  for (;;) {
    reap_children_except(keep);
    bool left = false;
    for (pid_t pid : descendants_of(::getpid())) {
      left = true;
      if (::kill(pid, SIGKILL) == 0 && pid != keep) ++killed;
    }
    if (!left || std::chrono::steady_clock::now() >= deadline) return killed;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    reap_children_except(keep);
  }
}

}  // namespace tandem::launch
