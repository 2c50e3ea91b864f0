"""shardwise.parallelize on real Gloo processes against the single-device run of the same
model, seed and data: 5 AdamW steps, the loss of every step and the final full parameters.

float64 throughout: the comparison is then about the rewrite, not rounding. (In float32,
AdamW turns rounding noise on gradients that are zero in theory, such as attention's key
bias, into lr-sized steps: TinyGPT's qkv.bias drifts by 4e-3 relative while the losses
agree to 2e-7.) Plans come from the search: Megatron's on a 2 GiB A100 mesh is searched on
the model at a large width (meta device, no weights) and runs on a narrow copy of it with
the same names, through its JSON."""
from __future__ import annotations

import json
import os
import re
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import shardwise
from conftest import TwoBranch, run_ranks, with_zero
from rank_ir_check import engine_against_rank_ir
from shardwise.models import CausalLMWithLoss
from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

transformers = pytest.importorskip("transformers")

STEPS = 5
TOLERANCE = 1e-7  # relative, float64 (the issue's bar is 1e-5; measured errors are 1e-16 .. 1e-8)


# ---- models (built identically in the test and in every rank) --------------------------------
WithLoss = CausalLMWithLoss  # a causal LM and its loss in one module, as parallelize(model, (ids, y)) captures it


def gpt2(hidden: int, seq: int, vocab: int):
    return WithLoss(transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=hidden, n_head=16, vocab_size=vocab, n_positions=seq, resid_pdrop=0, embd_pdrop=0,
        attn_pdrop=0)))


def llama(hidden: int, seq: int, vocab: int):
    return WithLoss(transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=hidden, intermediate_size=int(2.75 * hidden), num_attention_heads=16,
        num_key_value_heads=16, vocab_size=vocab, max_position_embeddings=seq)))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 4)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = F.relu(self.bn(self.conv1(x)))
        x = F.relu(self.conv2(x))
        return self.fc(x.flatten(1))


def bert():
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                  vocab_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return transformers.BertForMaskedLM(cfg)


class _BertWithLabels(nn.Module):
    """Masked LM with its own loss (labels = the ids: nothing ignored)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, labels):
        return self.m(input_ids=input_ids, labels=labels).loss


def _shifted(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return ids, torch.roll(ids, -1, dims=1)


def _ids(batch: int, seq: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _cases() -> dict:
    """name -> (build model, batch tensors, loss_fn)."""
    return {
        "tiny_gpt": (lambda: TinyGPT(TinyGPTConfig(layers=4)), lambda: _shifted(_ids(8, 32, 256, 1)), None),
        "tiny_gpt_wide": (lambda: TinyGPT(TinyGPTConfig(layers=2, hidden=256, heads=4)),
                          lambda: _shifted(_ids(16, 32, 256, 1)), None),
        "mlp_f32": (MLP, lambda: (torch.randn(8, 16, generator=torch.Generator().manual_seed(1)),
                                  torch.randint(0, 4, (8,), generator=torch.Generator().manual_seed(2))),
                    F.cross_entropy),
        "mlp": (MLP, lambda: (torch.randn(8, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64),
                              torch.randint(0, 4, (8,), generator=torch.Generator().manual_seed(2))), F.cross_entropy),
        "two_branch": (TwoBranch, lambda: (torch.randn(8, 16, generator=torch.Generator().manual_seed(1),
                                                       dtype=torch.float64),
                                           torch.randint(0, 8, (8,), generator=torch.Generator().manual_seed(2))),
                       F.cross_entropy),
        "cnn": (SmallCNN, lambda: (torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(1),
                                               dtype=torch.float64),
                                   torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(2))),
                F.cross_entropy),
        "bert": (lambda: _BertWithLabels(bert()), lambda: (_ids(4, 16, 128, 1), _ids(4, 16, 128, 1)), None),
        "gpt2": (lambda: gpt2(64, 16, 128), lambda: (_ids(2, 16, 128, 1), _ids(2, 16, 128, 2)), None),
        "gpt2_batch4": (lambda: gpt2(64, 16, 128), lambda: (_ids(4, 16, 128, 1), _ids(4, 16, 128, 2)), None),
        "gpt2_batch16": (lambda: gpt2(64, 16, 128), lambda: (_ids(16, 16, 128, 1), _ids(16, 16, 128, 2)), None),
        # GPT-2's own vocabulary: 50257 words split 4 ways cannot be even
        "gpt2_vocab50257": (lambda: gpt2(64, 16, 50257), lambda: (_ids(2, 16, 50257, 1), _ids(2, 16, 50257, 2)),
                            None),
        # hidden 256: 16 heads of 16, so the rotary table (head_dim / 2) still splits 4 ways
        "llama": (lambda: llama(256, 16, 128), lambda: (_ids(2, 16, 128, 1), _ids(2, 16, 128, 2)), None),
    }


# ---- the ranks ---------------------------------------------------------------------------------
def _train_and_compare(rank: int, world: int, case: str, plan_json: str | None, mesh, result_path: str,
                       stage_memory: float | None = None, zero: bool = False, hetero: bool = False) -> None:
    build, make_batch, loss_fn = _cases()[case]
    torch.manual_seed(0)
    dtype = torch.float32 if case.endswith("_f32") else torch.float64
    model = build().to(dtype)
    reference = build().to(dtype)
    reference.load_state_dict(model.state_dict())
    batch = make_batch()
    plan = shardwise.Plan.from_json(plan_json) if plan_json else None
    cluster = shardwise.Cluster.preset("cpu", world)
    if stage_memory is not None:  # little memory per rank: a pipeline stage's sub-mesh, or the job's
        stage_size = plan.data * plan.tensor if plan is not None else world
        doc = json.loads(shardwise.Cluster.preset("cpu", stage_size).to_json())
        doc["device_types"][0]["memory_bytes"] = int(stage_memory)
        cluster = shardwise.Cluster.from_json(json.dumps(doc))
    if hetero:  # one A100 and one V100
        doc = json.loads(shardwise.Cluster.preset("mixed-a100-v100").to_json())
        doc["nodes"][0]["devices"] = [{"count": 1, "device": "a100-pcie-80gb"}, {"count": 1, "device": "v100-pcie-32gb"}]
        cluster = shardwise.Cluster.from_json(json.dumps(doc))
    # The heterogeneous case: priced in bf16, as an A100 + V100 pair trains (the A100's share
    # is its bf16 rate's; in f32 the two run at 19.5 and 15.7 TFLOP/s).
    engine = shardwise.parallelize(model, batch, loss_fn, plan=plan, mesh=mesh, cluster=cluster,
                                   precision="bf16" if hetero else None)
    if zero:  # ZeRO set by hand on the searched plan (conftest.with_zero)
        engine = shardwise.parallelize(model, batch, loss_fn, plan=with_zero(engine.plan))
    optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-2) if zero else torch.optim.AdamW(engine.parameters(), lr=1e-2)
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    losses, ref_losses = [], []
    for _ in range(STEPS):
        optimizer.zero_grad()
        losses.append(engine.train_step(*batch).item())
        optimizer.step()
        ref_optimizer.zero_grad()
        loss = loss_fn(reference(*batch[:-1]), batch[-1]) if loss_fn else reference(*batch)
        loss.backward()
        ref_optimizer.step()
        ref_losses.append(loss.item())
    roundtrip = None
    if case == "mlp":  # the same plan through its JSON, in a second engine: the same losses, bit for bit
        torch.manual_seed(0)
        again = shardwise.parallelize(build().double(), batch, loss_fn,
                                      plan=shardwise.Plan.from_json(engine.plan.to_json()))
        opt = torch.optim.AdamW(again.parameters(), lr=1e-2)
        roundtrip = []
        for _ in range(STEPS):
            opt.zero_grad()
            roundtrip.append(again.train_step(*batch).item())
            opt.step()
    # Forward only, after training: the loss of the same batch on one device.
    eval_loss = engine.eval_step(*batch).item()
    with torch.no_grad():
        ref_eval = (loss_fn(reference(*batch[:-1]), batch[-1]) if loss_fn else reference(*batch)).item()
    full = engine.full_state_dict()
    ref_params = dict(reference.named_parameters())
    # Relative to the tensor's largest magnitude, floored at 1e-6: a parameter whose gradient
    # is zero in theory (attention's key bias) holds only rounding noise (1e-14) after training.
    param_error = max(((full[k] - p).abs().max() / p.abs().max().clamp_min(1e-6)).item()
                      for k, p in ref_params.items())
    loss_error = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump({"case": case, "engine": type(engine).__name__, "loss_error": loss_error, "eval_error": abs(eval_loss - ref_eval) / abs(ref_eval),
                       "param_error": param_error, "losses": losses,
                       "ref_losses": ref_losses, "code": engine.code, "whole": engine.whole_nodes,
                       "rank_ir": getattr(engine, "rank_ir", None),
                       # Every program (SPMD, or each pipeline stage's) against its rank IR,
                       # collectives included (rank_ir_check.py).
                       "lowered": engine_against_rank_ir(engine),
                       "mesh": (engine.plan.sharding or {}).get("mesh"), "placements": engine.plan.placements(),
                       "stage_meshes": engine.plan.stage_meshes,
                       "stage_mesh": engine.sharding.sharding["mesh"] if getattr(engine, "sharding", None)
                       else [1, 1],
                       "stage_placements": engine.sharding.placements() if getattr(engine, "sharding", None)
                       else None, "zero": (engine.plan.sharding or {}).get("zero"),
                       "state": optimizer.local_state_numel() if zero else None, "roundtrip": roundtrip,
                       "local_rows": engine._local_batch(batch)[-1].shape[0] if hetero else None,
                       "blocks": sorted({int(n.split(".")[1]) for stage in getattr(engine, "_stages", {}).values()
                                         for n, _ in stage["module"].named_parameters()
                                         if n.startswith("blocks.")}),
                       "whole_state": sum(v.numel() for s in ref_optimizer.state.values() for v in s.values()
                                          if v.dim() > 0)}, f)


def _run(rank: int, world: int, store_path: str, args: tuple) -> None:
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        _train_and_compare(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(world: int, case: str, plan_json: str | None = None, mesh=None, stage_memory: float | None = None,
           zero: bool = False, hetero: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        run_ranks(_run, args=(world, os.path.join(tmp, "store"),
                             (case, plan_json, mesh, result, stage_memory, zero, hetero)),
                 nprocs=world)
        with open(result) as f:
            return json.load(f)


def _searched(model_builder, batch: int, seq: int, mesh, gib: float = 2.0, vocab: int = 50304) -> shardwise.Plan:
    """The search's plan for the model at a large width on `mesh` A100s of `gib` GiB."""
    with torch.device("meta"):
        model = model_builder(2048, 512, vocab)
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    graph = shardwise.capture(model, (ids, ids))
    doc = json.loads(shardwise.Cluster.preset("dgx-a100", 1).to_json())
    doc["nodes"][0]["count"] = mesh[0] * mesh[1]
    doc["device_types"][0]["memory_bytes"] = int(gib * 2**30)
    # bf16, as such a model trains on A100s (the model is built in float32 on the meta device).
    return shardwise.plan(graph, shardwise.Cluster.from_json(json.dumps(doc)), global_batch=batch, mesh=mesh,
                          precision="bf16")


def _check(result: dict) -> None:
    print(f"parallelize errors: {result['case']}: losses {result['loss_error']:.1e}, "
          f"parameters {result['param_error']:.1e}")
    assert result["loss_error"] < TOLERANCE, result
    assert result["eval_error"] < TOLERANCE, result
    assert result["param_error"] < TOLERANCE, result
    # The programs that ran (the SPMD one, or each pipeline stage's) are their rank IR, node for
    # node, collectives included.
    lowered = result["lowered"]
    print(f"against the rank IR: {lowered['programs']} programs, {lowered['calls']} ATen calls, "
          f"{lowered['collectives']} resharding regions")
    assert lowered["programs"] >= 1 and lowered["calls"] > 0 and lowered["mismatches"] == [], lowered["mismatches"][:5]


# ---- the cases -----------------------------------------------------------------------------------
def test_data_parallel_mlp_equals_one_device():
    r = _spawn(2, "mlp", mesh=(2, 1))
    _check(r)
    assert r["placements"]["x"] == ["S(0)", "R"] and r["placements"]["fc1.weight"] == ["R", "R"]
    assert "reshard" in r["code"]  # the loss: a mean over the data axis
    assert r["roundtrip"] == r["losses"]  # the plan saved as JSON and loaded again: identical


def test_a_learned_position_embedding_is_reduced_in_the_buckets_as_ddp_reduces_it():
    # TinyGPT adds wpe(arange(T)), the same on every data rank, to each row's token embedding:
    # every rank's gradient of that replicated output is its rows' share, and the ranks' shares
    # sum in wpe's gradient, which the engine reduces in its buckets after backward (DDP's
    # reduction), not by an all-reduce of the output's gradient, exposed in backward.
    r = _spawn(2, "tiny_gpt", mesh=(2, 1))
    _check(r)
    ir = r["rank_ir"]
    assert "shardwise::reduce_gradient(%wpe.weight) {axes=[0]" in ir, ir
    backward_reductions = [line for line in ir.splitlines() if "shardwise::all_reduce" in line and 'pass="backward"' in line]
    assert not any("embedding" in line for line in backward_reductions), backward_reductions


def test_data_and_tensor_parallel_mlp_in_float32_within_the_issues_bar():
    # float32 (the rest run float64, see the module docstring): a 2 x 1 data-parallel plan and
    # a 1 x 2 plan of the same MLP, losses and parameters within 1e-5 of one device.
    for mesh in ((2, 1), (1, 2)):
        r = _spawn(2, "mlp_f32", mesh=mesh)
        print(f"parallelize errors: mlp float32 mesh {mesh}: losses {r['loss_error']:.1e}, "
              f"parameters {r['param_error']:.1e}")
        assert r["loss_error"] < 1e-5 and r["param_error"] < 1e-5, (mesh, r)


def test_megatron_gpt2_with_sequence_parallelism_equals_one_device():
    plan = _searched(gpt2, batch=2, seq=512, mesh=(1, 4))
    p = plan.placements()
    block = "m.transformer.h.0."
    assert p[block + "attn.c_attn.weight"][1] == "S(1,g3)"   # column-parallel, strided q/k/v
    assert p[block + "attn.c_proj.weight"][1] == "S(0)"      # row-parallel
    assert p[block + "mlp.c_fc.weight"][1] == "S(1)"
    assert p[block + "mlp.c_proj.weight"][1] == "S(0)"
    r = _spawn(4, "gpt2", plan.to_json())
    _check(r)
    code = r["code"]
    assert "vocab_lookup" in code                            # vocabulary-parallel embedding
    # Sequence parallel: a reduce-scatter after each sublayer (of the [b, s, h] output's
    # sequence dim, or of the flattened tokens) and an all-gather before the next.
    assert code.count("reduce_scatter(axis 1, dim ") >= 4, code
    assert "all_gather(axis 1, dim 0" in code
    # The rank IR is the program that ran: the same collectives, forward and backward, each a node.
    ir = r["rank_ir"]
    assert "shardwise::embedding_lookup" in ir
    assert r["whole"] == [], r["whole"]                       # every node has its local form
    # (A prefetched gather names its step twice in the code: where it is issued and where it
    # is waited for.)
    steps = "\n".join(line for line in code.splitlines() if "self.prefetch.start(" not in line)
    for kind in ("all_gather", "reduce_scatter", "all_reduce", "slice"):
        assert ir.count(f"shardwise::{kind}(") == steps.count(f"'{kind}(axis"), kind
    # Every ATen call and every collective of the program is the rank IR's node (rank_ir_check.py).
    lowered = r["lowered"]
    assert lowered["calls"] > 50 and lowered["collectives"] > 10 and lowered["mismatches"] == [], lowered


def test_gpt2_uneven_vocabulary_parallel_embedding_and_head_equal_one_device():
    # 50257 words on 4 ranks: 12565 on rank 0, 12564 on the others. The tied table is
    # vocabulary-parallel for both of its readers: the lookup (each rank its rows, partial
    # sums reduced) and the LM head (each rank its words' logits).
    plan = _searched(gpt2, batch=2, seq=512, mesh=(1, 4), vocab=50257)
    assert plan.placements()["m.transformer.wte.weight"][1].startswith("S(0)[0.2500149")
    strategies = plan.strategies()
    assert strategies["embedding"][1] == "split V" and strategies["linear"][1] == "split n"
    r = _spawn(4, "gpt2_vocab50257", plan.to_json())
    _check(r)
    assert "vocab_lookup" in r["code"] and ", 0, 12565," in r["code"]  # rank 0's rows [0, 12565)
    # The loss combines each rank's words' statistics: no rank gathers the 50257 logits.
    assert "vocab_cross_entropy" in r["code"] and "shardwise::vocab_cross_entropy" in r["rank_ir"]
    assert r["whole"] == [], r["whole"]


def test_tensor_parallel_llama_equals_one_device():
    plan = _searched(llama, batch=2, seq=512, mesh=(1, 4))
    p = plan.placements()
    mlp = "m.model.layers.0.mlp."
    assert p[mlp + "gate_proj.weight"][1] == p[mlp + "up_proj.weight"][1] == "S(0)"  # column-parallel
    assert p[mlp + "down_proj.weight"][1] == "S(1)"                                   # row-parallel
    r = _spawn(4, "llama", plan.to_json())
    _check(r)
    # Readers that want a value the same way share its reshard (q, k and v, gate and up read
    # one gathered norm output): no reshard of the same value with the same steps twice.
    calls = [line.split("self.reshard(", 1)[1].split(";")[0]
             for line in r["code"].splitlines() if "self.reshard(" in line]
    assert len(calls) == len(set(calls)), sorted(c for c in calls if calls.count(c) > 1)
    # The rotary positions' arange, split with the sequence, runs as each rank's block of it
    # (arange.start_step), not whole: every node has its local form.
    assert r["whole"] == [], r["whole"]


def test_hybrid_data_by_tensor_gpt2_equals_one_device():
    plan = _searched(gpt2, batch=4, seq=512, mesh=(2, 2))
    # The first block's MLP up-projection: output features (Megatron's column split) over the
    # tensor axis; the data axis splits what the search finds cheapest (the tokens, or the
    # features further where ZeRO's broadcasts would cost more).
    assert plan.strategies()["addmm_2"][1] == "split n"
    r = _spawn(4, "gpt2_batch4", plan.to_json())
    _check(r)
    assert r["mesh"] == [2, 2]


def test_zero_sharded_optimizer_state_equals_one_device():
    # TinyGPT on 2 x 2 CPU ranks: the search replicates most weights and shards their optimizer
    # state over both axes (ZeRO); engine.optimizer steps them with ZeroRedundancyOptimizer.
    r = _spawn(4, "tiny_gpt", mesh=(2, 2), zero=True)
    _check(r)
    assert r["zero"], "the plan shards some optimizer state"
    assert r["state"] < 0.5 * r["whole_state"], (r["state"], r["whole_state"])


def test_uneven_batch_shares_on_a_heterogeneous_cluster_equal_one_device():
    # An A100 and a V100: the search gives the A100 15 of the 16 sequences; the whole batch
    # flows unevenly (gathered with padding where needed) and the loss' mean weighs each
    # rank's rows.
    r = _spawn(2, "tiny_gpt_wide", mesh=(2, 1), hetero=True)
    _check(r)
    assert r["placements"]["labels"][0].startswith("S(0)[")
    assert r["local_rows"] == 15


def test_uneven_batch_shares_of_transformers_gpt2_equal_one_device():
    # The same on a model nobody here wrote. (At this size the search keeps the token lookup
    # whole on each rank and cuts its output locally: no traffic, and the lookup is cheap;
    # test_heterogeneous.py has GPT-2's own size, where the shares start at input_ids.)
    r = _spawn(2, "gpt2_batch16", mesh=(2, 1), hetero=True)
    _check(r)
    assert r["placements"]["y"][0].startswith("S(0)["), r["placements"]["y"]
    assert r["local_rows"] > 8, r["local_rows"]
    assert "all_to_all" not in r["rank_ir"], r["rank_ir"]


@pytest.mark.parametrize("case,mesh", [("two_branch", (1, 2)), ("cnn", (2, 1)), ("bert", (1, 2))])
def test_searched_plans_of_other_models_equal_one_device(case, mesh):
    r = _spawn(2, case, mesh=mesh)
    _check(r)


# ---- pipeline plans -------------------------------------------------------------------------------
def _pipeline_plan(case: str, stages: int, micro_batch: int, schedule: str, virtual_stages: int = 1,
                   k: int = 1, data: int = 1, tensor: int = 1) -> str:
    """A hand-written pipeline plan (plans are data: Plan.manual would also cost it, which
    needs repeated layers the two-branch model does not have)."""
    batch = _cases()[case][1]()
    doc = {"format": "shardwise.plan", "version": 1, "data": data, "tensor": tensor, "pipeline": stages,
           "global_batch": int(batch[0].shape[0]), "micro_batch": micro_batch, "schedule": schedule,
           "virtual_stages": virtual_stages, "kfkb_k": k, "recompute": "none", "zero_stage": 0,
           "layers_per_stage": [], "precision": "f32"}
    return shardwise.Plan.from_json(json.dumps(doc)).to_json()


@pytest.mark.parametrize("schedule,virtual_stages,k", [("gpipe", 1, 1), ("1f1b", 1, 1), ("interleaved-1f1b", 2, 1),
                                                       ("kfkb", 1, 2)])
def test_pipeline_schedules_equal_one_device(schedule, virtual_stages, k):
    # TinyGPT's LM head is its embedding: the tied weight lives on the first and the last
    # stage, whose gradients are summed across the two ranks.
    r = _spawn(2, "tiny_gpt", _pipeline_plan("tiny_gpt", 2, 2, schedule, virtual_stages, k))
    _check(r)
    assert "Stage0" in r["code"] or "virtual stage" in r["code"]


def test_gradient_accumulation_plan_without_pipeline_equals_one_device():
    # Pipeline 1, data 2, micro-batches of 2 rows: 8 / (2 x 2) = 2 micro-batches accumulated
    # per step on each rank (what the joint planner returns for one node when the whole batch
    # does not fit at once).
    r = _spawn(2, "tiny_gpt", _pipeline_plan("tiny_gpt", 1, 2, "1f1b", data=2))
    _check(r)


def test_pipeline_follows_the_plans_layers_per_stage():
    # The joint planner's time-balanced split (cost/layer_balance.h): 3 of TinyGPT's 4 blocks
    # on the first stage, 1 on the last (which also holds the LM head), not FLOPs' 2 / 2.
    doc = json.loads(_pipeline_plan("tiny_gpt", 2, 2, "1f1b"))
    doc["layers_per_stage"] = [3, 1]
    r = _spawn(2, "tiny_gpt", shardwise.Plan.from_json(json.dumps(doc)).to_json())
    _check(r)
    assert r["blocks"] == [0, 1, 2]


def test_pipeline_stages_run_on_the_rank_blocks_the_plan_orders():
    # plan.stage_groups (a heterogeneous cluster's stages on the devices that suit them): the
    # first stage (3 blocks) on ranks 2-3, the last (1 block and the LM head) on ranks 0-1,
    # each a data-parallel pair; values cross between the same sub-mesh coordinates.
    doc = json.loads(_pipeline_plan("tiny_gpt", 2, 2, "1f1b", data=2))
    doc["layers_per_stage"] = [3, 1]
    doc["stage_groups"] = [1, 0]
    r = _spawn(4, "tiny_gpt", shardwise.Plan.from_json(json.dumps(doc)).to_json())
    _check(r)
    assert r["blocks"] == [3], r["blocks"]  # rank 0 runs the last stage


@pytest.mark.parametrize("meshes,layers,schedule", [([[1, 1], [2, 1]], [3, 1], "1f1b"),
                                                     ([[1, 2], [1, 1]], [1, 3], "1f1b"),
                                                     ([[1, 1], [2, 1]], [1, 3], "zb-h1"),
                                                     ([[2, 1], [1, 2]], [2, 2], "1f1b")])
def test_pipeline_stages_on_sub_meshes_of_different_sizes_equal_one_device(meshes, layers, schedule):
    # plan.stage_meshes (Alpa's inter-op stages): one stage on one rank, the other on two (a
    # data pair, or a tensor pair), with different layer counts; or two stages of two ranks
    # of different shapes. What crosses the cut is gathered whole on the sending sub-mesh and
    # cut to the receiver's layout; the tied embedding / LM head, on both stages, has its
    # gradient summed whole over their ranks. ZB-H1: the same with backward split in B and W.
    doc = json.loads(_pipeline_plan("tiny_gpt", 2, 4, schedule))
    doc["layers_per_stage"] = layers
    doc["stage_meshes"] = meshes
    world = sum(a * b for a, b in meshes)
    r = _spawn(world, "tiny_gpt", shardwise.Plan.from_json(json.dumps(doc)).to_json())
    _check(r)
    assert r["stage_meshes"] == meshes
    assert r["stage_mesh"] == meshes[0]  # rank 0's stage runs its own layout, on its own mesh
    # rank 0 runs stage 0: its blocks are the plan's first `layers[0]`
    assert r["blocks"] == list(range(layers[0])), r["blocks"]


def test_a_batch_that_fits_only_in_micro_batches_runs_with_gradient_accumulation():
    # Memory per rank below what any sharding of one step of the whole batch needs, but above
    # what the joint planner's micro-batches need: parallelize runs the latter, no plan given.
    build, make_batch, _ = _cases()["tiny_gpt"]
    model, batch = build().double(), make_batch()
    graph = shardwise.capture(model, batch)

    def cluster(usable: float):
        doc = json.loads(shardwise.Cluster.preset("cpu", 2).to_json())
        doc["device_types"][0]["memory_bytes"] = int(usable / shardwise._C.MEMORY_FRACTION)  # what plans may use
        return shardwise.Cluster.from_json(json.dumps(doc))

    # With too little memory the search returns the sharding that needs the least: 2% below it.
    least = shardwise.Plan.search(graph, cluster(1.0), global_batch=8)
    assert least.fits is False
    usable = 0.98 * least.predicted_memory()[0]
    assert shardwise.Plan.search(graph, cluster(usable), global_batch=8).fits is False
    joint = shardwise.Plan.joint(graph, cluster(usable), global_batch=8)
    assert joint.fits and joint.num_micro_batches() > 1, joint
    r = _spawn(2, "tiny_gpt", stage_memory=usable / shardwise._C.MEMORY_FRACTION)
    _check(r)
    assert r["engine"] == "PipelineEngine"


def test_two_branch_model_split_across_four_pipeline_stages():
    r = _spawn(4, "two_branch", _pipeline_plan("two_branch", 4, 2, "1f1b"))
    _check(r)


@pytest.mark.slow
def test_data_by_tensor_by_pipeline_hybrid_at_world_size_eight():
    # 2 pipeline stages, each on a 2 x 2 {data, tensor} sub-mesh sharded by the search (little
    # memory per rank, so the tensor axis shards the weights too); 2 micro-batches of 2 x 2 rows.
    r = _spawn(8, "tiny_gpt", _pipeline_plan("tiny_gpt", 2, 2, "1f1b", data=2, tensor=2), stage_memory=3e5)
    _check(r)
    sharded = [k for k, v in r["stage_placements"].items() if k.endswith("weight") and v[1] != "R"]
    assert "blocks.0.qkv.weight" in sharded


def test_readme_training_job_runs_under_torchrun():
    """The README's main job (scripts/quickstart.sh runs it with 4 processes after installing)."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(shardwise.__path__[0]),
                                                                     os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "shardwise", "train", "--steps", "3"], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "loss (one device)" in out.stdout and "predicted step" in out.stdout
    # The report names what a user recognises: MFU beside the CPU's peak (no "0.0 TFLOP/s"),
    # the mesh by what it carries, memory by kind beside the device's capacity.
    assert re.search(r"^predicted step [\d.]+ m?s, MFU [\d.]+% of [\d.]+ [GT]FLOP/s f32 peak per device$", out.stdout,
                     re.M), out.stdout
    assert re.search(r"^plan +2 x cpu: batch.* over ", out.stdout, re.M), out.stdout
    assert re.search(r"^memory per device [\d.]+ [kM]?B of [\d.]+ GB", out.stdout, re.M), out.stdout
    assert "TFLOP/s per device" not in out.stdout and "_total" not in out.stdout
    last = [line for line in out.stdout.splitlines() if line.startswith("largest relative difference")][-1]
    losses = float(last.split("losses ")[1].split(",")[0])
    assert losses < 1e-12, last


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (NCCL)")
def test_nccl_world_size_one():
    """The CUDA / NCCL path of the same code: collectives and a parallelized model at world 1."""
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl", store=dist.FileStore(os.path.join(tmp, "store"), 1), rank=0, world_size=1)
        try:
            from shardwise import collectives as C

            x = torch.arange(6.0, device="cuda").reshape(2, 3).requires_grad_()
            assert torch.equal(C.all_reduce(x), x) and torch.equal(C.all_gather(x, dim=1), x)
            torch.manual_seed(0)
            model = MLP().cuda()
            reference = MLP().cuda()
            reference.load_state_dict(model.state_dict())
            batch = (torch.randn(8, 16, device="cuda"), torch.randint(0, 4, (8,), device="cuda"))
            engine = shardwise.parallelize(model, batch, F.cross_entropy, mesh=(1, 1),
                                           cluster=shardwise.Cluster.preset("cpu", 1))
            loss = engine.train_step(*batch)
            expected = F.cross_entropy(reference(batch[0]), batch[1])
            assert torch.allclose(loss, expected, rtol=1e-5)
        finally:
            dist.destroy_process_group()


# ---- bad input: clear errors, raised before any collective --------------------------------------
def _errors(rank: int, world: int, result_path: str) -> None:
    torch.manual_seed(0)
    model = MLP().double()
    batch = (torch.randn(8, 16, dtype=torch.float64), torch.randint(0, 4, (8,)))
    messages = {}

    def expect(key, fn):
        try:
            fn()
        except shardwise.ValidationError as e:
            messages[key] = str(e)
        else:
            messages[key] = None

    engine = shardwise.parallelize(model, batch, F.cross_entropy, mesh=(2, 1), cluster=shardwise.Cluster.preset("cpu", 2),
                                   static=True)
    expect("shape", lambda: engine.train_step(torch.randn(4, 16, dtype=torch.float64), batch[1][:4]))
    expect("count", lambda: engine.train_step(batch[0]))
    other = shardwise.parallelize(TwoBranch().double(), batch, F.cross_entropy, mesh=(2, 1),
                                  cluster=shardwise.Cluster.preset("cpu", 2))
    expect("model", lambda: shardwise.parallelize(model, batch, F.cross_entropy, plan=other.plan))
    doc = json.loads(engine.plan.to_json())
    doc["global_batch"], doc["micro_batch"] = 16, 16
    expect("batch", lambda: shardwise.parallelize(model, batch, F.cross_entropy,
                                                  plan=shardwise.Plan.from_json(json.dumps(doc))))
    expect("world", lambda: shardwise.parallelize(model, batch, F.cross_entropy, mesh=(4, 1),
                                                  cluster=shardwise.Cluster.preset("cpu", 4)))
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(messages, f)


def _run_errors(rank: int, world: int, store_path: str, result_path: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        _errors(rank, world, result_path)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_bad_input_gets_clear_errors():
    with pytest.raises(shardwise.ValidationError, match="init_process_group"):
        shardwise.parallelize(MLP(), (torch.randn(8, 16), torch.randint(0, 4, (8,))), F.cross_entropy)
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        run_ranks(_run_errors, args=(2, os.path.join(tmp, "store"), result), nprocs=2)
        with open(result) as f:
            messages = json.load(f)
    assert "'x': [4, 16]" in messages["shape"] and "'x': [8, 16]" in messages["shape"], messages["shape"]
    assert "static=True" in messages["shape"]
    assert "missing a required argument: 'x'" in messages["count"], messages["count"]
    assert "plan made for another model" in messages["model"] and "fingerprint" in messages["model"], messages["model"]
    assert "global batch 16" in messages["batch"]
    assert "4 devices, the job 2 ranks" in messages["world"]
