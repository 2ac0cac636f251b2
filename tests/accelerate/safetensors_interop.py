#!/usr/bin/env python3
"""safetensors interop with the real Python package: one test, one verdict.

usage: safetensors_interop.py TOOL WORKDIR

(a) C++ writes, Python reads: TOOL writes the recipe (tests/accelerate/safetensors_recipe.h);
    safetensors.torch.load_file must give exactly the tensors built here from the same recipe,
    and the files must be the bytes safetensors.torch.save writes (byte for byte with one
    metadata key; with two, the package orders metadata keys at random, so the header is
    compared as JSON and everything else byte for byte).
(b) Python writes, C++ reads: safetensors.torch.save_file writes the recipe; `TOOL check` must
    find exactly the recipe it builds itself.
(c) A checkpoint folder TOOL commits: Python's zlib.crc32 and os.path.getsize agree with every
    manifest entry, and its model.safetensors loads in Python with the recipe's tensors.
Exit status 0 when all three pass; each failure is printed.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

try:
    import safetensors
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save, save_file
except ImportError as error:
    print(f"FAIL: {error}: the venv lacks safetensors or torch (run scripts/setup)")
    sys.exit(1)

DTYPES = [("F64", torch.float64), ("F32", torch.float32), ("F16", torch.float16), ("BF16", torch.bfloat16),
          ("I64", torch.int64), ("I32", torch.int32), ("I16", torch.int16), ("I8", torch.int8),
          ("U8", torch.uint8), ("BOOL", torch.bool)]
SHAPES = [[], [0], [3], [2, 3], [2, 0, 4], [1, 2, 3, 2]]
METADATA = {"format": "pt", "note": "tandem \u2713 \"quoted\" \\ \n\t\x01\x7f"}


def values(dtype, n):
    """The same torch operations as recipe_values() in safetensors_recipe.h."""
    i = torch.arange(n, dtype=torch.int64)
    if dtype.is_floating_point:
        return ((i.to(torch.float64) - (n // 2)) * 0.25).to(dtype)
    if dtype == torch.int64:
        return (i * 1000000007 - (1 << 40)).to(dtype)
    if dtype == torch.int32:
        return (i * 65537 - (1 << 20)).to(dtype)
    if dtype == torch.int16:
        return (i * 101 - 3000).to(dtype)
    if dtype == torch.int8:
        return ((i * 7) % 256 - 128).to(dtype)
    if dtype == torch.uint8:
        return ((i * 37) % 256).to(dtype)
    if dtype == torch.bool:
        return (i % 3) == 0
    raise ValueError(dtype)


def recipe():
    tensors = {}
    for name, dtype in DTYPES:
        for s, shape in enumerate(SHAPES):
            n = 1
            for d in shape:
                n *= d
            tensors[f"{name}.s{s}"] = values(dtype, n).reshape(shape)
    tensors["F32.big"] = values(torch.float32, 256 * 33).reshape(256, 33)
    tensors["F32.special"] = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 1e-45], dtype=torch.float32)
    return tensors


def raw(t):
    """The tensor's bytes (bit for bit: NaN and -0 compare as they are stored)."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)
        print(f"FAIL: {what}")


def compare(label, got, want):
    expect(sorted(got) == sorted(want), f"{label}: names {sorted(set(got) ^ set(want))} differ")
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            continue
        expect(g.dtype == w.dtype, f"{label}: {name} has dtype {g.dtype}, expected {w.dtype}")
        expect(list(g.shape) == list(w.shape), f"{label}: {name} has shape {list(g.shape)}, expected {list(w.shape)}")
        if g.dtype == w.dtype and list(g.shape) == list(w.shape):
            expect(raw(g) == raw(w), f"{label}: {name}: the values differ")


def split(data):
    n = struct.unpack("<Q", data[:8])[0]
    return n, data[8:8 + n], data[8 + n:]


def main():
    tool, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    want = recipe()
    print(f"safetensors {safetensors.__version__}, torch {torch.__version__}: {len(want)} tensors")

    # (a) C++ writes, Python reads.
    subprocess.run([tool, "write", work], check=True)
    cpp = os.path.join(work, "cpp.safetensors")
    compare("(a) load_file of the C++ file", load_file(cpp), want)
    with safe_open(cpp, framework="pt") as f:
        expect(f.metadata() == METADATA, f"(a) metadata {f.metadata()!r}, expected {METADATA!r}")
    one_key = {"note": METADATA["note"]}
    with open(os.path.join(work, "cpp_one_key.safetensors"), "rb") as f:
        expect(f.read() == save(want, metadata=one_key), "(a) the C++ file (one metadata key) is not the bytes Python writes")
    with open(cpp, "rb") as f:
        ours = split(f.read())
    theirs = split(save(want, metadata=METADATA))
    expect(ours[0] == theirs[0] and ours[2] == theirs[2], "(a) header length or data differ from Python's")
    expect(json.loads(ours[1]) == json.loads(theirs[1]), "(a) the header differs from Python's")
    order = [[k for k in json.loads(header) if k != "__metadata__"] for header in (ours[1], theirs[1])]
    expect(order[0] == order[1], "(a) the tensors are not in Python's order")
    print("(a) C++ -> Python: checked")

    # (b) Python writes, C++ reads.
    py = os.path.join(work, "py.safetensors")
    save_file(want, py, metadata=METADATA)
    result = subprocess.run([tool, "check", py], capture_output=True, text=True)
    sys.stdout.write(result.stdout + result.stderr)
    expect(result.returncode == 0, f"(b) the C++ reader disagrees with the file Python wrote (exit {result.returncode})")
    print("(b) Python -> C++: checked")

    # (c) A checkpoint folder, verified with Python's zlib.
    root = os.path.join(work, "ckpt")
    result = subprocess.run([tool, "write-checkpoint", root], capture_output=True, text=True)
    sys.stderr.write(result.stderr)  # what the tool said, were it to fail
    expect(result.returncode == 0, f"(c) write-checkpoint failed (exit {result.returncode})")
    out = result.stdout.strip()
    expect(out == os.path.join(root, "checkpoint_000042"), f"(c) committed {out!r}")
    expect(sorted(os.listdir(root)) == ["checkpoint_000042"], f"(c) the root holds {sorted(os.listdir(root))}")
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    expect(manifest.get("format") == "tandem-checkpoint" and manifest.get("version") == 1, "(c) manifest header")
    expect(sorted(manifest.get("files", {})) == ["model.safetensors", "state.json"], f"(c) files {manifest.get('files')}")
    for name, entry in manifest.get("files", {}).items():
        with open(os.path.join(out, name), "rb") as f:
            data = f.read()
        expect(entry["size"] == len(data), f"(c) {name}: size {entry['size']} in the manifest, {len(data)} on disk")
        expect(int(entry["crc32"], 16) == zlib.crc32(data), f"(c) {name}: CRC-32 {entry['crc32']} in the manifest, "
                                                          f"{zlib.crc32(data):08x} by Python's zlib")
    compare("(c) model.safetensors", load_file(os.path.join(out, "model.safetensors")), want)
    print("(c) checkpoint folder: checked")

    if failures:
        print(f"FAILED: {len(failures)} check(s)")
        return 1
    print("PASSED: safetensors files and checkpoints interoperate with Python's safetensors and zlib")
    return 0


if __name__ == "__main__":
    sys.exit(main())
