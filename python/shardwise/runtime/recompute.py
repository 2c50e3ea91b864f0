"""Recomputation as the plan prices it: each instance of the repeated blocks (the core's
``recompute_block``) runs as one checkpointed segment of the rank program."""
from __future__ import annotations

import torch
import torch.fx


class Checkpointed(torch.nn.Module):
    """One recomputed block of a rank program: its activations are not kept for backward but
    made again there (torch.utils.checkpoint, non-reentrant; the random state restored, so a
    dropout draws the same mask), its collectives run again with it on every rank."""

    def __init__(self, block: torch.nn.Module):
        super().__init__()
        self.block = block

    def forward(self, *args):
        if not torch.is_grad_enabled():
            return self.block(*args)
        return torch.utils.checkpoint.checkpoint(self.block, *args, use_reentrant=False, preserve_rng_state=True)


def checkpoint_blocks(module: torch.fx.GraphModule, block_of: dict) -> torch.fx.GraphModule:
    """`module` split into consecutive segments, each recomputed block (the core's
    ``recompute_block``) one segment run through Checkpointed. The flat program stays
    readable as ``module.flat_code``."""
    from torch.fx.passes.split_module import split_module

    segment_of, segment, last = {}, 0, None
    checkpointed = set()
    for fx_node in module.graph.nodes:
        if fx_node.op in ("placeholder", "output"):
            continue
        block = block_of.get(fx_node, -1)
        if block != last:
            segment, last = segment + 1, block
        segment_of[fx_node.name] = segment
        if block >= 0:
            checkpointed.add(segment)
    flat_code = module.code
    split = split_module(module, module, lambda n: segment_of[n.name], keep_original_order=True)
    for segment in checkpointed:
        name = f"submod_{segment}"
        setattr(split, name, Checkpointed(getattr(split, name)))
    split.flat_code = flat_code
    return split
