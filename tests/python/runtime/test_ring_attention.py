"""Ring attention (runtime/ring_attention.py, issue 48's context parallelism): each rank holds
its rows of the sequence, and its output rows and the gradients of its q, k, v rows equal one
device's scaled_dot_product_attention over the whole sequence in float64, on real Gloo ranks:
contiguous and zig-zag layouts, causal, a boolean padding-and-causal mask, an additive mask,
grouped-query heads, a row that sees no key, values of another head size than the keys (torch's
fused CPU kernel computes the blocks where it can, the reference path the others). No op of the
forward makes a tensor with the whole sequence's length, and autograd keeps the rank's own rows
only."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import spawn_scenario
from shardwise.runtime.ring_attention import SequenceLayout, ring_attention

B, H, D = 2, 4, 8
TOLERANCE = 1e-12


def _case(name: str, seq: int):
    """Whole q, k, v, mask and the output's gradient, the same on every rank (seeded)."""
    g = torch.Generator().manual_seed(7)
    kv_heads = 2 if name == "gqa" else H
    q = torch.randn(B, H, seq, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, kv_heads, seq, D, generator=g, dtype=torch.float64)
    e = D // 2 if name == "wide_values" else D
    v = torch.randn(B, kv_heads, seq, e, generator=g, dtype=torch.float64)
    dout = torch.randn(B, H, seq, e, generator=g, dtype=torch.float64)
    mask = None
    if name in ("padding", "empty_row"):  # causal and left padding, as transformers builds it
        keep = torch.ones(B, seq, dtype=torch.bool)
        keep[1, :3] = False
        mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool))[None, None] & keep[:, None, None, :]
        if name == "padding":  # transformers unmasks the rows that see no key; "empty_row" keeps them
            mask = mask | ~mask.any(-1, keepdim=True)
    elif name == "additive":
        mask = torch.randn(B, 1, seq, seq, generator=g, dtype=torch.float64)
    return q, k, v, dout, mask


class _Shapes(TorchDispatchMode):
    """Every op's output shapes."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append((str(func), tuple(t.shape)))
        return out


def _scenario_matches_one_device(rank: int, world: int, name: str, layout: str, seq: int):
    q, k, v, dout, mask = _case(name, seq)
    causal = name in ("causal", "gqa", "wide_values")
    gqa = name == "gqa"
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*ref, attn_mask=mask, is_causal=causal, enable_gqa=gqa)
    expected.backward(dout)

    rows = SequenceLayout(layout, seq, world)
    mine = [rows.shard(t, 2, rank).requires_grad_() for t in (q, k, v)]
    local_mask = None if mask is None else rows.shard(mask, 2, rank)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        with _Shapes() as forward_ops:
            out = ring_attention(*mine, attn_mask=local_mask, is_causal=causal, enable_gqa=gqa,
                                 group=dist.group.WORLD.group_name, layout=layout)
    out.backward(rows.shard(dout, 2, rank))

    def whole(t):
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous())
        return rows.unshard(parts, 2)

    refused = []  # a block the caller places elsewhere than the ring does
    for wrong in ({"length": seq + 2 * world}, {"first_row": rows.chunks(rank)[0][0] + 1}):
        try:
            ring_attention(*mine, enable_gqa=gqa, group=dist.group.WORLD.group_name, layout=layout, **wrong)
        except ValueError as e:
            refused.append(str(e))
    err = lambda got, want: float((got - want).abs().max() / want.abs().max())  # noqa: E731
    return {"refused": refused, "out": err(whole(out.detach()), expected.detach()),
            "grads": [err(whole(m.grad), r.grad) for m, r in zip(mine, ref)],
            "whole_length_ops": sorted({f for f, shape in forward_ops.shapes if seq in shape}),
            "saved": saved, "rows": rows.rows(rank)}


CASES = [("plain", "contiguous", 2), ("causal", "contiguous", 2), ("causal", "zigzag", 2), ("causal", "zigzag", 4),
         ("padding", "zigzag", 2), ("empty_row", "contiguous", 2), ("additive", "contiguous", 4), ("gqa", "zigzag", 2),
         ("wide_values", "zigzag", 2)]


@pytest.mark.parametrize("name,layout,world", CASES, ids=[f"{n}-{lay}-{w}" for n, lay, w in CASES])
def test_ring_attention_equals_one_device_and_holds_its_rows_only(name, layout, world):
    seq = 16
    r = spawn_scenario(__name__, world, "matches_one_device", name, layout, seq)
    assert r["out"] < TOLERANCE, r
    assert max(r["grads"]) < TOLERANCE, r
    assert r["whole_length_ops"] == [], r  # no scores, K or V over the whole sequence
    assert len(r["refused"]) == 2 and "a sequence of" in r["refused"][0] and "holds rows from" in r["refused"][1], r
    kv_heads, e = (2 if name == "gqa" else H), (D // 2 if name == "wide_values" else D)
    own = {(B, H, r["rows"], D), (B, kv_heads, r["rows"], D), (B, kv_heads, r["rows"], e), (B, H, r["rows"], e),
           (B, H, r["rows"])}
    assert r["saved"] and set(map(tuple, r["saved"])) <= own, r  # q, k, v, output, log-sum-exp


def _scenario_counts_causal_pairs(rank: int, world: int, layout: str):
    """How many (query chunk, key chunk) score blocks each rank computes under causal attention."""
    import shardwise.runtime.ring_attention as ring

    calls = []
    block = ring._Attention.block

    def counted(self, q, qc, k, v, kc):
        calls.append(qc.size * kc.size)
        return block(self, q, qc, k, v, kc)

    ring._Attention.block = counted
    q, k, v, _, _ = _case("causal", 16)
    rows = SequenceLayout(layout, 16, world)
    ring_attention(*[rows.shard(t, 2, rank) for t in (q, k, v)], is_causal=True,
                   group=dist.group.WORLD.group_name, layout=layout)
    counts = [torch.zeros(world, dtype=torch.long) for _ in range(world)]
    dist.all_gather(counts, torch.full((world,), sum(calls), dtype=torch.long))
    return [int(c[0]) for c in counts]


def test_the_zigzag_layout_gives_every_rank_the_same_causal_work():
    """Score elements computed per rank, forward, 4 ranks: the contiguous layout's grow with
    the rank (1, 2, 3, 4 blocks of 4 x 4 rows); the zig-zag layout's are equal."""
    assert spawn_scenario(__name__, 4, "counts_causal_pairs", "contiguous") == [16, 32, 48, 64]
    zigzag = spawn_scenario(__name__, 4, "counts_causal_pairs", "zigzag")
    assert len(set(zigzag)) == 1 and zigzag[0] == 9 * 2 * 2, zigzag  # 2n + 1 chunk pairs of 2 x 2 rows


def test_layouts_refuse_a_sequence_they_do_not_divide_and_round_trip():
    with pytest.raises(ValueError, match="does not split into 8 equal chunks"):
        SequenceLayout("zigzag", 12, 4)
    with pytest.raises(ValueError, match="not one of"):
        SequenceLayout("striped", 16, 2)
    x = torch.arange(24).view(1, 24)
    rows = SequenceLayout("zigzag", 24, 3)
    assert rows.chunks(0) == [(0, 4), (20, 24)] and rows.chunks(2) == [(8, 12), (12, 16)]
    assert torch.equal(rows.unshard([rows.shard(x, 1, r) for r in range(3)], 1), x)


def test_dropout_is_refused_by_name():
    q = torch.zeros(1, 1, 2, 2)
    with pytest.raises(NotImplementedError, match="dropout_p=0.1"):
        ring_attention(q, q, q, dropout_p=0.1, group="unused")
