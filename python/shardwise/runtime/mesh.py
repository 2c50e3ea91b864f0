"""The mesh as one rank sees it: axis sizes, the rank's coordinates and each axis' group."""
from __future__ import annotations

import torch.distributed as dist

from .. import _teardown


class _Mesh:
    """Axis sizes, this rank's coordinates and the torch.distributed group of each axis.

    With `pipeline` > 1 the job is pipeline x mesh (Megatron's layout: the pipeline outermost):
    the mesh is the rank's pipeline stage's sub-mesh, `rank` the rank within it."""

    def __init__(self, sizes: list[int], rank: int, pipeline: int = 1):
        _teardown.hold(self)  # its groups are destroyed before the interpreter's finalization
        from torch.distributed.device_mesh import init_device_mesh

        self.sizes = list(sizes)
        self.rank = rank
        self.coords = []
        stride = 1
        for size in reversed(self.sizes):
            self.coords.insert(0, (rank // stride) % size)
            stride *= size
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        names = tuple(f"axis{a}" for a in range(len(self.sizes)))
        if pipeline > 1:
            self.device_mesh = init_device_mesh(device, (pipeline, *self.sizes), mesh_dim_names=("pipeline", *names))
            self.groups = [self.device_mesh.get_group(a + 1) for a in range(len(self.sizes))]
        else:
            self.device_mesh = init_device_mesh(device, tuple(self.sizes), mesh_dim_names=names)
            self.groups = [self.device_mesh.get_group(a) for a in range(len(self.sizes))]
        self.group_names = [g.group_name for g in self.groups]

        # Every set of two or more axes as one group too (a ZeRO parameter's optimizer state may
        # be sharded over several axes), made here because making a group is collective: every
        # rank makes the same ones, in the same order, whatever parameters it holds.
        self._axes_groups = {(a,): g for a, g in enumerate(self.groups)}
        if len(self.sizes) > 1:
            every = tuple(range(len(self.sizes)))
            self._axes_groups[every] = self.device_mesh[tuple(names)]._flatten().get_group()

    def axes_group(self, axes: tuple[int, ...]) -> tuple:
        """(group, this rank's index in it, its size, the global ranks in it) of the ranks that
        share this rank's coordinates off `axes`."""
        group = self._axes_groups.get(tuple(sorted(axes)))
        if group is None:
            raise ValueError(f"no group over mesh axes {axes} of a {len(self.sizes)}-axis mesh")
        ranks = dist.get_process_group_ranks(group)
        return group, ranks.index(dist.get_rank()), len(ranks), ranks
