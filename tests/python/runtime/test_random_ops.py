"""Seeded random ops on shards draw what one device draws, decided by the core.

The core (csrc/ops/random_draws.h, transform/spmd_rewrite.h) decides how each seeded op runs
on a rank that holds a block of its operand: a dropout's mask and a *_like op's values are
drawn whole and cut (NodeRewrite.one_device_random, lowered as OneDeviceRandom); any other
seeded op (bernoulli here) runs whole. The runtime decides nothing of it.

- Its list of seeded ops is torch's: every op of the builtin table carries torch's
  ``nondeterministic_seeded`` tag exactly when the core lists it as drawing.
- An MLP with dropout, Gaussian noise (randn_like) and a Bernoulli mask on its hidden
  activations trains on 2 Gloo ranks (float64, the same seed) equal to one device, losses and
  parameters within 1e-9, with the activations split over their columns (fc1
  column-parallel), over their rows (the batch), or held as a Partial sum at the dropout (fc1
  row-parallel).
"""
from __future__ import annotations

import datetime
import json

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import shardwise
from shardwise import _C
from shardwise._fx_import import op_overload
from conftest import finish_rank, parameter_error, regression_batch, spawn_reports, tight_plan, train_one_device

ROWS, STEPS, SEED = 32, 3, 5


def _overloads(name: str) -> list:
    """The torch overloads an IR op name names: itself, or every overload of a bare name."""
    if "." in name.partition("::")[2]:
        op = op_overload(name)
        return [op] if op is not None else []
    packet = getattr(torch.ops.aten, name.partition("::")[2], None)
    return [getattr(packet, o) for o in packet.overloads()] if packet is not None else []


def test_the_cores_seeded_ops_are_torchs():
    mismatched = []
    for name in _C.builtin_op_names():
        overloads = _overloads(name)
        if not overloads:
            continue
        tagged = any(torch.Tag.nondeterministic_seeded in op.tags for op in overloads)
        if tagged != (_C.random_draw(name) != "none"):
            mismatched.append((name, tagged, _C.random_draw(name)))
    assert not mismatched, mismatched
    # And every op the core lists draws in this torch (where this torch has it).
    listed = [n for n in _C.seeded_ops() if _overloads(n)]
    assert len(listed) >= 20, listed
    for name in listed:
        assert any(torch.Tag.nondeterministic_seeded in op.tags for op in _overloads(name)), name
    assert _C.random_draw("aten::dropout") == "mask" and _C.random_draw("aten::randn_like") == "like"
    assert _C.random_draw("aten::bernoulli.p") == "other" and _C.random_draw("aten::relu") == "none"


class NoisyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 16)

    def forward(self, x, y):
        h = F.dropout(self.fc1(x), 0.25, self.training)
        h = h + 0.1 * torch.randn_like(h)
        h = h * torch.bernoulli(torch.full_like(h, 0.8))
        return (self.fc2(torch.tanh(h)) - y).pow(2).mean()


def _model():
    torch.manual_seed(0)
    return NoisyMLP().double()


def _batch(step: int):
    return regression_batch(step, ROWS)


# Each layout on the tensor axis of 2, by value: (placement, strategy); the rest replicated.
HIDDEN = ("dropout", "randn_like", "mul", "add", "full_like", "bernoulli", "mul_1", "tanh")
LAYOUTS = {
    # fc1 column-parallel: the hidden dim split, every random op on a block of its columns.
    "columns": {"fc1.weight": "S(0)", "fc1.bias": "S(0)", "fc2.weight": "S(1)", "linear": ("S(1)", "split n"),
                **{v: ("S(1)", "split _1" if v in ("randn_like", "full_like", "bernoulli") else "split d1")
                   for v in HIDDEN},
                "linear_1": ("P(sum)", "split k")},
    # The batch split (data parallelism on the axis): every random op on a block of rows.
    "rows": {"x": "S(0)", "y": "S(0)", "linear": ("S(0)", "split _0"),
             **{v: ("S(0)", "split _0" if v in ("randn_like", "full_like", "bernoulli") else "split d0")
                for v in HIDDEN},
             "linear_1": ("S(0)", "split _0"), "sub": ("S(0)", "split d0"), "pow_1": ("S(0)", "split d0"),
             "mean": ("P(mean)", "split r0")},
    # fc1 row-parallel: the dropout on a Partial sum (each summand scaled by the same mask).
    "partial": {"fc1.weight": "S(1)", "linear": ("P(sum)", "split k"), "dropout": ("P(sum)", "partial")},
}
# What each layout runs: the random ops drawn whole and cut, and whether bernoulli runs whole.
EXPECTED = {"columns": (2, True), "rows": (2, True), "partial": (1, False)}


def _layout_plan(graph, world: int, layout: str):
    """The search's plan with its sharding set to LAYOUTS[layout] (the layouts under test,
    whatever the search would pick for this tiny model)."""
    doc = json.loads(tight_plan(graph, world, ROWS, (1, world)).to_json())
    for key in ("predicted", "programs"):
        doc.pop(key, None)
    sharding = doc["sharding"]
    for value in sharding["placements"]:
        sharding["placements"][value] = ["R", "R"]
    for value in sharding["strategies"]:
        sharding["strategies"][value] = ["replicate", "replicate"]
    for value, entry in LAYOUTS[layout].items():
        placement, strategy = (entry, None) if isinstance(entry, str) else entry
        assert value in sharding["placements"], (value, sorted(sharding["placements"]))  # the capture's names
        sharding["placements"][value] = ["R", placement]
        if strategy is not None:
            sharding["strategies"][value] = ["replicate", strategy]
    return shardwise.Plan.from_json(json.dumps(doc))


def _worker(rank: int, world: int, store: str, result: str, layout: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        graph = shardwise.capture(_model(), _batch(0))
        engine = shardwise.parallelize(_model(), _batch(0), plan=_layout_plan(graph, world, layout))
        optimizer = engine.optimizer(torch.optim.SGD, lr=0.1)
        torch.manual_seed(SEED)  # the generator state every rank and the one device start from
        losses = []
        for step in range(STEPS):
            losses.append(float(engine.train_step(*_batch(step))))
            optimizer.step()
            optimizer.zero_grad()
        state = engine.full_state_dict()
        reference = _model()
        torch.manual_seed(SEED)
        ref_losses = train_one_device(reference, _batch, STEPS, torch.optim.SGD(reference.parameters(), lr=0.1))
        finish_rank(result, rank, {"code": engine.code, "whole": sorted(engine.whole_nodes), "losses": losses,
                                   "ref_losses": ref_losses, "error": parameter_error(state, reference)})
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_random_ops_on_shards_equal_one_device(layout):
    drawn_whole_and_cut, bernoulli_whole = EXPECTED[layout]
    for r in spawn_reports(_worker, 2, layout):
        assert r["code"].count("one_device_random(") == drawn_whole_and_cut, r["code"]
        assert ("bernoulli" in r["whole"]) == bernoulli_whole, r["whole"]
        for a, b in zip(r["losses"], r["ref_losses"]):
            assert abs(a - b) <= 1e-9 * abs(b), (r["losses"], r["ref_losses"])
        assert r["error"] < 1e-9, r["error"]
