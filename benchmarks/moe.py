"""Expert parallelism against the best plan without it (issue 48), side by side in one run.

transformers' Mixtral (2 layers, hidden 128, 8 experts of 1,024, top 2; default experts,
captured as one op: python/shardwise/_moe_experts.py), float32, trained on Gloo processes of
this machine: each world's plan is the SPMD search on a data axis of that many ranks with the
experts' split allowed (``expert_parallel=True``: the search splits them, each rank holding its
block, the tokens gathered before them and their sum reduce-scattered after) and off (every
rank holds every expert, data parallelism for them). Printed per run: the experts' strategy,
the median step after a warm-up, the peak tensor memory of the largest rank
(benchmarks/_tensor_memory.py), the plan's predicted step, and allowed / off ratios.

    python benchmarks/moe.py [--worlds 2 4] [--steps 3] [--record]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VOCAB, ROWS, SEQ = 512, 8, 64


def _model():
    """The Mixtral with its loss (shardwise.models.CausalLMWithLoss), so that the graph the plan
    is searched on is the one parallelize captures."""
    import torch
    import transformers

    from shardwise.models import CausalLMWithLoss

    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(num_hidden_layers=2, hidden_size=128, intermediate_size=1024,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                     max_position_embeddings=SEQ, num_local_experts=8, num_experts_per_tok=2)
    return CausalLMWithLoss(transformers.MixtralForCausalLM(cfg))


def _batch() -> tuple:
    import torch

    ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=torch.Generator().manual_seed(1))
    return ids, torch.roll(ids, -1, dims=1)


def _rank(rank: int, store: str, world: int, allowed: bool, steps: int, out: str) -> None:
    """One rank of a run: the search's plan on a data axis of `world` ranks (experts' split
    allowed or not), a warm-up step, `steps` timed, then one more under the peak counter."""
    import statistics
    import time

    import torch
    import torch.distributed as dist

    import shardwise
    from _tensor_memory import PeakTensorBytes, live_storages

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        model, batch = _model(), _batch()
        graph = shardwise.capture(_model(), batch)
        plan = shardwise.Plan.search(graph, shardwise.Cluster.preset("cpu", world), mesh=(world, 1),
                                     global_batch=ROWS, precision="f32", expert_parallel=allowed)
        before = live_storages()
        engine = shardwise.parallelize(model, batch, plan=plan, verify=False)
        optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-4)
        times = []
        for step in range(1 + steps):
            dist.barrier()
            start = time.perf_counter()
            optimizer.zero_grad()
            engine.train_step(*batch)
            optimizer.step()
            dist.barrier()
            if step:
                times.append(time.perf_counter() - start)
        optimizer.zero_grad()
        with PeakTensorBytes(exclude=before) as tensors:
            engine.train_step(*batch)
            optimizer.step()
        peak = torch.tensor([float(tensors.peak)])
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        strategy = sorted({" / ".join(v) for k, v in plan.sharding["strategies"].items() if k.startswith("experts")})
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"step": statistics.median(times), "memory": float(peak[0]), "strategy": ", ".join(strategy),
                           "predicted": plan.predicted_step_time()}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run(world: int, allowed: bool, steps: int) -> dict:
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        mp.spawn(_rank, args=(os.path.join(tmp, "store"), world, allowed, steps, out), nprocs=world, join=True)
        with open(out) as f:
            return json.load(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--record", action="store_true", help="write benchmarks/results/moe_train.json")
    args = ap.parse_args()
    from _machine import machine_line

    print(machine_line())
    header = ["processes", "expert parallelism", "experts' strategy", "step (s)", "peak MB per rank",
              "predicted step (s)", "allowed / off: step", "allowed / off: memory"]
    table = []
    for world in args.worlds:
        runs = {allowed: _run(world, allowed, args.steps) for allowed in (True, False)}
        without = runs[False]
        for allowed, r in runs.items():
            row = [world, "allowed" if allowed else "off", r["strategy"], r["step"], r["memory"] / 1e6,
                   r["predicted"], r["step"] / without["step"] if allowed else None,
                   r["memory"] / without["memory"] if allowed else None]
            table.append(row)
            print(f"  {world} processes, expert parallelism {row[1]}: experts {row[2]}, step {row[3]:.3f} s, peak "
                  f"{row[4]:.1f} MB a rank", flush=True)
    print(f"\nMixtral (2 layers, hidden 128, 8 experts of 1,024, top 2), float32, {ROWS} x {SEQ} tokens, AdamW")
    print("| " + " | ".join(header) + " |\n|" + " --- |" * len(header))
    for row in table:
        cells = [f"{c:.3f}" if isinstance(c, float) else ("-" if c is None else str(c)) for c in row]
        print("| " + " | ".join(cells) + " |")
    if args.record:
        import torch

        from _machine import cpu_model
        from _results import record

        record("moe_train", table, {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}",
            "columns": header,
            "formats": {"step (s)": ".3f", "peak MB per rank": ".1f", "predicted step (s)": ".4f",
                        "allowed / off: step": ".2f", "allowed / off: memory": ".2f"},
            "notes": f"transformers Mixtral (2 layers, hidden 128, 8 experts of 1,024, top 2, vocabulary {VOCAB}), "
                     f"float32, {ROWS} x {SEQ} tokens, Gloo processes on this machine's cores; each world's plan: "
                     "Plan.search on a data axis of that many ranks, the experts' split allowed or not "
                     "(expert_parallel=False); median of the timed steps after a warm-up, peak tensor memory of the "
                     "largest rank (benchmarks/_tensor_memory.py)."})


if __name__ == "__main__":
    main()
