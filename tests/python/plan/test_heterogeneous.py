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


def _fast_and_half(nodes_each: int = 1) -> shardwise.Cluster:
    """DGX A100 nodes, the later half of them at half speed (a throttled fleet, declared as
    the A100's profile at 0.5: Cluster JSON's "like" and "speed")."""
    doc = json.loads(shardwise.Cluster.preset("dgx-a100", 2 * nodes_each).to_json())
    doc["device_types"].append({"name": "a100-half", "like": "a100-sxm4-80gb", "speed": 0.5})
    for n in range(nodes_each, 2 * nodes_each):
        doc["nodes"][n] = {"device": "a100-half", "count": 8}
    return shardwise.Cluster.from_json(json.dumps(doc))


def test_pipeline_stages_are_sized_to_their_devices(tmp_path):
    graph = shardwise.models.gpt(layers=24, hidden=2048, heads=16, seq=2048, vocab=50304, batch=2)
    cluster = _fast_and_half()
    plan = shardwise.plan(graph, cluster, global_batch=64, pipeline=True)
    predicted = json.loads(plan.to_json())["predicted"]
    devices, times = predicted["stage_devices"], predicted["stage_times"]
    assert len(devices) == plan.pipeline > 1, predicted
    assert set(devices) == {"a100-sxm4-80gb", "a100-half"}, devices  # in the order the planner chose
    per_device = [0] * plan.pipeline
    for chunk, n in enumerate(plan.layers_per_stage):
        per_device[chunk % plan.pipeline if plan.schedule not in ("zb-v", "dualpipe-v") else
                   (chunk if chunk < plan.pipeline else 2 * plan.pipeline - 1 - chunk)] += n
    fast = [n for n, d in zip(per_device, devices) if d == "a100-sxm4-80gb"]
    slow = [n for n, d in zip(per_device, devices) if d == "a100-half"]
    assert min(fast) > max(slow), (per_device, devices)
    # Balanced by time: no stage more than 1.5x another (equal layers would be 2x).
    assert max(times) < 1.5 * min(times), times
    # The same degrees with equal stages, priced on the same cluster: slower by the slow half.
    equal = shardwise.Plan.manual(graph, cluster, tensor=plan.tensor, pipeline=plan.pipeline, data=plan.data,
                                  context=plan.context,
                                  global_batch=64, micro_batch=plan.micro_batch, schedule=plan.schedule,
                                  virtual_stages=plan.virtual_stages, recompute=plan.recompute,
                                  zero=plan.zero_stage, stage_groups=getattr(plan, "stage_groups", None))
    print(f"8 + 8 half-speed A100s: {plan.schedule} p{plan.pipeline} d{plan.data} t{plan.tensor}, layers "
          f"{per_device} on {devices}: {plan.predicted_step_time() * 1e3:.0f} ms; equal stages "
          f"{equal.predicted_step_time() * 1e3:.0f} ms")
    assert equal.predicted_step_time() > 1.3 * plan.predicted_step_time()
    # The timeline names each stage's device, and its rows take their own times.
    svg = plan.timeline_svg(tmp_path / "plan.svg")
    assert f"rank 0 {devices[0]}" in svg and f"rank {plan.pipeline - 1} {devices[-1]}" in svg
    assert f"rank {plan.pipeline - 1} ({devices[-1]})" in plan.chrome_trace(tmp_path / "plan.json")
    busy = plan.simulation().busy  # seconds each rank computes: alike, as the stages are balanced
    assert max(busy) < 1.5 * min(busy), busy


def test_a_mixed_fleet_plans_with_what_is_faster():
    # shardwise.plan's default on a mixed cluster of several nodes: the faster of uneven batch
    # shares (the SPMD search) and stages sized to their devices (the joint planner).
    graph = shardwise.models.gpt(layers=24, hidden=2048, heads=16, seq=2048, vocab=50304, batch=2)
    cluster = _fast_and_half()
    chosen = shardwise.plan(graph, cluster, global_batch=64)
    shares = shardwise.plan(graph, cluster, global_batch=64, pipeline=False)
    stages = shardwise.plan(graph, cluster, global_batch=64, pipeline=True)
    assert chosen.predicted_step_time() == min(shares.predicted_step_time(), stages.predicted_step_time())


def test_bert_and_a_cnn_take_uneven_shares_from_their_inputs():
    import torch.nn as nn
    import torch.nn.functional as F

    cluster = shardwise.Cluster.preset(MIXED)

    def planned(graph, global_batch: int, inputs: tuple[str, ...]) -> dict:
        plan = shardwise.plan(graph, cluster, global_batch=global_batch, mesh=(8, 1), precision="bf16")
        balance = plan.balance()
        placements = json.loads(plan.to_json())["sharding"]["placements"]
        for name in inputs:
            assert placements[name][0].startswith("S(0)["), (name, placements[name])
        assert balance["step_time"] * 1.3 < balance["even_step_time"], balance
        return balance

    with torch.device("meta"):
        bert = transformers.BertForMaskedLM(transformers.BertConfig(
            num_hidden_layers=4, hidden_size=1024, num_attention_heads=16, intermediate_size=4096))
    ids = torch.randint(0, 30522, (2, 512), device="meta")
    planned(shardwise.capture(bert, {"input_ids": ids, "labels": ids}), 64, ("input_ids", "labels"))

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64)
            self.c2, self.b2 = nn.Conv2d(64, 128, 3, padding=1, stride=2), nn.BatchNorm2d(128)
            self.fc = nn.Linear(128, 10)

        def forward(self, x, y):
            h = F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))))
            return F.cross_entropy(self.fc(h.mean((2, 3))), y)

    graph = shardwise.capture(CNN(), (torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))))
    planned(graph, 256, ("x", "y"))
