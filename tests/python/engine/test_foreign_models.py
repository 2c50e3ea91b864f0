"""Models as projects outside this repository write them, trained by shardwise unchanged: here
karpathy/nanoGPT's GPT (benchmarks/foreign/nanogpt.py, written from its public description).

Each test runs real Gloo processes against the same loop on one process, in float64: the
losses of 3 AdamW steps and every parameter after them equal within 1e-9 relative, or a clear
error asserted by its message. Each failed before its fix (the test says how):

- the model's own loss, returned as ``(logits, loss)``, found without a loss_fn;
- a plan that gathers the attention heads before nanoGPT's ``transpose(1, 2).contiguous().view``
  (export drops the no-op ``contiguous()``, and the rank's view met a strided operand);
- the decay / no-decay parameter groups named from the whole model, on a 2-stage pipeline.

Scenarios run in spawned ranks (`_scenario_*`); each returns a dict from rank 0."""
from __future__ import annotations

import pathlib
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import shardwise
from conftest import TIGHT_PRECISION, parameter_error, spawn_scenario, tight_cluster

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmarks"))  # spawned ranks inherit it
from foreign.nanogpt import GPT, GPTConfig  # noqa: E402

STEPS = 3
TOLERANCE = 1e-9  # relative, float64
ROWS, BLOCK, VOCAB = 4, 16, 64


# ---- the model and its data (built identically in every rank) -------------------------------
def nanogpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, dropout=0.0,
                         bias=True)).double()


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and next-token targets; the first row's first targets are -1 (nanoGPT's
    ignore_index: counted out of the mean)."""
    g = torch.Generator().manual_seed(10 + step)
    idx = torch.randint(0, VOCAB, (ROWS, BLOCK), generator=g)
    targets = torch.randint(0, VOCAB, (ROWS, BLOCK), generator=g)
    targets[0, :3] = -1
    return idx, targets


def last_token_loss(out, targets):
    """A loss_fn: nanoGPT called without targets gives (the last position's logits, None)."""
    logits, _ = out
    return F.cross_entropy(logits[:, -1, :], targets[:, -1])


class WithLastTokenLoss(nn.Module):
    """The model and last_token_loss as one module (what parallelize captures with loss_fn)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets):
        return last_token_loss(self.model(idx), targets)


class OwnLoss(nn.Module):
    """nanoGPT and the loss it returns, alone: what parallelize trains of it (without loss_fn)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets):
        return self.model(idx, targets)[1]


class TwoLosses(nn.Module):
    """Returns two 0-dim losses and no name for either: which one to train is not known."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x, y):
        h = self.a(x)
        return h, F.mse_loss(h, y), h.abs().mean()


# ---- scenarios (run on every rank) -------------------------------------------------------------
def _train(engine, reference, groups, ref_groups, call) -> dict:
    """STEPS AdamW steps of the engine and of the one-device reference (`call(model, batch)`:
    its loss), each with its parameter groups; the losses and the parameters' worst error."""
    opt = engine.optimizer(torch.optim.AdamW, groups, lr=1e-2, betas=(0.9, 0.95))
    ref_opt = torch.optim.AdamW(ref_groups, lr=1e-2, betas=(0.9, 0.95))
    losses, ref_losses = [], []
    for step in range(STEPS):
        b = batch(step)
        losses.append(float(engine.train_step(*b)))
        opt.step()
        opt.zero_grad()
        loss = call(reference, b)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(float(loss.detach()))
    sizes = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, [len(g["params"]) for g in opt.param_groups])
    return {"losses": losses, "ref": ref_losses, "error": parameter_error(engine.full_state_dict(), reference),
            "group_sizes": sizes, "placements": engine.plan.placements()}


def _scenario_own_loss(rank, world, mesh):
    """No loss_fn: nanoGPT returns (logits, loss) and parallelize must train the loss."""
    model, reference = nanogpt(), nanogpt()
    cluster = shardwise.Cluster.preset("cpu", world)
    options = {}
    if mesh[1] > 1:  # weights on the tensor axis (a model this small is otherwise cheapest replicated)
        cluster = tight_cluster(shardwise.capture(nanogpt(), batch(0)), world, ROWS, mesh)
        options = {"precision": TIGHT_PRECISION, "zero": False}
    engine = shardwise.parallelize(model, batch(0), mesh=mesh, cluster=cluster, **options)
    return _train(engine, reference, model.optim_groups(0.1), reference.optim_groups(0.1),
                  lambda m, b: m(*b)[1])


def _scenario_ambiguous_output(rank, world):
    refused = {}
    cases = {"no_scalar": (nanogpt(), (batch(0)[0],)),  # no targets: (logits of the last position, None)
             "two_scalars": (TwoLosses().double(), (torch.randn(4, 8, dtype=torch.float64),
                                                     torch.randn(4, 8, dtype=torch.float64)))}
    for case, (model, inputs) in cases.items():
        try:
            shardwise.parallelize(model, inputs, mesh=(world, 1), cluster=shardwise.Cluster.preset("cpu", world))
            refused[case] = None
        except shardwise.ValidationError as e:
            refused[case] = str(e)
    return refused


def _scenario_gathered_heads(rank, world, mesh):
    """With a loss_fn, on a tight cluster: the attention's weights split over heads on one mesh
    axis, the batch on the other; the heads are gathered before nanoGPT's view of them."""
    model, reference = nanogpt(), nanogpt()
    graph = shardwise.capture(WithLastTokenLoss(nanogpt()), batch(0))
    cluster = tight_cluster(graph, world, ROWS, mesh)
    engine = shardwise.parallelize(model, batch(0), last_token_loss, mesh=mesh, cluster=cluster,
                                   precision=TIGHT_PRECISION, zero=False)
    return _train(engine, reference, model.optim_groups(0.1), reference.optim_groups(0.1),
                  lambda m, b: last_token_loss(m(b[0]), b[1]))


def _scenario_pipeline_groups(rank, world, by_name):
    """nanoGPT's decay / no-decay groups from the whole model's named_parameters(), given to a
    2-stage pipeline's engine on every rank (each rank holds one stage's parameters)."""
    model, reference = nanogpt(), nanogpt()
    # The plan is made on what a step computes: the model and its loss (the logits the bare
    # model returns beside it are no part of a training step).
    graph = shardwise.capture(OwnLoss(nanogpt()), batch(0))
    plan = shardwise.Plan.manual(graph, shardwise.Cluster.preset("cpu", world), pipeline=2, global_batch=ROWS,
                                 micro_batch=2, recompute=False)
    engine = shardwise.parallelize(model, batch(0), plan=plan)
    try:  # a name the model does not have is still refused, on every rank
        engine.optimizer(torch.optim.AdamW, [*model.optim_groups(0.1, by_name=True),
                                             {"params": ["transformer.h.0.attn.c_atn.weight"]}])
        typo = None
    except shardwise.ValidationError as e:
        typo = str(e)
    typos = [None] * world
    dist.all_gather_object(typos, typo)
    out = _train(engine, reference, model.optim_groups(0.1, by_name=by_name), reference.optim_groups(0.1),
                 lambda m, b: m(*b)[1])
    return {**out, "typos": typos}


# ---- spawning ----------------------------------------------------------------------------------
def _spawn(world, name, *args):
    return spawn_scenario(__name__, world, name, *args)


def _assert_equal_training(r):
    assert max(abs(a - b) / abs(b) for a, b in zip(r["losses"], r["ref"])) < TOLERANCE, r
    assert r["error"] < TOLERANCE, r


def _split(placements: dict, name: str) -> bool:
    return any(p.startswith("S") for p in placements[name])


# ---- tests -------------------------------------------------------------------------------------
@pytest.mark.parametrize("mesh", [(2, 1), (1, 2)])
def test_nanogpt_trains_on_the_loss_it_returns_beside_its_logits(mesh):
    # Before: the engine took out[0] (the logits) for the loss, and every rank failed with
    # "grad can be implicitly created only for scalar outputs".
    r = _spawn(2, "own_loss", mesh)
    _assert_equal_training(r)
    if mesh[1] > 1:  # tensor parallelism: the tight cluster leaves no room for replicated weights
        assert any(_split(r["placements"], n) for n in r["placements"] if n.endswith("weight")), r["placements"]


def test_an_output_with_no_loss_or_several_unnamed_ones_is_refused_naming_what_came_back():
    # Before: out[0] taken (logits of shape [4, 1, 64] or h), and backward failed on every rank.
    r = _spawn(2, "ambiguous_output")
    for case, shapes in (("no_scalar", "tuple (Tensor[4, 1, 64] float64, None)"),
                         ("two_scalars", "tuple (Tensor[4, 8] float64, Tensor[] float64, Tensor[] float64)")):
        message = r[case]
        assert message and ("GPT returned" in message or "TwoLosses returned" in message), r
        assert shapes in message, message
        assert "labels=" in message and "loss_fn=" in message, message
    assert "no 0-dim floating tensor" in r["no_scalar"] and "several" in r["two_scalars"], r


def test_a_view_of_the_heads_gathered_on_a_rank_does_not_depend_on_the_traced_strides():
    # Before: "view size is not compatible with input tensor's size and stride" at the first
    # step: export dropped nanoGPT's no-op contiguous() before view(B, T, C), and the rank's
    # operand (heads gathered, then transposed) was strided.
    r = _spawn(4, "gathered_heads", (2, 2))
    _assert_equal_training(r)
    assert any(_split(r["placements"], n) for n in r["placements"] if n.endswith("attn.c_attn.weight")), \
        r["placements"]


@pytest.mark.parametrize("by_name", [True, False], ids=["names", "tensors"])
def test_parameter_groups_of_the_whole_model_on_a_pipeline(by_name):
    # Before: "no trainable parameter named 'transformer.h.1.attn.c_attn.weight'" on the first
    # stage's rank (the parameter is the second stage's), and the tensors likewise refused.
    r = _spawn(2, "pipeline_groups", by_name)
    _assert_equal_training(r)
    # Both groups on every rank (an empty one kept: group i is the same group everywhere), and
    # together every parameter once: 10 matrices (the tied head once) and 18 vectors.
    assert all(len(sizes) == 2 for sizes in r["group_sizes"]), r["group_sizes"]
    assert all(0 < sum(sizes) < 28 for sizes in r["group_sizes"]), r["group_sizes"]
    assert sum(s[0] for s in r["group_sizes"]) >= 10 and sum(s[1] for s in r["group_sizes"]) == 18, r["group_sizes"]
    assert all(t and "transformer.h.0.attn.c_atn.weight" in t for t in r["typos"]), r["typos"]
