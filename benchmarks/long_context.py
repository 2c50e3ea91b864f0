"""Long sequences: what capture and planning cost as the sequence grows (issue 48, item 4, in part).

Llama 3 8B's configuration (transformers' LlamaForCausalLM, 32 layers) is built on the meta
device and captured with its loss at each length, then ``shardwise.plan`` plans it on the
dgx-h100 preset. Each length runs in a fresh process, so its peak resident set (ru_maxrss) is
its own: the interpreter, torch and transformers imported, the capture and the plan. CPU
seconds are process time (capture: ``shardwise.capture``; plan: ``shardwise.plan``).
Issue 48's bar: 131,072 tokens captured and planned in at most 10 s and 2 GB, growing at most
linearly; a batch of 16 x 8,192 captured in at most 4 s of CPU.

``--train`` measures instead what context parallelism buys here: a small transformers LLaMA
(float32) trained on one sequence of ``--train-seq`` tokens on 1, 2 and 4 Gloo processes, each
world with the search's plan on a data axis of that many ranks with ring attention allowed
and without it (``Plan.search(context_parallel=False)``: the best plan that keeps every
attention's sequence whole), side by side in one run: the median step time and the peak tensor
memory per rank (benchmarks/_tensor_memory.py, the largest rank), and their ratios allowed /
off. Timing never fails anything.

    python benchmarks/long_context.py [--lengths 8192 32768 131072] [--layers 32] [--record]
    python benchmarks/long_context.py --train [--train-seq 4096] [--record]
    python benchmarks/long_context.py --at-scale [--record]

``--at-scale`` plans Llama 3 405B's shape (transformers, 126 layers, meta device) at 131,072
tokens, 16 sequences a step, on 2,048 H100s (the dgx-h100 preset, 256 nodes) with
``shardwise.plan``, context parallelism allowed and off (``context_parallel=False``), side by
side: the plan, its predicted step, TFLOP/s and memory per GPU, the communication by kind
(seconds exposed), and the CPU seconds of the capture and of each plan.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _one(layers: int, seq: int, batch: int, nodes: int, global_batch: int) -> dict:
    """Capture and plan at one length, in this process (a fresh one: main runs each so)."""
    import resource
    import time

    import torch

    import shardwise
    from published import llama_module

    model = llama_module("8B", seq, layers)
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    start = time.process_time()
    graph = shardwise.capture(model, {"input_ids": ids, "labels": ids})
    captured = time.process_time()
    folded = sum(1 for n in graph.nodes() if n["op"] == "aten::scaled_dot_product_attention"
                 and n["attrs"].get("is_causal") is True)
    cluster = shardwise.Cluster.preset("dgx-h100", nodes=nodes)
    plan = shardwise.plan(graph, cluster, global_batch=global_batch)
    planned = time.process_time()
    return {"seq": seq, "batch": batch, "capture_cpu": captured - start, "plan_cpu": planned - captured,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "causal_folded": folded,
            "plan": repr(plan), "fits": bool(plan.fits), "step": plan.predicted_step_time()}


def at_scale(nodes: int, seq: int, global_batch: int, record_results: bool) -> None:
    """Llama 3 405B's shape at `seq` tokens on `nodes` DGX H100s, planned with context
    parallelism allowed and off, side by side (the module's docstring)."""
    import time

    import torch

    import shardwise
    from _machine import machine_line
    from _results import record
    from published import llama_module

    print(machine_line())
    ids = torch.zeros(2, seq, dtype=torch.long, device="meta")
    start = time.process_time()
    graph = shardwise.capture(llama_module("405B", seq), {"input_ids": ids, "labels": ids})
    capture = time.process_time() - start
    cluster = shardwise.Cluster.preset("dgx-h100", nodes=nodes)
    header = ["context parallelism", "plan", "predicted step (s)", "TFLOP/s per GPU", "memory per GPU (GB)",
              "exposed communication (s)", "plan CPU (s)"]
    table = []
    for allowed in (True, False):
        start = time.process_time()
        plan = shardwise.plan(graph, cluster, global_batch=global_batch, context_parallel=allowed)
        seconds = time.process_time() - start
        print(plan.report(), flush=True)
        predicted = plan._doc["predicted"]
        kinds = ("tensor_parallel", "context_parallel", "pipeline_p2p", "data_parallel", "zero_broadcast")
        comms = ", ".join(f"{k} {predicted['breakdown'][k]:.2f}" for k in kinds if predicted["breakdown"].get(k))
        degrees = (f"t {plan.tensor} c {plan.context} p {plan.pipeline} d {plan.data}, micro-batch {plan.micro_batch}, "
                   f"{plan.schedule}" + (f" v {plan.virtual_stages}" if plan.virtual_stages > 1 else "")
                   + f", recompute {plan.recompute}, ZeRO {plan.zero_stage}")
        table.append(["allowed" if allowed else "off", degrees, predicted["step_time"],
                      predicted["tflops_per_device"], predicted["memory_per_rank"] / 1e9, comms, seconds])
    print(f"\nLlama 3 405B shape (126 layers), {seq} tokens x {global_batch} sequences, dgx-h100 x{nodes} "
          f"({8 * nodes} GPUs); capture {capture:.2f} s CPU")
    print("| " + " | ".join(header) + " |\n|" + " --- |" * len(header))
    for row in table:
        print(f"| {row[0]} | {row[1]} | {row[2]:.2f} | {row[3]:.1f} | {row[4]:.1f} | {row[5]} | {row[6]:.2f} |")
    if record_results:
        from _machine import cpu_model

        record("long_context_at_scale", table, {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}",
            "columns": header,
            "formats": {"predicted step (s)": ".2f", "TFLOP/s per GPU": ".1f", "memory per GPU (GB)": ".1f",
                        "plan CPU (s)": ".2f"},
            "notes": f"Llama 3 405B shape (transformers, 126 layers, bf16, meta device) at {seq} tokens, "
                     f"{global_batch} sequences a step, dgx-h100 x{nodes}: shardwise.plan with context "
                     f"parallelism allowed and off (context_parallel=False); capture {capture:.2f} s CPU. "
                     "Exposed communication: the plan's seconds by kind (context_parallel: the ring's sends "
                     "waited for, inside the step's compute). Predictions of the analytic model, not measurements."})


TRAIN_VOCAB = 512


def _train_model(seq: int):
    """The LLaMA with its loss (shardwise.models.CausalLMWithLoss), so that the graph the plan
    is searched on is the one parallelize captures."""
    import torch
    import transformers

    from shardwise.models import CausalLMWithLoss

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=2,
                                   num_key_value_heads=2, vocab_size=TRAIN_VOCAB, max_position_embeddings=seq,
                                   attn_implementation="sdpa")
    return CausalLMWithLoss(transformers.LlamaForCausalLM(cfg))


def _train_batch(seq: int) -> tuple:
    import torch

    ids = torch.randint(0, TRAIN_VOCAB, (1, seq), generator=torch.Generator().manual_seed(1))
    return ids, torch.roll(ids, -1, dims=1)


def _train_rank(rank: int, store: str, world: int, seq: int, ring: bool, steps: int, out: str) -> None:
    """One rank of a run: the search's plan on a data axis of `world` ranks (ring attention
    allowed or not), a warm-up step, `steps` timed, then one more under the peak counter."""
    import torch
    import torch.distributed as dist

    import shardwise
    from _tensor_memory import live_storages
    from _workers import timed_steps_and_peak

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        model, batch = _train_model(seq), _train_batch(seq)
        graph = shardwise.capture(_train_model(seq), batch)
        plan = shardwise.Plan.search(graph, shardwise.Cluster.preset("cpu", world), mesh=(world, 1), global_batch=1,
                                     precision="f32", context_parallel=ring)
        before = live_storages()
        engine = shardwise.parallelize(model, batch, plan=plan, verify=False)
        optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-4)
        step_seconds, peak = timed_steps_and_peak(engine, optimizer, batch, steps, before)
        rings = sum(1 for line in engine.rank_ir.splitlines() if "= shardwise::ring_attention(" in line)
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"step": step_seconds, "memory": peak, "rings": rings,
                           "predicted": plan.predicted_step_time()}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _train_run(world: int, seq: int, ring: bool, steps: int) -> dict:
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        mp.spawn(_train_rank, args=(os.path.join(tmp, "store"), world, seq, ring, steps, out), nprocs=world, join=True)
        with open(out) as f:
            return json.load(f)


def train_comparison(seq: int, worlds: list[int], steps: int, record_it: bool) -> None:
    from _machine import machine_line

    print(machine_line())
    header = ["processes", "ring attention", "ring calls", "step (s)", "peak MB per rank", "predicted step (s)",
              "allowed / off: step", "allowed / off: memory"]
    table = []
    for world in worlds:
        runs = {ring: _train_run(world, seq, ring, steps) for ring in ((True, False) if world > 1 else (False,))}
        without = runs[False]
        for ring, r in runs.items():
            row = [world, "allowed" if ring else "off", r["rings"], r["step"], r["memory"] / 1e6, r["predicted"],
                   r["step"] / without["step"] if ring else None, r["memory"] / without["memory"] if ring else None]
            table.append(row)
            print(f"  {world} processes, ring attention {row[1]}: {row[2]} ring calls, step {row[3]:.3f} s, peak "
                  f"{row[4]:.1f} MB a rank", flush=True)
    print(f"\nLLaMA (2 layers, hidden 128, 2 heads of 64), float32, one sequence of {seq} tokens, AdamW")
    print("| " + " | ".join(header) + " |\n|" + " --- |" * len(header))
    for row in table:
        cells = [f"{c:.3f}" if isinstance(c, float) else ("-" if c is None else str(c)) for c in row]
        print("| " + " | ".join(cells) + " |")
    if record_it:
        from _machine import cpu_model
        from _results import record
        import torch

        record("long_context_train", table, {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}",
            "columns": header,
            "formats": {"step (s)": ".3f", "peak MB per rank": ".1f", "predicted step (s)": ".4f",
                        "allowed / off: step": ".2f", "allowed / off: memory": ".2f"},
            "notes": f"transformers LLaMA (2 layers, hidden 128, 2 heads of 64, vocabulary {TRAIN_VOCAB}), float32, one "
                     f"sequence of {seq} tokens, Gloo processes on this machine's cores; each world's plan: "
                     "Plan.search on a data axis of that many ranks, ring attention allowed or not (off: "
                     "context_parallel=False); ring calls: the ring attentions in rank 0's program; median of the "
                     "timed steps after a warm-up, peak tensor memory of the largest rank "
                     "(benchmarks/_tensor_memory.py)."})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768, 131072])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2, help="sequences captured at every length")
    ap.add_argument("--batch16", action=argparse.BooleanOptionalAction, default=True,
                    help="also capture 16 x 8,192 (issue 48's batch bar)")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--train", action="store_true", help="measure ring attention's plans training instead")
    ap.add_argument("--train-seq", type=int, default=4096)
    ap.add_argument("--train-worlds", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--at-scale", action="store_true",
                    help="plan Llama 3 405B at 131,072 tokens on 2,048 H100s with and without context parallelism")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child's JSON arguments
    from _results import add_record_argument, record

    add_record_argument(ap)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(_one(**json.loads(args.one))))
        return
    if args.at_scale:
        at_scale(256, 131072, 16, args.record)
        return
    if args.train:
        train_comparison(args.train_seq, args.train_worlds, args.train_steps, args.record)
        return
    from _machine import machine_line

    print(machine_line())
    cases = [(seq, args.batch) for seq in args.lengths] + ([(8192, 16)] if args.batch16 else [])
    rows = []
    for seq, batch in cases:
        spec = {"layers": args.layers, "seq": seq, "batch": batch, "nodes": args.nodes,
                "global_batch": args.global_batch}
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", json.dumps(spec)],
                              capture_output=True, text=True, check=True)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(r)
        print(f"  {batch} x {seq}: capture {r['capture_cpu']:.2f} s, plan {r['plan_cpu']:.2f} s CPU, peak resident "
              f"{r['peak_rss'] / 1e9:.2f} GB, {r['causal_folded']} attention calls causal; {r['plan']}", flush=True)
    print(f"\nLlama 3 8B shape, {args.layers} layers, meta device, dgx-h100 x{args.nodes}, "
          f"global batch {args.global_batch}")
    header = ["tokens", "batch", "capture CPU (s)", "plan CPU (s)", "capture + plan (s)", "peak resident (GB)",
              "attention causal", "plan", "fits"]
    print("| " + " | ".join(header) + " |\n|" + " --- |" * len(header))
    table = []
    for r in rows:
        row = [r["seq"], r["batch"], r["capture_cpu"], r["plan_cpu"], r["capture_cpu"] + r["plan_cpu"],
               r["peak_rss"] / 1e9, r["causal_folded"], r["plan"], "yes" if r["fits"] else "no"]
        table.append(row)
        print(f"| {row[0]} | {row[1]} | {row[2]:.2f} | {row[3]:.2f} | {row[4]:.2f} | {row[5]:.2f} | {row[6]} | "
              f"{row[7]} | {row[8]} |")
    if args.record:
        from _machine import cpu_model
        import torch

        record("long_context", table, {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}",
            "columns": header,
            "formats": {"capture CPU (s)": ".2f", "plan CPU (s)": ".2f", "capture + plan (s)": ".2f",
                        "peak resident (GB)": ".2f"},
            "notes": f"Llama 3 8B shape ({args.layers} layers, transformers), meta device, each length in a fresh "
                     f"process (peak resident: the whole process); plan: shardwise.plan on dgx-h100 x{args.nodes}, "
                     f"global batch {args.global_batch}. Issue 48's bar: 131,072 tokens in at most 10 s and 2 GB; "
                     "16 x 8,192 captured in at most 4 s."})


if __name__ == "__main__":
    main()
