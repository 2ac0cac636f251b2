"""frontier_peer.py: PyTorch's twin of tandem-frontier-worker (one probe of `tandem bench
--memory-budget`, Note [Memory frontier] in src/bench/frontier.cpp): the same GPT (peer.py's,
layer for layer bench/workloads.h's), FSDP2 (`fully_shard`) over each block wrapped in
`checkpoint_wrapper`, the token embedding, the head and the root, as torchtitan applies them;
Adam, a few steps, and rank 0 appends the same JSON record. Run under torchrun or `tandem run`."""
import argparse
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.nn  # noqa: E402,F401  before any process group: Note [Gloo threads at exit]
from gloo_exit import end_process_group, exit_without_gloo_threads  # noqa: E402
from peer import Gpt  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--strategy", required=True, choices=["fsdp2-checkpoint"])
    for flag in ("--vocab", "--context", "--dim", "--layers", "--heads", "--batch-size"):
        p.add_argument(flag, type=int, required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if a.steps < 2:
        p.error("--steps: at least 2 (the first is warm-up)")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import fully_shard

    net = Gpt((a.vocab, a.context, a.dim, a.layers, a.heads))
    params = sum(t.numel() for t in net.parameters())
    for i, block in enumerate(net.blocks):
        net.blocks[i] = checkpoint_wrapper(block)  # non-reentrant, PyTorch's default
        fully_shard(net.blocks[i])
    fully_shard(net.tok_emb)
    fully_shard(net.head)
    model = fully_shard(net)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1000 + rank)
    seq = torch.randint(0, a.vocab, (a.batch_size, a.context + 1), generator=g)
    x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    for step in range(a.steps):
        if step == 1:
            start = time.perf_counter()  # step 0 is warm-up
        opt.zero_grad()
        out = model(x)
        torch.nn.functional.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1)).backward()
        opt.step()
    seconds = time.perf_counter() - start
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0], dtype=torch.float64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if rank == 0:
        record = {"impl": "pytorch", "strategy": a.strategy, "params": params, "world": world,
                  "tokens_per_s": (a.steps - 1) * a.batch_size * a.context * world / seconds,
                  "step_s": seconds / (a.steps - 1), "peak_rss_bytes": int(peak.item())}
        with open(a.out, "a") as f:
            f.write(json.dumps(record) + "\n")
    del model, opt, net
    end_process_group()
    exit_without_gloo_threads(0, "FSDP2")


if __name__ == "__main__":
    main()
