"""shardwise.materialize: each rank builds only its own shards, from a model with weights or
from a meta-device model and a loader that never produces a full-size tensor."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import shardwise
from shardwise.materialize import local_index, local_tensor

transformers = pytest.importorskip("transformers")


def test_shards_of_every_rank_rebuild_the_tensor_once_per_replica():
    x = torch.arange(8 * 12, dtype=torch.float32).reshape(8, 12)
    counts = torch.zeros_like(x)
    for rank in range(8):
        # mesh (2, 4): rows split on the outer axis, columns strided in 3 groups on the inner
        index = local_index(x.shape, ["S(0)", "S(1,g3)"], [2, 4], rank)
        piece = local_tensor(x, ["S(0)", "S(1,g3)"], [2, 4], rank)
        assert piece.shape == (4, 3)
        rows = torch.arange(8)[index[0]]
        cols = index[1] if isinstance(index[1], torch.Tensor) else torch.arange(12)[index[1]]
        assert torch.equal(piece, x[rows][:, cols])
        counts[rows.unsqueeze(1), cols.unsqueeze(0)] += 1
    assert torch.equal(counts, torch.ones_like(x))
    # Replicated on one axis: every element on that axis' 2 ranks.
    assert sum(local_tensor(x, ["R", "S(0)"], [2, 4], r).numel() for r in range(8)) == 2 * x.numel()
    with pytest.raises(shardwise.ValidationError, match="Partial"):
        local_index(x.shape, ["P(sum)"], [2], 0)
    with pytest.raises(shardwise.ValidationError, match="S\\(1\\)"):
        local_index((8, 10), ["S(1)"], [4], 0)


def test_materialize_a_real_model_by_placements():
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6))
    plan = SimpleNamespace(sharding={"mesh": [1, 2], "placements": {
        "0.weight": ["R", "S(0)"], "0.bias": ["R", "S(0)"], "2.weight": ["R", "S(1)"], "2.bias": ["R", "R"]}})
    for rank in range(2):
        shards = shardwise.materialize(model, plan, rank)
        assert torch.equal(shards["0.weight"], model[0].weight.detach()[4 * rank:4 * rank + 4])
        assert torch.equal(shards["2.weight"], model[2].weight.detach()[:, 4 * rank:4 * rank + 4])
        assert torch.equal(shards["2.bias"], model[2].bias.detach())
    with pytest.raises(shardwise.ValidationError, match="rank 2 outside"):
        shardwise.materialize(model, plan, 2)


def _small_memory_a100(gib: float) -> shardwise.Cluster:
    doc = json.loads(shardwise.Cluster.preset("dgx-a100").to_json())
    for device in doc["device_types"]:
        device["memory_bytes"] = int(gib * 2**30)
    return shardwise.Cluster.from_json(json.dumps(doc))


def test_meta_model_and_a_loader_give_each_rank_its_heads_of_the_fused_qkv():
    # GPT-2 with hidden 2048 (16 heads of 128) on 1 x 8 A100s of 2 GiB: c_attn is S(1,g3).
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=2048, n_head=16, n_positions=512, use_cache=False))
    ids = torch.randint(0, 50257, (2, 512), device="meta")
    plan = shardwise.plan(shardwise.capture(model, {"input_ids": ids, "labels": ids}), _small_memory_a100(2),
                          global_batch=2, mesh=(1, 8))
    assert plan.placements()["transformer.h.0.attn.c_attn.weight"] == ["R", "S(1,g3)"]

    def loader(name, index):
        # Builds only the requested elements: value = row * 1e5 + column (2-D) or the index.
        shape = dict(model.named_parameters())[name].shape
        picks = [torch.arange(n)[sel] if isinstance(sel, slice) else sel for sel, n in zip(index, shape)]
        if len(picks) == 1:
            return picks[0].to(torch.float32)
        return (picks[0].unsqueeze(1) * 100000 + picks[1].unsqueeze(0)).to(torch.float64)

    for rank in (0, 5):
        shards = shardwise.materialize(model, plan, rank, loader=loader)
        qkv = shards["transformer.h.0.attn.c_attn.weight"]
        assert qkv.shape == (2048, 3 * 256)
        columns = qkv[0].long()
        heads = torch.arange(256 * rank, 256 * rank + 256)
        assert torch.equal(columns, torch.cat([heads, 2048 + heads, 4096 + heads]))
        # The tied 50257-word table, vocabulary-parallel and uneven: 6283 words on rank 0,
        # 6282 on the others, each rank its own consecutive rows.
        table = shards["transformer.wte.weight"]
        first = 0 if rank == 0 else 6283 + 6282 * (rank - 1)
        assert table.shape == (6283 if rank == 0 else 6282, 2048)
        assert torch.equal(table[:, 0].long(), torch.arange(first, first + table.shape[0]) * 100000)
        # Every other tensor: each rank's even share only.
        for name, tensor in shards.items():
            placed = plan.placements()[name]
            if name == "transformer.wte.weight":
                continue
            ways = 1
            for size, p in zip(plan.sharding["mesh"], placed):
                ways *= size if p.startswith("S(") else 1
            assert tensor.numel() * ways == dict(model.named_parameters())[name].numel(), name
    with pytest.raises(shardwise.ValidationError, match="meta device"):
        shardwise.materialize(model, plan, 0)
