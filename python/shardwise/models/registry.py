"""Resolves a model spec string (as the CLI takes it) to (model, example_inputs).

  tiny-gpt                 the built-in TinyGPT (real weights, CPU)
  module:function          your function returning (model, example_inputs)
  hf:gpt2 | hf:bert | hf:llama | hf:<model_type> | hf:path/to/config.json
                           a Hugging Face transformers model built from its config
                           with random weights on the meta device (nothing downloaded)
"""
from __future__ import annotations

import importlib
import os
from typing import Any

import torch

_HF_ALIASES = {"bert": "bert", "gpt2": "gpt2", "llama": "llama"}


def _hf_model(spec: str, batch: int, seq: int, device: str) -> tuple[torch.nn.Module, Any]:
    import transformers

    if spec.endswith(".json") or os.path.isdir(spec):
        config = transformers.AutoConfig.from_pretrained(spec)
    else:
        config = transformers.AutoConfig.for_model(_HF_ALIASES.get(spec, spec))
    config.use_cache = False
    is_masked_lm = config.model_type in ("bert", "roberta", "distilbert", "albert", "electra")
    auto = transformers.AutoModelForMaskedLM if is_masked_lm else transformers.AutoModelForCausalLM
    with torch.device(device):
        model = auto.from_config(config)
    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    return model, {"input_ids": ids, "labels": ids}


def resolve_model(spec: str, batch: int = 4, seq: int | None = None, device: str = "meta"):
    """(model, example_inputs) for a model spec; see the module docstring."""
    if spec == "tiny-gpt":
        from .tiny_gpt import TinyGPT

        torch.manual_seed(0)
        model = TinyGPT()
        return model, model.example_inputs(batch)
    if spec.startswith("hf:"):
        return _hf_model(spec[3:], batch, seq or 128, device)
    if ":" in spec:
        module_name, _, fn_name = spec.partition(":")
        fn = getattr(importlib.import_module(module_name), fn_name)
        return fn()
    raise ValueError(f"unknown model spec {spec!r}: use tiny-gpt, module:function, or hf:NAME")
