"""The mesh as one rank sees it: axis sizes, the rank's coordinates and each axis' group."""
from __future__ import annotations

import torch.distributed as dist

from .. import _C, _teardown
from .._C import ValidationError


class _Mesh:
    """Axis sizes, this rank's coordinates and the torch.distributed group of each axis.

    With `pipeline` > 1 the job is pipeline x mesh (Megatron's layout: the pipeline outermost):
    the mesh is the rank's pipeline stage's sub-mesh, `rank` the rank within it.

    `made`: stages on sub-meshes of their own sizes (plan.stage_meshes): the job's groups this
    rank is in, as ``groups.make_groups`` made them from the core's list (every rank makes every
    stage's groups, in that order: making a group is collective); the mesh takes its block's."""

    def __init__(self, sizes: list[int], rank: int, pipeline: int = 1,
                 made: list[tuple[dict, object]] | None = None):
        _teardown.hold(self)  # its groups are destroyed before the interpreter's finalization
        from torch.distributed.device_mesh import init_device_mesh

        self.sizes = list(sizes)
        self.rank = rank
        # The ranks that must run one program's collectives alike (lower._rank_program): the
        # job, or (blocks) this stage's sub-mesh alone.
        self.stage_group = None
        # The core's groups (transform/rank_graph.h, the rank IR's group=): per axis, the mesh
        # ranks that differ only there; this rank's coordinate is its place in its group.
        self.axis_groups = _C.axis_groups(self.sizes)
        mine = [next(g for g in groups if rank in g) for groups in self.axis_groups]
        self.coords = [g.index(rank) for g in mine]
        if made is not None:
            self._from_groups(made)
            return
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        names = tuple(f"axis{a}" for a in range(len(self.sizes)))
        if pipeline > 1:
            self.device_mesh = init_device_mesh(device, (pipeline, *self.sizes), mesh_dim_names=("pipeline", *names))
            self.groups = [self.device_mesh.get_group(a + 1) for a in range(len(self.sizes))]
        else:
            self.device_mesh = init_device_mesh(device, tuple(self.sizes), mesh_dim_names=names)
            self.groups = [self.device_mesh.get_group(a) for a in range(len(self.sizes))]
        self.group_names = [g.group_name for g in self.groups]
        offset = dist.get_rank() - rank  # the first global rank of this rank's stage
        for axis, (group, members) in enumerate(zip(self.groups, mine)):
            made = dist.get_process_group_ranks(group)
            if made != [offset + r for r in members]:
                raise ValidationError(f"mesh: axis {axis}'s group holds ranks {made}; the rank program's group= "
                                      f"is {[offset + r for r in members]} (rank {dist.get_rank()})")

        # Every set of two or more axes as one group too (a ZeRO parameter's optimizer state may
        # be sharded over several axes), made here because making a group is collective: every
        # rank makes the same ones, in the same order, whatever parameters it holds.
        self._axes_groups = {(a,): g for a, g in enumerate(self.groups)}
        if len(self.sizes) > 1:
            every = tuple(range(len(self.sizes)))
            self._axes_groups[every] = self.device_mesh[tuple(names)]._flatten().get_group()

    def _from_groups(self, made: list[tuple[dict, object]]) -> None:
        """The groups of this rank's block, among the job's groups it is in (the core's
        ``sub_mesh_groups``: each block's axis groups, then the block whole)."""
        self.device_mesh = None
        self.stage_group = None
        self.groups = [None] * len(self.sizes)
        self._axes_groups = {}
        for spec, group in made:
            if spec["kind"] == "axis":
                self.groups[spec["axis"]] = group
                self._axes_groups[(spec["axis"],)] = group
            elif spec["kind"] == "sub_mesh":  # the block whole
                self._axes_groups[tuple(range(len(self.sizes)))] = group
                self.stage_group = group
        self.group_names = [g.group_name if g is not None else None for g in self.groups]

    def axes_group(self, axes: tuple[int, ...]) -> tuple:
        """(group, this rank's index in it, its size, the global ranks in it) of the ranks that
        share this rank's coordinates off `axes`."""
        group = self._axes_groups.get(tuple(sorted(axes)))
        if group is None:
            raise ValueError(f"no group over mesh axes {axes} of a {len(self.sizes)}-axis mesh")
        ranks = dist.get_process_group_ranks(group)
        return group, ranks.index(dist.get_rank()), len(ranks), ranks
