"""Rank programs run through torch.compile (``parallelize(..., compile=...)``, runtime/compiled.py;
issue 49, in part): the same training as eager and as one device, on real Gloo ranks.

AOTAutograd's graphs (backend "aot_eager": the program traced forward and backward, through
the shardwise collectives, and run by the ATen ops it traced) give one device's numbers to
float64 rounding. Inductor's kernels are its own arithmetic: on one device, transformers'
GPT-2 compiled gives the token embedding's gradient 5e-8 relative away from eager's (its
embedding backward), so a compiled engine is held to the eager engine within 1e-6, not 1e-10.
"""
from __future__ import annotations

import pytest
import torch

from conftest import parameter_error, refusal, spawn_scenario, without_call_overhead

STEPS, ROWS = 3, 4


def _batch(step: int):
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 96, (ROWS, 16), generator=g)
    return {"input_ids": ids, "labels": ids}


def _model(layers: int = 2):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=32, n_head=4, vocab_size=96, n_positions=32,
                                  resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    return transformers.GPT2LMHeadModel(cfg).double().train()


def _train(engine) -> list[float]:
    optimizer = engine.optimizer(torch.optim.SGD, lr=0.1)
    losses = []
    for step in range(STEPS):
        losses.append(float(engine.train_step(**_batch(step))))
        optimizer.step()
        optimizer.zero_grad()
    return losses


def _reference_losses(layers: int) -> tuple[list[float], torch.nn.Module]:
    reference = _model(layers)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        loss = reference(**_batch(step)).loss
        loss.backward()
        losses.append(float(loss))
        optimizer.step()
        optimizer.zero_grad()
    return losses, reference


def _plan(world: int, recompute: bool | str):
    """The search's plan on a tensor axis of `world` (the program's collectives: the reshards
    between its ops), its repeated blocks recomputed in backward where `recompute` says."""
    import json

    import shardwise

    # Links without Gloo's per-call overhead: with it, a model this small is best computed
    # whole on every rank, with no collective to compile.
    cluster = without_call_overhead(shardwise.Cluster.preset("cpu", world))
    searched = shardwise.parallelize(_model(), _batch(0), mesh=(1, world), cluster=cluster, verify=False).plan
    doc = json.loads(searched.to_json())
    for key in ("predicted", "programs"):
        doc.pop(key, None)
    doc["sharding"]["recompute"] = recompute
    return shardwise.Plan.from_json(json.dumps(doc))


def _scenario_compiled(rank: int, world: int, compile_option, recompute: bool | str) -> dict:
    import shardwise

    plan = _plan(world, recompute)
    out = {}
    for key, option in (("eager", False), ("compiled", compile_option)):
        engine = shardwise.parallelize(_model(), _batch(0), plan=plan, compile=option)
        out[key] = {"losses": _train(engine), "state": engine.full_state_dict()}
        if key == "compiled":
            run = engine._first.run
            out["compiled_once"] = run.compile_seconds is not None and run.module is engine.module
            out["code"] = "reshard" in engine.code or "all_reduce" in engine.code
            out["marks"] = ["shardwise.recompute=" in engine.rank_ir, "shardwise.recompute_keeps" in engine.rank_ir]
    ref_losses, reference = _reference_losses(2)
    return {"ref_losses": ref_losses,
            **{key: {"losses": run["losses"], "error": parameter_error(run["state"], reference)}
               for key, run in out.items() if key in ("eager", "compiled")},
            "compiled_once": out["compiled_once"], "code": out["code"], "marks": out["marks"]}


@pytest.mark.parametrize("option, tolerance, recompute", [({"backend": "aot_eager"}, 1e-10, False),
                                                           ({"backend": "aot_eager"}, 1e-10, True),
                                                           ({"backend": "aot_eager"}, 1e-10, "selective"),
                                                           (True, 1e-6, False)],
                         ids=["aot_eager", "aot_eager-recomputed", "aot_eager-selective", "inductor"])
@pytest.mark.slow
def test_a_compiled_tensor_parallel_program_trains_as_one_device(option, tolerance, recompute):
    r = spawn_scenario(__name__, 2, "compiled", option, recompute)
    assert r["compiled_once"] and r["code"], r
    assert r["marks"] == [bool(recompute), recompute == "selective"], r  # the plan runs its recomputation
    for key, bound in (("eager", 1e-10), ("compiled", tolerance)):
        for a, b in zip(r[key]["losses"], r["ref_losses"]):
            assert abs(a - b) <= bound * abs(b), (key, r[key]["losses"], r["ref_losses"])
        assert r[key]["error"] < bound, (key, r[key]["error"])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_a_count_divides_as_a_tensor_as_it_does_as_a_float(dtype):
    """A compiled program takes a counted loss' count as a 0-dim float64 tensor (no recompile at
    each new count): the quotient and its gradient equal the float's bit for bit, at counts no
    reduced precision holds (1001, a class-weighted 7.3) as well as at one it does."""
    from shardwise.runtime.lower import divide_by_count

    total = torch.tensor([123.456, -0.1, 5e3], dtype=torch.float64).to(dtype).sum()
    for count in (42.0, 1001.0, 7.3):
        eager = total.clone().requires_grad_(True)
        tensor = total.clone().requires_grad_(True)
        a, b = divide_by_count(eager, count), divide_by_count(tensor, torch.tensor(count, dtype=torch.float64))
        assert a.dtype == b.dtype == dtype and torch.equal(a, b), (count, a, b)
        a.backward(torch.tensor(3.7, dtype=dtype))
        b.backward(torch.tensor(3.7, dtype=dtype))
        assert torch.equal(eager.grad, tensor.grad), (count, eager.grad, tensor.grad)


def test_compile_options_are_checked_before_any_work():
    from shardwise._C import ValidationError
    from shardwise.runtime.compiled import compile_options

    assert compile_options(False) is None and compile_options(None) is None
    assert compile_options(True) == {}
    assert compile_options("max-autotune") == {"mode": "max-autotune"}
    assert compile_options({"backend": "aot_eager", "dynamic": False}) == {"backend": "aot_eager", "dynamic": False}
    for bad, words in (("fastest", "not one of torch.compile's modes"), ({"backnd": "x"}, "['backnd']"),
                       ({"mode": "turbo"}, "'turbo'"), (3, "give True")):
        with pytest.raises(ValidationError, match=words.replace("[", r"\[").replace("]", r"\]")):
            compile_options(bad)


def _pipeline_plan(world: int, schedule: str, virtual: int, data: int = 1, **options):
    import shardwise

    graph = shardwise.capture(_model(2 * virtual), {k: v[:data] for k, v in _batch(0).items()})
    return shardwise.Plan.manual(graph, shardwise.Cluster.preset("cpu", world), pipeline=world // data, data=data,
                                 tensor=1, global_batch=ROWS, micro_batch=1, schedule=schedule,
                                 virtual_stages=virtual, **options)


def _scenario_pipeline(rank: int, world: int, schedule: str, virtual: int, data: int, fused: bool,
                       compile_option) -> dict:
    """A pipelined plan's stages (or, at data = world, one stage's micro-batches on a data
    axis), eager and compiled (`compile_option`), against one device: trained, then evaluated (the
    eval program's stages, compiled on their first call too)."""
    import shardwise

    plan = _pipeline_plan(world, schedule, virtual, data).with_fused_accumulation(fused)
    out = {}
    for key, option in (("eager", False), ("compiled", compile_option)):
        engine = shardwise.parallelize(_model(2 * virtual), _batch(0), plan=plan, compile=option)
        losses = _train(engine)
        engine.eval()
        losses.append(float(engine.eval_step(**_batch(STEPS))))
        out[key] = {"losses": losses, "state": engine.full_state_dict(), "fused": engine.plan.fused_accumulation}
        if key == "compiled":
            report = engine.compile_report()
            out["stages"] = len(report)
            out["all_compiled"] = all(entry["compile_seconds"] is not None and entry["graph_breaks"] is not None
                                      and "virtual stage" in entry["program"] for entry in report)
    ref_losses, reference = _reference_losses(2 * virtual)
    reference.eval()
    with torch.no_grad():
        ref_losses.append(float(reference(**_batch(STEPS)).loss))
    return {"ref_losses": ref_losses, "stages": out["stages"], "all_compiled": out["all_compiled"],
            **{key: {"losses": run["losses"], "error": parameter_error(run["state"], reference), "fused": run["fused"]}
               for key, run in out.items() if key in ("eager", "compiled")}}


AOT = {"backend": "aot_eager"}


@pytest.mark.parametrize("schedule, virtual, data, fused, option, tolerance",
                         [("1f1b", 1, 1, True, AOT, 1e-10), ("interleaved-1f1b", 2, 1, False, AOT, 1e-10),
                          ("1f1b", 1, 2, True, AOT, 1e-10), ("1f1b", 1, 1, True, True, 1e-6)],
                         ids=["1f1b", "interleaved", "data-2-in-micro-batches", "inductor"])
@pytest.mark.slow
def test_a_compiled_pipeline_trains_as_one_device(schedule, virtual, data, fused, option, tolerance):
    r = spawn_scenario(__name__, 2, "pipeline", schedule, virtual, data, fused, option)
    assert r["all_compiled"] and r["stages"] == 2 * virtual, r  # training's stages and eval's, each compiled
    # Compiled stages accumulate weight gradients through the compiled backward, not in place.
    assert r["eager"]["fused"] == fused and r["compiled"]["fused"] is False, r
    for a, b in zip(r["compiled"]["losses"], r["eager"]["losses"]):
        assert abs(a - b) <= (1e-12 if option is AOT else tolerance) * abs(b), (r["compiled"]["losses"],
                                                                               r["eager"]["losses"])
    for key, bound in (("eager", 1e-10), ("compiled", tolerance)):
        # transformers' loss is float32 (it casts the logits): a mean of micro-batch losses
        # rounds otherwise than the batch's; the parameters are float64's to rounding (inductor:
        # its own kernels, as in the tensor-parallel test above).
        for a, b in zip(r[key]["losses"], r["ref_losses"]):
            assert abs(a - b) <= 1e-6 * abs(b), (key, r[key]["losses"], r["ref_losses"])
        assert r[key]["error"] < bound, (key, r[key]["error"])


def _scenario_split_backward(rank: int, world: int) -> dict:
    import shardwise

    plan = _pipeline_plan(world, "zb-h1", 1, recompute="none")
    return {"error": refusal(lambda: shardwise.parallelize(_model(2), _batch(0), plan=plan, compile=True))}


def test_a_zero_bubble_split_backward_with_compile_is_refused_not_run_eagerly():
    r = spawn_scenario(__name__, 2, "split_backward")
    assert r["error"] is not None and "B/W split of zero-bubble schedules" in r["error"], r
    assert "zb-h1" in r["error"].lower(), r


def _scenario_other_programs(rank: int, world: int) -> dict:
    """Train, evaluate (the eval program), a shorter last batch (captured again) and train on:
    each new program compiled on its first call, eager's losses."""
    import shardwise

    losses = {}
    for key, option in (("eager", False), ("compiled", {"backend": "aot_eager"})):
        engine = shardwise.parallelize(_model(), _batch(0), mesh=(1, world), compile=option)
        optimizer = engine.optimizer(torch.optim.SGD, lr=0.1)
        out = [float(engine.train_step(**_batch(0)))]
        optimizer.step()
        optimizer.zero_grad()
        engine.eval()
        out.append(float(engine.eval_step(**_batch(1))))
        engine.train()
        out.append(float(engine.train_step(**{k: v[:2] for k, v in _batch(2).items()})))
        optimizer.step()
        optimizer.zero_grad()
        out.append(float(engine.train_step(**_batch(3))))
        losses[key] = out
        if key == "eager":
            eager_report = engine.compile_report()
        else:
            report = engine.compile_report()
            losses["programs"] = len(report)
            losses["all_compiled"] = all(entry["compile_seconds"] is not None for entry in report)
            losses["eager_report"] = eager_report
    return losses


def test_the_eval_program_and_another_batch_shape_are_compiled_too():
    r = spawn_scenario(__name__, 2, "other_programs")
    assert r["programs"] == 3 and r["all_compiled"], r  # training, eval, the shorter batch's training
    assert r["eager_report"] == [], r  # an eager engine compiles nothing
    for a, b in zip(r["compiled"], r["eager"]):
        assert abs(a - b) <= 1e-12 * abs(b), r


def test_importing_shardwise_does_not_import_dynamo():
    """Compilation's pieces are made when a program is first compiled: torch._dynamo costs most
    of a second to import, which every rank of every job would pay."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys, shardwise, shardwise.runtime.spmd_engine; "
                          "print('torch._dynamo' in sys.modules)"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
