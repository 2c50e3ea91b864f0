"""Collective matmul, measured: the plan the search makes with tensor-parallel collectives
run inside their matmuls as rings (runtime/collective_matmul.py), against the same plan,
the same placements, with those collectives run plainly, side by side.

    python benchmarks/collective_matmul.py                 # spawns 4 Gloo processes on this machine
    python benchmarks/collective_matmul.py --model gpt2    # Hugging Face GPT-2 of the same sizes
    python benchmarks/collective_matmul.py --record        # + its rows into results/ and the README

TinyGPT (nn.Linear: rings along the sequence dim of [b, s, h]) or Hugging Face GPT-2 (Conv1D:
[b, s, h] viewed as [b * s, h] into addmm, so each ring's blocks are strided, one slice of
every batch row) on a (1, world) mesh: ``Plan.search(..., mesh=(1, world), collective_matmul=True)``
on the CPU preset picks sequence parallelism (the norms cut along the sequence, the
column-parallel linears' inputs all-gathered into them, the row-parallel linears' outputs
reduce-scattered out of them), and the rewrite fuses those gathers and scatters. The plain
twin is the same plan JSON without ``sharding.collective_matmul``. Both engines hold the same
weights and train on the same batches with AdamW, alternating step by step; rank 0 reports
the median step time of each, the ratio fused / plain, the ratio the cost model predicts for
the same placements (the plan's breakdown ``step_time_plain_collectives``), the largest
relative difference between their losses, and how many contractions run a ring. Timing
never fails anything.
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from _machine import cpu_model
from _workers import (add_size_arguments, finish_worker, join_gloo, run_world, size_line, timed_rounds, token_batch,
                      training_steps, twin_tiny_gpts)


def _plans(model, batch, world: int):
    """The searched plan with collective matmuls and its twin without them."""
    import shardwise

    graph = shardwise.capture(model, batch)
    fused = shardwise.Plan.search(graph, shardwise.Cluster.preset("cpu", world), mesh=(1, world),
                                  global_batch=int(batch[0].shape[0]), precision="f32", collective_matmul=True)
    doc = json.loads(fused.to_json())
    for key in ("predicted", "programs"):
        doc.pop(key, None)
    doc["sharding"].pop("collective_matmul", None)
    return fused, shardwise.Plan.from_json(json.dumps(doc))


def _twin_gpt2s(rank: int, world: int, store: str, args):
    """twin_tiny_gpts' twins and batch, as Hugging Face GPT-2s of the same sizes (no dropout)
    with their own loss."""
    import transformers

    from shardwise.models.tiny_gpt import TinyGPTConfig

    join_gloo(rank, world, store)
    batch = token_batch(args, TinyGPTConfig().vocab)

    class CausalLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            cfg = transformers.GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=args.heads,
                                          n_positions=args.seq, vocab_size=TinyGPTConfig().vocab,
                                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                          eos_token_id=0)
            self.lm = transformers.GPT2LMHeadModel(cfg)

        def forward(self, input_ids, labels):
            return self.lm(input_ids=input_ids, labels=labels).loss

    torch.manual_seed(0)
    model, twin = CausalLM(), CausalLM()
    twin.load_state_dict(model.state_dict())
    return model, twin, batch


def _worker(rank: int, world: int, store: str, args, out: str) -> None:
    import shardwise

    twins = _twin_gpt2s if args.model == "gpt2" else twin_tiny_gpts
    model, twin, batch = twins(rank, world, store, args)
    fused_plan, plain_plan = _plans(model, batch, world)
    engines = {"fused": shardwise.parallelize(model, batch, plan=fused_plan),
               "plain": shardwise.parallelize(twin, batch, plan=plain_plan)}
    assert "self.collective_matmul(" in engines["fused"].code and "self.collective_matmul(" not in engines["plain"].code
    optimizers = {k: torch.optim.AdamW(e.parameters(), lr=1e-3) for k, e in engines.items()}
    losses = {k: [] for k in engines}
    wall, _ = timed_rounds(training_steps(engines, optimizers, batch, losses), args.warmup, args.steps)
    if rank == 0:
        median = {k: statistics.median(v) for k, v in wall.items()}
        difference = max(abs(a - b) / abs(b) for a, b in zip(losses["fused"], losses["plain"]))
        predicted = fused_plan.predicted_step_time()
        ir = engines["fused"].rank_ir
        with open(out, "w") as f:
            json.dump({"median_ms": {k: 1e3 * v for k, v in median.items()},
                       "ratio": median["fused"] / median["plain"], "loss_difference": difference,
                       "predicted_ms": {"fused": 1e3 * predicted,
                                        "plain": 1e3 * fused_plan.breakdown()["step_time_plain_collectives"]},
                       "gathers": ir.count("shardwise.gather_matmul"),
                       "scatters": ir.count("shardwise.matmul_scatter=")}, f)
    finish_worker()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_size_arguments(parser, worlds="4", layers=4, hidden=256, heads=4, seq=128, batch=8)
    parser.add_argument("--model", choices=("tiny-gpt", "gpt2"), default="tiny-gpt")
    from _results import add_record_argument, record

    add_record_argument(parser)
    args = parser.parse_args()
    rows = []
    line = size_line(args)
    print(f"{cpu_model()}; torch {torch.__version__}; "
          f"{line if args.model == 'tiny-gpt' else line.replace('TinyGPT', 'Hugging Face GPT-2 (Conv1D)')}")
    for world in (int(w) for w in args.worlds.split(",")):
        r = run_world(_worker, world, args)
        ms, predicted = r["median_ms"], r["predicted_ms"]
        print(f"world {world}: fused {ms['fused']:.1f} ms, plain {ms['plain']:.1f} ms, ratio fused / plain "
              f"{r['ratio']:.3f} (predicted {predicted['fused']:.1f} / {predicted['plain']:.1f} ms = "
              f"{predicted['fused'] / predicted['plain']:.3f}); {r['gathers']} gathers and {r['scatters']} "
              f"scatters in rings; losses differ by {r['loss_difference']:.1e}")
        rows.append({"model": args.model, "size": f"hidden {args.hidden}, seq {args.seq}, batch {args.batch}",
                     "world": world, "fused ms": ms["fused"], "plain ms": ms["plain"], "fused / plain": r["ratio"],
                     "predicted": predicted["fused"] / predicted["plain"],
                     "rings": f"{r['gathers']} gathers, {r['scatters']} scatters",
                     "losses differ by": r["loss_difference"]})
    if args.record:
        import os

        # A run of one model and size replaces only its rows: the table keeps both models' latest.
        record("collective_matmul", rows, {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, Gloo",
            "formats": {"fused ms": ".1f", "plain ms": ".1f", "fused / plain": ".3f", "predicted": ".3f",
                        "losses differ by": ".1e"},
            "notes": "predicted: the cost model's fused / plain for the same placements."},
            key=("model", "size", "world"))


if __name__ == "__main__":
    main()
