"""A column-parallel linear's input gradient is all-reduced beside its weight gradient
(Megatron-LM's asynchronous tensor-parallel all-reduce), as the plan prices it.

The core marks the reader ``{shardwise.async_gradient=i}`` and the all-reduce of that
operand's gradient ``{overlap="backward"}`` (search/parameter_collectives.h,
activation_gradient_overlap; tests/golden/sharded_async_gradient.ir). The runtime splits the
call's backward (runtime/async_gradients.py): the input's gradient, its all-reduce issued
asynchronously, then the weight's and the bias' gradients while it runs, then the wait.

Megatron's MLP behind a replicated layer, on 2 Gloo ranks in float64, against one device:
losses and parameters within 1e-9; the rank program and the lowered code carry the split;
the all-reduce was issued before the weight gradient was computed and waited for after it.
"""
from __future__ import annotations

import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import shardwise
from conftest import regression_batch, run_ranks, train_one_device

ROWS, STEPS, TOLERANCE = 8, 3, 1e-9


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc0 = nn.Linear(16, 32)
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 16)

    def forward(self, x, y):
        return F.mse_loss(self.fc2(F.gelu(self.fc1(torch.tanh(self.fc0(x))))), y)


def _model():
    torch.manual_seed(0)
    return MLP().double()


def _batch(step: int):
    return regression_batch(step, ROWS)


def _megatron_plan(world: int, async_gradients: bool = True) -> shardwise.Plan:
    """The searched plan (everything replicated at this size) with fc1 column-parallel and fc2
    row-parallel on the tensor axis (the weights stay replicated: each rank slices its block);
    `async_gradients`: its sharding's switch of the async-gradient pass."""
    graph = shardwise.capture(_model(), _batch(0))
    plan = shardwise.Plan.search(graph, shardwise.Cluster.preset("cpu", world), mesh=(1, world), global_batch=ROWS,
                                 precision="f32")
    doc = json.loads(plan.to_json())
    doc.pop("predicted", None)
    doc.pop("programs", None)
    doc["sharding"]["strategies"].update({"linear_1": ["replicate", "split n"], "gelu": ["replicate", "split d1"],
                                          "linear_2": ["replicate", "split k"]})
    if not async_gradients:
        doc["sharding"]["async_gradients"] = False
    return shardwise.Plan.from_json(json.dumps(doc))


def _worker(rank: int, world: int, store: str, result: str, overlapped: bool) -> None:
    from shardwise.runtime import async_gradients, transport

    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        # The order of events in backward: the asynchronous all-reduce, the weight gradient's
        # product, the wait.
        events = []
        all_reduce, rows = transport.all_reduce, async_gradients._rows

        class Recorded:
            def __init__(self, work):
                self._work = work

            def wait(self):
                events.append("wait")
                return self._work.wait()

        def recorded_all_reduce(tensor, *args, **kwargs):
            work = all_reduce(tensor, *args, **kwargs)
            if not kwargs.get("async_op"):
                return work
            events.append("issue")
            return Recorded(work)

        def recorded_weight_gradient(grad, x):
            events.append("weight")
            return rows(grad).t() @ rows(x)

        async_gradients.transport.all_reduce = recorded_all_reduce
        async_gradients._weight_gradient = recorded_weight_gradient
        engine = shardwise.parallelize(_model(), _batch(0), plan=_megatron_plan(world, overlapped))
        optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-2)
        losses = []
        for step in range(STEPS):
            losses.append(float(engine.train_step(*_batch(step))))
            optimizer.step()
            optimizer.zero_grad()
        state = engine.full_state_dict()
        reference = _model()
        ref_losses = train_one_device(reference, _batch, STEPS, torch.optim.AdamW(reference.parameters(), lr=1e-2))
        if rank == 0:
            with open(result, "w") as f:
                json.dump({"losses": losses, "ref_losses": ref_losses, "rank_ir": engine.rank_ir, "code": engine.code,
                           "events": events,
                           "error": max(((state[n] - p).abs().max() / p.abs().max()).item()
                                        for n, p in reference.named_parameters())}, f)
        dist.barrier()
    finally:
        async_gradients.transport.all_reduce = all_reduce
        dist.destroy_process_group()


def _trained(async_gradients: bool) -> dict:
    world = 2
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        run_ranks(_worker, args=(world, os.path.join(tmp, "store"), result, async_gradients), nprocs=world)
        with open(result) as f:
            r = json.load(f)
    for a, b in zip(r["losses"], r["ref_losses"]):
        assert abs(a - b) <= TOLERANCE * abs(b), (r["losses"], r["ref_losses"])
    assert r["error"] < TOLERANCE, r["error"]
    return r


def test_column_parallel_input_gradient_is_all_reduced_beside_the_weight_gradient():
    r = _trained(async_gradients=True)
    for a, b in zip(r["losses"], r["ref_losses"]):
        assert abs(a - b) <= TOLERANCE * abs(b), (r["losses"], r["ref_losses"])
    assert r["error"] < TOLERANCE, r["error"]
    ir = r["rank_ir"]
    assert "shardwise.async_gradient=0" in ir, ir
    marked = [line for line in ir.splitlines() if "shardwise::all_reduce" in line and 'pass="backward"' in line]
    assert marked and all('overlap="backward"' in line for line in marked), marked
    assert "self.async_gradient('aten::linear', 0," in r["code"], r["code"]
    # One split backward per step: the all-reduce issued, the weight gradient computed, the wait.
    assert r["events"] == ["issue", "weight", "wait"] * STEPS, r["events"]


def test_a_plan_with_async_gradients_off_all_reduces_after_the_backward_and_trains_as_one_device():
    # The plan's sharding.async_gradients off: the core's pass does not run (no mark, the
    # all-reduce exposed), the call is the op itself and its input gradient's all-reduce runs
    # in the operand's reshard after autograd's backward of it, blocking.
    r = _trained(async_gradients=False)
    ir = r["rank_ir"]
    assert "shardwise.async_gradient" not in ir, ir
    reduced = [line for line in ir.splitlines() if "shardwise::all_reduce" in line and 'pass="backward"' in line]
    assert reduced and all('overlap="exposed"' in line for line in reduced), reduced
    assert "self.async_gradient(" not in r["code"], r["code"]
    assert r["events"] == [], r["events"]  # nothing issued asynchronously, no split weight gradient

