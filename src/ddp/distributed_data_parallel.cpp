#include "tandem/ddp/distributed_data_parallel.h"

#include <ATen/ATen.h>

#include "tandem/comm/agreement.h"
#include "tandem/ddp/model_check.h"
#include "tandem/error.h"
#include "tandem/host_allocator.h"

namespace tandem::ddp::detail {

DdpCore::DdpCore(torch::nn::Module& module, std::shared_ptr<comm::ProcessGroup> pg,
                 DistributedDataParallelOptions options)
    : pg_(std::move(pg)), options_(options) {
  TANDEM_CHECK(pg_, "DDP: the process group is null");
  tune_host_allocator();  // Note [Host allocator]
  std::vector<at::Tensor> parameters, all_state;
  std::vector<std::string> names, all_names;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    all_state.push_back(item.value());
    all_names.push_back(item.key());
    if (item.value().requires_grad()) {
      parameters.push_back(item.value());
      names.push_back(item.key());
    }
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    buffers_.push_back(item.value());
    all_state.push_back(item.value());
    all_names.push_back(item.key());
  }
  state_ = all_state;
  // Note [Agreement before waiting] (docs/design/comm.md): the same DDP object, with the same
  // options, on every rank, before anything waits on the others.
  comm::Agreement("ddp: the DistributedDataParallel being made")
      .field("DDP objects made on this group before it", pg_->count_object("ddp"))
      .field("bucket_cap_mb", std::to_string(options_.bucket_cap_mb()))
      .field("first_bucket_mb", std::to_string(options_.first_bucket_mb()))
      .field("find_unused_parameters", options_.find_unused_parameters() ? "true" : "false")
      .field("static_graph", options_.static_graph() ? "true" : "false")
      .field("broadcast_buffers", options_.broadcast_buffers() ? "true" : "false")
      .field("gradient_as_bucket_view", options_.gradient_as_bucket_view() ? "true" : "false")
      .field("init_sync", options_.init_sync() ? "true" : "false")
      .check(*pg_);
  verify_placement(*pg_, all_state, all_names);
  if (options_.init_sync() && pg_->size() > 1) {
    verify_same_model(*pg_, parameters, names);
    // Rank 0's initial state everywhere: parameters and buffers, coalesced per dtype.
    pg_->broadcast_coalesced(all_state, 0);
  }
  reducer_ = std::make_unique<Reducer>(parameters, names, pg_, options_);
}

bool DdpCore::pre_forward() {
  if (!at::GradMode::is_enabled()) return false;  // evaluation forwards never interfere
  if (joining_) announce_active();
  reducer_->prepare_for_forward(sync_);
  if (!sync_) return false;
  if (options_.broadcast_buffers() && pg_->size() > 1 && !buffers_.empty()) {
    pg_->broadcast_coalesced(buffers_, joining_ ? buffer_source_ : 0);
  }
  return true;
}

void DdpCore::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  reducer_->prepare_for_forward(/*synced=*/true);
  reducer_->prepare_for_backward(outputs, /*outputs_complete=*/true, "std::vector<at::Tensor>");
}

void DdpCore::post_forward(const std::vector<at::Tensor>& outputs, bool outputs_complete,
                           const std::string& output_type) {
  reducer_->prepare_for_backward(outputs, outputs_complete, output_type);
}

}  // namespace tandem::ddp::detail
