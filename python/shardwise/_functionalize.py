"""Writes into intermediate tensors, made functional before capture turns a graph into the IR.

torch.export's training IR keeps a model's in-place ops: ``out += identity`` (a ResNet
residual) is ``aten.add_``, ``out[:, t] = y`` (an RNN or RWKV filling a buffer step by step)
is ``aten.copy_`` into ``aten.select(out, 1, t)``. The IR is a dataflow graph: a write that
returns nothing its readers use would be dead code, dropped with the work feeding it, and the
program would read the tensor as it was before the write. So each such write becomes the
functional op that computes the new value (``add``, ``copy``, ...), a write into a view
becomes a scatter of the new slice into its base (``select_scatter``, ``slice_scatter``), and
every later reader of the written tensor (or of the view) reads the new value.

Writes into a model's buffers (batch norm's running statistics, ``num_batches_tracked += 1``)
stay as they are: the rank program runs them on the rank's own buffers, in place. A lifted
constant (``constants``: what ``torch.tensor(data)`` makes inside forward) is not state: a
write into it is a write into the fresh tensor the call made, made functional like any other.
On CPU torch.export copies such a constant first (``lift_fresh_copy``, which the IR leaves out:
_fx_import.VALUE_IDENTITIES) and the write lands on the copy; on the meta device it reads the
constant directly. Both must give the same graph (transformers' empty KV cache: ``detach_``).

A write this pass cannot express exactly (into a view it has no scatter for, into an input
or parameter, into a tensor another view still aliases) raises CaptureError naming the op,
the module and the source line: never a silently dropped write.
"""
from __future__ import annotations

import torch
import torch.fx

from ._fx_import import CaptureError

aten = torch.ops.aten

# view op -> how a new value of the view is written back into its base (the functional
# inverse): a scatter taking (base, value, *the view's own arguments after its input).
_SCATTERS = {
    aten.select.int: aten.select_scatter.default,
    aten.slice.Tensor: aten.slice_scatter.default,
}


def _writes_first_operand(node: torch.fx.Node) -> bool:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    arguments = target._schema.arguments
    return bool(arguments) and arguments[0].alias_info is not None and arguments[0].alias_info.is_write


def _functional(target: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """add_.Tensor -> add.Tensor, copy_ -> copy, index_put_ -> index_put, ..."""
    name = target._schema.name.split("::")[-1]
    if not name.endswith("_") or target is aten.copy_.default:  # aten.copy has no autograd formula
        return None
    packet = getattr(aten, name[:-1], None)
    overload = target._overloadname
    return getattr(packet, overload, None) if packet is not None else None


def _where(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    module = list(stack.values())[-1][0] if stack else ""
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    line = next((t.strip() for t in reversed(trace) if t.strip().startswith("File")), "")
    return f"{node.target} (node '{node.name}', module '{module}'{', ' + line if line else ''})"


def _fake_value(target, args, kwargs, like: list):
    """The new node's meta["val"], computed on the graph's fake tensors."""
    from torch._guards import detect_fake_mode

    def val(a):
        return a.meta["val"] if isinstance(a, torch.fx.Node) else a

    mode = detect_fake_mode(like)
    fake_args = torch.fx.node.map_aggregate(args, val)
    fake_kwargs = torch.fx.node.map_aggregate(kwargs, val)
    if mode is None:
        return target(*fake_args, **fake_kwargs)
    with mode:
        return target(*fake_args, **fake_kwargs)


def functionalize(graph: torch.fx.Graph, constants=()) -> int:
    """Rewrites `graph` in place (its placeholders are the parameters, buffers and inputs;
    `constants`: the placeholders that are lifted constants). Returns the number of writes made
    functional."""
    constants = set(constants)
    changed = 0
    for node in list(graph.nodes):
        if not _writes_first_operand(node):
            continue
        # The written tensor and the chain of views from its base.
        chain: list[torch.fx.Node] = []
        base = node.args[0]
        while isinstance(base, torch.fx.Node) and base.op == "call_function" and base.target in _SCATTERS:
            chain.insert(0, base)
            base = base.args[0]
        if not isinstance(base, torch.fx.Node):
            raise CaptureError(f"capture: a write into a tensor that is not a graph value: {_where(node)}")
        if base.op == "placeholder" and base not in constants:
            if chain:
                raise CaptureError(f"capture: a write into a view of an input, parameter or buffer cannot be run "
                                   f"per rank: {_where(node)}")
            continue  # a buffer update: run in place on the rank's own buffer
        if _is_view(base):
            raise CaptureError(f"capture: a write into a view ({base.target}) shardwise has no functional form "
                               f"for: {_where(node)}")
        functional = _functional(node.target)
        if functional is None and node.target is not aten.copy_.default:
            raise CaptureError(f"capture: an in-place op with no functional form: {_where(node)}")
        order = {n: i for i, n in enumerate(graph.nodes)}
        position = order[node]
        # Another view of the base read after the write would see the write (it aliases the
        # base): refuse rather than let it read the old value.
        for view in [*chain, *(u for u in base.users if _is_view(u) and u not in chain and order[u] < position)]:
            for user in view.users:
                if user is not node and order[user] > position and user not in chain:
                    raise CaptureError(f"capture: a write into a tensor that a view still reads afterwards: "
                                       f"{_where(node)}")
        new, last = _written_value(graph, node, functional)
        value = new
        for view in reversed(chain):
            scatter = _SCATTERS[view.target]
            args = (view.args[0], value, *view.args[1:])
            with graph.inserting_after(last):
                value = graph.call_function(scatter, args, dict(view.kwargs))
            value.meta = {**node.meta, "val": _fake_value(scatter, args, view.kwargs, [view.args[0].meta["val"]])}
            last = value
        # Readers after the write read the new value: of the base, and of the write's result.
        made = _nodes_between(node.next, last) if last is not node else set()
        after = {n for n in graph.nodes if order.get(n, len(order)) > position and n not in made}
        base.replace_all_uses_with(value, delete_user_cb=lambda user: user in after)
        node.replace_all_uses_with(new)  # what the write returns: the written tensor's new value
        graph.erase_node(node)
        changed += 1
    if changed:
        graph.lint()
    return changed


def _is_view(node: torch.fx.Node) -> bool:
    """A call whose result aliases its input (a view)."""
    target = node.target
    return (node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and
            bool(target._schema.returns) and target._schema.returns[0].alias_info is not None and
            not _writes_first_operand(node))


def _written_value(graph: torch.fx.Graph, node: torch.fx.Node, functional) -> tuple[torch.fx.Node, torch.fx.Node]:
    """The value the write leaves in its operand, as new nodes after it: (the value, the last
    node inserted, or `node` when none was). copy_ has no differentiable functional op
    (aten.copy has no autograd formula): its value is the source expanded to the operand's
    shape and cast to its dtype."""
    like = [node.args[0].meta["val"]]
    if functional is not None:
        with graph.inserting_after(node):
            new = graph.call_function(functional, node.args, node.kwargs)
        new.meta = {**node.meta, "val": _fake_value(functional, node.args, node.kwargs, like)}
        return new, new
    dst, src = node.args[0], node.args[1]
    value, last = src, node
    if list(src.meta["val"].shape) != list(dst.meta["val"].shape):
        args = (value, list(dst.meta["val"].shape))
        with graph.inserting_after(last):
            value = last = graph.call_function(aten.expand.default, args)
        value.meta = {**node.meta, "val": _fake_value(aten.expand.default, args, {}, like)}
    if src.meta["val"].dtype != dst.meta["val"].dtype:
        kwargs = {"dtype": dst.meta["val"].dtype}
        with graph.inserting_after(last):
            value = last = graph.call_function(aten._to_copy.default, (value,), kwargs)
        value.meta = {**node.meta, "val": _fake_value(aten._to_copy.default, (value.args[0],), kwargs, like)}
    return value, last


def _nodes_between(first: torch.fx.Node, last: torch.fx.Node) -> set[torch.fx.Node]:
    out, node = set(), first
    while node is not last:
        out.add(node)
        node = node.next
    out.add(last)
    return out

