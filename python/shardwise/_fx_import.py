"""ATen-level FX graph -> shardwise IR (as the JSON document `_C.Graph.from_json` reads).

Both Python capture paths end here: `torch.export.export` (an ExportedProgram) and the
fx fallback (`make_fx` on fake tensors, recording each node's module stack). The conventions
are those of the core IR (csrc/ir/graph.h), shared with the TorchScript importer:

- op names are ``aten::<name>`` plus ``.<overload>`` unless the overload is "default";
- node inputs are the tensor operands in schema order (missing optional tensors
  omitted, ``Tensor[]`` arguments flattened); every other argument is an attribute
  keyed by its schema name, defaults filled in, so both importers agree;
- parameters and buffers are leaf values named by their fully qualified names;
- the module path of a node is the innermost entry of its ``nn_module_stack``.

An op that is not an ATen OpOverload (a Python callable the tracer kept) becomes an
opaque node named ``python::<qualified name>``: it has no sharding rule, so the
planner replicates it and `Graph.unknown_ops()` reports it. It never breaks capture.
"""
from __future__ import annotations

import math

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from . import _C

_DTYPES = {
    torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "bool", torch.complex64: "c64", torch.complex128: "c128",
}
for _name, _short in (("float8_e4m3fn", "f8e4m3"), ("float8_e5m2", "f8e5m2")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _short


# Ops the IR leaves out: each returns its operand's value, and whether torch.export records one
# at all depends on the kernels of the device the model was captured on, not on the program.
# The IR, its node names and the plans searched on it must not (a plan searched on a meta
# model runs on the CPU or GPU capture of the same model):
#   aten.contiguous      Tensor.contiguous() is traced only where its operand is not contiguous
#                        already. SDPA's CPU kernel returns a [b, s, h, d]-strided output (so do
#                        fused GPU kernels) and its meta kernel a [b, h, s, d] one, so
#                        `out.transpose(1, 2).contiguous()` (every transformers attention) is a
#                        copy on the meta device and nothing on CPU.
#   aten.lift_fresh_copy torch.tensor(data) copies its lifted constant on CPU; on the meta device
#                        the constant is read directly (transformers' DynamicLayer's empty cache).
# Neither changes a value, so no sharding decision is lost; every node of both ops is left out
# (a real copy too: labels[..., 1:].contiguous()), so no other node's name moves (FX numbers
# nodes per op: 'contiguous_2' would otherwise name the CPU capture's 'contiguous'), and the
# TorchScript importer already elides aten::contiguous (csrc/torch/torchscript_import.cc). The
# rewrite calls them again where a captured node read one (engine._build_module), so the rank
# program keeps the captured program's memory layouts (a view after contiguous()) and copies.
VALUE_IDENTITIES = frozenset({torch.ops.aten.contiguous.default, torch.ops.aten.lift_fresh_copy.default})


def is_value_identity(node: Any) -> bool:
    return (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in VALUE_IDENTITIES
            and bool(node.args) and isinstance(node.args[0], torch.fx.Node))


class CaptureError(_C.ShardwiseError):
    """Capture could not turn the program into the IR; the message names the node."""


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise CaptureError(f"unsupported tensor dtype {dtype}") from None


def tensor_entry(name: str, t: torch.Tensor, batch_dim: int | None, where: str | None = None) -> dict:
    if any(isinstance(d, torch.SymInt) for d in t.shape):
        # A size the trace could not fix (torch.nonzero, boolean masks, .item()): the IR has
        # static shapes only. Said here, naming the node, rather than by int()'s guard error.
        raise CaptureError(f"{where or f'value {name!r}'}: its shape {list(t.shape)} depends on tensor values; "
                           "capture needs static shapes")
    shape = [int(d) for d in t.shape]
    entry = {"name": name, "dtype": dtype_name(t.dtype), "shape": shape}
    if batch_dim is not None and t.dim() > 0:
        entry["batch_dim"] = batch_dim % t.dim()
    return entry


def op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        schema = target._schema
        base = schema.name  # "aten::linear"
        return base if schema.overload_name in ("", "default") else f"{base}.{schema.overload_name}"
    qual = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    module = getattr(target, "__module__", None)
    return f"python::{module}.{qual}" if module else f"python::{qual}"


def op_overload(name: str) -> "torch._ops.OpOverload | None":
    """The torch.ops overload an IR op name names ("aten::arange.start_step"): the inverse of
    op_name. None when this torch has no such op or overload."""
    namespace, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace, None), base, None) if namespace and base else None
    return getattr(packet, overload or "default", None) if packet is not None else None


def _json_float(value: float) -> Any:
    """A float as the core's graph JSON holds it (csrc/ir/json.h): a number, or {"float":
    "inf" | "-inf" | "nan"}, since JSON has no inf or nan (Python's json writes "-Infinity",
    which no JSON reader takes: masked_fill(mask, float("-inf")) failed to cross)."""
    if math.isnan(value):
        return {"float": "nan"}
    if math.isinf(value):
        return {"float": "inf" if value > 0 else "-inf"}
    return value


def _attr_value(value: Any, where: str) -> Any:
    """A Python argument -> a JSON attribute value (int, float, str, bool, None, list)."""
    if isinstance(value, float):
        return _json_float(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
        return str(value)
    if isinstance(value, (list, tuple)):
        items = [_attr_value(v, where) for v in value]
        if all(isinstance(v, (bool, int)) for v in items):
            return [int(v) for v in items]
        if all(isinstance(v, (bool, int, float, dict)) for v in items):
            return [v if isinstance(v, dict) else float(v) for v in items]
        return str(list(value))  # e.g. a list holding None: kept readable, never fatal
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise CaptureError(f"{where}: symbolic value {value}; capture needs static shapes")
    return str(value)


def _module_path(node: torch.fx.Node, strip_prefix: str) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    if path.startswith("L['self']."):  # dynamo-style spelling, seen in some versions
        path = path[len("L['self'].") :]
    if strip_prefix and (path == strip_prefix[:-1] or path.startswith(strip_prefix)):
        path = path[len(strip_prefix) :]
    return path


@dataclass
class _Builder:
    """Accumulates the IR document while walking one or more (nested) FX graphs."""

    strip_prefix: str = ""
    values: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    names: set = field(default_factory=set)
    # IR node (its first output's name) -> (FX node, the tuple index of each IR output or
    # None for a single tensor): what the rewrite (python/shardwise/runtime/lower.py) lowers again.
    sources: dict = field(default_factory=dict)
    constants: dict = field(default_factory=dict)  # lifted constant tensors by IR name (export)

    def unique(self, name: str) -> str:
        name = name or "v"
        out, k = name, 1
        while out in self.names:
            out, k = f"{name}_{k}", k + 1
        self.names.add(out)
        return out

    def leaf(self, name: str, t: torch.Tensor, role: str, batch_dim: int | None = None) -> str:
        if name in self.names:
            raise CaptureError(f"two leaf values named '{name}'")
        self.names.add(name)
        entry = tensor_entry(name, t, batch_dim)
        entry["role"] = role
        self.values.append(entry)
        return name


def _schema_args(node: torch.fx.Node) -> list[tuple[str, Any]]:
    """(argument name, value) for every schema argument, defaults filled in."""
    schema = node.target._schema
    out = []
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            out.append((arg.name, node.args[i]))
        elif arg.name in node.kwargs:
            out.append((arg.name, node.kwargs[arg.name]))
        elif arg.has_default_value():
            out.append((arg.name, arg.default_value))
    return out


def operand_nodes(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The FX nodes of a call's tensor operands, in the IR's input order (_split_operands'):
    schema order, or `arg<i>` then keywords for a call without a schema."""
    items = _schema_args(node) if isinstance(node.target, torch._ops.OpOverload) else \
        [(f"arg{i}", a) for i, a in enumerate(node.args)] + list(node.kwargs.items())
    out = []
    for _, value in items:
        values = value if isinstance(value, (list, tuple)) else [value]
        out.extend(v for v in values if isinstance(v, torch.fx.Node))
    return out


def _split_operands(items: list[tuple[str, Any]], env: dict, where: str):
    """Tensor operands -> input names; the rest -> attributes; and each argument's positions
    among the inputs."""
    inputs, attrs, positions = [], {}, {}
    for name, value in items:
        start = len(inputs)
        if isinstance(value, torch.fx.Node):
            if value not in env:
                raise CaptureError(f"{where}: operand '{value.name}' is not a tensor the IR knows")
            ref = env[value]
            if isinstance(ref, list):  # a multi-output value used whole (rare)
                inputs.extend(r for r in ref if r is not None)
            else:
                inputs.append(ref)
        elif isinstance(value, (list, tuple)) and any(isinstance(v, torch.fx.Node) for v in value):
            present = []
            for v in value:
                if isinstance(v, torch.fx.Node):
                    inputs.append(env[v])
                    present.append(1)
                else:
                    present.append(0)
            if not all(present):  # e.g. index.Tensor's [None, idx]: keep where the tensors sit
                attrs[f"{name}_present"] = present
        else:
            attrs[name] = _attr_value(value, f"{where}, argument '{name}'")
        positions[name] = list(range(start, len(inputs)))
    return inputs, attrs, positions


# ---- writes into the model's state ------------------------------------------------------------
# Ops that update a buffer operand in place while their schema says nothing of it: batch norm
# in training writes its running statistics (the flag named here says when). Ops whose schema
# marks an argument written (Tensor(a!): _native_batch_norm_legit) are found from it.
_STATE_WRITES = {
    torch.ops.aten.batch_norm.default: ("training", ("running_mean", "running_var")),
    torch.ops.aten.native_batch_norm.default: ("training", ("running_mean", "running_var")),
    torch.ops.aten.instance_norm.default: ("use_input_stats", ("running_mean", "running_var")),
}
# The IR's mark of the operands a call writes in place, by their positions among its inputs:
# the rank graph writes a leaf's back after the call (csrc/transform/rank_graph.h).
WRITES = "shardwise.writes"


def _written_positions(target: torch._ops.OpOverload, items: list[tuple[str, Any]],
                       positions: dict[str, list[int]]) -> list[int]:
    """The positions among a call's inputs of the operands it writes in place: its schema's
    written arguments (Tensor(a!)), and _STATE_WRITES' when the flag is set."""
    flag, names = _STATE_WRITES.get(target, (None, ()))
    writes_named = flag is not None and bool(dict(items).get(flag))
    out = []
    for argument in target._schema.arguments:
        info = argument.alias_info
        if (info is not None and info.is_write) or (writes_named and argument.name in names):
            out.extend(positions.get(argument.name, ()))
    return sorted(out)


def _output_tensors(val: Any) -> list[torch.Tensor | None] | None:
    """Tensors produced by a node: a list for multi-output ops, None for a plain tensor."""
    if isinstance(val, (list, tuple)):
        return [v if isinstance(v, torch.Tensor) else None for v in val]
    return None


def walk_graph(
    graph: torch.fx.Graph,
    builder: _Builder,
    env: dict,
    owner: torch.fx.GraphModule | None = None,
) -> list:
    """Adds every call_function node of `graph` to `builder`.

    `env` maps FX nodes already bound (placeholders) to IR value names; returns the
    IR value names (or nested lists) the graph's output node returns.
    """
    for node in graph.nodes:
        if node.op in ("placeholder",):
            if node not in env:
                raise CaptureError(f"placeholder '{node.name}' has no binding")
            continue
        if node.op == "get_attr":
            continue  # submodules of higher-order ops: inlined at their call site
        if node.op == "output":
            returned = node.args[0]
            return [_lookup(env, a) for a in returned] if isinstance(returned, (list, tuple)) else [_lookup(env, returned)]
        if node.op != "call_function":
            raise CaptureError(f"node '{node.name}': unexpected FX op kind '{node.op}' in an ATen graph")
        where = f"node '{node.name}' ({op_name(node.target)}) in module '{_module_path(node, builder.strip_prefix)}'"
        if node.target is operator.getitem:
            source, index = node.args
            env[node] = env[source][index]
            continue
        if (not isinstance(node.target, torch._ops.OpOverload) and not node.users
                and not isinstance(node.meta.get("val"), (torch.Tensor, list, tuple))):
            continue  # a call kept for its effect on autograd state (torch._C._set_grad_enabled): nothing to shard
        if is_value_identity(node) and node.args[0] in env:
            env[node] = env[node.args[0]]  # see VALUE_IDENTITIES
            continue
        sub = _inline_target(node, owner)
        if sub is not None:
            sub_gm, operands = sub
            placeholders = [n for n in sub_gm.graph.nodes if n.op == "placeholder"]
            sub_env = {p: env[a] for p, a in zip(placeholders, operands)}
            results = walk_graph(sub_gm.graph, builder, sub_env, sub_gm)
            env[node] = results if len(results) != 1 or isinstance(node.meta.get("val"), (list, tuple)) else results[0]
            continue
        _add_op_node(node, builder, env, where)
    raise CaptureError("FX graph has no output node")


def _lookup(env: dict, arg: Any):
    if isinstance(arg, torch.fx.Node):
        return env.get(arg)
    return None  # a non-tensor output (None, int): not part of the IR


def _inline_target(node: torch.fx.Node, owner: torch.fx.GraphModule | None):
    """A higher-order op (e.g. wrap_with_set_grad_enabled, autocast) that calls a
    subgraph: returns (subgraph module, its tensor operands) so the caller inlines it."""
    if isinstance(node.target, torch._ops.OpOverload) or owner is None:
        return None
    subs = [a for a in node.args if isinstance(a, torch.fx.Node) and a.op == "get_attr"]
    if len(subs) != 1:
        return None
    sub_gm = getattr(owner, subs[0].target, None)
    if not isinstance(sub_gm, torch.fx.GraphModule):
        return None
    operands = [a for a in node.args if isinstance(a, torch.fx.Node) and a is not subs[0]]
    return sub_gm, operands


def _add_op_node(node: torch.fx.Node, builder: _Builder, env: dict, where: str) -> None:
    val = node.meta.get("val")
    if isinstance(node.target, torch._ops.OpOverload):
        if len(node.target._schema.returns) == 0:
            return  # e.g. _assert_tensor_metadata: a check with no result, nothing to shard
        items = _schema_args(node)
        inputs, attrs, positions = _split_operands(items, env, where)
        written = _written_positions(node.target, items, positions)
        if written:
            attrs[WRITES] = written
    else:
        items = [(f"arg{i}", a) for i, a in enumerate(node.args)] + list(node.kwargs.items())
        inputs, attrs, _ = _split_operands(items, env, where)
    multi = _output_tensors(val)
    if multi is None:
        if not isinstance(val, torch.Tensor):
            raise CaptureError(f"{where}: no tensor metadata on the result (got {type(val).__name__})")
        outputs = [tensor_entry(builder.unique(node.name), val, None, where)]
        env[node] = outputs[0]["name"]
    else:
        getitem_names = {u.args[1]: u.name for u in node.users if u.target is operator.getitem}
        outputs, refs = [], []
        for i, t in enumerate(multi):
            if t is None:
                refs.append(None)
                continue
            name = builder.unique(getitem_names.get(i, f"{node.name}.{i}"))
            outputs.append(tensor_entry(name, t, None, where))
            refs.append(name)
        env[node] = refs
    builder.sources[outputs[0]["name"]] = (node, None if multi is None else [i for i, t in enumerate(multi)
                                                                               if t is not None])
    builder.nodes.append({
        "op": op_name(node.target),
        "inputs": inputs,
        "outputs": outputs,
        "attrs": attrs,
        "module": _module_path(node, builder.strip_prefix),
    })


def flatten_names(results: list) -> list[str]:
    out = []
    for r in results:
        if isinstance(r, list):
            out.extend(flatten_names(r))
        elif r is not None:
            out.append(r)
    return out


def document(builder: _Builder, outputs: list[str]) -> dict:
    return {
        "format": "shardwise.graph",
        "version": 1,
        "values": builder.values,
        "nodes": builder.nodes,
        "outputs": outputs,
    }

