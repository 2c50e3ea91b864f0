"""A rank that dies or stalls mid-training: every other rank fails with shardwise.CollectiveError
naming its rank, step and collective, within the process group's timeout - never a hang.
Real processes: one is killed (os._exit) or put to sleep between two steps."""
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
    try:
        engine.train_step(*batch)
        result = {"raised": None}
    except Exception as e:  # noqa: BLE001 - the test inspects it
        result = {"raised": type(e).__name__, "message": str(e),
                  "shardwise": isinstance(e, shardwise.ShardwiseError)}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    os._exit(0)


@pytest.mark.parametrize("fault", ["kill", "stall"])
def test_a_dead_or_stalled_rank_makes_the_others_fail_within_the_timeout(fault):
    world = 3
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_worker, args=(r, world, os.path.join(tmp, "store"), out, fault))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        alive = [p for p in procs if p.is_alive()]
        for p in alive:
            p.kill()
        assert not alive, "a rank hung"
        for rank in range(world - 1):
            with open(f"{out}.{rank}") as f:
                result = json.load(f)
            assert result["raised"] == "CollectiveError" and result["shardwise"], result
            assert f"rank {rank}, train_step 2" in result["message"]
            # It failed on the process group's timeout (the join above guards against a hang;
            # no wall-clock bound here) and names the collective that failed.
            assert "a collective failed" in result["message"] and "init_process_group" in result["message"]
