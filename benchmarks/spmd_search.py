"""The SPMD search's two levels side by side: search time and predicted step time.

    python benchmarks/spmd_search.py [--record]

GPT-3 175B's block structure (96 layers, hidden 12288, 96 heads, sequence 2048, global
batch 1536) on 128 DGX A100 nodes with an 8-way tensor axis inside each node, then a
GPT-2 and a LLaMA-style decoder from `transformers` on one node of 2 GiB devices (where
data parallelism cannot hold the weights). For GPT-3 the Megatron-LM configuration of
that size (t=8, p=16, d=8, 1F1B, micro-batch 1) is priced by the same cost model next to
the search's pipeline-free plan: the search has no pipeline dimension yet (issue 5).
Prints; asserts nothing.
"""
from __future__ import annotations

import json
import platform

import torch

import shardwise


def _small_memory_a100(gib: float) -> shardwise.Cluster:
    doc = json.loads(shardwise.Cluster.preset("dgx-a100").to_json())
    for device in doc["device_types"]:
        device["memory_bytes"] = int(gib * 2**30)
    return shardwise.Cluster.from_json(json.dumps(doc))


def _row(name: str, fast, thorough, rows: list) -> None:
    rows.append([name, fast.search_seconds(), thorough.search_seconds(), fast.predicted_step_time() * 1e3,
                 thorough.predicted_step_time() * 1e3, fast.predicted_step_time() / thorough.predicted_step_time(),
                 str(fast.sharding["mesh"])])
    print(f"{name:34s} {fast.search_seconds():8.2f} {thorough.search_seconds():10.2f} "
          f"{fast.predicted_step_time() * 1e3:12.2f} {thorough.predicted_step_time() * 1e3:12.2f} "
          f"{fast.predicted_step_time() / thorough.predicted_step_time():10.4f}  {fast.sharding['mesh']}")


def main() -> None:
    import argparse

    from _results import add_record_argument, record

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_record_argument(parser)
    args = parser.parse_args()
    rows: list = []
    print(f"machine: {platform.machine()}, torch {torch.__version__}")
    print(f"{'model':34s} {'fast s':>8s} {'thorough s':>10s} {'fast ms':>12s} {'thorough ms':>12s} "
          f"{'fast/thor':>10s}  mesh")

    gpt3 = shardwise.models.gpt(layers=96, hidden=12288, heads=96, seq=2048, vocab=50304, batch=2)
    cluster = shardwise.Cluster.preset("dgx-a100", nodes=128)
    fast = shardwise.plan(gpt3, cluster, global_batch=1536, mesh=(128, 8))
    thorough = shardwise.plan(gpt3, cluster, global_batch=1536, mesh=(128, 8), level="thorough")
    _row("GPT-3 175B, 128 x 8 A100", fast, thorough, rows)
    megatron = shardwise.Plan.manual(gpt3, cluster, tensor=8, pipeline=16, data=8, global_batch=1536,
                                     micro_batch=1)
    # Same op and collective costs, two evaluators (Plan.manual's cost/plan_cost.h, the
    # search's own); their TFLOP/s count different FLOPs, so only step times are shown.
    megatron_line = (f"Megatron t=8 p=16 d=8, 1F1B, micro-batch 1: {megatron.predicted_step_time():.2f} s/step; "
                     f"search, no pipeline: {thorough.predicted_step_time():.2f} s/step "
                     f"(ratio {thorough.predicted_step_time() / megatron.predicted_step_time():.3f})")
    print(f"  {megatron_line}")

    import transformers

    ids = torch.randint(0, 32000, (2, 512), device="meta")
    with torch.device("meta"):
        gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=2048, n_head=16, n_positions=512, use_cache=False))
        llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_hidden_layers=2, hidden_size=2048, num_attention_heads=16, num_key_value_heads=8,
            intermediate_size=5504, vocab_size=32000, max_position_embeddings=512, use_cache=False))
    small = _small_memory_a100(2)
    for name, model in [("transformers GPT-2 2L h2048, 2 GiB", gpt2), ("transformers LLaMA 2L h2048, 2 GiB", llama)]:
        graph = shardwise.capture(model, {"input_ids": ids, "labels": ids})
        fast = shardwise.plan(graph, small, global_batch=2, mesh=(1, 8))
        thorough = shardwise.plan(graph, small, global_batch=2, mesh=(1, 8), level="thorough")
        _row(name, fast, thorough, rows)
    if args.record:
        record("spmd_search", rows, {
            "columns": ["model", "fast s", "thorough s", "fast ms", "thorough ms", "fast/thor", "mesh"],
            "formats": {"fast s": ".2f", "thorough s": ".2f", "fast ms": ".2f", "thorough ms": ".2f",
                        "fast/thor": ".4f"},
            "notes": f"GPT-3 175B: {megatron_line}."})


if __name__ == "__main__":
    main()
