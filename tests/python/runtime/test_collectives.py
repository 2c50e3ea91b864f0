"""torch.ops.shardwise collectives on real Gloo processes: values and gradients against what
the ranks' inputs say they must be, a Megatron MLP against the single-device one, shapes
under FakeTensor, and errors that name the op, the group and the rank."""
from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist

from shardwise import collectives as C

from conftest import run_ranks


def _run(rank: int, world: int, store_path: str, check: str) -> None:
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        globals()[check](rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(check: str, world: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_ranks(_run, args=(world, os.path.join(tmp, "store"), check), nprocs=world)


def _input(rank: int, shape) -> torch.Tensor:
    """Rank-dependent values every rank can compute for every other rank."""
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64).reshape(shape) + 100.0 * rank).requires_grad_()


def _values_and_gradients(rank: int, world: int) -> None:
    shape = (2, 2 * world, 3)
    xs = [_input(r, shape).detach() for r in range(world)]
    weight = torch.linspace(-1, 1, 2 * 2 * world * world * 3, dtype=torch.float64)

    # all_gather along dim 1; backward reduce-scatters the (replicated) loss gradient.
    x = _input(rank, shape)
    y = C.all_gather(x, dim=1)
    assert torch.equal(y, torch.cat(xs, dim=1))
    w = weight[: y.numel()].reshape(y.shape)
    (y * w).sum().backward()
    assert torch.allclose(x.grad, world * w.chunk(world, dim=1)[rank])

    # reduce_scatter along dim 1: rank r keeps chunk r of the sum; backward all-gathers.
    x = _input(rank, shape)
    y = C.reduce_scatter(x, dim=1)
    assert torch.allclose(y, sum(xs).chunk(world, dim=1)[rank])
    grads = [weight[: y.numel()].reshape(y.shape) * (r + 1) for r in range(world)]
    (y * grads[rank]).sum().backward()
    assert torch.allclose(x.grad, torch.cat(grads, dim=1))

    # all_reduce (Megatron's g): the sum forward, the identity backward.
    x = _input(rank, shape)
    y = C.all_reduce(x)
    assert torch.allclose(y, sum(xs))
    (y * 3).sum().backward()
    assert torch.allclose(x.grad, torch.full(shape, 3.0, dtype=torch.float64))
    assert torch.allclose(C.all_reduce(x.detach(), "avg"), sum(xs) / world)
    assert torch.equal(C.all_reduce(x.detach(), "max"), xs[-1])

    # copy_to_group (Megatron's f): identity forward, the gradients' sum backward.
    x = _input(rank, shape)
    y = C.copy_to_group(x)
    assert torch.equal(y, x)
    (y * (rank + 1)).sum().backward()
    assert torch.allclose(x.grad, torch.full(shape, world * (world + 1) / 2, dtype=torch.float64))

    # all_to_all: split dim 1 into world chunks, chunk j to rank j, concatenated along dim 0.
    x = _input(rank, shape)
    y = C.all_to_all(x, split_dim=1, concat_dim=0)
    assert torch.equal(y, torch.cat([xs[j].chunk(world, dim=1)[rank] for j in range(world)], dim=0))
    grads = [weight[: y.numel()].reshape(y.shape) * (r + 1) for r in range(world)]
    (y * grads[rank]).sum().backward()
    # x's chunk j went to rank j as that rank's rows [rank * 2, rank * 2 + 2).
    expect = torch.cat([grads[j][2 * rank:2 * rank + 2] for j in range(world)], dim=1)
    assert torch.allclose(x.grad, expect)


def _complex_values(rank: int, world: int) -> None:
    # A complex tensor (torchtitan's RoPE table, complex64) crosses as its real view: Gloo has no
    # complex type, and shardwise.all_gather of one failed with "Invalid scalar type".
    def z(r):
        real = _input(r, (2, 2 * world, 3)).detach()
        return torch.complex(real, -real / 7).to(torch.complex64)

    zs = [z(r) for r in range(world)]
    assert torch.equal(C.all_gather(z(rank), dim=-2), torch.cat(zs, dim=-2))
    assert torch.allclose(C.all_reduce(z(rank)), sum(zs))
    assert torch.allclose(C.all_reduce(z(rank), "avg"), sum(zs) / world)
    assert torch.allclose(C.reduce_scatter(z(rank), dim=1), sum(zs).chunk(world, dim=1)[rank])
    assert torch.equal(C.all_to_all(z(rank), split_dim=1, concat_dim=0),
                       torch.cat([zs[j].chunk(world, dim=1)[rank] for j in range(world)], dim=0))
    assert torch.equal(C.all_gather(z(rank).conj(), dim=0), torch.cat([x.conj() for x in zs], dim=0))
    with pytest.raises(ValueError, match="complex tensor"):
        C.all_reduce(z(rank), "max")


def _every_dim_and_layout(rank: int, world: int) -> None:
    # The kernels gather flat and reduce-scatter rows of [world, chunk...]: each dim of a 3-D
    # tensor, negative dims, and inputs that are not contiguous (a transpose, a strided slice).
    shape = (2 * world, 3 * world, 4 * world)
    xs = [_input(r, shape).detach() for r in range(world)]
    layouts = {"contiguous": lambda t: t, "transposed": lambda t: t.transpose(0, 2),
               "strided": lambda t: t[:, :, ::2]}
    for layout, view in layouts.items():
        views = [view(x) for x in xs]
        for dim in (0, 1, 2, -1):
            got = C.all_gather(views[rank], dim=dim)
            assert torch.equal(got, torch.cat(views, dim=dim)), (layout, dim)
            got = C.reduce_scatter(views[rank], dim=dim)
            assert torch.equal(got, sum(views).chunk(world, dim=dim)[rank]), (layout, dim)
            assert got.is_contiguous(), (layout, dim)


def _megatron_mlp_matches_one_device(rank: int, world: int) -> None:
    torch.manual_seed(1)
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    up = torch.randn(8, 4 * world, dtype=torch.float64)
    down = torch.randn(4 * world, 8, dtype=torch.float64)
    reference = (torch.tanh(x @ up) @ down).square().sum()
    reference.backward()
    ref_x = x.grad.clone()

    # Column-parallel up projection (f before it), row-parallel down projection (g after).
    up_r = up.chunk(world, dim=1)[rank].clone().requires_grad_()
    down_r = down.chunk(world, dim=0)[rank].clone().requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    h = torch.tanh(C.copy_to_group(x2) @ up_r)
    loss = C.all_reduce(h @ down_r).square().sum()
    loss.backward()
    assert torch.allclose(loss, reference)
    assert torch.allclose(x2.grad, ref_x)
    up.requires_grad_()
    down.requires_grad_()
    (torch.tanh(x.detach() @ up) @ down).square().sum().backward()
    assert torch.allclose(up_r.grad, up.grad.chunk(world, dim=1)[rank])
    assert torch.allclose(down_r.grad, down.grad.chunk(world, dim=0)[rank])

    # Sequence parallel around it: tokens split over ranks, gathered before, scattered after.
    tokens = x.detach().chunk(world, dim=0)[rank].clone().requires_grad_()
    h = torch.tanh(C.all_gather(tokens, dim=0) @ up_r.detach())
    out = C.reduce_scatter(h @ down_r.detach(), dim=0)
    total = C.all_reduce(out.square().sum())
    assert torch.allclose(total, reference)


def _shapes_under_fake_tensors(rank: int, world: int) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 4 * world, 3)
        assert C.all_gather(x, dim=-1).shape == (2, 4 * world, 3 * world)
        assert C.reduce_scatter(x, dim=1).shape == (2, 4, 3)
        assert C.all_to_all(x, split_dim=1, concat_dim=0).shape == (2 * world, 4, 3)
        assert C.all_reduce(x).shape == x.shape
    for op, args in [(torch.ops.shardwise.all_gather, (torch.randn(2, 3, requires_grad=True), 1)),
                     (torch.ops.shardwise.reduce_scatter, (torch.randn(2 * world, 3, requires_grad=True), 0))]:
        torch.library.opcheck(op, args + (C.group_name(),), test_utils=("test_schema", "test_faketensor"))


def _errors_name_op_group_and_rank(rank: int, world: int) -> None:
    name = C.group_name()
    x = torch.randn(3, 5)
    with pytest.raises(ValueError, match=rf"reduce_scatter on group '{name}' \(rank {rank}\): dim 1 of size 5 does not split"):
        C.reduce_scatter(x, dim=1)
    with pytest.raises(ValueError, match=r"all_gather .*dim 4 out of range"):
        C.all_gather(x, dim=4)
    with pytest.raises(ValueError, match=r"reduce_op 'prod'"):
        C.all_reduce(x, "prod")
    with pytest.raises(ValueError, match=r"no process group named 'nope'"):
        C.all_reduce(x, group="nope")


@pytest.mark.parametrize("world", [2, 4])
def test_values_and_gradients(world):
    _spawn("_values_and_gradients", world)


def _vocabulary_parallel_cross_entropy(rank: int, world: int) -> None:
    # 11 classes on 3 ranks, cut unevenly (4, 4, 3); one ignored target. Each rank's loss is
    # the whole loss and its gradient the whole gradient's columns, for every reduction, with
    # and without label smoothing, for [N, C] and [N, C, d] logits; bf16 logits within bf16.
    # nll_loss over split classes likewise.
    import torch.nn.functional as F

    from shardwise.runtime.kernels import StatisticsKernels
    from shardwise.runtime.mesh import _Mesh

    kernels = StatisticsKernels(_Mesh([world], rank))
    start, stop = [(0, 4), (4, 8), (8, 11)][rank]
    gen = torch.Generator().manual_seed(1)
    cases = [(torch.randn(6, 11, dtype=torch.float64, generator=gen), torch.tensor([0, 3, -100, 10, 5, 7])),
             (torch.randn(2, 11, 3, dtype=torch.float64, generator=gen), torch.tensor([[1, -100, 9], [4, 8, 0]]))]

    def kernel(name, logits, *args):
        return kernels(name, 0, 1 if logits.dim() > 1 else 0, 11, start, stop, (logits,) + args, {})

    for logits, target in cases:
        for smoothing in (0.0, 0.1):
            for reduction, name in ((0, "none"), (1, "mean"), (2, "sum")):
                whole = logits.clone().requires_grad_()
                want = F.cross_entropy(whole, target, reduction=name, label_smoothing=smoothing)
                (want_grad,) = torch.autograd.grad(want.sum(), whole)
                mine = logits[:, start:stop].clone().requires_grad_()
                got = kernel("shardwise::vocab_cross_entropy", mine, target, None, reduction, -100, smoothing)
                (got_grad,) = torch.autograd.grad(got.sum(), mine)
                torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
                torch.testing.assert_close(got_grad, want_grad[:, start:stop], rtol=0, atol=1e-12)
        for reduction, name in ((0, "none"), (1, "mean"), (2, "sum")):
            whole = logits.clone().requires_grad_()
            want = F.nll_loss(whole, target, reduction=name)
            (want_grad,) = torch.autograd.grad(want.sum(), whole)
            mine = logits[:, start:stop].clone().requires_grad_()
            got = kernel("shardwise::vocab_nll_loss", mine, target, None, reduction, -100)
            (got_grad,) = torch.autograd.grad(got.sum(), mine)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
            torch.testing.assert_close(got_grad, want_grad[:, start:stop], rtol=0, atol=1e-12)
    # What the loss keeps for its backward: one tensor of the rank's logits' size (the shifted
    # exponentials), as aten's cross_entropy keeps its log-softmax and the cost model prices it
    # (analysis/saved_for_backward.h). Picking the target logit with gather kept a second one.
    logits, target = cases[0]
    mine = logits[:, start:stop].clone().requires_grad_()
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        kernel("shardwise::vocab_cross_entropy", mine, target, None, 1, -100, 0.0)
    assert sorted(n for n in saved.values() if n >= mine.numel()) == [mine.numel()], saved
    got = kernel("shardwise::vocab_cross_entropy", logits[:, start:stop].to(torch.bfloat16), target)
    assert got.dtype == torch.bfloat16
    want = F.cross_entropy(logits.to(torch.bfloat16).float(), target)
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=0)
    with pytest.raises(NotImplementedError, match="no distributed kernel 'shardwise::nope'"):
        kernels("shardwise::nope", 0, 1, 11, start, stop, (logits,), {})


def _split_statistics_kernels(rank: int, world: int) -> None:
    # Softmax, log-softmax, layer norm and RMS norm over a split last dim (13 on 3 ranks: 5, 4,
    # 4), and training batch norm over a split batch (7 rows: 3, 2, 2) and over a split spatial
    # dim: each rank's output is the whole op's block, and the gradients of the operand, the
    # weight and the bias are the whole op's (blocks where the parameter is split with the
    # dim, else whole). Float64 within 1e-12; bf16 within bf16's precision.
    import torch.nn.functional as F

    from shardwise.runtime.kernels import StatisticsKernels
    from shardwise.runtime.mesh import _Mesh

    kernels = StatisticsKernels(_Mesh([world], rank))

    def block(size):
        sizes = [size // world + (1 if r < size % world else 0) for r in range(world)]
        lo = sum(sizes[:rank])
        return lo, lo + sizes[rank]

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 6, 13, dtype=torch.float64, generator=gen) * 3 + 1
    w = torch.randn(13, dtype=torch.float64, generator=gen)
    b = torch.randn(13, dtype=torch.float64, generator=gen)
    lo, hi = block(13)
    upstream = torch.randn(4, 6, 13, dtype=torch.float64, generator=gen)
    cases = [  # (kernel, the whole op on (x, w, b), its arguments after x given (w, b), split params)
        ("shardwise::split_softmax", lambda x, w, b: F.softmax(x, -1), lambda w, b: (-1, None), False),
        ("shardwise::split_log_softmax", lambda x, w, b: torch.log_softmax(x, 2), lambda w, b: (2, None), False),
        ("shardwise::split_layer_norm", lambda x, w, b: F.layer_norm(x, [13], w, b, 1e-5),
         lambda w, b: ([13], w, b, 1e-5, True), True),
        ("shardwise::split_rms_norm", lambda x, w, b: F.rms_norm(x, [13], w, 1e-6), lambda w, b: ([13], w, 1e-6), True),
        ("shardwise::split_rms_norm", lambda x, w, b: F.rms_norm(x, [13], w), lambda w, b: ([13], w, None), True),
    ]
    for name, whole_op, arguments, split_params in cases:
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
        want = whole_op(xs, ws, bs)
        want_grads = torch.autograd.grad((want * upstream).sum(), (xs, ws, bs), allow_unused=True)
        xm = x[..., lo:hi].clone().requires_grad_()
        wm, bm = (t[lo:hi].clone().requires_grad_() for t in (w, b))
        got = kernels(name, 0, 2, 13, lo, hi, (xm,) + arguments(wm, bm), {})
        got_grads = torch.autograd.grad((got * upstream[..., lo:hi]).sum(), (xm, wm, bm), allow_unused=True)
        torch.testing.assert_close(got, want[..., lo:hi], rtol=0, atol=1e-12, msg=name)
        torch.testing.assert_close(got_grads[0], want_grads[0][..., lo:hi], rtol=0, atol=1e-12, msg=name)
        for got_g, want_g in zip(got_grads[1:], want_grads[1:]):
            assert (got_g is None) == (want_g is None), name
            if got_g is not None and split_params:
                torch.testing.assert_close(got_g, want_g[lo:hi], rtol=0, atol=1e-12, msg=name)
        # bf16 operands: combined in float32, returned in bf16
        got = kernels(name, 0, 2, 13, lo, hi, (x[..., lo:hi].to(torch.bfloat16),) + arguments(
            w[lo:hi].to(torch.bfloat16), b[lo:hi].to(torch.bfloat16)), {})
        want = whole_op(x.to(torch.bfloat16), w.to(torch.bfloat16), b.to(torch.bfloat16))
        assert got.dtype == want.dtype == torch.bfloat16, name
        torch.testing.assert_close(got.double(), want[..., lo:hi].double(), rtol=2e-2, atol=2e-2, msg=name)

    # Training batch norm, [N, C, H, W] split over N (dim 0) or H (dim 2); running statistics too.
    images = torch.randn(7, 3, 5, 4, dtype=torch.float64, generator=gen) * 2 - 1
    gamma, beta = torch.randn(3, dtype=torch.float64, generator=gen), torch.randn(3, dtype=torch.float64, generator=gen)
    grad_out = torch.randn(7, 3, 5, 4, dtype=torch.float64, generator=gen)
    for dim, size in ((0, 7), (2, 5)):
        lo, hi = block(size)
        index = [slice(None)] * 4
        index[dim] = slice(lo, hi)
        index = tuple(index)
        xs, gs, bs = (t.clone().requires_grad_() for t in (images, gamma, beta))
        mean, var = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
        want = F.batch_norm(xs, mean, var, gs, bs, training=True, momentum=0.1, eps=1e-5)
        want_grads = torch.autograd.grad((want * grad_out).sum(), (xs, gs, bs))
        xm = images[index].clone().requires_grad_()
        gm, bm = (t.clone().requires_grad_() for t in (gamma, beta))
        my_mean, my_var = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
        got = kernels("shardwise::sync_batch_norm", 0, dim, size, lo, hi,
                      (xm, gm, bm, my_mean, my_var, True, 0.1, 1e-5, False), {})
        # gamma's and beta's gradients are each rank's part: their sum over ranks is the whole
        got_grads = torch.autograd.grad((got * grad_out[index]).sum(), (xm, gm, bm))
        torch.testing.assert_close(got, want[index], rtol=0, atol=1e-12)
        torch.testing.assert_close(got_grads[0], want_grads[0][index], rtol=0, atol=1e-12)
        for got_g, want_g in zip(got_grads[1:], want_grads[1:]):
            total = C.all_reduce(got_g.contiguous())
            torch.testing.assert_close(total, want_g, rtol=0, atol=1e-12)
        torch.testing.assert_close(my_mean, mean, rtol=0, atol=1e-14)
        torch.testing.assert_close(my_var, var, rtol=0, atol=1e-14)


def _traffic_is_counted_by_the_calls(rank: int, world: int) -> None:
    from shardwise.runtime import traffic, transport

    x = torch.zeros(4 * world, 3, dtype=torch.float64)  # 96 * world bytes
    traffic.reset()
    C.all_reduce(x)
    C.all_gather(x, dim=0)       # the gathered output: world x the input
    C.reduce_scatter(x, dim=0)   # the input
    C.all_to_all(x, 0, 1)        # each rank's buffer
    transport.all_reduce(x.clone())
    transport.broadcast(x.clone(), src=0)
    if rank == 0:
        transport.isend(x.clone(), dst=1).wait()
    elif rank == 1:
        transport.recv(x.clone(), src=0)
    got = traffic.snapshot()
    n = x.numel() * x.element_size()
    want = {"all_reduce": {"bytes": 2 * n, "calls": 2}, "all_gather": {"bytes": world * n, "calls": 1},
            "reduce_scatter": {"bytes": n, "calls": 1}, "all_to_all": {"bytes": n, "calls": 1},
            "broadcast": {"bytes": n, "calls": 1}}
    if rank == 0:
        want["send"] = {"bytes": n, "calls": 1}  # a receive is its sender's send
    assert got == want, (rank, got)
    traffic.reset()
    assert traffic.snapshot() == {}


@pytest.mark.parametrize("world", [2, 3])
def test_gather_and_scatter_along_every_dim_of_any_layout(world):
    _spawn("_every_dim_and_layout", world)


def test_complex_tensors_cross_as_their_real_view():
    _spawn("_complex_values", 2)


def test_collective_traffic_is_counted_in_the_cost_models_units():
    _spawn("_traffic_is_counted_by_the_calls", 2)


def test_vocabulary_parallel_cross_entropy_equals_the_whole_one():
    _spawn("_vocabulary_parallel_cross_entropy", 3)


def test_split_softmax_norm_and_batch_norm_kernels_equal_the_whole_ops():
    _spawn("_split_statistics_kernels", 3)


def test_megatron_mlp_matches_one_device():
    _spawn("_megatron_mlp_matches_one_device", 2)


def test_shapes_under_fake_tensors():
    _spawn("_shapes_under_fake_tensors", 2)


def test_errors_name_op_group_and_rank():
    _spawn("_errors_name_op_group_and_rank", 2)


def test_group_name_needs_an_initialised_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        C.group_name()
