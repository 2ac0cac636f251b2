#!/usr/bin/env python3
"""PyTorch's own DDP on the workloads of bench/workloads.h: the peer Tandem is measured against.

Started like Tandem's benchmark, by `tandem run` (or torchrun): reads RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT. Same models, batch, optimizer, threads (1 per rank) and backend (Gloo).
Modes: ddp, plain (no DDP), no_sync. Rank 0 appends one JSON object to --out (or prints it).
"""
import argparse
import json
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 512), nn.Linear(512, 512), nn.Linear(512, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(1, 32, 3, bias=False), nn.BatchNorm2d(32)
        self.conv2, self.bn2 = nn.Conv2d(32, 64, 3, bias=False), nn.BatchNorm2d(64)
        self.fc1, self.fc2 = nn.Linear(64 * 12 * 12, 128), nn.Linear(128, 10)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.max_pool2d(F.relu(self.bn2(self.conv2(h))), 2)
        return self.fc2(F.relu(self.fc1(h.flatten(1))))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 128)
        self.layer1 = nn.TransformerEncoderLayer(128, 4, dim_feedforward=512, dropout=0.0)
        self.layer2 = nn.TransformerEncoderLayer(128, 4, dim_feedforward=512, dropout=0.0)
        self.head = nn.Linear(128, 10)

    def forward(self, tokens):
        return self.head(self.layer2(self.layer1(self.embed(tokens))).mean(0))


def batch_for(model, batch, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (batch,), generator=g)
    if model in ("mlp", "cnn"):
        return torch.randn(batch, 1, 28, 28, generator=g), y
    return torch.randint(0, 1000, (32, batch), generator=g), y


def percentile(values, p):
    v = sorted(values)
    pos = p * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def emit(record, out):
    """One JSON line: appended to `out`, or printed."""
    line = json.dumps(record)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")
    else:
        print(line)


def run_accelerate(a, rank, world):
    """Hugging Face accelerate's loop on the same model, batch and optimizer (its DDP on Gloo)."""
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    net = {"mlp": Mlp, "cnn": Cnn, "transformer": Transformer}[a.model]()
    x, y = batch_for(a.model, a.batch, 100 + rank)
    model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9))
    times = []
    for i in range(a.warmup + a.steps):
        start = time.perf_counter()
        with acc.accumulate(model):
            acc.backward(F.cross_entropy(model(x), y))
            opt.step()
            opt.zero_grad()
        if i >= a.warmup:
            times.append(time.perf_counter() - start)
    p50 = percentile(times, 0.5)
    p50s = acc.gather(torch.tensor([p50], dtype=torch.float64)).tolist()
    if acc.is_main_process:
        record = dict(impl="accelerate", model=a.model, mode="accelerate", world=world, batch=a.batch,
                      steps=a.steps, p50_s=p50, p95_s=percentile(times, 0.95),
                      samples_per_s_per_rank=a.batch / p50, threads=a.threads, rank_p50_s=p50s)
        emit(record, a.out)
    acc.wait_for_everyone()
    acc.end_training()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "cnn", "transformer"], default="mlp")
    ap.add_argument("--mode", choices=["ddp", "plain", "no_sync", "dp", "accelerate"], default="ddp")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--bucket-view", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if a.mode == "accelerate":
        return run_accelerate(a, rank, world)
    if world > 1 or "MASTER_ADDR" in os.environ:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    net = {"mlp": Mlp, "cnn": Cnn, "transformer": Transformer}[a.model]()
    x, y = batch_for(a.model, a.batch, 100 + rank)
    model = net
    if a.mode == "dp":
        # On a machine without GPUs, nn.DataParallel runs the module as is (no replicas).
        model = nn.DataParallel(net)
    elif a.mode != "plain":
        model = nn.parallel.DistributedDataParallel(net, gradient_as_bucket_view=a.bucket_view)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    times = []
    for i in range(a.warmup + a.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=not a.bucket_view)
        if a.mode == "no_sync":
            with model.no_sync():
                F.cross_entropy(model(x), y).backward()
        else:
            F.cross_entropy(model(x), y).backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - start)

    p50, p95 = percentile(times, 0.5), percentile(times, 0.95)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    mine = torch.tensor([p50, rss], dtype=torch.float64)
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    if dist.is_initialized():
        dist.all_gather(gathered, mine)
    else:
        gathered = [mine]
    if rank == 0:
        record = dict(impl="pytorch", model=a.model, mode=a.mode, world=world, batch=a.batch,
                      bucket_view=a.bucket_view, steps=a.steps, p50_s=p50, p95_s=p95,
                      samples_per_s_per_rank=a.batch / p50, threads=a.threads,
                      grad_bytes=sum(p.numel() * p.element_size() for p in net.parameters()),
                      rank_p50_s=[g[0].item() for g in gathered],
                      rank_peak_rss_mb=[g[1].item() for g in gathered])
        emit(record, a.out)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
