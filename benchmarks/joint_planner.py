"""The joint planner (pipeline x data x tensor) on GPT-3 175B and 1,024 A100s, next to the
Megatron-LM configuration for that size, priced by the same cost model.

    python benchmarks/joint_planner.py

Prints the planning time at both levels (targets: fast < 5 s, thorough < 60 s), the chosen
(t, p, d), micro-batch, schedule, virtual stages, recomputation, ZeRO stage, and the predicted
step time and TFLOP/s per device against Megatron's t 8, p 16, d 8 (interleaved, v 2).
"""
from __future__ import annotations

import os
import time

import shardwise


def describe(plan) -> str:
    return (f"t {plan.tensor:>2} p {plan.pipeline:>2} d {plan.data:>3}  b {plan.micro_batch}  {plan.schedule:<16} "
            f"v {plan.virtual_stages}  recompute {plan.recompute:<4}  zero {plan.zero_stage}")


def main() -> None:
    graph = shardwise.models.gpt(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)
    cluster = shardwise.Cluster.preset("dgx-a100", nodes=128)
    print(f"machine: {os.uname().machine}, {os.cpu_count()} cores; GPT-3 175B (96 x 12288, seq 2048), "
          f"{cluster.world_size} A100 (DGX, 128 nodes), global batch 1536, bf16")
    megatron = shardwise.Plan.manual(graph, cluster, tensor=8, pipeline=16, data=8, global_batch=1536, micro_batch=1,
                                     schedule="interleaved-1f1b", virtual_stages=2, recompute=True)
    print(f"{'':<22}{'plan':<78}{'step s':>8}  {'TFLOP/s':>8}  {'step / Megatron':>15}")
    base = megatron.predicted_step_time()
    print(f"{'Megatron (Table 1)':<22}{describe(megatron):<78}{base:>8.2f}  "
          f"{megatron.predicted_tflops_per_device():>8.1f}  {1.0:>15.3f}")
    for level in ("fast", "thorough"):
        t0 = time.perf_counter()
        plan = shardwise.plan(graph, cluster, global_batch=1536, level=level)  # joint: several nodes
        seconds = time.perf_counter() - t0
        step = plan.predicted_step_time()
        label = f"{level} ({seconds:.1f} s)"
        print(f"{label:<22}{describe(plan):<78}{step:>8.2f}  {plan.predicted_tflops_per_device():>8.1f}  "
              f"{step / base:>15.3f}")


if __name__ == "__main__":
    main()
