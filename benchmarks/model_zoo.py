"""Model zoo: capture and planning on real transformers architectures.

Builds tiny configurations (2 layers, hidden 64, 4 heads, vocabulary 128, random weights,
nothing downloaded) of the architectures transformers ships, each with its task head and
labels (causal LM, masked LM, seq2seq LM, image classification), and for each:

- captures it with every method (`shardwise.capture(model, inputs, method=...)` for
  export, fx and torchscript),
- plans the first graph that captured on 4 CPU processes with the mesh fixed to (1, 4)
  and to (2, 2),
- prints one row: the methods that worked, the plans (with how many nodes each splits on
  some mesh axis), the unknown ops (`graph.unknown_ops()`), and below the table the first
  line of each failure.

    python benchmarks/model_zoo.py                   # every model
    python benchmarks/model_zoo.py llama t5 falcon   # some (names as printed, or a prefix)
    python benchmarks/model_zoo.py --json zoo.json   # also write the results
    python benchmarks/model_zoo.py --record          # + the table's rows into results/model_zoo.json and the README

Nothing here times anything; a failure is a row of the table, never an exception.

Adding a column (for example training equivalence: 5 AdamW steps of
`shardwise.parallelize` against one device) is one function registered in `COLUMNS`:
it gets the `ZooModel` (whose `build()` gives a fresh model with the same weights on every
call, and `batch(seed)` more batches of the same shapes), the captured graphs by method
and the plans by mesh, and returns the cell's text (raise to report a failure: the cell
shows the first line of the exception). `--columns NAME ...` turns registered columns on.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import shardwise

BATCH, SEQ, VOCAB, IMAGE = 4, 16, 128, 32
METHODS = ("export", "fx", "torchscript")
MESHES = ((1, 4), (2, 2))

# Small everywhere: 2 layers, hidden 64, 4 heads, vocabulary 128.
_LM = dict(vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=0)


@dataclass(frozen=True)
class ZooModel:
    """One architecture with its task head: `config()` builds the transformers config,
    `head` names the model class, `task` the inputs it takes."""

    name: str
    family: str  # decoder, encoder-decoder, encoder, vision, moe; foreign: another project's model file
    head: str  # a transformers class name (foreign: where the model comes from, for the table)
    config: Callable[[], Any]
    task: str  # causal-lm, masked-lm, seq2seq-lm, image-classification
    # A model of another project (benchmarks/foreign/: nanoGPT's, torchtitan's, timm's): built by
    # `make()` (dropouts 0), fed by `make_batch(generator)`, its loss `loss_fn(output, target)`
    # with the batch's "target" (None: the model returns its loss, in whatever it returns).
    make: Callable[[], torch.nn.Module] | None = None
    make_batch: Callable[[torch.Generator], dict] | None = None
    loss_fn: Callable | None = None

    def build(self, seed: int = 0, device: str = "cpu") -> torch.nn.Module:
        """A fresh model, the same weights for the same seed (eval mode: dropout off, so
        two runs of one batch agree)."""
        torch.manual_seed(seed)
        if self.make is not None:
            with torch.device(device):
                return self.make().eval()
        import transformers

        with torch.device(device):
            model = getattr(transformers, self.head)(self.config())
        return model.eval()

    def trainable(self, model: torch.nn.Module) -> torch.nn.Module:
        """What shardwise.capture and the search see: the model with its loss (loss_fn's)."""
        if self.loss_fn is None:
            return model
        from shardwise.engine import _Trainable

        return _Trainable(model, self.loss_fn)

    def loss(self, model: torch.nn.Module, batch: dict) -> torch.Tensor:
        """The loss of `batch` on one device, as the model and its loss compute it."""
        if self.loss_fn is not None:
            inputs = {k: v for k, v in batch.items() if k != "target"}
            return self.loss_fn(model(**inputs), batch["target"])
        out = model(**batch)
        if isinstance(out, torch.Tensor):
            return out
        if getattr(out, "loss", None) is not None:
            return out.loss
        return next(x for x in out if isinstance(x, torch.Tensor) and x.dim() == 0)  # nanoGPT's (logits, loss)

    def build_for_training(self, seed: int = 0) -> torch.nn.Module:
        """`build(seed)`'s weights in float64, in training mode, with every dropout-like rate
        the config has (dropout, pdrop, drop path, layer drop) set to 0: two runs of one
        batch agree, and a step depends only on the weights and the batch. Mixtures of
        experts run transformers' `batched_mm` experts (a matmul per token over its experts'
        gathered weights): its default on CPU, `grouped_mm`, calls torch's grouped matmul,
        which has no float64 kernel (and the model fails eagerly)."""
        if self.make is not None:
            torch.manual_seed(seed)
            return self.make().double().train()
        import transformers

        cfg = self.config()
        for key, value in list(vars(cfg).items()):
            if isinstance(value, float) and any(k in key for k in ("dropout", "pdrop", "drop_path", "layerdrop")):
                setattr(cfg, key, 0.0)
        if self.family == "moe":
            cfg._experts_implementation = "batched_mm"
        torch.manual_seed(seed)
        model = getattr(transformers, self.head)(cfg)
        return model.double().train()

    def batch(self, seed: int = 0, device: str = "cpu") -> dict[str, torch.Tensor]:
        """Example inputs with labels for the task head, drawn from `seed`."""
        g = torch.Generator().manual_seed(seed)
        if self.make_batch is not None:
            return {k: v.to(device) for k, v in self.make_batch(g).items()}
        if self.task == "image-classification":
            cfg = self.config()
            channels = getattr(cfg, "num_channels", 3)
            pixels = torch.randn(BATCH, channels, IMAGE, IMAGE, generator=g)
            labels = torch.randint(0, cfg.num_labels, (BATCH,), generator=g)
            return {"pixel_values": pixels.to(device), "labels": labels.to(device)}
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        if self.task == "seq2seq-lm":
            labels = torch.randint(0, VOCAB, (BATCH, SEQ // 2), generator=g)
            return {"input_ids": ids.to(device), "labels": labels.to(device)}
        return {"input_ids": ids.to(device), "labels": ids.to(device)}


def _t(name: str, **kwargs) -> Callable[[], Any]:
    """A config factory: transformers.<name>(**kwargs), built on call."""

    def make():
        import transformers

        return getattr(transformers, name)(**kwargs)

    return make


_LLAMA_LIKE = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=128, **_LM)
_BERT_LIKE = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, **_LM)

ZOO: list[ZooModel] = [
    # ---- decoder-only, causal LM with labels --------------------------------------------
    ZooModel("gpt2", "decoder", "GPT2LMHeadModel",
             _t("GPT2Config", n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=0,
                eos_token_id=0), "causal-lm"),
    ZooModel("gpt-neo", "decoder", "GPTNeoForCausalLM",
             _t("GPTNeoConfig", num_layers=2, hidden_size=64, num_heads=4, attention_types=[[["global", "local"], 1]],
                window_size=8, intermediate_size=128, **_LM), "causal-lm"),
    ZooModel("gpt-j", "decoder", "GPTJForCausalLM",
             _t("GPTJConfig", n_layer=2, n_embd=64, n_head=4, rotary_dim=8, n_inner=128, vocab_size=VOCAB,
                n_positions=64), "causal-lm"),
    ZooModel("gpt-neox", "decoder", "GPTNeoXForCausalLM",
             _t("GPTNeoXConfig", num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                **_LM), "causal-lm"),
    ZooModel("bloom", "decoder", "BloomForCausalLM",
             _t("BloomConfig", n_layer=2, hidden_size=64, n_head=4, vocab_size=VOCAB), "causal-lm"),
    ZooModel("opt", "decoder", "OPTForCausalLM",
             _t("OPTConfig", num_hidden_layers=2, hidden_size=64, num_attention_heads=4, ffn_dim=128,
                word_embed_proj_dim=64, **_LM), "causal-lm"),
    # Multi-query Falcon (the 7B layout): q heads + one k + one v, split by fused_qkv[..., [-2], :].
    ZooModel("falcon", "decoder", "FalconForCausalLM",
             _t("FalconConfig", num_hidden_layers=2, hidden_size=64, num_attention_heads=4, multi_query=True,
                vocab_size=VOCAB), "causal-lm"),
    # Falcon's new decoder architecture (40B / 180B): grouped kv, split by qkv[:, :, :, [-2]].
    ZooModel("falcon-gqa", "decoder", "FalconForCausalLM",
             _t("FalconConfig", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                new_decoder_architecture=True, num_kv_heads=2, vocab_size=VOCAB), "causal-lm"),
    ZooModel("llama", "decoder", "LlamaForCausalLM", _t("LlamaConfig", **_LLAMA_LIKE), "causal-lm"),
    ZooModel("mistral", "decoder", "MistralForCausalLM", _t("MistralConfig", sliding_window=8, **_LLAMA_LIKE),
             "causal-lm"),
    ZooModel("qwen2", "decoder", "Qwen2ForCausalLM", _t("Qwen2Config", **_LLAMA_LIKE), "causal-lm"),
    ZooModel("qwen3", "decoder", "Qwen3ForCausalLM", _t("Qwen3Config", head_dim=16, **_LLAMA_LIKE), "causal-lm"),
    ZooModel("phi", "decoder", "PhiForCausalLM", _t("PhiConfig", **_BERT_LIKE), "causal-lm"),
    ZooModel("phi3", "decoder", "Phi3ForCausalLM", _t("Phi3Config", pad_token_id=0, **_LLAMA_LIKE), "causal-lm"),
    ZooModel("gemma", "decoder", "GemmaForCausalLM", _t("GemmaConfig", head_dim=16, **_LLAMA_LIKE), "causal-lm"),
    ZooModel("gemma2", "decoder", "Gemma2ForCausalLM", _t("Gemma2Config", head_dim=16, sliding_window=8, **_LLAMA_LIKE),
             "causal-lm"),
    ZooModel("stablelm", "decoder", "StableLmForCausalLM", _t("StableLmConfig", **_LLAMA_LIKE), "causal-lm"),
    ZooModel("olmo", "decoder", "OlmoForCausalLM", _t("OlmoConfig", pad_token_id=0, **_LLAMA_LIKE), "causal-lm"),
    ZooModel("codegen", "decoder", "CodeGenForCausalLM",
             _t("CodeGenConfig", n_layer=2, n_embd=64, n_head=4, rotary_dim=8, n_inner=128, vocab_size=VOCAB,
                n_positions=64, n_ctx=64), "causal-lm"),
    ZooModel("mpt", "decoder", "MptForCausalLM",
             _t("MptConfig", n_layers=2, d_model=64, n_heads=4, expansion_ratio=2, vocab_size=VOCAB, max_seq_len=64),
             "causal-lm"),
    ZooModel("rwkv", "decoder", "RwkvForCausalLM",
             _t("RwkvConfig", num_hidden_layers=2, hidden_size=64, attention_hidden_size=64, intermediate_size=128,
                vocab_size=VOCAB, context_length=64), "causal-lm"),
    ZooModel("mamba", "decoder", "MambaForCausalLM",
             _t("MambaConfig", num_hidden_layers=2, hidden_size=64, state_size=8, vocab_size=VOCAB), "causal-lm"),
    # ---- mixture of experts ----------------------------------------------------------------
    ZooModel("mixtral", "moe", "MixtralForCausalLM",
             _t("MixtralConfig", num_local_experts=4, num_experts_per_tok=2, **_LLAMA_LIKE), "causal-lm"),
    # The same with its router's load-balancing loss added to the loss (a product of two means
    # over the tokens: no micro-batch split computes it, so a pipeline of several is refused).
    ZooModel("mixtral-aux", "moe", "MixtralForCausalLM",
             _t("MixtralConfig", num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
                router_aux_loss_coef=0.02, **_LLAMA_LIKE), "causal-lm"),
    ZooModel("qwen2-moe", "moe", "Qwen2MoeForCausalLM",
             _t("Qwen2MoeConfig", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                shared_expert_intermediate_size=128, **_LLAMA_LIKE), "causal-lm"),
    # ---- encoder-decoder, seq2seq LM with labels ------------------------------------------
    ZooModel("t5", "encoder-decoder", "T5ForConditionalGeneration",
             _t("T5Config", num_layers=2, num_decoder_layers=2, d_model=64, d_kv=16, d_ff=128, num_heads=4,
                vocab_size=VOCAB, decoder_start_token_id=0), "seq2seq-lm"),
    ZooModel("bart", "encoder-decoder", "BartForConditionalGeneration",
             _t("BartConfig", encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB,
                max_position_embeddings=64), "seq2seq-lm"),
    # ---- encoders, masked LM with labels ---------------------------------------------------
    ZooModel("bert", "encoder", "BertForMaskedLM", _t("BertConfig", **_BERT_LIKE), "masked-lm"),
    ZooModel("roberta", "encoder", "RobertaForMaskedLM", _t("RobertaConfig", pad_token_id=1, **_BERT_LIKE),
             "masked-lm"),
    ZooModel("distilbert", "encoder", "DistilBertForMaskedLM",
             _t("DistilBertConfig", n_layers=2, dim=64, n_heads=4, hidden_dim=128, **_LM), "masked-lm"),
    ZooModel("electra", "encoder", "ElectraForMaskedLM",
             _t("ElectraConfig", embedding_size=64, **_BERT_LIKE), "masked-lm"),
    ZooModel("albert", "encoder", "AlbertForMaskedLM",
             _t("AlbertConfig", embedding_size=32, **_BERT_LIKE), "masked-lm"),
    # ---- vision, image classification with labels ------------------------------------------
    ZooModel("vit", "vision", "ViTForImageClassification",
             _t("ViTConfig", num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                image_size=IMAGE, patch_size=8, num_labels=10), "image-classification"),
    ZooModel("deit", "vision", "DeiTForImageClassification",
             _t("DeiTConfig", num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                image_size=IMAGE, patch_size=8, num_labels=10), "image-classification"),
    ZooModel("resnet", "vision", "ResNetForImageClassification",
             _t("ResNetConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
                num_labels=10), "image-classification"),
    ZooModel("convnext", "vision", "ConvNextForImageClassification",
             _t("ConvNextConfig", num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10), "image-classification"),
    ZooModel("swin", "vision", "SwinForImageClassification",
             _t("SwinConfig", image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4],
                window_size=4, num_labels=10), "image-classification"),
]


# ---- models of other projects (benchmarks/foreign/) --------------------------------------------
def _nanogpt() -> torch.nn.Module:
    from foreign.nanogpt import GPT, GPTConfig

    return GPT(GPTConfig(block_size=SEQ, vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=64, dropout=0.0, bias=True))


def _next_tokens(g: torch.Generator, inputs: str, targets: str) -> dict:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return {inputs: ids, targets: ids.roll(-1, dims=1)}


def _titan_llama3() -> torch.nn.Module:
    from foreign.installed import titan_llama3

    return titan_llama3(layers=2, dim=64, heads=4, kv_heads=2, vocab=VOCAB, seq=SEQ)


def _titan_loss(output, target):
    from foreign.installed import titan_loss

    return titan_loss()(output, target)


def _timm_vit() -> torch.nn.Module:
    from foreign.installed import timm_vit

    return timm_vit(image=IMAGE, patch=8, depth=2, dim=64, heads=4, classes=10)


def _images(g: torch.Generator) -> dict:
    return {"x": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g), "target": torch.randint(0, 10, (BATCH,), generator=g)}


def _cross_entropy(output, target):
    return torch.nn.functional.cross_entropy(output, target)


ZOO += [
    ZooModel("nanogpt", "foreign", "nanoGPT's GPT (benchmarks/foreign/nanogpt.py)", lambda: None, "causal-lm",
             make=_nanogpt, make_batch=lambda g: _next_tokens(g, "idx", "targets")),
    ZooModel("titan-llama3", "foreign", "torchtitan's Llama 3 and loss", lambda: None, "causal-lm",
             make=_titan_llama3, make_batch=lambda g: _next_tokens(g, "tokens", "target"), loss_fn=_titan_loss),
    ZooModel("timm-vit", "foreign", "timm's VisionTransformer", lambda: None, "image-classification",
             make=_timm_vit, make_batch=_images, loss_fn=_cross_entropy),
]


# ---- results ---------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    family: str
    captured: dict[str, Any] = field(default_factory=dict)  # method -> shardwise.Graph
    errors: dict[str, str] = field(default_factory=dict)  # "export", "plan (1, 4)", ... -> first line
    unknown: list[str] = field(default_factory=list)  # "op (module) xN"
    plans: dict[tuple[int, int], Any] = field(default_factory=dict)  # mesh -> shardwise.Plan
    cells: dict[str, str] = field(default_factory=dict)  # extra columns
    details: dict[str, Any] = field(default_factory=dict)  # extra columns' rows, by column

    def to_json(self) -> dict:
        return {"name": self.name, "family": self.family, "captured": sorted(self.captured),
                "unknown_ops": self.unknown, "plans": [list(m) for m in self.plans], "errors": self.errors,
                "columns": self.cells, "details": self.details}


def first_line(e: BaseException) -> str:
    """`Type: first line of the message`, without the stack."""
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return f"{type(e).__name__}: {line}"[:300]


# A column: (model, graphs by method, plans by mesh) -> the cell's text. See the module
# docstring; the training-equivalence column goes here.
Column = Callable[[ZooModel, dict[str, Any], dict[tuple[int, int], Any]], "str | tuple[str, Any]"]
COLUMNS: dict[str, Column] = {}
# A column's report below the table, given every result (its rows in `result.details[name]`).
REPORTS: dict[str, Callable[[list["Result"]], None]] = {}


@contextlib.contextmanager
def _quiet():
    """TorchScript's deprecation warnings, transformers' notices and the capture's fallback
    log are not results: keep them off the table."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stderr(io.StringIO()):
            yield


def run_one(spec: ZooModel, methods=METHODS, meshes=MESHES, columns: dict[str, Column] | None = None,
            verbose: bool = False) -> Result:
    result = Result(spec.name, spec.family)
    try:
        model = spec.trainable(spec.build())
        inputs = spec.batch()
    except Exception as e:  # noqa: BLE001 - the table reports it
        result.errors["build"] = first_line(e)
        return result
    for method in methods:
        try:
            with _quiet():
                result.captured[method] = shardwise.capture(model, inputs, method=method)
        except Exception as e:  # noqa: BLE001
            result.errors[method] = first_line(e)
            if verbose:
                traceback.print_exc()
    graph = next((result.captured[m] for m in methods if m in result.captured), None)
    if graph is not None:
        result.unknown = [f"{u.op} ({u.module_path or '<top>'}) x{u.count}" for u in graph.unknown_ops()]
        cluster = shardwise.Cluster.preset("cpu", 4)
        for mesh in meshes:
            try:
                result.plans[mesh] = shardwise.plan(graph, cluster, global_batch=BATCH, mesh=mesh)
            except Exception as e:  # noqa: BLE001
                result.errors[f"plan {mesh}"] = first_line(e)
                if verbose:
                    traceback.print_exc()
    for name, column in (columns or {}).items():
        try:
            cell = column(spec, result.captured, result.plans)
            if isinstance(cell, tuple):  # (text, details for the JSON and the column's report)
                cell, result.details[name] = cell
            result.cells[name] = cell
        except Exception as e:  # noqa: BLE001
            result.cells[name] = "fail"
            result.errors[name] = first_line(e)
    return result


def _plan_cell(plan) -> str:
    """"ok" and how many nodes the plan splits on some mesh axis (the rest replicated), so a
    rule that fails to expose a dim shows as a model planned wholly replicated."""
    strategies = plan.strategies()
    split = sum(any(s != "replicate" for s in texts) for texts in strategies.values())
    return f"ok {split}/{len(strategies)}"


def print_table(results: list[Result], columns: list[str], methods=METHODS) -> None:
    mesh_names = [f"plan {m[0]}x{m[1]} (split)" for m in MESHES]
    header = ["model", "family", *methods, *mesh_names, *columns, "unknown ops"]
    rows = []
    for r in results:
        capture = ["ok" if m in r.captured else "FAIL" for m in methods]
        plans = [_plan_cell(r.plans[m]) if m in r.plans else ("-" if not r.captured else "FAIL") for m in MESHES]
        rows.append([r.name, r.family, *capture, *plans, *[r.cells.get(c, "") for c in columns],
                     ", ".join(r.unknown) or "none"])
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None  # noqa: N806
    if Console is not None:
        table = Table(title="shardwise model zoo: capture and planning")
        for h in header:
            table.add_column(h, overflow="fold")
        for row in rows:
            table.add_row(*row)
        Console(width=200).print(table)
    else:
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
        print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    print("\nfailures (first line):")
    any_failure = False
    for r in results:
        for what, error in r.errors.items():
            any_failure = True
            print(f"  {r.name} [{what}]: {error}")
    if not any_failure:
        print("  none")
    for column in columns:
        if column in REPORTS:
            REPORTS[column](results)
    ok = ", ".join(f"{m} {sum(m in r.captured for r in results)}" for m in methods)
    planned = sum(all(m in r.plans for m in MESHES) for r in results)
    print(f"\n{len(results)} models; captured by {ok}; planned on both meshes {planned}; "
          f"with unknown ops {sum(bool(r.unknown) for r in results)}")


# ---- the training-equivalence column ("train eq") ---------------------------------------------

TRAIN_STEPS, TRAIN_LR, TRAIN_TOLERANCE, TRAIN_TIMEOUT = 5, 1e-3, 1e-6, 1200
TRAIN_WORLD = 4
# The runs, a spawn of TRAIN_WORLD processes each: (label, mesh or None, plan kinds). "auto": the
# search's plan on Cluster.preset("cpu", 4); "sharded": memory that holds the model on the mesh
# only with weights on its tensor axis; "pipeline": Plan.manual of 2 stages x data 2, 2
# micro-batches of 1 row each per data rank (1F1B); "tight": the automatic plan on a cluster
# too small for the preset's automatic plan (_tight_cluster: where micro-batches save memory,
# one on which only a plan in micro-batches fits).
TRAIN_RUNS = (("1x4", (1, 4), ("auto", "sharded")), ("2x2", (2, 2), ("auto", "sharded")),
              ("micro-batches", None, ("pipeline", "tight")))
TRAIN_PLANS = tuple(kind for _, _, kinds in TRAIN_RUNS for kind in kinds)  # (for the JSON's readers)


def _train_batch(spec: ZooModel, step: int) -> dict[str, torch.Tensor]:
    """Step `step`'s batch (`spec.batch(step)`), its floating tensors in float64."""
    return {k: v.double() if v.is_floating_point() else v for k, v in spec.batch(step).items()}


TRAIN_MEMORY_STEPS = (0.5, 0.25, 0.75, 0.1, 0.9, 0.02)


def _with_memory(cluster, memory: float):
    import json

    doc = json.loads(cluster.to_json())
    doc["device_types"][0]["memory_bytes"] = int(memory)
    return shardwise.Cluster.from_json(json.dumps(doc))


def _sharded_cluster(graph, mesh: tuple[int, int]):
    """A CPU cluster whose memory holds the model on `mesh` only with weights sharded on the
    tensor axis, and that fraction of the way from the least memory any plan needs to what
    the replicated plan needs. First 1/2, tests/python/conftest.py's `tight_cluster`; where
    the search's plan there puts no weight on the tensor axis (ZeRO's sharded optimizer
    state alone saves the half) or fits nowhere (the fast search is not monotonic in the
    memory it is given: ResNet and ConvNeXt fit at some fractions and not at larger or
    smaller ones), the other TRAIN_MEMORY_STEPS in turn. Returns (cluster, fraction), the
    last tried when none gives such a plan."""
    import json

    cluster = shardwise.Cluster.preset("cpu", TRAIN_WORLD)
    replicated = shardwise.plan(graph, cluster, global_batch=BATCH, mesh=mesh).predicted_memory()[0]
    least = shardwise.plan(graph, _with_memory(cluster, 1), global_batch=BATCH, mesh=mesh).predicted_memory()[0]
    weights = {v["name"] for v in json.loads(graph.to_json())["values"] if v["role"] == "parameter"}
    for fraction in TRAIN_MEMORY_STEPS:
        tight = _with_memory(cluster, (least + fraction * (replicated - least)) / shardwise._C.MEMORY_FRACTION)
        plan = shardwise.Plan.search(graph, tight, global_batch=BATCH, mesh=mesh)  # the default memory_fraction
        if plan.fits and any(p[1].startswith("S") for n, p in plan.placements().items() if n in weights):
            break
    return tight, fraction


def _tight_cluster(graph):
    """A CPU cluster too small for the automatic plan on the preset one, for the automatic plan
    under tight memory: where micro-batches save memory (the joint planner's least, micro-batches
    allowed, below the least of any plan of the whole batch at once: the SPMD search's, and for
    a graph whose rows meet in batch statistics the joint planner's of one micro-batch), halfway
    between the two, so that only a plan in micro-batches fits (tests/python/conftest.py's
    accumulation_cluster); elsewhere halfway between the least any plan needs and what the
    preset's automatic plan needs, so that the search must shard more than it would."""
    preset = shardwise.Cluster.preset("cpu", TRAIN_WORLD)
    tiny = _with_memory(preset, 1)
    whole = shardwise.Plan.search(graph, tiny, global_batch=BATCH).predicted_memory()[0]
    split = float("inf")
    if graph.repeated_blocks():
        if shardwise._C.batch_coupling(graph._core)["sites"]:
            whole = min(whole, shardwise.Plan.joint(graph, tiny, global_batch=BATCH).predicted_memory()[0])
        split = shardwise.Plan.joint(graph, tiny, global_batch=BATCH,
                                     micro_batch_semantics="per_micro_batch").predicted_memory()[0]
    if split < whole:
        return _with_memory(tiny, (split + whole) / 2 / shardwise._C.MEMORY_FRACTION)
    default = shardwise.plan(graph, preset, global_batch=BATCH).predicted_memory()[0]
    return _with_memory(tiny, (whole + default) / 2 / shardwise._C.MEMORY_FRACTION)


def _plan_summary(plan) -> str:
    """The plan's shape: its mesh, or its pipeline, data and tensor degrees and micro-batches."""
    if plan.sharding:
        return f"mesh {plan.sharding['mesh'][0]}x{plan.sharding['mesh'][1]}"
    return f"p{plan.pipeline} d{plan.data} t{plan.tensor}, {plan.num_micro_batches()} micro-batches"


def _engine_for(spec: ZooModel, kind: str, mesh, batch: dict, world: int):
    """(engine, memory fraction or None) of plan kind `kind` for a fresh training model."""
    fraction = None
    graph = None
    if kind != "auto":
        graph = shardwise.capture(spec.trainable(spec.build_for_training()), batch)
    model = spec.build_for_training()
    if kind == "auto":
        engine = shardwise.parallelize(model, batch, spec.loss_fn, mesh=mesh,
                                       cluster=shardwise.Cluster.preset("cpu", world))
    elif kind == "sharded":
        cluster, fraction = _sharded_cluster(graph, mesh)
        engine = shardwise.parallelize(model, batch, spec.loss_fn, mesh=mesh, cluster=cluster)
    elif kind == "pipeline":
        plan = shardwise.Plan.manual(graph, shardwise.Cluster.preset("cpu", world), pipeline=2, data=world // 2,
                                     global_batch=BATCH, micro_batch=1, recompute=False)
        engine = shardwise.parallelize(model, batch, spec.loss_fn, plan=plan)
    else:
        engine = shardwise.parallelize(model, batch, spec.loss_fn, cluster=_tight_cluster(graph))
    return engine, fraction


def _weight_placements(plan) -> dict[str, list[str]]:
    """Value -> placement per axis of the layout the ranks run: a sharded plan's, or a pipelined
    plan's stages' (the {data, tensor} sub-mesh of every stage: its tensor axis second too)."""
    if plan.sharding or not getattr(plan, "stage_sharding", None):
        return plan.placements()
    return plan.stage_plan().placements()


def _train_worker(rank: int, world: int, store: str, name: str, mesh, kinds: tuple[str, ...], out: str) -> None:
    """One rank: for each plan kind, parallelize a fresh float64 model, then TRAIN_STEPS AdamW
    steps; rank 0 writes the losses and the whole parameters (each rank writes its errors:
    a refusal, shardwise.ValidationError, apart from a failure)."""
    import datetime
    import os

    import torch.distributed as dist

    import transformers

    torch.set_num_threads(1)
    logging.getLogger("shardwise").setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TRAIN_TIMEOUT // 2))
    spec = next(s for s in ZOO if s.name == name)
    batches = [_train_batch(spec, step) for step in range(TRAIN_STEPS)]
    results: dict[str, dict] = {}
    try:
        for kind in kinds:
            try:
                engine, fraction = _engine_for(spec, kind, mesh, batches[0], world)
                optimizer = engine.optimizer(torch.optim.AdamW, lr=TRAIN_LR)
                losses = []
                for batch in batches:
                    losses.append(float(engine.train_step(**batch)))
                    optimizer.step()
                    optimizer.zero_grad()
                placements = _weight_placements(engine.plan)
                names = [n for n, _ in engine.named_parameters()]
                sharded = [n for n in names if len(placements.get(n, ())) > 1 and placements[n][1].startswith("S")]
                state = engine.full_state_dict()  # a collective: every rank gathers
                results[kind] = {"losses": losses, "sharded": sharded, "parameters": len(engine._model_names),
                                 "memory": fraction, "whole": list(getattr(engine, "whole_nodes", [])),
                                 "plan": _plan_summary(engine.plan), "state": state if rank == 0 else None}
            except Exception as e:  # noqa: BLE001 - the table reports it
                results[kind] = {"error": first_line(e), "refused": isinstance(e, shardwise.ValidationError),
                                 "message": str(e), "traceback": traceback.format_exc()}
            dist.barrier()
    finally:
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
        dist.destroy_process_group()


def _spawn_training(name: str, mesh, kinds: tuple[str, ...]) -> dict[str, dict]:
    """One spawn of TRAIN_WORLD Gloo processes (a FileStore in a temp dir) for the plan kinds
    `kinds`; returns rank 0's results by plan kind, with any rank's error in place of them."""
    import os
    import tempfile
    import time

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        context = mp.start_processes(_train_worker,
                                     args=(TRAIN_WORLD, os.path.join(tmp, "store"), name, mesh, kinds, tmp),
                                     nprocs=TRAIN_WORLD, join=False, start_method="spawn")
        deadline = time.monotonic() + TRAIN_TIMEOUT
        try:
            while not context.join(timeout=5):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the {'/'.join(kinds)} run took over {TRAIN_TIMEOUT} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(TRAIN_WORLD)]
    out = {}
    for kind in kinds:
        errors = [r[kind] for r in ranks if "error" in r.get(kind, {"error": "no result"})]
        out[kind] = errors[0] if errors else ranks[0][kind]
    return out


def _reference_training(spec: ZooModel) -> tuple[list[float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The same TRAIN_STEPS AdamW steps on one process: losses, parameters, and the floating
    buffers the model's state_dict keeps (batch norm's running statistics; not non-persistent
    ones such as a rotary embedding's `original_inv_freq`, which no step reads or writes).
    On one thread, as each rank runs: a model computing partly in float32 (RWKV's WKV
    recurrence) rounds its reductions by the thread count, 1e-7 apart between 1 and 2."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _reference_steps(spec)
    finally:
        torch.set_num_threads(threads)


def _reference_steps(spec: ZooModel):
    model = spec.build_for_training()
    optimizer = torch.optim.AdamW(model.parameters(), lr=TRAIN_LR)
    losses = []
    for step in range(TRAIN_STEPS):
        loss = spec.loss(model, _train_batch(spec, step))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return (losses, {n: p.detach() for n, p in model.named_parameters()},
            {n: b for n, b in model.state_dict().items()  # tied weights (lm_head = wte) are parameters
             if n not in dict(model.named_parameters(remove_duplicate=False)) and b.is_floating_point()})


def _tensor_error(mine: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> tuple[float, str]:
    """The worst max |difference| relative to the reference tensor's max magnitude (floored
    at 1e-6), and the tensor's name; a missing tensor is an infinite error."""
    worst, where = 0.0, ""
    for name, t in ref.items():
        if name not in mine:
            return float("inf"), f"{name} missing"
        error = ((mine[name].to(t.dtype) - t).abs().max() / t.abs().max().clamp_min(1e-6)).item()
        if not error <= worst:  # NaN counts as worst
            worst, where = error, name
    return worst, where


def train_equivalence(spec: ZooModel, graphs, plans) -> tuple[str, list[dict]]:
    """The "train eq" column: on 4 Gloo processes, `parallelize` with each plan of TRAIN_RUNS
    (the automatic plan and a sharded one on the meshes 1x4 and 2x2; a 2-stage pipeline and
    the automatic plan under memory too short for the whole batch at once), TRAIN_STEPS AdamW
    steps in float64 against one process. One row per plan: weights sharded on the tensor
    axis, whole nodes, the worst relative loss and parameter errors; pass within
    TRAIN_TOLERANCE. A plan shardwise refuses before the first step (ValidationError: batch
    statistics under micro-batches, a model with no repeated layers to pipeline) is a row of
    its own, "refused", with the reason; a refusal is not a failure."""
    import transformers

    transformers.logging.set_verbosity_error()
    ref_losses, ref_params, ref_buffers = _reference_training(spec)
    rows = []
    for label, mesh, kinds in TRAIN_RUNS:
        try:
            runs = _spawn_training(spec.name, mesh, kinds)
        except Exception as e:  # noqa: BLE001
            runs = {kind: {"error": first_line(e)} for kind in kinds}
        for kind in kinds:
            run = runs[kind]
            row = {"mesh": label, "plan": kind}
            if "error" in run:
                row.update(error=run["error"], refused=run.get("refused", False), message=run.get("message", ""),
                           passed=False)
                rows.append(row)
                continue
            loss_error = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(run["losses"], ref_losses))
            param_error, param_where = _tensor_error(run["state"], ref_params)
            buffer_error, buffer_where = _tensor_error(run["state"], ref_buffers) if ref_buffers else (0.0, "")
            row.update(sharded=len(run["sharded"]), parameters=run["parameters"], whole=len(run["whole"]),
                       memory=run["memory"], shape=run["plan"],
                       whole_nodes=run["whole"][:8], loss=loss_error, param=param_error, param_where=param_where,
                       buffer=buffer_error, buffer_where=buffer_where, losses=run["losses"], ref_losses=ref_losses,
                       passed=loss_error < TRAIN_TOLERANCE and param_error < TRAIN_TOLERANCE
                       and buffer_error < TRAIN_TOLERANCE)
            rows.append(row)
    passed = sum(r["passed"] for r in rows)
    refused = sum(r.get("refused", False) for r in rows)
    verdict = "pass" if passed + refused == len(rows) else "FAIL"
    return f"{verdict} {passed}/{len(rows)}" + (f" ({refused} refused)" if refused else ""), rows


def _print_train_details(results: list["Result"]) -> None:
    print(f"\ntraining equivalence ({TRAIN_STEPS} AdamW steps, lr {TRAIN_LR}, float64, {TRAIN_WORLD} Gloo processes; "
          f"pass: loss and parameters within {TRAIN_TOLERANCE:.0e} relative; sharded (f): the memory f of the way "
          f"from the least to the replicated plan's, where not {TRAIN_MEMORY_STEPS[0]:g}; refused: shardwise "
          "refused the plan before the first step, for the reason given):")
    print("| model | run | plan | shape | sharded weights | whole nodes | loss error | parameter error | result |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        for row in r.details.get("train eq", []):
            if "error" in row:
                what = "refused" if row.get("refused") else "**fail**"
                print(f"| {r.name} | {row['mesh']} | {row['plan']} | | | | | | {what}: {row['error']} |")
                continue
            worst = "" if row["passed"] else f" (worst {row['param_where'] if row['param'] >= row['buffer'] else row['buffer_where']})"
            buffer = f", buffers {row['buffer']:.1e}" if row["buffer"] >= TRAIN_TOLERANCE else ""
            plan = row["plan"] if row.get("memory") in (None, TRAIN_MEMORY_STEPS[0]) else \
                f"{row['plan']} ({row['memory']:g})"
            print(f"| {r.name} | {row['mesh']} | {plan} | {row.get('shape', '')} | {row['sharded']}/{row['parameters']} "
                  f"| {row['whole']} | {row['loss']:.1e} | {row['param']:.1e}{buffer} | "
                  f"{'pass' if row['passed'] else '**FAIL**' + worst} |")
    held = sum(bool(r.details.get("train eq")) and all(row["passed"] or row.get("refused")
                                                      for row in r.details["train eq"]) for r in results)
    print(f"\n{held} of {len(results)} models train equal to one device under every plan or name the refusal")


COLUMNS["train eq"] = train_equivalence
REPORTS["train eq"] = _print_train_details


# ---- the "ir calls" column: every node's ATen call rebuilt from the IR alone ------------------
def ir_calls(spec: ZooModel, graphs, plans) -> tuple[str, list[str]]:
    """The rank programs' lowering calls each node's op with its IR attributes bound to the
    op's schema (shardwise/_aten_call.py), never the captured call's arguments. Here: for the
    model in eval mode and in training mode (float64), every node torch.export captured is
    rebuilt from its op, attributes and operands and compared with the captured FX call,
    argument by argument. The cell: "rebuilt/nodes"; the details list what differs."""
    from shardwise._aten_call import CallRebuildError, bound_arguments, call_arguments
    from shardwise._fx_import import op_overload, operand_nodes
    from shardwise._inputs import bind_inputs
    from shardwise.capture import _capture_with_sources

    rebuilt, nodes, differ = 0, 0, []
    for training in (False, True):
        model = spec.build_for_training() if training else spec.build()
        batch = _train_batch(spec, 0) if training else spec.batch()
        with _quiet():
            graph, builder = _capture_with_sources(model, bind_inputs(model, (), batch), "export", None)
        for node in graph.nodes():
            nodes += 1
            fx_node, _ = builder.sources[node["outputs"][0]]
            op = op_overload(node["op"])
            if op is not fx_node.target:
                differ.append(f"{node['op']}: captured as {fx_node.target}")
                continue
            try:
                args, kwargs = call_arguments(op, node["attrs"], operand_nodes(fx_node))
            except CallRebuildError as e:
                differ.append(f"{node['op']}: {e}")
                continue
            if bound_arguments(op, args, kwargs, operand=id) != bound_arguments(op, fx_node.args, fx_node.kwargs,
                                                                               operand=id):
                differ.append(f"{node['op']} ({node['module']}): another call")
                continue
            rebuilt += 1
    return f"{rebuilt}/{nodes}", differ


COLUMNS["ir calls"] = ir_calls


def select(names: list[str]) -> list[ZooModel]:
    if not names:
        return list(ZOO)
    chosen = [spec for spec in ZOO if any(spec.name == n or spec.name.startswith(n) for n in names)]
    if not chosen:
        raise SystemExit(f"no zoo model matches {names}; known: {', '.join(s.name for s in ZOO)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help="zoo names (or prefixes); default: all")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--columns", nargs="*", default=[], help=f"extra columns: {sorted(COLUMNS) or 'none yet'}")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each failure's traceback")
    from _results import add_record_argument, record

    add_record_argument(parser)
    args = parser.parse_args(argv)
    unknown = [c for c in args.columns if c not in COLUMNS]
    if unknown:
        parser.error(f"unknown columns {unknown}; registered: {sorted(COLUMNS)}")
    logging.getLogger("shardwise").setLevel(logging.ERROR)
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, transformers {__import__('transformers').__version__}, "
          f"batch {BATCH}, sequence {SEQ}, image {IMAGE}x{IMAGE}")
    results = []
    for spec in select(args.models):
        print(f"... {spec.name}", file=sys.stderr, flush=True)
        results.append(run_one(spec, tuple(args.methods), columns={c: COLUMNS[c] for c in args.columns},
                               verbose=args.verbose))
        if results[-1].cells:
            print("    " + ", ".join(f"{k}: {v}" for k, v in results[-1].cells.items()), file=sys.stderr, flush=True)
    print_table(results, args.columns, tuple(args.methods))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_json() for r in results], f, indent=1)
    if args.record:
        import os

        import transformers
        from _machine import cpu_model

        # One row per model, merged: a run of some models, or with some columns, updates those cells only.
        record("model_zoo", _recorded(results, args.columns, tuple(args.methods)), {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, transformers "
                       f"{transformers.__version__}",
            "notes": "Split: the nodes a plan on Cluster.preset(\"cpu\", 4) splits on some mesh axis, of all nodes. "
                     "ir calls: nodes whose call the lowering rebuilt from the IR alone (eval and training mode). "
                     "Train eq (5 AdamW steps, float64, 4 Gloo processes, within 1e-6 of one process): the mesh "
                     "cells give the weights sharded on the tensor axis (memory fraction in parentheses where not "
                     "0.5), the pipeline and tight cells the plan that ran."},
            key=("model",))
    return 0


def _shape(text: str) -> str:
    """`p2 d2 t1, 2 micro-batches` as `p2 d2 t1 m2` (a mesh stays `mesh 4x1`)."""
    import re

    return re.sub(r", (\d+) micro-batches?$", r" m\1", text)


def _recorded(results: list[Result], columns: list[str], methods: tuple[str, ...]) -> list[dict]:
    """The rows results/model_zoo.json holds: the table above, a train eq run's plans per model."""
    heads = {spec.name: spec.head for spec in ZOO}
    rows = []
    for r in results:
        row = {"model": r.name, "class": f"`{heads[r.name]}`" if r.family != "foreign" else heads[r.name]}
        row.update({m: "ok" if m in r.captured else "**fails**" for m in methods})
        for mesh in MESHES:
            cell = (_plan_cell(r.plans[mesh]).removeprefix("ok ") if mesh in r.plans
                    else "-" if not r.captured else "**fails**")
            row[f"plan ({mesh[0]}, {mesh[1]}) split"] = cell
        row["unknown ops"] = ", ".join(r.unknown) or None
        if "ir calls" in columns:
            row["ir calls"] = r.cells.get("ir calls")
        if "train eq" in columns:
            errors = {"loss": [], "param": []}
            for run in r.details.get("train eq", []):
                label = f"{run['mesh']} {run['plan']}" if run["mesh"] in ("1x4", "2x2") else \
                    "tight (automatic plan)" if run["plan"] == "tight" else run["plan"]
                if "error" in run:
                    row[label] = "refused" if run.get("refused") else "**fail**"
                    continue
                row[label] = (_shape(run.get("shape", "")) if run["plan"] in ("pipeline", "tight") else
                              f"{run['sharded']}/{run['parameters']}"
                              + ("" if run.get("memory") in (None, TRAIN_MEMORY_STEPS[0]) else f" ({run['memory']:g})"))
                errors["loss"].append(run["loss"])
                errors["param"].append(max(run["param"], run["buffer"]))
            row["worst loss error"] = f"{max(errors['loss']):.1e}" if errors["loss"] else None
            row["worst parameter error"] = f"{max(errors['param']):.1e}" if errors["param"] else None
            row["train eq"] = r.cells.get("train eq")
        rows.append(row)
    return rows


if __name__ == "__main__":
    sys.exit(main())
