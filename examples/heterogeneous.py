"""A cluster of four A100s and four V100s: the search gives each device its share of the batch.

    python examples/heterogeneous.py
"""
import shardwise

graph = shardwise.models.gpt(layers=4, hidden=1024, heads=16, seq=1024, vocab=50304, batch=2)
cluster = shardwise.Cluster.preset("mixed-a100-v100")
plan = shardwise.plan(graph, cluster, global_batch=64, mesh=(8, 1))
balance = plan.balance()
print("batch shares per rank:", [round(r, 4) for r in balance["ratios"]])
print(f"predicted step {balance['step_time'] * 1e3:.1f} ms with these shares, "
      f"{balance['even_step_time'] * 1e3:.1f} ms with equal ones")
