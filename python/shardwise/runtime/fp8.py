"""FP8 linear layers: a plan whose precision is "fp8" runs each linear layer's products with its
weight in float8 (csrc/analysis/fp8_linears.h says which nodes: a linear, addmm or mm whose
weight is a parameter, K and N multiples of 16, float32 or bfloat16 operands), the rest of the
program in the model's dtype. The recipe is torchao's Float8 training with rowwise scales and
the weight gradient in high precision ("rowwise_with_gw_hp"):

- forward  y  = x W^T: x scaled per row over K, W per output row over K, both cast to
  float8_e4m3fn, multiplied by ``torch._scaled_mm`` into the input's dtype;
- backward dx = dy W: dy scaled per row over N, W per column over N, the same way;
           dW = dy^T x in the input's dtype (no float8), db = the sum of dy.

Each scale is a power of two (2^floor(log2(448 / amax)), amax floored at 1e-12), so scaling
is exact and only the cast to float8 rounds, and the dequantizing inverse is exact too. A
scale depends only on its own row or column: nothing depends on how the rows (the batch, the
sequence, micro-batches) are split, so data, sequence and pipeline parallelism compute what
one device computes. A contraction dim split over ranks (a row-parallel weight splits K, and
in backward a column-parallel one splits N) needs the whole row's amax: the core names those
mesh axes (``k_axes``, ``n_axes``) and the amaxes are all-reduced with MAX over them first
(x's and W's in one call).

A weight held sharded and gathered for its read (ZeRO-3 / FSDP; the rank graph's
``shardwise.fp8_saves_float8_weight``) is not saved for backward: the call casts the float8
copy of W^T that dx's product reads (its column scales too) in the forward and saves that, as
torchao's float8 FSDP and Transformer Engine keep a float8 weight, so the gathered weight is
released after the read and never gathered again (1 byte an element held, where a regather
moved the weight again); the numbers are the same, the cast reading the same W. Such a call
is traced under compile as any other (only one whose input gradient is all-reduced
asynchronously runs eagerly: ``Fp8Linears.with_collectives``).

A linear whose tensor-parallel collective runs inside it as a ring (runtime/collective_matmul.py)
runs these products block by block inside the ring (``collective_matmul.Fp8Products``): a block's rows are
scaled by their own amaxes, so its products are the whole call's rows. Where a whole tensor's
rows are on the rank (a row-parallel product's x, a column-parallel one's output gradient) their
amaxes, all-reduced over the ranks that split K or N, are taken once before the ring. A ring is
one of the runtime's stateful modules, run eagerly between compiled pieces (runtime/compiled.py).

``one_device()`` runs the same arithmetic on one device: a TorchFunctionMode that routes a
model's own linear / addmm / mm calls on a weight parameter, under the same rule, through the
same function. It is the reference FP8 plans are checked against (tests/python/runtime/test_fp8.py).
"""
from __future__ import annotations

import contextlib
from typing import Callable, NamedTuple

import torch
from torch.overrides import TorchFunctionMode

from .._C import ValidationError
from . import transport
from .async_gradients import (ASYNC_GRADIENT_EMITTER, _ADDMM, _BY_NAME, _LINEAR, _MM, SPLIT_OPS, bias_gradient,
                              contraction_operands)
from .mesh import _Mesh

FP8 = torch.float8_e4m3fn
_FP8_MAX = torch.finfo(FP8).max  # 448
_AMAX_FLOOR = 1e-12
_MULTIPLE = 16  # K and N (analysis/fp8_linears.h)
_DTYPES = (torch.float32, torch.bfloat16)


def _row_amax(t: torch.Tensor, dim: int) -> torch.Tensor:
    """`t`'s amax over `dim` (keepdim, float32)."""
    return t.detach().abs().amax(dim=dim, keepdim=True).float()


def _amaxes(parts: list[tuple[torch.Tensor, int]], groups: tuple[str, ...],
            amax: Callable = _row_amax) -> list[torch.Tensor]:
    """The amax of each tensor over its dim (keepdim, float32; `amax` computes it: _row_amax, or
    its compiled form); where `groups` split that dim, the max over them, every part in one
    all-reduce (priced so: search::ShardingModel's fp8_amax_elements)."""
    amaxes = [amax(t, dim) for t, dim in parts]
    if not groups:
        return amaxes
    flat = torch.cat([a.reshape(-1) for a in amaxes])
    for group in groups:
        flat = torch.ops.shardwise.all_reduce(flat, "max", group)
    return [chunk.reshape(a.shape) for chunk, a in zip(flat.split([a.numel() for a in amaxes]), amaxes)]


def _cast(t: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`t` scaled by the power of two that takes `amax` to at most 448, in float8_e4m3fn, and
    the inverse scales. No clamp: |t| x scale <= 448 exactly (a power of two times values <=
    amax)."""
    scale = torch.exp2(torch.floor(torch.log2(_FP8_MAX / amax.clamp_min(_AMAX_FLOOR))))
    q = (t.detach() * scale).to(FP8)
    if not q.is_contiguous():  # row-major, as _scaled_mm reads it (a transposed W's columns)
        q = q.contiguous()
    return q, scale.reciprocal()


def quantize(t: torch.Tensor, dim: int, groups: tuple[str, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """`t` (2-D) in float8_e4m3fn, scaled per slice along `dim` (its amax over that dim, a max
    over `groups` too), and the inverse scales (float32, keepdim) that dequantize it. The
    passes the cost model prices (csrc/cost/op_cost.h, FP8 linears): |t| and its amax, the
    scaled copy in float32, its cast to float8 (linalg.vector_norm(inf) reads t once but ran
    5x slower than abs + amax on the CPU)."""
    (amax,) = _amaxes([(t, dim)], groups)
    return _cast(t, amax)


def _scaled_product(a: torch.Tensor, a_scale: torch.Tensor, b_t: torch.Tensor, b_scale: torch.Tensor,
                    dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a [M, K] (float8, row scales [M, 1]) times b_t^T, b_t [N, K] (float8, row scales [N, 1]),
    plus `bias` [N] (in `dtype`) in the same kernel: ``torch._scaled_mm`` with its second
    operand column-major, as CUDA needs it."""
    out = torch.bfloat16 if a.is_cuda else dtype  # CUDA's rowwise scaling writes bf16
    return torch._scaled_mm(a, b_t.t(), scale_a=a_scale, scale_b=b_scale.t(), bias=bias, out_dtype=out).to(dtype)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


def _weight_nk(op, weight: torch.Tensor) -> torch.Tensor:
    """The weight as [N, K]: linear's as it is, addmm's and mm's [K, N] transposed."""
    return weight if op is _LINEAR else weight.t()


def _weight_columns(op, weight: torch.Tensor, n_groups: tuple[str, ...], amax: Callable = _row_amax,
                    cast: Callable = _cast) -> tuple[torch.Tensor, torch.Tensor]:
    """W's columns over N as rows ([K, N]) in float8, scaled per column (a max over
    `n_groups` where they split N), and their inverse scales: what dx = dy W multiplies.
    `amax` and `cast`: _row_amax and _cast, or their compiled forms (Casts)."""
    w_kn = _weight_nk(op, weight).t()
    (w_amax,) = _amaxes([(w_kn, 1)], n_groups, amax)
    return cast(w_kn, w_amax)


def _check_operands(op, x: torch.Tensor, weight: torch.Tensor) -> None:
    """An FP8 product's operands: float32 or bfloat16, one dtype."""
    if x.dtype not in _DTYPES or weight.dtype != x.dtype:
        raise ValidationError(f"fp8: {op} computes in float8 from float32 or bfloat16 operands, got {x.dtype} and "
                              f"{weight.dtype}; a float64 model has no FP8 plan (train it in float32 or bf16)")


def _forward_product(x: torch.Tensor, x_cast: tuple, w_cast: tuple, bias, beta, alpha) -> torch.Tensor:
    """y = alpha x W^T + beta bias from x's rows and W's rows over K in float8 (each with its
    inverse scales), in x's shape and dtype. A linear layer's bias is added by the product (as
    addmm adds it); the CPU kernel adds it in the output's dtype, CUDA's writes bf16 first, so
    there it is added after."""
    (x_q, x_scale), (w_q, w_scale) = x_cast, w_cast
    fused = bias is not None and bias.dim() == 1 and beta == 1 and alpha == 1 and bias.dtype == x.dtype \
        and not x.is_cuda
    y = _scaled_product(x_q, x_scale, w_q, w_scale, x.dtype, bias if fused else None)
    y = y.reshape(*x.shape[:-1], w_q.shape[0])
    if alpha != 1:
        y = y * alpha
    if bias is not None and not fused:
        y = y + (bias * beta if beta != 1 else bias)
    return y


class _Fp8Linear(torch.autograd.Function):
    """forward(op, k_groups, n_groups, grad_group, float8_weight, beta, alpha, x, weight, bias):
    the call of `op` with its product in float8 (the module docstring); `grad_group`: x's
    gradient all-reduced there asynchronously while dW is computed (runtime/async_gradients.py).
    `float8_weight` (the rank graph's ``shardwise.fp8_saves_float8_weight``: a weight gathered
    for this read): backward's float8 copy of W^T is cast here and saved in place of W, which
    is then released and never gathered again; the same numbers, as the cast reads the same W."""

    @staticmethod
    def forward(ctx, op, k_groups, n_groups, grad_group, float8_weight, beta, alpha, x, weight, bias):
        ctx.op, ctx.n_groups, ctx.grad_group, ctx.beta, ctx.alpha = op, n_groups, grad_group, beta, alpha
        ctx.bias_shape = bias.shape if bias is not None else None
        ctx.float8_weight = float8_weight
        if float8_weight:
            ctx.save_for_backward(x, *_weight_columns(op, weight, n_groups))
        else:
            ctx.save_for_backward(x, weight)
        x_rows, w_nk = _rows(x), _weight_nk(op, weight)
        x_amax, w_amax = _amaxes([(x_rows, 1), (w_nk, 1)], k_groups)
        return _forward_product(x, _cast(x_rows, x_amax), _cast(w_nk, w_amax), bias, beta, alpha)

    @staticmethod
    def backward(ctx, grad):
        if ctx.float8_weight:
            x, w_q, w_scale = ctx.saved_tensors
        else:
            x, weight = ctx.saved_tensors
        needs_x, needs_weight, needs_bias = ctx.needs_input_grad[7:10]
        op, alpha = ctx.op, ctx.alpha
        grad_rows = _rows(grad)
        grad_x = grad_weight = grad_bias = None
        work = None
        if needs_x:
            if ctx.float8_weight:
                (g_amax,) = _amaxes([(grad_rows, 1)], ctx.n_groups)
            else:
                w_kn = _weight_nk(op, weight).t()  # [K, N]: W's columns over N as rows
                g_amax, w_amax = _amaxes([(grad_rows, 1), (w_kn, 1)], ctx.n_groups)
                w_q, w_scale = _cast(w_kn, w_amax)
            g_q, g_scale = _cast(grad_rows, g_amax)
            grad_x = _scaled_product(g_q, g_scale, w_q, w_scale, grad.dtype).reshape(x.shape)
            if alpha != 1:
                grad_x = grad_x * alpha
            if ctx.grad_group is not None:
                grad_x = grad_x.contiguous()
                work = transport.all_reduce(grad_x, group=ctx.grad_group, async_op=True)
        if needs_weight:  # in the input's precision
            grad_weight = grad_rows.t() @ _rows(x) if op is _LINEAR else _rows(x).t() @ grad_rows
            if alpha != 1:
                grad_weight = grad_weight * alpha
        if needs_bias:
            grad_bias = bias_gradient(op, ctx.beta, grad, ctx.bias_shape)
        if work is not None:
            work.wait()
        return None, None, None, None, None, None, None, grad_x, grad_weight, grad_bias


def fp8_call(op, args: tuple, kwargs: dict, k_groups: tuple[str, ...] = (), n_groups: tuple[str, ...] = (),
             grad_group=None, float8_weight: bool = False) -> torch.Tensor:
    """The call of `op` (aten linear, addmm or mm) on its arguments as the program passes them,
    its product in float8; `float8_weight`: saving W's float8 copy for backward, not W."""
    x, weight, bias, beta, alpha = contraction_operands(op, args, kwargs)
    _check_operands(op, x, weight)
    return _Fp8Linear.apply(op, tuple(k_groups), tuple(n_groups), grad_group, bool(float8_weight), beta, alpha, x,
                            weight, bias)


class Casts(NamedTuple):
    """How a block's amaxes and scaled casts run: eagerly (``_row_amax``, ``_cast``), or, in a
    compiled program, each one kernel compiled with the program's options (``Casts.compiled``):
    the ring itself runs eagerly between compiled pieces (runtime/compiled.py), its casts as
    the traced FP8 linears' are fused, which is what the cost model prices for both."""
    amax: Callable
    cast: Callable

    @staticmethod
    def compiled(options: dict) -> "Casts":
        return Casts(torch.compile(_row_amax, **options), torch.compile(_cast, **options))


EAGER_CASTS = Casts(_row_amax, _cast)


class Fp8Spec(NamedTuple):
    """What an FP8 linear run inside a ring (runtime/collective_matmul.py) needs besides the
    op's: the process groups its amaxes are a max over where they split K (forward) and N
    (backward), whether it saves its weight's float8 columns for backward, and how its casts
    run (Casts)."""
    k_groups: tuple[str, ...]
    n_groups: tuple[str, ...]
    float8_weight: bool
    casts: Casts = EAGER_CASTS

    @staticmethod
    def of(mesh: _Mesh, op, x: torch.Tensor, weight: torch.Tensor, k_axes, n_axes, float8_weight,
           casts: Casts = EAGER_CASTS) -> "Fp8Spec":
        _check_operands(op, x, weight)
        return Fp8Spec(tuple(mesh.group_names[a] for a in k_axes), tuple(mesh.group_names[a] for a in n_axes),
                       bool(float8_weight), casts)


def fp8_marks(marks: dict) -> tuple:
    """A call's FP8 marks as a ring's last argument, ``((k axes, n axes, float8 weight),)``;
    () for a call that is no FP8 linear."""
    if FP8_K_AXES not in marks:
        return ()
    return ((tuple(marks[FP8_K_AXES]), tuple(marks[FP8_N_AXES]), bool(marks.get(FP8_FLOAT8_WEIGHT))),)


class Fp8Linears(torch.nn.Module):
    """``self.fp8_linear(op, k_axes, n_axes, async_step, args, kwargs)`` in a printed rank
    program: the call with its product in float8, its amaxes taken over the mesh axes that
    split K (forward) and N (backward), and where `async_step` is given (the rank IR's backward
    all_reduce of x's gradient, runtime/async_gradients.py) that all-reduce run beside dW."""

    def __init__(self, mesh: _Mesh | None, steps: dict):
        super().__init__()
        self._mesh = mesh
        self._steps = steps

    def _groups(self, axes) -> tuple[str, ...]:
        return tuple(self._mesh.group_names[a] for a in axes) if axes else ()

    def forward(self, op: str, k_axes, n_axes, async_step, args: tuple, kwargs: dict,
                float8_weight: bool = False) -> torch.Tensor:
        # Traced where compiled, amaxes all-reduced or not (torch.ops.shardwise.all_reduce is an op
        # with a fake kernel, as the rank program's own collectives); the cost model prices its
        # casts fused (csrc/cost/op_cost.h).
        if not self.calls_eagerly((op, k_axes, n_axes, async_step)):
            return fp8_call(_BY_NAME[op], args, kwargs, self._groups(k_axes), self._groups(n_axes),
                            float8_weight=float8_weight)
        return self.with_collectives(op, k_axes, n_axes, async_step, args, kwargs, float8_weight)

    @staticmethod
    def calls_eagerly(node_args: tuple) -> bool:
        """Whether the program's call with these arguments (op, k_axes, n_axes, async_step, ...)
        runs ``with_collectives`` (forward's test): under compile, an eager piece of its own
        (compiled.compiled_in_pieces)."""
        return node_args[3] is not None

    def with_collectives(self, op: str, k_axes, n_axes, async_step, args: tuple, kwargs: dict,
                         float8_weight: bool = False) -> torch.Tensor:
        """The call whose input gradient is all-reduced asynchronously beside dW (a Work waited
        for in its backward): run eagerly between compiled pieces (runtime/compiled.py)."""
        grad_group = None
        if async_step is not None:
            grad_group = self._mesh.groups[self._steps[async_step]["axis"]]
        return fp8_call(_BY_NAME[op], args, kwargs, self._groups(k_axes), self._groups(n_axes), grad_group,
                        float8_weight)


FP8_K_AXES, FP8_N_AXES = "shardwise.fp8_k_axes", "shardwise.fp8_n_axes"  # an FP8 linear's amax axes (rank_graph.h)
FP8_FLOAT8_WEIGHT = "shardwise.fp8_saves_float8_weight"  # its gathered weight saved as float8 W^T (fp8_axes.h)


class Fp8Emitter:
    """The emitter of the rank graph's FP8 linears (``{shardwise.fp8_k_axes=[..],
    shardwise.fp8_n_axes=[..]}``, where the plan runs in fp8), one of runtime/lower.py's
    ``FEATURES``, asked after the ring's and before the others: the call runs through
    ``self.fp8_linear``, which runs the async-gradient emitter's all-reduce itself
    (``read.taken["async_gradient"]``). One that runs a ring is the ring's emitter's, which
    runs its products in float8 (``fp8_marks``, collective_matmul.Fp8Products)."""

    name = "fp8_linear"  # the lowering's module: root.fp8_linear

    def module(self, lowering) -> torch.nn.Module:
        return Fp8Linears(lowering.mesh, lowering.root.reshard._steps if lowering.mesh is not None else {})

    def operand(self, lowering, read, i: int, op: dict) -> bool:
        return False

    def takes(self, lowering, read) -> bool:
        return FP8_K_AXES in read.marks  # (one that runs a ring: the ring's emitter took it, before this one)

    def emit(self, lowering, read, args: tuple, kwargs: dict):
        if read.target not in SPLIT_OPS:
            raise ValidationError(f"parallelize: the core marks '{read.first}' ({read.target}) as an FP8 linear, "
                                  f"which the runtime runs only for {', '.join(SPLIT_OPS.values())}")
        taken = read.taken.get(ASYNC_GRADIENT_EMITTER.name)
        return lowering.graph.call_module(self.name, (
            SPLIT_OPS[read.target], tuple(read.marks[FP8_K_AXES]), tuple(read.marks[FP8_N_AXES]),
            taken[1] if taken is not None else None, tuple(args), kwargs, bool(read.marks.get(FP8_FLOAT8_WEIGHT))))


FP8_EMITTER = Fp8Emitter()


# ---- one device: the same arithmetic on a model's own calls --------------------------------------
_LINEAR_FUNCS = {torch.nn.functional.linear, torch._C._nn.linear}
_ADDMM_FUNCS = {torch.addmm, torch.Tensor.addmm}
_MM_FUNCS = {torch.mm, torch.Tensor.mm}


def _is_fp8_linear(x, weight, k_dim: int) -> bool:
    """analysis/fp8_linears.h's rule on a call's operands."""
    if not isinstance(weight, torch.nn.Parameter) or not isinstance(x, torch.Tensor) or weight.dim() != 2:
        return False
    if x.dtype not in _DTYPES or weight.dtype not in _DTYPES or x.dim() == 0:
        return False
    k, n = weight.shape[k_dim], weight.shape[1 - k_dim]
    return x.shape[-1] == k and k % _MULTIPLE == 0 and n % _MULTIPLE == 0


class _OneDevice(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _LINEAR_FUNCS and len(args) >= 2 and _is_fp8_linear(args[0], args[1], 1):
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            with torch._C.DisableTorchFunction():
                return fp8_call(_LINEAR, (args[0], args[1], bias), {})
        if func in _ADDMM_FUNCS and len(args) >= 3 and _is_fp8_linear(args[1], args[2], 0) \
                and kwargs.get("beta", 1) == 1 and kwargs.get("alpha", 1) == 1 and len(args) == 3:
            with torch._C.DisableTorchFunction():
                return fp8_call(_ADDMM, tuple(args), {})
        if func in _MM_FUNCS and len(args) == 2 and not kwargs and _is_fp8_linear(args[0], args[1], 0):
            with torch._C.DisableTorchFunction():
                return fp8_call(_MM, tuple(args), {})
        return func(*args, **kwargs)


@contextlib.contextmanager
def one_device():
    """Within it, a model's linear layers compute as an "fp8" plan's do (the module docstring):
    the single-device reference of an FP8 plan."""
    with _OneDevice():
        yield
