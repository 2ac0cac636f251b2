#!/usr/bin/env python3
"""Writes grad_scaler.json: what PyTorch's own torch.amp.GradScaler does on a fixed pattern of
finite, inf and NaN gradients, the table tests/amp/grad_scaler_test.cpp replays with
tandem::amp::GradScaler.

The model: two parameters, w (4 values) and b (2 values), each with its own SGD optimizer
(w: lr 0.1, momentum 0.5; b: lr 0.05), so an inf in b alone skips b's step while w still steps,
and update() still backs the scale off (found_inf combined over optimizers). Each step:

    loss = sum(w * cw) + sum(b * cb)          # gradients are exactly scale * cw, scale * cb
    scaler.scale(loss).backward()
    if clip: scaler.unscale_(opt_w); scaler.unscale_(opt_b); clip_grad_norm_([w, b], 1.0)
    scaler.step(opt_w); scaler.step(opt_b); scaler.update()

cw and cb are exact binary fractions; the events put +inf, -inf or NaN into them, or a finite
1e36 that overflows once multiplied by the scale (every scale the pattern reaches there is >= 512,
so 1e36 * scale > float32's maximum). Non-finite values are written as the strings "inf", "-inf",
"nan" (JSON has no such numbers).

Run with the pinned wheel:  .venv/bin/python tests/oracles/make_grad_scaler_oracle.py
The output is committed; the C++ test never needs Python.
"""
import json
import math
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))

INIT_SCALE = 1024.0
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
GROWTH_INTERVAL = 3
W0 = [0.5, -0.25, 1.0, 0.75]
B0 = [0.125, -1.5]
LR_W, MOMENTUM_W, LR_B = 0.1, 0.5, 0.05
MAX_NORM = 1.0

# One entry per step: events (what is injected) and whether gradients are clipped that step.
PATTERN = [
    ([], False), ([], False), ([], False),           # 3 finite steps: 1024 -> 2048
    (["inf_w"], False),                              # backoff, tracker reset
    ([], True), ([], False),
    (["nan_b"], False),                              # only opt_b skips; scale still backs off
    ([], False), ([], True), ([], False),            # grow
    ([], False), ([], False), ([], False),           # grow
    (["big_w"], False),                              # 1e36 * 2048 overflows: backoff
    (["big_b"], True),                               # clip with an inf present; backoff
    (["neg_inf_w", "nan_b"], False),                 # both skip
    ([], False), ([], False),
    (["nan_w"], False),                              # one step short of growth: reset
    ([], False), ([], False), ([], False),           # grow
    ([], True), ([], False), ([], False),            # grow
    (["inf_b"], False),
    ([], False), ([], False), ([], False),           # grow
    ([], False), ([], False),
    (["nan_w", "inf_b"], True),
]


def constants(step):
    """The finite coefficients of step `step`: exact binary fractions."""
    cw = [((step * 7 + i * 3) % 11 - 5) / 4.0 for i in range(4)]
    cb = [((step * 5 + i * 2) % 9 - 4) / 8.0 for i in range(2)]
    return cw, cb


def inject(cw, cb, events):
    for e in events:
        kind, which = e.rsplit("_", 1)
        target = cw if which == "w" else cb
        target[0] = {"inf": math.inf, "neg_inf": -math.inf, "nan": math.nan, "big": 1e36}[kind]
    return cw, cb


def encode(values):
    out = []
    for v in values:
        if math.isnan(v):
            out.append("nan")
        elif math.isinf(v):
            out.append("inf" if v > 0 else "-inf")
        else:
            out.append(v)
    return out


def main():
    torch.manual_seed(0)
    w = torch.tensor(W0, dtype=torch.float32, requires_grad=True)
    b = torch.tensor(B0, dtype=torch.float32, requires_grad=True)
    opt_w = torch.optim.SGD([w], lr=LR_W, momentum=MOMENTUM_W)
    opt_b = torch.optim.SGD([b], lr=LR_B)
    stepped = {}

    def counting(name, opt):
        real = opt.step

        def step(*args, **kwargs):
            stepped[name] = True
            return real(*args, **kwargs)

        opt.step = step  # GradScaler calls optimizer.step(): the instance attribute wins

    counting("w", opt_w)
    counting("b", opt_b)

    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_factor=GROWTH_FACTOR,
                                  backoff_factor=BACKOFF_FACTOR, growth_interval=GROWTH_INTERVAL)
    defaults = torch.amp.GradScaler("cpu").state_dict()
    steps = []
    for t, (events, clip) in enumerate(PATTERN):
        cw, cb = inject(*constants(t), events)
        scale_used = scaler.get_scale()
        opt_w.zero_grad()
        opt_b.zero_grad()
        stepped.clear()
        loss = (w * torch.tensor(cw)).sum() + (b * torch.tensor(cb)).sum()
        scaler.scale(loss).backward()
        if clip:
            scaler.unscale_(opt_w)
            scaler.unscale_(opt_b)
            torch.nn.utils.clip_grad_norm_([w, b], MAX_NORM)
        scaler.step(opt_w)
        scaler.step(opt_b)
        scaler.update()
        state = scaler.state_dict()
        steps.append(dict(step=t, events=events, clip=clip, cw=encode(cw), cb=encode(cb),
                          scale_used=scale_used,
                          stepped_w=stepped.get("w", False), stepped_b=stepped.get("b", False),
                          scale=state["scale"], growth_tracker=state["_growth_tracker"],
                          w=w.detach().tolist(), b=b.detach().tolist()))
        if any(e.startswith("big") for e in events) and scale_used * 1e36 <= torch.finfo(torch.float32).max:
            raise SystemExit(f"step {t}: 1e36 * {scale_used} does not overflow: fix the pattern")

    table = dict(
        meta=dict(torch_version=torch.__version__, generator="tests/oracles/make_grad_scaler_oracle.py"),
        defaults=defaults,
        options=dict(init_scale=INIT_SCALE, growth_factor=GROWTH_FACTOR, backoff_factor=BACKOFF_FACTOR,
                     growth_interval=GROWTH_INTERVAL),
        model=dict(w0=W0, b0=B0, lr_w=LR_W, momentum_w=MOMENTUM_W, lr_b=LR_B, max_norm=MAX_NORM),
        steps=steps,
    )
    path = os.path.join(HERE, "grad_scaler.json")
    with open(path, "w") as f:
        json.dump(table, f, indent=1, allow_nan=False)
        f.write("\n")
    skipped = sum(1 for s in steps if not (s["stepped_w"] and s["stepped_b"]))
    print(f"wrote {path}: {len(steps)} steps, {skipped} with a skipped step, final scale {steps[-1]['scale']}")


if __name__ == "__main__":
    main()
