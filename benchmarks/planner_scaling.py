"""Planner speed and scaling: planning time for the GPT-3 family from 1.3B to 175B over 8 to
1,024 A100s, planning time against depth, and Llama-3-8B (captured from `transformers` on
the meta device) over 64 A100s.

    PYTHONPATH=python python benchmarks/planner_scaling.py [--svg benchmarks/images/planner_scaling.svg] [--record]

Models: the GPT-3 paper's sizes (Brown et al. 2020, Table 2.1), sequence 2048, vocabulary
51200, built in the IR without torch (`shardwise.models.gpt`), each at the paper's batch
(1.3B and 2.7B: 512 sequences, 6.7B and 13B: 1024, 175B: 1536). 1.3B has 16 heads of 128
(the paper's "24 heads" does not divide 2048); 13B has hidden 5120 (the paper's 5140 does not
divide into 40 heads).
Cluster: DGX-A100 nodes (8 GPUs each): 1, 8, 16, 64 and 128 nodes = 8, 64, 128, 512 and
1,024 devices. Cut to fit ~10 minutes on a 2-core box: no 256-device column, no 1,024-node
(8,192-GPU) column, and the depth sweep only at 64 devices.
Planner: the joint planner (`shardwise.plan(..., pipeline=True)`: pipeline x data x tensor
degrees, micro-batch, schedule, recomputation, ZeRO) at every point, so each line is one
planner; at 8 devices (one node) `shardwise.plan`'s default is the SPMD search, timed in a
second table.
Prints: wall and CPU seconds per plan (CPU is the fairer figure on a shared machine: the
planner is single-threaded), plans priced, the plan found and its predicted model TFLOP/s per GPU,
and the time against the issue's budget for GPT-3 175B on 1,024 GPUs (fast < 5 s, thorough
< 60 s). Writes a log-log chart (SVG, drawn here: matplotlib is not needed) and checks it
parses as XML. Asserts nothing about timing.
"""
from __future__ import annotations

import argparse
import os
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _machine import Timer, machine_line  # noqa: E402
from _svg import PALETTE, Panel, write_chart  # noqa: E402

import shardwise  # noqa: E402

# name, layers, hidden, heads, global batch (sequences of 2048)
GPT3 = [
    ("1.3B", 24, 2048, 16, 512),
    ("2.7B", 32, 2560, 32, 512),
    ("6.7B", 32, 4096, 32, 1024),
    ("13B", 40, 5120, 40, 1024),
    ("175B", 96, 12288, 96, 1536),
]
NODES = [1, 8, 16, 64, 128]
DEPTHS = [8, 16, 32, 64, 128]  # hidden 4096, 32 heads (6.7B's width), 64 devices
LEVELS = ("fast", "thorough")
BUDGET = {"fast": 5.0, "thorough": 60.0}  # issue 4/5: GPT-3 175B on 1,024 GPUs


def describe(plan) -> str:
    if plan.sharding:
        return f"SPMD mesh {plan.sharding['mesh']}"
    return (f"t{plan.tensor} p{plan.pipeline} d{plan.data} b{plan.micro_batch} "
            f"{'int' if plan.schedule == 'interleaved-1f1b' else plan.schedule}"
            f"{' v' + str(plan.virtual_stages) if plan.virtual_stages > 1 else ''} "
            f"rc {plan.recompute} z{plan.zero_stage}")


def timed_plan(graph, cluster, batch: int, level: str, pipeline: bool) -> dict:
    with Timer() as t:
        plan = shardwise.plan(graph, cluster, global_batch=batch, level=level, pipeline=pipeline)
    return {"plan": plan, "wall": t.wall, "cpu": t.cpu, "evaluated": (plan._result or {}).get("evaluated"),
            "tflops": plan.predicted_tflops_per_device(), "fits": plan.fits}


def row(label: str, devices: int, level: str, r: dict) -> str:
    evaluated = "" if r["evaluated"] is None else r["evaluated"]
    return (f"{label:<12} {devices:>6} {level:<9} {r['wall']:>8.2f} {r['cpu']:>8.2f} {evaluated:>6} "
            f"{'yes' if r['fits'] else 'NO':>4} {r['tflops']:>7.1f}  {describe(r['plan'])}")


HEADER = (f"{'model':<12} {'GPUs':>6} {'level':<9} {'wall s':>8} {'cpu s':>8} {'plans':>6} {'fits':>4} "
          f"{'TFLOP/s':>7}  plan")


def llama3_8b_graph():
    """Llama-3-8B's configuration, built on the meta device and captured (batch 2, seq 8192)."""
    import torch
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                   num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                                   max_position_embeddings=8192, rope_theta=500000.0, use_cache=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (2, 8192), device="meta")
    with Timer() as t:
        graph = shardwise.capture(model, {"input_ids": ids, "labels": ids})
    return graph, t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--svg", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "images",
                                                  "planner_scaling.svg"))
    from _results import add_record_argument, record

    add_record_argument(ap)
    args = ap.parse_args()
    print(machine_line())
    print("GPT-3 family (seq 2048, vocab 51200, bf16) on DGX-A100 nodes; joint planner (pipeline=True)")
    print(HEADER)
    with Timer() as whole:
        grid: dict[tuple[str, int, str], dict] = {}
        for name, layers, hidden, heads, batch in GPT3:
            graph = shardwise.models.gpt(layers=layers, hidden=hidden, heads=heads, seq=2048, vocab=51200, batch=2)
            for nodes in NODES:
                cluster = shardwise.Cluster.preset("dgx-a100", nodes=nodes)
                for level in LEVELS:
                    r = timed_plan(graph, cluster, batch, level, pipeline=True)
                    grid[(name, cluster.world_size, level)] = r
                    print(row(f"GPT-3 {name}", cluster.world_size, level, r), flush=True)

        print()
        print("One node (8 GPUs), shardwise.plan's default there: the SPMD sharding search (pipeline=False)")
        print(HEADER)
        one_node = shardwise.Cluster.preset("dgx-a100", nodes=1)
        spmd: dict[tuple[str, str], dict] = {}
        for name, layers, hidden, heads, batch in GPT3:
            graph = shardwise.models.gpt(layers=layers, hidden=hidden, heads=heads, seq=2048, vocab=51200, batch=2)
            for level in LEVELS:
                r = timed_plan(graph, one_node, batch, level, pipeline=False)
                spmd[(name, level)] = r
                print(row(f"GPT-3 {name}", 8, level, r), flush=True)

        print()
        print("Depth: hidden 4096, 32 heads, seq 2048, global batch 1024, 64 GPUs (8 nodes), joint planner")
        print(HEADER)
        depth: dict[tuple[int, str], dict] = {}
        cluster = shardwise.Cluster.preset("dgx-a100", nodes=8)
        for layers in DEPTHS:
            graph = shardwise.models.gpt(layers=layers, hidden=4096, heads=32, seq=2048, vocab=51200, batch=2)
            for level in LEVELS:
                r = grid.get(("6.7B", 64, level)) if layers == 32 else None
                r = r or timed_plan(graph, cluster, 1024, level, pipeline=True)
                depth[(layers, level)] = r
                print(row(f"{layers} layers", 64, level, r) + f"  ({graph.num_nodes()} graph nodes)", flush=True)

        print()
        print("Llama-3-8B (transformers LlamaForCausalLM on the meta device, seq 8192, global batch 512), 64 GPUs")
        llama: dict[str, dict] = {}
        try:
            graph, cap = llama3_8b_graph()
        except ImportError as e:
            print(f"  skipped: {e} (transformers is not installed)")
        else:
            print(f"  capture: {cap.wall:.2f} s wall, {cap.cpu:.2f} s CPU, {graph.num_nodes()} nodes, "
                  f"{graph.num_parameters() / 1e9:.2f}B parameters")
            print(HEADER)
            for level in LEVELS:
                r = timed_plan(graph, cluster, 512, level, pipeline=None)  # default: joint on 8 nodes
                llama[level] = r
                print(row("Llama-3-8B", 64, level, r), flush=True)

    print()
    for level in LEVELS:
        r = grid.get(("175B", 1024, level))
        if r is None:
            continue
        print(f"GPT-3 175B on 1,024 GPUs, {level}: {r['wall']:.2f} s wall, {r['cpu']:.2f} s CPU; budget "
              f"{BUDGET[level]:.0f} s: time / budget {r['wall'] / BUDGET[level]:.2f} (wall), "
              f"{r['cpu'] / BUDGET[level]:.2f} (CPU)")
    print(f"whole run: {whole.wall:.0f} s wall, {whole.cpu:.0f} s CPU; {machine_line()}")

    devices = [8 * n for n in NODES]
    by_devices = Panel("GPT-3 family: planning time vs devices", "devices (DGX-A100, 8 per node)",
                       "planning time, CPU s", x_ticks=devices)
    legend = []
    for i, (name, *_rest) in enumerate(GPT3):
        color = PALETTE[i]
        for level in LEVELS:
            dashed, marker = level == "thorough", "square" if level == "thorough" else "circle"
            by_devices.add(f"{name} {level}", [(n, grid[(name, n, level)]["cpu"]) for n in devices], color,
                           dashed, marker)
            legend.append((f"{name} {level}", color, dashed, marker))
    by_depth = Panel("Planning time vs layers (hidden 4096, 64 GPUs)", "layers", "planning time, CPU s",
                     x_ticks=DEPTHS)
    for level in LEVELS:
        dashed, marker = level == "thorough", "square" if level == "thorough" else "circle"
        by_depth.add(f"depth {level}", [(n, depth[(n, level)]["cpu"]) for n in DEPTHS], "#333", dashed, marker)
    legend += [("depth fast", "#333", False, "circle"), ("depth thorough", "#333", True, "square")]
    os.makedirs(os.path.dirname(args.svg) or ".", exist_ok=True)
    svg = write_chart(args.svg, [by_devices, by_depth], legend,
                      "GPT-3 sizes, shardwise joint planner (pipeline=True), CPU seconds on one core; "
                      "solid: fast, dashed: thorough; log axes")
    ET.fromstring(svg)  # raises if the SVG is not well-formed XML
    print(f"wrote {args.svg} ({len(svg)} bytes, well-formed XML)")
    if args.record:
        record("planner_scaling", _recorded(grid, spmd, depth, llama, devices), {
            "formats": {"TFLOP/s": ".1f"},
            "notes": "Each cell: planning CPU seconds at fast / thorough (the planner is single-threaded; wall "
                     "within a few percent). \"8, SPMD\": one node, shardwise.plan's default there (the SPMD "
                     "search); the other columns: the joint planner. The plan and its predicted model TFLOP/s per "
                     "GPU at fast on the most GPUs of the row; \"NO\": it does not fit. Budget for GPT-3 175B on "
                     f"1,024 GPUs: fast < 5 s, thorough < 60 s. Whole run {whole.wall:.0f} s."})


def _recorded(grid: dict, spmd: dict, depth: dict, llama: dict, devices: list[int]) -> list[dict]:
    """The table results/planner_scaling.json holds: a row per model, a column per device count."""
    def cell(fast, thorough):
        return f"{fast['cpu']:.2f} / {thorough['cpu']:.2f}" if fast and thorough else None

    def last(r):
        return {"plan (fast, most GPUs)": describe(r["plan"]) + ("" if r["fits"] else " (NO: does not fit)"),
                "TFLOP/s": round(r["tflops"], 1)}

    rows = []
    for name, *_rest in GPT3:
        row = {"model": f"GPT-3 {name}", "8, SPMD": cell(spmd.get((name, "fast")), spmd.get((name, "thorough")))}
        row.update({f"{n:,}": cell(grid[(name, n, "fast")], grid[(name, n, "thorough")]) for n in devices})
        rows.append(row | last(grid[(name, devices[-1], "fast")]))
    for layers in DEPTHS:
        rows.append({"model": f"{layers} layers x 4096",
                     "64": cell(depth[(layers, "fast")], depth[(layers, "thorough")])} | last(depth[(layers, "fast")]))
    if llama:
        rows.append({"model": "Llama-3-8B", "64": cell(llama["fast"], llama["thorough"])} | last(llama["fast"]))
    columns = ["model", "8, SPMD", *(f"{n:,}" for n in devices), "plan (fast, most GPUs)", "TFLOP/s"]
    return [{c: r.get(c) for c in columns} for r in rows]


if __name__ == "__main__":
    main()
