"""Long sequences: what capture and planning cost as the sequence grows (issue 48, item 4, in part).

Llama 3 8B's configuration (transformers' LlamaForCausalLM, 32 layers) is built on the meta
device and captured with its loss at each length, then ``shardwise.plan`` plans it on the
dgx-h100 preset. Each length runs in a fresh process, so its peak resident set (ru_maxrss) is
its own: the interpreter, torch and transformers imported, the capture and the plan. CPU
seconds are process time (capture: ``shardwise.capture``; plan: ``shardwise.plan``).
Issue 48's bar: 131,072 tokens captured and planned in at most 10 s and 2 GB, growing at most
linearly; a batch of 16 x 8,192 captured in at most 4 s of CPU. The step-time comparison of
context-parallel plans against the best plan without them is not here yet (issue 48, item 1).
Timing never fails anything.

    python benchmarks/long_context.py [--lengths 8192 32768 131072] [--layers 32] [--record]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768, 131072])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2, help="sequences captured at every length")
    ap.add_argument("--batch16", action=argparse.BooleanOptionalAction, default=True,
                    help="also capture 16 x 8,192 (issue 48's batch bar)")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child's JSON arguments
    from _results import add_record_argument, record

    add_record_argument(ap)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(_one(**json.loads(args.one))))
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
