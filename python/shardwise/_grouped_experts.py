"""Token-sorted grouped experts (torchtitan's mixture of experts) captured as ``shardwise_moe::experts``.

torchtitan, and code written like it, computes a mixture of experts' routed part as a program
over rows sorted by expert: a stable argsort of the flattened top-k expert ids, the rows
gathered by ``order // K``, ``torch._grouped_mm`` over the offsets of the experts' counts
(SwiGLU: ``silu(x @ w1ᵀ) * (x @ w3ᵀ) @ w2ᵀ``), the outputs scaled by their sorted scores and
scatter-added back into their tokens' rows. Op by op that program has no batch split (the argsort
mixes every token of the batch) and no split of the experts, so the planner could only replicate
it. Its value, though, is the experts op's sum (_moe_experts.py):

    out[t] = sum over k of scores[t, k] * w2[e] @ (silu(w1[e] x_t) * (w3[e] x_t)),  e = ids[t, k]

provided the counts are the number of rows of each expert (then the offsets delimit exactly the
rows the argsort put together). ``fold_routed_experts`` finds that program in a captured FX
graph, proves the counts are the ids' (a one-hot routing map summed over the tokens, a bincount,
a histc), and replaces it by ``shardwise_moe::experts(x, ids, scores, cat([w1, w3], 1), w2,
arange(E), "silu")``, whose rule, expert-parallel strategies, price and all-to-all kernel every
transformers mixture of experts already uses. A program that differs anywhere is left as it is.

``torch._grouped_mm`` has a fake kernel only for bfloat16 and a CPU kernel for no float64, so while
a model is captured ``grouped_mm_capturable`` routes it through ``shardwise_moe::grouped_mm``
(the same product, any dtype): a float64 model captures, and a grouped matmul that is not part of
such a program still runs, exactly.
"""
from __future__ import annotations

import contextlib
import operator

import torch
from torch.overrides import TorchFunctionMode

from . import _moe_experts  # noqa: F401  (registers shardwise_moe::experts)


# ---- torch._grouped_mm in any dtype ---------------------------------------------------------


def _grouped(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """a [R, K] rows grouped by offs (group g: rows offs[g-1]:offs[g]) times b[g] [K, N]; rows
    after the last offset are zero."""
    out = a.new_zeros((a.shape[0], b.shape[-1]))
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = a[start:end] @ b[g]
        start = end
    return out


@torch.library.custom_op("shardwise_moe::grouped_mm", mutates_args=())
def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """torch._grouped_mm(a, b, offs=offs) for a 2-D `a` and a 3-D `b`, in any dtype."""
    return _grouped(a, b, offs)


@grouped_mm.register_fake
def _grouped_mm_fake(a, b, offs):
    return a.new_empty((a.shape[0], b.shape[-1]))


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    a, b, offs = ctx.saved_tensors
    grad_a = _grouped(grad, b.transpose(-2, -1), offs) if ctx.needs_input_grad[0] else None
    grad_b = None
    if ctx.needs_input_grad[1]:
        grad_b = torch.zeros_like(b)
        start = 0
        for g, end in enumerate(offs.tolist()):
            grad_b[g] = a[start:end].transpose(0, 1) @ grad[start:end]
            start = end
    return grad_a, grad_b, None


grouped_mm.register_autograd(_backward, setup_context=_setup_context)


class _GroupedMmAnyDtype(TorchFunctionMode):
    """torch._grouped_mm(a 2-D, b 3-D, offs=...) as shardwise_moe::grouped_mm; every other call
    as it was."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch._grouped_mm:
            a, b = args[0], args[1]
            offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
            rest = {k: v for k, v in kwargs.items() if k != "offs" and v is not None}
            if offs is not None and a.dim() == 2 and b.dim() == 3 and len(args) <= 3 and not rest:
                return torch.ops.shardwise_moe.grouped_mm(a, b, offs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def grouped_mm_capturable():
    """Within it, torch._grouped_mm of a 2-D and a 3-D operand runs as shardwise_moe::grouped_mm:
    traced in any dtype, run in any dtype."""
    with _GroupedMmAnyDtype():
        yield


# ---- the token-sorted program as the experts op ---------------------------------------------

aten = torch.ops.aten
_GROUPED_MM = (torch.ops.shardwise_moe.grouped_mm.default, aten._grouped_mm.default)
_CASTS = (aten.to.dtype, aten._to_copy.default, aten.to.dtype_layout, aten.type_as.default)
_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default)
_ZEROS = (aten.zeros_like.default, aten.zeros.default, aten.new_zeros.default)


def _is(node, *targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _through_views(node):
    while _is(node, *_VIEWS):
        node = node.args[0]
    return node


def _uncast(node):
    """`node` without casts to the dtype it already has (torchtitan's ``x.bfloat16()`` in a
    bfloat16 model, ``.type_as(x)``)."""
    while _is(node, *_CASTS) and _val(node).dtype == _val(node.args[0]).dtype:
        node = node.args[0]
    return node


def _exact_cast_source(node, other_dtype: torch.dtype):
    """`node` without a cast that changes no product: a cast up (exact) after which a product
    with a tensor of `other_dtype` has the dtype it had without the cast."""
    while _is(node, *_CASTS):
        source, cast = node.args[0], _val(node).dtype
        before = _val(source).dtype
        if (torch.promote_types(before, cast) != cast
                or torch.promote_types(cast, other_dtype) != torch.promote_types(before, other_dtype)):
            return None
        node = source
    return node


def _weight(b):
    """From a grouped matmul's `b` [E, K, N]: the stacked weight as the experts op takes it,
    [E, N, K] (F.linear's layout), and whether a transpose must be added to make it (b is not
    itself the transpose of such a weight)."""
    b = _uncast(b)
    if _is(b, aten.transpose.int) and sorted(d % 3 for d in b.args[1:3]) == [1, 2]:
        return _uncast(b.args[0]), False
    return b, True


def _top_k_ids(ids, experts: int) -> bool:
    """ids are torch.topk's indices over a last dim of `experts` (distinct per token, in range)."""
    if not (ids.target is operator.getitem and ids.args[1] == 1 and _is(ids.args[0], aten.topk.default)):
        return False
    topk = ids.args[0]
    scores = _val(topk.args[0])
    dim = topk.args[2] if len(topk.args) > 2 else topk.kwargs.get("dim", -1)
    return scores is not None and dim % scores.dim() == scores.dim() - 1 and scores.shape[-1] == experts


def _counts_are_the_ids(counts, ids, experts: int) -> bool:
    """counts[e] is the number of entries of ids equal to e: a one-hot routing map summed over
    the tokens (torchtitan 0.3) or a histc of the ids over [0, E] in E bins (torchtitan 0.2)."""
    if not _top_k_ids(ids, experts):
        return False
    ids_val = _val(ids)
    if _is(counts, aten.sum.dim_IntList):
        routing, dims = counts.args[0], counts.args[1]
        if not (_is(routing, aten.scatter.value, aten.scatter_.value) and routing.args[2] is ids
                and routing.args[1] % ids_val.dim() == ids_val.dim() - 1 and routing.args[3] in (True, 1)):
            return False
        base = _val(routing.args[0])
        return (_is(routing.args[0], *_ZEROS) and tuple(base.shape) == tuple(ids_val.shape[:-1]) + (experts,)
                and sorted(d % base.dim() for d in dims) == list(range(base.dim() - 1))
                and not (len(counts.args) > 2 and counts.args[2]))
    if _is(counts, aten.histc.default):
        source = _through_views(counts.args[0])
        while _is(source, *_CASTS):
            source = _through_views(source.args[0])
        bins, low, high = (list(counts.args[1:]) + [100, 0, 0])[:3]
        return source is ids and bins == experts and low == 0 and high == experts
    return False


class _RoutedExperts:
    """The matched program's operands: token rows x [T, D], ids and scores [..., K], and the
    stacked weights w1, w3 [E, F, D] and w2 [E, D, F], each as (node, whether it is their
    transpose)."""


def _match(scatter) -> _RoutedExperts | None:
    """The program ending in `scatter` (a scatter_add into zero rows), or None."""
    m = _RoutedExperts()
    base, dim, index, src = scatter.args[:4]
    out = _val(scatter)
    if dim != 0 or out is None or out.dim() != 2 or not _is(base, *_ZEROS):
        return None
    if not _is(index, aten.expand.default):
        return None
    token = _through_views(index.args[0])
    if not (_is(token, aten.floor_divide.default) or (_is(token, aten.div.Tensor_mode)
                                                       and token.kwargs.get("rounding_mode") == "floor")):
        return None
    order, top_k = token.args[0], token.args[1]
    # Ascending (stable or not: the order within an expert's rows changes no token's sum).
    if not (_is(order, aten.argsort.stable, aten.argsort.default) and not order.kwargs.get("descending", False)
            and not (_is(order, aten.argsort.default) and order.args[2:3] == (True,))):
        return None
    ids = _through_views(order.args[0])
    ids_val = _val(ids)
    if _val(order).dim() != 1 or ids_val is None or ids_val.dim() < 2 or ids_val.shape[-1] != top_k or ids_val.numel() != _val(order).numel():
        return None
    # The scores, sorted as the rows, scale the experts' outputs: src = cast(Y * scores_sorted).
    product = src
    while _is(product, *_CASTS):
        product = product.args[0]
    if not _is(product, aten.mul.Tensor):
        return None
    for y, s in (product.args, product.args[::-1]):
        sorted_scores = _through_views(s)
        if not (_is(sorted_scores, aten.index.Tensor) and sorted_scores.args[1] == [order]):
            continue
        scores = _through_views(sorted_scores.args[0])
        if _val(scores) is None or tuple(_val(scores).shape) != tuple(ids_val.shape):
            continue
        y = _exact_cast_source(y, _val(scores).dtype)
        if _is(y, *_GROUPED_MM):
            break
    else:
        return None
    down = y
    hidden, w2, offs = down.args[:3]
    hidden = _uncast(hidden)
    if not _is(hidden, aten.mul.Tensor):
        return None
    for g, u in (hidden.args, hidden.args[::-1]):
        g, u = _uncast(g), _uncast(u)
        if _is(g, aten.silu.default) and _is(_uncast(g.args[0]), *_GROUPED_MM) and _is(u, *_GROUPED_MM):
            gate, up = _uncast(g.args[0]), u
            break
    else:
        return None
    rows = _uncast(gate.args[0])
    if not (_uncast(up.args[0]) is rows and gate.args[2] is offs and up.args[2] is offs
            and _is(rows, aten.index.Tensor) and rows.args[1] == [token]):
        return None
    x = rows.args[0]
    x_val = _val(x)
    if (x_val is None or x_val.dim() != 2 or tuple(x_val.shape) != tuple(out.shape) or x_val.dtype != out.dtype
            or x_val.shape[0] * top_k != ids_val.numel() or tuple(_val(index).shape) != (ids_val.numel(), out.shape[1])):
        return None
    if not (_is(offs, aten.cumsum.default) and offs.args[1] == 0):
        return None
    w1, w3, w2 = _weight(gate.args[1]), _weight(up.args[1]), _weight(w2)
    experts = _val(w1[0]).shape[0]
    if not _counts_are_the_ids(offs.args[0], ids, experts):
        return None
    m.x, m.ids, m.scores, m.top_k, m.experts = x, ids, scores, top_k, experts
    m.w1, m.w3, m.w2 = w1, w3, w2
    return m


def _add(graph, target, args, kwargs=None, like=None, name=None):
    """A new call of `target` with its fake value (and `like`'s module stack: its module path)."""
    node = graph.create_node("call_function", target, tuple(args), kwargs or {}, name=name)
    values = [_val(a) if isinstance(a, torch.fx.Node) else a for a in args]
    values = [[_val(v) if isinstance(v, torch.fx.Node) else v for v in a] if isinstance(a, list) else a for a in values]
    mode = torch._guards.detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])
    with mode if mode is not None else contextlib.nullcontext():
        node.meta["val"] = target(*values, **(kwargs or {}))
    if like is not None and "nn_module_stack" in like.meta:
        node.meta["nn_module_stack"] = like.meta["nn_module_stack"]
    return node


def _erase_dead(graph, node) -> None:
    """Erase `node` if nothing reads it and it writes nothing, then its operands likewise."""
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function" and not node.users
            and not node._erased):  # an operand of two erased nodes is reached twice
        return
    if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
        return
    if not isinstance(node.target, torch._ops.OpOverload) and node.target is not operator.getitem:
        return
    operands = [a for a in node.all_input_nodes]
    graph.erase_node(node)
    for a in operands:
        _erase_dead(graph, a)


def fold_routed_experts(graph: torch.fx.Graph) -> int:
    """Replaces each token-sorted grouped-experts program in `graph` by shardwise_moe::experts
    (the module's docstring); returns how many."""
    folded = 0
    for scatter in [n for n in graph.nodes if _is(n, aten.scatter_add.default)]:
        m = _match(scatter)
        if m is None:
            continue
        with graph.inserting_before(scatter):
            def stacked(weight):
                node, transposed = weight
                return _add(graph, aten.transpose.int, [node, 1, 2], like=scatter) if transposed else node
            gate_up = _add(graph, aten.cat.default, [[stacked(m.w1), stacked(m.w3)], 1], like=scatter)
            down = stacked(m.w2)
            ids = _add(graph, aten.reshape.default, [m.ids, [-1, m.top_k]], like=scatter)
            scores = _add(graph, aten.reshape.default, [m.scores, [-1, m.top_k]], like=scatter)
            expert_ids = _add(graph, aten.arange.default, [m.experts],
                              {"device": _val(m.x).device, "pin_memory": False}, like=scatter)
            experts = _add(graph, torch.ops.shardwise_moe.experts.default,
                           [m.x, ids, scores, gate_up, down, expert_ids, "silu"], like=scatter,
                           name="experts")  # as transformers' experts are named (the plan report reads it)
        scatter.replace_all_uses_with(experts)
        _erase_dead(graph, scatter)
        folded += 1
    return folded
