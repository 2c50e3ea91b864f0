"""A rank that dies or stalls mid-training: every other rank fails with shardwise.CollectiveError
naming its rank, step and collective, within the process group's timeout - never a hang.
Real processes: one is killed (os._exit) or put to sleep between two steps, or killed inside a
step: in a gradient bucket's all-reduce, or in a pipeline step between a send and the receive
that would follow it."""
from __future__ import annotations

import datetime
import json
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_S = 5


def _second_step_then_exit(engine, batch, path: str) -> None:
    """The step a peer's fault breaks: what it raised, written for the test; then out at once
    (the group is broken: no teardown collective)."""
    import shardwise

    try:
        engine.train_step(*batch)
        result = {"raised": None}
    except Exception as e:  # noqa: BLE001 - the test inspects it
        result = {"raised": type(e).__name__, "message": str(e),
                  "shardwise": isinstance(e, shardwise.ShardwiseError)}
    with open(path, "w") as f:
        json.dump(result, f)
    os._exit(0)


def _worker(rank: int, world: int, store: str, out: str, fault: str) -> None:
    import shardwise

    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    batch = (torch.randn(12, 16), torch.randint(0, 4, (12,)))  # 12 rows: 4 per rank
    engine = shardwise.parallelize(model, batch, torch.nn.functional.cross_entropy, mesh=(world, 1),
                                   cluster=shardwise.Cluster.preset("cpu", world))
    engine.train_step(*batch)
    if rank == world - 1:
        if fault == "stall":
            time.sleep(3 * TIMEOUT_S)
        os._exit(0 if fault == "stall" else 3)
    _second_step_then_exit(engine, batch, f"{out}.{rank}")


def _run_ranks(target, world: int, tmp: str, out: str, fault: str) -> list:
    """`world` spawned processes of `target(rank, world, store, out, fault)`, joined; fails the
    test if one hangs (a hang guard: the group's timeout is 5 s). Returns the processes."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(r, world, os.path.join(tmp, "store"), out, fault)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a rank hung"
    return procs


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["kill", "stall"])
def test_a_dead_or_stalled_rank_makes_the_others_fail_within_the_timeout(fault):
    world = 3
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        _run_ranks(_worker, world, tmp, out, fault)
        for rank in range(world - 1):
            with open(f"{out}.{rank}") as f:
                result = json.load(f)
            assert result["raised"] == "CollectiveError" and result["shardwise"], result
            assert f"rank {rank}, train_step 2" in result["message"]
            # It failed on the process group's timeout (the join above guards against a hang;
            # no wall-clock bound here) and names the collective that failed.
            assert "a collective failed" in result["message"] and "init_process_group" in result["message"]


class _DiesOn:
    """torch.distributed as one module of shardwise sees it, except that the first call of
    `name` ends the process: a rank killed inside a step. after=True: the call runs first and
    completes (a send the peer has), else the process dies in place of it (an all-reduce its
    peers are in, waiting for its share)."""

    def __init__(self, real, name: str, after: bool):
        self._real, self._name, self._after = real, name, after

    def __getattr__(self, attr):
        fn = getattr(self._real, attr)
        if attr != self._name:
            return fn

        def then_die(*args, **kwargs):
            if self._after:
                work = fn(*args, **kwargs)
                if work is not None:
                    work.wait()  # the peer has it: the death falls between this and what follows
            os._exit(3)

        return then_die


def _mid_step_worker(rank: int, world: int, store: str, out: str, fault: str) -> None:
    import shardwise
    import shardwise.runtime.transport  # the runtime's own torch.distributed calls go through it
    from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    torch.manual_seed(0)
    if fault == "bucket":  # data parallel: the gradients' all-reduce runs in buckets
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
        batch = (torch.randn(12, 16), torch.randint(0, 4, (12,)))
        engine = shardwise.parallelize(model, batch, torch.nn.functional.cross_entropy, mesh=(world, 1),
                                       cluster=shardwise.Cluster.preset("cpu", world))
        victim, call = world - 1, "all_reduce"
    else:  # two stages, four micro-batches: the first stage dies after its first send of step 2
        model = TinyGPT(TinyGPTConfig(layers=2))
        ids = torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(1))
        batch = (ids, torch.roll(ids, -1, dims=1))
        graph = shardwise.capture(TinyGPT(TinyGPTConfig(layers=2)), batch)
        plan = shardwise.Plan.manual(graph, shardwise.Cluster.preset("cpu", world), pipeline=world, global_batch=8,
                                     micro_batch=2, recompute=False)
        engine = shardwise.parallelize(model, batch, plan=plan)
        victim, call = 0, "isend"
    engine.train_step(*batch)
    if rank == victim:
        transport = shardwise.runtime.transport
        transport.dist = _DiesOn(transport.dist, call, after=fault == "pipeline")
    _second_step_then_exit(engine, batch, f"{out}.{rank}")


@pytest.mark.parametrize("fault,world", [("bucket", 3), ("pipeline", 2)])
def test_a_rank_killed_inside_a_step_makes_the_others_fail_naming_rank_and_step(fault, world):
    victim = world - 1 if fault == "bucket" else 0
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        procs = _run_ranks(_mid_step_worker, world, tmp, out, fault)
        assert procs[victim].exitcode == 3, "the victim died where the test put it"
        assert not os.path.exists(f"{out}.{victim}")
        for rank in (r for r in range(world) if r != victim):
            with open(f"{out}.{rank}") as f:
                result = json.load(f)
            assert result["raised"] == "CollectiveError" and result["shardwise"], result
            assert f"rank {rank}, train_step 2" in result["message"], result
