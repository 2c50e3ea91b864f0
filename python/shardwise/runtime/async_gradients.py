"""An activation's gradient all-reduced beside its reader's weight gradient: Megatron-LM's
asynchronous tensor-parallel all-reduce.

The core's async-gradient pass over the rank graph (csrc/transform/async_gradients.h) marks
the reader ``{shardwise.async_gradient=i}`` and the all-reduce of operand i's gradient
``{overlap="backward"}`` by the search's rule (search/parameter_collectives.h,
activation_gradient_overlap: a column-parallel linear's input, read by nothing else, with
nothing to do in forward), and the search prices that all-reduce as hidden under the weight
gradient's product. ``self.async_gradient(op, operand, step, args, kwargs)`` runs the call
with its backward split so that it is: operand i's gradient first, its all-reduce issued
asynchronously, the weight's and the bias' gradients computed while it runs, then the wait.
The products are the ones autograd's backward of the op computes (the same formulas), the
sum the same all-reduce: the result equals the fused backward followed by the all-reduce.

The ops it splits are the contractions whose backward is two products:
``aten.linear`` (x, weight, bias), ``aten.addmm`` (bias, x, weight) and ``aten.mm`` (x,
weight). The core marks no other (csrc/search/parameter_collectives.cc).
"""
from __future__ import annotations

import torch

from .._C import ValidationError
from . import transport
from .mesh import _Mesh

_LINEAR = torch.ops.aten.linear.default
_ADDMM = torch.ops.aten.addmm.default
_MM = torch.ops.aten.mm.default
SPLIT_OPS = {_LINEAR: "aten::linear", _ADDMM: "aten::addmm", _MM: "aten::mm"}
_BY_NAME = {name: op for op, name in SPLIT_OPS.items()}


def _rows(t: torch.Tensor) -> torch.Tensor:
    """`t` as a matrix: every leading dim folded into rows."""
    return t.reshape(-1, t.shape[-1])


def _weight_gradient(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """linear's weight gradient: grad^T x over every row."""
    return _rows(grad).t() @ _rows(x)


def _sum_to(grad: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """`grad` summed over the dims a broadcast operand of `shape` was expanded along."""
    return grad if grad.shape == shape else grad.sum_to_size(shape)


def contraction_operands(target, args: tuple, kwargs: dict) -> tuple:
    """(x, weight, bias, beta, alpha) of a call of `target` (one of SPLIT_OPS) from its
    arguments as the rank program passes them (bias None for mm; beta and alpha 1 but for addmm)."""
    if target is _LINEAR:
        return args[0], args[1], args[2] if len(args) > 2 else kwargs.get("bias"), 1, 1
    if target is _ADDMM:
        return (args[1], args[2], args[0], kwargs.get("beta", args[3] if len(args) > 3 else 1),
                kwargs.get("alpha", args[4] if len(args) > 4 else 1))
    return args[0], args[1], None, 1, 1


def contraction(op, beta, alpha, x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    """The call of `op` (one of SPLIT_OPS) on its operands (addmm's beta and alpha)."""
    if op is _LINEAR:
        return torch.nn.functional.linear(x, weight, bias)
    if op is _ADDMM:
        return torch.addmm(bias, x, weight, beta=beta, alpha=alpha)
    return torch.mm(x, weight)


def input_gradient(op, alpha, grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The contraction's gradient with respect to its input x."""
    grad_x = grad @ weight if op is _LINEAR else grad @ weight.t()
    return grad_x * alpha if alpha != 1 else grad_x


def bias_gradient(op, beta, grad: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The contraction's gradient with respect to its bias (of `shape`)."""
    return _sum_to(grad if op is _LINEAR or beta == 1 else grad * beta, shape)


class _SplitBackward(torch.autograd.Function):
    """forward(op, group, beta, alpha, x, weight, bias): the call (addmm's beta and alpha); backward: x's
    gradient, all-reduced over `group` asynchronously while the others are computed."""

    @staticmethod
    def forward(ctx, op, group, beta, alpha, x, weight, bias):
        ctx.op, ctx.group, ctx.beta, ctx.alpha = op, group, beta, alpha
        ctx.bias_shape = bias.shape if bias is not None else None
        ctx.save_for_backward(x, weight)
        return contraction(op, beta, alpha, x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        needs_x, needs_weight, needs_bias = ctx.needs_input_grad[4:7]
        grad_x = grad_weight = grad_bias = None
        work = None
        if needs_x:
            # The input's gradient first, then its all-reduce, asynchronous.
            grad_x = input_gradient(ctx.op, ctx.alpha, grad, weight).contiguous()
            work = transport.all_reduce(grad_x, group=ctx.group, async_op=True)
        # The weight's and the bias' while it runs.
        if needs_weight:
            if ctx.op is _LINEAR:
                grad_weight = _weight_gradient(grad, x)
            else:
                grad_weight = x.t() @ grad
                if ctx.op is _ADDMM and ctx.alpha != 1:
                    grad_weight = grad_weight * ctx.alpha
        if needs_bias:
            grad_bias = bias_gradient(ctx.op, ctx.beta, grad, ctx.bias_shape)
        if work is not None:
            work.wait()
        return None, None, None, None, grad_x, grad_weight, grad_bias


class AsyncGradient(torch.nn.Module):
    """``self.async_gradient(op, operand, step, args, kwargs)`` in the printed rank program:
    the call of `op` (one of SPLIT_OPS) whose tensor operand `operand` is this rank's
    replicated activation, its gradient all-reduced by `step` (the rank IR's backward
    all_reduce, registered with the Reshard module) beside the weight gradient."""

    def __init__(self, mesh: _Mesh, steps: dict):
        super().__init__()
        self._mesh = mesh
        self._steps = steps  # the Reshard module's typed steps, by text

    def forward(self, op: str, operand: int, step: str, args: tuple, kwargs: dict) -> torch.Tensor:
        target = _BY_NAME[op]
        group = self._mesh.groups[self._steps[step]["axis"]]
        x, weight, bias, beta, alpha = contraction_operands(target, args, kwargs)
        expected = 0 if target is not _ADDMM else 1
        if operand != expected:
            raise ValueError(f"async_gradient: {op}'s operand {operand} is not its input ({expected})")
        return _SplitBackward.apply(target, group, beta, alpha, x, weight, bias)


ASYNC_GRADIENT_MARK = "shardwise.async_gradient"  # {shardwise.async_gradient=i} (transform/async_gradients.h)


class AsyncGradientEmitter:
    """The async-gradient pass's emitter, one of runtime/lower.py's ``FEATURES`` (its interface
    is described there): the operand the call's mark names has its region's all-reduce run in
    the call's own backward (``read.taken["async_gradient"]``: the operand and that step), so the
    lowering reads it as it is; the call runs through ``self.async_gradient``."""

    name = "async_gradient"  # the lowering's module: root.async_gradient

    def module(self, lowering) -> torch.nn.Module:
        return AsyncGradient(lowering.mesh, lowering.root.reshard._steps)

    def operand(self, lowering, read, i: int, op: dict) -> bool:
        if read.marks.get(ASYNC_GRADIENT_MARK) != i or lowering.mesh is None:
            return False
        backward = lowering.step_texts(op["backward"])
        if len(backward) != 1:
            raise ValidationError(f"parallelize: the core runs the gradient of '{op['value']}' beside the weight "
                                  f"gradient of '{read.first}' in {len(backward)} steps; the runtime runs one "
                                  "all-reduce there")
        read.taken[self.name] = (i, backward[0])
        return True

    def takes(self, lowering, read) -> bool:
        return self.name in read.taken

    def emit(self, lowering, read, args: tuple, kwargs: dict):
        """linear, addmm, mm with its backward split around the operand's all-reduce."""
        if read.target not in SPLIT_OPS:
            raise ValidationError(f"parallelize: the core split the backward of '{read.first}' ({read.target}), "
                                  f"which the runtime cannot split ({', '.join(SPLIT_OPS.values())})")
        operand, step = read.taken[self.name]
        return lowering.graph.call_module(self.name, (SPLIT_OPS[read.target], operand, step, tuple(args), kwargs))


ASYNC_GRADIENT_EMITTER = AsyncGradientEmitter()
