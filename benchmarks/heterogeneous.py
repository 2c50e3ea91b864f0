"""Heterogeneous clusters, planned: shardwise's plan on a mixed fleet against the best plan
that gives every device an equal share of the batch and every pipeline stage an equal share
of the layers, and against an exhaustive search where the cases are small enough.

    python benchmarks/heterogeneous.py              # a table; planner only, seconds
    python benchmarks/heterogeneous.py --quick      # two clusters, the test's size
    python benchmarks/heterogeneous.py --record     # + the table into results/heterogeneous.json and the README

Clusters (every figure from the presets' catalogue; the slow half of the third declared as
the A100's profile at half speed, Cluster JSON's "like" / "speed"):
  - a100+v100: a DGX A100 node and an 8 x V100 SXM2 node
  - h100+a100: a DGX H100 node and a DGX A100 node
  - a100+half: two DGX A100 nodes, the second throttled to half speed
  - mixed-a100-v100: the preset's one PCIe machine of 4 A100s and 4 V100s (SPMD only)

"ours" is ``shardwise.plan`` as a user calls it: on a mixed cluster of several nodes, the
faster of uneven batch shares (the SPMD search) and pipeline stages sized to their devices
(the joint planner). "equal" is the best of
  - the SPMD search's placements with equal batch shares (the balance's even_step_time), and
  - every pipeline plan of a grid (tensor 1..8, pipeline 2..8, micro-batch 1..4, 1F1B and
    ZB-H1, with and without recomputation) with layers split by count, priced by the same
    evaluator on the same cluster (each stage on its own devices) and fitting in memory.
"exhaustive" (the small cases: 8 layers): the joint planner (on Megatron's layout, the
evaluator Plan.manual prices with) against every split of the layers over its chunks at its
degrees, schedule and micro-batch, the best that fits.
Timing never fails anything: these are predictions, printed side by side.
"""
from __future__ import annotations

import argparse
import itertools
import json

import shardwise
from shardwise import _C

FRACTION = _C.MEMORY_FRACTION


def _two_nodes(first: str, second: str) -> shardwise.Cluster:
    a = json.loads(shardwise.Cluster.preset(first, 1).to_json())
    b = json.loads(shardwise.Cluster.preset(second, 1).to_json())
    types = {t["name"]: t for t in a["device_types"] + b["device_types"]}
    links = [dict(level) for level in a["links"]]
    if len(links) < 2:
        links.append({"name": "network", "bandwidth": 2.5e10, "latency": 7e-6})
    # The second node's inner link at its own speed (a V100 node's NVLink is slower).
    per_device = {t["name"]: {"bandwidth": b["links"][0]["bandwidth"], "latency": b["links"][0]["latency"]}
                  for t in b["device_types"] if t["name"] not in {u["name"] for u in a["device_types"]}}
    if per_device:
        links[0]["per_device"] = {**links[0].get("per_device", {}), **per_device}
    return shardwise.Cluster.from_json(json.dumps({
        "name": f"{first} + {second}", "device_types": list(types.values()),
        "nodes": a["nodes"] + b["nodes"], "links": links}))


def _fast_and_half() -> shardwise.Cluster:
    doc = json.loads(shardwise.Cluster.preset("dgx-a100", 2).to_json())
    doc["name"] = "dgx-a100 + dgx-a100 at half speed"
    doc["device_types"].append({"name": "a100-half", "like": "a100-sxm4-80gb", "speed": 0.5})
    doc["nodes"][1] = {"device": "a100-half", "count": 8}
    return shardwise.Cluster.from_json(json.dumps(doc))


CLUSTERS = {
    "a100+v100": lambda: _two_nodes("dgx-a100", "v100"),
    "h100+a100": lambda: _two_nodes("dgx-h100", "dgx-a100"),
    "a100+half": _fast_and_half,
    "mixed-a100-v100": lambda: shardwise.Cluster.preset("mixed-a100-v100"),
}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _grid(cluster, layers: int, global_batch: int):
    """(tensor, pipeline, data, micro_batch, schedule, recompute) of the comparison grid."""
    world = cluster.world_size
    per_node = world // cluster.num_nodes
    for t in (t for t in _divisors(per_node) if t <= 8):
        for p in (p for p in _divisors(world // t) if 2 <= p <= min(8, layers)):
            d = world // (t * p)
            if global_batch % d:
                continue
            for b in (1, 2, 4):
                if (global_batch // d) % b:
                    continue
                for schedule in ("1f1b", "zb-h1"):
                    for recompute in ((True, False) if schedule == "1f1b" else (False,)):
                        yield t, p, d, b, schedule, recompute


def _priced(graph, cluster, t, p, d, b, schedule, recompute, global_batch, layers_per_stage=None):
    try:
        plan = shardwise.Plan.manual(graph, cluster, tensor=t, pipeline=p, data=d, global_batch=global_batch,
                                     micro_batch=b, schedule=schedule, recompute=recompute, precision="bf16",
                                     layers_per_stage=layers_per_stage)
    except _C.ValidationError:
        return None
    if plan._result["memory_use"] > FRACTION:
        return None
    return plan.predicted_step_time()


def _compositions(total: int, parts: int):
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield [bounds[i + 1] - bounds[i] for i in range(parts)]


def _row(name: str, cluster, graph, layers: int, global_batch: int, exhaustive: bool) -> dict:
    ours = shardwise.plan(graph, cluster, global_batch=global_batch, precision="bf16")
    shares = ours if ours.pipeline == 1 else shardwise.plan(graph, cluster, global_batch=global_batch,
                                                              precision="bf16", pipeline=False)
    balance = shares.balance()
    equal = [balance["even_step_time"]] if balance else [shares.predicted_step_time()]
    best_stages = joint = None
    if cluster.num_nodes > 1:
        for point in _grid(cluster, layers, global_batch):
            step = _priced(graph, cluster, *point, global_batch)
            if step is not None:
                equal.append(step)
        if exhaustive:
            # The joint planner on the evaluator Plan.manual prices with (Megatron's layout), and
            # every split of the layers at its degrees, schedule and chunks.
            joint = shardwise.Plan.joint(graph, cluster, global_batch=global_batch, precision="bf16",
                                         stage_layouts=False)
            j = json.loads(joint.to_json())
            chunks = j["pipeline"] * j["virtual_stages"]
            for split in _compositions(layers, chunks):
                try:
                    plan = shardwise.Plan.manual(graph, cluster, tensor=j["tensor"], pipeline=j["pipeline"],
                                                 data=j["data"], global_batch=global_batch,
                                                 micro_batch=j["micro_batch"], schedule=j["schedule"],
                                                 virtual_stages=j["virtual_stages"], kfkb_k=j["kfkb_k"],
                                                 recompute=j["recompute"], zero=j["zero_stage"],
                                                 precision="bf16", layers_per_stage=split,
                                                 stage_groups=j.get("stage_groups"))
                except _C.ValidationError:
                    continue
                if plan._result["memory_use"] <= FRACTION and (best_stages is None or
                                                                plan.predicted_step_time() < best_stages[0]):
                    best_stages = (plan.predicted_step_time(), split)
    row = {"cluster": name, "ours_ms": ours.predicted_step_time() * 1e3,
           "how": (f"p{ours.pipeline} d{ours.data} t{ours.tensor} {ours.schedule} layers {ours.layers_per_stage}"
                   if ours.pipeline > 1 else
                   f"shares {[round(r, 3) for r in balance['ratios']]}" if balance else "even"),
           "equal_ms": min(equal) * 1e3}
    row["speedup"] = row["equal_ms"] / row["ours_ms"]
    if best_stages is not None:
        j = json.loads(joint.to_json())
        row["stages_ms"] = joint.predicted_step_time() * 1e3
        row["stages"] = (f"p{j['pipeline']} v{j['virtual_stages']} d{j['data']} t{j['tensor']} b{j['micro_batch']} "
                         f"{j['schedule']} {j['layers_per_stage'] or 'even'}"
                         + (f" on blocks {j['stage_groups']}" if j.get("stage_groups") else ""))
        row["exhaustive_ms"] = best_stages[0] * 1e3
        row["exhaustive"] = str(best_stages[1])
        row["vs_exhaustive"] = row["stages_ms"] / row["exhaustive_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two clusters, a small model")
    parser.add_argument("--json", help="also write the rows here")
    from _results import add_record_argument, record

    add_record_argument(parser)
    args = parser.parse_args()
    names = ["a100+half", "mixed-a100-v100"] if args.quick else list(CLUSTERS)
    big = shardwise.models.gpt(layers=24, hidden=2048, heads=16, seq=2048, vocab=50304, batch=2)
    small = shardwise.models.gpt(layers=8, hidden=1024, heads=16, seq=1024, vocab=50304, batch=2)
    rows = []
    for name in names:
        cluster = CLUSTERS[name]()
        if not args.quick:
            rows.append(_row(name, cluster, big, 24, 64, exhaustive=False) | {"model": "GPT 1.3B (24 x 2048)"})
        rows.append(_row(name, cluster, small, 8, 32, exhaustive=cluster.num_nodes > 1) |
                    {"model": "GPT 8 x 1024"})
    print("| cluster | model | ours (ms) | how | equal shares + stages (ms) | equal / ours |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['cluster']} | {r['model']} | {r['ours_ms']:.1f} | {r['how']} | {r['equal_ms']:.1f} | "
              f"{r['speedup']:.2f} |")
    print()
    print("| cluster | model | joint planner's stages | (ms) | best split, exhaustive | (ms) | joint / exhaustive |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "stages_ms" in r:
            print(f"| {r['cluster']} | {r['model']} | {r['stages']} | {r['stages_ms']:.2f} | {r['exhaustive']} | "
                  f"{r['exhaustive_ms']:.2f} | {r['vs_exhaustive']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.record:
        record("heterogeneous", [
            [r["cluster"], r["model"], r["ours_ms"], r["how"], r["equal_ms"], r["speedup"], r.get("stages"),
             r.get("stages_ms"), r.get("exhaustive"), r.get("exhaustive_ms"), r.get("vs_exhaustive")] for r in rows], {
            "columns": ["cluster", "model", "ours ms", "how", "equal shares + stages ms", "equal / ours",
                        "joint planner's stages", "stages ms", "best split (exhaustive)", "exhaustive ms",
                        "joint / exhaustive"],
            "formats": {"ours ms": ".1f", "equal shares + stages ms": ".1f", "equal / ours": ".2f",
                        "stages ms": ".2f", "exhaustive ms": ".2f", "joint / exhaustive": ".3f"},
            "notes": "Predicted steps (planner only), bf16; global batch 64 (1.3B) and 32 (8 x 1024)."},
            key=("cluster", "model"))


if __name__ == "__main__":
    main()
