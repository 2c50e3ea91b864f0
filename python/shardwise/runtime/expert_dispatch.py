"""Expert parallelism by all-to-all: a mixture of experts' tokens sent to their experts' ranks.

A rank holds a block of a layer's tokens and a block of its experts (the strategy
``dispatch t`` of ``shardwise_moe::experts``: csrc/search/strategy.h, Strategy::dispatch).
Each of its routed rows (a token and one of its top-k experts) goes to the rank of the group
that holds that expert; that rank computes it with its own expert's weights, scaled by the
row's routing weight, and sends the result back, where the rows of one token are summed into
its output. Dropless: every routed row is computed, as on one device (python/shardwise/
_moe_experts.py computes the same sum expert by expert). Backward is the same exchange
reversed, through autograd: each all-to-all's gradient is the all-to-all back.

A row whose expert no rank of the group holds contributes nothing here: where another mesh
axis also splits the experts, the group holds one block of them, and the rows of the other
blocks are the other groups' part of the output's partial sum (the strategy says so).

The per-rank counts travel first (one all-to-all of one integer per rank), then the rows, their
expert ids and routing weights, then the results back: Gloo and NCCL both take uneven splits.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.nn.functional as F

from . import transport


class _AllToAll(torch.autograd.Function):
    """Rows to ranks (``send[r]`` to rank r, ``recv[r]`` from it); the gradient goes back."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, send: list[int], recv: list[int], group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _exchange(rows, send, recv, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _exchange(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def _exchange(rows: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    out = rows.new_empty((sum(recv),) + tuple(rows.shape[1:]))
    transport.all_to_all(out, rows.contiguous(), recv, send, group=group)
    return out


def _owners(expert_ids: torch.Tensor, group, device) -> tuple[torch.Tensor, int]:
    """The group rank holding each expert id (-1: none of the group), from every rank's block
    (its first id and count: the rewrite gives each rank a contiguous block of the arange)."""
    size = dist.get_world_size(group)
    first = int(expert_ids[0]) if expert_ids.numel() else 0
    # On the tokens' device: NCCL takes no host tensor.
    mine = torch.tensor([first, expert_ids.numel()], dtype=torch.int64, device=device)
    blocks = torch.empty(2 * size, dtype=torch.int64, device=device)
    transport.all_gather(blocks, mine, group=group)
    blocks = blocks.view(size, 2).tolist()
    end = max(f + n for f, n in blocks)
    owner = torch.full((end,), -1, dtype=torch.int64, device=device)
    for r, (f, n) in enumerate(blocks):
        owner[f:f + n] = r
    return owner, first


def experts_all_to_all(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, expert_ids, act: str, *,
                       group: str) -> torch.Tensor:
    """The experts' sum for this rank's tokens `hidden` [t, H], its experts (`expert_ids`, with
    their stacked weights) computing every group rank's rows routed to them (the module's
    docstring). `group`: the process group's name."""
    from .._moe_experts import _activation

    pg = c10d._resolve_process_group(group)
    size = dist.get_world_size(pg)
    owner, first = _owners(expert_ids, pg, hidden.device)
    tokens, top_k = top_k_index.shape
    flat = top_k_index.reshape(-1)
    held = flat < owner.numel()
    dest = torch.where(held, owner[flat.clamp(max=owner.numel() - 1)], torch.full_like(flat, -1))
    # This rank's routed rows in destination order (rows of no rank of the group left out).
    order = torch.argsort(torch.where(dest < 0, torch.full_like(dest, size), dest), stable=True)
    order = order[: int((dest >= 0).sum())]
    send_counts = torch.bincount(dest[order], minlength=size)
    recv_counts = torch.empty_like(send_counts)
    transport.all_to_all(recv_counts, send_counts, [1] * size, [1] * size, group=pg)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    token = order // top_k
    ids = _exchange(flat[order], send, recv, pg)
    # The rows and their routing weights travel as one tensor through one all-to-all each
    # way, so that every rank runs the same collectives in the same order in backward too
    # (two exchanges with gradients could run in either order on different ranks). A float32
    # weight is exact in the hidden state's float64 (and its gradient cast back to float32 as
    # the one-device product's is); a half-precision model's weights travel in float32.
    dtype = torch.promote_types(hidden.dtype, top_k_weights.dtype)
    packed = torch.cat([hidden[token].to(dtype), top_k_weights.reshape(-1)[order].to(dtype).unsqueeze(1)], dim=1)
    received = _AllToAll.apply(packed, send, recv, pg)
    rows, weights = received[:, :-1].to(hidden.dtype), received[:, -1].to(top_k_weights.dtype)
    fn = _activation(act)
    done = torch.zeros_like(rows)
    for j in range(expert_ids.numel()):
        at = torch.nonzero(ids == first + j).squeeze(1)
        if at.numel() == 0:
            continue
        gate, up = F.linear(rows[at], gate_up_proj[j]).chunk(2, dim=-1)
        routed = F.linear(fn(gate) * up, down_proj[j]) * weights[at, None]
        done = done.index_add(0, at, routed.to(done.dtype))
    # Every input of the exchange and every local weight in the graph, so that a rank whose
    # experts no row reached still runs the backward's all-to-all (the other ranks wait on
    # it) and has its weights' gradients (zeros), as the one-device op's backward gives.
    done = done + (received[:0].sum() + gate_up_proj[:0].sum() + down_proj[:0].sum()).to(done.dtype)
    back = _AllToAll.apply(done, recv, send, pg)
    return torch.zeros_like(hidden).index_add(0, token, back.to(hidden.dtype))
