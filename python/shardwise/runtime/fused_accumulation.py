"""A pipeline stage's weight gradient accumulated into the parameter's ``.grad`` by the product
that makes it (Megatron-LM's ``gradient_accumulation_fusion``).

A pipeline step runs m micro-batches' backwards into the same ``.grad``: autograd makes each
micro-batch's weight gradient in a fresh tensor (an ``mm``) and AccumulateGrad adds it in
(an ``add_`` over the whole weight). The core marks the contractions whose weight operand is
a parameter or its transpose (csrc/transform/fused_weight_accumulation.h); the lowering runs
each as ``self.fused_accumulation(op, args, kwargs)``, whose backward computes the same
products with the weight's term written as ``param.grad.addmm_(...)`` (``beta = 1``): one
pass over the weight gradient where there were three (write, read, add), and no temporary.
A lookup of a parameter table (aten::embedding, the core marks it too) adds the rows it read
into ``.grad`` (each row's micro-batch sum, ``index_add_``), where autograd makes a whole table
of zeros per micro-batch, scatters the rows in and adds the table: at GPT-2's 50,257 x 768,
77 ms of one CPU core per micro-batch against 0.22, with the same sums bit for bit.

The engine says which backward is running (``phase``):
- ``"full"``: its own ``torch.autograd.backward`` of a stage (pipeline_engine.full_backward):
  every gradient, the weight's accumulated in place;
- ``"B"``: a split backward's input part (runtime/weight_split.py): only the operands the
  split did not cut (the activation's), as autograd's own kernels skip what no input asks for;
- ``"W"``: its weight part, one site's ``autograd.grad`` at a time: only the cut operands',
  the weight's accumulated in place (then the backward from the weight values a site read
  to the parameters, a product of weights among them, runs as ``"full"``);
- otherwise (a backward the engine does not run, e.g. a user's ``autograd.grad``): every
  gradient returned to autograd, nothing written.

Under autocast the call is the op itself, with autograd's backward. Accumulated in place
only where autograd would do just that: the weight operand is a leaf
parameter or its ``t()`` (not a gathered shard or a cast: those reach the leaf through their
own backward), the backward builds no graph (``create_graph``), the gradient has the
parameter's dtype, and no hook of the parameter would do anything with the gradient now (a
user's ``register_hook`` or post-accumulate hook always would; a data-parallel bucket's
post-accumulate hook only in the backward the pipeline engine arms it for, the parameter's last
of the step, which autograd runs and the hook counts: the earlier micro-batches of a stage with
data ranks accumulate in place, the last adds its term as autograd does). Otherwise the
weight's gradient goes back to autograd as before. The sums are the same: on the CPU (MKL)
``addmm_`` rounds the product and then its sum with ``.grad``, as ``mm`` and ``add_`` do, and
float32 losses equal the unfused stages' bit for bit (benchmarks/fused_accumulation.py); a
GEMM that folds the add into its accumulation rounds once less.
"""
from __future__ import annotations

import contextlib

import torch

from .._C import ValidationError
from .async_gradients import (SPLIT_OPS, _BY_NAME, _LINEAR, _rows, bias_gradient, contraction, contraction_operands,
                              input_gradient)
from .buckets import _GradientBuckets

_PHASE = [None]


@contextlib.contextmanager
def phase(name: str):
    """The engine's backward of kind `name` ("full", "B" or "W") runs inside."""
    before = _PHASE[0]
    _PHASE[0] = name
    try:
        yield
    finally:
        _PHASE[0] = before


def _parameter_of(weight: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
    """(the leaf, transposed) where `weight` is a leaf or the ``t()`` of one; else None."""
    if weight.is_leaf:
        return weight, False
    base = weight._base
    if base is not None and base.is_leaf and base.dim() == 2 and weight.dim() == 2 and \
            weight.shape == base.shape[::-1] and weight.stride() == base.stride()[::-1] and \
            weight.storage_offset() == base.storage_offset():
        return base, True
    return None


def _no_hook_counts(param: torch.Tensor) -> bool:
    """Whether no post-accumulate hook of `param` would do anything with a gradient now: it has
    none, or only data-parallel buckets' (runtime/buckets.py) that would not count it yet (a
    pipeline's earlier micro-batches: the engine arms a parameter before its last backward, and
    that one goes through autograd and the hook). Any other hook (a user's) keeps autograd's."""
    hooks = param._post_accumulate_grad_hooks
    if hooks is None:
        return True
    return all(getattr(hook, "__func__", None) is _GradientBuckets._ready and not hook.__self__.counts(param)
               for hook in hooks.values())


def _accumulates_in_place(param: torch.Tensor, grad: torch.Tensor) -> bool:
    return (param.requires_grad and not torch.is_grad_enabled() and grad.dtype == param.dtype
            and _no_hook_counts(param) and not param._backward_hooks
            and (param.grad is None or (param.grad.layout == torch.strided and param.grad.dtype == param.dtype)))


def _asked(needs: bool, cut: bool) -> bool:
    """Whether the running backward asks for an operand's gradient: B the uncut operands', W
    the cut ones' (weight_split.WeightCut), any other every one autograd needs."""
    return needs and _PHASE[0] != ("B" if cut else "W")


def _writes_in_place(leaf: torch.Tensor | None, grad: torch.Tensor) -> bool:
    """Whether this backward adds the term into `leaf`'s .grad itself: the engine's own ("full",
    "W"), where autograd would do just that (_accumulates_in_place)."""
    return _PHASE[0] in ("full", "W") and leaf is not None and _accumulates_in_place(leaf, grad)


class _FusedAccumulation(torch.autograd.Function):
    """forward(op, beta, alpha, x, weight, bias): the call; backward: its gradients, the
    weight's accumulated into the parameter's .grad where the phase asks for it."""

    @staticmethod
    def forward(ctx, op, beta, alpha, x, weight, bias):
        ctx.op, ctx.beta, ctx.alpha = op, beta, alpha
        ctx.bias_shape = bias.shape if bias is not None else None
        # A split forward reads weight values through fresh leaves (weight_split.WeightCut).
        ctx.cut = tuple(getattr(t, "_shardwise_cut_of", None) is not None for t in (x, weight, bias))
        ctx.parameter = _parameter_of(getattr(weight, "_shardwise_cut_of", weight))
        ctx.save_for_backward(x, weight)
        return contraction(op, beta, alpha, x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        needs_x, needs_weight, needs_bias = (_asked(needs, cut) for needs, cut in zip(ctx.needs_input_grad[3:6],
                                                                                       ctx.cut))
        grad_x = grad_weight = grad_bias = None
        if needs_x:
            grad_x = input_gradient(ctx.op, ctx.alpha, grad, weight)
        if needs_weight:
            # The weight operand's gradient is a @ b (linear: grad^T x; addmm, mm: x^T grad).
            a, b = (_rows(grad).t(), _rows(x)) if ctx.op is _LINEAR else (x.t(), grad)
            leaf, transposed = ctx.parameter or (None, False)
            if _writes_in_place(leaf, grad):
                lhs, rhs = (b.t(), a.t()) if transposed else (a, b)  # the leaf's own orientation
                if leaf.grad is None:
                    made = torch.mm(lhs, rhs)
                    leaf.grad = made * ctx.alpha if ctx.alpha != 1 else made
                else:
                    leaf.grad.addmm_(lhs, rhs, alpha=ctx.alpha)
            else:
                grad_weight = a @ b
                if ctx.alpha != 1:
                    grad_weight = grad_weight * ctx.alpha
        if needs_bias:
            grad_bias = bias_gradient(ctx.op, ctx.beta, grad, ctx.bias_shape)
        return None, None, None, grad_x, grad_weight, grad_bias


_EMBEDDING = torch.ops.aten.embedding.default


def _embedding_operands(args: tuple, kwargs: dict) -> tuple:
    """(weight, indices, padding_idx, scale_grad_by_freq, sparse) of an aten::embedding call."""
    names, defaults = ("weight", "indices", "padding_idx", "scale_grad_by_freq", "sparse"), (None, None, -1, False,
                                                                                              False)
    return tuple(args[i] if i < len(args) else kwargs.get(name, default)
                 for i, (name, default) in enumerate(zip(names, defaults)))


class _FusedLookup(torch.autograd.Function):
    """forward(weight, indices, padding_idx): the lookup; backward: the table's gradient, the
    looked-up rows added into the parameter's .grad where the phase asks for it (autograd's
    embedding_dense_backward makes a whole table of zeros per micro-batch, scatters the rows
    in, and AccumulateGrad adds the table)."""

    @staticmethod
    def forward(ctx, weight, indices, padding_idx):
        ctx.padding_idx, ctx.rows = padding_idx, weight.shape[0]
        ctx.cut = getattr(weight, "_shardwise_cut_of", None) is not None
        leaf = getattr(weight, "_shardwise_cut_of", weight)
        ctx.parameter = leaf if leaf.is_leaf else None
        ctx.save_for_backward(indices)
        return torch.embedding(weight, indices, padding_idx, False, False)

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        if not _asked(ctx.needs_input_grad[0], ctx.cut):
            return None, None, None
        param = ctx.parameter
        if _writes_in_place(param, grad):
            rows, values = indices.reshape(-1), grad.reshape(-1, grad.shape[-1])
            if ctx.padding_idx >= 0:  # the padding row takes no gradient
                keep = rows != ctx.padding_idx
                rows, values = rows[keep], values[keep]
            # Each row's sum over this micro-batch first, in the lookup's order, then added to
            # .grad once: the sums autograd's embedding_dense_backward and AccumulateGrad's add_
            # make, bit for bit, over the rows read rather than the whole table.
            read, where = torch.unique(rows, return_inverse=True)
            sums = values.new_zeros(read.numel(), values.shape[1]).index_add_(0, where, values)
            if param.grad is None:
                param.grad = torch.zeros_like(param, memory_format=torch.contiguous_format)
            param.grad.index_add_(0, read, sums)
            return None, None, None
        return torch.ops.aten.embedding_dense_backward(grad, indices, ctx.rows, ctx.padding_idx, False), None, None


class FusedAccumulation(torch.nn.Module):
    """``self.fused_accumulation(op, args, kwargs)`` in the printed stage program: the call of
    `op` (aten::linear, aten::addmm, aten::mm or aten::embedding, the core's mark) with its
    weight gradient accumulated in place."""

    def forward(self, op: str, args: tuple, kwargs: dict) -> torch.Tensor:
        if op == "aten::embedding":
            weight, indices, padding_idx, scale, sparse = _embedding_operands(args, kwargs)
            if scale or sparse or torch.is_autocast_enabled(weight.device.type):  # not a scatter-add: the op's own
                return _EMBEDDING(weight, indices, padding_idx, scale, sparse)
            return _FusedLookup.apply(weight, indices, padding_idx)
        target = _BY_NAME[op]
        x, weight, bias, beta, alpha = contraction_operands(target, args, kwargs)
        if torch.is_autocast_enabled(x.device.type):  # the op's own autograd, as autocast casts it
            return contraction(target, beta, alpha, x, weight, bias)
        return _FusedAccumulation.apply(target, beta, alpha, x, weight, bias)


FUSED_ACCUMULATION_MARK = "shardwise.fused_accumulation"  # {..=i}, i the weight operand (fused_weight_accumulation.h)
# The ops whose weight gradient this module accumulates in place, by the op the program calls.
FUSABLE = {**SPLIT_OPS, _EMBEDDING: "aten::embedding"}


class FusedAccumulationEmitter:
    """The fused-accumulation pass's emitter, one of runtime/lower.py's ``FEATURES``: a call the
    stage IR marks runs through ``self.fused_accumulation``."""

    name = "fused_accumulation"  # the lowering's module: root.fused_accumulation

    def module(self, lowering) -> torch.nn.Module:
        return FusedAccumulation()

    def operand(self, lowering, read, i: int, op: dict) -> bool:
        return False

    def takes(self, lowering, read) -> bool:
        return FUSED_ACCUMULATION_MARK in read.marks

    def emit(self, lowering, read, args: tuple, kwargs: dict):
        if read.target not in FUSABLE:  # which operand is the weight: the core's (weight_gradient_split.h)
            raise ValidationError(f"parallelize: the core accumulates the weight gradient of '{read.first}' "
                                  f"({read.target}) at its operand {read.marks[FUSED_ACCUMULATION_MARK]} in place, "
                                  f"which the runtime can do only for the weight of {', '.join(FUSABLE.values())}")
        return lowering.graph.call_module(self.name, (FUSABLE[read.target], tuple(args), kwargs))


FUSED_ACCUMULATION_EMITTER = FusedAccumulationEmitter()
