"""Published-throughput check: Megatron-LM, Narayanan et al. 2021 (arXiv 2104.04473), Table 1.

For each published row (GPT, seq 2048, vocab 51200, DGX A100 nodes, interleaved 1F1B,
full recomputation, data degree = GPUs / (t p)), build the graph with the torch-free
builder, cost the published configuration with shardwise's analytic model (one set of
constants, no per-row factor; attention as Megatron-LM 2021 ran it, unfused: the builder's
attention="math", whose 9 bytes per score were fitted on this table, docs/cost-model.md)
and print published vs predicted TFLOP/s per GPU, both in Megatron-LM's accounting (eq. 3:
the recomputed forward counted; Plan.predicted_megatron_tflops_per_device).

Micro-batch size and virtual stages are not in Table 1. Rule: the best predicted among
micro-batch in {1, 2, 4, 8} and v dividing layers / p (v = 1 when p = 1), among those whose
predicted memory per rank fits in 80 GB and whose micro-batch count m is a multiple of p
(Megatron's interleaved schedule requires it). The chosen (b, v) are printed.

Table 2 (175B and 530B: PTD-P vs ZeRO-3) is printed as a ranking check. Never fails.

    python benchmarks/megatron.py [--record]
"""
from __future__ import annotations

import time

import shardwise

# (params B, heads, hidden, layers, t, p, GPUs, global batch, published TFLOP/s per GPU)
TABLE1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]

# Table 2: (model, heads, hidden, layers, system, t, p, GPUs, global batch, micro batch, published TFLOP/s)
TABLE2 = [
    ("175B", 96, 12288, 96, "ZeRO-3", 1, 1, 384, 1536, 4, 144),
    ("175B", 96, 12288, 96, "ZeRO-3", 1, 1, 768, 1536, 2, 88),
    ("175B", 96, 12288, 96, "ZeRO-3", 1, 1, 1536, 1536, 1, 44),
    ("175B", 96, 12288, 96, "PTD-P", 8, 12, 384, 1536, 1, 153),
    ("175B", 96, 12288, 96, "PTD-P", 8, 12, 768, 1536, 1, 149),
    ("175B", 96, 12288, 96, "PTD-P", 8, 12, 1536, 1536, 1, 141),
    ("530B", 128, 20480, 105, "ZeRO-3", 1, 1, 560, 2240, 4, 141),
    ("530B", 128, 20480, 105, "ZeRO-3", 1, 1, 1120, 2240, 2, 80),
    ("530B", 128, 20480, 105, "ZeRO-3", 1, 1, 2240, 2240, 1, 42),
    ("530B", 128, 20480, 105, "PTD-P", 8, 35, 560, 2240, 1, 171),
    ("530B", 128, 20480, 105, "PTD-P", 8, 35, 1120, 2240, 1, 167),
    ("530B", 128, 20480, 105, "PTD-P", 8, 35, 2240, 2240, 1, 159),
]

MEMORY = 80e9


def best_plan(graph, cluster, t, p, d, batch, layers, recompute: bool = True):
    """(plan, b, v): the best predicted interleaved-1F1B plan of these degrees over b in
    {1, 2, 4, 8} and v dividing layers / p that fits in MEMORY, or None."""
    best = None
    vs = [v for v in range(1, layers // p + 1) if (layers // p) % v == 0 and layers % p == 0] if p > 1 else [1]
    if p > 1 and layers % p != 0:
        vs = [1]
    for b in (1, 2, 4, 8):
        if batch % (b * d):
            continue
        m = batch // (b * d)
        for v in vs:
            if v > 1 and m % p:
                continue
            try:
                plan = shardwise.Plan.manual(graph, cluster, tensor=t, pipeline=p, data=d, global_batch=batch,
                                             micro_batch=b, schedule="interleaved-1f1b", virtual_stages=v,
                                             recompute=recompute)
            except shardwise.ValidationError:
                continue
            if plan.predicted_memory()[0] > MEMORY:
                continue
            if best is None or (plan.predicted_megatron_tflops_per_device()
                                > best[0].predicted_megatron_tflops_per_device()):
                best = (plan, b, v)
    return best


def predict_table1_row(row):
    """(plan, micro_batch, virtual_stages, planning ms) for one Table 1 row, or None."""
    params, heads, hidden, layers, t, p, gpus, batch, published = row
    d = gpus // (t * p)
    graph = shardwise.models.gpt(layers=layers, hidden=hidden, heads=heads, seq=2048, vocab=51200,
                                 attention="math")
    cluster = shardwise.Cluster.preset("dgx-a100", nodes=gpus // 8)
    start = time.perf_counter()
    found = best_plan(graph, cluster, t, p, d, batch, layers)
    elapsed = (time.perf_counter() - start) * 1e3
    return None if found is None else (*found, elapsed)


def predict_table2_row(row) -> float:
    """Predicted TFLOP/s per GPU of one Table 2 row."""
    name, heads, hidden, layers, system, t, p, gpus, batch, b, published = row
    d = gpus // (t * p)
    graph = shardwise.models.gpt(layers=layers, hidden=hidden, heads=heads, seq=2048, vocab=51200,
                                 attention="math")
    cluster = shardwise.Cluster.preset("dgx-a100", nodes=gpus // 8)
    if system == "ZeRO-3":
        plan = shardwise.Plan.manual(graph, cluster, tensor=1, pipeline=1, data=d, global_batch=batch,
                                     micro_batch=b, schedule="1f1b", recompute=True, zero=3)
    else:
        plan = best_plan(graph, cluster, t, p, d, batch, layers)[0]
    return plan.predicted_megatron_tflops_per_device()


def table2_pairs(preds: dict):
    """(model, GPUs, PTD-P, ZeRO-3) for every size where both were predicted."""
    for name, heads, hidden, layers, system, t, p, gpus, batch, b, published in TABLE2:
        if system == "PTD-P" and (name, "ZeRO-3", gpus) in preds and (name, "PTD-P", gpus) in preds:
            yield name, gpus, preds[(name, "PTD-P", gpus)], preds[(name, "ZeRO-3", gpus)]


def main() -> None:
    import argparse

    from _results import add_record_argument, record

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_record_argument(parser)
    args = parser.parse_args()
    rows = []
    print("Megatron-LM (Narayanan et al. 2021) Table 1 vs shardwise's analytic model, DGX-A100 preset")
    print(f"{'params':>8} {'h':>6} {'L':>4} {'t':>2} {'p':>3} {'d':>4} {'GPUs':>5} {'B':>5} {'b':>2} {'v':>2}"
          f" {'pub':>5} {'pred':>6} {'err%':>6} {'mem GB':>7} {'bubble%':>7} {'cost ms':>7}")
    errors = []
    for row in TABLE1:
        params, heads, hidden, layers, t, p, gpus, batch, published = row
        d = gpus // (t * p)
        found = predict_table1_row(row)
        if found is None:
            print(f"{params:>8} no plan fits in 80 GB")
            continue
        plan, b, v, elapsed = found
        pred = plan.predicted_megatron_tflops_per_device()
        err = 100 * (pred - published) / published
        errors.append(err)
        br = plan.breakdown()
        bubble = 100 * br["pipeline_bubble"] / plan.predicted_step_time()
        print(f"{params:>8} {hidden:>6} {layers:>4} {t:>2} {p:>3} {d:>4} {gpus:>5} {batch:>5} {b:>2} {v:>2}"
              f" {published:>5} {pred:>6.1f} {err:>+6.1f} {plan.predicted_memory()[0] / 1e9:>7.1f}"
              f" {bubble:>7.1f} {elapsed:>7.0f}")
        rows.append([params, hidden, layers, t, p, d, gpus, batch, b, v, published, pred, err,
                     plan.predicted_memory()[0] / 1e9, bubble, elapsed])
    if errors:
        worst = max(errors, key=abs)
        within = sum(abs(e) <= 10 for e in errors)
        print(f"{within}/{len(errors)} rows within +-10%; worst error {worst:+.1f}%;"
              f" mean |error| {sum(abs(e) for e in errors) / len(errors):.1f}%")

    print()
    print("Table 2 ranking check: PTD-P vs ZeRO-3 (micro-batch as published, full recomputation in both systems)")
    print(f"{'model':>5} {'system':>7} {'t':>2} {'p':>3} {'GPUs':>5} {'B':>5} {'b':>2} {'pub':>5} {'pred':>6} {'err%':>6}")
    preds = {}
    for row in TABLE2:
        name, heads, hidden, layers, system, t, p, gpus, batch, b, published = row
        try:
            pred = predict_table2_row(row)
        except Exception as e:  # noqa: BLE001 - a benchmark never fails
            print(f"{name:>5} {system:>7} {gpus:>5}: {e}")
            continue
        preds[(name, system, gpus)] = pred
        print(f"{name:>5} {system:>7} {t:>2} {p:>3} {gpus:>5} {batch:>5} {b:>2} {published:>5} {pred:>6.1f}"
              f" {100 * (pred - published) / published:>+6.1f}")
    right = 0
    pairs = list(table2_pairs(preds))
    for name, gpus, q, z in pairs:
        right += q > z
        print(f"{name} at {gpus} GPUs: PTD-P {'>' if q > z else '<='} ZeRO-3 ({q:.0f} vs {z:.0f})"
              f" {'ok' if q > z else 'WRONG ORDER'}")
    print(f"{right}/{len(pairs)} pairs ranked as published")
    if args.record:
        summary = (f"{sum(abs(e) <= 10 for e in errors)}/{len(errors)} rows within ±10%; worst error "
                   f"{max(errors, key=abs):+.1f}%; mean |error| {sum(abs(e) for e in errors) / len(errors):.1f}%. "
                   if errors else "")
        record("megatron", rows, {
            "columns": ["params B", "hidden", "layers", "t", "p", "d", "GPUs", "B", "b", "v", "published TFLOP/s",
                        "predicted", "error %", "memory GB", "bubble %", "plan ms"],
            "formats": {"params B": ".1f", "predicted": ".1f", "error %": "+.1f", "memory GB": ".1f",
                        "bubble %": ".1f", "plan ms": ".0f"},
            "notes": summary + f"Table 2 (PTD-P against ZeRO-3): {right}/{len(pairs)} pairs ranked as published."})


if __name__ == "__main__":
    main()
