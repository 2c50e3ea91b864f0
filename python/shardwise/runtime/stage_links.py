"""How a pipeline stage's ranks exchange the values that cross a cut with another stage's.

Stages of one layout (the same sub-mesh shape and sharding: every stage of a plan without
``stage_meshes``) exchange by coordinate: a rank sends its shard to the rank at its own
coordinate of the other stage's block, which holds it in the same placement. Stages of
different layouts (``stage_meshes``: sub-meshes of different sizes, Alpa's inter-op stages)
exchange whole values: the sender's stage gathers the value whole on its sub-mesh, each of its
ranks sends it to the receiving ranks it serves (receiver k is served by sender k mod the
sender's size), and each receiver cuts its own shard for its own placement. The gradient goes
back the same way. A value held Partial at such a cut is refused: its whole value is a sum the
receiver would have to hold unsummed, which a cut of the whole cannot give.

Every value and gradient crossing a cut travels on a channel: a two-rank process group of its
own per way and kind (sender, receiver, activation or gradient; csrc/schedule/p2p_channels.h
says why one per way and kind, and proves the schedules' lists run on them in order).
"""
from __future__ import annotations

import torch

from .. import _C
from .._C import ValidationError
from ..materialize import local_tensor
from .reshard import gather_whole


class StageLinks:
    """Every pipeline rank's block of global ranks and layout, seen from this rank.

    `blocks[q]`: the global ranks of pipeline rank q's sub-mesh, in sub-mesh order;
    `layouts[q]`: q's layout number (the core's job, ``_C.pipeline_job``: equal for stages of one
    sub-mesh and sharding, which exchange by coordinate); `me`: this rank's pipeline rank;
    `mesh`: its sub-mesh (None: one rank); `made`: the job's groups this rank is in
    (``groups.make_groups``), of which the channels' are its links: one two-rank group per pair
    of global ranks a channel links (receiver k of the receiving block with the sender serving
    it, k mod the sender block's size: csrc/transform/job_groups.h, channel_groups)."""

    def __init__(self, blocks: list[list[int]], layouts: list, me: int, local: int, mesh=None,
                 made: list[tuple[dict, object]] = ()):
        self.blocks, self.me, self.local, self.mesh = blocks, me, local, mesh
        # Asked at every send and receive: compared once here.
        self._alike = [layout == layouts[me] for layout in layouts]
        self.rank = blocks[me][local]  # this rank's global rank
        self._channels: dict[tuple[int, int, bool], object] = {}
        for spec, group in made:
            if spec["kind"] == "channel":
                src, dst = spec["ranks"]
                self._channels[(src, dst, bool(spec["channel"][2]))] = group

    def channel(self, src: int, dst: int, gradient: bool):
        """The process group that carries `src`'s values (or gradients) to `dst` (global ranks)."""
        try:
            return self._channels[(src, dst, gradient)]
        except KeyError:
            raise ValidationError(f"pipeline: rank {self.rank} has no channel from rank {src} to rank {dst} for "
                                  f"{'gradients' if gradient else 'activations'}; the schedule's lists and the "
                                  "stages' links disagree") from None

    def first_rank(self, q: int) -> int:
        return self.blocks[q][0]

    def by_coordinate(self, q: int) -> bool:
        return self._alike[q]

    def peer(self, q: int) -> int:
        """The rank of q's block at this rank's coordinate (stages of one layout)."""
        return self.blocks[q][self.local]

    def source(self, q: int) -> int:
        """The rank of q's block that sends this rank a whole value."""
        return self.blocks[q][self.local % len(self.blocks[q])]

    def destinations(self, q: int) -> list[int]:
        """The ranks of q's block this rank sends a whole value to."""
        mine = len(self.blocks[self.me])
        return [r for k, r in enumerate(self.blocks[q]) if k % mine == self.local]

    def whole(self, local: torch.Tensor, placement: list[str] | None, name: str) -> torch.Tensor:
        """The whole value from this rank's shard (collective on its sub-mesh)."""
        if self.mesh is None:
            return local
        self._refuse_partial(placement, name)
        return gather_whole(local, placement, self.mesh)

    def cut(self, whole: torch.Tensor, placement: list[str] | None, name: str) -> torch.Tensor:
        """This rank's shard of a whole value, for its placement."""
        if self.mesh is None:
            return whole
        self._refuse_partial(placement, name)
        return local_tensor(whole, placement, self.mesh.sizes, self.mesh.rank)

    def _refuse_partial(self, placement: list[str] | None, name: str) -> None:
        if placement is None or _C.partial_axes(placement):
            raise ValidationError(f"pipeline: '{name}' crosses a cut between stages of different sub-meshes held "
                                  f"{placement} on pipeline rank {self.me}; a Partial value cannot be sent whole and "
                                  "cut (give the stages one mesh shape)")
