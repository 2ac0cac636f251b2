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

// Note [Stage tags]
// Between two processes several streams may flow: with several stages per process (interleaved
// 1F1B) rank r sends the activations of its stages r, r + P, ... and, when P = 2, the gradients of
// its other stages to the same neighbour. Each stream has its own tag: the activations stage s
// sends to s + 1 have tag 2s (header and values, in order), the gradients stage s sends back to
// s - 1 have tag 2s + 1; Gloo and MPI match a receive with the sends of its tag only, so a
// schedule need only keep each stream in order. NCCL has no tags: there all the messages between
// two processes are one stream, and the receiver must take them in the order they were sent.
// The schedules' orders do that too (checked for every P, v and m up to 6, 4 and 4P in
// tests/pp/schedule_order_test.cpp: Megatron-LM's warmup of 2 (P - r - 1) + (v - 1) P forwards
// is what makes the interleaved one so; with P - r - 1 + (v - 1) P it still finishes on Gloo,
// but two processes' streams interleave in different orders).
int activation_tag(int from_stage) { return 2 * from_stage; }
int gradient_tag(int from_stage) { return 2 * from_stage + 1; }

c10::Device device_of(const comm::ProcessGroup& group) {
  if (group.has_nccl()) {
    if (auto device = group.cuda_device()) return *device;
  }
  return c10::Device(c10::kCPU);
}

}  // namespace

Stage::Stage(std::shared_ptr<torch::nn::Module> module, std::function<at::Tensor(const at::Tensor&)> forward, int index,
             int num_stages, Group group, DataParallelSync sync)
    : module_(std::move(module)),
      forward_(std::move(forward)),
      index_(index),
      num_stages_(num_stages),
      group_(std::move(group)),
      sync_(std::move(sync)) {
  TANDEM_CHECK(module_ && forward_, "pp: a stage needs a module");
  TANDEM_CHECK(group_, "pp: a stage needs a process group");
  TANDEM_CHECK(num_stages_ >= 1 && index_ >= 0 && index_ < num_stages_, "pp: stage ", index_, " of ", num_stages_,
               " does not exist (stages are numbered 0 to ", num_stages_ - 1, ")");
  TANDEM_CHECK(num_stages_ % group_->size() == 0, "pp: ", num_stages_, " stages do not divide among the ",
               group_->size(), " processes of the pipeline group (each process holds the same number of stages)");
  TANDEM_CHECK(group_->rank() == rank_of(index_), "pp: stage ", index_, " runs on rank ", rank_of(index_),
               " of its pipeline group (", index_, " mod ", group_->size(), "), but this process is rank ",
               group_->rank());
}

void Stage::send_activation(const at::Tensor& activation, int microbatch) {
  TANDEM_CHECK(!is_last(), "pp: the last stage has no next stage to send to");
  TANDEM_CHECK(activation.dim() <= kMaxDims, "pp: an activation of ", activation.dim(), " dimensions (at most ",
               kMaxDims, ")");
  at::Tensor values = activation.detach().contiguous();
  at::Tensor header = at::zeros({kHeaderLength}, at::TensorOptions().dtype(at::kLong).device(values.device()));
  std::vector<int64_t> fields{values.dim(), static_cast<int64_t>(values.scalar_type())};
  for (int64_t d = 0; d < values.dim(); ++d) fields.push_back(values.size(d));
  header.narrow(0, 0, static_cast<int64_t>(fields.size()))
      .copy_(at::tensor(fields, at::kLong));
  const int to = rank_of(index_ + 1);
  auto& sends = activation_sends_[microbatch];
  sends.push_back({group_->isend(header, to, activation_tag(index_)), header});
  sends.push_back({group_->isend(values, to, activation_tag(index_)), values});
}

at::Tensor Stage::recv_activation() {
  TANDEM_CHECK(!is_first(), "pp: the first stage has no previous stage to receive from");
  const c10::Device device = device_of(*group_);
  at::Tensor header = at::empty({kHeaderLength}, at::TensorOptions().dtype(at::kLong).device(device));
  const int from = rank_of(index_ - 1);
  group_->recv(header, from, activation_tag(index_ - 1));
  const at::Tensor fields = header.cpu();
  const int64_t dims = fields[0].item<int64_t>();
  TANDEM_CHECK(dims >= 0 && dims <= kMaxDims, "pp: stage ", index_, " received a malformed activation header (",
               dims, " dimensions)");
  std::vector<int64_t> sizes;
  for (int64_t d = 0; d < dims; ++d) sizes.push_back(fields[2 + d].item<int64_t>());
  const auto dtype = static_cast<at::ScalarType>(fields[1].item<int64_t>());
  at::Tensor values = at::empty(sizes, at::TensorOptions().dtype(dtype).device(device));
  group_->recv(values, from, activation_tag(index_ - 1));
  return values;
}

void Stage::send_gradient(const at::Tensor& grad, int microbatch) {
  TANDEM_CHECK(!is_first(), "pp: the first stage has no previous stage to send a gradient to");
  at::Tensor values = grad.detach().contiguous();
  gradient_sends_[microbatch].push_back({group_->isend(values, rank_of(index_ - 1), gradient_tag(index_)), values});
}

at::Tensor Stage::recv_gradient(const at::Tensor& like) {
  TANDEM_CHECK(!is_last(), "pp: the last stage has no next stage to receive a gradient from");
  at::Tensor values = at::empty(like.sizes(), like.options().device(device_of(*group_)));
  group_->recv(values, rank_of(index_ + 1), gradient_tag(index_ + 1));
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

// Note [Releasing sends]
// A send's tensor (an activation, a gradient) must stay alive until the send completes, and a
// stage that kept every send until the end of the step would hold one more tensor per microbatch
// and direction: under 1F1B, memory growing with m again. So a schedule releases each send as
// soon as it knows the receiver has it, which it learns from the receiver's next message:
// - the gradient of microbatch i coming back means the next stage took activation i;
// - an activation of microbatch j coming from the previous stage means that stage has run every
//   action before its forward of j, in its order (which every process can compute), and so taken
//   the gradients of the backwards among them.
// Waiting then returns at once (the message is delivered); neither the stage nor the backend
// holds the tensor after it (the MPI backend lets go of it before it finishes the work), so the
// same tensors are freed at the same points on every run. What is left is waited for at the end
// of the step.
void Stage::release(std::vector<Send>& sends) {
  for (auto& send : sends) {
    group_->wait(send.work, "pp: stage " + std::to_string(index_) + "'s send of " + std::to_string(send.tensor.numel()) +
                                " values");
  }
  sends.clear();
}

void Stage::release_activation_send(int microbatch) {
  auto it = activation_sends_.find(microbatch);
  if (it == activation_sends_.end()) return;
  release(it->second);
  activation_sends_.erase(it);
}

void Stage::release_gradient_sends_before(int microbatch) {
  while (!gradient_sends_.empty() && gradient_sends_.begin()->first < microbatch) {
    release(gradient_sends_.begin()->second);
    gradient_sends_.erase(gradient_sends_.begin());
  }
}

void Stage::wait_sends() {
  for (auto* sends : {&activation_sends_, &gradient_sends_}) {
    for (auto& [microbatch, pending] : *sends) release(pending);
    sends->clear();
  }
}

}  // namespace tandem::pp
