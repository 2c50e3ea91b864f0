"""The CUDA path: run with ``pytest -m gpu`` (scripts/gpu_check.sh does) on a machine with CUDA.

Every test here is skipped, with the reason, where ``torch.cuda.is_available()`` is false. On
a machine with one GPU:
 - the collectives of ``torch.ops.shardwise`` on NCCL (world 1: the only NCCL job one GPU
   takes) and on Gloo with CUDA tensors (2 ranks sharing the GPU: the host-staged path), with
   their autograd;
 - 2 and 4 processes sharing the GPU over Gloo, their tensors on CUDA: a data x tensor plan,
   pipelines (1F1B, interleaved), ZeRO, each against the same loop on one device (float64:
   the comparison is about the rewrite, not rounding), a float32 plan within 1e-5 and FSDP2's
   bf16 policy within bf16's rounding;
 - NCCL with one rank per GPU where there are several GPUs (skipped on one).
The step time, MFU and memory figures of GPT-2 124M on one GPU are a benchmark
(benchmarks/gpu.py), not a test: timing never fails a test.
"""
from __future__ import annotations

import copy
import json
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

import shardwise
from conftest import run_ranks, with_zero
from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig


def gpu(test):
    """A test of the CUDA path: ``pytest -m gpu`` selects it; skipped with the reason without CUDA."""
    needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                    reason="needs CUDA: torch.cuda.is_available() is false")
    return pytest.mark.gpu(needs_cuda(test))


TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-5}
BF16_TOLERANCE = 2e-2  # as tests/python/engine/test_training_loops.py states it for the bf16 policy
STEPS = 4


def _spawn(fn, world: int, *args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        run_ranks(fn, args=(world, os.path.join(tmp, "store"), result, *args), nprocs=world)
        with open(result) as f:
            return json.load(f)


# ---- collectives ---------------------------------------------------------------------------------
def _collectives(rank: int, world: int, store: str, result: str, backend: str) -> None:
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group(backend, store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        from shardwise import collectives as C

        errors = {}
        x = (torch.arange(2 * world * 3, dtype=torch.float64, device=device).reshape(2 * world, 3) + 100 * rank)
        every = [torch.arange(2 * world * 3, dtype=torch.float64, device=device).reshape(2 * world, 3) + 100 * r
                 for r in range(world)]

        def check(name, out, expected, grad, expected_grad):
            assert out.device == device and grad.device == device, (name, out.device, grad.device)
            errors[name] = max((out - expected).abs().max().item(), (grad - expected_grad).abs().max().item())

        for name, op, expected, expected_grad in [
            ("all_reduce", lambda t: C.all_reduce(t), sum(every), torch.ones_like(x)),
            ("copy_to_group", lambda t: C.copy_to_group(t), x, torch.full_like(x, world)),
            ("all_gather", lambda t: C.all_gather(t, dim=1), torch.cat(every, 1), torch.full_like(x, world)),
            ("reduce_scatter", lambda t: C.reduce_scatter(t, dim=0), sum(every).chunk(world, 0)[rank],
             torch.ones_like(x)),
            ("all_to_all", lambda t: C.all_to_all(t, split_dim=0, concat_dim=1),
             torch.cat([e.chunk(world, 0)[rank] for e in every], 1), torch.ones_like(x)),
        ]:
            leaf = x.clone().requires_grad_()
            out = op(leaf)
            out.sum().backward()
            check(name, out.detach(), expected, leaf.grad, expected_grad)
        if rank == 0:
            with open(result, "w") as f:
                json.dump({"errors": errors, "backend": dist.get_backend()}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@gpu
def test_nccl_collectives_and_their_gradients_at_world_one():
    r = _spawn(_collectives, 1, "nccl")
    assert r["backend"] == "nccl"
    assert all(e == 0 for e in r["errors"].values()), r


@gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL with several ranks needs one GPU per rank")
def test_nccl_collectives_and_their_gradients_on_every_gpu():
    r = _spawn(_collectives, torch.cuda.device_count(), "nccl")
    assert all(e == 0 for e in r["errors"].values()), r


@gpu
def test_gloo_collectives_on_cuda_tensors_of_ranks_sharing_one_gpu():
    """Gloo on CUDA tensors: each op through host memory, its result back on the GPU."""
    r = _spawn(_collectives, 2, "gloo")
    assert r["backend"] == "gloo"
    assert all(e == 0 for e in r["errors"].values()), r


# ---- engines on a shared GPU ----------------------------------------------------------------------
def _pipeline_plan(stages: int, schedule: str, virtual_stages: int, global_batch: int) -> str:
    return json.dumps({"format": "shardwise.plan", "version": 1, "data": 1, "tensor": 1, "pipeline": stages,
                       "global_batch": global_batch, "micro_batch": 2, "schedule": schedule,
                       "virtual_stages": virtual_stages, "kfkb_k": 1, "recompute": "none", "zero_stage": 0,
                       "layers_per_stage": [], "precision": "f32"})


def _batch(device, rows: int = 8, seq: int = 32, vocab: int = 256):
    ids = torch.randint(0, vocab, (rows, seq), generator=torch.Generator().manual_seed(1)).to(device)
    return ids, torch.roll(ids, -1, dims=1)


def _train(rank: int, world: int, store: str, result: str, spec: dict) -> None:
    device = torch.device(spec.get("device", "cuda"), 0)  # every rank on the one GPU
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if spec.get("host_staged"):  # the CPU test of the staged path: every runtime call staged
        from shardwise.runtime import transport

        transport.on_host = lambda tensor, group=None: True
        staged = transport._Staged.__init__

        def counted(self, *args):
            spec["staged"] = spec.get("staged", 0) + 1
            staged(self, *args)

        transport._Staged.__init__ = counted
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        dtype = getattr(torch, spec["dtype"])
        torch.manual_seed(0)
        model = TinyGPT(TinyGPTConfig(layers=4)).to(device=device, dtype=dtype)
        reference = copy.deepcopy(model)
        batch = _batch(device)
        plan = shardwise.Plan.from_json(spec["plan"]) if spec.get("plan") else None
        if spec.get("collective_matmul"):  # the search's plan with its tensor-parallel collectives in rings
            plan = shardwise.plan(shardwise.capture(model, batch), shardwise.Cluster.preset("cpu", world),
                                  global_batch=batch[0].shape[0], mesh=tuple(spec["mesh"]), precision="f32",
                                  collective_matmul=True)
            spec = {k: v for k, v in spec.items() if k != "mesh"}
        policy = None
        if spec.get("bf16"):
            policy = torch.distributed.fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                 reduce_dtype=torch.float32)
        engine = shardwise.parallelize(model, batch, plan=plan, mesh=tuple(spec["mesh"]) if spec.get("mesh") else None,
                                       cluster=shardwise.Cluster.preset("cpu", world), mixed_precision=policy)
        if spec.get("zero"):  # ZeRO set by hand on the searched plan (conftest.with_zero)
            engine = shardwise.parallelize(model, batch, plan=with_zero(engine.plan), mixed_precision=policy)
        optimizer_type, kwargs = ((torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}) if spec.get("bf16")
                                  else (torch.optim.AdamW, {"lr": 1e-2}))
        optimizer = engine.optimizer(optimizer_type, **kwargs)
        ref_optimizer = optimizer_type(reference.parameters(), **kwargs)
        losses, ref_losses = [], []
        for _ in range(STEPS):
            optimizer.zero_grad()
            loss = engine.train_step(*batch)
            assert loss.device.type == device.type, loss.device
            losses.append(loss.item())
            optimizer.step()
            ref_optimizer.zero_grad()
            if spec.get("bf16"):
                cast = {n: p.to(torch.bfloat16) for n, p in reference.named_parameters()}
                ref_loss = torch.func.functional_call(reference, cast, batch)
            else:
                ref_loss = reference(*batch)
            ref_loss.backward()
            ref_optimizer.step()
            ref_losses.append(ref_loss.item())
        full = engine.full_state_dict()
        devices = sorted({t.device.type for t in full.values()} | {p.device.type for p in engine.parameters()})
        param_error = max(((full[k] - p).abs().max() / p.abs().max().clamp_min(1e-6)).item()
                          for k, p in reference.named_parameters())
        if rank == 0:
            with open(result, "w") as f:
                json.dump({"engine": type(engine).__name__, "devices": devices, "losses": losses,
                           "ref_losses": ref_losses, "param_error": param_error,
                           "loss_error": max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)),
                           "mesh": (engine.plan.sharding or {}).get("mesh"),
                           "zero": (engine.plan.sharding or {}).get("zero"), "staged": spec.get("staged", 0),
                           "rings": engine.code.count("self.collective_matmul(") if hasattr(engine, "rank_ir") else 0},
                          f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _check(r: dict, tolerance: float, device: str = "cuda") -> None:
    print(f"{device}: {r['engine']} losses {r['loss_error']:.1e}, parameters {r['param_error']:.1e}")
    assert r["devices"] == [device], r  # nothing the engine holds left the model's device
    assert r["loss_error"] < tolerance and r["param_error"] < tolerance, r


@gpu
def test_data_by_tensor_plan_on_four_ranks_sharing_one_gpu_equals_one_device():
    r = _spawn(_train, 4, {"dtype": "float64", "mesh": [2, 2]})
    _check(r, TOLERANCE[torch.float64])
    assert r["mesh"] == [2, 2]


@gpu
def test_data_by_tensor_plan_in_float32_within_1e_5():
    # Losses only: in float32, AdamW turns rounding noise on gradients that are zero in theory
    # (attention's key bias) into lr-sized steps (tests/python/engine/test_parallelize.py says more).
    r = _spawn(_train, 4, {"dtype": "float32", "mesh": [2, 2]})
    print(f"cuda float32: losses {r['loss_error']:.1e}")
    assert r["devices"] == ["cuda"] and r["loss_error"] < TOLERANCE[torch.float32], r


@gpu
@pytest.mark.parametrize("schedule,virtual_stages", [("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zb-v", 2),
                                                     ("dualpipe-v", 2)])
def test_pipeline_on_two_ranks_sharing_one_gpu_equals_one_device(schedule, virtual_stages):
    r = _spawn(_train, 2, {"dtype": "float64", "plan": _pipeline_plan(2, schedule, virtual_stages, 8)})
    _check(r, TOLERANCE[torch.float64])
    assert r["engine"] == "PipelineEngine", r


@gpu
def test_collective_matmul_on_two_ranks_sharing_one_gpu_equals_one_device():
    # The rings' sends and receives of CUDA tensors over Gloo go through host copies
    # (runtime/collective_matmul.py, _Ring.exchange). (On 4 ranks the search keeps this
    # TinyGPT's collectives plain: no ring to test.)
    r = _spawn(_train, 2, {"dtype": "float64", "mesh": [1, 2], "collective_matmul": True})
    _check(r, TOLERANCE[torch.float64])
    assert r["rings"] > 0, r


@gpu
def test_zero_on_four_ranks_sharing_one_gpu_equals_one_device():
    r = _spawn(_train, 4, {"dtype": "float64", "mesh": [2, 2], "zero": True})
    _check(r, TOLERANCE[torch.float64])
    assert r["zero"], "the plan shards some optimizer state"


@gpu
def test_bf16_policy_on_two_ranks_sharing_one_gpu_within_bf16_rounding():
    r = _spawn(_train, 2, {"dtype": "float32", "mesh": [2, 1], "bf16": True})
    print(f"cuda bf16 policy: losses {r['loss_error']:.1e}, parameters {r['param_error']:.1e}")
    assert r["devices"] == ["cuda"], r
    assert r["loss_error"] < BF16_TOLERANCE and r["param_error"] < BF16_TOLERANCE, r


def _checkpoint(rank: int, world: int, store: str, result: str, spec: dict) -> None:
    """Train, save, train on; a new engine loads the checkpoint and trains the same steps; one
    device loads it too. Every tensor on the GPU."""
    device = torch.device(spec.get("device", "cuda"), 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        path = os.path.join(os.path.dirname(store), "ckpt")
        batch = _batch(device)

        def engine_and_optimizer():
            torch.manual_seed(0)
            model = TinyGPT(TinyGPTConfig(layers=2)).to(device=device, dtype=torch.float64)
            engine = shardwise.parallelize(model, batch, mesh=(2, 2), cluster=shardwise.Cluster.preset("cpu", world))
            return engine, engine.optimizer(torch.optim.AdamW, lr=1e-2)

        def steps(engine, optimizer, n):
            out = []
            for _ in range(n):
                optimizer.zero_grad()
                out.append(engine.train_step(*batch).item())
                optimizer.step()
            return out

        engine, optimizer = engine_and_optimizer()
        steps(engine, optimizer, 2)
        shardwise.save_checkpoint(path, engine, optimizer, extra={"step": 2})
        saved = {k: v.cpu() for k, v in engine.full_state_dict().items()}
        after = steps(engine, optimizer, 2)
        again, again_optimizer = engine_and_optimizer()
        extra = shardwise.load_checkpoint(path, again, again_optimizer)
        resumed = steps(again, again_optimizer, 2)
        devices = sorted({p.device.type for p in again.parameters()})
        one = TinyGPT(TinyGPTConfig(layers=2)).to(device=device, dtype=torch.float64)
        shardwise.load_checkpoint(path, one)  # collective: every rank loads the whole model
        loaded_error = max((one.state_dict()[k].cpu() - v).abs().max().item() for k, v in saved.items())
        if rank == 0:
            with open(result, "w") as f:
                json.dump({"after": after, "resumed": resumed, "extra": extra, "devices": devices,
                           "one_device": str(next(one.parameters()).device.type), "loaded_error": loaded_error}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@gpu
def test_checkpoint_of_a_cuda_engine_resumes_exactly_and_loads_on_one_device():
    r = _spawn(_checkpoint, 4, {})
    print(f"cuda checkpoint: resumed losses {r['resumed']} against {r['after']}")
    assert r["resumed"] == r["after"], r  # bit for bit: the same state, the same steps
    assert r["extra"]["step"] == 2 and r["devices"] == ["cuda"] and r["one_device"] == "cuda", r
    assert r["loaded_error"] == 0, r


# ---- this round's runtime on a shared GPU ----------------------------------------------------------
# The distributed kernels, the prefetched / released / gathered-again parameters and the
# recomputed blocks, each the CPU suite's own case (its model, batch and plan) moved onto the
# GPU: 2 ranks over Gloo (the kernels' collectives host-staged), float64, against the same loop
# on the GPU. Each also asserts the rank program has the feature, so a plan that stopped
# using it would fail here rather than pass vacuously.
def _round_case(name: str, world: int):
    """(model factory, batch of step k, plan factory, what the rank program must hold)."""
    if name == "kernels":
        import test_distributed_kernels as case

        return (lambda: case._model("statistics"), lambda step: case._batch("statistics", step),
                lambda: case._plan("statistics", world, (1, world)),
                [f"shardwise::{kernel}(" for kernel in case.KERNELS])
    if name == "gathers":
        import test_parameter_gathers as case

        def plan():
            graph = shardwise.capture(case._model(), case._batch(0))
            cluster = case.tight_cluster(graph, world, case.ROWS, (world, 1))
            return shardwise.plan(graph, cluster, global_batch=case.ROWS, mesh=(world, 1),
                                  precision=case.TIGHT_PRECISION, zero=False)

        return case._model, case._batch, plan, ['overlap="forward"', "regather=true"]
    if name == "async":
        import test_async_gradients as case

        return case._model, case._batch, lambda: case._megatron_plan(world), ["shardwise.async_gradient="]
    import test_recompute as case

    def plan():
        searched = shardwise.parallelize(case._model(), case._batch(0), mesh=(world, 1),
                                         cluster=shardwise.Cluster.preset("cpu", world), verify=False).plan
        doc = json.loads(searched.to_json())
        doc.pop("predicted", None)
        doc.pop("programs", None)
        doc["sharding"]["recompute"] = True
        return shardwise.Plan.from_json(json.dumps(doc))

    return case._model, case._batch, plan, ["shardwise.recompute="]


def _round(rank: int, world: int, store: str, result: str, spec: dict) -> None:
    device = torch.device(spec.get("device", "cuda"), 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        from conftest import train_one_device

        model_of, batch_of, plan_of, marks = _round_case(spec["case"], world)
        on_device = lambda step: tuple(t.to(device) for t in batch_of(step))  # noqa: E731
        engine = shardwise.parallelize(model_of().to(device), on_device(0), plan=plan_of())
        optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-2)
        torch.manual_seed(5)  # dropout's generator, the same for both runs
        losses = []
        for step in range(3):
            losses.append(float(engine.train_step(*on_device(step))))
            optimizer.step()
            optimizer.zero_grad()
        state = engine.full_state_dict()
        reference = model_of().to(device)
        torch.manual_seed(5)
        ref_losses = train_one_device(reference, on_device, 3, torch.optim.AdamW(reference.parameters(), lr=1e-2))
        if rank == 0:
            with open(result, "w") as f:
                json.dump({"devices": sorted({t.device.type for t in state.values()}
                                             | {p.device.type for p in engine.parameters()}),
                           "loss_error": max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)),
                           "param_error": max(((state[n] - p).abs().max() / p.abs().max().clamp_min(1e-6)).item()
                                              for n, p in reference.named_parameters()),
                           "missing": [m for m in marks if m not in engine.rank_ir],
                           "whole": engine.whole_nodes}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _check_round(r: dict, device: str) -> None:
    print(f"{device}: losses {r['loss_error']:.1e}, parameters {r['param_error']:.1e}")
    assert r["missing"] == [], r  # the rank program runs the feature under test
    assert r["devices"] == [device], r
    assert r["loss_error"] < TOLERANCE[torch.float64] and r["param_error"] < TOLERANCE[torch.float64], r


@gpu
@pytest.mark.parametrize("case", ["kernels", "gathers", "recompute", "async"])
def test_this_rounds_runtime_on_two_ranks_sharing_one_gpu_equals_one_device(case):
    """kernels: layer norm, RMS norm, softmax, log-softmax and nll split over their dim;
    gathers: weights sharded over the data axis, prefetched and gathered again in backward;
    recompute: transformers GPT-2 with dropout on, each layer checkpointed; async: a
    column-parallel linear's input gradient all-reduced beside its weight gradient (host-staged
    on Gloo)."""
    if case == "recompute":
        pytest.importorskip("transformers")
    r = _spawn(_round, 2, {"case": case})
    _check_round(r, "cuda")
    if case == "kernels":
        assert r["whole"] == [], r


# ---- the host-staged path on this CPU machine -------------------------------------------------------
# runtime/transport.py stages a Gloo call through host memory when the tensor is off the CPU.
# Here every runtime call is staged (on_host forced true): a pipeline's sends, receives and loss
# broadcast, the gradient buckets' asynchronous all-reduces and ZeRO's parameter broadcasts take
# the staged path and must still equal one device. (The C++ ops' staging needs a CUDA tensor.)
@pytest.mark.parametrize("spec", [
    {"plan": _pipeline_plan(2, "1f1b", 1, 8)},
    {"plan": _pipeline_plan(2, "dualpipe-v", 2, 8)},
    {"mesh": [2, 1]},
    {"mesh": [1, 2], "collective_matmul": True},
], ids=["pipeline-1f1b", "pipeline-dualpipe-v", "data-parallel-buckets", "collective-matmul-rings"])
def test_host_staged_runtime_calls_equal_one_device_on_cpu(spec):
    r = _spawn(_train, 2, {"dtype": "float64", "device": "cpu", "host_staged": True, **spec})
    _check(r, TOLERANCE[torch.float64], device="cpu")
    assert r["staged"] > 0, r  # the calls did take the staged path
    if spec.get("collective_matmul"):
        assert r["rings"] > 0, r


def test_host_staged_zero_broadcasts_equal_one_device_on_cpu():
    r = _spawn(_train, 4, {"dtype": "float64", "device": "cpu", "host_staged": True, "mesh": [2, 2], "zero": True})
    _check(r, TOLERANCE[torch.float64], device="cpu")
    assert r["zero"] and r["staged"] > 0, r


@gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="FP8 matrix units need compute capability 8.9 or later (Ada, Hopper)")
def test_an_fp8_linear_on_cuda_equals_its_dequantized_operands_product():
    """runtime/fp8.py's product on CUDA (rowwise scales, bf16 output, the bias added after):
    equal to the float8 operands dequantized and multiplied in float64, within bf16 rounding;
    its backward runs and dW is the unquantized product."""
    from shardwise.runtime import fp8

    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 512, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with fp8.one_device():
        y = layer(x)
    x_q, x_s = fp8.quantize(x, 1)
    w_q, w_s = fp8.quantize(layer.weight, 1)
    expected = (x_q.double() * x_s.double()) @ (w_q.double() * w_s.double()).t() + layer.bias.double()
    assert torch.allclose(y.double(), expected, rtol=1e-2, atol=1e-2)
    y.sum().backward()
    grad = torch.ones(64, 512, device="cuda", dtype=torch.bfloat16)
    assert torch.allclose(layer.weight.grad.float(), (grad.t().float() @ x.detach().float()), rtol=1e-2, atol=1e-1)
    assert x.grad is not None and torch.isfinite(x.grad).all()
