#include "tandem/comm/agreement.h"

#include <map>

#include <ATen/ATen.h>

#include "common/ranks_text.h"
#include "tandem/comm/process_group.h"
#include "tandem/error.h"

namespace tandem::comm {
namespace {

using tandem::detail::ranks_text;

// FNV-1a over the fields, names and values, each ended by a separator no value holds.
int64_t fingerprint(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 1);
}

std::string serialized(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string text;
  for (const auto& [name, value] : fields) text += name + '\x1f' + value + '\x1e';
  return text;
}

std::vector<std::pair<std::string, std::string>> parsed(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> fields;
  size_t at = 0;
  while (at < text.size()) {
    const size_t unit = text.find('\x1f', at), record = text.find('\x1e', at);
    if (unit == std::string::npos || record == std::string::npos || unit > record) break;
    fields.emplace_back(text.substr(at, unit - at), text.substr(unit + 1, record - unit - 1));
    at = record + 1;
  }
  return fields;
}

// Every rank's text, over the CPU backend: the lengths, then the bytes padded to the longest.
std::vector<std::string> gather_texts(ProcessGroup& group, const std::string& mine) {
  std::vector<int64_t> lengths;
  for (const auto& t : group.all_gather(at::full({1}, static_cast<int64_t>(mine.size()), at::kLong))) {
    lengths.push_back(t.item<int64_t>());
  }
  const int64_t longest = std::max<int64_t>(1, *std::max_element(lengths.begin(), lengths.end()));
  at::Tensor bytes = at::zeros({longest}, at::kByte);
  std::copy(mine.begin(), mine.end(), bytes.data_ptr<uint8_t>());
  std::vector<std::string> texts;
  const auto parts = group.all_gather(bytes);
  for (size_t r = 0; r < parts.size(); ++r) {
    const auto* data = parts[r].data_ptr<uint8_t>();
    texts.emplace_back(reinterpret_cast<const char*>(data), static_cast<size_t>(lengths[r]));
  }
  return texts;
}

}  // namespace

Agreement& Agreement::field(const std::string& name, const std::string& value) {
  fields_.emplace_back(name, value);
  return *this;
}

void Agreement::check(ProcessGroup& group) const {
  if (group.size() < 2) return;
  const std::string mine = serialized(fields_);
  std::vector<int64_t> prints;
  for (const auto& t : group.all_gather(at::full({1}, fingerprint(mine), at::kLong))) prints.push_back(t.item<int64_t>());
  if (std::all_of(prints.begin(), prints.end(), [&](int64_t p) { return p == prints.front(); })) return;
  // They differ: every rank takes every rank's fields, and all name the same first difference.
  const auto texts = gather_texts(group, mine);
  std::vector<std::vector<std::pair<std::string, std::string>>> all;
  for (const auto& t : texts) all.push_back(parsed(t));
  const std::string where = what_ + ": the ranks of " +
                            (group.is_subgroup() ? "group '" + group.name() + "'" : std::string("the world group")) +
                            " disagree on ";
  size_t most = 0;
  for (const auto& f : all) most = std::max(most, f.size());
  for (size_t i = 0; i < most; ++i) {
    std::map<std::string, std::vector<int>> by_value;  // "name=value" -> ranks
    std::vector<std::string> order;
    for (size_t r = 0; r < all.size(); ++r) {
      const std::string value = i < all[r].size() ? all[r][i].first + ": " + all[r][i].second : "(nothing)";
      if (!by_value.count(value)) order.push_back(value);
      by_value[value].push_back(static_cast<int>(r));
    }
    if (order.size() < 2) continue;
    // One field name on every rank: "its microbatches: 4 on ranks 0, 2; 8 on rank 1".
    std::string name = i < all[0].size() ? all[0][i].first : "";
    bool same_name = true;
    for (const auto& f : all) same_name = same_name && i < f.size() && f[i].first == name;
    std::string text = where + (same_name ? name : "what they set up") + ": ";
    for (size_t k = 0; k < order.size(); ++k) {
      std::string value = order[k];
      if (same_name) value = value.substr(name.size() + 2);
      text += (k ? "; " : "") + value + " on " + ranks_text(by_value[order[k]]);
    }
    throw Error(text);
  }
  throw Error(where + "their settings (same fields, different fingerprints: report this)");
}

}  // namespace tandem::comm
