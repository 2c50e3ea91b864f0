"""Bytes the runtime's collectives move on this process, counted by the calls themselves.

Two sources, one table: the ops of ``torch.ops.shardwise`` (the rank programs' all-reduce,
all-gather, reduce-scatter and all-to-all; counted in C++, csrc/torch/collectives.cc) and
the runtime's own ``torch.distributed`` calls (transport.py: gradient buckets and the loss
as all-reduce, ZeRO's parameter broadcasts, pipeline sends). Bytes are the cost model's
units (csrc/cost/collective_cost.h): an all-reduce its buffer, an all-gather the gathered
output, a reduce-scatter its input, an all-to-all each rank's buffer, a broadcast the
buffer, a send the message. Control messages (the plan's hash, step flags, the gradient
norm's scalar) are not counted.

    traffic.reset()
    engine.train_step(*batch)
    traffic.snapshot()   # {"all_reduce": {"bytes": 2.1e6, "calls": 3}, "send": {...}, ...}
"""
from __future__ import annotations

import torch

_OP_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")  # the order of shardwise::traffic
_counted: dict[str, list[int]] = {}  # this module's: kind -> [bytes, calls]


def count(kind: str, tensor: torch.Tensor) -> None:
    """One call of `kind` on `tensor` (its bytes in the cost model's units: see above)."""
    entry = _counted.setdefault(kind, [0, 0])
    entry[0] += tensor.numel() * tensor.element_size()
    entry[1] += 1


def snapshot() -> dict[str, dict[str, int]]:
    """Bytes and calls per collective kind since the last ``reset`` (kinds never called are
    left out)."""
    out: dict[str, dict[str, int]] = {}
    ops = torch.ops.shardwise.traffic()
    for i, kind in enumerate(_OP_KINDS):
        if ops[2 * i + 1]:
            out[kind] = {"bytes": int(ops[2 * i]), "calls": int(ops[2 * i + 1])}
    for kind, (nbytes, calls) in _counted.items():
        if calls:
            entry = out.setdefault(kind, {"bytes": 0, "calls": 0})
            entry["bytes"] += nbytes
            entry["calls"] += calls
    return out


def reset() -> None:
    torch.ops.shardwise.reset_traffic()
    _counted.clear()
