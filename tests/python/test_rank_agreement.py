"""Every rank runs the same nodes whole, or none goes on.

Whether a node runs whole on gathered operands is decided per rank (the core checks its
local call's shapes on the rank's block), and a node whole on one rank and split on another makes the
two run different collectives: the job hangs at the first one. That happened: an arange
split into blocks ran whole on the ranks past the first block alone (the rank graph called
arange(end), whose shape rule ignores the block's start; tests/cpp: SpmdRewrite.
EveryRanksArangeBlockRunsLocallyInItsRankGraph), and a ZeRO plan of TinyGPT on 2 x 2 ranks
hung in its first step. The runtime now all-gathers every rank's list and makes each rank's
program with their union (runtime/lower.py, _rank_program).

Here rank 1 alone is made to run one split node whole (as a per-rank decision would): both
ranks run it whole, train as one device does, and the job ends. The process group's timeout
turns a hang into a failure.
"""
from __future__ import annotations

import datetime
import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import shardwise
from conftest import regression_batch, train_one_device

ROWS, STEPS = 256, 2


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 16)

    def forward(self, x, y):
        return F.mse_loss(self.fc2(F.gelu(self.fc1(x))), y)


def _model():
    torch.manual_seed(0)
    return MLP().double()


def _batch(step: int):
    return regression_batch(step, ROWS)


def _worker(rank: int, world: int, store: str, result: str) -> None:
    from shardwise import _C
    from shardwise.runtime import lower

    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        local = lower._local_rank_program
        forced = []

        def one_rank_decides(graph, plan_json, r, adapt_to_shapes, micro_batches=1):
            program, whole = local(graph, plan_json, r, adapt_to_shapes, micro_batches)
            if dist.get_rank() == 1:  # a split node only this rank runs whole
                split = [n["outputs"][0]["value"] for n in program["nodes"]
                         if n["mode"] == "local" and any(p.startswith("S") for op in n["inputs"]
                                                         for p in op["required"])]
                forced.append(split[0])
                program = _C.rank_program(graph._core, plan_json, r, whole + split[:1],
                                          adapt_to_shapes=adapt_to_shapes, micro_batches=micro_batches)
                whole = [n["outputs"][0]["value"] for n in program["nodes"] if n["mode"] == "whole"]
            return program, whole

        lower._local_rank_program = one_rank_decides
        engine = shardwise.parallelize(_model(), _batch(0), mesh=(world, 1),  # the batch split
                                       cluster=shardwise.Cluster.preset("cpu", world))
        optimizer = engine.optimizer(torch.optim.SGD, lr=0.1)
        losses = []
        for step in range(STEPS):
            losses.append(float(engine.train_step(*_batch(step))))
            optimizer.step()
            optimizer.zero_grad()
        state = engine.full_state_dict()
        reference = _model()
        ref_losses = train_one_device(reference, _batch, STEPS, torch.optim.SGD(reference.parameters(), lr=0.1))
        error = max((state[n] - p).abs().max().item() for n, p in reference.named_parameters())
        with open(f"{result}.{rank}", "w") as f:
            json.dump({"whole": sorted(engine.whole_nodes), "forced": forced, "losses": losses,
                       "ref_losses": ref_losses, "error": error}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_a_node_one_rank_runs_whole_runs_whole_on_every_rank():
    world = 2
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result")
        mp.spawn(_worker, args=(world, os.path.join(tmp, "store"), result), nprocs=world, join=True)
        reports = []
        for rank in range(world):
            with open(f"{result}.{rank}") as f:
                reports.append(json.load(f))
    forced = reports[1]["forced"]
    assert forced, "rank 1 forced no node whole: the case tests nothing"
    for r in reports:
        assert forced[0] in r["whole"], r  # rank 0 runs it whole too
        assert r["whole"] == reports[0]["whole"], reports
        for a, b in zip(r["losses"], r["ref_losses"]):
            assert abs(a - b) <= 1e-9 * abs(b), r
        assert r["error"] < 1e-9, r
