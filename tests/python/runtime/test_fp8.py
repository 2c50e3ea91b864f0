"""FP8 linear layers (a plan's precision "fp8"): each linear layer's products with its weight
run in float8 through torch._scaled_mm with rowwise power-of-two scales, the weight gradient
and everything else in the model's dtype (csrc/analysis/fp8_linears.h, runtime/fp8.py).

transformers GPT-2 (Conv1D: addmm, and the tied head: linear) and LLaMA (grouped-query
attention), float32, on Gloo ranks: data 2, tensor 2, pipeline 2 (1F1B recomputed, and ZB-H1's
split backward) and data 2 x tensor 2
(the tensor plans searched with too little memory for whole weights: split on the tensor axis),
against the same FP8 arithmetic on one device (``runtime.fp8.one_device``) over 3 AdamW steps.
A scale depends only on its own row's (or column's) amax, taken over every rank that holds a
part of that row, so the float8 operands are the ones one device makes, and what differs is
the order float32 sums run in (a row-parallel product summed over ranks, gradients reduced
over the batch): losses and parameters within FP8_TOLERANCE. The plain float32 run differs
from the FP8 one by far more than that, so an FP8 plan that ran in float32 fails.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

import shardwise
from conftest import (TIGHT_PRECISION, op_counts, parameter_error, spawn_scenario, tight_cluster, tight_plan,
                      train_engine_counting_ops, train_one_device, zero3_plan)
from rank_ir_check import engine_against_rank_ir
from shardwise.runtime.compiled import runs_eagerly
from shardwise.models import CausalLMWithLoss
from shardwise.runtime import fp8
from shardwise.runtime.collective_matmul import CollectiveMatmul

transformers = pytest.importorskip("transformers")

STEPS, ROWS, SEQ, VOCAB = 3, 4, 16, 96
FP8_TOLERANCE = 1e-4  # relative, losses: float32 sums in another order (the docstring)
# Parameters after 3 AdamW steps, relative to each tensor's largest magnitude: Adam divides by
# the root of the squared gradient, so an element whose gradient is near zero moves by up to lr
# whatever its size, and float32 rounding there shows at 1e-4 (the float32 run against float32
# on one device does the same). The CPU's float8 product need not sum a block of 2 rows in the
# order it sums 4: on an AMD EPYC, GPT-2 split into 2-row blocks (data, pipeline, ZB-H1) is
# 8.6e-3 off (an Intel Xeon: below 1e-3; LLaMA 1e-5 on both), a few elements of near-zero
# gradient moved by Adam a fraction of lr. The float32 run's parameters differ from the FP8
# reference's by at least FLOAT32_GAP x this (measured 0.55 to 1.09): the run is FP8's arithmetic.
PARAMETER_TOLERANCE = 1e-2
FLOAT32_GAP = 5.0  # losses: the float32 run's differ from the FP8 one's by 5x FP8_TOLERANCE or more


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return CausalLMWithLoss(transformers.GPT2LMHeadModel(cfg)).train()


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=32, use_cache=False)
    return CausalLMWithLoss(transformers.LlamaForCausalLM(cfg)).train()


_MODELS = {"gpt2": _gpt2, "llama": _llama}
# 1F1B with its blocks recomputed (the product in float8 runs again in backward), and ZB-H1
# (the backward split into B and W: the weight gradient later, runtime/weight_split.py).
_SCHEDULES = {"pipeline": "1f1b", "zero-bubble": "zb-h1"}


def _batch(step: int):
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=g)
    return ids, ids.clone()


def _fp8_engine(model_of, layout: str, world: int, compile: bool = False):
    cluster = shardwise.Cluster.preset("cpu", world)
    if layout in _SCHEDULES:
        graph = shardwise.capture(model_of(), tuple(t[:ROWS // 2] for t in _batch(0)))  # one micro-batch
        plan = shardwise.Plan.manual(graph, cluster, pipeline=world, data=1, tensor=1, global_batch=ROWS,
                                     micro_batch=ROWS // 2, schedule=_SCHEDULES[layout], precision="fp8",
                                     recompute=layout == "pipeline")
        return shardwise.parallelize(model_of(), _batch(0), plan=plan)
    if layout == "zero3":  # every weight sharded on the data axis, gathered for its read
        return shardwise.parallelize(model_of(), _batch(0), plan=_zero3(shardwise.capture(model_of(), _batch(0)), world,
                                                                        "fp8"), compile=compile)
    if layout == "ring":  # tensor parallelism with its collectives run inside the products (collective matmul)
        graph = shardwise.capture(model_of(), _batch(0))
        searched = shardwise.plan(graph, tight_cluster(graph, world, ROWS, (1, world)), global_batch=ROWS,
                                  mesh=(1, world), precision=TIGHT_PRECISION, zero=False, recompute=False,
                                  collective_matmul=True)
    elif layout == "data":
        searched = shardwise.parallelize(model_of(), _batch(0), mesh=(world, 1), cluster=cluster, verify=False,
                                         precision="fp8").plan
    else:  # memory that holds the model only with its weights split on the tensor axis
        searched = tight_plan(shardwise.capture(model_of(), _batch(0)), world, ROWS, (1, 2) if world == 2 else (2, 2))
    doc = json.loads(searched.to_json())
    for key in ("predicted", "programs"):
        doc.pop(key, None)
    doc["precision"] = "fp8"
    return shardwise.parallelize(model_of(), _batch(0), plan=shardwise.Plan.from_json(json.dumps(doc)),
                                 compile=compile)


def _fp8_rings(irs: list[str]) -> int:
    """The FP8 linears of these rank IRs that run a ring (their products in float8 inside
    collective_matmul)."""
    return sum(1 for ir in irs for line in ir.splitlines() if "shardwise.fp8_k_axes=" in line and (
        "shardwise.gather_matmul=" in line or "shardwise.matmul_scatter=" in line))


def _scenario_fp8(rank: int, world: int, model_name: str, layout: str) -> dict:
    model_of = _MODELS[model_name]
    engine = _fp8_engine(model_of, layout, world)
    losses, counts = train_engine_counting_ops(engine, _batch, STEPS)
    state = engine.full_state_dict()
    code = engine.code
    # self.fp8_linear('aten::linear', k_axes, n_axes, ...), or through self.regather(fp8_linear_<i>, (...)
    # where its weight is gathered again in backward.
    calls = re.findall(r"fp8_linear(?:\(|_\d+, \()'aten::\w+', (\([^)]*\)), (\([^)]*\))", code)
    plan = json.loads(engine.plan.to_json())
    placements = (plan.get("sharding") or {}).get("placements", {})
    split_on_tensor = sum(1 for name, p in placements.items() if name.endswith("weight") and p[-1] != "R")

    reference = model_of()
    with fp8.one_device():
        ref_losses = train_one_device(reference, _batch, STEPS, torch.optim.AdamW(reference.parameters(), lr=1e-2))
    plain = model_of()
    f32_losses = train_one_device(plain, _batch, STEPS, torch.optim.AdamW(plain.parameters(), lr=1e-2))
    irs = list(engine.stage_rank_irs.values()) if hasattr(engine, "stage_rank_irs") else [engine.rank_ir]
    return {"losses": losses, "ref_losses": ref_losses, "f32_losses": f32_losses,
            # The program that ran is its rank IR, node for node: an FP8 call exactly where
            # the IR marks an FP8 linear, with the marked axes (rank_ir_check.py).
            "lowered": engine_against_rank_ir(engine), "fp8_marks": sum(ir.count("shardwise.fp8_k_axes=") for ir in irs),
            "fp8_rings": _fp8_rings(irs),
            "error": parameter_error(state, reference),
            "f32_error": parameter_error(dict(plain.named_parameters()), reference),
            "scaled_mm": counts["aten._scaled_mm"], "mm": counts["aten.mm"] + counts["aten.addmm"],
            "fp8_calls": len(calls), "amax_axes": sum(1 for k, n in calls if k != "()" or n != "()"),
            "split_on_tensor": split_on_tensor}


@pytest.mark.parametrize("model_name", ["gpt2", "llama"])
@pytest.mark.parametrize("layout,world", [("data", 2), ("tensor", 2), ("pipeline", 2), ("zero-bubble", 2),
                                          ("2x2", 4)])
def test_fp8_plans_run_their_linears_in_float8_and_equal_the_same_arithmetic_on_one_device(model_name, layout,
                                                                                          world):
    r = spawn_scenario(__name__, world, "fp8", model_name, layout)
    print(f"{model_name} {layout}: losses {r['losses']} one device {r['ref_losses']} float32 {r['f32_losses']}; "
          f"parameters {r['error']:.2e} (float32's {r['f32_error']:.2e}); _scaled_mm {r['scaled_mm']}, "
          f"mm/addmm {r['mm']}; fp8 calls {r['fp8_calls']}, with amax axes {r['amax_axes']}")
    for a, b in zip(r["losses"], r["ref_losses"]):
        assert abs(a - b) <= FP8_TOLERANCE * abs(b), (r["losses"], r["ref_losses"])
    assert r["error"] < PARAMETER_TOLERANCE, r["error"]
    # FP8 ran: the products went through _scaled_mm, and float32 would have given other losses.
    assert r["scaled_mm"] > 0 and r["fp8_calls"] > 0, r
    assert r["fp8_marks"] == r["fp8_calls"] and r["lowered"]["mismatches"] == [], r["lowered"]
    gap = max(abs(a - b) / abs(b) for a, b in zip(r["f32_losses"][1:], r["ref_losses"][1:]))
    assert gap > FLOAT32_GAP * FP8_TOLERANCE, (gap, r)
    assert r["f32_error"] > FLOAT32_GAP * PARAMETER_TOLERANCE, r["f32_error"]
    if layout in ("tensor", "2x2"):  # weights split on the tensor axis: amaxes taken over it
        assert r["split_on_tensor"] > 0 and r["amax_axes"] > 0, r


@pytest.mark.parametrize("model_name", ["gpt2", "llama"])
def test_an_fp8_linear_runs_its_tensor_collective_as_a_ring_in_float8(model_name):
    # Sequence parallelism with collective matmuls (Megatron's tp_comm_overlap under FP8):
    # each ring's products run in float8 block by block (collective_matmul.Fp8Products), a
    # block's rows scaled by their own amaxes (taken once before the ring where the rows are
    # whole on the rank, over the ranks that split K or N), so they are the whole call's rows.
    r = spawn_scenario(__name__, 2, "fp8", model_name, "ring")
    print(f"{model_name} ring: losses {r['losses']} one device {r['ref_losses']}; parameters {r['error']:.2e}; "
          f"fp8 rings {r['fp8_rings']}, fp8 calls {r['fp8_calls']}")
    for a, b in zip(r["losses"], r["ref_losses"]):
        assert abs(a - b) <= FP8_TOLERANCE * abs(b), (r["losses"], r["ref_losses"])
    assert r["error"] < PARAMETER_TOLERANCE, r["error"]
    assert r["fp8_rings"] > 0 and r["scaled_mm"] > 0, r
    # Every FP8 linear of the IR ran in float8: through fp8_linear, or in its ring with its marks.
    assert r["fp8_marks"] == r["fp8_calls"] + r["fp8_rings"] and r["lowered"]["mismatches"] == [], r["lowered"]
    gap = max(abs(a - b) / abs(b) for a, b in zip(r["f32_losses"][1:], r["ref_losses"][1:]))
    assert gap > FLOAT32_GAP * FP8_TOLERANCE, (gap, r)


def _scenario_fp8_compiled(rank: int, world: int, layout: str) -> dict:
    engine = _fp8_engine(_llama, layout, world, compile=True)
    optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-2)
    losses = []
    for step in range(STEPS):  # (no op counting: a dispatch mode would change what dynamo traces)
        losses.append(float(engine.train_step(*_batch(step))))
        optimizer.step()
        optimizer.zero_grad()
    reference = _llama()
    with fp8.one_device():
        ref_losses = train_one_device(reference, _batch, STEPS, torch.optim.AdamW(reference.parameters(), lr=1e-2))
    calls = re.findall(r"fp8_linear(?:\(|_\d+, \()'aten::\w+', (\([^)]*\)), (\([^)]*\))", engine.code)
    from torch._dynamo.utils import counters  # (this rank's process: dynamo's breaks and their reasons)

    return {"losses": losses, "ref_losses": ref_losses, "error": parameter_error(engine.full_state_dict(), reference),
            "fp8_calls": len(calls), "reasons": [str(reason) for reason in counters["graph_break"]],
            "async_calls": len(re.findall(r"fp8_linear(?:\(|_\d+, \()'aten::\w+', \([^)]*\), \([^)]*\), (?!None)",
                                          engine.code)),
            "amax_axes": sum(1 for k, n in calls if k != "()" or n != "()"),
            "breaks": sum(r["graph_breaks"] or 0 for r in engine.compile_report()),
            "eager_pieces": sum(r["eager_pieces"] for r in engine.compile_report()),
            "fp8_eager": sum(1 for run in engine._runs() for n in run.module.graph.nodes
                             if n.target == "fp8_linear" and runs_eagerly(run.module, n)),
            # A ring runs eagerly; its FP8 casts compiled (collective_matmul.CollectiveMatmul.compile_inner).
            "fp8_rings": _fp8_rings([engine.rank_ir]),
            "ring_casts_compiled": [m._casts is not None and hasattr(m._casts.cast, "_torchdynamo_orig_callable")
                                    for run in engine._runs() for m in run.module.modules()
                                    if isinstance(m, CollectiveMatmul)],
            "lowered": engine_against_rank_ir(engine),
            "compiled": [r["compile_seconds"] is not None for r in engine.compile_report()]}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["data", "tensor", "zero3", "ring"])
def test_compiled_fp8_plans_equal_the_same_arithmetic_on_one_device(layout):
    """Under compile an FP8 linear is traced, its casts fused by inductor (what the cost model
    prices for a compiled plan), whether its weight is whole on the rank (data parallelism) or
    split, its amaxes all-reduced (tensor parallelism: torch.ops.shardwise.all_reduce, a traced
    op), or gathered (ZeRO-3: its float8 W^T saved, no regather); only one whose input gradient
    is all-reduced asynchronously beside dW runs eagerly, a piece of its own between compiled
    pieces (Fp8Linears.with_collectives; compiled.compiled_in_pieces), as do ZeRO-3's
    prefetches and regathers. Each trains as the same FP8 arithmetic on one device."""
    r = spawn_scenario(__name__, 2, "fp8_compiled", layout)
    print(f"llama {layout} compiled: losses {r['losses']} one device {r['ref_losses']}; parameters {r['error']:.2e}; "
          f"fp8 calls {r['fp8_calls']} (amax axes {r['amax_axes']}); "
          f"graph breaks {r['breaks']}, eager pieces {r['eager_pieces']}, async {r['async_calls']}; "
          f"reasons {[x.splitlines()[1] for x in r['reasons']]}")
    assert r["compiled"] and all(r["compiled"]), r
    for a, b in zip(r["losses"], r["ref_losses"]):
        assert abs(a - b) <= FP8_TOLERANCE * abs(b), (r["losses"], r["ref_losses"])
    assert r["error"] < PARAMETER_TOLERANCE, r["error"]
    assert r["fp8_calls"] > 0, r
    # Traced: no FP8 call breaks a compiled piece; those with an asynchronous input gradient, and
    # only those, run in the program's eager pieces.
    fp8_breaks = [reason for reason in r["reasons"] if "Fp8Linears" in reason or "fp8" in reason.lower()]
    assert fp8_breaks == [], fp8_breaks
    assert r["fp8_eager"] == r["async_calls"], r
    assert r["lowered"]["mismatches"] == [], r["lowered"]
    if layout == "ring":  # the rings run eagerly, their FP8 products' casts compiled (fused, as priced)
        assert r["fp8_rings"] > 0 and r["ring_casts_compiled"] and all(r["ring_casts_compiled"]), r
    else:
        assert (r["amax_axes"] > 0) == (layout == "tensor"), r


def test_an_fp8_plan_is_priced_at_the_fp8_peak_and_refused_where_the_devices_have_none():
    graph = shardwise.capture(_llama(), _batch(0))
    h100 = shardwise.Cluster.preset("dgx-h100", 1)
    bf16 = shardwise.Plan.manual(graph, h100, data=8, tensor=1, global_batch=ROWS * 8, precision="bf16")
    in_fp8 = shardwise.Plan.manual(graph, h100, data=8, tensor=1, global_batch=ROWS * 8, precision="fp8")
    assert json.loads(in_fp8.to_json())["precision"] == "fp8"
    assert in_fp8.predicted_step_time() != bf16.predicted_step_time()
    a100 = shardwise.Cluster.preset("dgx-a100", 1)
    with pytest.raises(shardwise.ValidationError, match=r"precision 'fp8' needs FP8 matrix units, and device "
                                                        r"type 'a100-sxm4-80gb' has none"):
        shardwise.Plan.manual(graph, a100, data=8, tensor=1, global_batch=ROWS * 8, precision="fp8")
    with pytest.raises(shardwise.ValidationError, match="needs FP8 matrix units"):
        shardwise.plan(graph, a100, global_batch=ROWS * 8, precision="fp8")


def _scenario_float64(rank: int, world: int) -> dict:
    model = _gpt2().double()
    graph = shardwise.capture(model, _batch(0))
    plan = shardwise.Plan.manual(graph, shardwise.Cluster.preset("cpu", world), data=world, tensor=1,
                                 global_batch=ROWS, precision="fp8")
    try:
        shardwise.parallelize(model, _batch(0), plan=plan)
    except shardwise.ValidationError as e:
        return {"refused": str(e)}
    return {"refused": None}


def test_a_float64_model_has_no_fp8_plan_rather_than_a_silent_float64_run():
    r = spawn_scenario(__name__, 1, "float64")
    assert r["refused"] is not None and "no node of the model runs in float8" in r["refused"], r


def test_one_device_routes_only_the_linears_the_core_runs_in_fp8():
    """The reference's rule is the core's: a weight parameter with K and N multiples of 16."""
    torch.manual_seed(0)
    fits, odd = torch.nn.Linear(32, 48), torch.nn.Linear(32, 40)
    x = torch.randn(4, 32)
    counting = op_counts()
    with counting, fp8.one_device():
        y = fits(x)
        odd(x)
        x @ x.t()  # no weight
    assert counting.counts["aten._scaled_mm"] == 1, counting.counts
    # The same quantized operands, dequantized and multiplied in float64: equal to float32 rounding.
    x_q, x_s = fp8.quantize(x, 1)
    w_q, w_s = fp8.quantize(fits.weight, 1)
    expected = (x_q.double() * x_s.double()) @ (w_q.double() * w_s.double()).t() + fits.bias.double()
    assert torch.allclose(y.double(), expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(y, fits(x), rtol=1e-4, atol=1e-5)  # float8 rounded the operands


def _zero3(graph, world: int, precision: str):
    """The data-parallel plan with every weight a dim of allows sharded over the data axis
    (ZeRO-3 / FSDP: each gathered for its read), in `precision`, priced."""
    cluster = shardwise.Cluster.preset("cpu", world)
    searched = shardwise.plan(graph, cluster, global_batch=ROWS, mesh=(world, 1), zero=False, recompute=False)
    return zero3_plan(searched, _llama(), world, precision).price(graph, cluster)


def _gathered(plan) -> float:
    return sum(c["bytes"] * c["count"] for c in plan.collectives() if c["kind"] == "all_gather")


def _scenario_fp8_zero3(rank: int, world: int) -> dict:
    from shardwise.runtime import traffic

    graph = shardwise.capture(_llama(), _batch(0))
    plan = _zero3(graph, world, "fp8")
    engine = shardwise.parallelize(_llama(), _batch(0), plan=plan)
    optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-2)
    losses, moved = [], {}
    for step in range(STEPS):
        traffic.reset()
        losses.append(float(engine.train_step(*_batch(step))))
        optimizer.step()
        optimizer.zero_grad()
        moved = traffic.snapshot()
    reference = _llama()
    with fp8.one_device():
        ref_losses = train_one_device(reference, _batch, STEPS, torch.optim.AdamW(reference.parameters(), lr=1e-2))
    code = engine.code
    in_f32 = _zero3(graph, world, "f32")  # the same plan in float32: its gathered weights regathered
    return {"losses": losses, "ref_losses": ref_losses, "error": parameter_error(engine.full_state_dict(), reference),
            "lowered": engine_against_rank_ir(engine), "code": code,
            "saved_marks": engine.rank_ir.count("shardwise.fp8_saves_float8_weight=true"),
            "saving_calls": len(re.findall(r"fp8_linear\('aten::\w+', \([^)]*\), \([^)]*\), None, .*, True\)", code)),
            "sharded": sum(1 for p in plan.placements().values() if p[0].startswith("S")),
            "moved": moved.get("all_gather", {}).get("bytes", 0), "predicted": _gathered(plan),
            "predicted_f32": _gathered(in_f32),
            "activations": plan.predicted_memory()[1].get("activations", 0.0),
            "activations_f32": in_f32.predicted_memory()[1].get("activations", 0.0)}


def test_a_zero3_fp8_plan_saves_its_float8_weights_instead_of_gathering_them_again():
    """ZeRO-3 with FP8 linears (torchao's and Transformer Engine's float8 weight for the
    backward): each linear casts its gathered W's float8 W^T in the forward and saves it, so its
    weight is released after the read and never gathered again; the plan prices exactly that
    traffic (one gather of those weights a step, not two) and the saved copy, and the run equals
    the same FP8 arithmetic on one device."""
    r = spawn_scenario(__name__, 2, "fp8_zero3")
    print(f"llama zero3 fp8: losses {r['losses']} one device {r['ref_losses']}; parameters {r['error']:.2e}; "
          f"{r['saving_calls']} calls save float8 weights; all_gather moved {r['moved']} bytes, predicted "
          f"{r['predicted']:.0f} (in f32, regathered: {r['predicted_f32']:.0f}); activations {r['activations']:.0f} "
          f"(f32 {r['activations_f32']:.0f})")
    for a, b in zip(r["losses"], r["ref_losses"]):
        assert abs(a - b) <= FP8_TOLERANCE * abs(b), (r["losses"], r["ref_losses"])
    assert r["error"] < PARAMETER_TOLERANCE, r["error"]
    assert r["sharded"] > 0 and r["saved_marks"] > 0 and r["saving_calls"] == r["saved_marks"], r
    assert "regather(fp8_linear" not in r["code"], r["code"]
    assert r["lowered"]["mismatches"] == [], r["lowered"]
    # The run moves what the plan lists; the same plan in float32 gathers those weights twice.
    assert r["moved"] == r["predicted"] and r["predicted"] < r["predicted_f32"], r
