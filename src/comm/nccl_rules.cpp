#include "comm/nccl_rules.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>

#include <ATen/ATen.h>

#include "tandem/error.h"

namespace tandem::comm::detail {

// Note [Send tokens]
// Rule 2 (a send completes only once its receive is posted) on backends that buffer: when a
// batch starts, it sends a one-byte token to the peer of each of its receives ("posted"), and
// each of its sends first waits for its peer's token. Tokens and data each have a tag of their
// own on the backend, and since a group's items run one at a time in issue order on both sides,
// the n-th token and the n-th message between two ranks belong to the same pair of operations:
// the caller's tags are not used at all (rule 1).
namespace {
constexpr int kDataTag = 0;
constexpr int kTokenTag = 1;

std::string ms_text(std::chrono::milliseconds timeout) { return std::to_string(timeout.count()) + " ms"; }
}  // namespace

bool nccl_rules_from_env() {
  const char* value = std::getenv("TANDEM_NCCL_RULES");
  if (!value || !*value) return false;
  std::string lower = value;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "1" || lower == "on" || lower == "true") return true;
  if (lower == "0" || lower == "off" || lower == "false") return false;
  throw Error("TANDEM_NCCL_RULES='" + std::string(value) + "' is not a switch: use 1 or 0");
}

// A queued operation's work: finished by the stream's thread. Its wait ignores the caller's
// timeout: every item ends within the stream's own (the one running times out, and the ones queued
// behind a failed one fail at once), and a caller's clock racing the stream's would replace the
// stream's error, which names what waited, with a bare "timed out".
class StrictStream::Item : public c10d::Work {
 public:
  void done(std::exception_ptr failure) { finish(std::move(failure)); }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return c10d::Work::wait(kNoTimeout); }
};

StrictStream::StrictStream(std::string what, std::chrono::milliseconds timeout)
    : what_(std::move(what)), timeout_(timeout), thread_([this] { run(); }) {}

StrictStream::~StrictStream() {
  {
    std::lock_guard<std::mutex> hold(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  thread_.join();
}

void StrictStream::run() {
  for (;;) {
    std::pair<std::function<void()>, c10::intrusive_ptr<Item>> next;
    {
      std::unique_lock<std::mutex> hold(mutex_);
      ready_.wait(hold, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      next = std::move(queue_.front());
      queue_.pop_front();
      if (stopping_ && broken_.empty()) broken_ = what_ + " was destroyed with operations still queued";
    }
    std::string broken;
    {
      std::lock_guard<std::mutex> hold(mutex_);
      broken = broken_;
    }
    if (!broken.empty()) {
      next.second->done(std::make_exception_ptr(Error("an earlier operation on " + what_ + " failed: " + broken)));
      continue;
    }
    try {
      next.first();
      next.second->done(nullptr);
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> hold(mutex_);
        broken_ = one_line(e);
      }
      next.second->done(std::make_exception_ptr(Error("under NCCL's rules (TANDEM_NCCL_RULES): " + one_line(e))));
    }
  }
}

c10::intrusive_ptr<c10d::Work> StrictStream::submit(std::function<c10::intrusive_ptr<c10d::Work>()> start) {
  auto item = c10::make_intrusive<Item>();
  const auto timeout = timeout_;
  {
    std::lock_guard<std::mutex> hold(mutex_);
    queue_.emplace_back([start = std::move(start), timeout] { start()->wait(timeout); }, item);
  }
  ready_.notify_one();
  return item;
}

c10::intrusive_ptr<c10d::Work> StrictStream::submit_batch(const c10::intrusive_ptr<c10d::Backend>& backend,
                                                         std::vector<P2P> ops) {
  auto item = c10::make_intrusive<Item>();
  const auto timeout = timeout_;
  auto batch = [backend, ops = std::move(ops), timeout]() mutable {
    const bool alone = ops.size() == 1;
    auto named = [&](const P2P& op, const std::string& text) { return alone ? text : op.what + ": " + text; };
    // Note [Send tokens]: every receive is posted, and says so to its peer; the sends to each peer
    // go in their order, each once its own token has come, and the peers' chains run side by side
    // (the operations of a batch do not wait for each other: a batch may send a header and its
    // values, whose receives the peer posts one after the other). A Gloo work says it is complete
    // only once waited for, so each chain waits on a thread of its own.
    std::vector<c10::intrusive_ptr<c10d::Work>> data(ops.size()), posted;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].send) continue;
      std::vector<at::Tensor> one{ops[i].tensor};
      data[i] = backend->recv(one, ops[i].peer, kDataTag);
      std::vector<at::Tensor> token{at::ones({1}, at::kByte)};
      posted.push_back(backend->send(token, ops[i].peer, kTokenTag));
    }
    std::map<int, std::vector<size_t>> sends_to;  // peer -> its sends, in issue order
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].send) sends_to[ops[i].peer].push_back(i);
    }
    std::vector<std::thread> chains;
    std::vector<std::exception_ptr> failed(sends_to.size());
    size_t c = 0;
    for (auto& [peer, indices] : sends_to) {
      chains.emplace_back([&, peer = peer, indices = indices, slot = c++] {
        try {
          for (size_t i : indices) {
            std::vector<at::Tensor> token{at::zeros({1}, at::kByte)};
            try {
              backend->recv(token, peer, kTokenTag)->wait(timeout);
            } catch (const std::exception& e) {
              throw Error(named(ops[i], "its receive was not posted within " + ms_text(timeout) +
                                            " (a send completes only once its receive is posted: the peer waits "
                                            "elsewhere, likely in a send of its own queued before that receive; "
                                            "issue the two as one batch_isend_irecv) (" + one_line(e) + ")"));
            }
            std::vector<at::Tensor> one{ops[i].tensor};
            data[i] = backend->send(one, peer, kDataTag);
          }
        } catch (...) {
          failed[slot] = std::current_exception();
        }
      });
    }
    for (auto& t : chains) t.join();
    for (auto& f : failed) {
      if (f) std::rethrow_exception(f);
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      try {
        data[i]->wait(timeout);
      } catch (const std::exception& e) {
        throw Error(named(ops[i], one_line(e)));
      }
    }
    for (auto& w : posted) w->wait(timeout);
  };
  {
    std::lock_guard<std::mutex> hold(mutex_);
    queue_.emplace_back(std::move(batch), item);
  }
  ready_.notify_one();
  return item;
}

}  // namespace tandem::comm::detail
