#include "tandem/pp/stage.h"

#include <string>

#include <ATen/ATen.h>

#include "tandem/error.h"

namespace tandem::pp {

namespace {

// Note [Activation header]
// The next stage cannot know an activation's shape before it arrives (the last microbatch may be
// smaller, a stage may change the shape), so each activation is two messages: a header of
// kHeaderLength int64 (rank, dtype, then the sizes) and the values. Gradients need none: they
// come back in the shape of the activation the stage sent.
constexpr int64_t kMaxDims = 8;
constexpr int64_t kHeaderLength = 2 + kMaxDims;

c10::Device device_of(const comm::ProcessGroup& group) {
  if (group.has_nccl()) {
    if (auto device = group.cuda_device()) return *device;
  }
  return c10::Device(c10::kCPU);
}

}  // namespace

Stage::Stage(std::shared_ptr<torch::nn::Module> module, std::function<at::Tensor(const at::Tensor&)> forward, int index,
             int num_stages, Group group)
    : module_(std::move(module)),
      forward_(std::move(forward)),
      index_(index),
      num_stages_(num_stages),
      group_(std::move(group)) {
  TANDEM_CHECK(module_ && forward_, "pp: a stage needs a module");
  TANDEM_CHECK(group_, "pp: a stage needs a process group");
  TANDEM_CHECK(num_stages_ >= 1 && index_ >= 0 && index_ < num_stages_, "pp: stage ", index_, " of ", num_stages_,
               " does not exist (stages are numbered 0 to ", num_stages_ - 1, ")");
  TANDEM_CHECK(group_->size() == num_stages_, "pp: ", num_stages_, " stages need a pipeline group of ", num_stages_,
               " processes, one per stage; this one has ", group_->size());
  TANDEM_CHECK(group_->rank() == index_, "pp: stage ", index_, " runs on rank ", index_,
               " of its pipeline group, but this process is rank ", group_->rank());
}

void Stage::send_activation(const at::Tensor& activation) {
  TANDEM_CHECK(!is_last(), "pp: the last stage has no next stage to send to");
  TANDEM_CHECK(activation.dim() <= kMaxDims, "pp: an activation of ", activation.dim(), " dimensions (at most ",
               kMaxDims, ")");
  at::Tensor values = activation.detach().contiguous();
  at::Tensor header = at::zeros({kHeaderLength}, at::TensorOptions().dtype(at::kLong).device(values.device()));
  std::vector<int64_t> fields{values.dim(), static_cast<int64_t>(values.scalar_type())};
  for (int64_t d = 0; d < values.dim(); ++d) fields.push_back(values.size(d));
  header.narrow(0, 0, static_cast<int64_t>(fields.size()))
      .copy_(at::tensor(fields, at::kLong));
  sends_.emplace_back(group_->isend(header, index_ + 1), header);
  sends_.emplace_back(group_->isend(values, index_ + 1), values);
}

at::Tensor Stage::recv_activation() {
  TANDEM_CHECK(!is_first(), "pp: the first stage has no previous stage to receive from");
  const c10::Device device = device_of(*group_);
  at::Tensor header = at::empty({kHeaderLength}, at::TensorOptions().dtype(at::kLong).device(device));
  group_->recv(header, index_ - 1);
  const at::Tensor fields = header.cpu();
  const int64_t dims = fields[0].item<int64_t>();
  TANDEM_CHECK(dims >= 0 && dims <= kMaxDims, "pp: stage ", index_, " received a malformed activation header (",
               dims, " dimensions)");
  std::vector<int64_t> sizes;
  for (int64_t d = 0; d < dims; ++d) sizes.push_back(fields[2 + d].item<int64_t>());
  const auto dtype = static_cast<at::ScalarType>(fields[1].item<int64_t>());
  at::Tensor values = at::empty(sizes, at::TensorOptions().dtype(dtype).device(device));
  group_->recv(values, index_ - 1);
  return values;
}

void Stage::send_gradient(const at::Tensor& grad) {
  TANDEM_CHECK(!is_first(), "pp: the first stage has no previous stage to send a gradient to");
  at::Tensor values = grad.detach().contiguous();
  sends_.emplace_back(group_->isend(values, index_ - 1), values);
}

at::Tensor Stage::recv_gradient(const at::Tensor& like) {
  TANDEM_CHECK(!is_last(), "pp: the last stage has no next stage to receive a gradient from");
  at::Tensor values = at::empty(like.sizes(), like.options().device(device_of(*group_)));
  group_->recv(values, index_ + 1);
  return values.to(like.device());
}

// Note [The first failed stage]
// When one stage fails, its neighbours fail next: their receives from it break when its process
// exits, and theirs break the next ones'. The launcher reports whichever process it reaps first,
// so the stage that failed first must be named in every stage's line. A failing stage records
// its line in the group's store before it throws (before its process exits and closes its
// connections); a stage whose failure comes later finds it there and leads with it. A stage
// killed outright records nothing: its neighbours' lines name its rank as the peer they lost,
// and the first of those is recorded in its place. The store lives in rank 0's process (under
// `tandem run`): a stage that fails after rank 0 has exited cannot read it, and its line is then
// its own, which names the peer it lost.
std::string Stage::explain_failure(const std::string& here) {
  static const std::string kKey = "pp_first_failure";
  try {
    const auto& store = group_->store();
    if (store->check({kKey})) {
      const auto first = store->get(kKey);
      return std::string(first.begin(), first.end()) + " (then " + here + ")";
    }
    store->set(kKey, std::vector<uint8_t>(here.begin(), here.end()));
  } catch (const std::exception&) {
    // The store may be gone with the process that hosted it: the line stays this stage's own.
  }
  return here;
}

void Stage::wait_sends() {
  for (auto& [work, tensor] : sends_) {
    group_->wait(work, "pp: stage " + std::to_string(index_) + "'s send of " + std::to_string(tensor.numel()) +
                           " values");
  }
  sends_.clear();
}

}  // namespace tandem::pp
