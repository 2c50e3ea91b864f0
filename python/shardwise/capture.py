"""shardwise.capture: a PyTorch model + example inputs -> shardwise.Graph.

Three front ends reach the same core IR:

- ``method="export"`` (default): ``torch.export.export(..., strict=False)``, the
  training IR (pre-dispatch ATen) with shapes from ``node.meta["val"]``.
- ``method="fx"``: ``make_fx`` on fake tensors (pre-dispatch ATen, each node's
  ``nn_module_stack`` recorded); used automatically when export fails.
- ``method="torchscript"``: ``torch.jit.trace`` and the C++ importer that walks the
  ``torch::jit::Graph``. TorchScript is deprecated in favour of torch.export (torch
  2.11+); it is supported because existing code still ships traced modules, and
  its deprecation warnings are left visible.

Meta-device models capture without allocating weights: build the model under
``with torch.device("meta"):`` and pass meta (or CPU) example inputs.
"""
from __future__ import annotations

import contextlib
import json
import warnings
from typing import Any

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
from torch.export.graph_signature import InputKind

from . import _C
from ._logging import get_logger
from ._causal_masks import fold_causal_masks
from ._grouped_experts import fold_routed_experts, grouped_mm_capturable
from ._moe_experts import experts_as_one_op
from ._functionalize import functionalize
from ._fx_import import CaptureError, _Builder, document, flatten_names, op_name, walk_graph
from ._inputs import bind_inputs, forward_signature, input_names, split_call, tensor_leaves
from ._tensor_names import canonical_names
from .graph import Graph

log = get_logger("shardwise.capture")

_METHODS = ("export", "fx", "torchscript")


# The tensors of a model's output (capture's own name for it, kept for its readers).
_tensor_leaves = tensor_leaves


class _TensorOutputs(torch.nn.Module):
    """Calls the model with the bound inputs and returns its output tensors as a flat
    tuple, so outputs torch.export and the TorchScript tracer cannot flatten (a KV cache
    object) never stop capture. Names inside it are the model's own, under the prefix
    "model."."""

    def __init__(self, model: torch.nn.Module, constants: dict | None = None):
        super().__init__()
        self.model = model
        self._signature = forward_signature(model)
        self._constants = dict(constants or {})  # bound inputs that are Python values, passed as they are

    def forward(self, **kwargs):
        return self._call(kwargs)

    def _call(self, named: dict):
        args, kwargs = split_call(self._signature, {**self._constants, **named})
        return tuple(tensor_leaves(self.model(*args, **kwargs)))


def _strip(name: str, prefix: str = "model.") -> str:
    return name[len(prefix):] if name.startswith(prefix) else name


def _capture_export(model: torch.nn.Module, named: dict, batch_dim: int | None, prefix: str = "model.") -> dict:
    """`prefix`: the path, inside the export wrapper, of the module whose names the IR uses
    (stripped from parameter names and module paths)."""
    try:
        with _quick_export():
            return _capture_export_once(model, named, batch_dim, prefix)
    except CaptureError:
        # The capture's own errors name the source line of the op they refuse, from the node's
        # stack trace: trace again with them, to raise that error with its line.
        return _capture_export_once(model, named, batch_dim, prefix)


@contextlib.contextmanager
def _quick_export():
    """torch.export without what the capture never reads, measured on Llama 3 8B's shape
    (32 layers, 16 x 8,192 on the meta device; issue 48's bar is 4 s of CPU):
    - each node's Python stack trace, extracted and symbolised per ATen node: median 5.5 s
      of CPU with them, 4.6 s without, six fresh processes each. Only the capture's error
      messages read them (``_functionalize._where``), and an error traces again with them.
    - the Python source of each intermediate GraphModule, generated again by every export
      pass (6 times): with torch's lazy GraphModules (what dynamo and inductor use) it is
      generated once, when the module is called or its ``code`` read: 1.4 M of 9.0 M Python
      calls, about 1 s of 8 under the profiler."""
    import torch.fx.config as fx_config

    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:  # pragma: no cover - private in torch 2.13; without it, eager modules
        _use_lazy_graph_module = None
    # torch 2.11 has no such setting (its exports emit stack traces): nothing to switch there.
    has_setting = hasattr(fx_config, "do_not_emit_stack_traces")
    before = getattr(fx_config, "do_not_emit_stack_traces", None)
    if has_setting:
        fx_config.do_not_emit_stack_traces = True
    try:
        with _use_lazy_graph_module(True) if _use_lazy_graph_module else contextlib.nullcontext():
            yield
    finally:
        if has_setting:
            fx_config.do_not_emit_stack_traces = before


def _capture_export_once(model: torch.nn.Module, named: dict, batch_dim: int | None, prefix: str) -> tuple:
    wrapper = _TensorOutputs(model)
    canonical = canonical_names(wrapper)  # a tied weight is one IR value
    tracking = _ModuleTracker(_named_root(model, prefix))
    with tracking:
        try:
            ep = torch.export.export(wrapper, (), kwargs=named, strict=False)
        except _C.ShardwiseError:
            raise  # shardwise's own errors (a model with no loss) say what is wrong; fx would not help
        except Exception as e:
            raise _Located(e, tracking.innermost()) from e
    builder = _Builder(strip_prefix=prefix)
    env: dict = {}
    user_names = iter(input_names(named))
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    for spec, node in zip(ep.graph_signature.input_specs, placeholders):
        val = node.meta.get("val")
        if spec.kind == InputKind.USER_INPUT:
            # A Python constant input is specialised into the graph: its placeholder is bound
            # to no value, and nothing reads it.
            env[node] = builder.leaf(next(user_names), val, "input", batch_dim) if isinstance(val, torch.Tensor) else None
            continue
        role = {InputKind.PARAMETER: "parameter", InputKind.BUFFER: "buffer",
                InputKind.CONSTANT_TENSOR: "constant"}.get(spec.kind)
        if role is None:
            raise CaptureError(f"input '{node.name}' of kind {spec.kind.name} is not supported")
        name = _strip(canonical.get(spec.target, spec.target), prefix)
        if role == "constant":
            builder.constants[name] = ep.constants.get(spec.target)
        env[node] = name if name in builder.names else builder.leaf(name, val, role)
    functionalize(ep.graph, constants=[node for spec, node in zip(ep.graph_signature.input_specs, placeholders)
                                       if spec.kind == InputKind.CONSTANT_TENSOR])
    fold_routed_experts(ep.graph)
    fold_causal_masks(ep.graph)
    results = walk_graph(ep.graph, builder, env, ep.graph_module)
    return document(builder, flatten_names(results)), builder


def _capture_fx(model: torch.nn.Module, named: dict, batch_dim: int | None, prefix: str = "model.") -> dict:
    """make_fx on fake tensors, with each ATen node's module stack recorded: an independent
    route to the same ATen program as torch.export, with none of export's own machinery
    (graph signatures, input and output specs, guards)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    wrapper = _TensorOutputs(model)
    params = dict(wrapper.named_parameters())  # tied weights once, under their first name
    buffers = dict(wrapper.named_buffers())
    names = [n for n, v in named.items() if isinstance(v, torch.Tensor)]
    constants = {n: v for n, v in named.items() if not isinstance(v, torch.Tensor)}
    nested = [n for n, v in constants.items() if tensor_leaves(v)]
    if nested:
        raise CaptureError(f"fx capture takes tensors and Python constants as inputs; {nested} hold tensors inside "
                           "a structure (capture with method='export')")

    def run(p, b, *xs):
        # Parameters and buffers as traced inputs (placeholders, in this order), Python
        # values among the inputs baked in.
        with torch.nn.utils.stateless._reparametrize_module(wrapper, {**p, **b}, tie_weights=True):
            return wrapper._call({**constants, **dict(zip(names, xs))})

    # make_fx records each node's nn_module_stack (paths under `run._orig_mod`) when asked
    # to and when node meta is preserved, as torch.export's non-strict tracing does.
    run._orig_mod = wrapper
    tracking = _ModuleTracker(_named_root(model, prefix))
    try:
        with tracking, fx_traceback.preserve_node_meta(), _compiling():
            lowered = make_fx(run, pre_dispatch=True, tracing_mode="fake", _allow_non_fake_inputs=True,
                              record_module_stack=True)(params, buffers, *[named[n] for n in names])
    except Exception as e:
        raise _Located(e, tracking.innermost()) from e
    builder = _Builder(strip_prefix=prefix)
    env: dict = {}
    placeholders = [n for n in lowered.graph.nodes if n.op == "placeholder"]
    leaf_specs = ([(_strip(n, prefix), "parameter") for n in params] + [(_strip(n, prefix), "buffer") for n in buffers]
                  + [(n, "input") for n in names])
    for (name, role), node in zip(leaf_specs, placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            env[node] = builder.leaf(name, val, role, batch_dim if role == "input" else None)
    # Tensors the program makes from Python values (Falcon's fused_qkv[..., [-2], :] indexes
    # with torch.tensor([-2])): make_fx keeps them as attributes, export lifts them as
    # constant inputs; both become Constant leaves.
    for node in lowered.graph.nodes:
        val = getattr(lowered, node.target, None) if node.op == "get_attr" else None
        if isinstance(val, torch.Tensor):
            name = node.target if node.target not in builder.names else builder.unique(node.target)
            builder.names.discard(name)
            env[node] = builder.leaf(name, val, "constant")
            builder.constants[name] = val
    functionalize(lowered.graph)
    fold_routed_experts(lowered.graph)
    fold_causal_masks(lowered.graph)
    results = walk_graph(lowered.graph, builder, env, lowered)
    return document(builder, flatten_names(results)), builder


@contextlib.contextmanager
def _compiling():
    """torch.compiler.is_compiling() is true while fx traces, as it is under torch.export:
    models branch on it to take their traceable path (transformers' MoE experts pick a
    grouped-mm fallback whose fake kernel takes float32, where torch._grouped_mm's wants
    bfloat16)."""
    session = getattr(torch.compiler, "_compile_session_context", None)
    with session() if session is not None else contextlib.nullcontext():
        yield


# ---- where a capture failed ----------------------------------------------------------------


class _ModuleTracker:
    """Which module a trace was in when it failed. Forward pre-hooks push a module's path
    and forward hooks pop it, so an exception leaves the failing module on top. The hooks
    touch no tensor: the captured program is the same with them."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.stack: list[str] = []
        self.handles: list = []

    def __enter__(self):
        for path, module in self.model.named_modules():
            self.handles.append(module.register_forward_pre_hook(lambda m, a, path=path: self.stack.append(path)))
            self.handles.append(module.register_forward_hook(lambda m, a, o: self._pop()))
        return self

    def _pop(self):
        if self.stack:
            self.stack.pop()

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles.clear()
        return False

    def innermost(self) -> str | None:
        """The failing module's path ("" for the model itself), or None if the failure
        came before any module ran."""
        return self.stack[-1] if self.stack else None


class _Located(Exception):
    """A capture failure with where it happened: the module path (as the IR names it) and
    the op when torch's error names one."""

    def __init__(self, error: BaseException, module: str | None):
        super().__init__(str(error))
        self.error = error
        self.module = module
        self.op = _failing_op(error)


def _failing_op(error: BaseException) -> str | None:
    """The op named by torch's fake-tensor errors (no fake kernel, data-dependent output)."""
    func = getattr(error, "func", None)
    return op_name(func) if isinstance(func, torch._ops.OpOverload) else None


def _named_root(model: torch.nn.Module, prefix: str) -> torch.nn.Module:
    """The module whose names the IR uses: `model` itself for the prefix "model." (the
    capture wrapper's), a submodule of it for a longer prefix (parallelize's)."""
    inner = prefix[len("model."):-1]
    return model.get_submodule(inner) if inner else model


def _describe(located: _Located, root: torch.nn.Module) -> str:
    """` at <op> in module '<path>' (<class>)`, as much of it as is known."""
    parts = []
    if located.op:
        parts.append(f" at {located.op}")
    if located.module is not None:
        try:
            cls = type(root.get_submodule(located.module)).__name__
        except AttributeError:
            cls = None
        parts.append(f" in module '{located.module}'" + (f" ({cls})" if cls else ""))
    return "".join(parts)


def _hint(error: BaseException) -> str:
    """What to do about the failures that have one fix."""
    name = type(error).__name__
    if name == "UnsupportedOperatorException":
        return ("\nhint: the op has no fake (meta) kernel, so its output shapes cannot be traced: register one "
                "with torch.library.register_fake, or capture with method='torchscript', which runs the op")
    if name in ("GuardOnDataDependentSymNode", "DynamicOutputShapeException", "DataDependentOutputException"):
        return "\nhint: a shape or a branch there depends on tensor values; capture needs static shapes"
    return ""


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


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
    named = bind_inputs(model, example_inputs, example_kwargs)
    if method == "torchscript":
        from ._torchscript import import_torchscript

        with experts_as_one_op(model):
            return Graph._from_core(import_torchscript(model, _unaliased(named)), batch_dim=batch_dim)
    graph, _ = _capture_with_sources(model, named, method, batch_dim)
    return graph


def _unaliased(named: dict) -> dict:
    """The inputs with every tensor that is another input (labels=input_ids, the usual causal-LM
    call) replaced by a copy: torch.export folds aliased inputs into one placeholder, so the
    graph would read the other name, and a plan searched on distinct tensors (or the engine's
    own micro-batches, which are distinct) would not fit it. Only the capture sees the copies."""
    seen: set[int] = set()
    out = {}
    for name, value in named.items():
        if isinstance(value, torch.Tensor):
            if id(value) in seen:
                value = value.clone()
            seen.add(id(value))
        out[name] = value
    return out


def _capture_with_sources(model: torch.nn.Module, named: dict, method: str, batch_dim: int | None,
                          prefix: str = "model."):
    """The Graph and the capture's _Builder, whose `sources` map every IR node back to the
    ATen FX node it came from (the rewrite lowers those again, per rank). A mixture of
    experts' experts are captured as one op (_moe_experts.py, _grouped_experts.py)."""
    with experts_as_one_op(model), grouped_mm_capturable():
        return _capture_with_sources_of(model, named, method, batch_dim, prefix)


def _capture_with_sources_of(model: torch.nn.Module, named: dict, method: str, batch_dim: int | None,
                             prefix: str):
    root = _named_root(model, prefix)  # parallelize's wrapper: name the user's model
    named = _unaliased(named)
    if method == "export":
        try:
            doc, builder = _capture_export(model, named, batch_dim, prefix)
        except _Located as export_error:  # report both failures if the fallback fails too
            log.warning("torch.export failed%s (%s: %s); falling back to fx capture", _describe(export_error, root),
                        type(export_error.error).__name__, _first_line(export_error.error))
            try:
                doc, builder = _capture_fx(model, named, batch_dim, prefix)
            except Exception as fx_error:
                fx = fx_error if isinstance(fx_error, _Located) else _Located(fx_error, None)
                raise CaptureError(
                    f"could not capture {type(root).__name__}: torch.export failed{_describe(export_error, root)} "
                    f"with {type(export_error.error).__name__}: {_first_line(export_error.error)}"
                    f"{_hint(export_error.error)}\n"
                    f"and the fx fallback failed{_describe(fx, root)} with {type(fx.error).__name__}: "
                    f"{_first_line(fx.error)}\n"
                    f"torch.export's error in full: {export_error.error}\n"
                    f"fx's error in full: {fx.error}") from fx.error
    else:
        try:
            doc, builder = _capture_fx(model, named, batch_dim, prefix)
        except _Located as fx_error:
            raise CaptureError(
                f"could not capture {type(root).__name__} with fx{_describe(fx_error, root)}: "
                f"{type(fx_error.error).__name__}: {_first_line(fx_error.error)}{_hint(fx_error.error)}\n"
                f"in full: {fx_error.error}") from fx_error.error
    # allow_nan=False: a non-finite float that reached the document unconverted is a bug here,
    # not a "-Infinity" for the core to choke on (_fx_import.py writes them as {"float": "inf"}).
    return Graph._from_core(_C.Graph.from_json(json.dumps(doc, allow_nan=False)), batch_dim=batch_dim), builder
