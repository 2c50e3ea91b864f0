"""A plan that recomputes runs recomputed: each repeated block (a transformer layer) is one
checkpointed region of the rank program, as the search prices it (its forward again in
backward, one block's activations kept), and training is still one device's.

transformers GPT-2 (3 layers, dropout on, float64) on 2 Gloo ranks, the searched plan with
recomputation set, against the same plan without it and against one device: losses and
parameters within 1e-9 (dropout draws the same masks when a block runs again), batch norm
style state writes happen once, and the activations saved for backward shrink.
"""
from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

import shardwise
from conftest import run_ranks, train_one_device
from shardwise.models import CausalLMWithLoss

transformers = pytest.importorskip("transformers")

STEPS, TOLERANCE, FLOAT32_ROUTER_TOLERANCE = 2, 1e-9, 2e-6


def _model():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=96, n_positions=32, resid_pdrop=0.1,
                                  embd_pdrop=0.1, attn_pdrop=0.1)
    return CausalLMWithLoss(transformers.GPT2LMHeadModel(cfg)).double().train()


def _batch(step: int):
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 96, (4, 16), generator=g)
    return ids, ids.clone()


class ConvBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))) + x


class BatchNormLayers(torch.nn.Module):
    """Two repeated blocks, each writing batch norm's running statistics and its
    num_batches_tracked in training: state a block run again must not write twice."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([ConvBlock(), ConvBlock()])
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x, y):
        for block in self.blocks:
            x = block(x)
        return torch.nn.functional.cross_entropy(self.head(x.mean((2, 3))), y)


def _bn_model():
    torch.manual_seed(0)
    return BatchNormLayers().double().train()


def _bn_batch(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(4, 4, 6, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (4,), generator=g)


def _deepseek_model(implementation: str | None = None):
    """transformers' DeepSeek-V3, two families of repeated blocks: 2 dense layers
    (first_k_dense_replace), then 2 mixture-of-experts layers. `implementation`: the experts'
    (None: transformers' default, which the capture takes as one op; the reference runs "eager")."""
    cfg = transformers.DeepseekV3Config(
        num_hidden_layers=4, first_k_dense_replace=2, hidden_size=32, intermediate_size=64, moe_intermediate_size=64,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1, kv_lora_rank=16,
        q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=96, max_position_embeddings=32)
    if implementation is not None:
        cfg._experts_implementation = implementation
    torch.manual_seed(0)
    return CausalLMWithLoss(transformers.DeepseekV3ForCausalLM(cfg)).double().train()


def _saved_bytes(engine, batch) -> tuple[float, int]:
    """One training step's loss and the bytes autograd saved for its backward outside
    checkpointed regions (what a step holds between forward and backward)."""
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = engine.train_step(*batch)
    return float(loss), saved[0]


def _train(engine, optimizer, batch_of) -> tuple[list[float], list[int]]:
    """STEPS steps: each one's loss and the bytes it saved for backward outside checkpoints."""
    losses, saved = [], []
    for step in range(STEPS):
        loss, nbytes = _saved_bytes(engine, batch_of(step))
        losses.append(loss)
        saved.append(nbytes)
        optimizer.step()
        optimizer.zero_grad()
    return losses, saved


def _relative_error(state: dict, reference: dict) -> float:
    """The largest difference from the reference's state, relative to each tensor's largest value."""
    return max(((state[n].double() - t.double()).abs().max() / t.double().abs().max().clamp_min(1e-6)).item()
               for n, t in reference.items())


def _worker(rank: int, world: int, store: str, result: str, name: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    model_of, batch_of, reference_of = {"gpt2": (_model, _batch, _model), "batchnorm": (_bn_model, _bn_batch, _bn_model),
                                        "deepseek_v3": (_deepseek_model, _batch, lambda: _deepseek_model("eager"))}[name]
    try:
        _run(rank, world, result, model_of, batch_of, reference_of)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run(rank, world, result, _model, _batch, _reference):
    if True:
        searched = shardwise.parallelize(_model(), _batch(0), mesh=(world, 1),
                                         cluster=shardwise.Cluster.preset("cpu", world), verify=False).plan
        out = {}
        for recompute in (False, True):
            doc = json.loads(searched.to_json())
            doc.pop("predicted", None)
            doc.pop("programs", None)
            doc["sharding"]["recompute"] = recompute
            engine = shardwise.parallelize(_model(), _batch(0), plan=shardwise.Plan.from_json(json.dumps(doc)))
            optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-2)
            torch.manual_seed(5)  # the dropout masks' generator state, the same for every run
            losses, saved = _train(engine, optimizer, _batch)
            out[str(recompute)] = {"losses": losses, "saved": saved, "state": engine.full_state_dict(),
                                   "rank_ir": engine.rank_ir, "code": engine.code}
        reference = _reference()
        ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
        torch.manual_seed(5)
        ref_losses = train_one_device(reference, _batch, STEPS, ref_opt)
        if rank == 0:
            ref = reference.state_dict()
            report = {"ref_losses": ref_losses}
            for key, run in out.items():
                report[key] = {"losses": run["losses"], "saved": run["saved"],
                               "error": _relative_error(run["state"], ref),
                               "from_plain": _relative_error(run["state"], out["False"]["state"]),
                               "blocks": sorted({line.split("shardwise.recompute=")[1].split(",")[0].split("}")[0]
                                                 for line in run["rank_ir"].splitlines()
                                                 if "shardwise.recompute=" in line}),
                               "code": run["code"]}
            with open(result, "w") as f:
                json.dump(report, f)


def _spawn(name: str) -> dict:
    world = 2
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        run_ranks(_worker, args=(world, os.path.join(tmp, "store"), result, name), nprocs=world)
        with open(result) as f:
            return json.load(f)


def _expect_one_device(r: dict, parameter_tolerance: float = TOLERANCE) -> None:
    """Both runs' losses within TOLERANCE of one device's, their parameters (and buffers)
    within `parameter_tolerance`."""
    for run in (r["False"], r["True"]):
        for a, b in zip(run["losses"], r["ref_losses"]):
            assert abs(a - b) <= TOLERANCE * abs(b), (run["losses"], r["ref_losses"])
        assert run["error"] < parameter_tolerance, run["error"]


def test_recomputed_plan_checkpoints_each_layer_and_equals_one_device():
    r = _spawn("gpt2")
    plain, recomputed = r["False"], r["True"]
    _expect_one_device(r)
    assert plain["blocks"] == [] and recomputed["blocks"] == ["0", "1", "2"]  # one region per layer
    # The layers' activations are made again in backward, not kept: what the step holds
    # between forward and backward shrinks (the search prices one layer's instead of three).
    print(f"saved for backward: {plain['saved'][0]} bytes plain, {recomputed['saved'][0]} recomputed")
    assert recomputed["saved"][0] < 0.6 * plain["saved"][0], (plain["saved"], recomputed["saved"])
    assert "all_reduce" in recomputed["code"] or "reshard" in recomputed["code"]  # the flat program prints


def test_recomputed_blocks_write_batch_norm_state_once():
    # Running statistics and num_batches_tracked after 2 steps equal one device's: the
    # copy into the state is skipped when backward runs a block again.
    r = _spawn("batchnorm")
    assert r["True"]["blocks"] == ["0", "1"]
    _expect_one_device(r)  # the state dict: buffers included


def test_recomputation_checkpoints_every_family_of_repeated_blocks():
    # DeepSeek-V3's dense first layers are a family of their own beside its mixture-of-experts
    # layers: both are checkpointed (the planner prices both so: cost::checkpoint_outer_blocks),
    # one region per layer, and training is one device's.
    # Its router's logits are float32 in a float64 model, so a batch split 2 ways rounds their
    # weight's gradient as DDP's would (test_expert_parallel.py): against one device the
    # parameters agree to float32's rounding; the recomputed run equals the plain one to float64's.
    r = _spawn("deepseek_v3")
    plain, recomputed = r["False"], r["True"]
    _expect_one_device(r, FLOAT32_ROUTER_TOLERANCE)
    assert recomputed["from_plain"] < TOLERANCE, recomputed["from_plain"]
    assert plain["blocks"] == [] and recomputed["blocks"] == ["0", "1", "2", "3"]
    # (2,560,072 bytes plain, 1,648,712 recomputed: the embedding, head and loss keep theirs)
    print(f"saved for backward: {plain['saved'][0]} bytes plain, {recomputed['saved'][0]} recomputed")
    assert recomputed["saved"][0] < 0.7 * plain["saved"][0], (plain["saved"], recomputed["saved"])


def _pipeline_worker(rank: int, world: int, store: str, result: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        def model():
            torch.manual_seed(0)
            cfg = transformers.GPT2Config(n_layer=4, n_embd=32, n_head=4, vocab_size=96, n_positions=32,
                                          resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
            return CausalLMWithLoss(transformers.GPT2LMHeadModel(cfg)).double().train()

        graph = shardwise.capture(model(), tuple(t[:2] for t in _batch(0)))  # one micro-batch, as parallelize does
        out = {}
        for recompute in (False, True):
            plan = shardwise.Plan.manual(graph, shardwise.Cluster.preset("cpu", world), pipeline=world, data=1,
                                         tensor=1, global_batch=4, micro_batch=2, schedule="1f1b",
                                         recompute=recompute)
            engine = shardwise.parallelize(model(), _batch(0), plan=plan)
            optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-2)
            losses, saved = _train(engine, optimizer, _batch)
            out[str(recompute)] = {"losses": losses, "saved": saved, "state": engine.full_state_dict()}
        reference = model()
        ref_losses = train_one_device(reference, _batch, STEPS, torch.optim.AdamW(reference.parameters(), lr=1e-2))
        ref = reference.state_dict()
        report = {"ref_losses": ref_losses}
        for key, run in out.items():
            report[key] = {"losses": run["losses"], "saved": run["saved"], "error": _relative_error(run["state"], ref)}
        with open(f"{result}.{rank}", "w") as f:
            json.dump(report, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_a_pipeline_with_a_stage_per_rank_recomputes_when_its_plan_says_so_and_equals_one_device():
    # Pipeline 2 x data 1 x tensor 1: each stage's program is the replicated one, which was
    # made without the plan's recomputation: recompute=True ran, and held, every layer's
    # activations (benchmarks/fidelity.py measured the same peak with and without it).
    world = 2
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        run_ranks(_pipeline_worker, args=(world, os.path.join(tmp, "store"), result), nprocs=world)
        reports = []
        for rank in range(world):
            with open(f"{result}.{rank}") as f:
                reports.append(json.load(f))
    for r in reports:
        plain, recomputed = r["False"], r["True"]
        for run in (plain, recomputed):
            for a, b in zip(run["losses"], r["ref_losses"]):
                assert abs(a - b) <= TOLERANCE * abs(b), (run["losses"], r["ref_losses"])
            assert run["error"] < TOLERANCE, run["error"]
        # Each rank's stage keeps only its layers' inputs (and the embedding's and head's own):
        # what a step holds between its forwards and backwards shrinks on both stages.
        print(f"saved for backward: {plain['saved'][0]} bytes plain, {recomputed['saved'][0]} recomputed")
        assert recomputed["saved"][0] < 0.6 * plain["saved"][0], (plain["saved"], recomputed["saved"])
