"""Plans that split the batch into micro-batches compute the whole batch's step (issue 45).

Each scenario runs on real Gloo ranks against the same loop on one process, in float64: a
pipeline or the gradient accumulation the search falls back to combines the micro-batch losses
as the loss's reduction requires (a sum is summed, a mean averaged), and a graph whose rows meet
in batch statistics (batch norm in training mode, a router's load-balancing loss) is refused
with micro-batches, naming the op and module, unless the user opts in with
``micro_batch_semantics="per_micro_batch"``. The engine follows the held module's train / eval
mode at every step. Every test here failed on the main branch before the fix."""
from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import shardwise
from conftest import accumulation_cluster, spawn_scenario

transformers = pytest.importorskip("transformers")

EXACT = 1e-9


# ---- models and losses ---------------------------------------------------------------------------
def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, vocab_size=64, max_position_embeddings=32, use_cache=False)
    return transformers.LlamaForCausalLM(cfg).double().train()


def _t5():
    torch.manual_seed(0)
    cfg = transformers.T5Config(num_layers=2, num_decoder_layers=2, d_model=32, d_kv=8, d_ff=64, num_heads=4,
                                vocab_size=64, decoder_start_token_id=0, dropout_rate=0.0)
    return transformers.T5ForConditionalGeneration(cfg).double().train()


def _resnet():
    torch.manual_seed(0)
    cfg = transformers.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 8], depths=[2, 2], num_labels=4)
    return transformers.ResNetForImageClassification(cfg).double().train()


def _mixtral():
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=64, vocab_size=64, max_position_embeddings=32, use_cache=False,
                                     num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
                                     router_aux_loss_coef=0.5)
    cfg._experts_implementation = "batched_mm"  # torch's grouped matmul has no float64 kernel
    return transformers.MixtralForCausalLM(cfg).double().train()


def titan_loss(out, labels):
    """torchtitan's cross_entropy_loss (torchtitan/components/loss.py): a sum over the tokens, the
    loop dividing by a count it fixes; here in the model's dtype (torchtitan's casts the logits
    to float32, whose rounding would hide a 1e-9 comparison)."""
    logits = out.logits if hasattr(out, "logits") else out
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1), reduction="sum", ignore_index=-100) / 64.0


def sum_loss(out, labels):
    """A plain reduction="sum" cross entropy, as a user passes loss_fn."""
    return F.cross_entropy(out.logits.flatten(0, 1), labels.flatten(0, 1), reduction="sum")


def _tokens(rows, seq=8, vocab=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (rows, seq), generator=g)


# ---- the loop on both sides ------------------------------------------------------------------------
def _train(engine, reference, batch: dict, reference_loss, steps=3, lr=0.05) -> dict:
    """`steps` SGD steps of the engine and of the reference on `batch`: the worst relative error
    of the losses and of every floating tensor of the state (SGD: a loss off by a factor shows
    in full, where AdamW's normalisation would hide it)."""
    opt = engine.optimizer(torch.optim.SGD, lr=lr)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr)
    loss_error = 0.0
    losses = []
    for _ in range(steps):
        loss = float(engine.train_step(**batch))
        opt.step()
        opt.zero_grad()
        ref = reference_loss(reference, batch)
        ref.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        loss_error = max(loss_error, abs(loss - float(ref)) / abs(float(ref)))
        losses.append((loss, float(ref)))
    full = engine.full_state_dict()
    error = max((full[n].double() - t.double()).abs().max().item() / max(t.double().abs().max().item(), 1e-30)
                for n, t in reference.state_dict().items() if t.is_floating_point())
    return {"loss_error": loss_error, "param_error": error, "losses": losses,
            "micro_batches": engine.plan.num_micro_batches() if not engine.plan.sharding else 1,
            "pipeline": engine.plan.pipeline}


def _with_loss(loss_fn, model_keys):
    def reference_loss(model, batch):
        return loss_fn(model(**{k: batch[k] for k in model_keys}), batch["target"])
    return reference_loss


def _refusal(fn) -> str:
    try:
        fn()
    except shardwise.ValidationError as e:
        return str(e)
    return ""


# ---- scenarios (every rank) ------------------------------------------------------------------------
def _scenario_sum_losses(rank, world):
    """torchtitan's sum loss through a 2-stage x data-2 pipeline (2 micro-batches, 1F1B) and
    through gradient accumulation on data 4; T5 with a sum loss under the automatic plan on
    a cluster too small for the whole batch at once."""
    out = {}
    cluster = shardwise.Cluster.preset("cpu", world)
    ids = _tokens(8)
    batch = {"input_ids": ids, "target": ids.roll(-1, 1)}
    graph = shardwise.capture(_llama(), {"input_ids": ids[:2]})
    for name, kw in (("pipeline", dict(pipeline=2, data=2, global_batch=8, micro_batch=2)),
                     ("accumulation", dict(pipeline=1, data=4, global_batch=8, micro_batch=1))):
        model = _llama()
        reference = copy.deepcopy(model)
        plan = shardwise.Plan.manual(graph, cluster, recompute=False, **kw)
        engine = shardwise.parallelize(model, batch, loss_fn=titan_loss, plan=plan)
        out[name] = _train(engine, reference, batch, _with_loss(titan_loss, ["input_ids"]))
    model = _t5()
    reference = copy.deepcopy(model)
    ids = _tokens(8, seq=16, seed=2)  # long enough that micro-batches save memory
    t5_batch = {"input_ids": ids, "decoder_input_ids": ids[:, :8], "target": ids[:, 1:9]}
    wrapped = shardwise.engine._Trainable(_t5(), sum_loss)
    # Priced in the model's precision (f32 for float64): in TIGHT_PRECISION, with activations
    # counted as autograd keeps them, micro-batches save this T5 no memory.
    small = accumulation_cluster(shardwise.capture(wrapped, {k: v for k, v in t5_batch.items()}), world, 8,
                                 precision=None)
    engine = shardwise.parallelize(model, t5_batch, loss_fn=sum_loss, cluster=small, zero=False)
    out["t5_automatic"] = _train(engine, reference, t5_batch, _with_loss(sum_loss, ["input_ids", "decoder_input_ids"]))
    return out


def _scenario_t5_pipeline(rank, world):
    model = _t5()
    reference = copy.deepcopy(model)
    ids = _tokens(4, seed=2)
    batch = {"input_ids": ids, "decoder_input_ids": ids[:, :4], "target": ids[:, 1:5]}
    graph = shardwise.capture(_t5(), {"input_ids": ids, "decoder_input_ids": ids[:, :4]})
    plan = shardwise.Plan.manual(graph, shardwise.Cluster.preset("cpu", world), pipeline=2, global_batch=4,
                                 micro_batch=1, recompute=False)
    engine = shardwise.parallelize(model, batch, loss_fn=sum_loss, plan=plan)
    return _train(engine, reference, batch, _with_loss(sum_loss, ["input_ids", "decoder_input_ids"]))


def _scenario_batch_statistics(rank, world):
    """ResNet (batch norm in training) and Mixtral with its router's load-balancing loss."""
    out = {}
    cluster = shardwise.Cluster.preset("cpu", world)
    g = torch.Generator().manual_seed(1)
    images = {"pixel_values": torch.randn(8, 3, 32, 32, generator=g, dtype=torch.float64),
              "labels": torch.randint(0, 4, (8,), generator=g)}
    graph = shardwise.capture(_resnet(), images)
    accumulate = dict(pipeline=1, data=2, global_batch=8, micro_batch=2, recompute=False)
    out["resnet_manual"] = _refusal(lambda: shardwise.Plan.manual(graph, cluster, **accumulate))
    chosen = shardwise.Plan.manual(graph, cluster, micro_batch_semantics="per_micro_batch", **accumulate)
    # An explicit plan (a saved one, edited back to exact) is refused by parallelize too.
    exact = shardwise.Plan.from_json(chosen.with_micro_batch_semantics("exact").to_json())
    out["resnet_explicit"] = _refusal(lambda: shardwise.parallelize(_resnet(), images, plan=exact))
    engine = shardwise.parallelize(_resnet(), images, plan=chosen)
    engine.train_step(**images)
    out["resnet_chosen_report"] = engine.plan.report()
    # (in the model's precision, as the T5 above)
    small = accumulation_cluster(shardwise.capture(shardwise.engine._Trainable(_resnet(), None), images), world, 8,
                                 precision=None)
    out["resnet_automatic"] = _refusal(lambda: shardwise.parallelize(_resnet(), images, cluster=small, zero=False))

    ids = _tokens(4, seed=3)
    tokens = {"input_ids": ids, "labels": ids}
    graph = shardwise.capture(_mixtral(), tokens)
    out["mixtral_pipeline"] = _refusal(lambda: shardwise.parallelize(
        _mixtral(), tokens, plan=shardwise.Plan.manual(graph, cluster, pipeline=2, global_batch=4, micro_batch=2,
                                                       recompute=False, micro_batch_semantics="per_micro_batch")
        .with_micro_batch_semantics("exact")))
    # One micro-batch through both stages: the batch's step.
    model = _mixtral()
    reference = copy.deepcopy(model)
    plan = shardwise.Plan.manual(graph, cluster, pipeline=2, global_batch=4, micro_batch=4, recompute=False)
    engine = shardwise.parallelize(model, tokens, plan=plan)
    out["mixtral_one_micro_batch"] = _train(engine, reference, tokens, lambda m, b: m(**b).loss)
    return out


class Dropped(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(8, 3)

    def forward(self, x, y):
        return F.cross_entropy(self.head(self.drop(torch.relu(self.fc(x)))), y)


def _scenario_modes(rank, world, pipeline):
    torch.manual_seed(0)
    model = Dropped().double()
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(8, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (8,), generator=g))
    plan = None
    if pipeline:
        graph = shardwise.capture(Dropped().double(), batch)
        plan = shardwise.Plan.manual(graph, shardwise.Cluster.preset("cpu", world), pipeline=1, data=world,
                                     global_batch=8, micro_batch=2, recompute=False)
    engine = shardwise.parallelize(model, batch, plan=plan, cluster=shardwise.Cluster.preset("cpu", world))
    model.eval()  # the module the user holds, as with DDP and FSDP2
    reference.eval()
    out = {"engine_training": engine.training}
    out["eval"] = [float(engine.eval_step(*batch)) for _ in range(2)]
    out["train_step_in_eval"] = float(engine.train_step(*batch))
    with torch.no_grad():
        out["reference"] = float(reference(*batch))
    model.train()
    out["engine_training_after"] = engine.training
    engine.eval()  # the engine's own switch sets the module's mode
    out["model_training_after_engine_eval"] = model.training
    return out


def _scenario_mask_across_a_cut(rank, world, padded=False):
    """Llama's automatic plan on a cluster where only micro-batches fit (the joint planner's
    least memory a fifth of the way to the SPMD search's): 2 stages, each a searched layout on 2 tensor
    ranks. Its causal mask, floating but computed from integers, crosses the cut and is
    resharded in the second stage. `padded`: with an attention_mask (a padded row, its labels
    -100), from which transformers builds the mask over an arange of the batch's rows."""
    def llama():  # the zoo's configuration
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=128, vocab_size=128,
                                       max_position_embeddings=64, bos_token_id=0, eos_token_id=0)
        return transformers.LlamaForCausalLM(cfg).double().train()

    ids = _tokens(8, seq=16, vocab=128, seed=3)
    batch = {"input_ids": ids, "labels": ids}  # the model's own loss (float32 logits: 1e-7 off)
    if padded:
        mask = torch.ones_like(ids)
        mask[1, 11:] = 0
        batch = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
    # (parallelize's own precision and ZeRO: in TIGHT_PRECISION without ZeRO micro-batches
    # save this Llama no memory; nor at 4 rows on 4 ranks, where the SPMD search holds one row a
    # rank, now that its memory is priced by liveness: 8 rows, and the memory a fifth of the way
    # from the micro-batched plans' least to the SPMD search's, where micro-batches of one row fit)
    small = accumulation_cluster(shardwise.capture(llama(), batch), world, 8, precision=None, zero=True,
                                 toward_whole=0.2)
    model = llama()
    reference = copy.deepcopy(model)
    engine = shardwise.parallelize(model, batch, cluster=small)
    out = _train(engine, reference, batch, lambda m, b: m(**b).loss)
    out["stage_mesh"] = json.loads(engine.plan.to_json()).get("stage_sharding", {}).get("mesh")
    return out


# ---- spawning ------------------------------------------------------------------------------------------
def _spawn(world, name, *args):
    return spawn_scenario(__name__, world, name, *args)


# ---- tests ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sum_losses_are_summed_over_micro_batches_in_pipelines_accumulation_and_the_automatic_plan():
    # Before: the pipeline engine divided every loss by m: a sum loss and its gradients came
    # out 1/m of one device's (torchtitan's loss on 2 x 2: half).
    r = _spawn(4, "sum_losses")
    assert r["pipeline"]["micro_batches"] == 2 and r["pipeline"]["pipeline"] == 2, r
    assert r["accumulation"]["micro_batches"] == 2, r
    assert r["t5_automatic"]["micro_batches"] > 1, r  # the search fell back to micro-batches
    for case in ("pipeline", "accumulation", "t5_automatic"):
        assert r[case]["loss_error"] < EXACT and r[case]["param_error"] < EXACT, (case, r[case])


def test_a_sum_loss_through_a_two_stage_pipeline_equals_one_device():
    r = _spawn(2, "t5_pipeline")
    assert r["micro_batches"] == 4, r
    assert r["loss_error"] < EXACT and r["param_error"] < EXACT, r


def test_batch_statistics_refuse_micro_batches_naming_the_op_unless_chosen():
    r = _spawn(2, "batch_statistics")
    for case in ("resnet_manual", "resnet_explicit"):
        assert "aten::batch_norm in module 'resnet.embedder.embedder.normalization'" in r[case], (case, r[case])
        assert "micro_batch_semantics='per_micro_batch'" in r[case], r[case]
    # Memory too short for one step of the batch: the search does not split it silently.
    assert "aten::batch_norm" in r["resnet_automatic"] and "per_micro_batch" in r["resnet_automatic"], r
    assert "micro-batches per micro-batch" in r["resnet_chosen_report"], r["resnet_chosen_report"]
    # The load-balancing loss: a product of two means over the tokens.
    assert "aten::mul.Tensor" in r["mixtral_pipeline"] and "reduced over the batch" in r["mixtral_pipeline"], r
    one = r["mixtral_one_micro_batch"]
    assert one["loss_error"] < EXACT and one["param_error"] < EXACT, one


def test_a_pipeline_of_a_model_without_repeated_layers_says_why_it_cannot_be_priced():
    # Before: "evaluate: pipeline 2 x virtual_stages 1 = 2 chunks but the graph has 0 layers".
    torch.manual_seed(0)
    cfg = transformers.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=4)
    model = transformers.ResNetForImageClassification(cfg).eval()
    graph = shardwise.capture(model, {"pixel_values": torch.randn(4, 3, 16, 16), "labels": torch.randint(0, 4, (4,))})
    assert not graph.repeated_blocks()
    with pytest.raises(shardwise.ValidationError, match="has none .*repeated.* pipeline 1"):
        shardwise.Plan.manual(graph, shardwise.Cluster.preset("cpu", 2), pipeline=2, global_batch=4, micro_batch=4)


@pytest.mark.parametrize("pipeline", [False, True])
def test_the_engine_follows_the_held_modules_train_and_eval_mode(pipeline):
    # Before: model.eval() on the module the user holds was ignored (dropout stayed on).
    r = _spawn(2, "modes", pipeline)
    assert r["engine_training"] is False, r
    for loss in (*r["eval"], r["train_step_in_eval"]):
        assert abs(loss - r["reference"]) / r["reference"] < EXACT, r
    assert r["engine_training_after"] is True, r
    assert r["model_training_after_engine_eval"] is False, r


def test_a_floating_mask_crossing_a_cut_into_a_tensor_parallel_stage_carries_no_gradient():
    # Before: every floating value a stage received required a gradient, the causal mask too;
    # its gather in the second stage had no backward steps (the core's program gives it no
    # gradient) and handed autograd the whole [1, 1, 16, 16] for a [1, 1, 8, 16] shard:
    # "_ReshardFnBackward returned an invalid gradient" on the second stage's ranks, and the
    # first stage's a peer failure (the zoo's Llama, GPT-J under tight memory).
    r = _spawn(4, "mask_across_a_cut")
    assert r["pipeline"] == 2 and r["stage_mesh"] == [1, 2], r  # the case named: stages on 2 tensor ranks
    assert r["micro_batches"] > 1, r
    # transformers' causal-LM loss rounds the float64 logits to float32, here and on one device.
    assert r["loss_error"] < 1e-6 and r["param_error"] < EXACT, r


def test_a_padded_batch_whose_micro_batch_is_one_row_gets_its_stage_layout_searched_on_that_capture():
    # Before: the joint planner searched the stages' layout on the capture of the whole batch
    # (4 rows, 8 now) at one micro-batch's rows (1). transformers builds the padding mask over an
    # arange of the batch's rows, not indexed by the batch: 4 long in that capture, 1 in the
    # engine's. The layout split it over the 2 tensor ranks, and parallelize refused the plan
    # its own search had made ("node 'arange_1' ... strategy 'split d0' is not legal ...
    # [d0=1] on 2 ranks"). The layout is now searched on the capture that runs.
    r = _spawn(4, "mask_across_a_cut", True)
    assert r["pipeline"] == 2 and r["stage_mesh"] == [1, 2] and r["micro_batches"] == 8, r
    assert r["loss_error"] < 1e-6 and r["param_error"] < EXACT, r


# ---- the counted mean in the rank IR -------------------------------------------------------------
class _Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 5)

    def forward(self, x, labels):
        return F.cross_entropy(self.head(x), labels)  # ignore_index -100: a mean over the rows counted


def test_the_rank_ir_counts_a_pipelines_micro_batches_as_its_runtime_does():
    """A stage on one rank with 4 micro-batches runs cross entropy as its sum times 4 / G (G the
    step's count of targets): the core's program says so (shares 4, reduction sum, a counted-mean
    node in the rank IR), not the runtime alone; with one micro-batch it is the plain mean."""
    graph = shardwise.capture(_Classifier(), (torch.randn(4, 8), torch.tensor([1, -100, 3, 0])))
    accumulated = shardwise._C.rank_program(graph._core, "", 0, micro_batches=4)
    (loss,) = [n for n in accumulated["nodes"] if n["counted"] is not None]
    assert loss["counted"]["shares"] == 4 and loss["attrs"]["reduction"] == 2
    assert "shardwise::counted_mean" in accumulated["rank_ir"] and "shares=4" in accumulated["rank_ir"]
    single = shardwise._C.rank_program(graph._core, "", 0)
    (loss,) = [n for n in single["nodes"] if n["counted"] is not None]
    assert loss["counted"]["shares"] == 1 and loss["attrs"].get("reduction", 1) == 1
    assert "counted_mean" not in single["rank_ir"]
    with pytest.raises(shardwise.ValidationError, match="micro_batches 0"):
        shardwise._C.rank_program(graph._core, "", 0, micro_batches=0)
