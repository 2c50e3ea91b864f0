"""A pipeline stage's weight gradients accumulated into ``.grad`` by the products that make
them (runtime/fused_accumulation.py; the core marks the contractions,
csrc/transform/fused_weight_accumulation.h).

In one process: the backward's gradients equal autograd's in every phase, the weight's
written in place only in the engine's own backwards ("full", "W"), and left to autograd
where a hook watches the parameter or a graph is built. On real Gloo processes, float64,
against one device: Hugging Face GPT-2 (Conv1D: addmm of the weight itself; a tied LM head:
linear of the embedding) and TinyGPT (nn.Linear: t + addmm) under 1F1B, ZB-H1 (full
backwards, split B and W) and ZB-V (the V's turn), with every marked contraction of every
micro-batch counted accumulating in place.
"""
from __future__ import annotations

import contextlib
import json

import pytest
import torch
import torch.distributed as dist

import shardwise
from conftest import finish_rank, parameter_error, spawn_reports, train_beside_one_device
from shardwise.models import CausalLMWithLoss
from shardwise.runtime import fused_accumulation
from shardwise.runtime.fused_accumulation import FusedAccumulation

transformers = pytest.importorskip("transformers")

STEPS, ROWS, MICRO, TOLERANCE = 3, 8, 2, 1e-9


@contextlib.contextmanager
def _in_place_counted():
    """Inside: the weight terms written in place, counted by the phase that wrote them."""
    counts = {"full": 0, "W": 0, "B": 0, None: 0}
    real = fused_accumulation._accumulates_in_place

    def counted(param, grad):
        ok = real(param, grad)
        counts[fused_accumulation._PHASE[0]] += ok
        return ok

    fused_accumulation._accumulates_in_place = counted
    try:
        yield counts
    finally:
        fused_accumulation._accumulates_in_place = real


def _linear_twice(weight, bias, op: str, transposed: bool, seed: int):
    """Two micro-batches through one marked call: (their inputs, their outputs)."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(5, weight.shape[1 if op == "aten::linear" or transposed else 0], generator=g,
                      dtype=torch.float64, requires_grad=True) for _ in range(2)]
    outs = []
    for x in xs:
        w = weight.t() if transposed else weight
        args = {"aten::linear": (x, w, bias), "aten::addmm": (bias, x, w), "aten::mm": (x, w)}[op]
        outs.append(FusedAccumulation()(op, args, {}))
    return xs, outs


@pytest.mark.parametrize("op,transposed", [("aten::linear", False), ("aten::addmm", True), ("aten::addmm", False),
                                           ("aten::mm", True)])
def test_full_backward_accumulates_the_weight_in_place_and_equals_autograd(op, transposed):
    torch.manual_seed(0)
    shape = (3, 4) if op == "aten::linear" or transposed else (4, 3)
    weight = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, dtype=torch.float64, requires_grad=True) if op != "aten::mm" else None
    ref_w = weight.detach().clone().requires_grad_(True)
    ref_b = bias.detach().clone().requires_grad_(True) if bias is not None else None
    xs, outs = _linear_twice(weight, bias, op, transposed, 1)
    with _in_place_counted() as made, fused_accumulation.phase("full"):
        for y in outs:
            torch.autograd.backward([y], [torch.ones_like(y)])
    assert made["full"] == 2  # both micro-batches' weight terms written by the product, in place
    ref_xs = [x.detach().clone().requires_grad_(True) for x in xs]
    for x in ref_xs:
        w = ref_w.t() if transposed else ref_w
        y = {"aten::linear": lambda: torch.nn.functional.linear(x, w, ref_b),
             "aten::addmm": lambda: torch.addmm(ref_b, x, w), "aten::mm": lambda: x @ w}[op]()
        y.backward(torch.ones_like(y))
    torch.testing.assert_close(weight.grad, ref_w.grad, rtol=1e-12, atol=1e-12)
    for x, ref in zip(xs, ref_xs):
        torch.testing.assert_close(x.grad, ref.grad, rtol=1e-12, atol=1e-12)
    if bias is not None:
        torch.testing.assert_close(bias.grad, ref_b.grad, rtol=1e-12, atol=1e-12)


def test_a_backward_the_engine_does_not_run_leaves_the_weight_to_autograd():
    """Outside the engine's phases (a user's autograd.grad), with a hook on the parameter, or
    building a graph: the weight's gradient is returned, as autograd's own would be."""
    torch.manual_seed(0)
    weight = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    xs, ys = _linear_twice(weight, None, "aten::linear", False, 2)
    x, y = xs[0], ys[0]
    (gw,) = torch.autograd.grad(y.sum(), [weight], retain_graph=True)
    torch.testing.assert_close(gw, torch.ones(5, 3, dtype=torch.float64).t() @ x.detach())
    assert weight.grad is None  # nothing written outside the engine's backward
    arrived = []
    weight.register_post_accumulate_grad_hook(lambda p: arrived.append(p.grad.clone()))
    with fused_accumulation.phase("full"):
        y.sum().backward(retain_graph=True)
    assert len(arrived) == 1  # autograd accumulated it: the hook saw it arrive
    torch.testing.assert_close(arrived[0], gw)
    weight2 = weight.detach().clone().requires_grad_(True)
    y2 = _linear_twice(weight2, None, "aten::linear", False, 2)[1][0]
    with fused_accumulation.phase("full"):
        (g2,) = torch.autograd.grad(y2.sum(), [weight2], create_graph=True)
    assert weight2.grad is None and g2.requires_grad  # a graph built: autograd's result, not .grad


def test_under_autocast_the_call_is_the_op_itself():
    """Autocast casts the op's operands inside it: the call is the aten op with its own backward
    (the Function's saved operands would be the uncast ones)."""
    torch.manual_seed(0)
    weight = torch.randn(4, 3, requires_grad=True)
    bias = torch.randn(4, requires_grad=True)
    x = torch.randn(5, 3, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), fused_accumulation.phase("full"):
        y = FusedAccumulation()("aten::addmm", (bias, x, weight.t()), {})
        assert y.dtype == torch.bfloat16 and type(y.grad_fn).__name__ == "AddmmBackward0", y.grad_fn
        y.float().sum().backward()
    assert weight.grad.dtype == torch.float32 and weight.grad.shape == weight.shape


def _row_gradients(ids_list) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    return [torch.randn(*ids.shape, 5, generator=g, dtype=torch.float64) for ids in ids_list]


def _lookups(table, ids_list, phase_name=None):
    """Each ids tensor looked up through the fused call (padding row 1); their backwards, at
    _row_gradients, in `phase_name`."""
    outs = [FusedAccumulation()("aten::embedding", (table, ids, 1), {}) for ids in ids_list]
    with fused_accumulation.phase(phase_name) if phase_name else contextlib.nullcontext():
        for y, dy in zip(outs, _row_gradients(ids_list)):
            torch.autograd.backward([y], [dy])


def test_a_lookup_adds_its_rows_into_the_table_gradient_and_equals_autograd():
    """Two micro-batches with repeated rows and the padding row (1): written in place in the
    engine's backwards, the padding row untouched, equal to autograd's lookup bit for bit (each
    row's micro-batch sum, then one add); outside them, under a hook, or scaled by frequency,
    autograd's own."""
    g = torch.Generator().manual_seed(3)
    ids_list = [torch.tensor([[0, 2, 2], [1, 4, 0]]), torch.tensor([[4, 4, 1], [3, 2, 2]])]
    table = torch.randn(6, 5, dtype=torch.float64, generator=g, requires_grad=True)
    ref = table.detach().clone().requires_grad_(True)
    with _in_place_counted() as made:
        _lookups(table, ids_list, "full")
    assert made["full"] == 2  # both micro-batches' rows added into .grad
    for ids, dy in zip(ids_list, _row_gradients(ids_list)):
        torch.nn.functional.embedding(ids, ref, padding_idx=1).backward(dy)
    assert torch.equal(table.grad, ref.grad), (table.grad - ref.grad).abs().max()
    assert not table.grad[1].any() and table.grad[5].eq(0).all()  # the padding row and a row never read
    # Outside the engine's phases: the gradient returned, nothing written.
    other = table.detach().clone().requires_grad_(True)
    y = FusedAccumulation()("aten::embedding", (other, ids_list[0], 1), {})
    (gw,) = torch.autograd.grad(y.sum(), [other])
    assert other.grad is None
    torch.testing.assert_close(gw, torch.autograd.grad(torch.nn.functional.embedding(ids_list[0], ref, 1).sum(),
                                                       [ref])[0])
    # A hooked table: autograd accumulates it, and the hook sees each micro-batch arrive.
    arrived = []
    other.register_post_accumulate_grad_hook(lambda p: arrived.append(1))
    _lookups(other, ids_list, "full")
    assert len(arrived) == 2
    torch.testing.assert_close(other.grad, ref.grad, rtol=1e-12, atol=1e-12)
    # Scaled by frequency: not a scatter-add; the op itself.
    y = FusedAccumulation()("aten::embedding", (table, ids_list[0], -1, True, False), {})
    assert type(y.grad_fn).__name__ == "EmbeddingBackward0", y.grad_fn


def test_a_cut_lookup_adds_its_rows_in_w_and_none_in_b():
    """A split forward reads the table through a fresh leaf (weight_split.WeightCut): B leaves
    the table alone; W adds the rows into the parameter's .grad."""
    table = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[0, 2, 2], [1, 4, 0]])
    cut = table.detach().requires_grad_(True)
    cut._shardwise_cut_of = table
    y = FusedAccumulation()("aten::embedding", (cut, ids, -1), {})
    with fused_accumulation.phase("B"):
        torch.autograd.backward([y], [torch.ones_like(y)], inputs=[cut], retain_graph=True)
    assert cut.grad is None and table.grad is None  # B: nothing of the table's
    with fused_accumulation.phase("W"):
        (dv,) = torch.autograd.grad([y], [cut], [torch.ones_like(y)], allow_unused=True)
    assert dv is None  # written in place instead
    expected = torch.zeros_like(table).index_add_(0, ids.reshape(-1), torch.ones(6, 5, dtype=torch.float64))
    torch.testing.assert_close(table.grad, expected, rtol=0, atol=0)


# ---- on Gloo processes ----------------------------------------------------------------------
class FactorizedWeight(torch.nn.Module):
    """A weight made by a product of two parameters (u @ v, marked: v is a parameter) and read
    by a product with an activation: under a split backward W reaches u @ v from the value's
    gradient, where both factors' gradients are wanted."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(16, 32)
        self.u = torch.nn.Parameter(torch.randn(32, 8) / 4)
        self.v = torch.nn.Parameter(torch.randn(8, 32) / 4)
        self.mid = torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh())
        self.head = torch.nn.Linear(32, 8)

    def forward(self, x, target):
        h = torch.tanh(self.inp(x))
        h = self.mid(torch.mm(h, torch.mm(self.u, self.v)))
        return torch.nn.functional.cross_entropy(self.head(h), target)


def _model(case: str):
    torch.manual_seed(0)
    if case == "factorized":
        return FactorizedWeight().double()
    if case == "gpt2":
        return CausalLMWithLoss(transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=4, n_embd=32, n_head=4, vocab_size=64, n_positions=16, resid_pdrop=0, embd_pdrop=0,
            attn_pdrop=0))).double()
    from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig
    return TinyGPT(TinyGPTConfig(layers=4, hidden=32, heads=4, seq=16, vocab=64)).double()


def _batch(step: int, case: str = "gpt2"):
    g = torch.Generator().manual_seed(step)
    if case == "factorized":
        return torch.randn(ROWS, 16, generator=g, dtype=torch.float64), torch.randint(0, 8, (ROWS,), generator=g)
    ids = torch.randint(0, 64, (ROWS, 16), generator=g)
    return ids, torch.roll(ids, -1, dims=1)


def _plan(stages: int, schedule: str, fused: bool = True, data: int = 1) -> shardwise.Plan:
    plan = shardwise.Plan.from_json(json.dumps({
        "format": "shardwise.plan", "version": 1, "data": data, "tensor": 1, "pipeline": stages, "global_batch": ROWS,
        "micro_batch": MICRO, "schedule": schedule, "virtual_stages": 2 if schedule == "zb-v" else 1, "kfkb_k": 1,
        "recompute": "none", "zero_stage": 0, "layers_per_stage": [], "precision": "f32"}))
    return plan if fused else plan.with_fused_accumulation(False)


def _worker(rank: int, world: int, store: str, result: str, case: str, schedule: str, fused: bool = True,
            data: int = 1) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        with _in_place_counted() as in_place:
            _train_and_report(rank, result, case, schedule, world, in_place, fused, data)
    finally:
        dist.destroy_process_group()


def _train_and_report(rank: int, result: str, case: str, schedule: str, world: int, in_place: dict,
                      fused: bool = True, data: int = 1) -> None:
    """STEPS steps of the pipeline plan beside one device; the rank's report (`in_place`: the
    counts so far, by phase)."""
    model = _model(case)
    engine = shardwise.parallelize(model, _batch(0, case), plan=_plan(world // data, schedule, fused, data))
    reference = _model(case)
    losses, ref_losses = train_beside_one_device(engine, reference, lambda step: _batch(step, case), STEPS)
    marked = sum(stage["module"].code.count("fused_accumulation(") for stage in engine._stages.values())
    lookups = sum(stage["module"].code.count("fused_accumulation('aten::embedding'")
                  for stage in engine._stages.values())
    report = {"rank": rank, "losses": losses, "ref_losses": ref_losses,
              "in_place": {str(k): v for k, v in in_place.items()}, "marked": marked, "lookups": lookups,
              "micro_batches": engine._m, "error": parameter_error(engine.full_state_dict(), reference)}
    finish_rank(result, rank, report)


@pytest.mark.parametrize("case,schedule", [("gpt2", "1f1b"), ("gpt2", "zb-h1"), ("gpt2", "zb-v"),
                                           ("tiny_gpt", "1f1b"), ("tiny_gpt", "zb-h1"), ("tiny_gpt", "zb-v"),
                                           ("factorized", "zb-h1")])
def test_pipeline_stages_accumulate_weight_gradients_in_place_and_train_as_one_device(case, schedule):
    reports = spawn_reports(_worker, 2, case, schedule)
    if case == "factorized":  # its four contractions (inp, u @ v, mid, head) and their in-place terms
        assert sum(r["marked"] for r in reports) == 4, reports
        assert sum(r["in_place"]["W"] + r["in_place"]["full"] for r in reports) == 4 * 4 * STEPS, reports
        r = reports[-1]
        assert max(abs(a - b) / abs(b) for a, b in zip(r["losses"], r["ref_losses"])) <= TOLERANCE, r
        assert max(rep["error"] for rep in reports) < TOLERANCE, [rep["error"] for rep in reports]
        return
    for r in reports:
        # Every marked contraction of every micro-batch wrote its weight's term in place, in
        # the engine's full backwards or its W actions, never in a split B.
        assert r["marked"] >= 8, r  # GPT-2: 4 Conv1Ds a block; TinyGPT: 4 linears a block (2 blocks a rank)
        done = r["in_place"]
        assert done["B"] == 0 and done["None"] == 0, done
        assert done["full"] + done["W"] == r["marked"] * r["micro_batches"] * STEPS, (done, r["marked"])
        if schedule == "1f1b":
            assert done["W"] == 0, done  # no split: every one in a full backward
    # The first stage's lookups (the token and the position tables) are among them.
    assert reports[0]["lookups"] == 2, reports[0]
    if schedule != "1f1b":
        assert sum(r["in_place"]["W"] for r in reports) > 0, reports  # split micro-batches: W wrote them
    r = reports[-1]
    errors = [abs(a - b) / abs(b) for a, b in zip(r["losses"], r["ref_losses"])]
    print(f"{case} {schedule}: {r['marked']} contractions fused on rank 1; losses within {max(errors):.1e}, "
          f"parameters {r['error']:.1e}")
    assert max(errors) <= TOLERANCE, (r["losses"], r["ref_losses"])
    assert max(rep["error"] for rep in reports) < TOLERANCE, [rep["error"] for rep in reports]


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_a_plan_with_fused_accumulation_off_leaves_the_weight_gradients_to_autograd(schedule):
    # The plan's switch (plan.fused_accumulation; no module global): no stage marks a
    # contraction, no term is written in place, and the run still equals one device.
    reports = spawn_reports(_worker, 2, "tiny_gpt", schedule, False)
    for r in reports:
        assert r["marked"] == 0 and r["lookups"] == 0, r
        assert sum(r["in_place"].values()) == 0, r["in_place"]
        assert max(abs(a - b) / abs(b) for a, b in zip(r["losses"], r["ref_losses"])) <= TOLERANCE, r
        assert r["error"] < TOLERANCE, r["error"]


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_stages_with_data_ranks_accumulate_in_place_until_the_buckets_count_and_train_as_one_device(schedule):
    # Pipeline 2 x data 2: each parameter's data-parallel bucket hook counts only the backward
    # the engine arms it for (its last of the step), so every earlier micro-batch writes its
    # weight terms in place and the last leaves them to autograd, which accumulates and runs
    # the hook that issues the bucket's all-reduce. Equal to one device in float64.
    reports = spawn_reports(_worker, 4, "gpt2", schedule, True, 2)
    for r in reports:
        done = r["in_place"]
        assert r["marked"] >= 8 and r["micro_batches"] == 2, r
        assert done["B"] == 0 and done["None"] == 0, done
        assert done["full"] + done["W"] == r["marked"] * (r["micro_batches"] - 1) * STEPS, (done, r["marked"])
        assert max(abs(a - b) / abs(b) for a, b in zip(r["losses"], r["ref_losses"])) <= TOLERANCE, r
        assert r["error"] < TOLERANCE, r["error"]
