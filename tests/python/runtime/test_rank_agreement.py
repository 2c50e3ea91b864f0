"""Every rank runs the same nodes whole, or none goes on.

Whether a node runs whole on gathered operands is decided per rank (the core checks its
local call's shapes on the rank's block), and a node whole on one rank and split on another
makes the two run different collectives: the job hangs at the first one. That happened: an
arange split into blocks ran whole on the ranks past the first block alone, and a ZeRO plan
of TinyGPT on 2 x 2 ranks hung in its first step. The core now decides it for the whole mesh
on every rank (csrc/transform/job_rank_graph.h; tests/cpp: JobRankGraph.*), and the runtime
compares the ranks' lists once before the first collective (runtime/lower.py, _rank_program).

Here rank 1 alone is made to run one split node whole, as a rank-dependent decision the core
missed would: every rank raises, naming the other, and the job ends instead of hanging. The
process group's timeout turns a hang into a failure.
"""
from __future__ import annotations

import datetime
import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import shardwise
from conftest import regression_batch, run_ranks

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

        def one_rank_decides(graph, plan_json, r, adapt_to_shapes, micro_batches=1, stages=lower.StageCut()):
            program, whole = local(graph, plan_json, r, adapt_to_shapes, micro_batches, stages)
            if dist.get_rank() == 1:  # a split node only this rank runs whole
                split = [n["outputs"][0]["value"] for n in program["nodes"]
                         if n["outputs"][0]["value"] not in program["whole"]
                         and any(p.startswith("S") for op in n["inputs"] for p in op["required"])]
                forced.append(split[0])
                program = _C.rank_program(graph._core, plan_json, r, whole + split[:1],
                                          adapt_to_shapes=adapt_to_shapes, micro_batches=micro_batches)
                whole = program["whole"]
            return program, whole

        lower._local_rank_program = one_rank_decides
        error = None
        try:
            shardwise.parallelize(_model(), _batch(0), mesh=(world, 1),  # the batch split
                                  cluster=shardwise.Cluster.preset("cpu", world))
        except shardwise.ValidationError as e:
            error = str(e)
        with open(f"{result}.{rank}", "w") as f:
            json.dump({"error": error, "forced": forced}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_ranks_that_would_run_different_nodes_whole_stop_before_their_first_collective():
    world = 2
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result")
        run_ranks(_worker, args=(world, os.path.join(tmp, "store"), result), nprocs=world)
        reports = []
        for rank in range(world):
            with open(f"{result}.{rank}") as f:
                reports.append(json.load(f))
    forced = reports[1]["forced"]
    assert forced, "rank 1 forced no node whole: the case tests nothing"
    for rank, r in enumerate(reports):
        assert r["error"] is not None, (rank, r)  # no rank went on
        assert "job_rank_graph" in r["error"] and f"rank {rank} runs whole" in r["error"], r["error"]
        assert forced[0] in r["error"], r["error"]  # the node, named on both ranks


def _scenario_plan_made_once(rank: int, world: int) -> list[dict]:
    from shardwise.plan import Plan

    real = Plan.search.__func__
    searches = []

    def counted(cls, *args, **kwargs):
        searches.append(kwargs.get("mesh"))
        if kwargs.get("level") == "thorough":  # the second call below: a refusal made on rank 0
            raise shardwise.ValidationError(f"refused on rank {dist.get_rank()}")
        return real(cls, *args, **kwargs)

    Plan.search = classmethod(counted)
    try:
        cluster = shardwise.Cluster.preset("cpu", world)
        engine = shardwise.parallelize(_model(), _batch(0), mesh=(world, 1), cluster=cluster)
        searched = len(searches)
        try:
            shardwise.parallelize(_model(), _batch(0), mesh=(world, 1), cluster=cluster, level="thorough")
            refused = None
        except shardwise.ValidationError as e:
            refused = str(e)
    finally:
        Plan.search = classmethod(real)
    mine = {"searched": searched, "plan": engine.plan.hash(), "report": engine.plan.report(),
            "refused": refused, "searches": len(searches)}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    return everyone


def test_the_plan_is_searched_on_rank_0_and_broadcast_and_its_refusal_raised_on_every_rank():
    # Every rank asks the same search (engine_base.planned_once): rank 0 alone searches, the
    # others take its plan (with the report their own capture gives it); a refusal of rank 0's
    # search is raised on every rank, of its type and with its message, and no rank waits.
    from conftest import spawn_scenario

    ranks = spawn_scenario(__name__, 2, "plan_made_once")
    assert [r["searched"] for r in ranks] == [1, 0], ranks
    assert ranks[0]["plan"] == ranks[1]["plan"] and ranks[0]["report"] == ranks[1]["report"]
    assert "mesh" in ranks[1]["report"], ranks[1]["report"]
    assert [r["refused"] for r in ranks] == ["refused on rank 0"] * 2, ranks
    assert [r["searches"] for r in ranks] == [2, 0], ranks


def _scenario_program_refused_on_one_rank(rank: int, world: int) -> list[dict]:
    from shardwise.runtime import engine_base

    real = engine_base._C.program_hash

    def refused_on_rank_1(graph, plan_json, r):
        if dist.get_rank() == 1:
            raise shardwise.ValidationError("rewrite: refused here")
        return real(graph, plan_json, r)

    engine_base._C.program_hash = refused_on_rank_1
    try:
        shardwise.parallelize(_model(), _batch(0), mesh=(world, 1), cluster=shardwise.Cluster.preset("cpu", world))
        error = None
    except shardwise.ValidationError as e:
        error = str(e)
    finally:
        engine_base._C.program_hash = real
    everyone = [None] * world
    dist.all_gather_object(everyone, error)
    return everyone


def test_a_rank_whose_core_refuses_its_program_is_named_on_every_rank_at_the_one_agreement_check():
    # The plan's hash and every rank program's are gathered once (engine_base.check_same_job):
    # a rank whose core raised there raises its own error, the others name it, none waits.
    from conftest import spawn_scenario

    errors = spawn_scenario(__name__, 2, "program_refused_on_one_rank")
    assert errors[1] == "rewrite: refused here", errors
    assert errors[0] is not None and "rank 1: rewrite: refused here" in errors[0], errors
