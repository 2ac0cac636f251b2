// A worker for the launcher tests, without LibTorch so it starts instantly.
// Usage: fake_worker MODE DIR [ARGS]. Every mode first writes its pid to DIR/rank_<RANK>.pid.
//   ok                    print the torchrun variables, exit 0
//   exit-if-rank R CODE   rank R exits with CODE after 0.5 s; the others sleep until killed
//   kill-if-rank R        rank R sends itself SIGKILL after 0.5 s; the others sleep
//   throw-if-rank R       rank R throws an exception nothing catches after 0.5 s (std::terminate:
//                         "terminate called after throwing ...", then SIGABRT); the others sleep
//   fail-first-attempt    rank 1 exits 1 on attempt 0; every rank writes DIR/seen_<RANK> with
//                         TORCHELASTIC_RESTART_COUNT and exits 0 on later attempts
//   sleep                 sleep until killed
//   ignore-term           ignore SIGTERM and SIGINT, sleep until killed
//   spawn-child           start a child (pid in DIR/child_<RANK>.pid) that sleeps; both sleep
//   escape-child          start a child that leaves the process group (setsid) holding stdout
//                         open (pid in DIR/escaped_<RANK>.pid), then exit 0
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path + ".tmp") << text;
  std::rename((path + ".tmp").c_str(), path.c_str());  // readers never see half a file
}

[[noreturn]] void sleep_forever() {
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: fake_worker MODE DIR [ARGS]\n");
    return 64;
  }
  const std::string mode = argv[1], dir = argv[2];
  const int rank = std::atoi(env("RANK").c_str());
  write_file(dir + "/rank_" + std::to_string(rank) + ".pid", std::to_string(::getpid()));
  std::printf("rank %d of %s starting mode %s\n", rank, env("WORLD_SIZE").c_str(), mode.c_str());
  std::fflush(stdout);

  if (mode == "ok") {
    for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                             "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                             "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS"}) {
      std::printf("%s=%s\n", name, env(name).c_str());
    }
    std::fprintf(stderr, "a line on stderr from rank %d\n", rank);
    return 0;
  }
  if (mode == "exit-if-rank" || mode == "kill-if-rank") {
    if (rank == std::atoi(argv[3])) {
      ::usleep(500000);
      std::fprintf(stderr, "rank %d failing on purpose\n", rank);
      if (mode == "kill-if-rank") ::raise(SIGKILL);
      return std::atoi(argv[4]);
    }
    sleep_forever();
  }
  if (mode == "throw-if-rank") {
    if (rank == std::atoi(argv[3])) {
      ::usleep(500000);
      throw std::runtime_error("prepare_pipeline: 3 microbatches over pp_size 4: too few");
    }
    sleep_forever();
  }
  if (mode == "fail-first-attempt") {
    const std::string count = env("TORCHELASTIC_RESTART_COUNT");
    if (count == "0" && rank == 1) {
      ::usleep(200000);
      return 1;
    }
    if (count != "0") write_file(dir + "/seen_" + std::to_string(rank), count);
    return 0;
  }
  if (mode == "sleep") sleep_forever();
  if (mode == "ignore-term") {
    ::signal(SIGTERM, SIG_IGN);
    ::signal(SIGINT, SIG_IGN);
    write_file(dir + "/ignoring_" + std::to_string(rank), "1");
    sleep_forever();
  }
  if (mode == "spawn-child") {
    pid_t child = ::fork();
    if (child == 0) sleep_forever();
    write_file(dir + "/child_" + std::to_string(rank) + ".pid", std::to_string(child));
    sleep_forever();
  }
  if (mode == "escape-child") {
    pid_t child = ::fork();
    if (child == 0) {
      ::setsid();
      sleep_forever();
    }
    write_file(dir + "/escaped_" + std::to_string(rank) + ".pid", std::to_string(child));
    return 0;
  }
  std::fprintf(stderr, "fake_worker: unknown mode %s\n", mode.c_str());
  return 64;
}
