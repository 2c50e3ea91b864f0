"""TorchScript front end: a module (traced here, or already a ScriptModule) -> the
shardwise core IR, through the C++ importer (csrc/torch/torchscript_import.cc).

Status: TorchScript is deprecated in favour of ``torch.export`` (PyTorch docs since
2.9; ``torch.jit.trace``/``script`` emit a ``DeprecationWarning`` in 2.10-2.13 and a
``FutureWarning`` from 2.14). This path exists for code that still ships traced
modules; ``shardwise.capture(model, inputs)`` (torch.export) is the preferred capture.
The deprecation warning is deliberately left visible: it is torch's message to the
user, not noise of ours.

The importer needs static shapes, which only traced graphs carry. A scripted module
(``torch.jit.script``) is accepted, but its graph has no shapes and usually control
flow, so importing it fails with a ShardwiseError that says so; trace it instead.
"""
from __future__ import annotations

import copy
import inspect
import re
from collections.abc import Mapping
from typing import Any, Sequence

import torch

from . import _C
from ._inputs import forward_signature, split_call, tensor_leaves
from ._tensor_names import module_tensor_table

__all__ = ["import_torchscript", "import_torchscript_debug", "import_graph_debug", "trace", "module_tensor_table"]

_ScriptTypes = (torch.jit.ScriptModule, torch.jit.ScriptFunction)


def _tensor_output_view(model: torch.nn.Module, example_inputs: tuple | Mapping) -> torch.nn.Module:
    """A shallow copy of `model` (the same parameters, buffers and submodules, so the same
    names) whose forward() returns the tensors of the model's output as a flat tuple.

    The tracer accepts only tensors, and lists, tuples and dicts of them, as outputs: a
    transformers model with its default use_cache=True returns a Cache object and fails
    with "Tracer cannot infer type of CausalLMOutputWithPast(...)". The importer keeps only
    output tensors anyway (non-tensor outputs are not part of the computation to shard), as
    torch.export capture does. With keyword inputs the copy's forward() takes exactly those
    names and calls the model as capture bound them (``forward(*xs)``'s ``xs_0``, ...
    positionally: shardwise._inputs.split_call)."""
    original = model.forward
    signature = forward_signature(model)
    if isinstance(example_inputs, Mapping):
        names = [n for n, v in example_inputs.items() if not _is_constant(v)]
        constants = {n: v for n, v in example_inputs.items() if _is_constant(v)}

        def forward(*args, **kwargs):
            named = dict(constants, **dict(zip(names, args)), **kwargs)
            call_args, call_kwargs = split_call(signature, named)
            return tuple(tensor_leaves(original(*call_args, **call_kwargs)))

        # The tracer names the traced method's inputs from this signature.
        forward.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    else:
        def forward(*args, **kwargs):
            return tuple(tensor_leaves(original(*args, **kwargs)))

        if signature is not None:
            forward.__signature__ = signature
    view = copy.copy(model)  # the user's module keeps its own forward()
    view.forward = forward
    return view


def _is_constant(value: Any) -> bool:
    """A keyword input the tracer cannot take (it takes tensors, and tuples and dicts of
    them): a flag, a size, None. Traced as the constant it is, as torch.export does."""
    return not tensor_leaves(value)


def trace(model: torch.nn.Module, example_inputs: tuple | Mapping) -> torch.jit.ScriptModule:
    """``torch.jit.trace`` as the importer wants it; a Mapping is traced as keyword
    arguments (``example_kwarg_inputs``). An nn.Module is traced returning the tensors of
    its output as a flat tuple (`_tensor_output_view`).

    strict=False lets the model return dicts and lists (Hugging Face ModelOutput);
    check_trace=False skips re-running the model to compare traces, which is slow and,
    for models that build masks from Python control flow, reports harmless differences.
    """
    if isinstance(model, torch.nn.Module) and not isinstance(model, _ScriptTypes):
        model = _tensor_output_view(model, example_inputs)
        if isinstance(example_inputs, Mapping):  # the view takes the constants itself
            example_inputs = {n: v for n, v in example_inputs.items() if not _is_constant(v)}
    if isinstance(example_inputs, Mapping):
        return torch.jit.trace(model, example_kwarg_inputs=dict(example_inputs), strict=False, check_trace=False)
    return torch.jit.trace(model, tuple(example_inputs), strict=False, check_trace=False)


def _module_constants(model: torch.nn.Module) -> dict[str, Any]:
    """Flags a scripted graph reads through prim::GetAttr (``self.training``), by
    qualified name; a traced graph never reads them (the tracer baked them in)."""
    return {(f"{path}.training" if path else "training"): m.training for path, m in model.named_modules()}


def _input_names(model: Any, example_inputs: tuple | Mapping) -> list[str]:
    """forward() argument names of the example inputs, or [] to let the importer use
    the graph's own names (the ScriptModule case: its graph names them already)."""
    if isinstance(example_inputs, Mapping):
        return []  # the traced graph's inputs carry the keyword names
    if isinstance(model, _ScriptTypes) or not isinstance(model, torch.nn.Module):
        return []
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return []
    names = []
    for p, value in zip(params, example_inputs):
        if p.kind not in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            return []
        if not isinstance(value, torch.Tensor):
            return []  # nested inputs: the importer names their leaves "<name>_<i>" itself
        names.append(p.name)
    return names


def _graph_name(value: "torch._C.Value") -> str:
    return re.sub(r"\.\d+$", "", value.debugName())  # "input_ids.1" is input `input_ids`


def _typed_graph(graph: "torch._C.Graph", example_inputs: tuple | Mapping) -> "torch._C.Graph":
    """The graph with complete types on its tensor inputs. A trace with keyword inputs
    leaves them as plain `Tensor`; the types come from the example tensors, matched by
    name (keywords) or position. A copy: the module's own graph is not touched."""
    def incomplete(v) -> bool:
        t = v.type()
        return isinstance(t, torch._C.TensorType) and (t.sizes() is None or t.scalarType() is None)

    if not example_inputs or not any(incomplete(v) for v in graph.inputs()):
        return graph
    copy = graph.copy()
    inputs = [v for v in copy.inputs() if not isinstance(v.type(), torch._C.ClassType)]
    if isinstance(example_inputs, Mapping):
        pairs = [(v, example_inputs.get(_graph_name(v))) for v in inputs]
    else:
        pairs = list(zip(inputs, example_inputs))
    for v, t in pairs:
        if isinstance(t, torch.Tensor) and incomplete(v):
            v.setType(torch._C.TensorType.create_from_tensor(t))
    return copy


def _prepare(model: Any, example_inputs: Any):
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, Mapping):
        example_inputs = tuple(example_inputs)
    if isinstance(model, _ScriptTypes):
        scripted = model
    elif isinstance(model, torch.nn.Module):
        if not example_inputs:
            raise ValueError("import_torchscript needs example inputs to trace an nn.Module")
        scripted = trace(model, example_inputs)
    else:
        raise TypeError(f"import_torchscript expects an nn.Module or a ScriptModule, got {type(model).__name__}")
    # Names and tied-weight identity come from the module the user gave: for a traced
    # module they are the same names (the tracer keeps the module hierarchy).
    source = model if isinstance(model, torch.nn.Module) else None
    table = module_tensor_table(source) if source is not None else []
    constants = _module_constants(source) if source is not None else {}
    graph = _typed_graph(scripted.graph, example_inputs)
    return scripted, graph, table, _input_names(model, example_inputs), constants


def import_torchscript(model: Any, example_inputs: tuple | Mapping = (), **options) -> "_C.Graph":
    """Traces `model` on `example_inputs` (unless it is already a ScriptModule) and
    imports the TorchScript graph into a ``shardwise._C.Graph``.

    example_inputs: a tensor, a tuple of positional arguments, or a dict of keyword
    arguments ({"input_ids": ..., "labels": ...}); the IR inputs are named by the
    forward() arguments they bind to.

    TorchScript is deprecated (see the module docstring); prefer ``shardwise.capture``.
    options: scalar_constants_as_attributes, remove_mutation, canonicalize_convolution,
    elide_no_ops (all True by default; see TorchScriptImportOptions in
    csrc/torch/torchscript_import.h). Raises ShardwiseError on graphs the IR cannot
    express (data-dependent control flow, missing shapes), naming the node and source line.
    """
    # `scripted` must outlive the call: inlining reads its submodules' method graphs.
    scripted, graph, table, names, constants = _prepare(model, example_inputs)
    return _C.import_torchscript(graph, table, names, constants, **options)


def import_torchscript_debug(model: Any, example_inputs: tuple | Mapping = (), **options) -> dict:
    """As import_torchscript, but returns the IR as plain Python data: {"values": [{name,
    dtype, shape, batch_dim, role}], "nodes": [{op, inputs, outputs, attrs, module_path}],
    "inputs": [...], "outputs": [...]}. For tests and inspection."""
    scripted, graph, table, names, constants = _prepare(model, example_inputs)  # noqa: F841 (kept alive)
    return _C._torchscript_import_debug(graph, table, names, constants, **options)


def import_graph_debug(graph: "torch._C.Graph", module_tensors: Sequence = (), input_names: Sequence[str] = (),
                       **options) -> dict:
    """Imports a bare torch._C.Graph (e.g. ``torch.jit.trace(fn, ...).graph``) to plain data."""
    return _C._torchscript_import_debug(graph, list(module_tensors), list(input_names), {}, **options)
