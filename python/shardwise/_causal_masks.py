"""Causal masks that are constants of the graph, given back to attention as ``is_causal``.

A traced model cannot take the data-dependent shortcut its eager run takes: transformers'
SDPA attention, called without a padding mask, passes ``is_causal=True`` and no mask
eagerly, but under torch.export (which cannot see that the mask would be all causal) it
builds a boolean ``[batch, 1, seq, seq]`` mask from ``arange`` and shape arithmetic and
passes it explicitly. The numbers are the same; the kernels are not: on CUDA a mask rules
out FlashAttention, and the captured step ran 5.4% slower than the eager one (GPT-2 124M,
bf16, H200, benchmarks/gpu.py).

``fold_causal_masks`` finds each ``aten.scaled_dot_product_attention`` whose mask is
computed from no input, parameter or buffer (only from shapes), evaluates that mask once
on the CPU, and where it equals the causal mask (query row i sees key columns 0..i, for
every batch and head), rewrites the call to ``is_causal=True`` without a mask, as the eager
call was. A mask that depends on the data (a padding mask), that is not causal, or that
cannot be evaluated is left as it is. The shapes are the capture's (a batch of another
shape is captured again), so the folded mask is the mask of every batch this graph runs.

The mask is never built whole: at 131,072 tokens a boolean [1, 1, seq, seq] is 17 GB, and
its int64 operands 8 times that. A value of the mask's ancestry larger than
``_WHOLE_LIMIT`` elements (by its traced shape) is kept as its recipe, which only ops that
can make a block of query rows (dimension -2) from the same rows of their operands may be:
pointwise ops, casts and ``expand`` (any other op that large leaves the mask unfolded).
Such a mask is proved causal in linear time where it is an AND of comparisons of key
positions against query positions, as transformers builds it (``_causal_terms``); else it
is compared a block of rows at a time up to ``_COMPARED_LIMIT`` elements, and beyond that
left a mask. Memory is linear in the sequence (docs/design/capture.md).
"""
from __future__ import annotations

import logging
import math

import torch
import torch.fx

_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_SIGNATURE = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")


# Values of a mask's ancestry with more elements than this are built in blocks of rows.
_WHOLE_LIMIT = 1 << 22
_ATEN = torch.ops.aten
_EXPAND = _ATEN.expand.default
# Casts and copies: a boolean value unchanged by them, but for its dtype's spelling.
_CASTS = {_ATEN.to.dtype, _ATEN.to.dtype_layout, _ATEN._to_copy.default, _ATEN.clone.default, _ATEN.alias.default}
# Ops besides the pointwise-tagged ones whose block of rows reads only its operands' same
# rows: casts, the bitwise operators' dunder overloads; and expand (by its sizes).
_ROW_WISE = _CASTS | {_ATEN.__and__.Tensor, _ATEN.__or__.Tensor, _ATEN.__xor__.Tensor}
# Beyond this many elements a mask that _causal_terms cannot prove causal is not compared.
_COMPARED_LIMIT = 1 << 28
_AND = {_ATEN.__and__.Tensor, _ATEN.bitwise_and.Tensor, _ATEN.logical_and.default}
_SAME = _CASTS | {_EXPAND}  # a boolean value unchanged, but for its shape
# Comparisons `x op y`, as (col op' row) of a key column's value against a query row's:
# _COMPARE[op] when x is the column, _SWAPPED[op] when x is the row.
_COMPARE = {_ATEN.le.Tensor: "le", _ATEN.lt.Tensor: "lt", _ATEN.ge.Tensor: "ge", _ATEN.gt.Tensor: "gt",
            _ATEN.eq.Tensor: "eq"}
_SWAPPED = {"le": "ge", "lt": "gt", "ge": "le", "gt": "lt", "eq": "eq"}
_log = logging.getLogger("shardwise.capture")


def fold_causal_masks(graph: torch.fx.Graph) -> int:
    """Rewrites every attention call of `graph` whose mask is a constant causal mask; returns
    how many. The mask's own nodes go when nothing else reads them."""
    values: dict = {}
    verdicts: dict = {}  # mask node -> whether it is causal (layers share one mask)
    folded = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _SDPA:
            continue
        bound = dict(zip(_SIGNATURE, node.args))
        bound.update({k: v for k, v in node.kwargs.items() if k in _SIGNATURE})
        mask = bound.get("attn_mask")
        if not isinstance(mask, torch.fx.Node) or bound.get("is_causal", False):
            continue
        query, key = bound["query"].meta.get("val"), bound["key"].meta.get("val")
        if query is None or key is None or query.shape[-2] != key.shape[-2]:
            continue
        if mask not in verdicts:
            value = _constant(mask, values)
            verdicts[mask] = value is not None and _is_causal(value, query.shape[-2])
        if not verdicts[mask]:
            continue
        # As the eager call is made: no mask argument at all, is_causal set.
        kwargs = {k: v for k, v in node.kwargs.items() if k not in _SIGNATURE}
        node.args = (bound["query"], bound["key"], bound["value"])
        node.kwargs = {"dropout_p": bound.get("dropout_p", 0.0), "is_causal": True, **kwargs}
        folded += 1
        _drop_unused(mask, graph)
    return folded


class _Rows:
    """A value too large to build whole (more than _WHOLE_LIMIT elements): `target` over `args`
    (values: tensors, _Rows, Python constants), an op that makes any block of its rows
    (dimension -2) from the same rows of its operands."""

    def __init__(self, target, args: tuple, kwargs: dict, val: torch.Tensor):
        self.target, self.args, self.kwargs = target, args, kwargs
        self.shape, self.dtype = tuple(val.shape), val.dtype


def _causal_terms(mask: _Rows, seq: int) -> bool:
    """A linear-time proof that `mask` is causal, or False when it finds none (which proves
    nothing). The mask must be an AND of terms (through casts and expands of booleans), each a
    boolean constant that is all true, or a comparison of a key column's values b(j) against a
    query row's a(i) (operands [..., 1, seq] and [..., seq, 1], as broadcasting builds
    transformers' masks). Sound: one term's true set in every row i is exactly {j <= i} and
    every other term is true on all j <= i, so their AND is the causal mask; prefix and suffix
    extremes of b decide both for every row at once."""
    terms, stack = [], [mask]
    while stack:
        value = stack.pop()
        if isinstance(value, _Rows) and value.target in _AND:
            stack.extend(value.args[:2])
        elif isinstance(value, _Rows) and value.target in _SAME and value.dtype == torch.bool:
            inner = value.args[0]
            if getattr(inner, "dtype", None) != torch.bool:
                return False
            stack.append(inner)
        else:
            terms.append(value)
    causal = False
    for term in terms:
        if isinstance(term, torch.Tensor) and term.dtype == torch.bool and term.numel() <= _WHOLE_LIMIT:
            if not bool(term.all()):
                return False
            continue
        compared = _column_against_row(term, seq)
        if compared is None:
            return False
        op, b, a = compared
        exact, lower = _term_extremes(op, b, a)
        if exact and not causal:
            causal = True  # this term is the causal mask; the rest need only hold on it
        elif not lower:
            return False
    return causal


def _column_against_row(term, seq: int):
    """(op, b, a) of a comparison term `b(j) op a(i)`: b the key columns' values [..., seq],
    a the query rows' [..., seq], broadcast to one batch shape; None for any other term."""
    if not isinstance(term, _Rows) or term.target not in _COMPARE or term.kwargs:
        return None
    x, y = term.args[:2]
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dim() >= 2 and y.dim() >= 2):
        return None

    def side(t):  # "col" for [..., 1, seq], "row" for [..., seq, 1]
        if t.shape[-2] == 1 and t.shape[-1] == seq:
            return "col"
        return "row" if t.shape[-2] == seq and t.shape[-1] == 1 else None

    op = _COMPARE[term.target]
    if (side(x), side(y)) == ("row", "col"):
        x, y, op = y, x, _SWAPPED[op]
    elif (side(x), side(y)) != ("col", "row"):
        return None
    b, a = x[..., 0, :], y[..., :, 0]
    lead = torch.broadcast_shapes(b.shape[:-1], a.shape[:-1])
    return op, b.expand(*lead, seq), a.expand(*lead, seq)


def _term_extremes(op: str, b: torch.Tensor, a: torch.Tensor) -> tuple[bool, bool]:
    """For the term b(j) op a(i): (its true set in every row i is exactly {j <= i}, it holds for
    every j <= i), from the prefix and suffix extremes of b."""
    dtype = torch.promote_types(b.dtype, a.dtype)
    if dtype == torch.bool:
        dtype = torch.int64
    b, a = b.to(dtype), a.to(dtype)
    prefix_max, prefix_min = b.cummax(-1).values, b.cummin(-1).values
    # The extremes of b over j > i (the last row has none: its conditions hold vacuously).
    after_min = b.flip(-1).cummin(-1).values.flip(-1).roll(-1, -1)
    after_max = b.flip(-1).cummax(-1).values.flip(-1).roll(-1, -1)
    holds = {"le": prefix_max <= a, "lt": prefix_max < a, "ge": prefix_min >= a, "gt": prefix_min > a,
             "eq": (prefix_max == a) & (prefix_min == a)}[op]
    fails_after = {"le": after_min > a, "lt": after_min >= a, "ge": after_max < a, "gt": after_max <= a,
                   "eq": None}[op]
    if fails_after is not None:
        fails_after[..., -1] = True
    lower = bool(holds.all())
    return lower and fails_after is not None and bool(fails_after.all()), lower


def _large(node: torch.fx.Node) -> "torch.Tensor | None":
    """The traced value of `node` when it has more than _WHOLE_LIMIT elements."""
    val = node.meta.get("val")
    return val if isinstance(val, torch.Tensor) and val.numel() > _WHOLE_LIMIT else None


def _row_wise(node: torch.fx.Node, val: torch.Tensor) -> bool:
    target = node.target
    return val.dim() >= 2 and (target is _EXPAND or target in _ROW_WISE
                               or torch.Tag.pointwise in getattr(target, "tags", ()))


def _rows(value, start: int, stop: int):
    """Rows start..stop (dimension -2) of `value`, or `value` itself where it has no rows of its
    own (a scalar, a tensor of fewer than 2 dimensions or of one broadcast row)."""
    if isinstance(value, _Rows):
        args = torch.fx.node.map_aggregate(value.args, lambda a: _rows(a, start, stop))
        kwargs = torch.fx.node.map_aggregate(value.kwargs, lambda a: _rows(a, start, stop))
        if value.target is _EXPAND:
            sizes = list(args[1])
            if sizes[-2] != -1:
                sizes[-2] = stop - start
            args = (args[0], sizes, *args[2:])
        return value.target(*args, **kwargs)
    if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[-2] > 1:
        return value[..., start:stop, :]
    return value


def _is_causal(mask, seq: int) -> bool:
    """Whether `mask` (a tensor or _Rows) is the causal mask of `seq` queries, for every batch
    and head: proved in linear time where _causal_terms can (transformers' masks), else
    compared a block of rows at a time up to _COMPARED_LIMIT elements (beyond, left as a
    mask: never folded on a guess)."""
    shape = tuple(mask.shape)
    if mask.dtype != torch.bool or len(shape) < 2 or shape[-2:] != (seq, seq):
        return False
    if isinstance(mask, _Rows):
        try:
            if _causal_terms(mask, seq):
                return True
        except Exception:  # an op the proof does not know how to run: compare instead
            pass
        if math.prod(shape) > _COMPARED_LIMIT:
            _log.info("capture: an attention mask of shape %s computed from shapes alone stays a mask (not "
                      "provably causal in linear time, too large to compare)", list(shape))
            return False
    per_row = max(1, math.prod(shape) // seq)
    step = max(1, _WHOLE_LIMIT // per_row)
    keys = torch.arange(seq, device="cpu")
    for start in range(0, seq, step):
        stop = min(seq, start + step)
        causal = keys[None, :] <= torch.arange(start, stop, device="cpu")[:, None]
        try:
            block = _rows(mask, start, stop)
        except Exception:  # an op that does not run on a block: leave the mask alone
            return False
        if tuple(block.shape[-2:]) != (stop - start, seq) or not bool((block == causal).all()):
            return False
    return True


def _constant(node: torch.fx.Node, values: dict):
    """The value of `node` computed on the CPU when nothing but shapes and constants feed it,
    else None. `values` caches what was computed (several layers share one mask)."""
    if node in values:
        return values[node]
    order, seen, stack = [], set(), [node]
    while stack:  # the ancestors, each after what it reads
        n = stack[-1]
        pending = [a for a in n.all_input_nodes if a not in seen and a not in values]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op != "call_function" or _random(n):
            values[n] = None
        order.append(n)
    cpu = torch.device("cpu")

    def on_cpu(a):
        if isinstance(a, torch.fx.Node):
            return values[a]
        return cpu if isinstance(a, torch.device) else a

    for n in order:
        if n in values:
            continue
        if any(values.get(a) is None for a in n.all_input_nodes):
            values[n] = None
            continue
        args = torch.fx.node.map_aggregate(n.args, on_cpu)
        kwargs = torch.fx.node.map_aggregate(n.kwargs, on_cpu)
        large = _large(n)
        if large is not None:  # built in blocks of rows when it is read, or not at all
            values[n] = _Rows(n.target, args, kwargs, large) if _row_wise(n, large) else None
            continue
        if any(isinstance(values[a], _Rows) for a in n.all_input_nodes):
            values[n] = None  # a small value of a large one (a reduction): not built in rows
            continue
        try:
            values[n] = n.target(*args, **kwargs)
        except Exception:  # an op that does not run on these values: leave the mask alone
            values[n] = None
    return values.get(node)


def _random(node: torch.fx.Node) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def _drop_unused(node: torch.fx.Node, graph: torch.fx.Graph) -> None:
    stack, erased = [node], set()
    while stack:
        n = stack.pop()
        if n in erased or n.users or n.op != "call_function":
            continue
        inputs = list(n.all_input_nodes)
        graph.erase_node(n)
        erased.add(n)
        stack.extend(inputs)
