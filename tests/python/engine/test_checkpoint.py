"""Checkpoints across plans (shardwise.save_checkpoint / load_checkpoint, written with DCP):
one device -> weights sharded over a 2 x 2 mesh -> ZeRO on 2 x 2 -> a 2-stage pipeline on
2 ranks -> stages of 1 and 2 ranks (plan.stage_meshes) -> one device gives
the same state dict, parameters and optimizer state, bit for bit; training resumed from a
checkpoint gives the losses of the run that never stopped (bit for bit under the same plan);
a checkpoint of another model, or a damaged one, is refused on every rank with nothing changed.
Real Gloo processes, float64."""
from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import shardwise
from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

from conftest import run_ranks, without_call_overhead

CFG = dict(layers=4)
BATCH, SEQ, VOCAB = 8, 32, 256
LR = 1e-2


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return TinyGPT(TinyGPTConfig(**CFG)).double()


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(100 + step))
    return ids, torch.roll(ids, -1, dims=1)


def _pipeline_plan() -> str:
    doc = {"format": "shardwise.plan", "version": 1, "data": 1, "tensor": 1, "pipeline": 2, "global_batch": BATCH,
           "micro_batch": 2, "schedule": "1f1b", "virtual_stages": 1, "kfkb_k": 1, "recompute": "none",
           "zero_stage": 0, "layers_per_stage": [], "precision": "f32"}
    return shardwise.Plan.from_json(json.dumps(doc)).to_json()


def _cluster(world: int, memory: float) -> shardwise.Cluster:
    """CPU ranks with little memory, so the search must shard: at 1.25 MB every weight over
    both axes of a 2 x 2 mesh (the search's prices since 2026-12-01 fit 1.33 MB with the
    attention's weights on the tensor axis alone); at 1.5 MB the optimizer state over the data axis (ZeRO) and
    the position embedding over the tensor axis."""
    doc = json.loads(without_call_overhead(shardwise.Cluster.preset("cpu", world)).to_json())
    doc["device_types"][0]["memory_bytes"] = int(memory)
    return shardwise.Cluster.from_json(json.dumps(doc))


def _engine(layout: str, world: int):
    model = _model()
    if layout in ("sharded", "zero"):  # 2 x 2 data x tensor; engine.optimizer applies ZeRO
        memory = 1.25e6 if layout == "sharded" else 1.5e6
        # Priced in bf16: the memory figures of _cluster force these layouts at bf16's bytes.
        engine = shardwise.parallelize(model, _batch(0), mesh=(2, 2), cluster=_cluster(world, memory),
                                       precision="bf16")
        return engine, engine.optimizer(torch.optim.AdamW, lr=LR)
    if layout == "pipeline":
        engine = shardwise.parallelize(model, _batch(0), plan=shardwise.Plan.from_json(_pipeline_plan()))
        return engine, torch.optim.AdamW(engine.parameters(), lr=LR)
    if layout == "stage_meshes":  # stages of one rank and of a data pair (plan.stage_meshes)
        doc = json.loads(_pipeline_plan())
        doc["stage_meshes"] = [[1, 1], [2, 1]]
        engine = shardwise.parallelize(model, _batch(0), plan=shardwise.Plan.from_json(json.dumps(doc)),
                                       cluster=shardwise.Cluster.preset("cpu", world))
        return engine, torch.optim.AdamW(engine.parameters(), lr=LR)
    raise ValueError(layout)


def _train(engine, optimizer, steps: range) -> list[float]:
    losses = []
    for step in steps:
        optimizer.zero_grad()
        losses.append(engine.train_step(*_batch(step)).item())
        optimizer.step()
    return losses


# ---- the ranks ---------------------------------------------------------------------------------
def _job(rank: int, world: int, store_path: str, spec: dict) -> None:
    # One thread a rank, as conftest's scenarios run: the losses are compared bit for bit, and a
    # rank left at the default threads runs MKL's float64 products with its dynamic thread
    # count on (torch.set_num_threads turns it off), which may split a product differently from
    # run to run on a loaded machine (one resumed loss 4.5e-15 apart, once in the suite).
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        engine, optimizer = _engine(spec["layout"], world)
        result: dict = {}
        if spec.get("bad_load"):  # refused on every rank, nothing changed
            before = {k: v.clone() for k, v in engine.full_state_dict().items()}
            try:
                shardwise.load_checkpoint(spec["bad_load"], engine, optimizer)
                result["error"] = None
            except shardwise.ShardwiseError as e:
                result["error"] = f"{type(e).__name__}: {e}"
            after = engine.full_state_dict()
            result["unchanged"] = all(torch.equal(before[k], after[k]) for k in before)
        if spec.get("load"):
            result["extra"] = shardwise.load_checkpoint(spec["load"], engine, optimizer)
        start = result.get("extra", {}).get("step", 0)
        result["losses_before"] = _train(engine, optimizer, range(start, start + spec.get("train", 0)))
        if spec.get("save"):
            shardwise.save_checkpoint(spec["save"], engine, optimizer, extra={"step": start + spec.get("train", 0)})
        after_save = start + spec.get("train", 0)
        result["losses_after"] = _train(engine, optimizer, range(after_save, after_save + spec.get("then", 0)))
        result["placements"] = engine.plan.placements() if engine.plan.sharding else None
        result["zero"] = (engine.plan.sharding or {}).get("zero")
        if rank == 0:
            with open(spec["result"], "w") as f:
                json.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(world: int, tmp: str, **spec) -> dict:
    spec["result"] = os.path.join(tmp, f"result-{spec['layout']}.json")
    store = tempfile.mktemp(dir=tmp)
    run_ranks(_job, args=(world, store, spec), nprocs=world)
    with open(spec["result"]) as f:
        return json.load(f)


def _single(steps_trained: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    for step in range(steps_trained):
        optimizer.zero_grad()
        model(*_batch(step)).backward()
        optimizer.step()
    return model, optimizer


def _optimizer_tensors(model, optimizer) -> dict[str, torch.Tensor]:
    name = {id(p): n for n, p in model.named_parameters()}
    return {f"{name[id(p)]}/{k}": v for p, s in optimizer.state.items() for k, v in s.items()}


# ---- the cases ---------------------------------------------------------------------------------------
def test_one_device_to_two_plans_and_back_is_bitwise_equal(tmp_path):
    tmp = str(tmp_path)
    model, optimizer = _single(2)  # AdamW state exists
    shardwise.save_checkpoint(os.path.join(tmp, "single"), model, optimizer, extra={"step": 2})

    a = _spawn(4, tmp, layout="sharded", load=os.path.join(tmp, "single"), save=os.path.join(tmp, "sharded"))
    assert a["extra"] == {"step": 2}
    assert all(p.startswith("S") for p in a["placements"]["blocks.0.qkv.weight"]), \
        ("plan A shards the weights over both axes", a["placements"]["blocks.0.qkv.weight"])
    b = _spawn(4, tmp, layout="zero", load=os.path.join(tmp, "sharded"), save=os.path.join(tmp, "zero"))
    assert b["zero"], "plan B shards optimizer state over the data axis (ZeRO)"
    _spawn(2, tmp, layout="pipeline", load=os.path.join(tmp, "zero"), save=os.path.join(tmp, "pipeline"))
    # stages of their own sizes: the tied embedding held on one rank and on a data pair
    _spawn(3, tmp, layout="stage_meshes", load=os.path.join(tmp, "pipeline"), save=os.path.join(tmp, "meshes"))

    back, back_optimizer = _single(0)
    back_optimizer = torch.optim.AdamW(back.parameters(), lr=0.5)  # hyperparameters come from the checkpoint
    assert shardwise.load_checkpoint(os.path.join(tmp, "meshes"), back, back_optimizer) == {"step": 2}
    want, got = model.state_dict(), back.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want), [k for k in want if not torch.equal(want[k], got[k])]
    want_state, got_state = _optimizer_tensors(model, optimizer), _optimizer_tensors(back, back_optimizer)
    assert want_state.keys() == got_state.keys() and len(want_state) == 3 * len(list(model.parameters()))
    assert all(torch.equal(want_state[k], got_state[k]) for k in want_state)
    assert back_optimizer.param_groups[0]["lr"] == LR


@pytest.mark.slow
def test_resumed_training_gives_the_losses_of_the_run_that_never_stopped_and_another_model_is_refused(tmp_path):
    tmp = str(tmp_path)
    ckpt = os.path.join(tmp, "step2")
    first = _spawn(4, tmp, layout="zero", train=2, save=ckpt, then=3)
    # A checkpoint of another model first: refused on every rank, nothing changed.
    other = torch.nn.Sequential(torch.nn.Linear(4, 4))
    shardwise.save_checkpoint(os.path.join(tmp, "other"), other, torch.optim.SGD(other.parameters(), lr=0.1))
    same_plan = _spawn(4, tmp, layout="zero", bad_load=os.path.join(tmp, "other"), load=ckpt, train=3)
    assert same_plan["error"].startswith("ValidationError") and "lacks" in same_plan["error"], same_plan
    assert "ranks 0, 1, 2, 3: " in same_plan["error"] and same_plan["unchanged"]
    assert same_plan["losses_before"] == first["losses_after"]  # bit for bit
    other_plan = _spawn(2, tmp, layout="pipeline", load=ckpt, train=3)
    model, optimizer = _single(0)
    assert shardwise.load_checkpoint(ckpt, model, optimizer) == {"step": 2}
    single = []
    for step in range(2, 5):
        optimizer.zero_grad()
        loss = model(*_batch(step))
        loss.backward()
        optimizer.step()
        single.append(loss.item())
    for losses in (other_plan["losses_before"], single):
        assert max(abs(a - b) / abs(b) for a, b in zip(losses, first["losses_after"])) < 1e-12, (losses, first)


def test_a_damaged_or_missing_checkpoint_changes_nothing(tmp_path):
    model, optimizer = _single(1)
    path = str(tmp_path / "ckpt")
    shardwise.save_checkpoint(path, model, optimizer)
    fresh, fresh_optimizer = _single(0)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(shardwise.ValidationError, match="not a readable checkpoint"):
        shardwise.load_checkpoint(str(tmp_path / "missing"), fresh, fresh_optimizer)
    for name in os.listdir(path):  # cut every data file in half
        if name.endswith(".distcp"):
            with open(os.path.join(path, name), "r+b") as f:
                f.truncate(os.path.getsize(os.path.join(path, name)) // 2)
    with pytest.raises(shardwise.CheckpointError, match="nothing was changed"):
        shardwise.load_checkpoint(path, fresh, fresh_optimizer)
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())
    assert not fresh_optimizer.state
    with pytest.raises(shardwise.ValidationError, match="saved without an optimizer"):
        shardwise.save_checkpoint(path, model)  # a new checkpoint replaces the damaged one
        shardwise.load_checkpoint(path, fresh, fresh_optimizer)
    assert not os.path.exists(path + ".partial") and not os.path.exists(path + ".old")


def test_boxes_of_strided_and_uneven_shards_cover_the_rank_s_slice():
    from shardwise.checkpoint import _boxes
    from shardwise.materialize import local_tensor

    full = torch.arange(4 * 12.).reshape(4, 12)
    for placement, mesh in ((["S(1,g3)"], [2]), (["S(0)[0.75,0.25]"], [2]), (["S(1,g3)", "S(0)"], [2, 2])):
        for rank in range(2 ** len(mesh)):
            local = local_tensor(full, placement, mesh, rank)
            boxes = _boxes([4, 12], placement, mesh, rank)
            assert sum(b.sizes[0] * b.sizes[1] for b in boxes) == local.numel()
            for b in boxes:
                got = local[b.local[0]:b.local[0] + b.sizes[0], b.local[1]:b.local[1] + b.sizes[1]]
                want = full[b.offsets[0]:b.offsets[0] + b.sizes[0], b.offsets[1]:b.offsets[1] + b.sizes[1]]
                assert torch.equal(got, want), (placement, rank, b)
    assert len(_boxes([4, 12], ["S(1,g3)"], [2], 1)) == 3  # q, k and v of the same heads


@pytest.mark.slow
def test_training_resumes_under_torchrun(tmp_path):
    """The README job: `python -m shardwise train --save DIR`, then `--resume DIR` in a new
    torchrun, prints the losses the uninterrupted run printed."""
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.fail("torchrun is not on PATH (it comes with torch)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.path.join(os.path.dirname(__file__), "..", "..", "..",
                                                                                    "python"),
                                                                       os.environ.get("PYTHONPATH")]))}

    def run(*args) -> list[str]:
        out = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "shardwise", "train",
                              *args], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        return [line.split()[:2] for line in out.stdout.splitlines() if line.split() and line.split()[0].isdigit()]

    ckpt = str(tmp_path / "ckpt")
    whole = run("--steps", "4")
    first = run("--steps", "2", "--save", ckpt)
    resumed = run("--steps", "2", "--resume", ckpt)
    assert first == whole[:2]
    assert resumed == whole[2:], (resumed, whole)


def _interrupted_save_job(rank: int, world: int, store_path: str, path: str, fault: str, result: str) -> None:
    """Saves after step 1, trains step 2, then saves again with rank 1's writes failing
    (fault 'full': the disk is full) or rank 1 killed while it writes ('kill')."""
    import errno

    import torch.distributed.checkpoint as dcp

    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=10))
    engine, optimizer = _engine("pipeline", world)
    _train(engine, optimizer, range(1))
    shardwise.save_checkpoint(path, engine, optimizer, extra={"step": 1})
    _train(engine, optimizer, range(1, 2))
    if rank == 1:
        def write_data(self, plan, planner):
            if fault == "kill":
                os._exit(3)
            raise OSError(errno.ENOSPC, "No space left on device", path)

        dcp.FileSystemWriter.write_data = write_data
    try:
        shardwise.save_checkpoint(path, engine, optimizer, extra={"step": 2})
        raised = None
    except Exception as e:  # noqa: BLE001 - the test inspects it
        raised = f"{type(e).__name__}: {e}"
    with open(f"{result}.{rank}", "w") as f:
        json.dump({"raised": raised}, f)
    os._exit(0)  # a rank of a broken group: no teardown collective


@pytest.mark.parametrize("fault", ["full", "kill"])
def test_an_interrupted_save_leaves_the_previous_checkpoint_whole(tmp_path, fault):
    world, path, result = 2, str(tmp_path / "ckpt"), str(tmp_path / "result")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_interrupted_save_job, args=(r, world, str(tmp_path / "store"), path, fault, result))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)  # a hang guard
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a rank hung"
    survivors = [0, 1] if fault == "full" else [0]
    for rank in survivors:
        with open(f"{result}.{rank}") as f:
            raised = json.load(f)["raised"]
        assert raised is not None and raised.startswith(("CheckpointError", "CollectiveError")), raised
        if fault == "full":
            assert "No space left on device" in raised, raised
    # The checkpoint of step 1, whole: it loads on one device and holds step 1's weights.
    model, optimizer = _single(0)
    extra = shardwise.load_checkpoint(path, model, optimizer)
    assert extra == {"step": 1}
    expected, _ = _single(1)
    ref = expected.state_dict()
    error = max(((v - ref[k]).abs().max() / ref[k].abs().max().clamp_min(1e-6)).item()
                for k, v in model.state_dict().items())
    assert error < 1e-10, error  # the pipeline's step 1 against one device's, in float64
    after_two, _ = _single(2)  # and not step 2's
    assert any(not torch.allclose(v, after_two.state_dict()[k]) for k, v in model.state_dict().items())


def test_a_save_stopped_between_its_two_renames_loads_the_previous_checkpoint(tmp_path):
    # save_checkpoint moves the previous checkpoint to .old, then the new one in: a process
    # killed between the two leaves only .old, which load_checkpoint takes.
    model, optimizer = _single(1)
    path = str(tmp_path / "ckpt")
    shardwise.save_checkpoint(path, model, optimizer, extra={"step": 1})
    os.replace(path, path + ".old")
    fresh, fresh_optimizer = _single(0)
    assert shardwise.load_checkpoint(path, fresh, fresh_optimizer) == {"step": 1}
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in fresh.state_dict().items())


RESTARTED_SCRIPT = """
import os, sys
import torch
import torch.distributed as dist
import shardwise
from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

dist.init_process_group("gloo")
ckpt, steps, die_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
model = TinyGPT(TinyGPTConfig(layers=2)).double()


def batch(step):
    ids = torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(100 + step))
    return ids, torch.roll(ids, -1, dims=1)


engine = shardwise.parallelize(model, batch(0), mesh=(2, 1))
optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-2)
start = shardwise.load_checkpoint(ckpt, engine, optimizer)["step"] if os.path.exists(ckpt) else 0
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
for step in range(start, steps):
    if step == die_at and attempt == 0 and dist.get_rank() == 1:
        os._exit(1)  # killed mid-run, on the first attempt only
    optimizer.zero_grad()
    loss = engine.train_step(*batch(step))
    optimizer.step()
    shardwise.save_checkpoint(ckpt, engine, optimizer, extra={"step": step + 1})
    if dist.get_rank() == 0:
        sys.stdout.write(f"step {step} loss {loss.item():.15e} attempt {attempt}\\n")
        sys.stdout.flush()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_restarts_a_killed_job_from_its_last_checkpoint_with_the_losses_of_an_uninterrupted_run(tmp_path):
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.fail("torchrun is not on PATH (it comes with torch)")
    script = tmp_path / "train.py"
    script.write_text(RESTARTED_SCRIPT)
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: torchrun otherwise shares its rendezvous store with
    # the workers, and a restarted attempt's init_process_group can read the dead attempt's
    # Gloo address (pytorch/pytorch#135712): here 2 of 4 restarts failed or hung that way
    # without it, 9 of 9 passed with it. The README's restart recipe sets it too.
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [os.path.join(os.path.dirname(__file__), "..", "..", "..", "python"),
                                                       os.environ.get("PYTHONPATH")]))}

    def run(name: str, die_at: int) -> dict[int, tuple[str, int]]:
        out = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                              "--monitor-interval", "0.5", str(script), str(tmp_path / name), "5", str(die_at)],
                             capture_output=True, text=True, env=env, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        steps = {}
        for line in out.stdout.splitlines():
            if line.startswith("step "):
                _, step, _, loss, _, attempt = line.split()
                steps[int(step)] = (loss, int(attempt))
        return steps

    whole = run("whole", die_at=-1)
    restarted = run("restarted", die_at=3)
    assert sorted(whole) == sorted(restarted) == [0, 1, 2, 3, 4], (whole, restarted)
    assert all(attempt == 0 for _, attempt in whole.values())
    assert [restarted[s][1] for s in range(5)] == [0, 0, 0, 1, 1], restarted  # steps 3 and 4 after the restart
    assert [whole[s][0] for s in range(5)] == [restarted[s][0] for s in range(5)], (whole, restarted)
