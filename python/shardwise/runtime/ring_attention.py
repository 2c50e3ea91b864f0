"""Ring attention: scaled dot-product attention over a sequence split across a process group
(context parallelism, issue 48; Liu et al. 2023, "Ring Attention with Blockwise Transformers",
with the causal load balance of zig-zag layouts).

Each rank holds its rows of the query, key and value sequences (``[batch, heads, rows, dim]``)
and a ``SequenceLayout`` says which global positions those rows are. The key and value blocks
travel the ring (group rank i sends to i + 1 and receives from i - 1), the next block in flight
while the current one is computed. Each block's output rows and log-sum-exp (torch's fused CPU
kernel, ``_scaled_dot_product_flash_attention_for_cpu``, where it takes the block: one head
size for q, k and v; a reference path of explicit scores elsewhere) are merged by their
log-sum-exp, the merge flash attention makes within one device, so the result is
softmax(Q K^T * scale + mask) V over the whole sequence, in the compute dtype (float32 for half
operands, as the statistics kernels do). A rank holds at most two blocks of K and V, and no
block's scores whole where the fused kernel runs (the reference path: one chunk pair's);
autograd keeps the rank's own q, k, v, output and log-sum-exp. Backward gives the fused
kernel's backward the whole call's output and log-sum-exp, so each block's gradients are its
share of the whole call's.

Backward is the same ring: a block's K and V travel with the gradients accumulated for them,
and one more hop after the full turn brings each rank its own block's dK and dV. Causal
attention skips the chunk pairs whose keys all follow their queries. In the contiguous layout
rank r then computes r + 1 of its n block pairs, so rank 0 idles while rank n - 1 works; in the
zig-zag layout (2n chunks, rank r holding chunks r and 2n - 1 - r) every rank computes 2n + 1 of
its 4n chunk pairs, two of them on the diagonal.

The arguments are aten's ``scaled_dot_product_attention``'s, the mask's rows the rank's own
(its key columns whole, in global order), plus the group's name and the layout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from . import transport

_HALF = (torch.float16, torch.bfloat16)
LAYOUTS = ("contiguous", "zigzag")


class SequenceLayout:
    """Which global positions of a sequence of `length` each of `ranks` ranks holds, in the
    order of its rows: ``contiguous``, rank r rows [r L, (r + 1) L) with L = length / ranks;
    ``zigzag``, the sequence cut in 2 ranks chunks and rank r holding chunks r and
    2 ranks - 1 - r, one early and one late, so causal attention gives every rank as many
    visible keys."""

    def __init__(self, kind: str, length: int, ranks: int):
        if kind not in LAYOUTS:
            raise ValueError(f"ring attention: layout {kind!r} is not one of {', '.join(LAYOUTS)}")
        parts = ranks if kind == "contiguous" else 2 * ranks
        if ranks < 1 or length % parts:
            raise ValueError(f"ring attention: a sequence of {length} does not split into {parts} equal chunks "
                             f"({kind} over {ranks} ranks)")
        self.kind, self.length, self.ranks = kind, length, ranks
        self.chunk = length // parts

    def chunks(self, rank: int) -> list[tuple[int, int]]:
        """The rank's global [start, stop) ranges, in the order of its rows."""
        c = self.chunk
        if self.kind == "contiguous":
            return [(rank * c, (rank + 1) * c)]
        late = 2 * self.ranks - 1 - rank
        return [(rank * c, (rank + 1) * c), (late * c, (late + 1) * c)]

    def rows(self, rank: int) -> int:
        return sum(stop - start for start, stop in self.chunks(rank))

    def shard(self, whole: torch.Tensor, dim: int, rank: int) -> torch.Tensor:
        """The rank's rows of a whole sequence along `dim`."""
        return torch.cat([whole.narrow(dim, start, stop - start) for start, stop in self.chunks(rank)], dim)

    def unshard(self, parts: list[torch.Tensor], dim: int) -> torch.Tensor:
        """The whole sequence from every rank's rows (rank order)."""
        pieces = []
        for rank, part in enumerate(parts):
            offset = 0
            for start, stop in self.chunks(rank):
                pieces.append((start, part.narrow(dim, offset, stop - start)))
                offset += stop - start
        return torch.cat([p for _, p in sorted(pieces, key=lambda item: item[0])], dim)


@dataclass
class _Chunk:
    """A run of a block's rows: local rows [row, row + size), global positions [start, start + size)."""
    row: int
    start: int
    size: int


def _chunks(layout: SequenceLayout, rank: int) -> list[_Chunk]:
    out, row = [], 0
    for start, stop in layout.chunks(rank):
        out.append(_Chunk(row, start, stop - start))
        row += stop - start
    return out


class _Ring:
    """The group's ring: this rank's neighbours (global ranks) and the blocks in flight."""

    def __init__(self, group_name: str):
        self.group = c10d._resolve_process_group(group_name)
        self.size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.next = dist.get_global_rank(self.group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(self.group, (self.rank - 1) % self.size)

    def source(self, step: int) -> int:
        """The group rank whose block this rank holds after `step` hops."""
        return (self.rank - step) % self.size

    def start(self, tensor: torch.Tensor, tag: int = 0):
        """Sends `tensor` to the next rank and receives the previous rank's into a new one;
        returns it and the two works to wait on. Tensors in flight at once take distinct tags."""
        incoming = torch.empty_like(tensor)
        works = [transport.isend(tensor, self.next, group=self.group, tag=tag),
                 transport.irecv(incoming, self.prev, group=self.group, tag=tag)]
        return incoming, works


def _wait(works) -> None:
    for work in works:
        work.wait()


@dataclass
class _Attention:
    """What one call computes: the ring, the layout, causal or not, the scale, the rank's mask
    rows (key columns in global order; None: none), and the query heads per key head."""
    ring: _Ring
    layout: SequenceLayout
    causal: bool
    scale: float
    mask: torch.Tensor | None
    groups: int

    def visible(self, qc: _Chunk, kc: _Chunk) -> bool:
        """Whether any key of `kc` is visible to a query of `qc` (causal: not all after)."""
        return not (self.causal and kc.start >= qc.start + qc.size)

    def diagonal(self, qc: _Chunk, kc: _Chunk) -> bool:
        """Causal chunks that overlap the diagonal (equal chunks: the same positions)."""
        return self.causal and kc.start + kc.size - 1 > qc.start

    def mask_block(self, qc: _Chunk, kc: _Chunk) -> torch.Tensor | None:
        """The mask's rows of `qc` and columns of `kc`, or None."""
        if self.mask is None:
            return None
        m = self.mask.narrow(-1, kc.start, kc.size)
        return m.narrow(-2, qc.row, qc.size) if m.shape[-2] != 1 else m

    def fused(self, q: torch.Tensor, v: torch.Tensor, qc: _Chunk, kc: _Chunk) -> bool:
        """Whether torch's fused CPU kernel computes the block (it takes one head size for
        q, k and v, and a causal block only on the diagonal itself)."""
        aligned = not self.diagonal(qc, kc) or (qc.start == kc.start and qc.size == kc.size)
        return q.device.type == "cpu" and q.shape[-1] == v.shape[-1] and aligned

    def additive(self, m: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
        """A block of the mask as the fused kernel takes it: added to the scores, in q's dtype."""
        if m is None or m.dtype != torch.bool:
            return None if m is None else m.to(dtype)
        return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, -math.inf)

    def scores(self, q: torch.Tensor, qc: _Chunk, k: torch.Tensor, kc: _Chunk) -> torch.Tensor:
        """q chunk `qc`'s scores against k chunk `kc`, masked with -inf (the reference path)."""
        s = torch.matmul(q.narrow(-2, qc.row, qc.size), k.narrow(-2, kc.row, kc.size).transpose(-2, -1)) * self.scale
        if self.diagonal(qc, kc):
            qpos = torch.arange(qc.start, qc.start + qc.size, device=s.device)
            kpos = torch.arange(kc.start, kc.start + kc.size, device=s.device)
            s = s.masked_fill(kpos[None, :] > qpos[:, None], -math.inf)
        m = self.mask_block(qc, kc)
        if m is not None:
            s = s.masked_fill(~m, -math.inf) if m.dtype == torch.bool else s + m.to(s.dtype)
        return s

    def block(self, q, qc: _Chunk, k, v, kc: _Chunk) -> tuple[torch.Tensor, torch.Tensor]:
        """The block's output rows and their log-sum-exp (-inf where the block shows a row no key)."""
        qb, kb, vb = q.narrow(-2, qc.row, qc.size), k.narrow(-2, kc.row, kc.size), v.narrow(-2, kc.row, kc.size)
        if self.fused(q, v, qc, kc):
            m = self.mask_block(qc, kc)
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                qb, kb, vb, 0.0, self.diagonal(qc, kc), attn_mask=self.additive(m, q.dtype), scale=self.scale)
            if m is not None:  # the kernel gives a row that sees no key a log-sum-exp of 0
                seen = (m if m.dtype == torch.bool else ~torch.isneginf(m)).any(-1).expand_as(lse)
                lse = torch.where(seen, lse.to(q.dtype), -math.inf)
            return out, lse.to(q.dtype)
        s = self.scores(q, qc, k, kc)
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - _finite(lse).unsqueeze(-1))
        return torch.matmul(p, vb), lse

    def block_grads(self, q, qc: _Chunk, k, v, kc: _Chunk, out, lse, dout, delta):
        """The block's share of dq (q chunk `qc`'s rows) and of dk, dv (k chunk `kc`'s rows),
        from the whole call's output rows and log-sum-exp."""
        qb, kb, vb = q.narrow(-2, qc.row, qc.size), k.narrow(-2, kc.row, kc.size), v.narrow(-2, kc.row, kc.size)
        do = dout.narrow(-2, qc.row, qc.size)
        rows_lse = lse.narrow(-1, qc.row, qc.size)
        if self.fused(q, v, qc, kc):
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                do, qb, kb, vb, out.narrow(-2, qc.row, qc.size).contiguous(), _finite(rows_lse).contiguous(), 0.0,
                self.diagonal(qc, kc), attn_mask=self.additive(self.mask_block(qc, kc), q.dtype), scale=self.scale)
        s = self.scores(q, qc, k, kc)
        p = torch.where(torch.isneginf(rows_lse).unsqueeze(-1), 0, torch.exp(s - _finite(rows_lse).unsqueeze(-1)))
        dp = torch.matmul(do, vb.transpose(-2, -1))
        ds = p * (dp - delta.narrow(-1, qc.row, qc.size).unsqueeze(-1)) * self.scale
        return torch.matmul(ds, kb), torch.matmul(ds.transpose(-2, -1), qb), torch.matmul(p.transpose(-2, -1), do)

    def expand(self, kv: torch.Tensor) -> torch.Tensor:
        """Key or value heads repeated for their query heads (grouped-query attention)."""
        return kv if self.groups == 1 else kv.repeat_interleave(self.groups, dim=1)

    def fold(self, grad: torch.Tensor) -> torch.Tensor:
        """A repeated key or value head's gradient summed back to its head."""
        if self.groups == 1:
            return grad
        b, h, n, d = grad.shape
        return grad.view(b, h // self.groups, self.groups, n, d).sum(2)


def _finite(m: torch.Tensor) -> torch.Tensor:
    """A max or log-sum-exp with the rows that see no key (-inf) at 0, so exp(s - m) is 0, not NaN."""
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


class _Rows:
    """One query chunk's output rows and log-sum-exp over the blocks merged so far."""

    def __init__(self):
        self.out: torch.Tensor | None = None
        self.lse: torch.Tensor | None = None

    def add(self, out: torch.Tensor, lse: torch.Tensor) -> None:
        if self.out is None:
            self.out, self.lse = out, lse
            return
        total = torch.logaddexp(self.lse, lse)
        shift = _finite(total)
        self.out = self.out * torch.exp(self.lse - shift).unsqueeze(-1) + out * torch.exp(lse - shift).unsqueeze(-1)
        self.lse = total

    def result(self, like: torch.Tensor, qc: _Chunk, dv: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The output rows (0 where no key is visible, as torch's kernels give) and their log-sum-exp."""
        if self.out is None:  # no block had a visible key (not under a causal layout)
            shape = like.shape[:-2] + (qc.size,)
            return like.new_zeros(shape + (dv,)), like.new_full(shape, -math.inf)
        return torch.where(torch.isneginf(self.lse).unsqueeze(-1), 0, self.out), self.lse


def _forward(a: _Attention, q, k, v):
    qchunks = _chunks(a.layout, a.ring.rank)
    rows = [_Rows() for _ in qchunks]
    kv = torch.cat([k.flatten(), v.flatten()])
    for step in range(a.ring.size):
        works = []
        if step + 1 < a.ring.size:
            incoming, works = a.ring.start(kv)
        kb, vb = a.expand(kv[:k.numel()].view_as(k)), a.expand(kv[k.numel():].view_as(v))
        for kc in _chunks(a.layout, a.ring.source(step)):
            for qc, r in zip(qchunks, rows):
                if a.visible(qc, kc):
                    r.add(*a.block(q, qc, kb, vb, kc))
        _wait(works)
        if works:
            kv = incoming
    results = [r.result(q, qc, v.shape[-1]) for r, qc in zip(rows, qchunks)]
    return torch.cat([o for o, _ in results], -2), torch.cat([lse for _, lse in results], -1)


def _backward(a: _Attention, q, k, v, out, lse, dout):
    qchunks = _chunks(a.layout, a.ring.rank)
    delta = (dout * out).sum(-1)
    dq = torch.zeros_like(q)
    kv = torch.cat([k.flatten(), v.flatten()])
    grads = torch.zeros_like(kv)  # the travelling block's dK and dV
    nk = k.numel()
    for step in range(a.ring.size):
        kb, vb = a.expand(kv[:nk].view_as(k)), a.expand(kv[nk:].view_as(v))
        dk, dv = torch.zeros_like(kb), torch.zeros_like(vb)
        for kc in _chunks(a.layout, a.ring.source(step)):
            for qc in qchunks:
                if not a.visible(qc, kc):
                    continue
                dq_b, dk_b, dv_b = a.block_grads(q, qc, kb, vb, kc, out, lse, dout, delta)
                dq.narrow(-2, qc.row, qc.size).add_(dq_b)
                dk.narrow(-2, kc.row, kc.size).add_(dk_b)
                dv.narrow(-2, kc.row, kc.size).add_(dv_b)
        grads = grads + torch.cat([a.fold(dk).flatten(), a.fold(dv).flatten()])
        if a.ring.size == 1:
            break
        # The block and its gradients hop on; after the last block only the gradients do,
        # to the rank that holds the block.
        if step + 1 < a.ring.size:
            (kv, grads), works = _hop(a.ring, kv, grads)
        else:
            (grads,), works = _hop(a.ring, grads)
        _wait(works)
    return dq, grads[:nk].view_as(k), grads[nk:].view_as(v)


def _hop(ring: _Ring, *tensors):
    received, works = [], []
    for tag, t in enumerate(tensors):
        incoming, w = ring.start(t.contiguous(), tag)
        received.append(incoming)
        works += w
    return tuple(received), works


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, a: _Attention):
        out, lse = _forward(a, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.attention = a
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(ctx.attention, q, k, v, out, lse, dout.contiguous())
        return dq, dk, dv, None


def ring_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False, scale=None,
                   enable_gqa: bool = False, *, group: str, layout: str = "contiguous",
                   first_row: int | None = None, length: int | None = None) -> torch.Tensor:
    """``scaled_dot_product_attention`` of this rank's query rows over the whole sequence, whose
    rows the ranks of `group` (a process group's name) hold as `layout` says. Every rank calls
    it with its own rows of query, key and value (and of the mask: its key columns whole).
    `first_row` and `length` (the whole sequence's), where the caller knows them, are checked
    against the ring's layout."""
    if dropout_p:
        raise NotImplementedError(f"ring attention: dropout_p={dropout_p} (its draws would differ from one device's); "
                                  "the rewrite keeps such an attention's sequence whole")
    if is_causal and attn_mask is not None:
        raise ValueError("ring attention: is_causal with an attn_mask (scaled_dot_product_attention takes one)")
    heads, kv_heads = query.shape[-3], key.shape[-3]
    if heads != kv_heads and (not enable_gqa or heads % kv_heads):
        raise ValueError(f"ring attention: {heads} query heads against {kv_heads} key heads "
                         f"({'they do not divide' if enable_gqa else 'enable_gqa is false'})")
    ring = _Ring(group)
    rows = query.shape[-2]
    seq = SequenceLayout(layout, rows * ring.size, ring.size)
    if length is not None and length != seq.length:
        raise ValueError(f"ring attention: {ring.size} ranks of {rows} rows hold {seq.length} of a sequence of {length}: "
                         "a ring splits it in equal blocks, one a rank")
    if first_row is not None and seq.chunks(ring.rank)[0][0] != first_row:
        raise ValueError(f"ring attention: rank {ring.rank} of the ring holds rows from {first_row}, where the "
                         f"{layout} layout puts {seq.chunks(ring.rank)[0][0]}")
    if key.shape[-2] != rows or value.shape[-2] != rows:
        raise ValueError(f"ring attention: query, key and value hold {rows}, {key.shape[-2]} and "
                         f"{value.shape[-2]} rows: a ring splits one sequence alike")
    dtype = torch.float32 if query.dtype in _HALF else query.dtype
    mask = attn_mask if attn_mask is None or attn_mask.dtype == torch.bool else attn_mask.to(dtype)
    if mask is not None and mask.shape[-1] != seq.length:
        raise ValueError(f"ring attention: the mask has {mask.shape[-1]} key columns, the sequence {seq.length}")
    a = _Attention(ring, seq, bool(is_causal), 1 / math.sqrt(query.shape[-1]) if scale is None else scale,
                   mask, heads // kv_heads)
    out = _RingAttention.apply(query.to(dtype), key.to(dtype), value.to(dtype), a)
    return out.to(query.dtype)
