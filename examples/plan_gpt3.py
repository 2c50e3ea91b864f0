"""Plan GPT-3 175B for 1,024 A100s on a laptop (no GPU, no weights), and draw its timeline.

    python examples/plan_gpt3.py [timeline.svg]
"""
import sys

import shardwise

graph = shardwise.models.gpt(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)  # the IR, no torch
cluster = shardwise.Cluster.preset("dgx-a100", nodes=128)
plan = shardwise.plan(graph, cluster, global_batch=1536)  # several nodes: the joint planner
print(plan.report())
print(f"planned in {plan.search_seconds():.1f} s: t {plan.tensor}, p {plan.pipeline}, d {plan.data}, "
      f"micro-batch {plan.micro_batch}, {plan.schedule}")
plan.timeline_svg(sys.argv[1] if len(sys.argv) > 1 else "gpt3-timeline.svg")
