#pragma once
// tandem::tp::parallelize: tensor parallelism for a LibTorch module by a plan of module names and
// styles (PyTorch's parallelize_module, docs/guide-tp.md). The modules the plan names must be
// tandem::nn::Hookable members, or a tandem::fsdp::Unit or nn::Checkpoint of one (LibTorch has no
// forward hooks): the styles put their collectives there and cut the parameters in place.
//
//   struct Mlp : torch::nn::Module {
//     tandem::nn::Hookable up{register_module("up", tandem::nn::Hookable(torch::nn::Linear(64, 256)))};
//     tandem::nn::Hookable down{register_module("down", tandem::nn::Hookable(torch::nn::Linear(256, 64)))};
//     at::Tensor forward(const at::Tensor& x) { return down(at::gelu(up(x))); }
//   };
//   tandem::comm::DeviceMesh mesh(pg, {2, 2}, {"dp", "tp"});
//   auto layout = tandem::tp::parallelize(*mlp, mesh["tp"], {{"up", tandem::tp::ColwiseParallel()},
//                                                           {"down", tandem::tp::RowwiseParallel()}});
//   // then FSDP or DDP over mesh["dp"], and the optimizer
//
// Call it before the optimizer is made and before DDP or FSDP wrap the module. Every rank of the
// group must run the module on the same batch: the first forward of each module whose input is
// Replicate compares that input across the group (a one-line error names the rank that differs).
#include <map>
#include <memory>
#include <string>

#include <torch/nn/module.h>

#include "tandem/comm/device_mesh.h"
#include "tandem/comm/placement.h"
#include "tandem/tp/functional.h"
#include "tandem/tp/style.h"

namespace tandem::tp {

/// What parallelize did: the group, and the placement of each parameter it cut, by its name in
/// the module (the others are Replicate).
struct Layout {
  Group group;
  std::map<std::string, Placement> placements;
  /// The placement of the parameter named `name`: Shard(d) or Replicate.
  Placement placement(const std::string& name) const;
};

/// Applies `plan` over `group` (collective over it: rank 0's parameters and buffers reach every
/// rank first). One-line tandem::Error for: a name that matches no module, a module matched twice,
/// a matched module that is not a tandem::nn::Hookable (or is parallelized already), a style on a
/// module it does not apply to, sizes that do not divide by the group's size.
Layout parallelize(torch::nn::Module& module, Group group, const Plan& plan);
/// Over a 1-D mesh (mesh["tp"]).
Layout parallelize(torch::nn::Module& module, const comm::DeviceMesh& tp_mesh, const Plan& plan);

}  // namespace tandem::tp
