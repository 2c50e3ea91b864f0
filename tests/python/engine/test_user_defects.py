"""The defects a new user met in their own loops (issue 19), each on real Gloo processes
against one process: each test failed on the main branch before the fix and names what it checks.

Scenarios run in spawned ranks (`_scenario_*`); each returns a dict from rank 0 (and asserts
what must hold on every rank inside the ranks, where it can)."""
from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import shardwise
from conftest import TIGHT_PRECISION, spawn_scenario, tight_cluster
from shardwise.models import CausalLMWithLoss

transformers = pytest.importorskip("transformers")


# ---- models ---------------------------------------------------------------------------------
class WritesIntoABuffer(nn.Module):
    """out[:, t] = ... step by step (as RWKV and RNNs fill their outputs), then an in-place
    residual (as ResNet's `out += identity` after batch norm)."""

    def __init__(self):
        super().__init__()
        self.step = nn.Linear(8, 6)
        self.skip = nn.Linear(8, 6)
        self.bn = nn.BatchNorm1d(6)
        self.head = nn.Linear(6, 3)

    def forward(self, x, y):
        out = torch.zeros(x.shape[0], 3, 6, dtype=x.dtype)
        for t in range(3):
            out[:, t] = torch.tanh(self.step(x * (t + 1)))
        h = self.bn(self.skip(x))
        h += out.sum(1)
        return F.cross_entropy(self.head(torch.relu(h)), y)


class VarArgs(nn.Module):
    """forward(*xs): the inputs come as positional items (capture names them xs_0, xs_1)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, *xs):
        return (self.a(xs[0]) * self.b(xs[1])).pow(2).mean()


class Losses(nn.Module):
    """Means the data counts: cross entropy with class weights, label smoothing and -100
    labels (mean over the weights of the counted labels), and a masked token mean written by
    hand (sum over the mask / the mask's count)."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 5)
        self.register_buffer("class_weight", torch.tensor([1.0, 2.0, 0.5, 1.5, 3.0], dtype=torch.float64))

    def forward(self, x, labels, mask):
        logits = self.head(x)  # [rows, tokens, classes]
        ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), weight=self.class_weight, label_smoothing=0.1)
        per_token = logits.logsumexp(-1)
        masked = (per_token * mask).sum() / mask.sum()
        return ce + 0.1 * masked


def _qwen2(dtype=torch.float64):
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=96, max_position_embeddings=64, use_cache=False)
    return transformers.Qwen2ForCausalLM(cfg).to(dtype)


def _batch(rows=4, seq=8, vocab=96):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, vocab, (rows, seq), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


# ---- scenarios (run on every rank) ----------------------------------------------------------------
def _sgd_steps(engine, reference, batch: tuple, steps: int, lr: float) -> tuple[list[float], list[float]]:
    """`steps` SGD steps of the engine and of the single-device reference on `batch`: their losses."""
    opt, ref_opt = engine.optimizer(torch.optim.SGD, lr=lr), torch.optim.SGD(reference.parameters(), lr=lr)
    losses, ref_losses = [], []
    for _ in range(steps):
        losses.append(float(engine.train_step(*batch)))
        opt.step()
        opt.zero_grad()
        loss = reference(*batch)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(float(loss.detach()))
    return losses, ref_losses


def _scenario_writes(rank, world, mesh):
    torch.manual_seed(0)
    model, reference = WritesIntoABuffer().double(), WritesIntoABuffer().double()
    reference.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (8,), generator=g)
    engine = shardwise.parallelize(model, (x, y), mesh=mesh, cluster=shardwise.Cluster.preset("cpu", world))
    losses, ref_losses = _sgd_steps(engine, reference, (x, y), steps=3, lr=0.1)
    full = engine.full_state_dict()
    return {"losses": losses, "ref_losses": ref_losses,
            "error": max((full[n].double() - t.double()).abs().max().item() for n, t in
                         reference.state_dict().items()),  # num_batches_tracked (the BN's count) too
            "names": sorted(full), "ref_names": sorted(reference.state_dict())}


def _scenario_clip(rank, world, mesh):
    model = _qwen2()
    batch = _batch()
    graph = shardwise.capture(_qwen2(), batch)
    cluster = tight_cluster(graph, world, 4, mesh) if mesh[1] > 1 else shardwise.Cluster.preset("cpu", world)
    engine = shardwise.parallelize(model, batch, mesh=mesh, cluster=cluster, precision=TIGHT_PRECISION, zero=False)
    engine.train_step(**batch)
    out = {"sharded": any(x.startswith("S") for n, p in engine.plan.placements().items() if n in dict(model.named_parameters())
                          for x in p)}
    try:
        out["torch_norm"] = float(torch.nn.utils.clip_grad_norm_(engine.parameters(), 1e9))
    except shardwise.ValidationError as e:
        out["refused"] = str(e)
    out["norm"] = float(engine.clip_grad_norm_(1e9))
    reference = _qwen2()
    reference(**batch).loss.backward()
    out["ref_norm"] = float(torch.nn.utils.clip_grad_norm_(reference.parameters(), 1e9))
    return out


def _scenario_failed_step(rank, world, mesh):
    """Rank 1 is handed a batch without its labels at step 1 and one of another shape at step 2,
    and goes on after catching the error; every rank must fail both and run step 3 together."""
    model, reference = _qwen2(), _qwen2()
    batch = _batch()
    engine = shardwise.parallelize(model, batch, mesh=mesh, cluster=shardwise.Cluster.preset("cpu", world))
    opt = engine.optimizer(torch.optim.SGD, lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    events = []
    for step in range(4):
        given = batch
        if step == 1 and rank == 1:
            given = {"input_ids": batch["input_ids"]}  # refused by this rank alone
        if step == 2 and rank == 1:
            given = {k: v[:, :4] for k, v in batch.items()}  # valid alone, not beside the others
        try:
            loss = engine.train_step(**given)
        except shardwise.ValidationError as e:
            events.append(("refused", step, str(e)[:200]))
            opt.zero_grad()
            continue
        opt.step()
        opt.zero_grad()
        events.append(("ran", step, float(loss)))
    for step in (0, 3):
        loss = reference(**batch).loss
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        events.append(("reference", step, float(loss.detach())))
    gathered = [None] * world
    dist.all_gather_object(gathered, events)
    return {"events": gathered}


def _scenario_pipeline_loss(rank, world, dtype):
    model = _qwen2(getattr(torch, dtype))
    batch = _batch()
    graph = shardwise.capture(_qwen2(), batch)
    plan = shardwise.Plan.manual(graph, shardwise.Cluster.preset("cpu", world), pipeline=2, global_batch=4,
                                 micro_batch=2, recompute=False)
    engine = shardwise.parallelize(model, batch, plan=plan)
    loss = engine.train_step(**batch)
    with torch.no_grad():
        ref = _qwen2(getattr(torch, dtype))(**batch).loss
    gathered = [None] * world
    dist.all_gather_object(gathered, (str(loss.dtype), float(loss)))
    return {"losses": gathered, "ref": float(ref), "ref_dtype": str(ref.dtype),
            "optimizer": isinstance(engine.optimizer(torch.optim.AdamW, lr=1e-3), torch.optim.Optimizer)}


def _scenario_unverified_capture(rank, world):
    """Capture with its writes left as they were (the defect): parallelize must refuse, on every
    rank; the ranks, which captured one program, check it once (rank 0's run)."""
    import sys

    import torch.distributed as dist

    engine_module = sys.modules["shardwise.engine"]
    checks, check = [], engine_module.verify_capture
    engine_module.verify_capture = lambda *a, **k: checks.append(1) or check(*a, **k)
    sys.modules["shardwise.capture"].functionalize = lambda graph, constants=(): 0
    torch.manual_seed(0)
    x, y = torch.randn(8, 8, dtype=torch.float64), torch.randint(0, 3, (8,))
    error = None
    try:
        shardwise.parallelize(WritesIntoABuffer().double(), (x, y))
    except shardwise.CaptureError as e:
        error = str(e)
    everyone = [None] * world
    dist.all_gather_object(everyone, {"error": error, "checks": len(checks)})
    return {"error": error, "ranks": everyone}


def _scenario_verified_once(rank, world):
    """A capture that holds: checked on rank 0 alone, and no rank's generator moved by it."""
    import sys

    import torch.distributed as dist

    engine_module = sys.modules["shardwise.engine"]
    checks, check = [], engine_module.verify_capture
    engine_module.verify_capture = lambda *a, **k: checks.append(check(*a, **k))
    torch.manual_seed(0)
    model = WritesIntoABuffer().double()
    x, y = torch.randn(8, 8, dtype=torch.float64), torch.randint(0, 3, (8,))
    before = torch.get_rng_state()
    shardwise.parallelize(model, (x, y))
    moved = not torch.equal(before, torch.get_rng_state())
    everyone = [None] * world
    dist.all_gather_object(everyone, {"checks": len(checks), "moved": moved,
                                      "state": hash(torch.get_rng_state().numpy().tobytes())})
    return {"ranks": everyone}


def _scenario_shapes(rank, world, mesh):
    """Batches of other shapes: the last, shorter one (3 rows on 2 data ranks) and another
    sequence length, each captured again under the engine's sharding."""
    model, reference = _qwen2(), _qwen2()
    batch = _batch()
    graph = shardwise.capture(_qwen2(), batch)
    cluster = tight_cluster(graph, world, 4, mesh) if mesh[1] > 1 else shardwise.Cluster.preset("cpu", world)
    engine = shardwise.parallelize(model, batch, mesh=mesh, cluster=cluster, precision=TIGHT_PRECISION, zero=False)
    opt = engine.optimizer(torch.optim.SGD, lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    losses, ref_losses = [], []
    for b in (batch, {k: v[:3] for k, v in batch.items()}, _batch(4, 12), batch):
        losses.append(float(engine.train_step(**b)))
        opt.step()
        opt.zero_grad()
        loss = reference(**b).loss
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(float(loss.detach()))
    static = shardwise.parallelize(_qwen2(), batch, mesh=mesh, cluster=cluster, static=True,
                                   precision=TIGHT_PRECISION)
    try:
        static.train_step(**_batch(4, 12))
        refused = None
    except shardwise.ValidationError as e:
        refused = str(e)
    return {"losses": losses, "ref": ref_losses, "programs": len(engine._programs), "refused": refused}


def _causal_lm(name):
    torch.manual_seed(0)
    if name == "gpt2":  # its default attention: SDPA
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=16, resid_pdrop=0,
                                      embd_pdrop=0, attn_pdrop=0)
        return CausalLMWithLoss(transformers.GPT2LMHeadModel(cfg)).double()
    cfg = transformers.BloomConfig(n_layer=2, hidden_size=64, n_head=4, vocab_size=128, hidden_dropout=0.0,
                                   attention_dropout=0.0)
    return CausalLMWithLoss(transformers.BloomForCausalLM(cfg)).double()


def _scenario_outer_tensor_axis(rank, world, name):
    """The layers' tensor parallelism on the outer mesh axis and the batch on the inner one: a
    view merging (batch, sequence), or BLOOM's (batch, heads) reshape, splits the minor index
    on the outer axis, which is a strided shard of the merged dim."""
    g = torch.Generator().manual_seed(1)
    ids, y = torch.randint(0, 128, (2, 16), generator=g), torch.randint(0, 128, (2, 16), generator=g)
    searched = shardwise.parallelize(_causal_lm(name), (ids, y), mesh=(2, 2),
                                     cluster=shardwise.Cluster.preset("cpu", 4)).plan
    doc = json.loads(searched.to_json())
    sharding = doc["sharding"]
    weights = [v for n, v in sharding["placements"].items() if n.endswith(".weight")]
    if any(v[1].startswith("S") for v in weights):  # the layers on the inner axis: swap the axes
        for key in ("placements", "strategies"):
            sharding[key] = {n: list(reversed(v)) for n, v in sharding[key].items()}
        sharding["zero"] = {n: [1 - a for a in axes] for n, axes in sharding["zero"].items()}
    model, reference = _causal_lm(name), _causal_lm(name)
    engine = shardwise.parallelize(model, (ids, y), plan=shardwise.Plan.from_json(json.dumps(doc)))
    losses, ref_losses = _sgd_steps(engine, reference, (ids, y), steps=2, lr=0.5)
    full = engine.full_state_dict()
    placements = engine.plan.placements()
    outer = [n for n, v in placements.items() if n.endswith(".weight") and v[0].startswith("S")]
    return {"losses": losses, "ref": ref_losses, "outer_splits": len(outer),
            "error": max((full[n] - p).abs().max().item() for n, p in reference.named_parameters())}


def _scenario_counted_losses(rank, world, mesh):
    torch.manual_seed(0)
    model, reference = Losses().double(), Losses().double()
    reference.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, 8, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 5, (4, 6), generator=g)
    labels[0, 3:] = -100
    labels[3] = -100  # the last data rank's rows count no label at all
    mask = (labels != -100).double()
    # A model this small is cheapest replicated; the loss is split over every mesh axis by hand
    # (each rank then holds one row's 6 tokens: the last rank's count none).
    searched = shardwise.parallelize(Losses().double(), (x, labels, mask), mesh=mesh,
                                     cluster=shardwise.Cluster.preset("cpu", world), verify=False).plan
    doc = json.loads(searched.to_json())
    doc["sharding"]["strategies"]["cross_entropy_loss"] = ["split n" if size > 1 else "replicate" for size in mesh]
    engine = shardwise.parallelize(model, (x, labels, mask), plan=shardwise.Plan.from_json(json.dumps(doc)))
    loss = engine.train_step(x, labels, mask)
    ref = reference(x, labels, mask)
    ref.backward()
    grads = engine._full_grads()
    return {"loss": float(loss), "ref": float(ref.detach()),
            "error": max(((grads[n] - p.grad).abs().max() / p.grad.abs().max()).item()
                         for n, p in reference.named_parameters()),
            "strategy": engine.plan.strategies()["cross_entropy_loss"]}


class WeightedSummedLoss(nn.Module):
    """Class-weighted cross entropy summed over the rows (a buffer of class weights)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 8)
        self.register_buffer("classes", torch.linspace(0.5, 2.0, 8))

    def forward(self, x, y):
        return F.cross_entropy(self.lin(x), y, weight=self.classes, reduction="sum")


def _scenario_weighted_sum(rank, world):
    torch.manual_seed(0)
    model, reference = WeightedSummedLoss().double(), WeightedSummedLoss().double()
    reference.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 16, generator=g, dtype=torch.float64), torch.randint(0, 8, (32,), generator=g)
    engine = shardwise.parallelize(model, (x, y), cluster=shardwise.Cluster.preset("cpu", world), mesh=(world, 1))
    loss = engine.train_step(x, y)
    ref = reference(x, y)
    ref.backward()
    grads = engine._full_grads()
    return {"loss": float(loss), "ref": float(ref.detach()), "strategy": engine.plan.strategies()["cross_entropy_loss"],
            "error": max(((grads[n] - p.grad).abs().max() / p.grad.abs().max()).item()
                         for n, p in reference.named_parameters())}


def _scenario_var_args(rank, world, mesh):
    torch.manual_seed(0)
    model, reference = VarArgs().double(), VarArgs().double()
    reference.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(1)
    x, z = torch.randn(8, 8, generator=g, dtype=torch.float64), torch.randn(8, 8, generator=g, dtype=torch.float64)
    engine = shardwise.parallelize(model, (x, z), mesh=mesh, cluster=shardwise.Cluster.preset("cpu", world))
    loss = engine.train_step(x, z)
    ref = reference(x, z)
    ref.backward()
    grads = engine._full_grads()
    return {"loss": float(loss), "ref": float(ref.detach()),
            "error": max((grads[n] - p.grad).abs().max().item() for n, p in reference.named_parameters())}


def _scenario_positional_labels(rank, world, mesh):
    model = _qwen2()
    batch = _batch()
    try:
        shardwise.parallelize(model, (batch["input_ids"], batch["labels"]), mesh=mesh,
                              cluster=shardwise.Cluster.preset("cpu", world))
    except shardwise.ValidationError as e:
        return {"error": str(e)}
    return {"error": None}


def _scenario_tied_state(rank, world, kind):
    """A tied LM head (Qwen2 with tie_word_embeddings): full_state_dict loads into a fresh model
    with strict=True, as the model's own state_dict does, and gives the trained weights."""
    def build():
        torch.manual_seed(0)
        cfg = transformers.Qwen2Config(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=128, vocab_size=96,
                                       max_position_embeddings=64, use_cache=False, tie_word_embeddings=True)
        return transformers.Qwen2ForCausalLM(cfg).double()

    model, reference = build(), build()
    batch = _batch()
    if kind == "pipeline":
        plan = shardwise.Plan.manual(shardwise.capture(build(), batch), shardwise.Cluster.preset("cpu", world),
                                     pipeline=2, global_batch=4, micro_batch=2, recompute=False)
        engine = shardwise.parallelize(model, batch, plan=plan)
    else:
        engine = shardwise.parallelize(model, batch, mesh=(1, world), cluster=shardwise.Cluster.preset("cpu", world))
    opt, ref_opt = engine.optimizer(torch.optim.SGD, lr=0.1), torch.optim.SGD(reference.parameters(), lr=0.1)
    engine.train_step(**batch)
    opt.step()
    reference(**batch).loss.backward()
    ref_opt.step()
    full = engine.full_state_dict()
    fresh = build()
    missing = None
    try:
        fresh.load_state_dict(full, strict=True)
    except RuntimeError as e:
        missing = " ".join(str(e).split())[:400]
    ref_state = reference.state_dict()
    return {"missing": missing, "names": sorted(set(full) ^ set(ref_state)),
            "tied": fresh.lm_head.weight is fresh.model.embed_tokens.weight,
            "error": max((fresh.state_dict()[n] - t).abs().max().item() for n, t in ref_state.items())}


# ---- spawning ----------------------------------------------------------------------------------------
def _spawn(world, name, *args):
    return spawn_scenario(__name__, world, name, *args)


# ---- tests ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mesh", [(2, 1), (1, 2)])
def test_writes_into_intermediate_tensors_are_kept(mesh):
    # Before: capture dropped `out[:, t] = ...` with the linear feeding it (its parameters
    # vanished from the engine), and the in-place residual after batch norm failed at run time
    # ("Output 0 of _ReshardFn is a view and is being modified inplace").
    r = _spawn(2, "writes", mesh)
    assert r["names"] == r["ref_names"], r
    assert max(abs(a - b) / b for a, b in zip(r["losses"], r["ref_losses"])) < 1e-10, r
    assert r["error"] < 1e-10, r


@pytest.mark.parametrize("mesh", [(1, 2), (2, 1)])
def test_clip_grad_norm_is_global_and_torchs_is_refused_when_weights_are_sharded(mesh):
    r = _spawn(2, "clip", mesh)
    assert abs(r["norm"] - r["ref_norm"]) / r["ref_norm"] < 1e-10, r
    if mesh[1] > 1:
        assert r["sharded"], r  # the tight cluster leaves no room for replicated weights
    # (On the data axis the search may shard a weight FSDP's way, which parameter gathers
    # priced as the runtime runs them can make worth it.)
    if r["sharded"]:  # torch's clip would see this rank's shard only
        assert "engine.clip_grad_norm_" in r["refused"], r
    else:             # every gradient whole on every rank: torch's is exact
        assert abs(r["torch_norm"] - r["ref_norm"]) / r["ref_norm"] < 1e-10, r


def test_a_step_refused_on_one_rank_is_refused_on_every_rank_and_the_next_runs_together():
    r = _spawn(2, "failed_step", (2, 1))
    ours = [[e for e in events if e[0] != "reference"] for events in r["events"]]
    reference = [e[2] for e in r["events"][0] if e[0] == "reference"]
    for rank, events in enumerate(ours):
        assert [e[:2] for e in events] == [["ran", 0], ["refused", 1], ["refused", 2], ["ran", 3]], (rank, events)
    assert "another rank refused" in ours[0][1][2] and "missing ['labels']" in ours[1][1][2], ours
    assert all("different shapes" in events[2][2] for events in ours), ours
    for events in ours:  # step 4 paired with step 4 on every rank: the one-device losses
        assert abs(events[0][2] - reference[0]) / reference[0] < 1e-6
        assert abs(events[3][2] - reference[1]) / reference[1] < 1e-6


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_a_pipeline_reports_its_loss_in_its_dtype_on_every_rank(dtype):
    # Before: the loss was broadcast in the parameters' dtype: 0.0 on the first stage's rank
    # in float64, every rank aborted in bf16 (gloo: 4 vs 2 bytes).
    r = _spawn(2, "pipeline_loss", dtype)
    (dtype0, loss0), (dtype1, loss1) = r["losses"]
    assert dtype0 == dtype1 == r["ref_dtype"] and loss0 == loss1, r
    assert abs(loss0 - r["ref"]) / r["ref"] < (1e-6 if dtype == "float64" else 2e-2), r
    assert r["optimizer"]


def test_positional_labels_bind_as_python_binds_them_and_the_error_says_how_to_pass_labels():
    # model(ids, labels) gives labels to attention_mask, and the model returns no loss: the
    # engine says so (before: it ran on whatever it had bound).
    r = _spawn(2, "positional_labels", (2, 1))
    assert r["error"] and "labels=" in r["error"], r


@pytest.mark.parametrize("world", [1, 2])
def test_a_capture_that_drops_a_write_is_refused_before_training(world):
    # The check of parallelize (runtime/verify.py): the captured program run whole against the
    # eager model. With capture's writes dropped (as before the fix), it names what differs, on
    # every rank, though rank 0 alone ran the check (every rank captured the same program).
    r = _spawn(world, "unverified_capture")
    assert r["error"] and "captured program" in r["error"], r
    assert [e["error"] for e in r["ranks"]] == [r["error"]] * world, r
    assert [e["checks"] for e in r["ranks"]] == [1] + [0] * (world - 1), r


def test_the_capture_is_checked_on_rank_zero_alone_and_moves_no_generator():
    # Before: each rank ran the check (a forward and backward of the whole model at the global
    # batch: the ranks of a CPU job share its cores) and drew its seed from the generator. With
    # rank 0 alone drawing, rank 0's dropout masks would differ from the other ranks'.
    r = _spawn(2, "verified_once")
    assert [e["checks"] for e in r["ranks"]] == [1, 0], r
    assert not any(e["moved"] for e in r["ranks"]), r
    assert r["ranks"][0]["state"] == r["ranks"][1]["state"], r


@pytest.mark.parametrize("mesh", [(2, 1), (1, 2)])
def test_batches_of_other_shapes_are_captured_again_or_refused_under_static(mesh):
    r = _spawn(2, "shapes", mesh)
    assert max(abs(a - b) / b for a, b in zip(r["losses"], r["ref"])) < 1e-6, r
    assert r["programs"] == 3, r  # the first batch's shapes came back: its program ran again
    assert r["refused"] and "static=True" in r["refused"], r


@pytest.mark.parametrize("name", ["gpt2", "bloom"])
def test_tensor_parallelism_on_the_outer_mesh_axis_equals_one_device(name):
    # Before: GPT-2 wrong from step 1 (1.8e-3 relative here): its (batch, sequence) merge split
    # on the outer axis was placed as a contiguous shard, not a strided one (search/strategy.h:
    # groups count the major indices as the outer axes leave them). BLOOM's (batch, heads)
    # reshape has the same shape of bug; this plan of it passed before too, and must still.
    r = _spawn(4, "outer_tensor_axis", name)
    assert r["outer_splits"] > 0, r  # weights sharded on the outer axis
    assert max(abs(a - b) / b for a, b in zip(r["losses"], r["ref"])) < 1e-10, r
    assert r["error"] < 1e-10, r


def test_a_forward_of_var_args_trains():
    # Before: parallelize called the model with its items as keywords (xs_0=..., a TypeError).
    r = _spawn(2, "var_args", (2, 1))
    assert abs(r["loss"] - r["ref"]) / r["ref"] < 1e-12 and r["error"] < 1e-12, r


@pytest.mark.parametrize("mesh", [(4, 1), (2, 2)])
def test_means_the_data_counts_stay_global_with_weights_smoothing_and_masks(mesh):
    # Before: each rank's mean over its own count (the last rank's: 0 / 0), averaged.
    r = _spawn(4, "counted_losses", mesh)
    assert r["strategy"] == ["split n" if size > 1 else "replicate" for size in mesh], r
    assert abs(r["loss"] - r["ref"]) / r["ref"] < 1e-12 and r["error"] < 1e-12, r


def test_a_class_weighted_summed_loss_over_split_rows_weighs_every_rank_s_rows():
    # Before: the class weights, lacking the summed rows, were taken for a term added to the sum
    # (as addmm's bias) and zeroed on all ranks but one: the loss was rank 0's rows only (48.5
    # of 94.6). They multiply every row's term: whole on each rank (csrc/ops/dim_rule.h, added).
    r = _spawn(2, "weighted_sum")
    assert r["strategy"][0] == "split n", r
    assert abs(r["loss"] - r["ref"]) / r["ref"] < 1e-12 and r["error"] < 1e-12, r


def test_the_same_tensor_passed_as_two_inputs_captures_the_graph_of_two_tensors():
    # labels=input_ids is the usual causal-LM call; torch.export folds the two into one
    # placeholder, and the graph then read the other name: a plan searched on such a call did
    # not fit the engine's capture of the same model (fingerprint refused, or wrong nodes).
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 8)
            self.head = nn.Linear(8, 32)

        def forward(self, input_ids, labels):
            return F.cross_entropy(self.head(self.emb(input_ids)).flatten(0, 1), labels.flatten())

    model = LM()
    ids = torch.randint(0, 32, (2, 6))
    aliased = shardwise.capture(model, (ids, ids))
    distinct = shardwise.capture(model, (ids, ids.clone()))
    assert aliased._core.fingerprint() == distinct._core.fingerprint()
    assert str(aliased) == str(distinct)


@pytest.mark.parametrize("kind", ["spmd", "pipeline"])
def test_a_tied_weights_full_state_dict_loads_strictly_into_the_model(kind):
    # Before: full_state_dict named a tied weight once (the engine's name), so a strict
    # load_state_dict into the user's model failed on lm_head.weight.
    r = _spawn(2, "tied_state", kind)
    assert r["missing"] is None and r["names"] == [], r
    assert r["tied"] and r["error"] < 1e-12, r
