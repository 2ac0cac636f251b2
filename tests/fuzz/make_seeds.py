#!/usr/bin/env python3
"""Writes the seed corpora under corpus/<harness>/ (committed; rerun after changing this file).

Each seed is a small valid input, so that the fuzzer starts inside the format rather than at its
first check: IDX files of every element type (plain and gzip), safetensors files as the
format asks (every tensor of each dtype, data tiled by data_offsets), checkpoint manifests that match manifest_fuzzer.cpp's fixed
files, launch environments of every source, and `tandem run` command lines."""
import gzip
import json
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))


def write(harness, name, data):
    folder = os.path.join(HERE, "corpus", harness)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def gz(data):
    return gzip.compress(data, mtime=0)  # mtime 0: the same bytes on every run


# IDX: magic 00 00 <type> <rank>, big-endian uint32 dimensions, big-endian elements.
def idx(code, dims, element):
    body = b"".join(struct.pack(">I", d) for d in dims)
    count = 1
    for d in dims:
        count *= d
    data = b"".join(struct.pack(element, i % 7 - 3 if element != ">B" else i % 251) for i in range(count))
    return bytes([0, 0, code, len(dims)]) + body + data


idx_seeds = {
    "labels_u8": idx(0x08, [10], ">B"),
    "images_u8": idx(0x08, [2, 3, 4], ">B"),
    "i8": idx(0x09, [5], ">b"),
    "i16": idx(0x0B, [2, 2], ">h"),
    "i32": idx(0x0C, [3], ">i"),
    "f32": idx(0x0D, [1, 2, 1, 2], ">f"),
    "f64": idx(0x0E, [2], ">d"),
}
for name, data in idx_seeds.items():
    write("idx", name + ".idx", data)
    write("idx", name + ".idx.gz", gz(data))


# safetensors: u64 little-endian header length, JSON header padded with spaces to 8, data.
def safetensors(tensors, metadata=None):
    header, blob = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text.encode() + blob


write("safetensors", "model.safetensors", safetensors(
    [("fc.weight", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)), ("fc.bias", "F32", [2], struct.pack("<2f", 0, 1))],
    {"format": "pt"}))
write("safetensors", "dtypes.safetensors", safetensors([
    ("a", "F64", [1], struct.pack("<d", 1.5)), ("b", "I64", [2], struct.pack("<2q", -1, 2)),
    ("c", "I32", [1], struct.pack("<i", 7)), ("d", "F16", [2], b"\x00\x3c\x00\xc0"),
    ("e", "BF16", [1], b"\x80\x3f"), ("f", "I16", [1], struct.pack("<h", -2)),
    ("g", "I8", [2], b"\x01\xff"), ("h", "U8", [3], b"\x00\x7f\xff"), ("i", "BOOL", [2], b"\x00\x01")]))
write("safetensors", "empty_and_scalar.safetensors", safetensors(
    [("scalar", "F32", [], struct.pack("<f", 2)), ("empty", "F32", [0, 3], b"")]))
write("safetensors", "no_tensors.safetensors", safetensors([], {"step": "12"}))
# Pieces that cover their tensors (Note [Sharded files]): the only sets of one file accepted.
write("safetensors", "chunks.safetensors", safetensors(
    [("w", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)), ("s", "F32", [1], struct.pack("<f", 5))],
    {"format": "pt", "tandem_chunks": json.dumps({"w": [[0, 0], [2, 2]], "s": [[0], []]})}))
write("safetensors", "rows.safetensors", safetensors(
    [("w", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)), ("b", "I64", [1], struct.pack("<q", 9))],
    {"format": "pt", "tandem_rows": json.dumps({"w": [0, [2, 2]], "b": [0, [1]]})}))

# Checkpoint manifests, as CheckpointWriter::commit writes them, for manifest_fuzzer.cpp's files.
files = {"model.safetensors": b"tandem!\n", "state.json": b"", "rank_1/rng.bin": b"\x00\x01\x02\x03"}


def manifest(names):
    entries = {n: {"size": len(files[n]), "crc32": "%08x" % zlib.crc32(files[n])} for n in sorted(names)}
    doc = {"format": "tandem-checkpoint", "version": 1, "created": "2025-01-31T12:00:00Z", "files": entries}
    return json.dumps(doc, indent=2) + "\n"


write("manifest", "all.json", manifest(files))
write("manifest", "one.json", manifest(["model.safetensors"]))
write("manifest", "none.json", manifest([]))

# Launch environments, NAME=VALUE lines (env_fuzzer.cpp): every source World reads.
write("env", "torchrun", "RANK=1\nWORLD_SIZE=4\nLOCAL_RANK=1\nLOCAL_WORLD_SIZE=2\nGROUP_RANK=0\n"
      "MASTER_ADDR=10.0.0.1\nMASTER_PORT=29500\nTORCHELASTIC_RESTART_COUNT=1\nTORCHELASTIC_MAX_RESTARTS=3\n"
      "TORCHELASTIC_RUN_ID=job-7\nTORCHELASTIC_USE_AGENT_STORE=True\n")
write("env", "hand_started", "RANK=0\nWORLD_SIZE=2\nMASTER_ADDR=127.0.0.1\nMASTER_PORT=29500\n")
write("env", "slurm", "SLURM_PROCID=5\nSLURM_NTASKS=8\nSLURM_LOCALID=1\nSLURM_NNODES=2\n"
      "SLURM_NTASKS_PER_NODE=4(x2)\nSLURM_NODEID=1\nMASTER_ADDR=node1\nMASTER_PORT=1234\n")
write("env", "openmpi", "OMPI_COMM_WORLD_RANK=2\nOMPI_COMM_WORLD_SIZE=3\nOMPI_COMM_WORLD_LOCAL_RANK=2\n"
      "OMPI_COMM_WORLD_LOCAL_SIZE=3\nMASTER_ADDR=localhost\nMASTER_PORT=65535\n")
write("env", "single", "HOME=/root\n")

# `tandem run` command lines (cli_fuzzer.cpp splits them at whitespace).
write("cli", "simple", "run --nproc-per-node 2 -- ./train --epochs 3")
write("cli", "multinode", "run --nnodes 2 --node_rank 1 --master-addr 10.0.0.1 --master_port 29500 "
      "--max-restarts 1 --run-id job7 --log-dir logs --grace-period 2.5 ./train -- --lr 0.1")
write("cli", "keywords", "run --nproc_per_node=auto --nnodes=1 --grace-period=0 /bin/true")
write("cli", "help", "run --help")
