"""shardwise.capture: a PyTorch model + example inputs -> shardwise.Graph.

Three front ends reach the same core IR:

- ``method="export"`` (default): ``torch.export.export(..., strict=False)``, the
  training IR (pre-dispatch ATen) with shapes from ``node.meta["val"]``.
- ``method="fx"``: ``torch.fx.symbolic_trace`` for the program structure (and each
  node's ``nn_module_stack``), then lowered to the same ATen ops by interpreting that
  graph under ``make_fx``; used automatically when export fails.
- ``method="torchscript"``: ``torch.jit.trace`` and the C++ importer that walks the
  ``torch::jit::Graph``. TorchScript is deprecated in favour of torch.export (torch
  2.11+); it is supported because existing code still ships traced modules, and
  its deprecation warnings are left visible.

Meta-device models capture without allocating weights: build the model under
``with torch.device("meta"):`` and pass meta (or CPU) example inputs.
"""
from __future__ import annotations

import inspect
import json
import warnings
from collections.abc import Mapping
from typing import Any, Sequence

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
from torch.export.graph_signature import InputKind

from . import _C
from ._logging import get_logger
from ._functionalize import functionalize
from ._fx_import import CaptureError, _Builder, document, flatten_names, walk_graph
from .graph import Graph

log = get_logger("shardwise.capture")

_METHODS = ("export", "fx", "torchscript")


def _tensor_leaves(out: Any) -> list[torch.Tensor]:
    """The tensors of a model's output, in order; non-tensor leaves (caches, None,
    Python scalars) are dropped: they are not part of the computation to shard."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, Mapping):
        return [t for v in out.values() for t in _tensor_leaves(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _tensor_leaves(v)]
    return []


class _TensorOutputs(torch.nn.Module):
    """Calls the model with keyword arguments and returns its output tensors as a flat
    tuple, so outputs torch.export cannot flatten (e.g. a KV cache object) never stop
    capture. Names inside it are the model's own, under the prefix "model."."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, **kwargs):
        return tuple(_tensor_leaves(self.model(**kwargs)))


def _bind_inputs(model: torch.nn.Module, example_inputs: Any, example_kwargs: dict | None) -> dict:
    """Example inputs as {forward argument name: value}, in signature order."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if isinstance(example_inputs, Mapping):
        args, kwargs = (), dict(example_inputs)
    else:
        args, kwargs = tuple(example_inputs), {}
    kwargs.update(example_kwargs or {})
    signature = inspect.signature(model.forward)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as e:
        raise CaptureError(f"example inputs do not match {type(model).__name__}.forward: {e}") from None
    named = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            named.update({f"{name}_{i}": v for i, v in enumerate(value)})
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return named


def _input_names(named: dict) -> list[str]:
    """IR names of the tensor leaves of the bound inputs, in pytree order."""
    names = []
    for key, value in named.items():
        leaves = _tensor_leaves(value)
        if isinstance(value, torch.Tensor):
            names.append(key)
        else:
            names.extend(f"{key}_{i}" for i in range(len(leaves)))
    return names


def _strip(name: str, prefix: str = "model.") -> str:
    return name[len(prefix):] if name.startswith(prefix) else name


def _canonical_names(model: torch.nn.Module) -> dict[str, str]:
    """Every parameter/buffer name -> the first name of the same tensor, so a tied
    weight (GPT-2's lm_head.weight is transformer.wte.weight) is one IR value."""
    first: dict[int, str] = {}
    canonical = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        canonical[name] = first.setdefault(id(t), name)
    return canonical


def _capture_export(model: torch.nn.Module, named: dict, batch_dim: int | None, prefix: str = "model.") -> dict:
    """`prefix`: the path, inside the export wrapper, of the module whose names the IR uses
    (stripped from parameter names and module paths)."""
    wrapper = _TensorOutputs(model)
    canonical = _canonical_names(wrapper)
    ep = torch.export.export(wrapper, (), kwargs=named, strict=False)
    builder = _Builder(strip_prefix=prefix)
    env: dict = {}
    user_names = iter(_input_names(named))
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    for spec, node in zip(ep.graph_signature.input_specs, placeholders):
        val = node.meta.get("val")
        if spec.kind == InputKind.USER_INPUT:
            if isinstance(val, torch.Tensor):
                env[node] = builder.leaf(next(user_names), val, "input", batch_dim)
            continue  # a Python constant input: specialised into the graph
        role = {InputKind.PARAMETER: "parameter", InputKind.BUFFER: "buffer",
                InputKind.CONSTANT_TENSOR: "constant"}.get(spec.kind)
        if role is None:
            raise CaptureError(f"input '{node.name}' of kind {spec.kind.name} is not supported")
        name = _strip(canonical.get(spec.target, spec.target), prefix)
        if role == "constant":
            builder.constants[name] = ep.constants.get(spec.target)
        env[node] = name if name in builder.names else builder.leaf(name, val, role)
    functionalize(ep.graph)
    results = walk_graph(ep.graph, builder, env, ep.graph_module)
    return document(builder, flatten_names(results)), builder


class _MetaInterpreter(torch.fx.Interpreter):
    """Runs a symbolic_trace graph; Interpreter.run_node already publishes each node's
    meta (with its nn_module_stack) as the current meta, which make_fx copies onto the
    ATen nodes it records under preserve_node_meta()."""

    def call_module(self, target, args, kwargs):
        # A leaf module's own path is not in the stack recorded at its call site.
        meta = fx_traceback.get_current_meta()
        if meta is not None:
            stack = dict(meta.get("nn_module_stack") or {})
            stack[target] = (target, type(self.module.get_submodule(target)))
            meta["nn_module_stack"] = stack
        return super().call_module(target, args, kwargs)


def _capture_fx(model: torch.nn.Module, named: dict, batch_dim: int | None, prefix: str = "model.") -> dict:
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = torch.fx.symbolic_trace(model)
    params = dict(gm.named_parameters())
    buffers = dict(gm.named_buffers())
    names = list(named)
    tensors = [named[n] for n in names]

    def run(p, b, *xs):
        with torch.nn.utils.stateless._reparametrize_module(gm, {**p, **b}, tie_weights=True):
            return tuple(_tensor_leaves(_MetaInterpreter(gm).run(*xs)))

    with fx_traceback.preserve_node_meta():
        lowered = make_fx(run, pre_dispatch=True, tracing_mode="fake", _allow_non_fake_inputs=True)(
            params, buffers, *tensors)
    inner = prefix[len("model."):]  # symbolic_trace names are the model's own: no wrapper
    builder = _Builder(strip_prefix=inner)
    env: dict = {}
    placeholders = [n for n in lowered.graph.nodes if n.op == "placeholder"]
    leaf_specs = ([(_strip(n, inner), "parameter") for n in params] + [(_strip(n, inner), "buffer") for n in buffers]
                  + [(n, "input") for n in names])
    for (name, role), node in zip(leaf_specs, placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            env[node] = builder.leaf(name, val, role, batch_dim if role == "input" else None)
    functionalize(lowered.graph)
    results = walk_graph(lowered.graph, builder, env, lowered)
    return document(builder, flatten_names(results)), builder


def capture(
    model: torch.nn.Module,
    example_inputs: Any = (),
    method: str = "export",
    *,
    example_kwargs: dict | None = None,
    batch_dim: int | None = 0,
) -> Graph:
    """Captures `model` called on `example_inputs` into a shardwise.Graph.

    example_inputs: a tensor, a tuple of positional arguments, or a dict of keyword
    arguments (example_kwargs adds keywords to positional ones). batch_dim: the
    dimension of each input tensor that is the batch (None: no batch dimension); it is
    propagated to every activation through the op rules.
    """
    if method not in _METHODS:
        raise ValueError(f"capture method must be one of {_METHODS}, got {method!r}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"capture expects a torch.nn.Module, got {type(model).__name__}")
    named = _bind_inputs(model, example_inputs, example_kwargs)
    if method == "torchscript":
        from ._torchscript import import_torchscript

        return Graph._from_core(import_torchscript(model, named), batch_dim=batch_dim)
    graph, _ = _capture_with_sources(model, named, method, batch_dim)
    return graph


def _capture_with_sources(model: torch.nn.Module, named: dict, method: str, batch_dim: int | None,
                          prefix: str = "model."):
    """The Graph and the capture's _Builder, whose `sources` map every IR node back to the
    ATen FX node it came from (the rewrite lowers those again, per rank)."""
    if method == "export":
        try:
            doc, builder = _capture_export(model, named, batch_dim, prefix)
        except _C.ShardwiseError:
            raise  # shardwise's own errors say what is wrong; the fx fallback would not help
        except Exception as export_error:  # noqa: BLE001 - report both failures if the fallback fails too
            log.warning("torch.export failed (%s: %s); falling back to fx capture",
                        type(export_error).__name__, str(export_error).splitlines()[0] if str(export_error) else "")
            try:
                doc, builder = _capture_fx(model, named, batch_dim, prefix)
            except Exception as fx_error:
                inner = getattr(model, "model", None)  # parallelize's wrapper: name the user's model
                name = type(inner if isinstance(inner, torch.nn.Module) and prefix.startswith("model.model.")
                            else model).__name__
                raise CaptureError(
                    f"could not capture {name}: torch.export failed with "
                    f"{type(export_error).__name__}: {export_error}\n"
                    f"and the fx fallback failed with {type(fx_error).__name__}: {fx_error}") from fx_error
    else:
        doc, builder = _capture_fx(model, named, batch_dim, prefix)
    return Graph._from_core(_C.Graph.from_json(json.dumps(doc)), batch_dim=batch_dim), builder
