// `tandem run` end to end: real processes, real signals, and the process table as the oracle.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "tandem/comm/net.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Alive means in the process table and not a zombie.
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string line;
  std::getline(stat, line);
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

bool gone_within(pid_t pid, std::chrono::milliseconds limit) {
  auto end = Clock::now() + limit;
  while (alive(pid)) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tandem-launcher-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { (void)!std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// One `tandem run` child with its output captured to files.
class Launcher {
 public:
  Launcher(const TempDir& dir, std::vector<std::string> args, std::vector<std::string> env = {})
      : dir_(dir) {
    args.insert(args.begin(), {TANDEM_CLI, "run"});
    start_ = Clock::now();
    pid_ = ::fork();
    if (pid_ == 0) {
      int out = ::open((dir / "launcher.out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = ::open((dir / "launcher.err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, 1);
      ::dup2(err, 2);
      for (auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(126);
    }
  }
  // A failed test shows what the launcher said before its folder is removed (TempDir outlives
  // the Launcher): the checks themselves compare exit codes and files.
  ~Launcher() {
    if (!status_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (::testing::Test::HasFailure()) {
      std::fprintf(stderr, "===== tandem run's stdout\n%s===== tandem run's stderr\n%s=====\n", out().c_str(),
                   err().c_str());
    }
  }
  pid_t pid() const { return pid_; }

  /// Waits up to `limit`; returns the exit code (128+N for signal N), or -1 on time-out.
  int wait(std::chrono::milliseconds limit = 30s) {
    auto end = Clock::now() + limit;
    while (!status_) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = status;
        elapsed_ = Clock::now() - start_;
        break;
      }
      if (Clock::now() > end) return -1;
      std::this_thread::sleep_for(10ms);
    }
    return WIFEXITED(*status_) ? WEXITSTATUS(*status_) : 128 + WTERMSIG(*status_);
  }
  double seconds() const { return std::chrono::duration<double>(elapsed_).count(); }
  std::string out() const { return read_file(dir_ / "launcher.out"); }
  std::string err() const { return read_file(dir_ / "launcher.err"); }

 private:
  const TempDir& dir_;
  pid_t pid_ = -1;
  std::optional<int> status_;
  Clock::time_point start_;
  Clock::duration elapsed_{};
};

pid_t wait_for_pid(const std::string& path, std::chrono::milliseconds limit = 20s) {
  auto end = Clock::now() + limit;
  while (!exists(path)) {
    if (Clock::now() > end) return -1;
    std::this_thread::sleep_for(10ms);
  }
  return std::atoi(read_file(path).c_str());
}

std::vector<pid_t> worker_pids(const TempDir& dir, int n) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) pids.push_back(wait_for_pid(dir / ("rank_" + std::to_string(r) + ".pid")));
  return pids;
}

void expect_all_gone(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) {
    EXPECT_GT(p, 0);
    EXPECT_TRUE(gone_within(p, 1s)) << "pid " << p << " is still running";
  }
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(Launcher, GivesEachWorkerTheTorchrunEnvironmentAndPrefixedLogs) {
  TempDir dir;
  Launcher l(dir, {"--nproc-per-node", "2", "--log-dir", dir / "logs", "--", FAKE_WORKER, "ok", dir.path()});
  ASSERT_EQ(l.wait(), 0) << l.err();
  const std::string out = l.out();
  for (const char* line : {"[rank0]: RANK=0", "[rank1]: RANK=1", "[rank1]: LOCAL_RANK=1", "[rank0]: WORLD_SIZE=2",
                           "[rank1]: LOCAL_WORLD_SIZE=2", "[rank0]: GROUP_RANK=0", "[rank0]: MASTER_ADDR=127.0.0.1",
                           "[rank1]: TORCHELASTIC_RESTART_COUNT=0", "[rank0]: OMP_NUM_THREADS=1"}) {
    EXPECT_TRUE(contains(out, line)) << line << "\n" << out;
  }
  EXPECT_TRUE(contains(l.err(), "[rank1]: a line on stderr from rank 1"));
  // The log files hold the worker's bytes, unprefixed, one file per stream.
  EXPECT_TRUE(contains(read_file(dir / "logs/attempt_0/rank_1.stdout.log"), "\nRANK=1\n"));
  EXPECT_EQ(read_file(dir / "logs/attempt_0/rank_0.stderr.log"), "a line on stderr from rank 0\n");
}

TEST(Launcher, KeepsAUserOmpNumThreads) {
  TempDir dir;
  Launcher l(dir, {"--nproc-per-node", "2", "--", FAKE_WORKER, "ok", dir.path()}, {"OMP_NUM_THREADS=3"});
  ASSERT_EQ(l.wait(), 0);
  EXPECT_TRUE(contains(l.out(), "[rank1]: OMP_NUM_THREADS=3"));
}

// The other ranks sleep forever: the job ends only if the launcher stops them (wait's bound is a
// hang guard, not a speed check).
TEST(Launcher, ARankExitingWithCode3StopsTheOtherRanks) {
  TempDir dir;
  Launcher l(dir, {"--nproc-per-node", "3", "--log-dir", dir / "logs", "--", FAKE_WORKER, "exit-if-rank",
                   dir.path(), "1", "3"});
  auto pids = worker_pids(dir, 3);
  EXPECT_EQ(l.wait(10s), 1);
  EXPECT_TRUE(contains(l.err(), "rank 1 (local rank 1, pid " + std::to_string(pids[1]) +
                                    ") failed with exit code 3; its log: " + dir / "logs/attempt_0/rank_1.stderr.log"))
      << l.err();
  expect_all_gone(pids);
}

TEST(Launcher, ARankKilledBySigkillStopsTheJob) {
  TempDir dir;
  Launcher l(dir, {"--nproc-per-node", "2", "--", FAKE_WORKER, "kill-if-rank", dir.path(), "0", "0"});
  auto pids = worker_pids(dir, 2);
  EXPECT_EQ(l.wait(10s), 1);
  EXPECT_TRUE(contains(l.err(), "rank 0 (local rank 0, pid " + std::to_string(pids[0]) + ") failed with signal 9"))
      << l.err();
  expect_all_gone(pids);
}

// A program that lets an exception escape dies of SIGABRT with its message two lines up its log;
// the launcher's line quotes it.
TEST(Launcher, AnUncaughtExceptionIsQuotedInTheFailureLine) {
  TempDir dir;
  Launcher l(dir, {"--nproc-per-node", "2", "--", FAKE_WORKER, "throw-if-rank", dir.path(), "1"});
  auto pids = worker_pids(dir, 2);
  EXPECT_EQ(l.wait(10s), 1);
  EXPECT_TRUE(contains(l.err(), "job failed: rank 1 (local rank 1, pid " + std::to_string(pids[1]) +
                                    ") failed with signal 6 (Aborted): uncaught exception: prepare_pipeline: 3 "
                                    "microbatches over pp_size 4: too few; its log: "))
      << l.err();
  expect_all_gone(pids);
}

TEST(Launcher, MaxRestartsRestartsEveryWorkerWithTheRestartCount) {
  TempDir dir;
  Launcher l(dir, {"--nproc-per-node", "2", "--max-restarts", "1", "--", FAKE_WORKER, "fail-first-attempt", dir.path()});
  ASSERT_EQ(l.wait(), 0) << l.err();
  EXPECT_EQ(read_file(dir / "seen_0"), "1");
  EXPECT_EQ(read_file(dir / "seen_1"), "1");
  EXPECT_TRUE(contains(l.err(), "restarting all workers (restart 1 of 1)"));
}

TEST(Launcher, GivesUpWhenRestartsAreSpent) {
  TempDir dir;
  Launcher l(dir, {"--nproc-per-node", "2", "--max-restarts", "1", "--", FAKE_WORKER, "exit-if-rank", dir.path(), "0", "7"});
  EXPECT_EQ(l.wait(), 1);
  EXPECT_TRUE(contains(l.err(), "failed with exit code 7")) << l.err();
  EXPECT_TRUE(contains(l.err(), "(after 1 restarts)")) << l.err();
}

TEST(Launcher, SigtermToTheLauncherEndsEveryWorker) {
  TempDir dir;
  Launcher l(dir, {"--nproc-per-node", "2", "--", FAKE_WORKER, "spawn-child", dir.path()});
  auto pids = worker_pids(dir, 2);
  pids.push_back(wait_for_pid(dir / "child_0.pid"));
  pids.push_back(wait_for_pid(dir / "child_1.pid"));
  ::kill(l.pid(), SIGTERM);
  EXPECT_EQ(l.wait(5s), 128 + SIGTERM);
  expect_all_gone(pids);  // the workers' own children too: signals go to process groups
}

TEST(Launcher, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
  TempDir dir;
  Launcher l(dir, {"--nproc-per-node", "2", "--grace-period", "1", "--", FAKE_WORKER, "ignore-term", dir.path()});
  auto pids = worker_pids(dir, 2);
  wait_for_pid(dir / "ignoring_0");
  wait_for_pid(dir / "ignoring_1");
  ::kill(l.pid(), SIGINT);
  EXPECT_EQ(l.wait(5s), 128 + SIGINT);
  // A lower bound (the grace period was honoured before SIGKILL), not a speed check: a slow
  // machine cannot fail it.
  EXPECT_GE(l.seconds(), 1.0);
  expect_all_gone(pids);
}

TEST(Launcher, ASecondSignalKillsAtOnce) {
  TempDir dir;
  Launcher l(dir, {"--nproc-per-node", "2", "--grace-period", "60", "--", FAKE_WORKER, "ignore-term", dir.path()});
  auto pids = worker_pids(dir, 2);
  wait_for_pid(dir / "ignoring_0");
  wait_for_pid(dir / "ignoring_1");
  ::kill(l.pid(), SIGTERM);
  std::this_thread::sleep_for(200ms);
  ::kill(l.pid(), SIGTERM);
  EXPECT_EQ(l.wait(5s), 128 + SIGTERM);
  expect_all_gone(pids);
}

TEST(Launcher, WorkersDieWithALauncherKilledBySigkill) {
  TempDir dir;
  Launcher l(dir, {"--nproc-per-node", "2", "--", FAKE_WORKER, "sleep", dir.path()});
  auto pids = worker_pids(dir, 2);
  ::kill(l.pid(), SIGKILL);
  EXPECT_EQ(l.wait(5s), 128 + SIGKILL);
  expect_all_gone(pids);
}

TEST(Launcher, AnEscapedDescendantHoldingTheOutputDoesNotHangTheLauncher) {
  TempDir dir;
  Launcher l(dir, {"--nproc-per-node", "1", "--", FAKE_WORKER, "escape-child", dir.path()});
  pid_t escaped = wait_for_pid(dir / "escaped_0.pid");
  EXPECT_EQ(l.wait(10s), 0);  // the escaped child sleeps forever holding the output: not waited for
  if (escaped > 0) ::kill(escaped, SIGKILL);  // it left our process group on purpose
}

TEST(Launcher, ABusyExplicitPortIsAClearError) {
  TempDir dir;
  int port = tandem::comm::pick_free_port();
  int held = tandem::comm::listen_on("127.0.0.1", port);
  Launcher l(dir, {"--nproc-per-node", "2", "--master-port", std::to_string(port), "--", FAKE_WORKER, "ok", dir.path()});
  EXPECT_EQ(l.wait(), 2);
  EXPECT_EQ(l.err(), "tandem: --master-port " + std::to_string(port) +
                         " is busy on 127.0.0.1: another process holds it; choose another port or omit "
                         "--master-port to pick a free one\n");
  EXPECT_FALSE(exists(dir / "rank_0.pid"));
  ::close(held);
}

struct BadRun {
  const char* name;
  std::vector<std::string> args;
  const char* message;
};

void PrintTo(const BadRun& run, std::ostream* out) { *out << run.name; }

class LauncherRejects : public ::testing::TestWithParam<BadRun> {};

TEST_P(LauncherRejects, BeforeStartingAnything) {
  TempDir dir;
  std::vector<std::string> args = GetParam().args;
  for (auto& a : args) if (a == "DIR") a = dir.path();
  Launcher l(dir, args);
  EXPECT_EQ(l.wait(), 2);
  EXPECT_EQ(l.err(), std::string("tandem: ") + GetParam().message + "\n");
  EXPECT_FALSE(exists(dir / "rank_0.pid"));
}

INSTANTIATE_TEST_SUITE_P(
    Table, LauncherRejects,
    ::testing::Values(
        BadRun{"NprocZero", {"--nproc-per-node", "0", "--", FAKE_WORKER, "ok", "DIR"},
               "--nproc-per-node '0' is not valid: expected a positive number, gpu, cpu or auto"},
        BadRun{"NprocNegative", {"--nproc-per-node", "-2", "--", FAKE_WORKER, "ok", "DIR"},
               "--nproc-per-node '-2' is not valid: expected a positive number, gpu, cpu or auto"},
        BadRun{"NodeRankTooLarge",
               {"--nnodes", "2", "--node-rank", "2", "--master-addr", "127.0.0.1", "--master-port", "29999", "--",
                FAKE_WORKER, "ok", "DIR"},
               "--node-rank 2 is not valid: expected 0..1 for --nnodes 2"},
        BadRun{"MissingProgram", {"--nproc-per-node", "2", "--", "/nonexistent/train"},
               "worker program '/nonexistent/train' does not exist"},
        BadRun{"NotExecutable", {"--", LAUNCHER_TEST_SOURCE}, "worker program '" LAUNCHER_TEST_SOURCE "' is not executable"},
        BadRun{"NotOnPath", {"--", "tandem-no-such-worker"}, "worker program 'tandem-no-such-worker' not found on PATH"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Launcher, AnUnknownFlagIsAUsageError) {
  TempDir dir;
  Launcher l(dir, {"--nprocs", "2", "--", FAKE_WORKER, "ok", dir.path()});
  EXPECT_EQ(l.wait(), 2);
  EXPECT_TRUE(contains(l.err(), "tandem: ")) << l.err();
}

TEST(Launcher, AWorkerDyingBeforeRendezvousEndsTheJob) {
  TempDir dir;
  Launcher l(dir, {"--nproc-per-node", "2", "--", COLLECTIVES_WORKER}, {"TANDEM_TEST_DIE_BEFORE_RENDEZVOUS=1"});
  EXPECT_EQ(l.wait(20s), 1);
  EXPECT_TRUE(contains(l.err(), "rank 1 (local rank 1, pid ")) << l.err();
  EXPECT_TRUE(contains(l.err(), "failed with exit code 5")) << l.err();
}
