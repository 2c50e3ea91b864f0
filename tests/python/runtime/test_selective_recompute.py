"""Selective recomputation runs as the plan prices it: each repeated block is a checkpointed
region whose products (a linear's mm / addmm) and fused attention keep their outputs from the
forward, while the cheap ops (norms, activations, residual adds, dropout) run again in
backward (csrc/analysis/selective_recompute.h, runtime/recompute.py). Training equals one
device in float64.

transformers GPT-2 (dropout on where the plan is data parallel) and LLaMA (grouped-query
attention), on Gloo ranks: data 2, tensor 2, pipeline 2 (1F1B) and data 2 x tensor 2 (the
tensor plans searched with too little memory for whole weights: split on the tensor axis), each
with and without selective recomputation, against one device over 2 AdamW steps (losses and
parameters within 1e-9). Counting the ops each step runs shows what was run again: the
products as often as without recomputation, the elementwise multiplies more often.
"""
from __future__ import annotations

import collections
import json

import pytest
import torch
import torch.distributed as dist

import shardwise
from conftest import parameter_error, spawn_scenario, tight_plan, train_engine_counting_ops, train_one_device
from shardwise.models import CausalLMWithLoss

transformers = pytest.importorskip("transformers")

STEPS, EXACT, ROWS, SEQ, VOCAB = 2, 1e-9, 4, 16, 96
PRODUCTS = ("aten.mm", "aten.addmm")


def _gpt2(dropout: float):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32,
                                  resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    return CausalLMWithLoss(transformers.GPT2LMHeadModel(cfg)).double().train()


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=3, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=32, use_cache=False)
    return CausalLMWithLoss(transformers.LlamaForCausalLM(cfg)).double().train()


def _batch(step: int):
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=g)
    return ids, ids.clone()


def _engine(model_of, layout: str, world: int, recompute: str):
    cluster = shardwise.Cluster.preset("cpu", world)
    if layout == "pipeline":
        graph = shardwise.capture(model_of(), tuple(t[:ROWS // 2] for t in _batch(0)))  # one micro-batch
        plan = shardwise.Plan.manual(graph, cluster, pipeline=world, data=1, tensor=1, global_batch=ROWS,
                                     micro_batch=ROWS // 2, schedule="1f1b", recompute=recompute)
        return shardwise.parallelize(model_of(), _batch(0), plan=plan)
    if layout == "data":
        searched = shardwise.parallelize(model_of(), _batch(0), mesh=(world, 1), cluster=cluster, verify=False).plan
    else:  # memory that holds the model only with its weights split on the tensor axis
        searched = tight_plan(shardwise.capture(model_of(), _batch(0)), world, ROWS, (1, 2) if world == 2 else (2, 2))
    doc = json.loads(searched.to_json())
    for key in ("predicted", "programs"):
        doc.pop(key, None)
    doc["sharding"]["recompute"] = recompute if recompute == "selective" else recompute == "full"
    return shardwise.parallelize(model_of(), _batch(0), plan=shardwise.Plan.from_json(json.dumps(doc)))


def _scenario_selective(rank: int, world: int, model_name: str, layout: str) -> dict:
    dropout = 0.1 if layout == "data" else 0.0
    model_of = _llama if model_name == "llama" else (lambda: _gpt2(dropout))
    out = {}
    for recompute in ("none", "selective"):
        engine = _engine(model_of, layout, world, recompute)
        torch.manual_seed(5)  # the dropout masks' generator state, the same for every run
        losses, counts = train_engine_counting_ops(engine, _batch, STEPS)
        rank_ir = engine.rank_ir if hasattr(engine, "rank_ir") else ""
        plan = json.loads(engine.plan.to_json())
        placements = (plan.get("sharding") or {}).get("placements", {})
        split_on_tensor = sum(1 for name, p in placements.items() if name.endswith("weight") and p[-1] != "R")
        out[recompute] = {"losses": losses, "state": engine.full_state_dict(),
                          "counts": dict(counts), "keeps": rank_ir.count("shardwise.recompute_keeps=true")}
    reference = model_of()
    torch.manual_seed(5)
    ref_losses = train_one_device(reference, _batch, STEPS, torch.optim.AdamW(reference.parameters(), lr=1e-2))
    every = [None] * world
    dist.all_gather_object(every, {k: v["counts"] for k, v in out.items()})
    return {"ref_losses": ref_losses, "counts": every, "split_on_tensor": split_on_tensor,
            **{k: {"losses": v["losses"], "keeps": v["keeps"],
                   "error": parameter_error({n: t.double() for n, t in v["state"].items()}, reference)}
               for k, v in out.items()}}


@pytest.mark.parametrize("model_name", ["gpt2", "llama"])
@pytest.mark.parametrize("layout,world", [("data", 2), ("tensor", 2), ("pipeline", 2), ("2x2", 4)])
def test_selective_recomputation_keeps_the_products_runs_the_rest_again_and_equals_one_device(model_name, layout,
                                                                                             world):
    r = spawn_scenario(__name__, world, "selective", model_name, layout)
    for recompute in ("none", "selective"):
        run = r[recompute]
        for a, b in zip(run["losses"], r["ref_losses"]):
            assert abs(a - b) <= EXACT * abs(b), (recompute, run["losses"], r["ref_losses"])
        assert run["error"] < EXACT, (recompute, run["error"])
    if layout != "pipeline":  # the SPMD rank IR marks the kept nodes
        assert r["selective"]["keeps"] > 0 and r["none"]["keeps"] == 0, (r["selective"]["keeps"], r["none"]["keeps"])
        assert layout == "data" or r["split_on_tensor"] > 0  # tensor parallelism, not only the batch
    for rank, counts in enumerate(r["counts"]):
        none, selective = collections.Counter(counts["none"]), collections.Counter(counts["selective"])
        products = sum(none[op] for op in PRODUCTS)
        print(f"rank {rank}: products {products} / {sum(selective[op] for op in PRODUCTS)}, "
              f"mul {none['aten.mul']} / {selective['aten.mul']}")
        assert products > 0
        assert sum(selective[op] for op in PRODUCTS) == products, (rank, none, selective)  # kept: run once
        assert selective["aten.mul"] > none["aten.mul"], (rank, none["aten.mul"], selective["aten.mul"])  # run again


def test_plans_name_selective_recomputation_and_refuse_an_unknown_one():
    graph = shardwise.capture(_llama(), _batch(0))
    cluster = shardwise.Cluster.preset("cpu", 2)
    searched = shardwise.plan(graph, cluster, global_batch=ROWS, mesh=(2, 1), recompute="selective")
    assert searched.sharding["recompute"] == "selective"
    assert [c["recompute"] for c in searched.candidates()] == ["selective"]
    assert "selective" in searched.report()
    every = shardwise.plan(graph, cluster, global_batch=ROWS, mesh=(2, 1))
    assert [c["recompute"] for c in every.candidates()] == ["none", "selective", "full"]
    by_kind = {c["recompute"]: c for c in every.candidates()}
    assert by_kind["none"]["memory_per_rank"] > by_kind["selective"]["memory_per_rank"] > \
        by_kind["full"]["memory_per_rank"]
    assert by_kind["none"]["step_time"] < by_kind["selective"]["step_time"] < by_kind["full"]["step_time"]

    manual = {r: shardwise.Plan.manual(graph, cluster, pipeline=2, data=1, global_batch=ROWS, micro_batch=ROWS // 2,
                                       recompute=r) for r in ("none", "selective", "full")}
    assert json.loads(manual["selective"].to_json())["recompute"] == "selective"
    assert manual["none"].predicted_memory()[0] > manual["selective"].predicted_memory()[0] > \
        manual["full"].predicted_memory()[0]
    with pytest.raises(shardwise.ValidationError, match="plan.recompute: unknown value 'some'"):
        shardwise.Plan.manual(graph, cluster, pipeline=2, data=1, global_batch=ROWS, micro_batch=ROWS // 2,
                              recompute="some")
    with pytest.raises(shardwise.ValidationError, match="plan.recompute: unknown value 'some'"):
        shardwise.plan(graph, cluster, global_batch=ROWS, mesh=(2, 1), recompute="some")
    with pytest.raises(shardwise.ValidationError, match="zb-h1 with recomputation"):
        shardwise.Plan.manual(graph, cluster, pipeline=2, data=1, global_batch=ROWS, micro_batch=ROWS // 2,
                              schedule="zb-h1", recompute="selective")
