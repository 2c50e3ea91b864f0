"""Non-finite constants cross from Python to the core exactly (issue 45).

A model's -inf mask fill (DeepSeek-V3's attention and router, any causal mask written with
``float("-inf")``), a nan or inf argument: Python's json writes "-Infinity", which the core's
JSON reader refused ("ParseError invalid JSON ... last read: '-I'"), so such models did not
capture at all. The capture now writes them as the core's graph JSON holds them
({"float": "-inf"}, csrc/ir/json.h); the graph's attributes come back as the same floats, the
IR text and the plan JSON round-trip them, and DeepSeek-V3 trains equal to one device."""
from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import shardwise
from conftest import spawn_scenario

transformers = pytest.importorskip("transformers")


class Masked(nn.Module):
    """Scores masked with -inf above the diagonal, clamped to [-inf, inf], a nan filled where
    the mask says (then replaced): every non-finite float a capture meets as an argument."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        scores = self.fc(x) @ x.transpose(-1, -2)
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf")).clamp(float("-inf"), float("inf"))
        probs = scores.softmax(-1).masked_fill(mask, float("nan")).nan_to_num(0.0)
        return probs.sum()


def test_non_finite_arguments_cross_into_the_graph_exactly():
    graph = shardwise.capture(Masked(), (torch.randn(2, 4, 8),))
    values = [v for n in graph.nodes() for k, v in n["attrs"].items() if isinstance(v, float) and not math.isfinite(v)]
    assert any(v == float("-inf") for v in values), graph.nodes()
    assert any(math.isnan(v) for v in values), graph.nodes()
    # The graph's own JSON and text forms round-trip them.
    again = shardwise.Graph.from_json(graph.to_json())
    assert again.to_json() == graph.to_json()
    assert "-inf" in str(graph)


def test_a_plan_with_non_finite_figures_round_trips():
    doc = json.loads(shardwise.Plan.manual(shardwise.capture(Masked(), (torch.randn(2, 4, 8),)),
                                           shardwise.Cluster.preset("cpu", 2), global_batch=2).to_json())
    doc["predicted"]["step_time"] = {"float": "inf"}
    doc["predicted"]["breakdown"]["compute"] = {"float": "-inf"}
    plan = shardwise.Plan.from_json(json.dumps(doc))
    assert plan.predicted_step_time() == float("inf")
    assert plan.breakdown()["compute"] == float("-inf")
    assert shardwise.Plan.from_json(plan.to_json()) == plan
    # A nan is refused, naming where: no price is nan, and a plan holding one is not equal to
    # itself after a round trip.
    doc["predicted"]["breakdown"]["compute"] = {"float": "nan"}
    with pytest.raises(shardwise.ParseError, match=r"breakdown\['compute'\]: nan"):
        shardwise.Plan.from_json(json.dumps(doc))


# ---- DeepSeek-V3 on two Gloo ranks ----------------------------------------------------------
def _deepseek_v3():
    torch.manual_seed(0)
    cfg = transformers.DeepseekV3Config(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                        moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=4,
                                        n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                                        first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
                                        qk_nope_head_dim=8, v_head_dim=8, vocab_size=64, max_position_embeddings=32,
                                        use_cache=False)
    cfg._experts_implementation = "batched_mm"  # torch's grouped matmul has no float64 kernel
    return transformers.DeepseekV3ForCausalLM(cfg).double().train()


def next_token_loss(out, labels):
    """A float64 cross entropy (transformers' own casts the logits to float32, whose rounding
    would hide a 1e-9 comparison)."""
    return F.cross_entropy(out.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())


def _scenario_deepseek(rank, world, mesh):
    """One SGD step, then two AdamW steps, against the same on one process: the errors of the
    loss and of every tensor of the state after the first step and after the last."""
    model = _deepseek_v3()
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (4, 8), generator=g)
    engine = shardwise.parallelize(model, {"input_ids": ids, "target": ids}, loss_fn=next_token_loss,
                                   mesh=tuple(mesh), cluster=shardwise.Cluster.preset("cpu", world))

    def errors():
        full = engine.full_state_dict()
        return {n: (full[n] - t).abs().max().item() / max(t.abs().max().item(), 1e-30)
                for n, t in reference.state_dict().items() if t.is_floating_point()}

    out = {"loss_errors": []}
    for step, (opt, ref_opt) in enumerate(
            [(engine.optimizer(torch.optim.SGD, lr=0.1), torch.optim.SGD(reference.parameters(), lr=0.1))] +
            [(engine.optimizer(torch.optim.AdamW, lr=1e-2), torch.optim.AdamW(reference.parameters(), lr=1e-2))] * 2):
        loss = float(engine.train_step(input_ids=ids, target=ids))
        opt.step()
        opt.zero_grad()
        ref = next_token_loss(reference(input_ids=ids), ids)
        ref.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        out["loss_errors"].append(abs(loss - float(ref)) / float(ref))
        if step == 0:
            out["first"] = errors()
    out["last"] = errors()
    return out


def _spawn(world, name, *args):
    return spawn_scenario(__name__, world, name, *args)


@pytest.mark.parametrize("mesh", [(2, 1), (1, 2)])
def test_deepseek_v3_trains_equal_to_one_device(mesh):
    # Before: capture failed with "ParseError invalid JSON ... last read: '-I'" (its -inf mask).
    r = _spawn(2, "deepseek", list(mesh))
    # Its router computes in float32 (``hidden_states.type(torch.float32)`` against the gate
    # weight cast alike), so the gate's gradient carries float32 rounding that depends on how
    # the batch's tokens are summed: one device's number only to float32's precision. Every
    # other tensor, computed in float64, equals one device's to 1e-9 after a step; from the
    # second step on the routing carries the gate's rounding everywhere (float32's 1e-6).
    assert r["loss_errors"][0] < 1e-9, r["loss_errors"]
    router = {n for n in r["first"] if n.endswith("mlp.gate.weight")}
    assert router, sorted(r["first"])
    assert {n: e for n, e in r["first"].items() if n not in router and e > 1e-9} == {}, r["first"]
    assert max(r["first"][n] for n in router) < 1e-6, r["first"]
    assert max(r["loss_errors"]) < 1e-6 and max(r["last"].values()) < 1e-6, r
