"""Recomputation as the plan prices it: each instance of the repeated blocks (the core's
``shardwise.recompute`` mark) runs as one checkpointed segment of the rank program. Under selective
recomputation (calls marked ``shardwise.recompute_keeps``) the segment keeps the outputs of the ops the
core names (``_C.SELECTIVE_RECOMPUTE_SAVED_OPS``: a linear's mm / addmm, fused attention) and
runs the rest again: torch.utils.checkpoint's selective policy."""
from __future__ import annotations

import functools

import torch
import torch.fx
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from .. import _C


@functools.cache
def _saved_ops() -> frozenset:
    """The core's op names as the dispatcher's packets (an op this torch lacks is skipped)."""
    packets = []
    for name in _C.SELECTIVE_RECOMPUTE_SAVED_OPS:
        namespace, op = name.split("::")
        packet = getattr(getattr(torch.ops, namespace), op, None)
        if packet is not None:
            packets.append(packet)
    return frozenset(packets)


def _keep_products(ctx, func, *args, **kwargs) -> CheckpointPolicy:
    del ctx, args, kwargs
    return (CheckpointPolicy.MUST_SAVE if func.overloadpacket in _saved_ops()
            else CheckpointPolicy.PREFER_RECOMPUTE)


def _selective_contexts():
    return create_selective_checkpoint_contexts(_keep_products)


class Checkpointed(torch.nn.Module):
    """One recomputed block of a rank program: its activations are not kept for backward but
    made again there (torch.utils.checkpoint, non-reentrant; the random state restored, so a
    dropout draws the same mask), its collectives run again with it on every rank. With
    ``selective``, the outputs of the saved ops are kept from the forward and not made again."""

    def __init__(self, block: torch.nn.Module, selective: bool = False):
        super().__init__()
        self.block = block
        self.selective = selective

    def forward(self, *args):
        if not torch.is_grad_enabled():
            return self.block(*args)
        if not self.selective:  # no context_fn: dynamo traces checkpoint only with a function it can see
            return torch.utils.checkpoint.checkpoint(self.block, *args, use_reentrant=False, preserve_rng_state=True)
        return torch.utils.checkpoint.checkpoint(self.block, *args, use_reentrant=False, preserve_rng_state=True,
                                                 context_fn=_selective_contexts)


def checkpoint_blocks(module: torch.fx.GraphModule, block_of: dict, selective: frozenset = frozenset()
                      ) -> torch.fx.GraphModule:
    """`module` split into consecutive segments, each recomputed block (the core's
    ``shardwise.recompute`` mark) one segment run through Checkpointed; the blocks in ``selective``
    recompute selectively. The flat program stays readable as ``module.flat_code``."""
    from torch.fx.passes.split_module import split_module

    segment_of, segment, last = {}, 0, None
    block_of_segment = {}
    for fx_node in module.graph.nodes:
        if fx_node.op in ("placeholder", "output"):
            continue
        block = block_of.get(fx_node, -1)
        if block != last:
            segment, last = segment + 1, block
        segment_of[fx_node.name] = segment
        if block >= 0:
            block_of_segment[segment] = block
    flat_code = module.code
    split = split_module(module, module, lambda n: segment_of[n.name], keep_original_order=True)
    for segment, block in block_of_segment.items():
        name = f"submod_{segment}"
        setattr(split, name, Checkpointed(getattr(split, name), selective=block in selective))
    split.flat_code = flat_code
    return split
