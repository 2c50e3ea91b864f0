"""Process groups made as the core lists them (csrc/transform/job_groups.h).

Making a group is collective: every rank of the job calls ``dist.new_group`` for every group,
member or not, in one order. The core lists each job's groups beyond the DeviceMesh's (the
sub-meshes of stages of their own sizes, the schedule's channels, the leaves several pipeline
ranks read) in that order; this makes them as listed and hands back the ones this rank is in.
"""
from __future__ import annotations

import torch.distributed as dist


def make_groups(specs: list[dict]) -> list[tuple[dict, object]]:
    """Makes every group of `specs` (the core's dicts: kind, ranks, ...) in their order, on
    every rank; returns (spec, group) for each group that holds this rank."""
    me = dist.get_rank()
    mine = []
    for spec in specs:
        group = dist.new_group(spec["ranks"])
        if me in spec["ranks"]:
            mine.append((spec, group))
    return mine
