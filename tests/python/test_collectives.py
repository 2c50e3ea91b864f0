"""torch.ops.shardwise collectives on real Gloo processes: values and gradients against what
the ranks' inputs say they must be, a Megatron MLP against the single-device one, shapes
under FakeTensor, and errors that name the op, the group and the rank."""
from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardwise import collectives as C


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
        mp.spawn(_run, args=(world, os.path.join(tmp, "store"), check), nprocs=world, join=True)


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
    import torch.nn.functional as F

    from shardwise.runtime.lower import VocabCrossEntropy
    from shardwise.runtime.mesh import _Mesh

    kernel = VocabCrossEntropy(_Mesh([world], rank))
    start, stop = [(0, 4), (4, 8), (8, 11)][rank]
    gen = torch.Generator().manual_seed(1)
    cases = [(torch.randn(6, 11, dtype=torch.float64, generator=gen), torch.tensor([0, 3, -100, 10, 5, 7])),
             (torch.randn(2, 11, 3, dtype=torch.float64, generator=gen), torch.tensor([[1, -100, 9], [4, 8, 0]]))]
    for logits, target in cases:
        for smoothing in (0.0, 0.1):
            for reduction, name in ((0, "none"), (1, "mean"), (2, "sum")):
                whole = logits.clone().requires_grad_()
                want = F.cross_entropy(whole, target, reduction=name, label_smoothing=smoothing)
                (want_grad,) = torch.autograd.grad(want.sum(), whole)
                mine = logits[:, start:stop].clone().requires_grad_()
                got = kernel(mine, target, start, stop, 0, 11, reduction, -100, smoothing)
                (got_grad,) = torch.autograd.grad(got.sum(), mine)
                torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
                torch.testing.assert_close(got_grad, want_grad[:, start:stop], rtol=0, atol=1e-12)
    logits, target = cases[0]
    got = kernel(logits[:, start:stop].to(torch.bfloat16), target, start, stop, 0, 11, 1, -100, 0.0)
    assert got.dtype == torch.bfloat16
    want = F.cross_entropy(logits.to(torch.bfloat16).float(), target)
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=0)


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


def test_collective_traffic_is_counted_in_the_cost_models_units():
    _spawn("_traffic_is_counted_by_the_calls", 2)


def test_vocabulary_parallel_cross_entropy_equals_the_whole_one():
    _spawn("_vocabulary_parallel_cross_entropy", 3)


def test_megatron_mlp_matches_one_device():
    _spawn("_megatron_mlp_matches_one_device", 2)


def test_shapes_under_fake_tensors():
    _spawn("_shapes_under_fake_tensors", 2)


def test_errors_name_op_group_and_rank():
    _spawn("_errors_name_op_group_and_rank", 2)


def test_group_name_needs_an_initialised_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        C.group_name()
