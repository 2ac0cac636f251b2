#include "tandem/ddp/failed_backward.h"

#include "tandem/error.h"

namespace tandem::ddp {

std::vector<std::string> exchange_after_failed_backward(comm::ProcessGroup& pg, const std::string& prefix,
                                                        const std::string& mine, const std::string& who) {
  auto store = pg.store();
  store->set(prefix + std::to_string(pg.rank()), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < pg.size(); ++r) keys.push_back(prefix + std::to_string(r));
  const auto timeout = pg.options().timeout();
  try {
    store->wait(keys, timeout);
  } catch (const std::exception&) {
    std::string absent;
    for (int r = 0; r < pg.size(); ++r) {
      if (r == pg.rank()) continue;  // our own key is there
      bool there = false;
      try {
        there = store->check({keys[static_cast<size_t>(r)]});
      } catch (const std::exception&) {
      }
      if (!there) absent += (absent.empty() ? "" : ", ") + std::to_string(r);
    }
    throw Error(message(who, ": backward failed on rank ", pg.rank(), ", but rank(s) ", absent,
                        " did not report a failed backward within ", timeout.count() / 1000,
                        " s: an exception in backward can be recovered from only when it happens on every rank"));
  }
  std::vector<std::string> posts;
  for (const auto& key : keys) {
    auto value = store->get(key);
    posts.emplace_back(value.begin(), value.end());
  }
  return posts;
}

}  // namespace tandem::ddp
