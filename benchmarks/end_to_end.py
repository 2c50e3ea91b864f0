"""End to end: capture + plan + rewrite time for `transformers` GPT-2 and LLaMA models of
growing size, each phase timed on its own.

    PYTHONPATH=python python benchmarks/end_to_end.py [--record]

Models, built on the meta device (no weights allocated): GPT-2 124M, 355M, 774M and 1.5B
(GPT2LMHeadModel, seq 1024), and LLaMA-2 shapes (LlamaForCausalLM, seq 2048, vocab 32000):
2 layers at widths 1024, 2048 and 4096, then the whole Llama-2-7B (32 x 4096).
Phases:
  capture  `shardwise.capture(model, {"input_ids", "labels"})` (torch.export) at the global
           batch (8), as `shardwise.parallelize` captures it;
  plan     `shardwise.plan(graph, Cluster.preset("dgx-a100"), global_batch=8)` (one node of 8
           A100s: the SPMD sharding search), level fast; thorough timed too;
  rewrite  `shardwise._C.rank_program(graph._core, plan.to_json(), 0)`: the core's per-rank
           program for rank 0 (local shapes, collectives, what each node reads) of the fast
           plan, which `parallelize` then lowers into a torch.fx GraphModule. The lowering
           needs the model's real tensors, so it is not timed here. First call, then the
           median of three more.
A 1-layer GPT-2 is captured first, untimed in the table, so torch.export's one-time start-up
does not land on the first row. Prints wall and CPU seconds (the box is shared: CPU is the
fairer figure) and the machine. Asserts nothing about timing.
"""
from __future__ import annotations

import os
import statistics
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _machine import Timer, machine_line  # noqa: E402

import shardwise  # noqa: E402

BATCH = 8

GPT2 = [  # name, layers, hidden, heads
    ("GPT-2 124M", 12, 768, 12),
    ("GPT-2 355M", 24, 1024, 16),
    ("GPT-2 774M", 36, 1280, 20),
    ("GPT-2 1.5B", 48, 1600, 25),
]
LLAMA = [  # name, layers, hidden, heads, intermediate
    ("LLaMA 2L h1024", 2, 1024, 8, 2816),
    ("LLaMA 2L h2048", 2, 2048, 16, 5504),
    ("LLaMA 2L h4096", 2, 4096, 32, 11008),
    ("Llama-2-7B 32L", 32, 4096, 32, 11008),
]


def models():
    import torch
    import transformers

    for name, layers, hidden, heads in GPT2:
        cfg = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=1024, use_cache=False)
        with torch.device("meta"):
            model = transformers.GPT2LMHeadModel(cfg)
        yield name, model, torch.randint(0, cfg.vocab_size, (BATCH, 1024), device="meta")
    for name, layers, hidden, heads, inter in LLAMA:
        cfg = transformers.LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                       num_key_value_heads=heads, intermediate_size=inter, vocab_size=32000,
                                       max_position_embeddings=2048, use_cache=False)
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(cfg)
        yield name, model, torch.randint(0, cfg.vocab_size, (BATCH, 2048), device="meta")


def main() -> None:
    import argparse

    from _results import add_record_argument, record

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_record_argument(parser)
    args = parser.parse_args()
    recorded = []
    warnings.filterwarnings("ignore")
    print(machine_line())
    cluster = shardwise.Cluster.preset("dgx-a100")
    print(f"cluster: dgx-a100, 1 node, {cluster.world_size} GPUs; global batch {BATCH}; seconds wall (CPU)")
    print(f"{'model':<16} {'params':>7} {'nodes':>6} {'capture s':>15} {'plan fast s':>15} {'mesh':>7} {'fits':>4} "
          f"{'rewrite s':>15} {'rewrite med':>11} {'local/whole':>11} {'total s':>8} {'plan thorough s':>16}")
    rows = []
    with Timer() as whole:
        import torch
        import transformers

        with torch.device("meta"):  # torch.export's one-time start-up, kept out of the first row
            tiny = transformers.GPT2LMHeadModel(
                transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2, use_cache=False))
        tiny_ids = torch.randint(0, 100, (BATCH, 16), device="meta")
        with Timer() as warm:
            shardwise.capture(tiny, {"input_ids": tiny_ids, "labels": tiny_ids})
        print(f"{'(warm-up)':<16} one-time start-up: capture of a 1-layer, 64-wide GPT-2: {warm.wall:.2f} s wall "
              f"({warm.cpu:.2f} CPU)")
        for name, model, ids in models():
            with Timer() as cap:
                graph = shardwise.capture(model, {"input_ids": ids, "labels": ids})
            with Timer() as fast:
                plan = shardwise.plan(graph, cluster, global_batch=BATCH, level="fast")
            with Timer() as rw:
                program = shardwise._C.rank_program(graph._core, plan.to_json(), 0)
            again = []
            for _ in range(3):
                with Timer() as t:
                    shardwise._C.rank_program(graph._core, plan.to_json(), 0)
                again.append(t.wall)
            with Timer() as thorough:
                shardwise.plan(graph, cluster, global_batch=BATCH, level="thorough")
            whole = len(program["whole"])  # the nodes run whole; the rest run on their blocks
            total = cap.wall + fast.wall + rw.wall
            rows.append((name, cap, fast, rw, total))
            mesh = "x".join(str(x) for x in plan.sharding["mesh"])
            print(f"{name:<16} {graph.num_parameters() / 1e9:>6.2f}B {graph.num_nodes():>6} "
                  f"{cap.wall:>7.2f} ({cap.cpu:>5.2f}) {fast.wall:>7.2f} ({fast.cpu:>5.2f}) {mesh:>7} "
                  f"{'yes' if plan.fits else 'NO':>4} {rw.wall:>7.3f} ({rw.cpu:>5.3f}) "
                  f"{statistics.median(again):>11.3f} {len(program['nodes']) - whole:>5}/{whole:<5} "
                  f"{total:>8.2f} {thorough.wall:>7.2f} ({thorough.cpu:>5.2f})", flush=True)
            recorded.append([name, graph.num_parameters() / 1e9, graph.num_nodes(), cap.wall, fast.wall, mesh,
                             bool(plan.fits), rw.wall, statistics.median(again),
                             f"{modes.count('local')}/{modes.count('whole')}", total, thorough.wall,
                             100 * cap.wall / total])
            del model, graph
    print()
    for name, cap, fast, rw, total in rows:
        print(f"{name:<16} capture {100 * cap.wall / total:4.1f}%  plan {100 * fast.wall / total:4.1f}%  "
              f"rewrite {100 * rw.wall / total:4.1f}% of {total:.2f} s")
    print(f"whole run: {whole.wall:.0f} s wall, {whole.cpu:.0f} s CPU; {machine_line()}")
    if args.record:
        record("end_to_end", recorded, {
            "columns": ["model", "params B", "nodes", "capture s", "plan fast s", "mesh", "fits", "rewrite s",
                        "rewrite median s", "local/whole", "total s", "plan thorough s", "capture %"],
            "formats": {"params B": ".2f", "capture s": ".2f", "plan fast s": ".2f", "rewrite s": ".3f",
                        "rewrite median s": ".3f", "total s": ".2f", "plan thorough s": ".2f", "capture %": ".1f"},
            "notes": f"Wall seconds; one DGX-A100 node (8 GPUs), global batch {BATCH}, meta-device models. total = "
                     f"capture + plan fast + rewrite. One-time start-up (a 1-layer GPT-2 captured first): "
                     f"{warm.wall:.2f} s. Whole run {whole.wall:.0f} s."})


if __name__ == "__main__":
    main()
