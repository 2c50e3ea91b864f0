"""A pipeline's data-parallel gradient reduction runs beside backward, as the plan prices it.

Each stage's gradients are final after the last backward (B) of the last of the rank's
virtual stages that reads them; the pipeline engine arms exactly those parameters before that
B, so each bucket's all-reduce is issued by the hook of its last gradient while that backward
and the cooldown's remaining actions run (runtime/buckets.py), not after the step's last
action. A parameter two virtual stages of one rank read (TinyGPT's tied embedding under
interleaving) is armed only before the later one, so no bucket is reduced before its
gradient is complete: training equals one device in float64. Under ZB-H1 the gradients come
in W, so the hooks are armed before the last W instead.

cost/plan_cost.cc prices the same thing: the reduction is exposed only beyond the window
from the stage's last backward to the step's end; tests/cpp/plan_cost_test.cc states the
formula.

A stage whose weights are sharded over its data axis (ZeRO-3) reduce-scatters their gradients
in each micro-batch's backward instead, a unit group at a time, asynchronously
(runtime/parameter_gathers.py, DeferredScatters): the parts add up in the shards, and
training equals one device too.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

import shardwise
from conftest import finish_rank, parameter_error, spawn_reports, train_one_device
from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

STEPS, ROWS, TOLERANCE = 3, 16, 1e-9  # 4 micro-batches of 2 per data rank (DualPipeV: at least 2p)


def _model():
    torch.manual_seed(0)
    return TinyGPT(TinyGPTConfig(layers=4)).double()


def _batch(step: int):
    ids = torch.randint(0, 256, (ROWS, 32), generator=torch.Generator().manual_seed(step))
    return ids, torch.roll(ids, -1, dims=1)


def _plan(schedule: str, virtual_stages: int) -> shardwise.Plan:
    return shardwise.Plan.from_json(json.dumps({
        "format": "shardwise.plan", "version": 1, "data": 2, "tensor": 1, "pipeline": 2, "global_batch": ROWS,
        "micro_batch": 2, "schedule": schedule, "virtual_stages": virtual_stages,
        "kfkb_k": 1, "recompute": "none",
        "zero_stage": 0, "layers_per_stage": [], "precision": "f32"}))


def _zero3_stages(plan: shardwise.Plan) -> shardwise.Plan:
    """`plan` (complete) with every stage weight that the data axis divides sharded over it:
    ZeRO-3 inside the stages, each gradient reduce-scattered beside backward."""
    doc = json.loads(plan.to_json())
    for key in ("predicted", "programs"):
        doc.pop(key, None)
    placements = doc["stage_sharding"]["placements"]
    shapes = {n: p.shape for n, p in _model().named_parameters()}
    for name, held in placements.items():
        if name in shapes and held[0] == "R":
            dims = [d for d, size in enumerate(shapes[name]) if size % 2 == 0]
            if dims:
                placements[name] = [f"S({dims[0]})"] + held[1:]
    return shardwise.Plan.from_json(json.dumps(doc))


def _worker(rank: int, world: int, store: str, result: str, schedule: str, virtual_stages: int,
            zero3: bool = False) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        engine = shardwise.parallelize(_model(), _batch(0), plan=_plan(schedule, virtual_stages))
        if zero3:
            engine = shardwise.parallelize(_model(), _batch(0), plan=_zero3_stages(engine.plan))
        optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-2)
        losses, in_backward, scattered = [], [], []
        for step in range(STEPS):
            losses.append(float(engine.train_step(*_batch(step))))
            in_backward.append(engine._buckets.issued_in_backward if engine._buckets is not None else 0)
            scattered.append([e for stage in engine._first.stages.values() if stage["module"].scatters is not None
                              for e in stage["module"].scatters.events])
            optimizer.step()
            optimizer.zero_grad()
        state = engine.full_state_dict()
        reference = _model()
        ref_losses = train_one_device(reference, _batch, STEPS, torch.optim.AdamW(reference.parameters(), lr=1e-2))
        report = {"rank": rank, "in_backward": in_backward, "scattered": scattered, "micro_batches": engine._m,
                  "buckets": len(engine._buckets) if engine._buckets is not None else 0, "losses": losses,
                  "ref_losses": ref_losses, "error": parameter_error(state, reference)}
        finish_rank(result, rank, report)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("schedule,virtual_stages", [("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1),
                                                     ("dualpipe-v", 2)])
def test_pipeline_buckets_are_issued_in_backward_and_train_as_one_device(schedule, virtual_stages):
    world = 4
    reports = spawn_reports(_worker, world, schedule, virtual_stages)
    for r in reports:
        assert r["buckets"] > 0, r
        # Every bucket was issued by the hook of its last gradient, in backward, every step.
        assert r["in_backward"] == [r["buckets"]] * STEPS, r
    r = reports[0]
    for a, b in zip(r["losses"], r["ref_losses"]):
        assert abs(a - b) <= TOLERANCE * abs(b), (r["losses"], r["ref_losses"])
    assert r["error"] < TOLERANCE, r["error"]


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "dualpipe-v"])
def test_pipeline_stages_reduce_scatter_their_sharded_weights_beside_backward_and_train_as_one_device(schedule):
    # 2 stages x 2 data ranks, every stage weight sharded over the data axis (ZeRO-3 inside the
    # stages): each micro-batch's backward (under ZB-H1 its W) reduce-scatters its unit groups
    # asynchronously, the micro-batches' gradients add up in the shards, and training equals
    # one device.
    world = 4
    reports = spawn_reports(_worker, world, schedule, 2 if schedule == "dualpipe-v" else 1, True)
    for r in reports:
        for events in r["scattered"]:  # each step: every group issued, then landed, once per micro-batch
            issued = [g for kind, g in events if kind == "issue"]
            assert issued and len(issued) == len([g for kind, g in events if kind == "wait"]), events
            assert len(issued) == len(set(issued)) * r["micro_batches"], events  # each group once per micro-batch
    r = reports[0]
    for a, b in zip(r["losses"], r["ref_losses"]):
        assert abs(a - b) <= TOLERANCE * abs(b), (r["losses"], r["ref_losses"])
    assert r["error"] < TOLERANCE, r["error"]
