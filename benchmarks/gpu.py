"""GPT-2 124M in bf16 on one GPU: shardwise's engine against the eager model, side by side.

    python benchmarks/gpu.py                      # CUDA: GPT-2 124M, batch 8 x 1024, bf16
    python benchmarks/gpu.py --smoke              # anywhere: a 2-layer GPT-2, batch 2 x 64 (CI's CPU run)
    python benchmarks/gpu.py --json report.json   # the figures as JSON too
    python benchmarks/gpu.py --record             # + the table into results/gpu.json and the README

One process, world size 1 (NCCL on CUDA, Gloo on the CPU): the engine runs the plan the
search makes for this device (Cluster.detect()), which is the whole model on one rank, so
the step-time ratio measures what the rewrite and the runtime add to the eager step.

Printed, each measured in this run:
 - step time: the median of --steps timed AdamW steps after --warmup, engine and eager,
   measured alternately in blocks (engine, eager, engine, eager) so drift hits both; the
   ratio engine / eager (issue 22's target: at most 1.02);
 - model FLOP/s and MFU: model FLOPs per step = 3 x the forward's matmul FLOPs (every
   Linear / Conv1D and the tied LM head, 2 x rows x in x out each, plus attention's
   scores and weighted sum, 2 x 2 x batch x seq^2 x hidden per layer, causal or not), no
   recomputation counted; MFU against the bf16 peak of a timed 8192^3 matmul on this GPU
   and against the datasheet's dense bf16 peak where the card is known;
 - peak memory: torch.cuda.max_memory_allocated over the engine's steps against the plan's
   predicted memory per rank (target: within 10%), and the eager run's peak beside it.
Timing never fails a test: tests/python/test_benchmarks.py runs --smoke on the CPU and checks
that every figure is printed.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn

DATASHEET_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense, SXM


class WithLoss(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, labels):
        return self.m(input_ids=input_ids, labels=labels, use_cache=False).loss


def model_flops(config, batch: int, seq: int) -> float:
    """Training FLOPs of one step of GPT-2 (forward x 3), no recomputation."""
    h, layers, vocab = config.n_embd, config.n_layer, config.vocab_size
    inner = config.n_inner or 4 * h
    tokens = batch * seq
    per_layer = 2 * tokens * (h * 3 * h + h * h + h * inner + inner * h) + 2 * 2 * batch * seq * seq * h
    head = 2 * tokens * h * vocab
    return 3.0 * (layers * per_layer + head)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_matmul_peak(device: torch.device, n: int = 8192) -> float:
    """bf16 FLOP/s of an n^3 matmul, timed as Cluster.detect() times its GEMMs."""
    from shardwise.cluster import _time_square_gemm

    return 2 * n ** 3 / _time_square_gemm(n, "bf16", device)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a 2-layer GPT-2 at batch 2 x 64 (any device)")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--precision", default=None, choices=["fp8"],
                        help="fp8: the plan's linears in float8 (runtime/fp8.py), the eager model's under "
                             "shardwise.runtime.fp8.one_device(); needs FP8 units (compute capability 8.9+) on CUDA")
    parser.add_argument("--profile", default=None,
                        help="also write the top kernels of 3 engine and 3 eager steps (torch.profiler) to this file")
    from _results import add_record_argument, record

    add_record_argument(parser)
    args = parser.parse_args(argv)

    import transformers

    import shardwise

    device = shardwise.local_device()
    batch = args.batch or (2 if args.smoke else 8)
    seq = args.seq or (64 if args.smoke else 1024)
    steps = args.steps or (4 if args.smoke else 10)
    if args.smoke:
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=seq)
    else:
        config = transformers.GPT2Config(n_positions=max(seq, 1024))  # GPT-2 124M
    for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
        setattr(config, name, 0.0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(shardwise.backend_for(device), store=dist.FileStore(os.path.join(tmp, "store"), 1),
                                rank=0, world_size=1)
        try:
            figures = _measure(args, shardwise, transformers, config, device, dtype, batch, seq, steps)
        finally:
            dist.destroy_process_group()
    for key, value in figures.items():
        print(f"{key:<34} {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    if args.record:
        record("gpu", _recorded(figures), {
            "machine": f"{figures['device']}, torch {figures['torch']}"
                       + (_cuda_versions() if device.type == "cuda" else ""),
            "notes": f"{figures['model']}, {figures['dtype']}, batch {figures['batch x seq']}, AdamW, one process; "
                     f"median of {steps} steps after {args.warmup}, engine and eager timed alternately."})
    return 0


def _cuda_versions() -> str:
    try:
        nccl = torch.cuda.nccl.version()
        nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception:  # noqa: BLE001 - a label, never a failure
        nccl = "?"
    return f", CUDA {torch.version.cuda}, NCCL {nccl}"


# (figure, key in the figures, target): the table results/gpu.json holds.
RECORDED = [
    ("step, engine (ms)", "engine step ms (median)", ""),
    ("step, eager (ms)", "eager step ms (median)", ""),
    ("ratio engine / eager", "step ratio engine / eager", "<= 1.02"),
    ("model TFLOP/s, engine", "model TFLOP/s engine", ""),
    ("model TFLOP/s, eager", "model TFLOP/s eager", ""),
    ("MFU engine vs the datasheet's bf16 peak", "MFU engine (vs datasheet)", "report"),
    ("MFU engine vs a timed 8192^3 bf16 matmul", "MFU engine (vs timed matmul)", "report"),
    ("timed 8192^3 bf16 matmul (TFLOP/s)", "bf16 matmul 8192^3 TFLOP/s", ""),
    ("predicted step (ms)", "predicted step ms", "report"),
    ("measured / predicted step", None, ""),
    ("peak memory, engine (MiB)", "engine peak memory MiB", ""),
    ("peak memory, eager (MiB)", "eager peak memory MiB", ""),
    ("predicted memory per rank (MiB)", "predicted memory MiB", ""),
    ("measured / predicted memory", "measured / predicted memory", "within 10%"),
    ("capture + plan + rewrite (s)", "capture + plan + rewrite s", ""),
]


def _recorded(figures: dict) -> list[list]:
    rows = []
    for label, key, target in RECORDED:
        if key is None:  # measured / predicted step
            value = (round(figures["engine step ms (median)"] / figures["predicted step ms"], 3)
                     if figures.get("predicted step ms") else None)
        else:
            value = figures.get(key)
        rows.append({"figure": label, "value": value, "target": target or None})
    return rows


def _measure(args, shardwise, transformers, config, device, dtype, batch, seq, steps) -> dict:
    torch.manual_seed(0)
    model = WithLoss(transformers.GPT2LMHeadModel(config)).to(device=device, dtype=dtype)
    eager = copy.deepcopy(model)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1)).to(device)
    data = (ids, ids)
    params = sum(p.numel() for p in model.parameters())

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    t0 = time.perf_counter()
    engine = shardwise.parallelize(model, data, cluster=shardwise.Cluster.detect(), precision=args.precision)
    setup_s = time.perf_counter() - t0
    optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-4)
    eager_optimizer = torch.optim.AdamW(eager.parameters(), lr=1e-4)

    def engine_step():
        optimizer.zero_grad(set_to_none=True)
        loss = engine.train_step(*data)
        optimizer.step()
        return loss

    from shardwise.runtime import fp8

    def eager_step():
        eager_optimizer.zero_grad(set_to_none=True)
        with fp8.one_device() if args.precision == "fp8" else contextlib.nullcontext():
            loss = eager(*data)
        loss.backward()
        eager_optimizer.step()
        return loss

    def timed(step, n):
        times = []
        for _ in range(n):
            _sync(device)
            start = time.perf_counter()
            step()
            _sync(device)
            times.append(time.perf_counter() - start)
        return times

    losses = []
    for _ in range(args.warmup):
        losses.append((float(engine_step()), float(eager_step())))
    engine_peak = eager_peak = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    engine_times = timed(engine_step, (steps + 1) // 2)
    if device.type == "cuda":
        engine_peak = torch.cuda.max_memory_allocated(device) - base
        torch.cuda.reset_peak_memory_stats(device)
    eager_times = timed(eager_step, (steps + 1) // 2)
    if device.type == "cuda":
        eager_peak = torch.cuda.max_memory_allocated(device) - base
    engine_times += timed(engine_step, steps // 2)
    eager_times += timed(eager_step, steps // 2)
    engine_s, eager_s = statistics.median(engine_times), statistics.median(eager_times)
    flops = model_flops(config, batch, seq)

    if args.profile:
        _profile(args.profile, device, {"engine": engine_step, "eager": eager_step})

    predicted_bytes, breakdown = engine.plan.predicted_memory()
    figures = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": f"GPT-2 ({params / 1e6:.1f}M parameters, {config.n_layer} layers, hidden {config.n_embd})",
        "dtype": str(dtype).replace("torch.", "") + (", linears in fp8" if args.precision == "fp8" else ""),
        "batch x seq": f"{batch} x {seq}",
        "capture + plan + rewrite s": round(setup_s, 2),
        "plan": engine.plan.report().splitlines()[0] if engine.plan.report() else "",
        "first losses (engine, eager)": [[round(a, 6), round(b, 6)] for a, b in losses],
        "engine step ms (median)": round(engine_s * 1e3, 3),
        "eager step ms (median)": round(eager_s * 1e3, 3),
        "step ratio engine / eager": round(engine_s / eager_s, 4),
        "model TFLOP/s engine": round(flops / engine_s / 1e12, 2),
        "model TFLOP/s eager": round(flops / eager_s / 1e12, 2),
        "predicted step ms": round(engine.plan.predicted_step_time() * 1e3, 3)
        if engine.plan.predicted_step_time() else None,
        "predicted memory MiB": round(predicted_bytes / 2**20, 1) if predicted_bytes else None,
        "predicted memory breakdown MiB": {k: round(v / 2**20, 1) for k, v in (breakdown or {}).items()},
    }
    if device.type == "cuda":
        peak = timed_matmul_peak(device)
        name = torch.cuda.get_device_name(device)
        sheet = next((v for k, v in DATASHEET_BF16.items() if k in name), None)
        figures.update({
            "bf16 matmul 8192^3 TFLOP/s": round(peak / 1e12, 1),
            "MFU engine (vs timed matmul)": round(flops / engine_s / peak, 4),
            "MFU engine (vs datasheet)": round(flops / engine_s / sheet, 4) if sheet else None,
            "MFU eager (vs datasheet)": round(flops / eager_s / sheet, 4) if sheet else None,
            "engine peak memory MiB": round(engine_peak / 2**20, 1),
            "eager peak memory MiB": round(eager_peak / 2**20, 1),
            "measured / predicted memory": round(engine_peak / predicted_bytes, 4) if predicted_bytes else None,
        })
    return figures


def _profile(path: str, device: torch.device, steps: dict) -> None:
    """The 25 kernels (or CPU ops) that take the most time in 3 steps of each, one table each."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    with open(path, "w") as f:
        for name, step in steps.items():
            with profile(activities=activities) as prof:
                for _ in range(3):
                    step()
                _sync(device)
            f.write(f"==== {name}: 3 steps\n")
            f.write(prof.key_averages().table(sort_by=sort, row_limit=25, max_name_column_width=70))
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
