"""Buffers a training step writes in place (batch norm's running statistics) end where one
device's end, whatever the plan does with the op that writes them.

Batch norm in training updates `running_mean` and `running_var` in place, through an operand
its schema does not mark written (aten::batch_norm). A plan that splits the op over channels
(a sharded plan: its weight and bias S(0) on the tensor axis, the buffers replicated) hands
the op its block of the buffers; the block the op updates must reach the buffer on every rank
(the rank IR's write-back: the block all-gathered, then written: csrc/transform/rank_graph.h), or the running statistics of every
channel block stay at their initial values: a silent wrong model in eval mode, with training
losses and parameters unchanged. Found by benchmarks/model_zoo.py's training column (ResNet
on a 2 x 2 mesh).
"""
from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import shardwise
from conftest import run_ranks, tight_plan
from rank_ir_check import engine_against_rank_ir

STEPS, ROWS, TOLERANCE = 3, 4, 1e-9


class BatchNormCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x, y):
        x = F.relu(self.bn(self.conv1(x)))
        x = F.relu(self.conv2(x))
        return F.cross_entropy(self.fc(x.flatten(1)), y)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return BatchNormCNN().double().train()


def _batch(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(ROWS, 3, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 10, (ROWS,), generator=g)


def _worker(rank: int, world: int, store: str, mesh: tuple[int, int], result: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        searched = tight_plan(shardwise.capture(_model(), _batch(0)), world, ROWS, mesh)
        # Batch norm split over its channels on the tensor axis, whatever the search chose for
        # it: the case under test (the search's choice moves with the prices of its collectives).
        doc = json.loads(searched.to_json())
        for key in ("predicted", "programs"):
            doc.pop(key, None)
        doc["sharding"]["strategies"]["batch_norm"] = ["replicate" if size == 1 else "split d0" for size in mesh]
        engine = shardwise.parallelize(_model(), _batch(0), plan=shardwise.Plan.from_json(json.dumps(doc)))
        # The write-back is the rank IR's (rank_graph.h: write_back steps, then write_state), and
        # the program runs it node for node, its all-gathers among the regions compared.
        lowered = engine_against_rank_ir(engine)
        ir = engine.rank_ir
        write_backs = [line for line in ir.splitlines() if "write_back=true" in line]
        optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-2)
        for step in range(STEPS):
            engine.train_step(*_batch(step))
            optimizer.step()
            optimizer.zero_grad()
        state = engine.full_state_dict()
        engine.eval()
        eval_loss = float(engine.eval_step(*_batch(9)))

        reference = _model()
        ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
        for step in range(STEPS):
            reference(*_batch(step)).backward()
            ref_opt.step()
            ref_opt.zero_grad()
        reference.eval()
        with torch.no_grad():
            ref_eval = float(reference(*_batch(9)))
        errors = {name: ((state[name].double() - t.double()).abs().max() / t.double().abs().max().clamp_min(1e-6)).item()
                  for name, t in reference.state_dict().items()}
        if rank == 0:
            with open(result, "w") as f:
                json.dump({"errors": errors, "eval": abs(eval_loss - ref_eval) / abs(ref_eval),
                           "strategy": engine.plan.strategies()["batch_norm"], "lowered": lowered,
                           "write_backs": write_backs, "write_states": ir.count("shardwise::write_state(")}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("mesh", [(1, 2)])
def test_batch_norm_split_over_channels_updates_the_whole_running_statistics(mesh):
    world = mesh[0] * mesh[1]
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        run_ranks(_worker, args=(world, os.path.join(tmp, "store"), mesh, result), nprocs=world)
        with open(result) as f:
            r = json.load(f)
    assert any(s != "replicate" for s in r["strategy"]), r  # the plan splits batch norm's channels
    for name, error in r["errors"].items():  # running_mean, running_var, num_batches_tracked too
        assert error < TOLERANCE, (name, r)
    assert r["eval"] < TOLERANCE, r  # eval mode reads the running statistics
    # In the IR: running_mean and running_var, each block all-gathered back and written;
    # num_batches_tracked (add_ on the whole buffer) written where it is.
    assert r["write_states"] == 3, r
    assert len(r["write_backs"]) == 2 and all("all_gather" in line for line in r["write_backs"]), r
    assert r["lowered"]["mismatches"] == [], r["lowered"]
    assert r["lowered"]["collectives"] >= 2, r["lowered"]
