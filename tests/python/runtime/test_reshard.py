"""runtime/reshard.py: a slice step keeps the rows that transform/local_shard gives the rank.

Parameters are materialised with local_shard's bounds (C++) and activations are cut by the
runtime's slice step. Both must cut at the same rows, or a rank computes on rows its weights
do not match. Uneven ratios once differed: C++ rounded half-way ties away from zero
(std::llround) while Python's round went to the even neighbour, so at ratios 0.3 / 0.7 over
15 rows C++ gave rank 0 five rows and the slice four. Both now read one rule,
_C.block_bounds.
"""
from __future__ import annotations

import pytest
import torch

from shardwise import _C
from shardwise._C import ValidationError
from shardwise.runtime.mesh import _Mesh
from shardwise.runtime.reshard import _apply_step


def _one_axis_mesh(size: int, rank: int) -> _Mesh:
    """A one-axis mesh as rank `rank` sees it, with no process group: a slice is local."""
    mesh = _Mesh.__new__(_Mesh)
    mesh.sizes, mesh.rank, mesh.coords, mesh.group_names = [size], rank, [rank], ["unused"]
    return mesh


def _held_rows(shape: list[int], placement: str, size: int, rank: int) -> list[int]:
    runs = _C.local_shard(shape, [placement], [size], rank)["dims"][0]
    return [i for begin, end in runs for i in range(begin, end)]


@pytest.mark.parametrize("rows, placement, size", [
    (15, "S(0)[0.3,0.7]", 2),           # 4.5: the half-way tie
    (10, "S(0)[0.25,0.25,0.5]", 3),     # 2.5 and 5.0
    (7, "S(0)[0.5,0.5]", 2),            # 3.5
    (12, "S(0)", 4),
])
def test_the_slice_step_keeps_the_rows_local_shard_gives(rows, placement, size):
    (step,) = _C.reshard_actions(["R"], [placement])
    assert step["kind"] == "slice"
    whole = torch.arange(rows * 3, dtype=torch.float64).reshape(rows, 3)
    for rank in range(size):
        kept = _apply_step(whole, step, _one_axis_mesh(size, rank))
        assert kept[:, 0].div(3).long().tolist() == _held_rows([rows, 3], placement, size, rank), rank


def test_the_half_way_tie_goes_to_the_earlier_rank():
    assert _C.block_bounds(15, 2, 0, [0.3, 0.7]) == (0, 5)
    assert _C.block_bounds(15, 2, 1, [0.3, 0.7]) == (5, 15)


def test_an_even_slice_of_rows_it_cannot_split_is_refused_naming_the_step():
    (step,) = _C.reshard_actions(["R"], ["S(0)"])
    with pytest.raises(ValidationError, match=r"slice\(axis 0, dim 0\).*\(7, 3\).*7 elements do not split into 2"):
        _apply_step(torch.zeros(7, 3), step, _one_axis_mesh(2, 1))


def test_the_partial_axes_of_a_placement_are_the_cores_reading_of_its_text():
    # The runtime asks the core (search/placement.h) where a placement is Partial, rather than
    # reading the text itself (issue 47: lower.py's write-back and whole-block index,
    # stage_links.py's cut between sub-meshes).
    assert _C.partial_axes(["R", "P(sum)"]) == [1]
    assert _C.partial_axes(["P(mean)", "S(0)[0.3,0.7]"]) == [0]
    assert _C.partial_axes(["S(1)", "R", "P(max)"]) == [2]
    assert _C.partial_axes(["S(1,g3)", "R"]) == []
    with pytest.raises(_C.ParseError, match="cannot parse placement 'Q'"):
        _C.partial_axes(["Q"])
