#!/usr/bin/env python3
"""PyTorch FSDP2's side of the mixed-precision comparison, run by torchrun on Gloo (CPU).

usage: torchrun --nproc-per-node W fsdp2_mixed_precision.py INIT TANDEM_BF16 TANDEM_FP32

The same MLP as tests/fsdp/mixed_precision_run.cpp, from Tandem's initial weights (INIT), each
Linear fully_shard'ed and the root too, MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=R),
AdamW in the same two groups, 20 steps of the batches drawn from the same seeds. Rank 0 then
compares Tandem's trained weights (TANDEM_BF16: reduce in bfloat16, TANDEM_FP32: in float32) with
FSDP2's under torch.testing's bfloat16 tolerance (rtol 1.6e-2, atol 1e-5), and checks that an FSDP2
run in float32 is outside it (the comparison can tell the policies apart). Exit 0 when all hold.

TANDEM_BF16 may be "-": the bfloat16 reduction is compared at 2 processes only. FSDP2 on Gloo sums
bfloat16 in the ring's order and then divides by W (ReduceOp.AVG); Tandem multiplies by 1/W and
sums in rank order. With 2 processes both give the same bits; with 3, last-bit differences that 20
AdamW steps turn into different trajectories (seen: 5.6x the tolerance; one order against the
other, not one of them wrong). float32 reductions of bfloat16 gradients agree at any size.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from gloo_exit import end_process_group, exit_without_gloo_threads  # noqa: E402  before any process group

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402

RTOL, ATOL = 1.6e-2, 1e-5  # torch.testing.assert_close's defaults for bfloat16


def train(init, policy):
    rank = dist.get_rank()
    net = nn.Sequential(nn.Linear(13, 11), nn.Tanh(), nn.Linear(11, 7), nn.Tanh(), nn.Linear(7, 3))
    net.load_state_dict(init)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for entry in net:
        if any(True for _ in entry.parameters()):
            fully_shard(entry, mesh=mesh, mp_policy=policy)
    fully_shard(net, mesh=mesh, mp_policy=policy)
    weights = [p for p in net.parameters() if p.dim() > 1]
    biases = [p for p in net.parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": weights, "lr": 1e-2, "weight_decay": 0.1},
                             {"params": biases, "lr": 3e-2, "weight_decay": 0.0}])
    for step in range(20):
        torch.manual_seed(1000 * step + 10 * rank)
        x = torch.randn(8, 13)
        y = torch.randn(8, 3)
        (net(x) - y).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return {name: p.full_tensor().detach() for name, p in net.named_parameters()}


def worst(got, want):
    """The largest |a - b| / (atol + rtol |b|) over every tensor: <= 1 is within tolerance."""
    assert got.keys() == want.keys(), f"names differ: {sorted(got)} vs {sorted(want)}"
    return max(((got[k].float() - want[k].float()).abs() / (ATOL + RTOL * want[k].float().abs())).max().item()
               for k in want)


def main():
    init_path, tandem_bf16, tandem_fp32 = sys.argv[1:4]
    dist.init_process_group("gloo")
    init = load_file(init_path)
    runs = {
        "bf16": train(init, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)),
        "fp32": train(init, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)),
        "none": train(init, MixedPrecisionPolicy()),
    }
    failed = False
    if dist.get_rank() == 0:
        world = dist.get_world_size()
        for reduce, path in (("bf16", tandem_bf16), ("fp32", tandem_fp32)):
            if path == "-":
                print(f"skipped: Tandem vs FSDP2, {reduce} reduce, {world} ranks (compared at 2: orders of addition)")
                continue
            tandem = load_file(path)
            ratio = worst(tandem, runs[reduce])
            ok = ratio <= 1.0
            failed |= not ok
            print(f"{'ok' if ok else 'FAIL'}: Tandem vs FSDP2, bf16 compute, {reduce} reduce, {world} ranks: "
                  f"largest difference {ratio:.3g} of bf16's tolerance")
            apart = worst(tandem, runs["none"])
            ok = apart > 1.0
            failed |= not ok
            print(f"{'ok' if ok else 'FAIL'}: Tandem's bf16 run vs FSDP2 in float32: {apart:.3g} of the tolerance "
                  "(must be outside it)")
    dist.barrier()
    runs.clear()
    end_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    # FSDP2 keeps the group's Gloo threads: leave without the finalization that can abort
    # (Note [Gloo threads at exit], bench/gloo_exit.py; seen here once under ctest -j2).
    exit_without_gloo_threads(main(), "FSDP2")
