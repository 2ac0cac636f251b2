#!/usr/bin/env python3
"""Placements and sharded checkpoints against PyTorch and the safetensors package: one verdict.

usage: chunks_interop.py TOOL TANDEM WORKDIR

(a) Boxes: for 400 seeded cases (shapes, meshes of 1 to 3 dimensions, Shard/Replicate/Partial,
    two Shards of one dimension, uneven and empty pieces), every coordinate's offsets and sizes by
    `TOOL boxes` (comm::local_chunk) equal PyTorch DTensor's
    _compute_local_shape_and_global_offset, the function its checkpoints use.
(b) A checkpoint `TOOL write-checkpoint` saves on a 2 x 2 mesh: Python reads every piece with
    safetensors as it is and puts it in place by the file's tandem_chunks metadata; the result
    is the whole tensors TOOL wrote beside it (expected.safetensors).
(c) `TANDEM checkpoint consolidate CKPT --model 0 --out F` writes exactly expected.safetensors,
    byte for byte, and safetensors.torch.load_file reads it.
Exit status 0 when all three pass; each failure is printed.
"""
import json
import os
import random
import shutil
import subprocess
import sys

try:
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
except ImportError as error:
    print(f"FAIL: {error}: the venv lacks torch or safetensors (run scripts/setup)")
    sys.exit(1)

tool, tandem, work = sys.argv[1:4]
failures = []


def coordinates(mesh):
    out = [[]]
    for size in mesh:
        out = [c + [i] for c in out for i in range(size)]
    return out


def torch_placement(text, ndim):
    if text == "R":
        return Replicate()
    if text == "P":
        return Partial()
    d = int(text[1:])
    return Shard(d + ndim if d < 0 else d)  # DTensor's user APIs normalise negative dims


# (a) Boxes against DTensor.
rng = random.Random(32)
cases = []
for _ in range(400):
    shape = [rng.choice([0, 1, 2, 3, 5, 7, 8, 13]) for _ in range(rng.randint(0, 3))]
    mesh = [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
    choices = ["R", "P"] + [f"S{d}" for d in range(len(shape))] + ([f"S{-1}"] if shape else [])
    cases.append({"shape": shape, "mesh": mesh, "placements": [rng.choice(choices) for _ in mesh]})
run = subprocess.run([tool, "boxes"], input=json.dumps(cases), capture_output=True, text=True)
if run.returncode != 0:
    failures.append(f"TOOL boxes exited {run.returncode}: {run.stderr.strip()}")
else:
    ours = json.loads(run.stdout)
    compared = 0
    for case, boxes in zip(cases, ours):
        placements = [torch_placement(p, len(case["shape"])) for p in case["placements"]]
        for coordinate, (offsets, sizes) in zip(coordinates(case["mesh"]), boxes):
            local_shape, global_offset = _compute_local_shape_and_global_offset(
                case["shape"], case["mesh"], coordinate, placements)
            compared += 1
            if list(local_shape) != sizes or list(global_offset) != offsets:
                failures.append(f"{case} at {coordinate}: ours {offsets} {sizes}, PyTorch's "
                                f"{list(global_offset)} {list(local_shape)}")
    print(f"(a) {compared} boxes of {len(cases)} cases compared with PyTorch's")

# (b) The pieces, placed by their metadata in Python, are the whole tensors.
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
run = subprocess.run([tool, "write-checkpoint", work], capture_output=True, text=True)
if run.returncode != 0:
    failures.append(f"TOOL write-checkpoint exited {run.returncode}: {run.stderr.strip()}")
    checkpoint = None
else:
    checkpoint = run.stdout.strip()
    expected = load_file(os.path.join(work, "expected.safetensors"))
    state = json.load(open(os.path.join(checkpoint, "state.json")))
    placed = {}
    filled = {}
    for file in state["model_files"][0]:
        with safe_open(os.path.join(checkpoint, file), framework="pt") as f:
            chunks = json.loads((f.metadata() or {}).get("tandem_chunks", "{}"))
            for name in f.keys():
                piece = f.get_tensor(name)
                if name not in chunks:
                    placed[name] = piece.clone()
                    filled[name] = filled.get(name, 0) + piece.numel()
                    continue
                offsets, whole_shape = chunks[name]
                if name not in placed:
                    placed[name] = torch.empty(whole_shape, dtype=piece.dtype)
                view = placed[name].reshape([1]) if not whole_shape else placed[name]
                view[tuple(slice(o, o + s) for o, s in zip(offsets, piece.shape))] = piece
                filled[name] = filled.get(name, 0) + piece.numel()
    if sorted(placed) != sorted(expected):
        failures.append(f"(b) the pieces name {sorted(placed)}, the whole model {sorted(expected)}")
    for name, want in expected.items():
        got = placed.get(name)
        if got is None:
            continue
        if filled[name] != want.numel():
            failures.append(f"(b) {name}: the pieces hold {filled[name]} elements, the tensor {want.numel()}")
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            failures.append(f"(b) {name}: placed from its pieces, it differs from the whole tensor")
    print(f"(b) {len(placed)} tensors put together from {len(state['model_files'][0])} files by tandem_chunks")

# (c) tandem checkpoint consolidate: the whole model, byte for byte.
if checkpoint:
    out = os.path.join(work, "consolidated.safetensors")
    run = subprocess.run([tandem, "checkpoint", "consolidate", checkpoint, "--model", "0", "--out", out],
                         capture_output=True, text=True)
    if run.returncode != 0:
        failures.append(f"(c) tandem checkpoint consolidate exited {run.returncode}: {run.stderr.strip()}")
    else:
        if open(out, "rb").read() != open(os.path.join(work, "expected.safetensors"), "rb").read():
            failures.append("(c) the consolidated file is not the whole model's bytes")
        loaded = load_file(out)
        if sorted(loaded) != sorted(expected) or not all(torch.equal(loaded[n], expected[n]) for n in expected):
            failures.append("(c) safetensors.torch.load_file of the consolidated file differs")
        print(f"(c) tandem checkpoint consolidate: {len(loaded)} tensors, the whole model's bytes")

for failure in failures:
    print("FAIL:", failure)
print("PASS" if not failures else f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
