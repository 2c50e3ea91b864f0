"""GPT-2 124M or a LLaMA of 1.2B in bf16 on one GPU: shardwise's engine against the eager model, side by side.

    python benchmarks/gpu.py                      # CUDA: GPT-2 124M, batch 8 x 1024, bf16
    python benchmarks/gpu.py --model llama        # CUDA: Llama 3.2 1B's shape (1.24B), batch 4 x 2048, bf16
    python benchmarks/gpu.py --compile            # + ours compiled and the eager model under torch.compile
    python benchmarks/gpu.py --smoke              # anywhere: a 2-layer GPT-2, batch 2 x 64 (CI's CPU run)
    python benchmarks/gpu.py --json report.json   # the figures as JSON too
    python benchmarks/gpu.py --record             # + the table into results/gpu.json and the README

One process, world size 1 (NCCL on CUDA, Gloo on the CPU): the engine runs the plan the
search makes for this device (Cluster.detect()), which is the whole model on one rank, so
the step-time ratio measures what the rewrite and the runtime add to the eager step.

Printed, each measured in this run:
 - step time: the median of --steps timed AdamW steps after --warmup, engine and eager,
   measured alternately in blocks (engine, eager, engine, eager) so drift hits both; the
   ratio engine / eager (issue 22's target: at most 1.02). With --compile two more sides in
   the same blocks: ours compiled (``parallelize(..., compile=True)``: the rank program through
   inductor) and the eager model under ``torch.compile`` (the whole model and its loss, inductor's
   defaults), each compile time the first step's; the ratio ours compiled / eager compiled
   (issue 49's target: at most 1.0, i.e. MFU at least the compiled eager model's);
 - model FLOP/s and MFU: model FLOPs per step = 3 x the forward's matmul FLOPs (every
   Linear / Conv1D and the tied LM head, 2 x rows x in x out each, plus attention's
   scores and weighted sum, 2 x 2 x batch x seq^2 x hidden per layer, causal or not; LLaMA's
   q, k, v, o and its three MLP products likewise), no recomputation counted; MFU against the bf16 peak of a timed 8192^3 matmul on this GPU
   and against the datasheet's dense bf16 peak where the card is known;
 - peak memory: torch.cuda.max_memory_allocated over each side's steps, less what the other
   sides hold (the allocation at the start of its block less its own parameters, gradients
   and optimizer state), against the plan's predicted memory per rank (issue 46's target:
   within 15%), and the eager run's peak beside it.
Timing never fails a test: tests/python/benchmarks/test_benchmarks.py runs --smoke on the CPU and checks
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
from typing import Callable

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
    """Training FLOPs of one step of GPT-2 or LLaMA (forward x 3), no recomputation."""
    tokens = batch * seq
    if config.model_type == "gpt2":
        h, layers, vocab = config.n_embd, config.n_layer, config.vocab_size
        inner = config.n_inner or 4 * h
        products = h * 3 * h + h * h + h * inner + inner * h
    else:  # llama: q and o h x h, k and v h x (kv heads x head dim), gate, up and down h x inner
        h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
        kv = config.num_key_value_heads * (getattr(config, "head_dim", None) or h // config.num_attention_heads)
        products = 2 * h * h + 2 * h * kv + 3 * h * config.intermediate_size
    per_layer = 2 * tokens * products + 2 * 2 * batch * seq * seq * h
    head = 2 * tokens * h * vocab
    return 3.0 * (layers * per_layer + head)


def model_config(transformers, name: str, smoke: bool, seq: int):
    """GPT-2 124M, or Llama 3.2 1B's shape (16 layers, hidden 2048, GQA 32 / 8 heads, MLP 8192,
    vocabulary 128,256, tied embeddings: 1.24B parameters); a 2-layer toy of each with --smoke."""
    if name == "gpt2":
        if smoke:
            config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=seq)
        else:
            config = transformers.GPT2Config(n_positions=max(seq, 1024))  # GPT-2 124M
        for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
            setattr(config, key, 0.0)
        return config, transformers.GPT2LMHeadModel
    if smoke:
        config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=seq,
                                          tie_word_embeddings=True)
    else:
        config = transformers.LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                          num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                                          max_position_embeddings=max(seq, 2048), rope_theta=500000.0,
                                          tie_word_embeddings=True)
    return config, transformers.LlamaForCausalLM


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_matmul_peak(device: torch.device, n: int = 8192) -> float:
    """bf16 FLOP/s of an n^3 matmul, timed as Cluster.detect() times its GEMMs."""
    from shardwise.cluster import _time_square_gemm

    return 2 * n ** 3 / _time_square_gemm(n, "bf16", device)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a 2-layer model at batch 2 x 64 (any device)")
    parser.add_argument("--model", default="gpt2", choices=["gpt2", "llama"],
                        help="gpt2: GPT-2 124M, batch 8 x 1024; llama: Llama 3.2 1B's shape, batch 4 x 2048")
    parser.add_argument("--compile", action="store_true",
                        help="also ours compiled (parallelize(compile=True)) and the eager model under torch.compile")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--precision", default=None, choices=["fp8"],
                        help="fp8: the plan's linears in float8 (runtime/fp8.py), the eager model's under "
                             "shardwise.runtime.fp8.one_device(); needs FP8 units (compute capability 8.9+) on CUDA")
    parser.add_argument("--profiled", action="store_true",
                        help="also price the plan with its ops timed on this device at the shapes it runs them "
                             "(shardwise.profile's plan_specs / measure_specs and AdamW's step: Plan.price(profile=))")
    parser.add_argument("--profile", default=None,
                        help="also write the top kernels of 3 engine and 3 eager steps (torch.profiler) to this file")
    from _results import add_record_argument, record

    add_record_argument(parser)
    args = parser.parse_args(argv)

    import transformers

    import shardwise

    device = shardwise.local_device()
    llama = args.model == "llama"
    batch = args.batch or (2 if args.smoke else 4 if llama else 8)
    seq = args.seq or (64 if args.smoke else 2048 if llama else 1024)
    steps = args.steps or (4 if args.smoke else 10)
    config, model_class = model_config(transformers, args.model, args.smoke, seq)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(shardwise.backend_for(device), store=dist.FileStore(os.path.join(tmp, "store"), 1),
                                rank=0, world_size=1)
        try:
            figures = _measure(args, shardwise, model_class, config, device, dtype, batch, seq, steps)
        finally:
            dist.destroy_process_group()
    for key, value in figures.items():
        print(f"{key:<34} {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    if args.record:
        record("gpu" if args.model == "gpt2" and not args.compile else f"gpu-{args.model}", _recorded(figures), {
            "machine": f"{figures['device']}, torch {figures['torch']}"
                       + (_cuda_versions() if device.type == "cuda" else ""),
            "notes": f"{figures['model']}, {figures['dtype']}, batch {figures['batch x seq']}, AdamW, one process; "
                     f"median of {steps} steps after {args.warmup}, the sides timed alternately."})
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
    ("measured / predicted step", None, "within 15%"),
    ("peak memory, engine (MiB)", "engine peak memory MiB", ""),
    ("peak memory, eager (MiB)", "eager peak memory MiB", ""),
    ("predicted memory per rank (MiB)", "predicted memory MiB", ""),
    ("predicted step, ops timed on this GPU (ms)", "predicted step ms (profiled)", "report"),
    ("measured / predicted step, ops timed", "measured / predicted step (profiled)", "within 15%"),
    ("measured / predicted memory", "measured / predicted memory", "within 15%"),
    ("capture + plan + rewrite (s)", "capture + plan + rewrite s", ""),
    ("step, ours compiled (ms)", "engine compiled step ms (median)", ""),
    ("step, eager compiled (ms)", "eager compiled step ms (median)", ""),
    ("ratio ours compiled / eager compiled", "step ratio engine compiled / eager compiled", "<= 1.0"),
    ("ratio ours compiled / ours eager", "step ratio engine compiled / engine", ""),
    ("MFU ours compiled vs the datasheet", "MFU engine compiled (vs datasheet)", "report"),
    ("MFU eager compiled vs the datasheet", "MFU eager compiled (vs datasheet)", "report"),
    ("compile time, ours / eager (s)", "compile s (engine compiled, eager compiled)", ""),
]


def _recorded(figures: dict) -> list[list]:
    rows = []
    for label, key, target in RECORDED:
        if key is None:  # measured / predicted step
            value = (round(figures["engine step ms (median)"] / figures["predicted step ms"], 3)
                     if figures.get("predicted step ms") else None)
        else:
            value = figures.get(key)
        if key is not None and key not in figures:
            continue  # a side this run did not measure (--compile)
        rows.append({"figure": label, "value": value, "target": target or None})
    return rows


class Side:
    """One way of running the step: its step function, and what it holds between steps (its
    parameters, their gradients and its optimizer's state), which the memory figures of the
    other sides leave out."""

    def __init__(self, name: str, step: Callable, optimizer, modules=()):
        self.name, self.step, self.optimizer, self.modules = name, step, optimizer, modules
        self.times: list[float] = []
        self.peak = None
        self.first_step_s = None

    def state_bytes(self) -> int:
        """The optimizer's state alone (AdamW's moments, in the parameters' dtype)."""
        return sum(v.untyped_storage().nbytes() for state in self.optimizer.state.values()
                   for v in state.values() if torch.is_tensor(v) and v.dim() > 0)

    def held_bytes(self) -> int:
        tensors = [p for group in self.optimizer.param_groups for p in group["params"]]
        tensors += [p.grad for p in tensors if p.grad is not None]
        tensors += [v for state in self.optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
        tensors += [b for m in self.modules for b in m.buffers()]
        storages = {}
        for t in tensors:
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())


def _measure(args, shardwise, model_class, config, device, dtype, batch, seq, steps) -> dict:
    torch.manual_seed(0)
    model = WithLoss(model_class(config)).to(device=device, dtype=dtype)
    copies = [copy.deepcopy(model) for _ in range(3 if args.compile else 1)]
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1)).to(device)
    data = (ids, ids)
    params = sum(p.numel() for p in model.parameters())
    from shardwise.runtime import fp8

    def eager_side(name, module):
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)

        def step():
            optimizer.zero_grad(set_to_none=True)
            with fp8.one_device() if args.precision == "fp8" else contextlib.nullcontext():
                loss = module(*data)
            loss.backward()
            optimizer.step()
            return loss
        return Side(name, step, optimizer, (module,))

    def engine_side(name, engine):
        optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-4)

        def step():
            optimizer.zero_grad(set_to_none=True)
            loss = engine.train_step(*data)
            optimizer.step()
            return loss
        return Side(name, step, optimizer)

    cluster = shardwise.Cluster.detect()
    t0 = time.perf_counter()
    engine = shardwise.parallelize(model, data, cluster=cluster, precision=args.precision)
    setup_s = time.perf_counter() - t0
    sides = [engine_side("engine", engine), eager_side("eager", copies[0])]
    if args.compile:
        compiled_engine = shardwise.parallelize(copies[1], data, cluster=cluster, precision=args.precision,
                                                compile=True)
        sides += [engine_side("engine compiled", compiled_engine),
                  eager_side("eager compiled", torch.compile(copies[2]))]

    def timed(side, n):
        if device.type == "cuda":
            others = torch.cuda.memory_allocated(device) - side.held_bytes()
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(n):
            _sync(device)
            start = time.perf_counter()
            side.step()
            _sync(device)
            side.times.append(time.perf_counter() - start)
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device) - others
            side.peak = max(side.peak or 0, peak)

    losses = []
    for i in range(args.warmup):
        row = []
        for side in sides:
            _sync(device)
            start = time.perf_counter()
            row.append(float(side.step().detach()))
            _sync(device)
            if i == 0:
                side.first_step_s = time.perf_counter() - start
        losses.append(row)
    for n in ((steps + 1) // 2, steps // 2):
        for side in sides:
            timed(side, n)
    by_name = {side.name: side for side in sides}
    median = {side.name: statistics.median(side.times) for side in sides}
    engine_s, eager_s = median["engine"], median["eager"]
    flops = model_flops(config, batch, seq)

    if args.profile:
        _profile(args.profile, device, {side.name: side.step for side in sides})

    profiled = _profiled_prediction(shardwise, copies[0], data, cluster, batch, args) if args.profiled else {}
    predicted_bytes, breakdown = engine.plan.predicted_memory()
    name = "GPT-2" if config.model_type == "gpt2" else "LLaMA"
    layers = getattr(config, "n_layer", None) or config.num_hidden_layers
    hidden = getattr(config, "n_embd", None) or config.hidden_size
    figures = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": f"{name} ({params / 1e6:.1f}M parameters, {layers} layers, hidden {hidden})",
        "dtype": str(dtype).replace("torch.", "") + (", linears in fp8" if args.precision == "fp8" else ""),
        "batch x seq": f"{batch} x {seq}",
        "capture + plan + rewrite s": round(setup_s, 2),
        "plan": engine.plan.report().splitlines()[0] if engine.plan.report() else "",
        "sides": [side.name for side in sides],
        "first losses (engine, eager)": [[round(v, 6) for v in row] for row in losses],
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
    if figures["predicted step ms"]:
        figures["measured / predicted step"] = round(engine_s * 1e3 / figures["predicted step ms"], 4)
    if profiled:
        figures.update(profiled)
        figures["measured / predicted step (profiled)"] = round(engine_s * 1e3 / profiled["predicted step ms (profiled)"], 4)
    if args.compile:
        compiled_s, compiled_eager_s = median["engine compiled"], median["eager compiled"]
        figures.update({
            "engine compiled step ms (median)": round(compiled_s * 1e3, 3),
            "eager compiled step ms (median)": round(compiled_eager_s * 1e3, 3),
            "step ratio engine compiled / eager compiled": round(compiled_s / compiled_eager_s, 4),
            "step ratio engine compiled / engine": round(compiled_s / engine_s, 4),
            "step ratio eager compiled / eager": round(compiled_eager_s / eager_s, 4),
            "compile s (engine compiled, eager compiled)": [round(by_name["engine compiled"].first_step_s, 1),
                                                            round(by_name["eager compiled"].first_step_s, 1)],
        })
    if device.type == "cuda":
        peak = timed_matmul_peak(device)
        gpu = torch.cuda.get_device_name(device)
        sheet = next((v for k, v in DATASHEET_BF16.items() if k in gpu), None)
        figures.update({
            "bf16 matmul 8192^3 TFLOP/s": round(peak / 1e12, 1),
            "MFU engine (vs timed matmul)": round(flops / engine_s / peak, 4),
            "MFU engine (vs datasheet)": round(flops / engine_s / sheet, 4) if sheet else None,
            "MFU eager (vs datasheet)": round(flops / eager_s / sheet, 4) if sheet else None,
            "engine peak memory MiB": round(by_name["engine"].peak / 2**20, 1),
            "engine optimizer state MiB (held)": round(by_name["engine"].state_bytes() / 2**20, 1),
            "eager peak memory MiB": round(by_name["eager"].peak / 2**20, 1),
            "measured / predicted memory": round(by_name["engine"].peak / predicted_bytes, 4)
            if predicted_bytes else None,
        })
        if args.compile:
            figures.update({
                "MFU engine compiled (vs datasheet)": round(flops / median["engine compiled"] / sheet, 4)
                if sheet else None,
                "MFU eager compiled (vs datasheet)": round(flops / median["eager compiled"] / sheet, 4)
                if sheet else None,
                "engine compiled peak memory MiB": round(by_name["engine compiled"].peak / 2**20, 1),
                "eager compiled peak memory MiB": round(by_name["eager compiled"].peak / 2**20, 1),
            })
    return figures


def _profiled_prediction(shardwise, module, data, cluster, batch, args) -> dict:
    """The plan the search finds for this device, priced with its own ops timed here at the
    shapes it runs them and AdamW's step timed on this device's parameters' dtype (the
    profiled cost model, profiled_cost.h), beside the analytic model's figure for the same plan."""
    from shardwise.profile import measure_optimizer, measure_specs, plan_specs

    start = time.perf_counter()
    graph = shardwise.capture(module, data)
    found = shardwise.plan(graph, cluster, global_batch=batch, precision=args.precision)
    specs = plan_specs(graph, cluster, [found])
    ops = measure_specs(specs, budget_s=60, progress=False)
    dtype = next(module.parameters()).dtype
    ops["optimizer"] = measure_optimizer(elements=64 << 20, dtype=dtype)
    doc = {"format": "shardwise.profile", "version": 1, **ops}
    priced = found.price(graph, cluster, profile=shardwise.Profile.from_json(json.dumps(doc)))
    return {
        "predicted step ms (profiled)": round(priced.predicted_step_time() * 1e3, 3),
        "predicted step ms (analytic, same plan)": round(found.predicted_step_time() * 1e3, 3),
        "profiled breakdown ms": {k: round(v * 1e3, 3) for k, v in priced.breakdown().items() if v},
        "profiled ops measured / asked": f"{len(ops['ops'])} / {len(specs)}",
        "profile s": round(time.perf_counter() - start, 1),
    }


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
