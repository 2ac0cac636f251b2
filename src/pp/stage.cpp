#include "tandem/pp/stage.h"

#include <string>

#include <ATen/ATen.h>

#include "tandem/comm/agreement.h"
#include "tandem/error.h"

namespace tandem::pp {

namespace {

// Note [Activation shapes]
// The next stage cannot know an activation's shape before the first one arrives (a stage may
// change the shape), so the first activation of a microbatch size is led by a header of
// kHeaderLength int64 (rank, dtype, then the sizes); the receiver keeps the shape under that size
// (the number of samples in the microbatch, which every stage knows from the step's agreed batch
// size), and the later activations of that size are their values alone: no second message and no
// host sync per microbatch, as PyTorch's pipelining infers the shapes once. A stage whose output
// changes shape for the same microbatch size is refused with one line (a header the receiver does
// not expect would be read as values). Gradients need no header: they come back in the shape of
// the activation the stage sent.
constexpr int64_t kMaxDims = 8;
constexpr int64_t kHeaderLength = 2 + kMaxDims;

std::string shape_text(const std::vector<int64_t>& sizes, at::ScalarType dtype) {
  std::string text = std::string(c10::toString(dtype)) + "[";
  for (size_t d = 0; d < sizes.size(); ++d) text += (d ? ", " : "") + std::to_string(sizes[d]);
  return text + "]";
}

// Where the stage's module lives: its first parameter's (or buffer's) device, else the CPU.
c10::Device device_of(const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) return p.device();
  for (const auto& b : module.buffers()) return b.device();
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
  const int p = group_->size();
  // The same on every rank before anything waits on a message (Note [Agreement before waiting]
  // in docs/design/comm.md): on which device the messages go, how many stages, which of each
  // process's stages this is. Before the local rules, so that a rank whose local rule fails does
  // not leave the others in these all-gathers.
  // Messages go over NCCL only when every stage can send them there: its module on the CUDA device
  // its rank's NCCL is bound to. A CPU model on a host with GPUs, or two ranks on one GPU (NCCL
  // takes one rank per device: the second has none), send theirs over the CPU backend, all of them,
  // the tensors copied to the host and back (one all-gather decides, before anything waits).
  module_device_ = device_of(*module_);
  const auto cuda = group_->cuda_device();
  const bool nccl_here = module_device_.is_cuda() && cuda && module_device_.index() == cuda->index();
  bool nccl_everywhere = nccl_here;
  if (p > 1) {
    for (const auto& flag : group_->all_gather(at::full({1}, nccl_here ? 1 : 0, at::kLong))) {
      nccl_everywhere = nccl_everywhere && flag.item<int64_t>() == 1;
    }
  }
  message_device_ = nccl_everywhere ? *cuda : c10::Device(c10::kCPU);
  comm::Agreement("pp: the stages being made")
      .field("number of stages", num_stages_)
      .field("stage (of each process's, in order)", p > 0 && index_ >= 0 ? std::to_string(index_ / p) : "none")
      .check(*group_);
  TANDEM_CHECK(num_stages_ >= 1 && index_ >= 0 && index_ < num_stages_, "pp: stage ", index_, " of ", num_stages_,
               " does not exist (stages are numbered 0 to ", num_stages_ - 1, ")");
  TANDEM_CHECK(num_stages_ % p == 0, "pp: ", num_stages_, " stages do not divide among the ", p,
               " processes of the pipeline group (each process holds the same number of stages)");
  TANDEM_CHECK(group_->rank() == rank_of(index_), "pp: stage ", index_, " runs on rank ", rank_of(index_),
               " of its pipeline group (", index_, " mod ", p, "), but this process is rank ", group_->rank());
}

std::vector<comm::P2POp> Stage::activation_sends(const at::Tensor& activation, int64_t rows) {
  TANDEM_CHECK(!is_last(), "pp: the last stage has no next stage to send to");
  TANDEM_CHECK(activation.dim() <= kMaxDims, "pp: an activation of ", activation.dim(), " dimensions (at most ",
               kMaxDims, ")");
  at::Tensor values = activation.detach().to(message_device_).contiguous();
  const int to = rank_of(index_ + 1);
  std::vector<comm::P2POp> ops;
  const std::vector<int64_t> sizes = values.sizes().vec();
  auto known = sent_shapes_.find(rows);
  if (known == sent_shapes_.end()) {
    std::vector<int64_t> fields{values.dim(), static_cast<int64_t>(values.scalar_type())};
    fields.insert(fields.end(), sizes.begin(), sizes.end());
    fields.resize(kHeaderLength, 0);
    ops.push_back(comm::P2POp::send(at::tensor(fields, at::kLong).to(message_device_), to));
    sent_shapes_[rows] = {sizes, values.scalar_type()};
  } else {
    TANDEM_CHECK(known->second.sizes == sizes && known->second.dtype == values.scalar_type(), "pp: stage ", index_,
                 "'s output for a microbatch of ", rows, " samples is ", shape_text(sizes, values.scalar_type()),
                 ", where an earlier one of that size was ", shape_text(known->second.sizes, known->second.dtype),
                 ": a stage's output keeps one shape per microbatch size (Note [Activation shapes])");
  }
  ops.push_back(comm::P2POp::send(values, to));
  return ops;
}

std::vector<comm::P2POp> Stage::gradient_sends(const at::Tensor& grad) {
  TANDEM_CHECK(!is_first(), "pp: the first stage has no previous stage to send a gradient to");
  return {comm::P2POp::send(grad.detach().to(message_device_).contiguous(), rank_of(index_ - 1))};
}

Stage::Receive Stage::activation_receive(int64_t rows) {
  TANDEM_CHECK(!is_first(), "pp: the first stage has no previous stage to receive from");
  const int from = rank_of(index_ - 1);
  auto known = received_shapes_.find(rows);
  if (known == received_shapes_.end()) {
    at::Tensor header = at::empty({kHeaderLength}, at::TensorOptions().dtype(at::kLong).device(message_device_));
    return {comm::P2POp::recv(header, from), true};
  }
  at::Tensor values = at::empty(known->second.sizes, at::TensorOptions().dtype(known->second.dtype).device(message_device_));
  return {comm::P2POp::recv(values, from), false};
}

comm::P2POp Stage::activation_after_header(const at::Tensor& header, int64_t rows) {
  const at::Tensor fields = header.cpu();  // once per microbatch size (Note [Activation shapes])
  const int64_t* f = fields.data_ptr<int64_t>();
  TANDEM_CHECK(f[0] >= 0 && f[0] <= kMaxDims, "pp: stage ", index_, " received a malformed activation header (",
               f[0], " dimensions)");
  Shape shape{std::vector<int64_t>(f + 2, f + 2 + f[0]), static_cast<at::ScalarType>(f[1])};
  received_shapes_[rows] = shape;
  at::Tensor values = at::empty(shape.sizes, at::TensorOptions().dtype(shape.dtype).device(message_device_));
  return comm::P2POp::recv(values, rank_of(index_ - 1));
}

comm::P2POp Stage::gradient_receive(const at::Tensor& like) {
  TANDEM_CHECK(!is_last(), "pp: the last stage has no next stage to receive a gradient from");
  return comm::P2POp::recv(at::empty(like.sizes(), like.options().device(message_device_)), rank_of(index_ + 1));
}

void Stage::keep_sends(bool gradient, int microbatch, std::vector<c10::intrusive_ptr<c10d::Work>> works,
                       std::vector<at::Tensor> tensors) {
  auto& kept = (gradient ? gradient_sends_ : activation_sends_)[microbatch];
  for (size_t i = 0; i < works.size(); ++i) kept.push_back({works[i], tensors[i]});
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
