#include "comm/flight_recorder.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <c10/core/ScalarType.h>

#include "comm/nccl_backend.h"
#include "common/durable_io.h"

namespace tandem::comm::detail {
namespace {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

size_t capacity_from_env() {
  const char* value = std::getenv("TANDEM_FLIGHT_RECORDER_ENTRIES");
  if (!value || !*value) return 1000;
  const long n = std::strtol(value, nullptr, 10);
  return n > 0 ? static_cast<size_t>(n) : 1000;
}

// Tabs and newlines would break the line format: a space instead.
std::string field(std::string text) {
  for (char& c : text) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  return text.empty() ? "-" : text;
}

// The process's records and where they go.
struct Registry {
  std::mutex mutex;
  std::vector<std::weak_ptr<FlightRecord>> records;
  int rank = 0, world = 1;
  bool installed = false;
  bool failure_dumped = false;
  std::string failure_text;  // the failure's dump: a later SIGUSR1 writes it again, not a poorer one
  int wake[2] = {-1, -1};  // SIGUSR1 -> the dumping thread
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: signal handlers and on_exit use it
  return *r;
}

std::string dump_folder() {
  if (const char* dir = std::getenv("TANDEM_FLIGHT_RECORDER_DIR"); dir && *dir) return dir;
  const char* log = std::getenv("TANDEM_LOG_DIR");
  if (!log || !*log) return "";
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return std::string(log) + "/attempt_" + (restart && *restart ? restart : "0");
}

std::atomic<bool> in_signal_handler{false};  // a dump from a fatal signal queries no device

#if !defined(__SANITIZE_THREAD__)
std::atomic<bool> g_in_fatal{false};

void on_fatal_signal(int sig) {
  if (!g_in_fatal.exchange(true)) {
    in_signal_handler = true;
    // Best effort: not async-signal-safe, but the process is ending, and this is what says where.
    dump_flight_records(std::string("fatal signal ") + std::to_string(sig) + " (" + ::strsignal(sig) + ")", true);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}
#endif

void on_usr1(int) {
  const char byte = 1;
  const int fd = registry().wake[1];
  if (fd >= 0) (void)!::write(fd, &byte, 1);
}

void install_triggers() {
  Registry& r = registry();
  if (::pipe(r.wake) == 0) {
    ::fcntl(r.wake[1], F_SETFL, O_NONBLOCK);
    ::fcntl(r.wake[0], F_SETFD, FD_CLOEXEC);
    ::fcntl(r.wake[1], F_SETFD, FD_CLOEXEC);
    std::thread([fd = r.wake[0]] {
      char byte;
      while (::read(fd, &byte, 1) == 1) dump_flight_records("SIGUSR1");
    }).detach();
    struct sigaction usr1 {};
    usr1.sa_handler = on_usr1;
    sigemptyset(&usr1.sa_mask);
    usr1.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &usr1, nullptr);
    // Tells `tandem run` that SIGUSR1 asks this worker for its record (and does not kill it).
    const std::string folder = dump_folder();
    if (!folder.empty()) {
      const int fd = ::open((folder + "/flight_rank_" + std::to_string(r.rank) + ".armed").c_str(),
                            O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd >= 0) ::close(fd);
    }
  }
  // Fatal signals, where nobody else handles them (a sanitizer's handler stays). Not under
  // ThreadSanitizer, which reports the dump's lock in a signal handler as the error it would be
  // in a process that goes on (this one does not).
#if !defined(__SANITIZE_THREAD__)
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) {
    struct sigaction current {};
    if (::sigaction(sig, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) continue;
    struct sigaction fatal {};
    fatal.sa_handler = on_fatal_signal;
    sigemptyset(&fatal.sa_mask);
    fatal.sa_flags = SA_RESETHAND;
    ::sigaction(sig, &fatal, nullptr);
  }
#endif
  ::on_exit(
      [](int status, void*) {
        if (status != 0) dump_flight_records("exit status " + std::to_string(status), true);
      },
      nullptr);
}

}  // namespace

bool flight_recorder_enabled() {
  const char* value = std::getenv("TANDEM_FLIGHT_RECORDER");
  return !(value && (std::strcmp(value, "0") == 0 || std::strcmp(value, "off") == 0));
}

FlightRecord::FlightRecord(std::string group, std::vector<int> global_ranks, size_t capacity)
    : group_(std::move(group)), global_ranks_(std::move(global_ranks)), ring_(capacity) {}

uint64_t FlightRecord::issue(char kind, uint64_t seq, std::string op, int peer, const at::Tensor* tensor) {
  std::lock_guard<std::mutex> hold(mutex_);
  sweep_locked();  // a few event queries: what the device finished since the last operation
  const uint64_t id = next_++;
  Entry& e = ring_[id % ring_.size()];
  e = Entry{};
  e.id = id;
  e.kind = kind;
  e.seq = seq;
  e.op = std::move(op);
  e.peer = peer;
  if (tensor && tensor->defined()) {
    e.numel = tensor->numel();
    e.dtype = c10::toString(tensor->scalar_type());
  }
  e.issued_us = now_us();
  return id;
}

void FlightRecord::finish(uint64_t id, bool ok) {
  std::lock_guard<std::mutex> hold(mutex_);
  Entry& e = ring_[id % ring_.size()];
  if (e.id != id || e.state != State::Issued) return;
  e.state = ok ? State::Done : State::Failed;
  e.done_us = now_us();
}

// Note [Device completion]
// A NCCL collective's wait() only orders the current stream after it: the host goes on before the
// device has run it. Marking it done there would make a rank stuck in a collective on the device
// look finished in its dump, the one thing a dump must not get wrong. So a stream-waited operation
// stays "issued" until its work's CUDA event has fired, asked (never waited for) whenever the
// group issues another operation and before every dump that is not a fatal signal's, as PyTorch's
// NCCL watchdog asks its events for its own flight recorder.
void FlightRecord::finish_waited(uint64_t id, const c10::intrusive_ptr<c10d::Work>& work) {
  if (is_nccl_work(*work)) {
    finish_on_device(id, work);
  } else {
    finish(id, true);
  }
}

void FlightRecord::finish_on_device(uint64_t id, c10::intrusive_ptr<c10d::Work> work) {
  std::lock_guard<std::mutex> hold(mutex_);
  if (on_device_.size() >= ring_.size()) on_device_.erase(on_device_.begin());  // the ring moved past it
  on_device_.emplace_back(id, std::move(work));
  sweep_locked();
}

void FlightRecord::sweep() {
  std::lock_guard<std::mutex> hold(mutex_);
  sweep_locked();
}

void FlightRecord::sweep_locked() {
  for (auto it = on_device_.begin(); it != on_device_.end();) {
    bool finished = false, ok = true;
    try {
      finished = it->second->isCompleted();
      ok = !finished || it->second->isSuccess();
    } catch (const std::exception&) {
      finished = true;
      ok = false;
    }
    if (!finished) {
      ++it;
      continue;
    }
    Entry& e = ring_[it->first % ring_.size()];
    if (e.id == it->first && e.state == State::Issued) {
      e.state = ok ? State::Done : State::Failed;
      e.done_us = now_us();
    }
    it = on_device_.erase(it);
  }
}

void FlightRecord::write(std::string& out) const {
  std::lock_guard<std::mutex> hold(mutex_);
  out += "group\t" + field(group_) + "\t";
  for (size_t i = 0; i < global_ranks_.size(); ++i) out += (i ? "," : "") + std::to_string(global_ranks_[i]);
  out += "\n";
  const uint64_t first = next_ > ring_.size() ? next_ - ring_.size() : 0;
  for (uint64_t id = first; id < next_; ++id) {
    const Entry& e = ring_[id % ring_.size()];
    const char* state = e.state == State::Done ? "done" : e.state == State::Failed ? "failed" : "issued";
    out += std::string("op\t") + e.kind + "\t" + std::to_string(e.seq) + "\t" + field(e.op) + "\t" +
           std::to_string(e.peer) + "\t" + std::to_string(e.numel) + "\t" + field(e.dtype) + "\t" + state + "\t" +
           std::to_string(e.issued_us) + "\t" + std::to_string(e.done_us) + "\n";
  }
}

std::shared_ptr<FlightRecord> new_flight_record(const std::string& group, const std::vector<int>& global_ranks,
                                                int global_rank, int world_size) {
  if (!flight_recorder_enabled()) return nullptr;
  auto record = std::make_shared<FlightRecord>(group, global_ranks, capacity_from_env());
  Registry& r = registry();
  bool install = false;
  {
    std::lock_guard<std::mutex> hold(r.mutex);
    r.rank = global_rank;
    r.world = world_size;
    r.records.push_back(record);
    install = !r.installed;
    r.installed = true;
  }
  if (install) install_triggers();
  return record;
}

std::string dump_flight_records(const std::string& reason, bool first_failure_only) {
  Registry& r = registry();
  const std::string folder = dump_folder();
  if (folder.empty()) return "";
  std::string text;
  int rank = 0;
  {
    std::lock_guard<std::mutex> hold(r.mutex);
    if (first_failure_only && r.failure_dumped) return "";
    rank = r.rank;
    if (r.failure_dumped) {
      // A failure's record says more than one taken later (the process may be exiting, its groups
      // gone); written again, so that `tandem run` sees the rank answered its SIGUSR1.
      text = r.failure_text;
    } else {
      text = "tandem-flight-recorder\t1\nrank\t" + std::to_string(r.rank) + "\t" + std::to_string(r.world) + "\t" +
             std::to_string(::getpid()) + "\t" + field(reason) + "\n";
      size_t live = 0;
      for (auto it = r.records.begin(); it != r.records.end();) {
        if (auto record = it->lock()) {
          if (!in_signal_handler.load()) record->sweep();  // Note [Device completion]
          record->write(text);
          ++live;
          ++it;
        } else {
          it = r.records.erase(it);
        }
      }
      if (live == 0) return "";  // every group is gone: nothing to say, and nothing to overwrite
      if (first_failure_only) {
        r.failure_dumped = true;
        r.failure_text = text;
      }
    }
  }
  const std::string path = folder + "/flight_rank_" + std::to_string(rank) + ".txt";
  try {
    // Whole or absent, never half-written (a reader may come while a rank is being stopped).
    tandem::detail::write_file_durably(
        path, [&](int fd) { tandem::detail::write_all(fd, text.data(), text.size(), "flight recorder"); },
        "flight recorder");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: could not write the flight recorder's dump %s: %s\n", path.c_str(), e.what());
    return "";
  }
  return path;
}

}  // namespace tandem::comm::detail
