// Accelerator::get_state_dict: a prepared model's whole tensors, assembled from the boxes its
// layouts say each process holds (Note [Whole tensors from boxes]).
#include <algorithm>
#include <cstring>
#include <map>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "accelerate/send_to_main.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/error.h"

namespace tandem {
namespace {

// One box of a tensor, with where it sits in the whole (a 0-d tensor's: its one row).
struct Box {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape, offsets, sizes;
  at::Tensor data;  // contiguous CPU, `sizes`
};

// The boxes of one process as bytes: an 8-byte header length, the JSON header, the data in
// order. Both sides are this job's processes (one build), so the dtype travels as its number.
std::string pack(const std::vector<Box>& boxes) {
  nlohmann::json header = nlohmann::json::array();
  for (const Box& b : boxes) {
    header.push_back({{"name", b.name},
                      {"dtype", static_cast<int>(b.dtype)},
                      {"shape", b.shape},
                      {"offsets", b.offsets},
                      {"sizes", b.sizes}});
  }
  const std::string text = header.dump();
  std::string bytes(sizeof(uint64_t), '\0');
  const uint64_t length = text.size();
  std::memcpy(bytes.data(), &length, sizeof length);
  bytes += text;
  for (const Box& b : boxes) bytes.append(static_cast<const char*>(b.data.data_ptr()), b.data.nbytes());
  return bytes;
}

std::vector<Box> unpack(const std::string& bytes) {
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), sizeof length);
  const auto header = nlohmann::json::parse(bytes.substr(sizeof length, length));
  size_t at = sizeof length + length;
  std::vector<Box> boxes;
  for (const auto& entry : header) {
    Box b{entry["name"], static_cast<at::ScalarType>(entry["dtype"].get<int>()), entry["shape"], entry["offsets"],
          entry["sizes"], {}};
    b.data = at::empty(b.sizes, at::TensorOptions().dtype(b.dtype));
    TANDEM_CHECK(at + b.data.nbytes() <= bytes.size(), "get_state_dict: a process's pieces arrived cut short");
    std::memcpy(b.data.data_ptr(), bytes.data() + at, b.data.nbytes());
    at += b.data.nbytes();
    boxes.push_back(std::move(b));
  }
  return boxes;
}

}  // namespace

// Note [Whole tensors from boxes]
// Every process sends the main one the boxes it holds that count (Layout::counts: the first copy
// of each, so the boxes tile every tensor once), one process at a time (send_to_main: the main
// process never holds more than the result and one process's boxes); the main process places each
// box into its whole tensor, in the order the tensors first arrive (the main process's model's,
// then, under a pipeline, each later stage's). A whole tensor (DDP, one process) is one box, the
// main process's. No arithmetic touches the values: the result is bit for bit what the processes
// hold, in the dtype they keep it (FSDP's shards, float32 under mixed precision).
Accelerator::NamedTensors Accelerator::state_dict_of(const torch::nn::Module* owner, bool on_every_process) {
  std::optional<size_t> found;
  for (size_t m = 0; m < models_.size(); ++m) {
    if (models_[m].owner.get() == owner) found = m;
  }
  TANDEM_CHECK(found, "get_state_dict: this model was not prepared by this Accelerator (prepare_model or "
                      "prepare_pipeline)");
  // The model, or a pipeline's stages on this process (each stage's processes send theirs).
  std::vector<size_t> members{*found};
  if (models_[*found].stage) {
    members.clear();
    for (size_t m = 0; m < models_.size(); ++m) {
      if (models_[m].stage) members.push_back(m);
    }
  }
  auto build = [&] {
    std::vector<Box> boxes;
    for (auto& [slot, held] : counted_tensors(members)) {
      const comm::Layout& l = slot.layout;
      at::Tensor data = held.detach().to(at::kCPU).contiguous();
      boxes.push_back({slot.name, slot.dtype, l.shape, l.chunk.offsets, l.chunk.sizes, data.to(slot.dtype)});
    }
    return pack(boxes);
  };
  NamedTensors whole;
  std::map<std::string, size_t> index;
  std::vector<int64_t> placed;  // elements placed per tensor: each must be covered once
  auto place = [&](int, std::string bytes) {
    for (Box& b : unpack(bytes)) {
      auto it = index.find(b.name);
      if (it == index.end()) {
        it = index.emplace(b.name, whole.size()).first;
        whole.emplace_back(b.name, at::empty(b.shape, at::TensorOptions().dtype(b.dtype)));
        placed.push_back(0);
      }
      at::Tensor& t = whole[it->second].second;
      TANDEM_CHECK(t.sizes().vec() == b.shape && t.scalar_type() == b.dtype, "get_state_dict: two processes hold a '",
                   b.name, "' of different shapes or dtypes (pipeline stages must name their tensors apart)");
      at::Tensor rows = t.dim() == 0 ? t.view({1}) : t;
      comm::narrow_to(rows, comm::Chunk{b.offsets, b.sizes}).copy_(b.data.view(b.sizes));
      placed[it->second] += b.data.numel();
    }
  };
  accelerate::send_to_main(pg_, "get_state_dict", build, place);
  for (size_t i = 0; i < whole.size(); ++i) {
    TANDEM_CHECK(placed[i] == whole[i].second.numel(), "get_state_dict: the pieces of '", whole[i].first, "' cover ",
                 placed[i], " of its ", whole[i].second.numel(), " elements (pipeline stages must name their tensors "
                 "apart)");
  }
  if (!on_every_process || !pg_ || pg_->size() == 1) return is_main_process() ? whole : NamedTensors{};
  std::vector<Box> all;
  for (auto& [name, t] : whole) {
    all.push_back({name, t.scalar_type(), t.sizes().vec(), std::vector<int64_t>(t.dim(), 0), t.sizes().vec(), t});
  }
  NamedTensors everywhere;
  for (Box& b : unpack(accelerate::broadcast_from_main(*pg_, is_main_process() ? pack(all) : std::string()))) {
    everywhere.emplace_back(b.name, b.data.view(b.shape));
  }
  return everywhere;
}

}  // namespace tandem
