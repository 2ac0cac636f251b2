#!/usr/bin/env python3
"""Writes the oracle tables Tandem's C++ tests compare against, produced by PyTorch itself:

  distributed_sampler.json  torch.utils.data.DistributedSampler indices for a table of
                            (N, world size, rank, seed, epoch, shuffle, drop_last)
  bucket_assignment.json    torch.distributed._compute_bucket_assignment_by_size for a table of
                            parameter lists and size limits
  zero_partition.json       torch.distributed.optim.ZeroRedundancyOptimizer's assignment of
                            parameters to ranks for a table of param groups and world sizes

Run with the pinned wheel:  .venv/bin/python tests/oracles/make_oracles.py
The output is committed; the C++ tests never need Python.
"""
import itertools
import json
import os

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))


def sampler_cases():
    cases = []
    sizes = [0, 1, 3, 10, 17, 100, 1001]
    worlds = [1, 2, 3, 4, 8]
    for n, w, shuffle, drop_last in itertools.product(sizes, worlds, [False, True], [False, True]):
        for seed, epoch in ([(0, 0), (0, 1), (1234, 7)] if shuffle else [(0, 0)]):
            for rank in range(w):
                s = DistributedSampler(range(n), num_replicas=w, rank=rank, shuffle=shuffle,
                                       seed=seed, drop_last=drop_last)
                s.set_epoch(epoch)
                cases.append(dict(n=n, world_size=w, rank=rank, seed=seed, epoch=epoch,
                                  shuffle=shuffle, drop_last=drop_last,
                                  num_samples=len(s), indices=list(s)))
    return cases


DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "int64": torch.int64}


def bucket_cases():
    KB, MB = 1024, 1024 * 1024
    models = {
        "mlp": [("float32", 784 * 256), ("float32", 256), ("float32", 256 * 10), ("float32", 10)],
        "big_and_small": [("float32", 300000), ("float32", 10), ("float64", 5), ("float32", 3000000),
                          ("float32", 7)],
        "many_equal": [("float32", 65536)] * 40,
        "mixed_dtypes": [("float32", 1000), ("float16", 400000), ("float32", 2000000), ("float16", 10),
                         ("float64", 200000), ("float32", 5)],
        "one_giant": [("float32", 10_000_000)],
        "empty_tensors": [("float32", 0), ("float32", 100), ("float32", 0)],
    }
    limits = {"default": [1 * MB, 25 * MB], "tiny": [4 * KB], "giant": [1 << 40], "three": [64 * KB, 256 * KB, 1 * MB]}
    cases = []
    for (mname, spec), (lname, lim) in itertools.product(models.items(), limits.items()):
        tensors = [torch.empty(numel, dtype=DTYPES[d]) for d, numel in spec]
        buckets, bucket_limits = dist._compute_bucket_assignment_by_size(tensors, lim, [False] * len(tensors))
        order = list(reversed(range(len(tensors))))
        reordered = [tensors[i] for i in order]
        rb, rl = dist._compute_bucket_assignment_by_size(reordered, lim, [False] * len(tensors), order)
        cases.append(dict(model=mname, limits_name=lname, size_limits=lim,
                          tensors=[dict(dtype=d, numel=numel, bytes=t.numel() * t.element_size())
                                   for (d, numel), t in zip(spec, tensors)],
                          buckets=buckets, bucket_limits=bucket_limits,
                          rebuild_order=order, rebuild_buckets=rb, rebuild_limits=rl))
    return cases


def zero_partition_cases():
    """ZeroRedundancyOptimizer._partition_parameters, PyTorch's own code, without a process
    group: the method reads only world_size, param_groups and its cache."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    models = {
        "one_group": [[784 * 512, 512, 512 * 256, 256, 256 * 10, 10]],
        "equal_sizes": [[100] * 7],
        "two_groups": [[1000, 10, 5000, 7], [3000, 3000, 1, 2]],
        "three_groups_uneven": [[7], [300000, 20, 20, 20], [5, 5000000, 64, 64, 1]],
        "fewer_params_than_ranks": [[10, 20]],
        "with_empty": [[0, 50, 0, 50]],
    }
    cases = []
    for (name, groups), world in itertools.product(models.items(), [1, 2, 3, 4, 8]):
        zro = ZeroRedundancyOptimizer.__new__(ZeroRedundancyOptimizer)
        zro.world_size = world
        zro.param_groups = [{"params": [torch.empty(n) for n in numels], "lr": 0.1} for numels in groups]
        zro._partition_parameters_cache = []
        partition = zro._partition_parameters()
        ids = {id(p): (g, i) for g, group in enumerate(zro.param_groups) for i, p in enumerate(group["params"])}
        owner = [[-1] * len(numels) for numels in groups]
        for rank, rank_groups in enumerate(partition):
            for rank_group in rank_groups:
                for p in rank_group["params"]:
                    g, i = ids[id(p)]
                    owner[g][i] = rank
        cases.append(dict(model=name, world_size=world, numels=groups, owner=owner))
    return cases


def main():
    meta = dict(torch_version=torch.__version__, generator="tests/oracles/make_oracles.py")
    with open(os.path.join(HERE, "distributed_sampler.json"), "w") as f:
        json.dump(dict(meta=meta, cases=sampler_cases()), f, separators=(",", ":"))
    with open(os.path.join(HERE, "bucket_assignment.json"), "w") as f:
        json.dump(dict(meta=meta, cases=bucket_cases()), f, indent=1)
    with open(os.path.join(HERE, "zero_partition.json"), "w") as f:
        json.dump(dict(meta=meta, cases=zero_partition_cases()), f, indent=1)
    print("wrote oracles with torch", torch.__version__)


if __name__ == "__main__":
    main()
