#!/usr/bin/env python3
"""The PyTorch peer of tandem-bench-worker: one measurement of PyTorch (or Hugging Face
accelerate) on the models of bench/workloads.h, defined here layer for layer (same module names,
shapes and parameter count), with the worker's flags and its record ("tandem-bench-run/1").

Started by `tandem bench` through `tandem run` (or torchrun): reads RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT; Gloo on CPU, NCCL on CUDA. Strategies: single (plain loop), ddp
(torch DDP), ddp-no-sync (DDP under no_sync()), zero1 (ZeroRedundancyOptimizer), fsdp (FSDP2's
fully_shard), tp and fsdp+tp (parallelize_module with the worker's plan and loss_parallel, FSDP2
across the TP pairs), pp-gpipe, pp-1f1b, pp-interleaved (torch.distributed.pipelining: the GPT cut
into the worker's stages, ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B), accelerate
(accelerate.Accelerator), dp (torch.nn.DataParallel over --replicas CUDA devices).
dp-replicate, dp-persistent, zero2, allreduce and sweep are Tandem's alone: they give the
"unsupported" record, as does any combination that cannot run here. Rank 0 appends one JSON line to --out (or prints it); every rank exits 0.
Bad flags: one line on stderr, exit 2. --list-strategies prints STRATEGIES as JSON.
"""
import argparse
import contextlib
import json
import math
import os
import resource
import sys
import time

RECORD = "tandem-bench-run/1"
# What keeps Gloo's threads past destroy_process_group, when a peer used it (see exit's note):
# FSDP2, or the device mesh of tensor parallelism's DTensors (torch 2.11 caches meshes and their
# groups beyond the modules' life).
GLOO_HOLDER = ""
# Tensor parallelism (the table's tp_size): "tp" cuts over every rank, "fsdp+tp" over pairs with
# FSDP2 across them; only the GPT has a plan (gpt_tp_plan in bench/workloads.h).
TP_SIZE = {"tp": -1, "fsdp+tp": 2}
# Pipeline parallelism (the table's pp_schedule): one pipeline over every rank, the GPT only.
PP_SCHEDULE = {"pp-gpipe": "gpipe", "pp-1f1b": "1f1b", "pp-interleaved": "interleaved"}
# Every strategy of Tandem's table (src/bench/strategies.cpp), in its order: how it occupies its
# devices (alone, replicas in one process, or ranks) and whether this peer measures it. The test
# bench.strategies.peer holds this table to `tandem-bench-worker --list-strategies`.
STRATEGIES = {
    "single": ("alone", True),
    "dp-replicate": ("replicas", False),
    "dp-persistent": ("replicas", False),
    "ddp": ("ranks", True),
    "accelerate": ("ranks", True),
    "zero1": ("ranks", True),
    "zero2": ("ranks", False),
    "fsdp": ("ranks", True),
    "tp": ("ranks", True),
    "fsdp+tp": ("ranks", True),
    "pp-gpipe": ("ranks", True),
    "pp-1f1b": ("ranks", True),
    "pp-interleaved": ("ranks", True),
    "accelerate-zero1": ("ranks", False),
    "accelerate-zero2": ("ranks", False),
    "dp": ("replicas", True),
    "ddp-no-sync": ("ranks", True),
    "allreduce": ("ranks", False),
    "sweep": ("ranks", False),
}


def launch(a):
    return STRATEGIES[a.strategy][0]


def gpt_config(scale):  # (V, T, d, L, heads): the large model (bench/workloads.h)
    return {"tiny": (128, 16, 32, 3, 2), "cpu": (4096, 64, 192, 4, 6), "full": (8192, 256, 512, 8, 8)}[scale]


def tp_group_size(a, world):
    size = TP_SIZE.get(a.strategy, 1)
    return world if size == -1 else size


def pp_stages_per_rank(a):
    return {"": 0, "interleaved": 2}.get(PP_SCHEDULE.get(a.strategy, ""), 1)


def batch_group_size(a, world):
    """The ranks that train one batch together: a TP group, or the whole pipeline."""
    return world if a.strategy in PP_SCHEDULE else tp_group_size(a, world)


def microbatches(a, world):
    return a.microbatches or 2 * world


def stage_blocks(layers, stage, stages):
    """Blocks [first, last) of stage `stage` (pp::stage_blocks): the first layers % stages one more."""
    base, extra = divmod(layers, stages)
    first = stage * base + min(stage, extra)
    return first, first + base + (1 if stage < extra else 0)


def pipeline_refusal(a, world):
    """The worker's refusals of a pipeline (Note [Pipeline measurements] in bench/worker.cpp)."""
    if a.model != "large":
        return f"{a.strategy} has a plan for the large model only, not {a.model}"
    if world < 2:
        return f"{a.strategy} is a pipeline of a stage per rank: it needs at least 2 ranks (got {world})"
    v, layers = pp_stages_per_rank(a), gpt_config(a.scale)[3]
    if layers < world * v - 1:
        return (f"{a.strategy}: the {a.scale} GPT's {layers} blocks cannot fill {world * v} pipeline stages "
                "(every stage but the last needs one)")
    m = microbatches(a, world)
    if m < world or (v > 1 and m % world) or a.batch_size * world < m:
        return (f"{a.strategy} at {world} ranks cannot run {m} microbatches: it needs at least {world}"
                f"{', a multiple of them,' if v > 1 else ''} and at most the batch's {a.batch_size * world} samples")
    return None


def table_refusal(a, world):
    """The strategy table's own refusals (bench::table_refusal): a model without a plan, a mesh
    the world does not make, heads or classes that do not divide among a TP group, a pipeline
    the model or the microbatches cannot fill."""
    if a.strategy in PP_SCHEDULE:
        return pipeline_refusal(a, world)
    if a.strategy not in TP_SIZE:
        return None
    if a.model != "large":
        return f"{a.strategy} has a plan for the large model only, not {a.model}"
    size = TP_SIZE[a.strategy]
    if size > 0 and (world % size != 0 or world // size < 2):
        return (f"{a.strategy} needs a 2-D mesh of at least two tensor-parallel groups of {size}: a multiple of "
                f"{size} ranks, at least {2 * size} (got {world})")
    tp = tp_group_size(a, world)
    vocab, _, _, _, heads = gpt_config(a.scale)
    if heads % tp or vocab % tp:
        return f"{a.strategy} cuts the GPT's {heads} heads and {vocab} classes over {tp} ranks: they do not divide"
    return None

# ---- flags and the record -------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's default prints the usage too)
        sys.stderr.write(f"peer.py: {message}\n")
        sys.exit(2)


def positive(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not positive")
    return value


def non_negative(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def seconds(text):
    value = float(text)
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 3600")
    return value


def parse_flags(argv=None):
    ap = Parser(description="One measurement of PyTorch, the peer of tandem-bench-worker")
    ap.add_argument("--model", choices=["small", "medium", "large"], default="small")
    ap.add_argument("--scale", choices=["tiny", "cpu", "full"], default="cpu")
    ap.add_argument("--strategy", choices=list(STRATEGIES), default="ddp")
    ap.add_argument("--batch-size", type=positive, default=32, help="samples per device")
    ap.add_argument("--steps", type=positive, default=20, help="timed steps")
    ap.add_argument("--warmup", type=non_negative, default=3, help="untimed steps first")
    ap.add_argument("--min-seconds", type=seconds, default=0.0,
                    help="timed steps last at least this long (more than --steps)")
    ap.add_argument("--threads", type=positive, default=1, help="intra-op threads of this process")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--replicas", type=positive, default=2, help="dp: replicas (CUDA devices)")
    ap.add_argument("--sweep-min-bytes", type=positive, default=4096, help="sweep: smallest buffer (the worker's)")
    ap.add_argument("--sweep-max-bytes", type=positive, default=64 << 20, help="sweep: largest buffer")
    ap.add_argument("--microbatches", type=positive, default=0, help="pp-*: per step (default: twice the ranks)")
    ap.add_argument("--out", help="append the record here (default: stdout)")
    ap.add_argument("--list-strategies", action="store_true", help="print STRATEGIES as JSON and exit")
    a = ap.parse_args(argv)
    if a.list_strategies:
        print(json.dumps({name: {"launch": how, "pytorch": measured} for name, (how, measured) in STRATEGIES.items()}))
        sys.exit(0)
    if a.sweep_max_bytes < 4096:
        ap.error(f"--sweep-max-bytes: {a.sweep_max_bytes} is below 4096")
    return a


def record_world(a, world):
    """Devices used: the replicas for dp (and the worker's dp-*), else the ranks."""
    return a.replicas if launch(a) == "replicas" else world


def record_head(a, world):
    return {"record": RECORD, "impl": "pytorch", "model": a.model, "scale": a.scale, "strategy": a.strategy,
            "device": a.device, "precision": a.precision, "world": record_world(a, world),
            "nodes": max(1, world // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world))))}


def emit(a, record):
    line = json.dumps(record)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")
    else:
        print(line, flush=True)


def unsupported_without_torch(a, world):
    """Why the combination cannot run, decided before importing torch (the cheap cases)."""
    if a.strategy in ("dp-replicate", "dp-persistent"):
        return ("PyTorch's DataParallel has no modes: torch.nn.DataParallel is measured as strategy dp "
                "(dp-replicate and dp-persistent are Tandem's)")
    if a.strategy in ("allreduce", "sweep"):
        return f"{a.strategy} times Tandem's process group: the Tandem worker measures it, not the PyTorch peer"
    if not STRATEGIES[a.strategy][1]:
        return f"{a.strategy} is Tandem's alone: the Tandem worker measures it, not the PyTorch peer"
    if a.strategy == "dp" and a.device == "cpu":
        return "torch.nn.DataParallel replicates only across CUDA devices; on CPU it runs the module once"
    if launch(a) != "ranks" and world > 1:
        return f"{a.strategy} runs in one process, but {world} were launched"
    if (a.strategy in TP_SIZE or a.strategy in PP_SCHEDULE) and a.precision == "fp16":
        return f"{a.strategy} does not support --precision fp16"
    return table_refusal(a, world)


def percentile(values, p):
    """Linear-interpolated percentile (numpy's default), p in [0, 1]."""
    if not values:
        return 0.0
    v = sorted(values)
    pos = p * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def exit_if_unsupported_without_torch():
    """The cheap cases, decided before importing torch: an unsupported record costs no import."""
    a = parse_flags()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    reason = unsupported_without_torch(a, world)
    if reason:
        if rank == 0:
            emit(a, dict(record_head(a, world), unsupported=reason))
        sys.exit(0)


if __name__ == "__main__":
    exit_if_unsupported_without_torch()

# ---- the models (bench/workloads.h) ---------------------------------------------------------------

import torch  # noqa: E402
import torch.distributed.nn  # noqa: E402,F401  before any process group: Note [Gloo threads at exit]
from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: E402  the same: its defaults bind group.WORLD
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# Note [Gloo threads at exit] is in gloo_exit.py, beside this file.
from gloo_exit import end_process_group, exit_without_gloo_threads  # noqa: E402


def mlp_dims(scale):
    return [784, 32, 10] if scale == "tiny" else [784, 512, 256, 10]


class Mlp(nn.Module):
    """Linear layers fc0, fc1, ... with ReLU between them."""

    def __init__(self, dims):
        super().__init__()
        self.count = len(dims) - 1
        for i in range(self.count):
            setattr(self, f"fc{i}", nn.Linear(dims[i], dims[i + 1]))

    def forward(self, x):
        h = x.flatten(1)
        for i in range(self.count):
            h = getattr(self, f"fc{i}")(h)
            if i + 1 < self.count:
                h = F.relu(h)
        return h


def resnet_config(scale):  # (w, H)
    return {"tiny": (4, 16), "cpu": (16, 32), "full": (64, 32)}[scale]


def conv3x3(cin, cout, stride):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.bn1 = conv3x3(cin, cout, stride), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = conv3x3(cout, cout, 1), nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    """ResNet-18's topology with the CIFAR stem (conv3x3, no max pool), widths w, 2w, 4w, 8w."""

    def __init__(self, config):
        super().__init__()
        w, _ = config
        self.conv1, self.bn1 = conv3x3(3, w, 1), nn.BatchNorm2d(w)
        self.layer1 = self.stage(w, w, 1)
        self.layer2 = self.stage(w, 2 * w, 2)
        self.layer3 = self.stage(2 * w, 4 * w, 2)
        self.layer4 = self.stage(4 * w, 8 * w, 2)
        self.fc = nn.Linear(8 * w, 10)

    @staticmethod
    def stage(cin, cout, stride):
        return nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.layer4(self.layer3(self.layer2(self.layer1(h))))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


class GptBlock(nn.Module):
    """Pre-LN: x + proj(causal attention(ln1(x))), then x + fc2(gelu(fc1(ln2(x)))); q, k, v apart
    (tensor parallelism cuts each by heads)."""

    def __init__(self, dim, heads):
        super().__init__()
        self.head_dim = dim // heads
        self.ln1, self.q, self.k, self.v = nn.LayerNorm(dim), nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, _ = x.shape

        def split(y):  # as many heads as q gives (heads / tp of them under tensor parallelism)
            return y.view(b, t, -1, self.head_dim).transpose(1, 2)

        normed = self.ln1(x)
        y = F.scaled_dot_product_attention(split(self.q(normed)), split(self.k(normed)), split(self.v(normed)),
                                           dropout_p=0.0, is_causal=True)
        h = x + self.proj(y.transpose(1, 2).reshape(b, t, -1))
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))


class Gpt(nn.Module):
    def __init__(self, config):
        super().__init__()
        vocab, context, dim, layers, heads = config
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*[GptBlock(dim, heads) for _ in range(layers)])
        self.ln_f, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, tokens):  # [B,T] -> [B,T,V]
        positions = torch.arange(tokens.size(1), device=tokens.device)
        return self.head(self.ln_f(self.blocks(self.tok_emb(tokens) + self.pos_emb(positions))))


class GptStage(nn.Module):
    """Stage `stage` of `stages` of a Gpt (the worker's GptStage): its blocks, the embeddings on
    the first stage, the final LayerNorm and the head on the last, sharing the whole model's
    parameters; each forward under autocast to `dtype` when given (the worker's)."""

    def __init__(self, whole, stage, stages, device_type, dtype):
        super().__init__()
        self.device_type, self.dtype = device_type, dtype
        self.tok_emb = whole.tok_emb if stage == 0 else None
        self.pos_emb = whole.pos_emb if stage == 0 else None
        first, last = stage_blocks(len(whole.blocks), stage, stages)
        self.blocks = nn.ModuleDict({str(i): whole.blocks[i] for i in range(first, last)})
        self.ln_f = whole.ln_f if stage == stages - 1 else None
        self.head = whole.head if stage == stages - 1 else None

    def forward(self, x):
        with torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None):
            h = x
            if self.tok_emb is not None:
                h = self.tok_emb(x) + self.pos_emb(torch.arange(x.size(1), device=x.device))
            for block in self.blocks.values():
                h = block(h)
            return self.head(self.ln_f(h)) if self.head is not None else h


def make_model(model, scale):
    if model == "small":
        return Mlp(mlp_dims(scale))
    if model == "medium":
        return ResNet(resnet_config(scale))
    return Gpt(gpt_config(scale))


def synthetic_batch(model, scale, batch, seed):
    """The worker's batch, value for value (the same CPU generator and draws)."""
    g = torch.Generator().manual_seed(seed)
    if model == "small":
        x = torch.randn(batch, 1, 28, 28, generator=g)
        return x, torch.randint(0, 10, (batch,), generator=g)
    if model == "medium":
        _, image = resnet_config(scale)
        x = torch.randn(batch, 3, image, image, generator=g)
        return x, torch.randint(0, 10, (batch,), generator=g)
    vocab, context, _, _, _ = gpt_config(scale)
    seq = torch.randint(0, vocab, (batch, context + 1), generator=g)
    return seq[:, :context].contiguous(), seq[:, 1:].contiguous()


def loss_of(output, target):
    """Cross entropy over the output flattened to [-1, classes] and the target to [-1]."""
    return F.cross_entropy(output.reshape(-1, output.size(-1)), target.reshape(-1))


# ---- the measurement ------------------------------------------------------------------------------


class Loop:
    """warmup + steps iterations; the timed ones' durations and their phases'. On CUDA every
    phase and step ends with a synchronize. With --min-seconds, enough steps to fill that time,
    agreed by the ranks through `slowest` (the worker's Loop)."""

    def __init__(self, a, slowest=None):
        self.a = a
        self.slowest = slowest  # seconds -> the slowest rank's; None: exactly --steps
        self.times, self.forward, self.backward, self.optimizer = [], [], [], []
        self.faults_per_step = 0.0  # the process's minor page faults over the timed steps, per step
        self.steps = 0  # timed steps run
        self.timed = False

    def sync(self):
        if self.a.device == "cuda":
            torch.cuda.synchronize()

    def phase(self, into, f):
        start = time.perf_counter()
        out = f()
        self.sync()
        if self.timed:
            into.append(time.perf_counter() - start)
        return out

    def run(self, step):
        last_warmup = 0.0
        for _ in range(self.a.warmup):
            start = time.perf_counter()
            step()
            self.sync()
            last_warmup = time.perf_counter() - start
        self.steps = self.timed_steps(last_warmup)
        self.timed = True
        faults_before = minor_faults()
        for _ in range(self.steps):
            start = time.perf_counter()
            step()
            self.sync()
            self.times.append(time.perf_counter() - start)
        self.faults_per_step = (minor_faults() - faults_before) / self.steps
        self.timed = False

    def timed_steps(self, step_seconds):
        a = self.a
        if a.min_seconds <= 0 or a.warmup == 0 or self.slowest is None:
            return a.steps
        # At most 100,000 steps for the time (a step of a microsecond), never fewer than --steps.
        wanted = min(math.ceil(a.min_seconds / max(self.slowest(step_seconds), 1e-6)), 100000)
        return max(a.steps, int(wanted))


def minor_faults():
    """The process's minor page faults so far (the worker's Note [Host allocator])."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def model_state_bytes(net, opt):
    """This rank's parameter, gradient and optimizer-state bytes, accounted from the tensors (the
    worker's model_state_bytes): ZeroRedundancyOptimizer keeps its share in opt.optim.state. The
    gradients as they are after the step: under tensor parallelism PyTorch's gradient of a
    row-cut embedding is whole (Replicate) on every rank, larger than its parameter."""
    def local(t):  # FSDP2's and TP's DTensors: this rank's part
        return t.to_local() if hasattr(t, "to_local") else t

    state = getattr(opt, "optim", opt).state
    tensors = [local(t) for s in state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    grads = [local(p.grad if p.grad is not None else p) for p in net.parameters() if p.requires_grad]
    return [sum(local(p).numel() * local(p).element_size() for p in net.parameters()),
            sum(g.numel() * g.element_size() for g in grads),
            sum(t.numel() * t.element_size() for t in tensors)]


def ddp_buckets(model):
    try:
        return len(model.reducer._get_zeros_like_grad_buckets())
    except Exception:  # private API: a count only, never worth a failed run
        return 0


class Measurement:
    def __init__(self, a, rank, world):
        self.a, self.rank, self.world = a, rank, world
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.cuda = a.device == "cuda"
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
        self.versions = {"torch": torch.__version__}

    def unsupported(self):
        a = self.a
        if self.cuda:
            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if gpus == 0:
                return "no CUDA device is visible"
            if a.strategy == "dp" and a.replicas > gpus:
                return f"{a.replicas} replicas need {a.replicas} GPUs, but {gpus} are visible"
            if a.strategy != "dp" and self.local_rank >= gpus:
                return f"LOCAL_RANK {self.local_rank} needs GPU {self.local_rank}, but {gpus} are visible"
        if self.dtype is not None:
            try:
                with torch.autocast(a.device, dtype=self.dtype):
                    pass
            except Exception as e:  # noqa: BLE001
                return f"autocast to {a.precision} on {a.device}: {str(e).splitlines()[0] if str(e) else e!r}"
        return None

    def emit_unsupported(self, reason):
        if self.rank == 0:
            emit(self.a, dict(record_head(self.a, self.world), unsupported=reason))
        return 0

    def run(self):
        a = self.a
        reason = self.unsupported()
        if reason:
            return self.emit_unsupported(reason)
        torch.set_num_threads(a.threads)
        if self.cuda:
            torch.cuda.set_device(self.local_rank if a.strategy != "dp" else 0)
        if a.strategy == "accelerate":
            return self.run_accelerate()
        dist = torch.distributed
        if a.strategy in ("ddp", "ddp-no-sync", "zero1", "fsdp", "tp", "fsdp+tp") or a.strategy in PP_SCHEDULE:
            backend = "nccl" if self.cuda else "gloo"
            if "MASTER_ADDR" in os.environ:
                dist.init_process_group(backend, rank=self.rank, world_size=self.world)
            else:  # alone, as a world of one (the Tandem worker does the same)
                dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        try:
            self.report(self.measure())  # measure's model is freed when it returns
        finally:
            end_process_group()
        return 0

    def device(self):
        if not self.cuda:
            return torch.device("cpu")
        return torch.device("cuda", 0 if self.a.strategy == "dp" else self.local_rank)

    def setup(self):
        """The model (seed 0), its counts, and this rank's batch on the device."""
        a = self.a
        torch.manual_seed(0)
        net = make_model(a.model, a.scale)
        params = sum(p.numel() for p in net.parameters())
        grad_bytes = sum(p.numel() * 4 for p in net.parameters() if p.requires_grad)  # fp32
        # DataParallel: B per replica; a TP group, or the pipeline, trains one batch of B per rank
        # in it (the worker's).
        group = batch_group_size(a, self.world)
        samples = a.batch_size * a.replicas if a.strategy == "dp" else a.batch_size * group
        x, y = synthetic_batch(a.model, a.scale, samples, 100 + self.rank // group)
        return net, params, grad_bytes, x, y

    def plain_step(self, loop, model, opt, scaler, x, y, no_sync=False, loss_context=contextlib.nullcontext):
        opt.zero_grad()

        def forward():
            if self.dtype is None:
                return loss_of(model(x), y)
            with torch.autocast(self.a.device, dtype=self.dtype):
                return loss_of(model(x), y)

        def backward(loss):
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()

        def step():
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()

        with model.no_sync() if no_sync else contextlib.nullcontext(), loss_context():
            loss = loop.phase(loop.forward, forward)
            loop.phase(loop.backward, lambda: backward(loss))
        loop.phase(loop.optimizer, step)

    def measure(self):
        a = self.a
        if a.strategy in PP_SCHEDULE:
            return self.measure_pipeline()
        net, params, grad_bytes, x, y = self.setup()
        device = self.device()
        net.to(device)
        x, y = x.to(device), y.to(device)
        buckets = 0
        loss_context = contextlib.nullcontext
        if a.strategy == "single":
            model = net
        elif a.strategy == "dp":
            model = nn.DataParallel(net, device_ids=list(range(a.replicas)))
        elif a.strategy == "fsdp":
            model = self.fully_shard_units(net)
        elif a.strategy in TP_SIZE:
            model, loss_context = self.tensor_parallel(net), self.loss_parallel
        else:
            model = nn.parallel.DistributedDataParallel(net, device_ids=[self.local_rank] if self.cuda else None)
        if a.strategy == "zero1":  # ZeRO-1: PyTorch's ZeroRedundancyOptimizer over the same SGD
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.01, momentum=0.9)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        scaler = torch.amp.GradScaler(a.device) if a.precision == "fp16" else None
        loop = Loop(a, self.slowest)
        no_sync = a.strategy == "ddp-no-sync"
        loop.run(lambda: self.plain_step(loop, model, opt, scaler, x, y, no_sync, loss_context))
        if a.strategy in ("ddp", "ddp-no-sync", "zero1"):
            buckets = ddp_buckets(model)
        devices = list(range(a.replicas)) if a.strategy == "dp" else None
        state = model_state_bytes(net, opt) if a.strategy in ("ddp", "zero1", "fsdp") or a.strategy in TP_SIZE else None
        return dict(loop=loop, params=params, grad_bytes=grad_bytes, buckets=buckets, devices=devices, state=state)

    def measure_pipeline(self):
        """torch.distributed.pipelining over every rank, cut as the worker cuts (Note [Pipeline
        measurements] in bench/worker.cpp). The share of each timed step a rank waits in the
        schedule's point-to-point waits (its _wait_batch_p2p, timed in place) is its bubble; the
        activations a step holds are measured on CUDA only (the CPU allocator keeps no count)."""
        import torch.distributed.pipelining.schedules as schedules
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

        a, world, rank = self.a, self.world, self.rank
        net, params, grad_bytes, x, y = self.setup()
        device = self.device()
        net.to(device)
        x, y = x.to(device), y.to(device)
        v, m = pp_stages_per_rank(a), microbatches(a, world)
        stages = world * v
        modules = [GptStage(net, s, stages, device.type, self.dtype) for s in range(rank, stages, world)]
        pipeline = [PipelineStage(mod, s, stages, device) for mod, s in zip(modules, range(rank, stages, world))]

        def loss_fn(output, target):
            with torch.autocast(device.type, dtype=self.dtype, enabled=self.dtype is not None):
                return loss_of(output, target)

        kind = PP_SCHEDULE[a.strategy]
        if kind == "interleaved":
            schedule = ScheduleInterleaved1F1B(pipeline, n_microbatches=m, loss_fn=loss_fn)
        else:
            schedule = (ScheduleGPipe if kind == "gpipe" else Schedule1F1B)(pipeline[0], n_microbatches=m, loss_fn=loss_fn)
        opt = torch.optim.SGD([p for mod in modules for p in mod.parameters()], lr=0.01, momentum=0.9)
        waited = [0.0]
        wait = schedules._wait_batch_p2p

        def timed_wait(work):
            start = time.perf_counter()
            try:
                return wait(work)
            finally:
                waited[0] += time.perf_counter() - start

        schedules._wait_batch_p2p = timed_wait
        loop, bubble = Loop(a, self.slowest), []

        def step():
            opt.zero_grad()
            waited[0], start = 0.0, time.perf_counter()
            args = (x,) if rank == 0 else ()
            schedule.step(*args, **({"target": y, "losses": []} if rank == world - 1 else {}))
            seconds = time.perf_counter() - start
            if loop.timed:
                bubble.append(waited[0] / seconds if seconds > 0 else 0.0)
            loop.phase(loop.optimizer, opt.step)

        try:
            loop.run(step)
            held = -1
            if self.cuda:
                held = 0
                for _ in range(2):
                    torch.cuda.reset_peak_memory_stats(device)
                    start = torch.cuda.memory_allocated(device)
                    step()
                    held = max(held, torch.cuda.max_memory_allocated(device) - start)
        finally:
            schedules._wait_batch_p2p = wait
        return dict(loop=loop, params=params, grad_bytes=grad_bytes, buckets=0, devices=None, state=None,
                    pp_bubble=percentile(bubble, 0.5), pp_activation_bytes=held)

    def fully_shard_units(self, net, mesh=None):
        """FSDP2 on Tandem's units (Sequential entries, the GPT's embedding and head), over `mesh`
        (None: the world)."""
        global GLOO_HOLDER
        GLOO_HOLDER = "FSDP2"
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        # Mixed precision as accelerate sets FSDP2's, and as Tandem's Accelerator sets its own:
        # gather, compute and reduce in the autocast dtype; float32 shards.
        policy = MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=self.dtype)

        def auto_wrap(module):  # Tandem's auto_wrap: top down, never inside a unit
            if isinstance(module, nn.Sequential):
                for entry in module:
                    if any(True for _ in entry.parameters()):
                        fully_shard(entry, mesh=mesh, mp_policy=policy)
            for child in module.children():
                if not isinstance(child, FSDPModule):
                    auto_wrap(child)

        auto_wrap(net)
        for name in ("tok_emb", "head"):
            if hasattr(net, name):
                fully_shard(getattr(net, name), mesh=mesh, mp_policy=policy)
        return fully_shard(net, mesh=mesh, mp_policy=policy)

    def tensor_parallel(self, net):
        """parallelize_module with the worker's plan (gpt_tp_plan) over the mesh's "tp" dimension,
        the head's logits kept cut for loss_parallel; under fsdp+tp FSDP2 across the "dp" one."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        global GLOO_HOLDER
        GLOO_HOLDER = "DTensor's device mesh"
        tp = tp_group_size(self.a, self.world)
        mesh = init_device_mesh(self.device().type, (self.world // tp, tp), mesh_dim_names=("dp", "tp"))
        plan = {"tok_emb": RowwiseParallel(input_layouts=Replicate()),
                "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
        for i in range(len(net.blocks)):
            plan.update({f"blocks.{i}.{n}": ColwiseParallel() for n in ("q", "k", "v", "fc1")})
            plan.update({f"blocks.{i}.{n}": RowwiseParallel() for n in ("proj", "fc2")})
        parallelize_module(net, mesh["tp"], plan)
        return self.fully_shard_units(net, mesh["dp"]) if mesh["dp"].size() > 1 else net

    @staticmethod
    def loss_parallel():
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def run_accelerate(self):
        """Hugging Face accelerate's loop: prepare, accumulate, backward, step, zero_grad."""
        a = self.a
        import accelerate
        from accelerate import Accelerator

        self.versions["accelerate"] = accelerate.__version__
        mixed = {"fp32": "no"}.get(a.precision, a.precision)
        try:
            acc = Accelerator(cpu=not self.cuda, mixed_precision=mixed)
        except ValueError as e:  # the process group may exist already
            end_process_group()
            return self.emit_unsupported(f"accelerate {accelerate.__version__}: {e}")
        torch.set_num_threads(a.threads)  # accelerate sets its own when OMP_NUM_THREADS is unset
        try:
            if a.precision != "fp32" and not acc.native_amp:
                # accelerate accepts fp16 on CPU but then neither autocasts nor scales: it would run fp32.
                return self.emit_unsupported(
                    f"accelerate {accelerate.__version__} on {acc.device.type} accepts mixed_precision='{mixed}' "
                    "but neither autocasts nor scales the loss: it would run fp32")
            result = self.measure_accelerate(acc)
            mine = self.my_numbers(result)
            gathered = acc.gather(mine.to(acc.device)).cpu().view(-1, mine.numel()) if self.world > 1 else mine.view(1, -1)
            if acc.is_main_process:
                emit(a, self.record(result, gathered))
            acc.wait_for_everyone()
        finally:
            acc.free_memory()  # its prepared model holds the process group (Note [Gloo threads at exit])
            acc.end_training()
            end_process_group()
        return 0

    def measure_accelerate(self, acc):
        """The timed loop on accelerate's prepared model and optimizer, which are dropped on return."""
        a = self.a
        net, params, grad_bytes, x, y = self.setup()
        model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9))
        x, y = x.to(acc.device), y.to(acc.device)
        loop = Loop(a, self.slowest)

        def step():
            with acc.accumulate(model):
                loss = loop.phase(loop.forward, lambda: loss_of(model(x), y))  # autocast inside
                loop.phase(loop.backward, lambda: acc.backward(loss))

                def optimize():
                    opt.step()
                    opt.zero_grad()

                loop.phase(loop.optimizer, optimize)

        loop.run(step)
        buckets = ddp_buckets(model) if isinstance(model, nn.parallel.DistributedDataParallel) else 0
        return dict(loop=loop, params=params, grad_bytes=grad_bytes, buckets=buckets, devices=None)

    def slowest(self, seconds):
        """The largest of every rank's `seconds`: the ranks run the same number of steps."""
        dist = torch.distributed
        if not (dist.is_initialized() and self.world > 1):
            return seconds
        t = torch.tensor([seconds], dtype=torch.float64, device=self.device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def my_numbers(self, result):
        if self.cuda:
            memory = torch.cuda.max_memory_allocated(self.device())
        else:
            memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        loop = result["loop"]
        state = result.get("state") or [-1, -1, -1]
        return torch.tensor([percentile(loop.times, 0.5), float(memory), loop.faults_per_step] + [float(b) for b in state] +
                            [result.get("pp_bubble", -1.0), float(result.get("pp_activation_bytes", -1))],
                            dtype=torch.float64)

    def report(self, result):
        """Every rank's p50 and memory reach rank 0, which emits the record."""
        mine = self.my_numbers(result)
        dist = torch.distributed
        if dist.is_initialized() and self.world > 1:
            mine = mine.to(self.device())  # NCCL gathers CUDA tensors only
            gathered = [torch.zeros_like(mine) for _ in range(self.world)]
            dist.all_gather(gathered, mine)
            gathered = torch.stack([g.cpu() for g in gathered])
        else:
            gathered = mine.view(1, -1)
        if self.rank == 0:
            emit(self.a, self.record(result, gathered))
        if dist.is_initialized():
            dist.barrier()

    def pipeline_fields(self, gathered):
        """The worker's pipeline fields (Note [Pipeline measurements])."""
        a, world = self.a, self.world
        v, m = pp_stages_per_rank(a), microbatches(a, world)
        return {"pp_schedule": PP_SCHEDULE[a.strategy], "pp_microbatches": m, "pp_stages_per_rank": v,
                "rank_pp_bubble": [g[6].item() for g in gathered],
                "pp_bubble_theory": (world - 1) / (v * m + world - 1),
                "rank_pp_activation_bytes": [int(g[7].item()) for g in gathered]}

    def record(self, result, gathered):
        a, loop = self.a, result["loop"]
        peak = [int(g[1].item()) for g in gathered]
        mem_kind = "cuda" if self.cuda else "rss"
        if result["devices"] is not None:  # dp on CUDA: per device
            peak = [torch.cuda.max_memory_allocated(d) for d in result["devices"]]
        return dict(
            record_head(a, self.world),
            batch_per_device=a.batch_size, steps=loop.steps, warmup=a.warmup, threads=a.threads,
            params=result["params"], grad_bytes=result["grad_bytes"], buckets=result["buckets"],
            p50_s=percentile(loop.times, 0.5), p95_s=percentile(loop.times, 0.95),
            rank_p50_s=[g[0].item() for g in gathered],
            forward_p50_s=percentile(loop.forward, 0.5), backward_p50_s=percentile(loop.backward, 0.5),
            optimizer_p50_s=percentile(loop.optimizer, 0.5),
            peak_mem_bytes=peak, mem_kind=mem_kind,
            rank_faults_per_step=[round(g[2].item()) for g in gathered],
            # Python keeps glibc's malloc as it is, unless the environment tunes it.
            host_allocator="tunables" if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "") else "system",
            versions=self.versions,
            # CPU collectives: always Gloo here (PyTorch's wheel has no MPI); one process: none.
            **({} if self.cuda or launch(a) != "ranks" else {"backend": "gloo"}),
            **({} if a.strategy not in PP_SCHEDULE else self.pipeline_fields(gathered)),
            **({} if not result.get("state") else {"model_state_bytes": [
                {"params": int(g[3].item()), "grads": int(g[4].item()), "optimizer": int(g[5].item())}
                for g in gathered]}))


def main(argv=None):
    a = parse_flags(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    reason = unsupported_without_torch(a, world)
    if reason:
        if rank == 0:
            emit(a, dict(record_head(a, world), unsupported=reason))
        return 0
    return Measurement(a, rank, world).run()


if __name__ == "__main__":
    exit_without_gloo_threads(main(), GLOO_HOLDER)
