"""The joint planner (pipeline x data x tensor) on GPT-3 175B and 1,024 A100s, next to the
Megatron-LM configuration for that size, priced by the same cost model.

    python benchmarks/joint_planner.py [--record]

Prints the planning time at both levels (targets: fast < 5 s, thorough < 60 s), the chosen
(t, p, d), micro-batch b and micro-batches m per step, schedule, virtual stages,
recomputation, ZeRO stage, and the predicted step time and TFLOP/s per device (Megatron-LM's
accounting, as the paper's) against
Megatron's t 8, p 16, d 8 (interleaved, v 2): once
with the best plans' stages laid out by the SPMD search (the default), once with Megatron's
layout alone (the model Megatron's row is priced with).

Then the same planner told the condition of the links between pipeline stages
(shardwise.NetworkCondition): with none (the evaluator alone), steady, and with the bandwidth
cut every other period, on a small GPT that must be pipelined over slow links and on 175B:
the chosen plan, its predicted step, and for a kFkB choice its step against its own 1F1B twin
(same degrees and micro-batch), both simulated on that network.
"""
from __future__ import annotations

import json
import os
import time

import shardwise


def describe(plan) -> str:
    return (f"t {plan.tensor:>2} p {plan.pipeline:>2} d {plan.data:>3}  b {plan.micro_batch} "
            f"m {plan.num_micro_batches():>4}  {plan.schedule:<16} v {plan.virtual_stages}  "
            f"recompute {plan.recompute:<4}  zero {plan.zero_stage}")


def main() -> None:
    import argparse

    from _results import add_record_argument, record

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_record_argument(parser)
    args = parser.parse_args()
    rows = []
    graph = shardwise.models.gpt(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)
    cluster = shardwise.Cluster.preset("dgx-a100", nodes=128)
    print(f"machine: {os.uname().machine}, {os.cpu_count()} cores; GPT-3 175B (96 x 12288, seq 2048), "
          f"{cluster.world_size} A100 (DGX, 128 nodes), global batch 1536, bf16")
    megatron = shardwise.Plan.manual(graph, cluster, tensor=8, pipeline=16, data=8, global_batch=1536, micro_batch=1,
                                     schedule="interleaved-1f1b", virtual_stages=2, recompute=True)
    print(f"{'':<30}{'plan':<86}{'step s':>8}  {'TFLOP/s':>8}  {'step / Megatron':>15}")
    base = megatron.predicted_step_time()
    print(f"{'Megatron (Table 1)':<30}{describe(megatron):<86}{base:>8.2f}  "
          f"{megatron.predicted_megatron_tflops_per_device():>8.1f}  {1.0:>15.3f}")
    rows.append(["GPT-3 175B: Megatron (Table 1)", None, " ".join(describe(megatron).split()), round(base, 2),
                 megatron.predicted_megatron_tflops_per_device(), 1.0, None, None])
    for level in ("fast", "thorough"):
        for layouts in (True, False):
            t0 = time.perf_counter()
            plan = shardwise.Plan.joint(graph, cluster, global_batch=1536, level=level, stage_layouts=layouts)
            seconds = time.perf_counter() - t0
            step = plan.predicted_step_time()
            label = f"{level} ({seconds:.1f} s)" if layouts else f"{level}, Megatron's layout"
            print(f"{label:<30}{describe(plan):<86}{step:>8.2f}  {plan.predicted_megatron_tflops_per_device():>8.1f}  "
                  f"{step / base:>15.3f}")
            rows.append([f"GPT-3 175B: {level}" + ("" if layouts else ", Megatron's layout"), None,
                         " ".join(describe(plan).split()), round(step, 2),
                         plan.predicted_megatron_tflops_per_device(), step / base, seconds if layouts else None, None])
    print("(the first of each level prices its best plans with the layout the SPMD search finds for their "
          "stages' tensor ranks, sequence parallelism included; the second, like Megatron's row, with Megatron's "
          "layout)")

    networks = [("none (evaluator alone)", None),
                ("steady", shardwise.NetworkCondition(durations=(0.1,), bandwidth=(1.0,))),
                ("halved every other 0.1 s", shardwise.NetworkCondition(durations=(0.1, 0.1), bandwidth=(1.0, 0.5))),
                ("1/5 every other 0.1 s", shardwise.NetworkCondition(durations=(0.1, 0.1), bandwidth=(1.0, 0.2)))]
    doc = json.loads(shardwise.Cluster.preset("dgx-a100", nodes=4).to_json())
    for device in doc["device_types"]:
        device["memory_bytes"] = 2 * 2**30
    doc["links"][1]["bandwidth"] = 1.25e9
    cases = [("GPT 8 x 2048 on 4 DGX A100 nodes, 2 GiB devices, 10 Gb/s between nodes, batch 256",
              shardwise.models.gpt(layers=8, hidden=2048, heads=16, seq=2048, vocab=51200),
              shardwise.Cluster.from_json(json.dumps(doc)), 256),
             ("GPT-3 175B on 128 DGX A100 nodes, batch 1536", graph, cluster, 1536)]
    short = {cases[0][0]: "GPT 8 x 2048, 4 nodes, 10 Gb/s", cases[1][0]: "GPT-3 175B"}
    for title, g, c, batch in cases:
        print(f"\n{title}, level fast")
        print(f"{'network':<26}{'plan':<86}{'step s':>8}  {'plan s':>6}  kfkb / its 1f1b")
        for name, network in networks:
            t0 = time.perf_counter()
            plan = shardwise.plan(g, c, global_batch=batch, pipeline=True, network=network)
            seconds = time.perf_counter() - t0
            twin = ""
            if plan.schedule == "kfkb":
                same = [p for p in plan.alternatives() if p.schedule == "1f1b" and
                        (p.tensor, p.pipeline, p.data, p.micro_batch) ==
                        (plan.tensor, plan.pipeline, plan.data, plan.micro_batch)]
                twin = (f"{plan.predicted_step_time() / same[0].predicted_step_time():.3f}" if same
                        else "twin not in 10 best")
                label = describe(plan) + f"  k {plan.kfkb_k}"
            else:
                label = describe(plan)
            print(f"{name:<26}{label:<86}{plan.predicted_step_time():>8.3f}  {seconds:>6.2f}  {twin}")
            rows.append([f"{short[title]}, fast", name, " ".join(label.split()), round(plan.predicted_step_time(), 3),
                         None, None, seconds, twin or None])
    if args.record:
        record("joint_planner", rows, {
            "columns": ["case", "network between stages", "plan", "step s", "TFLOP/s", "step / Megatron", "plan s",
                        "kfkb / its 1f1b"],
            "formats": {"TFLOP/s": ".1f", "step / Megatron": ".3f", "plan s": ".2f"},
            "notes": "GPT-3 175B (96 x 12288, seq 2048) on 1,024 A100s (128 DGX nodes), global batch 1536, bf16; "
                     "TFLOP/s in Megatron-LM's accounting. \"Megatron's layout\": the best plans priced with "
                     "Megatron's layout alone (the model Megatron's row is priced with); the others with the SPMD "
                     "search's stage layouts. The small GPT: 2 GiB devices, batch 256."})


if __name__ == "__main__":
    main()
