#include "tandem/ddp/model_check.h"

#include <ATen/ATen.h>

#include "tandem/error.h"

namespace tandem::ddp {
namespace {

constexpr int64_t kMaxDims = 8;
constexpr int64_t kRow = 3 + kMaxDims;  // dtype, device type, ndim, sizes (padded with -1)

std::string describe_row(const int64_t* row) {
  std::string text = c10::toString(static_cast<at::ScalarType>(row[0]));
  text += "[";
  for (int64_t d = 0; d < std::min(row[2], kMaxDims); ++d) text += (d ? ", " : "") + std::to_string(row[3 + d]);
  if (row[2] > kMaxDims) text += ", ...";
  text += "] on " + c10::DeviceTypeName(static_cast<c10::DeviceType>(row[1]), true);
  return text;
}

}  // namespace

void verify_same_model(comm::ProcessGroup& pg, const std::vector<at::Tensor>& parameters,
                       const std::vector<std::string>& names) {
  const int world = pg.size();
  at::Tensor count = at::tensor({static_cast<int64_t>(parameters.size())}, at::kLong);
  auto counts = pg.all_gather(count);
  for (int r = 1; r < world; ++r) {
    const auto theirs = counts[r].item<int64_t>(), first = counts[0].item<int64_t>();
    if (theirs != first) {
      throw Error("DDP: ranks hold different models: rank 0 has " + std::to_string(first) +
                  " parameters that require gradients, rank " + std::to_string(r) + " has " + std::to_string(theirs));
    }
  }
  at::Tensor mine = at::full({static_cast<int64_t>(parameters.size()), kRow}, -1, at::kLong);
  auto rows = mine.accessor<int64_t, 2>();
  for (size_t i = 0; i < parameters.size(); ++i) {
    const auto& p = parameters[i];
    rows[i][0] = static_cast<int64_t>(p.scalar_type());
    rows[i][1] = static_cast<int64_t>(p.device().type());
    rows[i][2] = p.dim();
    for (int64_t d = 0; d < std::min<int64_t>(p.dim(), kMaxDims); ++d) rows[i][3 + d] = p.size(d);
  }
  auto all = pg.all_gather(mine);
  for (size_t i = 0; i < parameters.size(); ++i) {
    for (int r = 1; r < world; ++r) {
      const int64_t* a = all[0][static_cast<int64_t>(i)].data_ptr<int64_t>();
      const int64_t* b = all[r][static_cast<int64_t>(i)].data_ptr<int64_t>();
      if (!std::equal(a, a + kRow, b)) {
        throw Error("DDP: ranks hold different models: parameter " + std::to_string(i) + " ('" + names[i] +
                    "' here) is " + describe_row(a) + " on rank 0 but " + describe_row(b) + " on rank " +
                    std::to_string(r));
      }
    }
  }
}

void verify_placement(const comm::ProcessGroup& pg, const std::vector<at::Tensor>& tensors,
                      const std::vector<std::string>& names) {
  if (tensors.empty()) return;
  const c10::Device device = tensors.front().device();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const c10::Device d = tensors[i].device();
    if (!d.is_cpu() && !d.is_cuda()) {
      throw Error("DDP: '" + names[i] + "' is on " + d.str() + "; DDP needs the module on one cpu or cuda device");
    }
    if (d != device) {
      throw Error("DDP: '" + names[i] + "' is on " + d.str() + " but '" + names.front() + "' is on " + device.str() +
                  "; move the whole module to one device (module->to(device)) before wrapping it");
    }
  }
  (void)pg.backend_for(device);  // throws when a CUDA module meets a group without NCCL
}

}  // namespace tandem::ddp
