"""Tensor-parallel collectives run inside their matmuls, as rings (collective matmul: Wang et
al., ASPLOS 2023; torchtitan's async tensor parallelism).

The core's collective-matmul pass marks them on the rank graph (csrc/transform/collective_matmul.h,
where the plan's ``sharding.collective_matmul`` switches it on: transform/rank_passes.h): a contraction carries ``{shardwise.gather_matmul=i}``
when its operand i arrives by one all-gather along a row dim, or
``{shardwise.matmul_scatter=i}`` (i: its input) when its output leaves by one reduce-scatter
along a row dim; those collectives carry ``{overlap="matmul"}``, and the search prices them
hidden under (n-1)/n of the contraction's products (search/parameter_collectives.h,
MatmulCollective). ``RingEmitter`` is the pass's emitter (one pass, one emitter:
transform/rank_passes.h): the lowering (runtime/lower.py) hands it each operand and call,
and it reads those marks off the rank IR being lowered. The emitted call,
``self.collective_matmul(kind, op, operand, forward_step, backward_step, args, kwargs)`` in
the printed rank program, runs them:

- **gather**: the operand's blocks pass around the axis' ring, rank k to k+1; each rank
  multiplies the block in hand while the next one travels, and assembles the gathered
  operand, which it returns beside the product (other readers of the gathered value read
  it). Backward: each block's input gradient is added into the partial sums passing the
  ring (a ring reduce-scatter), its weight gradient computed in the same step.
- **scatter**: the product's blocks (rows) are computed one per ring step, each added to the
  partial sum arriving from the previous rank and passed on, so rank k ends with the sum of
  its block. Backward: the output gradient's blocks pass the ring (a ring all-gather), each
  block's input and weight gradients computed while the next travels.

The products are the ones autograd's formulas for the op compute, block by block; the sums
are the same reductions in another order: the result equals the plain collective and the
op to rounding. Bytes are counted as the collective each ring replaces (traffic.py), which
moves the same bytes, so a plan's predicted traffic and the measured one stay comparable.
The ops are ``aten.linear`` (x, weight, bias), ``aten.addmm`` (bias, x, weight) and
``aten.mm`` (x, weight), as in async_gradients.py.
"""
from __future__ import annotations

import operator

import torch
import torch.distributed as dist

from .._C import ValidationError
from . import fp8 as fp8_ops
from . import traffic, transport
from .async_gradients import ASYNC_GRADIENT_MARK, _ADDMM, _BY_NAME, _LINEAR, SPLIT_OPS, _rows, contraction_operands
from .mesh import _Mesh


class _Ring:
    """One mesh axis' group as a ring: this rank's index ``k`` of ``n``, sending to the next
    and receiving from the previous."""

    def __init__(self, group):
        ranks = dist.get_process_group_ranks(group)
        self.group, self.n, self.k = group, len(ranks), ranks.index(dist.get_rank())
        self.next, self.prev = ranks[(self.k + 1) % self.n], ranks[(self.k - 1) % self.n]

    def exchange(self, send: torch.Tensor, receive: torch.Tensor) -> list:
        """Sends `send` to the next rank and receives the previous rank's into `receive`,
        asynchronously (one batched pair: NCCL runs a ring's sends and receives together or
        not at all); the work handles to wait for."""
        if transport.on_host(send, self.group):  # Gloo with device tensors: through host copies
            return [transport.isend(send, self.next, group=self.group),
                    transport.irecv(receive, self.prev, group=self.group)]
        return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, self.next, self.group),
                                       dist.P2POp(dist.irecv, receive, self.prev, self.group)])


class _Blocks:
    """Where the ring's n blocks lie along `dim` of a whole tensor: contiguous (groups 1), or
    strided (the dim viewed as [groups, n * size], block j the j-th slice of every group: a
    sequence cut flattened with the batch, as GPT-2's Conv1D views [b, s, h] as [b * s, h]
    before its addmm). A rank's local block is its slices of every group, in group order,
    as the resharding steps hold it (reshard.py, _grouped)."""

    def __init__(self, dim: int, groups: int, n: int):
        self.dim, self.groups, self.n = dim, groups, n

    def take(self, whole: torch.Tensor, j: int) -> torch.Tensor:
        """Block j of `whole` (a copy where strided)."""
        if self.groups == 1:
            size = whole.shape[self.dim] // self.n
            return whole.narrow(self.dim, j * size, size)
        grouped = whole.unflatten(self.dim, (self.groups, -1))
        size = grouped.shape[self.dim + 1] // self.n
        return grouped.narrow(self.dim + 1, j * size, size).flatten(self.dim, self.dim + 1)

    def join(self, blocks: list) -> torch.Tensor:
        """The whole tensor of the n blocks in rank order."""
        if self.groups == 1:
            return torch.cat(blocks, self.dim)
        grouped = [b.unflatten(self.dim, (self.groups, -1)) for b in blocks]
        return torch.cat(grouped, self.dim + 1).flatten(self.dim, self.dim + 1)


def _wait(works: list) -> None:
    for work in works:
        work.wait()


def ring_gather(local: torch.Tensor, dim: int, ring: _Ring, each) -> list[torch.Tensor]:
    """The all-gather of `local` along `dim` over `ring`, block by block: ``each(j, block)``
    is called on every rank's block j (this rank's first) while the next block travels.
    Returns the blocks in rank order."""
    blocks: list[torch.Tensor | None] = [None] * ring.n
    current = local.contiguous()
    blocks[ring.k] = current
    for step in range(ring.n):
        j = (ring.k - step) % ring.n  # the block in hand
        works = []
        if step < ring.n - 1:
            incoming = torch.empty_like(current)
            works = ring.exchange(current, incoming)
        each(j, current)
        if works:
            _wait(works)
            current = incoming
            blocks[(j - 1) % ring.n] = current
    return blocks


def ring_reduce_scatter(ring: _Ring, part) -> torch.Tensor:
    """The sum over `ring`'s ranks of ``part(k)``, on rank k: ``part(j)`` (this rank's share
    of block j) is computed while the partial sum of the block before travels, then added to
    the partial sum that arrives and passed on; block k's ends here."""
    received, works = None, []
    for step in range(ring.n):
        j = (ring.k - 1 - step) % ring.n
        block = part(j)
        if works:
            _wait(works)
            block = received + block
        if step == ring.n - 1:
            return block
        block = block.contiguous()
        received = torch.empty_like(block)
        works = ring.exchange(block, received)
    raise AssertionError("unreachable")


class _Contraction:
    """The op's products on one block of rows: forward, and the input's and weight's
    gradients (autograd's formulas for linear, addmm, mm). An FP8 linear's products
    (Fp8Products, below) scale each row by its own amax: ``row_scales`` gives what a
    whole tensor's rows need (a max over ranks taken once, before the ring) for the blocks
    cut from it (``scales``: the block's rows' amaxes); these products need none."""

    def __init__(self, op, beta, alpha, weight, bias):
        self.op, self.beta, self.alpha, self.weight, self.bias = op, beta, alpha, weight, bias

    def row_scales(self, t: torch.Tensor, forward: bool) -> torch.Tensor | None:
        return None

    def prepare(self, forward: bool) -> None:
        """What the products need of the weight that takes a collective (an FP8 weight's amaxes
        over ranks), made before the ring starts: no collective beside its transfers."""

    def forward(self, x: torch.Tensor, scales: torch.Tensor | None = None) -> torch.Tensor:
        if self.op is _LINEAR:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        if self.op is _ADDMM:
            return torch.addmm(self.bias, x, self.weight, beta=self.beta, alpha=self.alpha)
        return torch.mm(x, self.weight)

    def input_gradient(self, grad: torch.Tensor, scales: torch.Tensor | None = None) -> torch.Tensor:
        if self.op is _LINEAR:
            return grad @ self.weight
        out = grad @ self.weight.t()
        return out * self.alpha if self.op is _ADDMM and self.alpha != 1 else out

    def weight_gradient(self, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.op is _LINEAR:
            return _rows(grad).t() @ _rows(x)
        out = x.t() @ grad
        return out * self.alpha if self.op is _ADDMM and self.alpha != 1 else out

    def bias_gradient(self, grad: torch.Tensor) -> torch.Tensor:
        if self.op is _LINEAR:
            return _rows(grad).sum(0)
        out = grad.sum(0)
        return out * self.beta if self.beta != 1 else out


def _whole(block: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    """A tensor (on the meta device: no memory) of `n` such blocks along `dim`: what the
    collective a ring replaces is counted by (traffic.py)."""
    shape = list(block.shape)
    shape[dim] *= n
    return torch.empty(shape, dtype=block.dtype, device="meta")


def _add(total, value):
    return value if total is None else total + value


class Fp8Products(_Contraction):
    """An FP8 linear's products on blocks of rows (a ring's), the arithmetic of runtime/fp8.py's
    _Fp8Linear: each row of x (forward) and of the output gradient (backward) is
    scaled by its own amax, W's rows over K and columns over N by theirs, so a block's float8
    operands are the whole call's rows and its products the whole product's rows. Where a
    whole tensor's rows are on this rank (`row_scales`: a scatter's x, a gather's output
    gradient) their amaxes, a max over the groups that split the summed dim, are taken once
    before the ring, and a block reads its rows' (`scales`); a block that travels takes its
    own (its rows whole on the ranks of those groups). dW = dy^T x in the input's precision."""

    def __init__(self, op, beta, alpha, weight, bias, spec: fp8_ops.Fp8Spec, columns: tuple | None = None):
        super().__init__(op, beta, alpha, weight, bias)
        self.spec = spec
        self._rows_q: tuple | None = None  # W's rows over K in float8 and their inverse scales
        self._columns = columns  # W's columns over N likewise: what dx = dy W multiplies

    def _amax(self, t: torch.Tensor, dim: int, groups: tuple[str, ...]) -> torch.Tensor:
        return fp8_ops._amaxes([(t, dim)], groups, self.spec.casts.amax)[0]

    def row_scales(self, t: torch.Tensor, forward: bool) -> torch.Tensor:
        return self._amax(t, t.dim() - 1, self.spec.k_groups if forward else self.spec.n_groups)

    def prepare(self, forward: bool) -> None:
        if forward:
            self.weight_rows()
        else:
            self.weight_columns()

    def weight_rows(self) -> tuple:
        if self._rows_q is None:
            w_nk = fp8_ops._weight_nk(self.op, self.weight)
            self._rows_q = self.spec.casts.cast(w_nk, self._amax(w_nk, 1, self.spec.k_groups))
        return self._rows_q

    def weight_columns(self) -> tuple:
        if self._columns is None:
            self._columns = fp8_ops._weight_columns(self.op, self.weight, self.spec.n_groups, *self.spec.casts)
        return self._columns

    def forward(self, x: torch.Tensor, scales: torch.Tensor | None = None) -> torch.Tensor:
        amax = self.row_scales(x, forward=True) if scales is None else scales
        x_cast = self.spec.casts.cast(_rows(x), _rows(amax))
        return fp8_ops._forward_product(x, x_cast, self.weight_rows(), self.bias, self.beta, self.alpha)

    def input_gradient(self, grad: torch.Tensor, scales: torch.Tensor | None = None) -> torch.Tensor:
        amax = self.row_scales(grad, forward=False) if scales is None else scales
        w_q, w_scale = self.weight_columns()
        g_q, g_scale = self.spec.casts.cast(_rows(grad), _rows(amax))
        out = fp8_ops._scaled_product(g_q, g_scale, w_q, w_scale, grad.dtype).reshape(*grad.shape[:-1], w_q.shape[0])
        return out * self.alpha if self.alpha != 1 else out


def _products(op, beta, alpha, weight, bias, fp8, columns: tuple | None = None) -> _Contraction:
    """The products a ring runs: the op's, or an FP8 linear's (`fp8`: runtime/fp8.py's
    Fp8Spec, the call's amax groups and whether it saves its weight's float8 columns;
    `columns`: those columns and their scales as backward kept them, in place of `weight`)."""
    if fp8 is None:
        return _Contraction(op, beta, alpha, weight, bias)
    return Fp8Products(op, beta, alpha, weight, bias, fp8, columns)


def _backward_products(ctx, kept: list) -> _Contraction:
    """Backward's products from what forward saved of the weight (_saved_weight)."""
    if len(kept) == 1:
        return _products(ctx.op, ctx.beta, ctx.alpha, kept[0], None, ctx.fp8)
    return _products(ctx.op, ctx.beta, ctx.alpha, None, None, ctx.fp8, tuple(kept))


def _saved_weight(product: _Contraction, weight: torch.Tensor, fp8) -> tuple:
    """What backward keeps of the weight: the weight, or its float8 columns and their scales
    (an FP8 linear that saves them instead of a gathered weight)."""
    if fp8 is not None and fp8.float8_weight:
        return product.weight_columns()
    return (weight,)


def _take(layout: "_Blocks", t: torch.Tensor | None, j: int) -> torch.Tensor | None:
    return None if t is None else layout.take(t, j)


class _GatherMatmul(torch.autograd.Function):
    """forward(op, ring, layout, beta, alpha, fp8, x, weight, bias) -> (the product, the
    gathered x); `layout` (_Blocks) says where the blocks lie along the gathered dim; `fp8`
    (runtime/fp8.py's Fp8Spec, or None): the products in float8."""

    @staticmethod
    def forward(ctx, op, ring, layout, beta, alpha, fp8, x, weight, bias):
        product = _products(op, beta, alpha, weight, bias, fp8)
        product.prepare(forward=True)
        outputs: list[torch.Tensor | None] = [None] * ring.n
        blocks = ring_gather(x, layout.dim, ring, lambda j, block: outputs.__setitem__(j, product.forward(block)))
        gathered = layout.join(blocks)
        traffic.count("all_gather", gathered)
        ctx.op, ctx.ring, ctx.layout, ctx.beta, ctx.alpha, ctx.fp8 = op, ring, layout, beta, alpha, fp8
        ctx.has_bias = bias is not None
        ctx.save_for_backward(gathered, *_saved_weight(product, weight, fp8))
        return layout.join(outputs), gathered

    @staticmethod
    def backward(ctx, grad, grad_gathered):
        gathered, *kept = ctx.saved_tensors
        product = _backward_products(ctx, kept)
        needs_x, needs_weight, needs_bias = ctx.needs_input_grad[6:9]
        ring, block = ctx.ring, ctx.layout.take
        grad_weight = grad_bias = grad_x = None
        # Every row of the output gradient is here: its scales (a max over the ranks that split
        # N) are taken once, before the ring.
        scales = product.row_scales(grad, forward=False) if grad is not None and needs_x else None
        if needs_x:
            product.prepare(forward=False)

        def part(j: int) -> torch.Tensor:
            # Block j's input gradient, sent on; its weight gradient beside it. The gathered
            # value's own gradient (its other readers') joins the sum.
            nonlocal grad_weight
            out = None
            if grad is not None:
                g = block(grad, j)
                if needs_weight:
                    grad_weight = _add(grad_weight, product.weight_gradient(g, block(gathered, j)))
                out = product.input_gradient(g, _take(ctx.layout, scales, j))
            return _add(out, block(grad_gathered, j)) if grad_gathered is not None else out

        if needs_x:
            grad_x = ring_reduce_scatter(ring, part)
            traffic.count("reduce_scatter", gathered)
        elif needs_weight and grad is not None:
            for j in range(ring.n):
                grad_weight = _add(grad_weight, product.weight_gradient(block(grad, j), block(gathered, j)))
        if needs_bias and ctx.has_bias and grad is not None:
            grad_bias = product.bias_gradient(grad)
        return None, None, None, None, None, None, grad_x, grad_weight, grad_bias


class _MatmulScatter(torch.autograd.Function):
    """forward(op, ring, layout, beta, alpha, fp8, x, weight, bias) -> this rank's block
    (`layout`, _Blocks) of the product summed over the ring; `fp8` as _GatherMatmul's."""

    @staticmethod
    def forward(ctx, op, ring, layout, beta, alpha, fp8, x, weight, bias):
        product = _products(op, beta, alpha, weight, bias, fp8)
        # Every row of x is here: its scales (a max over the ranks that split K) once, before the ring.
        scales = product.row_scales(x, forward=True)
        product.prepare(forward=True)
        out = ring_reduce_scatter(ring, lambda j: product.forward(layout.take(x, j), _take(layout, scales, j)))
        traffic.count("reduce_scatter", _whole(out, layout.dim, ring.n))
        ctx.op, ctx.ring, ctx.layout, ctx.beta, ctx.alpha, ctx.fp8 = op, ring, layout, beta, alpha, fp8
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, *_saved_weight(product, weight, fp8))
        return out

    @staticmethod
    def backward(ctx, grad):
        x, *kept = ctx.saved_tensors
        product = _backward_products(ctx, kept)
        needs_x, needs_weight, needs_bias = ctx.needs_input_grad[6:9]
        if needs_x:
            product.prepare(forward=False)
        ring, layout = ctx.ring, ctx.layout
        grads_x: list[torch.Tensor | None] = [None] * ring.n
        grad_weight = grad_bias = None

        def each(j: int, g: torch.Tensor) -> None:
            # Block j of the output gradient: its products while the next block travels.
            nonlocal grad_weight, grad_bias
            if needs_x:
                grads_x[j] = product.input_gradient(g)
            if needs_weight:
                grad_weight = _add(grad_weight, product.weight_gradient(g, layout.take(x, j)))
            if needs_bias and ctx.has_bias:
                grad_bias = _add(grad_bias, product.bias_gradient(g))

        ring_gather(grad, layout.dim, ring, each)
        traffic.count("all_gather", _whole(grad, layout.dim, ring.n))
        grad_x = layout.join(grads_x) if needs_x else None
        return None, None, None, None, None, None, grad_x, grad_weight, grad_bias


class CollectiveMatmul(torch.nn.Module):
    """``self.collective_matmul(kind, op, operand, forward_step, backward_step, args, kwargs)``
    in the printed rank program: the call of `op` (aten::linear, addmm, mm) whose collective
    on operand `operand` runs inside it as a ring. `kind` "gather": args hold the operand's
    local block; returns (the product, the gathered operand). "scatter": returns this rank's
    block of the reduce-scattered product. The steps are the rank IR's, by text (registered
    with the Reshard module); `backward_step` None where the operand has no gradient. An FP8
    linear's ring has an eighth argument, ``fp8``: (k axes, n axes, whether it saves its
    weight's float8 columns), the rank IR's marks (runtime/fp8.py)."""

    def __init__(self, mesh: _Mesh, steps: dict):
        super().__init__()
        self._mesh = mesh
        self._steps = steps
        self._rings: dict[int, _Ring] = {}
        self._casts = None  # an FP8 ring's casts: eager (None), or compiled (compile_inner)

    def compile_inner(self, options: dict) -> None:
        """In a compiled program (runtime/compiled.py): the ring runs eagerly, an FP8 ring's
        amaxes and casts each compiled with the program's options (fp8.Casts.compiled)."""
        self._casts = fp8_ops.Casts.compiled(options)

    def _ring(self, axis: int) -> _Ring:
        if axis not in self._rings:
            self._rings[axis] = _Ring(self._mesh.groups[axis])
        return self._rings[axis]

    def forward(self, kind: str, op: str, operand: int, forward_step: str, backward_step: str | None,
                args: tuple, kwargs: dict, fp8: tuple | None = None):
        target = _BY_NAME.get(op)
        forward = self._steps[forward_step]
        expected = {"gather": ("all_gather", "reduce_scatter"), "scatter": ("reduce_scatter", "all_gather")}[kind]
        backward = self._steps[backward_step] if backward_step is not None else None
        if target is None or forward["kind"] != expected[0] or forward["ratios"] or (
                backward is not None and (backward["kind"], backward["axis"], backward["dim"], backward["groups"]) !=
                (expected[1], forward["axis"], forward["dim"], forward["groups"])):
            raise ValidationError(f"collective_matmul: {kind} of {op} by {forward_step!r} / {backward_step!r} is "
                                  "not a ring the runtime runs")
        x, weight, bias, beta, alpha = contraction_operands(target, args, kwargs)
        if operand != (1 if target is _ADDMM else 0):
            raise ValidationError(f"collective_matmul: {op}'s operand {operand} is not its input")
        ring = self._ring(forward["axis"])
        layout = _Blocks(forward["dim"], forward["groups"], ring.n)
        if backward is None and x.requires_grad and kind == "gather":
            raise ValidationError(f"collective_matmul: {op}'s input needs a gradient but its gather has no "
                                  "backward step")
        spec = None
        if fp8 is not None:
            spec = fp8_ops.Fp8Spec.of(self._mesh, target, x, weight, *fp8, casts=self._casts or fp8_ops.EAGER_CASTS)
        function = _GatherMatmul if kind == "gather" else _MatmulScatter
        return function.apply(target, ring, layout, beta, alpha, spec, x, weight, bias)


GATHER_MARK, SCATTER_MARK = "shardwise.gather_matmul", "shardwise.matmul_scatter"  # transform/collective_matmul.h
RING_OVERLAP = "matmul"  # the overlap mark of a ring's steps


class RingEmitter:
    """The collective-matmul pass's emitter, one of runtime/lower.py's feature emitters (its
    ``FEATURES``): the lowering asks it of each operand it reads (``operand``: does this
    feature run the operand's region inside a call?) and of each call (``takes``), and lets it
    make the calls it takes (``emit``). Everything it knows it reads off the rank IR: the
    call's marks (``read.marks``) and each operand's region (its steps and their ``overlap``),
    as ``_C.rank_ir_operands`` gives them."""

    name = "collective_matmul"  # the lowering's module: root.collective_matmul

    def module(self, lowering) -> torch.nn.Module:
        return CollectiveMatmul(lowering.mesh, lowering.root.reshard._steps)

    def operand(self, lowering, read, i: int, op: dict) -> bool:
        """True where the operand's region runs inside a call: this call's ring gathers it
        (recorded in ``read.taken``), or its producer's ring gave it scattered (read as it is)."""
        if lowering.mesh is None:
            return False
        if read.marks.get(GATHER_MARK) == i:
            key = op["region"]
            if key in lowering.reshards:
                raise ValidationError(f"parallelize: the core runs the gather of '{op['value']}' inside "
                                      f"'{read.first}', but an earlier node read it gathered")
            read.taken[self.name] = (i, lowering.step_texts(op["forward"]), lowering.step_texts(op["backward"]), key)
            return True
        forward = op["forward"]
        return op.get("overlap") == RING_OVERLAP and bool(forward) and forward[0]["kind"] == "reduce_scatter"

    def takes(self, lowering, read) -> bool:
        return lowering.mesh is not None and (self.name in read.taken or SCATTER_MARK in read.marks)

    def emit(self, lowering, read, args: tuple, kwargs: dict) -> torch.fx.Node:
        """linear, addmm, mm with its operand's gather, or its output's reduce-scatter, run as a
        ring inside the call (the gather also gives the gathered operand to its other readers)."""
        op = SPLIT_OPS.get(read.target)
        if op is None:
            raise ValidationError(f"parallelize: the core runs a collective matmul in '{read.first}' ({read.target}), "
                                  f"which the runtime cannot ({', '.join(SPLIT_OPS.values())})")
        if lowering.split_backward:
            raise ValidationError(f"parallelize: '{read.first}' runs a collective matmul inside a stage whose "
                                  "backward is split (zero-bubble): the ring computes the weight gradient with the "
                                  "input's")
        if ASYNC_GRADIENT_MARK in read.marks:  # one module of the runtime's or the other, never both
            raise ValidationError(f"parallelize: the core runs a collective matmul in '{read.first}' ({read.target}) "
                                  "and its operand's gradient all-reduce beside its weight gradient; the ring would "
                                  "drop the all-reduce (transform/collective_matmul.h leaves such a call alone)")
        graph = lowering.graph
        fp8 = fp8_ops.fp8_marks(read.marks)  # an FP8 linear's products run in the ring in float8
        if self.name in read.taken:
            i, forward, backward, key = read.taken[self.name]
            ring = graph.call_module(self.name, ("gather", op, i, forward[0], backward[0] if backward else None,
                                                 tuple(args), kwargs) + fp8)
            product = graph.call_function(operator.getitem, (ring, 0))
            lowering.reshards[key] = graph.call_function(operator.getitem, (ring, 1))  # its other readers'
            return product
        region = lowering.region_read_from(read.first, RING_OVERLAP)
        forward, backward = lowering.step_texts(region["forward"]), lowering.step_texts(region["backward"])
        return graph.call_module(self.name, ("scatter", op, read.marks[SCATTER_MARK], forward[0],
                                             backward[0] if backward else None, tuple(args), kwargs) + fp8)


RING_EMITTER = RingEmitter()
