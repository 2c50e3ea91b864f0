"""Plan quality: the joint planner's plan against Megatron-LM's published configuration, for
every row of Narayanan et al. 2021 (arXiv 2104.04473) Table 1, both priced by the same cost
model (`cost/plan_cost.h`).

    PYTHONPATH=python python benchmarks/plan_quality.py [--levels fast,thorough] [--record]

Megatron: the row's t, p, d (GPUs / (t p)) and global batch, interleaved 1F1B, full
recomputation, with the micro-batch and virtual stages Table 1 leaves out chosen as in
benchmarks/megatron.py (best predicted among b in {1, 2, 4, 8} and v dividing layers / p that
fit in 80 GB with m a multiple of p).
Ours: `shardwise.plan(graph, cluster, global_batch=B, level=..., pipeline=True)` on the same
GPT graph (seq 2048, vocab 51200, bf16) and the same DGX-A100 cluster.
Prints per row and level: the chosen (t, p, d), micro-batch, schedule, recomputation, ZeRO
stage, predicted TFLOP/s per GPU (Megatron-LM's accounting, as the paper's), Megatron's, the
ratio ours / Megatron and the planning seconds (wall and CPU). Also Megatron's (t, p, d)
without recomputation (best b, v that fit), to separate what the degrees gain from what
dropping recomputation gains, and flags a plan
Megatron-LM could not run as written: t not dividing the heads or the 8 GPUs of a node
(a tensor group then spans two nodes, which the cost model prices as if it were inside one:
see the README), or layers not divisible by p x v (uneven stages: Megatron-LM's interleaved
schedule needs even chunks). "best valid" is the best plan among the
planner's ten best that has no flag. Where ours is below Megatron, the step's breakdown of
both is printed. Under every row, each plan's predicted MFU (model FLOPs / 312 TFLOP/s, A100
bf16) as priced and with every overlap it relies on exposed instead, and which overlaps
those are (the data-parallel reduction beside backward, ZB-H1's weight gradients in the
bubble). Asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _machine import Timer, machine_line  # noqa: E402
from megatron import TABLE1, best_plan, predict_table1_row  # noqa: E402

import shardwise  # noqa: E402

PER_NODE = 8


def describe(plan) -> str:
    # (ZB-V and DualPipeV were printed "int v2" before: every schedule but 1F1B and ZB-H1 was.)
    sched = {"interleaved-1f1b": f"int v{plan.virtual_stages}", "dualpipe-v": "dpv",
             "kfkb": f"kfkb{plan.kfkb_k}"}.get(plan.schedule, plan.schedule)
    return (f"({plan.tensor},{plan.pipeline},{plan.data}) b{plan.micro_batch} {sched:<6} "
            f"rc {plan.recompute:<4} z{plan.zero_stage}")


def flags(plan, heads: int, layers: int) -> str:
    out = []
    t, p, v = plan.tensor, plan.pipeline, plan.virtual_stages
    if heads % t:
        out.append(f"t{t}!|heads{heads}")
    if PER_NODE % t:
        out.append(f"t{t} spans nodes")
    if layers % (p * v):
        out.append(f"uneven L{layers}/(p{p} v{v})")
    return ",".join(out)


def no_recompute(graph, cluster, t, p, d, batch, layers):
    """Megatron's degrees, recomputation off: the best (b, v) that fits in 80 GB, or None."""
    found = best_plan(graph, cluster, t, p, d, batch, layers, recompute=False)
    return found[0] if found else None


A100_BF16_PEAK = 312.0  # TFLOP/s: MFU = model FLOPs per second per GPU / this


def overlap(plan) -> tuple[float, str]:
    """(the plan's model-FLOPs MFU with every overlap it relies on exposed instead, and what
    those overlaps are): the data-parallel reduction beside backward (the evaluator's
    data_parallel_total less its exposed part), and the weight gradients of ZB-H1, ZB-V and
    DualPipeV filling the bubble of the same plan unsplit ((p - 1) / v micro-batch times, 1F1B's
    or interleaving's, less the schedule's bubble: the evaluator's own formulas)."""
    br = plan.breakdown()
    hidden = {}
    dp = br.get("data_parallel_total", 0.0) - br.get("data_parallel", 0.0)
    if dp > 1e-9:
        hidden["dp beside bwd"] = dp
    if plan.schedule in ("zb-h1", "zb-v", "dualpipe-v"):
        per_micro_batch = (br["compute"] + br["tensor_parallel"]) / plan.num_micro_batches()
        unsplit = (plan.pipeline - 1) / plan.virtual_stages * per_micro_batch
        hidden["W in bubble"] = unsplit - br["pipeline_bubble"]
    step = plan.predicted_step_time()
    exposed = plan.predicted_tflops_per_device() * step / (step + sum(hidden.values())) / A100_BF16_PEAK
    return exposed, ", ".join(f"{k} {v:.2f} s" for k, v in hidden.items()) or "none"


def overlap_line(label: str, plan) -> str:
    mfu = plan.predicted_tflops_per_device() / A100_BF16_PEAK
    without, relies = overlap(plan)
    return (f"      {label:<9} MFU {100 * mfu:5.1f}% with overlap, {100 * without:5.1f}% without; "
            f"relies on: {relies}")


def breakdown_line(label: str, plan) -> str:
    br = plan.breakdown()
    parts = ["compute", "tensor_parallel", "pipeline_p2p", "pipeline_bubble", "data_parallel", "optimizer",
             "zero_broadcast"]
    return (f"      {label:<9} step {plan.predicted_step_time():6.2f} s = "
            + " + ".join(f"{k.replace('pipeline_', 'pp_').replace('_parallel', '')} {br.get(k, 0.0):.2f}"
                         for k in parts)
            + f"; memory {plan.predicted_memory()[0] / 1e9:.1f} GB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="fast,thorough", help="comma-separated: fast, thorough")
    from _results import add_record_argument, record

    add_record_argument(ap)
    args = ap.parse_args()
    levels = [x for x in args.levels.split(",") if x]
    print(machine_line())
    print("Narayanan et al. 2021 Table 1 rows: ours = shardwise.plan(pipeline=True), Megatron = the published "
          "(t, p, d), both priced by cost/plan_cost.h on DGX-A100 nodes")
    print(f"{'params':>7} {'GPUs':>5} {'B':>5} {'level':<8} {'ours (t,p,d) b sched rc zero':<36} {'ours':>6} "
          f"{'Megatron (t,p,d) b v':<22} {'Meg':>6} {'ours/Meg':>8} {'Meg norc':>8} {'wall s':>7} {'cpu s':>7}"
          f"  {'flags':<22} best valid")
    summary = {level: [] for level in levels}
    with Timer() as whole:
        for row in TABLE1:
            params, heads, hidden, layers, t, p, gpus, batch, published = row
            d = gpus // (t * p)
            graph = shardwise.models.gpt(layers=layers, hidden=hidden, heads=heads, seq=2048, vocab=51200)
            cluster = shardwise.Cluster.preset("dgx-a100", nodes=gpus // PER_NODE)
            found = predict_table1_row(row)
            if found is None:
                print(f"{params:>7} Megatron's configuration does not fit in 80 GB under the model; skipped")
                continue
            meg, mb, mv, _ = found
            meg_tf = meg.predicted_megatron_tflops_per_device()
            norc = no_recompute(graph, cluster, t, p, d, batch, layers)
            norc_s = f"{norc.predicted_megatron_tflops_per_device():8.1f}" if norc is not None else f"{'no fit':>8}"
            meg_s = f"({t},{p},{d}) b{mb} v{mv}"
            for level in levels:
                with Timer() as clock:
                    ours = shardwise.plan(graph, cluster, global_batch=batch, level=level, pipeline=True)
                tf = ours.predicted_megatron_tflops_per_device()
                valid = [a for a in [ours, *ours.alternatives()[1:]] if not flags(a, heads, layers)]
                best_valid = valid[0].predicted_megatron_tflops_per_device() if valid else None
                valid_s = (f"{describe(valid[0])} {best_valid:.1f} ({best_valid / meg_tf:.3f})" if valid
                           else "none in top 10")
                fl = flags(ours, heads, layers)
                summary[level].append((params, tf / meg_tf, clock.wall, clock.cpu, fl,
                                       valid[0].predicted_megatron_tflops_per_device() / meg_tf if valid else None))
                print(f"{params:>7} {gpus:>5} {batch:>5} {level:<8} {describe(ours):<36} {tf:6.1f} {meg_s:<22} "
                      f"{meg_tf:6.1f} {tf / meg_tf:8.4f} {norc_s} {clock.wall:7.2f} {clock.cpu:7.2f}  "
                      f"{fl or '-':<22} {'=' if not fl else valid_s}", flush=True)
                if tf < meg_tf or not ours.fits:
                    print(breakdown_line("ours", ours))
                    print(breakdown_line("Megatron", meg))
                print(overlap_line("ours", ours))
                print(overlap_line("Megatron", meg))
    # GPT-3 175B on 1,024 A100s (the joint planner's headline job): Megatron-LM's configuration
    # for it (t 8, p 16, d 8, interleaved v 2, recomputation) against ours, with the overlaps.
    gpt3 = shardwise.models.gpt(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)
    cluster = shardwise.Cluster.preset("dgx-a100", nodes=128)
    meg = shardwise.Plan.manual(gpt3, cluster, tensor=8, pipeline=16, data=8, global_batch=1536, micro_batch=1,
                                schedule="interleaved-1f1b", virtual_stages=2, recompute=True)
    print(f"\nGPT-3 175B, 1024 GPUs, batch 1536: Megatron (8,16,8) b1 int v2 rc full "
          f"{meg.predicted_megatron_tflops_per_device():.1f} TFLOP/s (Megatron's accounting)")
    print(overlap_line("Megatron", meg))
    headline = {}
    for level in levels:
        ours = shardwise.plan(gpt3, cluster, global_batch=1536, level=level, pipeline=True)
        headline[level] = (" ".join(describe(ours).split()), ours.predicted_megatron_tflops_per_device(),
                           ours.predicted_megatron_tflops_per_device() / meg.predicted_megatron_tflops_per_device())
        print(f"  {level:<8} ours {describe(ours)} {ours.predicted_megatron_tflops_per_device():.1f} TFLOP/s "
              f"({ours.predicted_megatron_tflops_per_device() / meg.predicted_megatron_tflops_per_device():.3f} x)")
        print(overlap_line("ours", ours))
    print()
    for level in levels:
        rows = summary[level]
        if not rows:
            continue
        ratios = [r[1] for r in rows]
        below = [f"{r[0]}B ({r[1]:.3f})" for r in rows if r[1] < 1]
        flagged = [f"{r[0]}B" for r in rows if r[4]]
        valid = [(r[1], r[5]) for r in rows if r[5] is not None]
        print(f"{level}: ours / Megatron min {min(ratios):.3f}, geometric mean "
              f"{_gmean(ratios):.3f}, max {max(ratios):.3f}; below 1 on {len(below)} of {len(rows)} rows"
              f"{': ' + ', '.join(below) if below else ''}; planning {sum(r[2] for r in rows):.0f} s wall, "
              f"{sum(r[3] for r in rows):.0f} s CPU in all, worst {max(r[2] for r in rows):.1f} s wall")
        if flagged:
            print(f"  plans Megatron-LM could not run as written on {len(flagged)} rows ({', '.join(flagged)}); "
                  f"over the {len(valid)} rows with a valid plan among the ten best, geometric mean ours / Megatron "
                  f"{_gmean([v[0] for v in valid]):.3f} as found, {_gmean([v[1] for v in valid]):.3f} with the best "
                  f"valid one, min {min(v[1] for v in valid):.3f}")
    print(f"whole run: {whole.wall:.0f} s wall, {whole.cpu:.0f} s CPU; {machine_line()}")
    if args.record:
        record("plan_quality", [{
            "level": level, "ours / Megatron, min": min(r[1] for r in summary[level]),
            "geometric mean": _gmean([r[1] for r in summary[level]]), "max": max(r[1] for r in summary[level]),
            "rows below 1": f"{sum(r[1] < 1 for r in summary[level])} of {len(summary[level])}",
            "planning s (all rows, wall)": sum(r[2] for r in summary[level]),
            "GPT-3 175B on 1,024 GPUs: ours": headline[level][0], "TFLOP/s": headline[level][1],
            "x Megatron": headline[level][2]} for level in levels if summary[level]], {
            "formats": {"ours / Megatron, min": ".3f", "geometric mean": ".3f", "max": ".3f",
                        "planning s (all rows, wall)": ".0f", "TFLOP/s": ".1f", "x Megatron": ".3f"},
            "notes": "Ours / Megatron: predicted TFLOP/s per GPU (Megatron-LM's accounting) of shardwise.plan("
                     "pipeline=True) over Megatron's published configuration, both priced by cost/plan_cost.h, on "
                     f"the {len(TABLE1)} rows of Narayanan et al. 2021 Table 1; the per-row table is the script's "
                     "output."},
            key=("level",))


def _gmean(xs: list[float]) -> float:
    import math

    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


if __name__ == "__main__":
    main()
