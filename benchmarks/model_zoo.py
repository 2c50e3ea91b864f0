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
    family: str  # decoder, encoder-decoder, encoder, vision, moe
    head: str  # a transformers class name
    config: Callable[[], Any]
    task: str  # causal-lm, masked-lm, seq2seq-lm, image-classification

    def build(self, seed: int = 0, device: str = "cpu") -> torch.nn.Module:
        """A fresh model, the same weights for the same seed (eval mode: dropout off, so
        two runs of one batch agree)."""
        import transformers

        torch.manual_seed(seed)
        with torch.device(device):
            model = getattr(transformers, self.head)(self.config())
        return model.eval()

    def build_for_training(self, seed: int = 0) -> torch.nn.Module:
        """`build(seed)`'s weights in float64, in training mode, with every dropout-like rate
        the config has (dropout, pdrop, drop path, layer drop) set to 0: two runs of one
        batch agree, and a step depends only on the weights and the batch. Mixtures of
        experts run transformers' `batched_mm` experts (a matmul per token over its experts'
        gathered weights): its default on CPU, `grouped_mm`, calls torch's grouped matmul,
        which has no float64 kernel (and the model fails eagerly)."""
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
        model = spec.build()
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
TRAIN_PLANS = ("auto", "sharded")


def _train_batch(spec: ZooModel, step: int) -> dict[str, torch.Tensor]:
    """Step `step`'s batch (`spec.batch(step)`), its floating tensors in float64."""
    return {k: v.double() if v.is_floating_point() else v for k, v in spec.batch(step).items()}


TRAIN_MEMORY_STEPS = (0.5, 0.25, 0.75, 0.1, 0.9, 0.02)


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

    def with_memory(cluster, memory: float):
        doc = json.loads(cluster.to_json())
        doc["device_types"][0]["memory_bytes"] = int(memory)
        return shardwise.Cluster.from_json(json.dumps(doc))

    cluster = shardwise.Cluster.preset("cpu", TRAIN_WORLD)
    replicated = shardwise.plan(graph, cluster, global_batch=BATCH, mesh=mesh).predicted_memory()[0]
    least = shardwise.plan(graph, with_memory(cluster, 1), global_batch=BATCH, mesh=mesh).predicted_memory()[0]
    weights = {v["name"] for v in json.loads(graph.to_json())["values"] if v["role"] == "parameter"}
    for fraction in TRAIN_MEMORY_STEPS:
        tight = with_memory(cluster, (least + fraction * (replicated - least)) / shardwise._C.MEMORY_FRACTION)
        plan = shardwise.Plan.search(graph, tight, global_batch=BATCH, mesh=mesh)  # the default memory_fraction
        if plan.fits and any(p[1].startswith("S") for n, p in plan.placements().items() if n in weights):
            break
    return tight, fraction


def _train_worker(rank: int, world: int, store: str, name: str, mesh: tuple[int, int], out: str) -> None:
    """One rank: for each plan kind, parallelize a fresh float64 model on `mesh`, then
    TRAIN_STEPS AdamW steps; rank 0 writes the losses and the whole parameters (each rank
    writes its errors)."""
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
        for kind in TRAIN_PLANS:
            try:
                fraction = None
                if kind == "auto":
                    cluster = shardwise.Cluster.preset("cpu", world)
                else:
                    graph = shardwise.capture(spec.build_for_training(), batches[0])
                    cluster, fraction = _sharded_cluster(graph, mesh)
                model = spec.build_for_training()
                engine = shardwise.parallelize(model, batches[0], mesh=mesh, cluster=cluster)
                optimizer = engine.optimizer(torch.optim.AdamW, lr=TRAIN_LR)
                losses = []
                for batch in batches:
                    losses.append(float(engine.train_step(**batch)))
                    optimizer.step()
                    optimizer.zero_grad()
                placements = engine.plan.placements()
                names = [n for n, _ in engine.named_parameters()]
                sharded = [n for n in names if len(placements.get(n, ())) > 1 and placements[n][1].startswith("S")]
                state = engine.full_state_dict()  # a collective: every rank gathers
                results[kind] = {"losses": losses, "sharded": sharded, "parameters": len(names), "memory": fraction,
                                 "whole": list(engine.whole_nodes), "state": state if rank == 0 else None}
            except Exception as e:  # noqa: BLE001 - the table reports it
                results[kind] = {"error": first_line(e), "traceback": traceback.format_exc()}
            dist.barrier()
    finally:
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
        dist.destroy_process_group()


def _spawn_training(name: str, mesh: tuple[int, int]) -> dict[str, dict]:
    """One spawn of TRAIN_WORLD Gloo processes (a FileStore in a temp dir) for both plans of
    `mesh`; returns rank 0's results by plan kind, with any rank's error in place of them."""
    import os
    import tempfile
    import time

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        context = mp.start_processes(_train_worker, args=(TRAIN_WORLD, os.path.join(tmp, "store"), name, mesh, tmp),
                                     nprocs=TRAIN_WORLD, join=False, start_method="spawn")
        deadline = time.monotonic() + TRAIN_TIMEOUT
        try:
            while not context.join(timeout=5):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the {mesh[0]}x{mesh[1]} run took over {TRAIN_TIMEOUT} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(TRAIN_WORLD)]
    out = {}
    for kind in TRAIN_PLANS:
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
        loss = model(**_train_batch(spec, step)).loss
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
    """The "train eq" column: on 4 Gloo processes, `parallelize` on each mesh with the
    automatic plan (`Cluster.preset("cpu", 4)`) and a sharded one (tight_cluster: the
    memory holds the model only with its weights sharded on the tensor axis), TRAIN_STEPS
    AdamW steps in float64 against one process. One row per (mesh, plan): weights sharded on
    the tensor axis, whole nodes, the worst relative loss and parameter errors; pass within
    TRAIN_TOLERANCE."""
    import transformers

    transformers.logging.set_verbosity_error()
    ref_losses, ref_params, ref_buffers = _reference_training(spec)
    rows = []
    for mesh in MESHES:
        try:
            runs = _spawn_training(spec.name, mesh)
        except Exception as e:  # noqa: BLE001
            runs = {kind: {"error": first_line(e)} for kind in TRAIN_PLANS}
        for kind in TRAIN_PLANS:
            run = runs[kind]
            row = {"mesh": f"{mesh[0]}x{mesh[1]}", "plan": kind}
            if "error" in run:
                row.update(error=run["error"], passed=False)
                rows.append(row)
                continue
            loss_error = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(run["losses"], ref_losses))
            param_error, param_where = _tensor_error(run["state"], ref_params)
            buffer_error, buffer_where = _tensor_error(run["state"], ref_buffers) if ref_buffers else (0.0, "")
            row.update(sharded=len(run["sharded"]), parameters=run["parameters"], whole=len(run["whole"]),
                       memory=run["memory"],
                       whole_nodes=run["whole"][:8], loss=loss_error, param=param_error, param_where=param_where,
                       buffer=buffer_error, buffer_where=buffer_where, losses=run["losses"], ref_losses=ref_losses,
                       passed=loss_error < TRAIN_TOLERANCE and param_error < TRAIN_TOLERANCE
                       and buffer_error < TRAIN_TOLERANCE)
            rows.append(row)
    passed = sum(r["passed"] for r in rows)
    return f"{'pass' if passed == len(rows) else 'FAIL'} {passed}/{len(rows)}", rows


def _print_train_details(results: list["Result"]) -> None:
    print(f"\ntraining equivalence ({TRAIN_STEPS} AdamW steps, lr {TRAIN_LR}, float64, {TRAIN_WORLD} Gloo processes; "
          f"pass: loss and parameters within {TRAIN_TOLERANCE:.0e} relative; sharded (f): the memory f of the way "
          f"from the least to the replicated plan's, where not {TRAIN_MEMORY_STEPS[0]:g}):")
    print("| model | mesh | plan | sharded weights | whole nodes | loss error | parameter error | result |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        for row in r.details.get("train eq", []):
            if "error" in row:
                print(f"| {r.name} | {row['mesh']} | {row['plan']} | | | | | **fail**: {row['error']} |")
                continue
            worst = "" if row["passed"] else f" (worst {row['param_where'] if row['param'] >= row['buffer'] else row['buffer_where']})"
            buffer = f", buffers {row['buffer']:.1e}" if row["buffer"] >= TRAIN_TOLERANCE else ""
            plan = row["plan"] if row.get("memory") in (None, TRAIN_MEMORY_STEPS[0]) else \
                f"{row['plan']} ({row['memory']:g})"
            print(f"| {r.name} | {row['mesh']} | {plan} | {row['sharded']}/{row['parameters']} | {row['whole']} "
                  f"| {row['loss']:.1e} | {row['param']:.1e}{buffer} | "
                  f"{'pass' if row['passed'] else '**FAIL**' + worst} |")
    both = sum(bool(r.details.get("train eq")) and all(row["passed"] for row in r.details["train eq"])
               for r in results)
    print(f"\n{both} of {len(results)} models pass on both meshes with both plans")


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
