#pragma once
// Pipeline parallelism (PyTorch's torch.distributed.pipelining, docs/guide-pp.md): a model cut by
// layers into stages, each stage on a process of a pipeline group, microbatches in flight.
// A Stage is one part of the model and its place in the pipeline; a Schedule
// (tandem/pp/schedule.h) runs the microbatches through the stages.
//
//   // 4 processes, each one stage of a 4-stage pipeline:
//   auto pg = tandem::comm::ProcessGroup::create(tandem::comm::World::from_env());
//   torch::nn::Sequential part = my_layers_for(pg->rank());     // this stage's layers
//   tandem::pp::Stage stage(part, pg->rank(), 4, pg);
//   tandem::pp::Schedule1F1B schedule(stage, /*microbatches=*/8, cross_entropy);
//   auto losses = schedule.step(x, y);  // x read on stage 0, y on stage 3; gradients on every stage
//
// Stage s runs on rank s mod P of a group of P processes: one stage per process when there are as
// many stages as processes, or several (s = r, r + P, r + 2P, ...: the looped placement of
// interleaved 1F1B). Activations travel forward from stage s to s + 1, their gradients back; the
// shape of an activation goes once per microbatch size (Note [Activation shapes] in stage.cpp).
// Messages carry no tags that matter: between two processes they are one stream, in the order the
// schedules issue them, as on NCCL. A stage's module takes one tensor and returns one. Making a
// stage is collective over its group: the stages check that they agree on the pipeline (stage
// index, count) and choose where messages go (over NCCL only if every stage can) before any
// message waits.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "tandem/comm/process_group.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"

namespace tandem::pp {

using Group = std::shared_ptr<comm::ProcessGroup>;

/// How a stage's gradients are synchronised across data-parallel replicas, when they are (PP x
/// DDP, PP x FSDP): `require` turns synchronisation of the next forwards on or off, `arm` makes
/// the next backward (from `output`) synchronise what has accumulated.
struct DataParallelSync {
  std::function<void(bool)> require;
  std::function<void(const at::Tensor& output)> arm;
  explicit operator bool() const { return static_cast<bool>(arm); }
};

class Stage {
 public:
  /// `module` (any module whose forward takes one tensor and returns one: a Sequential too) is
  /// stage `index` of `num_stages`, on rank `index` mod `group->size()` (which must divide
  /// `num_stages`). One-line tandem::Error for an index out of range, a group whose size does not
  /// divide the stages, or one where this process is not the stage's rank.
  template <typename M>
  Stage(torch::nn::ModuleHolder<M> module, int index, int num_stages, Group group)
      : Stage(module.ptr(), [m = module.ptr()](const at::Tensor& x) -> at::Tensor { return m->forward(x); }, index,
              num_stages, std::move(group)) {}
  /// A stage whose module is replicated across a data-parallel group (PP x DDP on a 2-D mesh:
  /// `ddp` over mesh["dp"], `group` mesh["pp"]). The schedule runs every forward of a step
  /// without synchronisation and arms `ddp` before the stage's last backward of the step, which
  /// then averages the gradients of all microbatches across the replicas once, overlapped with
  /// that backward (Note [Pipeline step] in schedule.cpp).
  template <typename M>
  Stage(ddp::DistributedDataParallel<M> ddp, int index, int num_stages, Group group)
      : Stage(ddp.ptr(), [d = ddp.ptr()](const at::Tensor& x) -> at::Tensor { return d->forward(x); }, index,
              num_stages, std::move(group)) {
    sync_.require = [d = ddp.ptr().get()](bool on) { d->set_require_backward_grad_sync(on); };
    sync_.arm = [d = ddp.ptr().get()](const at::Tensor& output) { d->prepare_for_backward({output}); };
  }
  /// A stage whose module is sharded across a data-parallel group (PP x FSDP: `fsdp` over
  /// mesh["dp"]): the same, with FSDP's reduce-scatter in the stage's last backward.
  template <typename M>
  Stage(fsdp::FullyShardedDataParallel<M> fsdp, int index, int num_stages, Group group)
      : Stage(fsdp.ptr(), [f = fsdp.ptr()](const at::Tensor& x) -> at::Tensor { return f->forward(x); }, index,
              num_stages, std::move(group)) {
    sync_.require = [f = fsdp.ptr().get()](bool on) { f->set_requires_gradient_sync(on); };
    sync_.arm = [f = fsdp.ptr().get()](const at::Tensor&) { f->prepare_for_backward(); };
  }
  /// The same with the module and its forward apart, and how its gradients are synchronised
  /// across data-parallel replicas (none by default).
  Stage(std::shared_ptr<torch::nn::Module> module, std::function<at::Tensor(const at::Tensor&)> forward, int index,
        int num_stages, Group group, DataParallelSync sync = {});

  int index() const { return index_; }
  int num_stages() const { return num_stages_; }
  bool is_first() const { return index_ == 0; }
  bool is_last() const { return index_ == num_stages_ - 1; }
  /// The rank of `stage`'s process in the group: stage mod the group's size.
  int rank_of(int stage) const { return stage % group_->size(); }
  comm::ProcessGroup& group() const { return *group_; }
  /// This stage's module (for its parameters and the optimizer).
  torch::nn::Module& module() { return *module_; }
  /// The stage's forward on one microbatch.
  at::Tensor forward(const at::Tensor& input) { return forward_(input); }

  const DataParallelSync& data_parallel_sync() const { return sync_; }

  /// The device its messages travel on, decided by every stage together when they are made: this
  /// rank's CUDA device when every stage's module is on the CUDA device its rank's NCCL is bound
  /// to, else the CPU (Gloo or MPI) for all of them: a CPU model on a host with GPUs, or two ranks
  /// on one GPU (NCCL takes one rank per device), send over the CPU backend.
  const c10::Device& message_device() const { return message_device_; }
  /// Where the module computes (its first parameter's device, else the CPU): received tensors go there.
  const c10::Device& module_device() const { return module_device_; }

  // The messages between neighbours (the schedules' building blocks). A schedule issues them in
  // batches (Note [Batched exchanges] in schedule.cpp); a send's tensors are kept until it is
  // released (Note [Releasing sends] in stage.cpp).
  /// The sends of `activation`, of a microbatch of `rows` samples, to the next stage: its values,
  /// led by a header the first time a microbatch of that many rows goes (Note [Activation shapes]).
  std::vector<comm::P2POp> activation_sends(const at::Tensor& activation, int64_t rows);
  /// The send of `grad` (the gradient of this stage's input) to the previous stage.
  std::vector<comm::P2POp> gradient_sends(const at::Tensor& grad);
  /// The receive of the previous stage's activation of a microbatch of `rows` samples: into a
  /// buffer of its shape when that is known, else of its header first (`header_first`); then
  /// activation_after_header() gives the values' receive.
  struct Receive {
    comm::P2POp op;
    bool header_first = false;
  };
  Receive activation_receive(int64_t rows);
  comm::P2POp activation_after_header(const at::Tensor& header, int64_t rows);
  /// The receive of the gradient of this stage's output `like` (its shape and dtype).
  comm::P2POp gradient_receive(const at::Tensor& like);
  /// Keeps the works of sends issued for `microbatch`'s activation (or gradient) until released.
  void keep_sends(bool gradient, int microbatch, std::vector<c10::intrusive_ptr<c10d::Work>> works,
                  std::vector<at::Tensor> tensors);
  /// Waits for the send of `microbatch`'s activation and lets its tensors go (call it once the
  /// next stage is known to have received it).
  void release_activation_send(int microbatch);
  /// The same for the gradient sends of the microbatches before `microbatch`.
  void release_gradient_sends_before(int microbatch);
  /// Waits for every send issued so far and lets their tensors go.
  void wait_sends();
  /// The line for this stage's failure `here`: led by the pipeline's first failure when another
  /// stage recorded one (Note [The first failed stage] in stage.cpp), else recorded as that.
  std::string explain_failure(const std::string& here);

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::function<at::Tensor(const at::Tensor&)> forward_;
  int index_, num_stages_;
  Group group_;
  DataParallelSync sync_;
  c10::Device message_device_{c10::kCPU}, module_device_{c10::kCPU};
  /// Note [Activation shapes]: by microbatch rows, the sizes and dtype of the activations sent
  /// (to the next stage) and received (from the previous one).
  struct Shape {
    std::vector<int64_t> sizes;
    at::ScalarType dtype;
  };
  std::map<int64_t, Shape> sent_shapes_, received_shapes_;
  struct Send {
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor tensor;  // kept alive until the send completes
  };
  std::map<int, std::vector<Send>> activation_sends_, gradient_sends_;  // by microbatch
  void release(std::vector<Send>& sends);
};

}  // namespace tandem::pp
