"""A mixture of experts written as torchtitan writes it (tests/python/torchtitan_moe.py: token
rows sorted by expert, torch._grouped_mm over the counts' offsets, a scatter-add back), captured
as the experts op (python/shardwise/_grouped_experts.py) and trained under expert parallelism
equal to the same model on one device in float64 (issue 48). The one-device run computes the
experts by torchtitan 0.2's loop over ``num_tokens_per_expert.tolist()`` (torch._grouped_mm has
no float64 kernel on the CPU); the capture takes the grouped-matmul program."""
from __future__ import annotations

import math

import pytest
import torch

import shardwise
from conftest import experts_trained_beside_one_device, spawn_scenario, token_batch
from torchtitan_moe import Decoder

STEPS, ROWS, SEQ, VOCAB, TOLERANCE = 3, 8, 16, 64, 1e-9


def _model(experts: int, use_grouped_mm: bool = True, counts: str = "routing_map") -> torch.nn.Module:
    torch.manual_seed(0)
    # Experts large beside the rest (8 of 512 x 64), so the search splits them.
    return Decoder(vocab=VOCAB, dim=64, hidden=512, experts=experts, use_grouped_mm=use_grouped_mm,
                   counts=counts).double().train()


def _batch(step: int) -> dict:
    return token_batch(step, ROWS, SEQ, VOCAB)


def _scenario_trains_as_one_device(rank: int, world: int, experts: int, mesh: list, pipeline: int, expert: int = 1,
                                   counts: str = "routing_map"):
    return experts_trained_beside_one_device(world, _model(experts, counts=counts), _model(experts, False, counts),
                                             _batch, STEPS, ROWS, mesh, pipeline, expert,
                                             ("experts.w1", "experts.w2", "experts.w3"), loss_of=lambda m, b: m(**b))


def _check(r: dict, experts: int, ways: int, stages: int = 1) -> None:
    split = [math.prod(n for n, s in zip(r["mesh"], v) if s in ("split e", "dispatch t"))
             for v in r["strategies"].values()]
    assert len(split) == 2 and all(n == ways for n in split), (r["mesh"], r["strategies"])
    assert all(h["rows"] == experts // ways and h["state_rows"] == [experts // ways] for h in r["held"].values()), \
        r["held"]
    assert len(r["held"]) == 6 // stages, r["held"]  # w1, w2, w3 of each layer of its stage
    for a, b in zip(r["losses"], r["ref_losses"]):
        assert abs(a - b) <= TOLERANCE * abs(b), (r["losses"], r["ref_losses"])
    # Parameters and the router's statistics (each layer's tokens_per_expert buffer).
    assert sum(k.endswith("tokens_per_expert") for k in r["errors"]) == 2, sorted(r["errors"])
    assert max(r["errors"].values()) < TOLERANCE, sorted(r["errors"].items(), key=lambda kv: -kv[1])[:4]


@pytest.mark.parametrize("method", ["export", "fx"])
def test_the_grouped_matmul_program_is_captured_as_the_experts_op(method):
    graph = shardwise.capture(_model(8), _batch(0), method=method)
    ops = [n["op"] for n in graph.nodes()]
    assert ops.count("shardwise_moe::experts") == 2, sorted(set(ops))
    assert not {"aten::argsort", "shardwise_moe::grouped_mm", "aten::scatter_add"} & set(ops), sorted(set(ops))


@pytest.mark.parametrize("ways", [2, 4])
def test_torchtitan_experts_split_ways_train_as_one_device(ways):
    r = spawn_scenario(__name__, ways, "trains_as_one_device", 8, [ways, 1], 1)
    _check(r, 8, ways)
    assert r["rows_by_rank"] == [[8 // ways]] * ways, r["rows_by_rank"]
    assert all(v == ["dispatch t", "replicate"] for v in r["strategies"].values()), r["strategies"]


def test_torchtitan_experts_split_beside_data_parallelism_train_as_one_device():
    r = spawn_scenario(__name__, 4, "trains_as_one_device", 6, [2, 2], 1)
    _check(r, 6, 2)


def test_torchtitan_experts_split_in_each_pipeline_stage_train_as_one_device():
    # plan.expert 2: each stage's 2 data ranks split its layer's experts.
    r = spawn_scenario(__name__, 4, "trains_as_one_device", 8, [2, 1], 2, 2)
    _check(r, 8, 2, stages=2)


def test_torchtitan_0_2_histc_counts_split_two_ways_train_as_one_device():
    r = spawn_scenario(__name__, 2, "trains_as_one_device", 8, [2, 1], 1, 1, "histc")
    _check(r, 8, 2)


def test_counts_that_are_not_the_ids_keep_the_program_as_written_and_train_as_one_device():
    # Every expert given the same count whatever the routing: the grouped matmuls' groups are
    # not the experts the ids chose, so the program is not the experts' sum and stays as it is
    # (shardwise_moe::grouped_mm, any dtype), its experts whole.
    graph = shardwise.capture(_model(8, counts="balanced"), _batch(0))
    ops = [n["op"] for n in graph.nodes()]
    assert "shardwise_moe::experts" not in ops and ops.count("shardwise_moe::grouped_mm") == 6, sorted(set(ops))
    r = spawn_scenario(__name__, 2, "trains_as_one_device", 8, [2, 1], 1, 1, "balanced")
    assert not r["strategies"]
    assert all(h["rows"] == 8 for h in r["held"].values()), r["held"]
    for a, b in zip(r["losses"], r["ref_losses"]):
        assert abs(a - b) <= TOLERANCE * abs(b), (r["losses"], r["ref_losses"])
    assert max(r["errors"].values()) < TOLERANCE, sorted(r["errors"].items(), key=lambda kv: -kv[1])[:4]


def test_the_any_dtype_grouped_matmul_is_torchs_in_float32():
    # torch._grouped_mm runs float32 on the CPU: shardwise_moe::grouped_mm (what a grouped
    # matmul the capture cannot fold runs as) against it, forward and backward, with an empty
    # group.
    g = torch.Generator().manual_seed(0)
    a = torch.randn(10, 8, generator=g, requires_grad=True)
    b = torch.randn(4, 8, 16, generator=g, requires_grad=True)
    offs = torch.tensor([3, 3, 7, 10], dtype=torch.int32)
    grad = torch.randn(10, 16, generator=g)
    ours = torch.ops.shardwise_moe.grouped_mm(a, b, offs)
    ours_grads = torch.autograd.grad(ours, [a, b], grad)
    theirs = torch._grouped_mm(a, b, offs=offs)
    theirs_grads = torch.autograd.grad(theirs, [a, b], grad)
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    for x, y in zip(ours_grads, theirs_grads):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-5), (x - y).abs().max()


def test_torchtitans_own_casts_fold_in_a_bfloat16_model_and_not_in_a_float64_one():
    # torchtitan casts the grouped matmuls' operands to bfloat16 and the combine's product to
    # float32: in a bfloat16 model the first are no casts at all and the second is the product's
    # own promotion (float32 scores), so the program is the experts op's; in a float64 model the
    # casts round to bfloat16, which the op would not: left as written.
    torch.manual_seed(0)
    for dtype, folded in ((torch.bfloat16, 2), (torch.float64, 0)):
        model = Decoder(vocab=VOCAB, dim=64, hidden=512, casts=True).to(dtype).train()
        ops = [n["op"] for n in shardwise.capture(model, _batch(0)).nodes()]
        assert ops.count("shardwise_moe::experts") == folded, (dtype, sorted(set(ops)))
