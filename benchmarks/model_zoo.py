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

    def to_json(self) -> dict:
        return {"name": self.name, "family": self.family, "captured": sorted(self.captured),
                "unknown_ops": self.unknown, "plans": [list(m) for m in self.plans], "errors": self.errors,
                "columns": self.cells}


def first_line(e: BaseException) -> str:
    """`Type: first line of the message`, without the stack."""
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return f"{type(e).__name__}: {line}"[:300]


# A column: (model, graphs by method, plans by mesh) -> the cell's text. See the module
# docstring; the training-equivalence column goes here.
Column = Callable[[ZooModel, dict[str, Any], dict[tuple[int, int], Any]], str]
COLUMNS: dict[str, Column] = {}


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
            result.cells[name] = column(spec, result.captured, result.plans)
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
    ok = ", ".join(f"{m} {sum(m in r.captured for r in results)}" for m in methods)
    planned = sum(all(m in r.plans for m in MESHES) for r in results)
    print(f"\n{len(results)} models; captured by {ok}; planned on both meshes {planned}; "
          f"with unknown ops {sum(bool(r.unknown) for r in results)}")


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
    print_table(results, args.columns, tuple(args.methods))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_json() for r in results], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
