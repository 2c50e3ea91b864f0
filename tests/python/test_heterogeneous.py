"""Heterogeneous clusters (issue 25): uneven batch shares on captured transformers models,
from the op rules alone, priced as the run holds them.

The Gloo runs of uneven shares against one device are in test_parallelize.py
(test_uneven_batch_shares_*); these are the planner's side, at the sizes the issue names."""
from __future__ import annotations

import json

import pytest
import torch

import shardwise

transformers = pytest.importorskip("transformers")

MIXED = "mixed-a100-v100"  # 4 A100s + 4 V100s on PCIe


def _captured(model_class, config) -> shardwise.Graph:
    """The model captured on the meta device at batch 2 (the search scales it to the global batch)."""
    with torch.device("meta"):
        model = model_class(config)
    ids = torch.randint(0, config.vocab_size, (2, 1024), device="meta")
    return shardwise.capture(model, {"input_ids": ids, "labels": ids})


def _plan(graph) -> tuple[dict, dict]:
    plan = shardwise.plan(graph, shardwise.Cluster.preset(MIXED), global_batch=64, mesh=(8, 1), precision="bf16")
    return json.loads(plan.to_json()), plan.balance()


def _shares_start_at_the_inputs(doc: dict, balance: dict) -> None:
    placements = doc["sharding"]["placements"]
    assert balance is not None and balance["axis"] == 0
    ratios = balance["ratios"]
    assert min(ratios[:4]) > max(ratios[4:]), ratios  # the A100s take more rows than the V100s
    for name in ("input_ids", "labels"):
        placement = placements[name][0]
        assert placement.startswith("S(0)["), (name, placement)
        assert [float(r) for r in placement[5:-1].split(",")] == pytest.approx(ratios), (name, placement)
    # No activation crosses ranks by all-to-all: uneven blocks would be gathered whole and cut
    # again (resharding.h), which an even-block price would miss.
    kinds = {c["kind"] for c in doc["predicted"]["collectives"] if c["phase"] != "step"}
    assert "all_to_all" not in kinds, doc["predicted"]["collectives"]
    assert balance["step_time"] * 1.3 < balance["even_step_time"], balance


def test_transformers_gpt2_takes_uneven_shares_as_the_builtin_graph_does():
    captured = _captured(transformers.GPT2LMHeadModel, transformers.GPT2Config(
        n_layer=4, n_embd=1024, n_head=16, n_positions=1024, vocab_size=50304))
    builtin = shardwise.models.gpt(layers=4, hidden=1024, heads=16, seq=1024, vocab=50304, batch=2)
    doc, balance = _plan(captured)
    _shares_start_at_the_inputs(doc, balance)
    builtin_doc, builtin_balance = _plan(builtin)
    _shares_start_at_the_inputs(builtin_doc, builtin_balance)
    step, builtin_step = doc["predicted"]["step_time"], builtin_doc["predicted"]["step_time"]
    print(f"GPT-2 on {MIXED}: captured {step * 1e3:.1f} ms, built-in {builtin_step * 1e3:.1f} ms, "
          f"shares {[round(r, 3) for r in balance['ratios']]}")
    assert abs(step - builtin_step) <= 0.1 * builtin_step, (step, builtin_step)


def test_transformers_llama_takes_uneven_shares():
    captured = _captured(transformers.LlamaForCausalLM, transformers.LlamaConfig(
        num_hidden_layers=4, hidden_size=1024, intermediate_size=2816, num_attention_heads=16,
        num_key_value_heads=16, vocab_size=32000, max_position_embeddings=1024))
    doc, balance = _plan(captured)
    _shares_start_at_the_inputs(doc, balance)
    # The integer split is within one sample of the balance LP's optimum.
    assert balance["step_time"] <= balance["lp_step_time"] * 1.1, balance
