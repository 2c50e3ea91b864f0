"""Resolves a model spec string (as the CLI takes it) to (model, example_inputs).

  tiny-gpt                 the built-in TinyGPT (real weights, CPU)
  module:function          your function returning (model, example_inputs)
  hf:gpt2 | hf:t5 | hf:vit | hf:<model_type> | hf:path/to/config.json | hf:path/to/dir
                           a Hugging Face transformers model built from its config
                           with random weights on the meta device (nothing downloaded),
                           with its task head and labels (see `hf_task_head`)
"""
from __future__ import annotations

import importlib
import inspect
import os
from typing import Any

import torch

_HF_ALIASES = {"bert": "bert", "gpt2": "gpt2", "llama": "llama"}

# Task heads in the order a config with no `architectures` is given one: an encoder-decoder
# its (text, then speech) sequence-to-sequence head; an encoder its masked LM (BERT also has
# a causal LM head, BART a masked one and Whisper a causal one, so the order matters); a
# decoder its causal LM; a vision model its image classifier; anything else its base model.
_SEQ2SEQ_HEADS = (
    ("seq2seq-lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("speech-seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
)
_TASK_HEADS = (
    ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("base", "MODEL_MAPPING_NAMES"),
)


def hf_task_head(config) -> tuple[str, str]:
    """(task, class name) of the model to build for a transformers config.

    A config saved with a checkpoint names its class (`architectures`, e.g.
    T5ForConditionalGeneration): that one. Otherwise the first task of `_TASK_HEADS` whose
    auto mapping knows the config's model type, `_SEQ2SEQ_HEADS` first for an
    encoder-decoder config."""
    import transformers
    from transformers.models.auto import modeling_auto

    names = list(getattr(config, "architectures", None) or [])
    for name in names:
        if hasattr(transformers, name):
            return _task_of(name), name
    model_type = config.model_type
    heads = (_SEQ2SEQ_HEADS if getattr(config, "is_encoder_decoder", False) else ()) + _TASK_HEADS
    for task, mapping in heads:
        found = getattr(modeling_auto, mapping, {}).get(model_type)
        if isinstance(found, (list, tuple)):
            found = found[0]
        if found and hasattr(transformers, found):
            return task, found
    raise ValueError(f"hf:{model_type}: transformers has no model class for this config"
                     + (f" (architectures {names} are not in this transformers version)" if names else ""))


def _task_of(class_name: str) -> str:
    """The task of a transformers class name, from its suffix."""
    for suffix, task in (("ForConditionalGeneration", "seq2seq-lm"), ("ForSeq2SeqLM", "seq2seq-lm"),
                         ("ForMaskedLM", "masked-lm"), ("ForCausalLM", "causal-lm"), ("LMHeadModel", "causal-lm"),
                         ("ForImageClassification", "image-classification")):
        if class_name.endswith(suffix):
            return task
    return "base"


def _image_size(config) -> tuple[int, int]:
    size = getattr(config, "image_size", None) or 224
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    return int(size), int(size)


def hf_example_inputs(model: torch.nn.Module, config, task: str, batch: int, seq: int, device: str) -> dict:
    """Example inputs for a transformers model: its main input (token ids, pixels, audio
    features) and, when its forward() takes them, labels for its task."""
    main = getattr(model, "main_input_name", "input_ids")
    vocab = getattr(config, "vocab_size", None) or 2
    if main == "pixel_values":
        height, width = _image_size(config)
        channels = getattr(config, "num_channels", 3)
        inputs = {main: torch.randn(batch, channels, height, width, device=device)}
    elif main == "input_features":
        frames = 2 * getattr(config, "max_source_positions", seq // 2)
        inputs = {main: torch.randn(batch, getattr(config, "num_mel_bins", 80), frames, device=device)}
    elif main == "input_values":
        inputs = {main: torch.randn(batch, 16 * seq, device=device)}
    else:
        inputs = {main: torch.randint(0, vocab, (batch, seq), device=device)}
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        parameters = {}
    takes_labels = "labels" in parameters
    if takes_labels and task in ("causal-lm", "masked-lm", "seq2seq-lm", "speech-seq2seq"):
        inputs["labels"] = torch.randint(0, vocab, (batch, seq), device=device)
        if task.endswith("seq2seq-lm") and "decoder_input_ids" in parameters:
            # Given rather than shifted from the labels by the model, which needs a
            # decoder_start_token_id that a config built from defaults may lack (T5's).
            inputs["decoder_input_ids"] = torch.randint(0, vocab, (batch, seq), device=device)
    elif takes_labels and task == "image-classification":
        inputs["labels"] = torch.randint(0, getattr(config, "num_labels", 2), (batch,), device=device)
    return inputs


def _hf_model(spec: str, batch: int, seq: int, device: str) -> tuple[torch.nn.Module, Any]:
    import transformers

    if spec.endswith(".json") or os.path.isdir(spec):
        config = transformers.AutoConfig.from_pretrained(spec)
    else:
        config = transformers.AutoConfig.for_model(_HF_ALIASES.get(spec, spec))
    if hasattr(config, "use_cache"):
        config.use_cache = False  # training: no KV cache
    task, class_name = hf_task_head(config)
    with torch.device(device):
        model = getattr(transformers, class_name)(config)
    return model, hf_example_inputs(model, config, task, batch, seq, device)


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
