"""Bad input to parallelize, each a clear exception naming what is wrong, raised before any
collective and changing nothing (issue 7): an op with no rule (a warning, and the result is
still right), data-dependent control flow, ranks holding different plans, a damaged plan
file, a cluster with impossible values, a model that fits under no plan (with the memory it
needs), a global batch that does not split into micro-batches x data. (Wrong input shapes, a
plan for another model or batch, and a cluster of another size: test_parallelize.py.)"""
from __future__ import annotations

import json
import os
import tempfile
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import shardwise
from shardwise import Cluster

from conftest import run_ranks


@torch.library.custom_op("shardwise_test_bad_input::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    """An op no rule knows (a custom op, opaque to capture)."""
    return x * 2 + 1


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


mystery.register_autograd(lambda ctx, grad: grad * 2)


class Mysterious(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        return self.out(mystery(self.fc(x)))


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc(x)
        return h * 2 if h.sum() > 0 else h - 1  # depends on the data: no static graph


def _batch(rows: int = 8):
    g = torch.Generator().manual_seed(1)
    return torch.randn(rows, 16, generator=g, dtype=torch.float64), torch.randint(0, 4, (rows,), generator=g)


def _model(cls=Mysterious):
    torch.manual_seed(0)
    return cls().double()


def _cases(rank: int, world: int, tmp: str) -> dict:
    out: dict = {}

    def expect(key, fn):
        try:
            fn()
            out[key] = None
        except shardwise.ShardwiseError as e:
            out[key] = f"{type(e).__name__}: {e}"

    cpu = Cluster.preset("cpu", world)
    # An op with no rule: a warning naming it, and the single-device result.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = shardwise.parallelize(_model(), _batch(), F.cross_entropy, mesh=(2, 1), cluster=cpu)
    out["unknown_warning"] = [str(w.message) for w in caught if "no sharding rule" in str(w.message)]
    reference = _model()
    optimizer = torch.optim.AdamW(engine.parameters(), lr=1e-2)
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    errors = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = engine.train_step(*_batch())
        optimizer.step()
        ref_optimizer.zero_grad()
        ref = F.cross_entropy(reference(_batch()[0]), _batch()[1])
        ref.backward()
        ref_optimizer.step()
        errors.append(abs(loss.item() - ref.item()) / abs(ref.item()))
    full = engine.full_state_dict()
    out["unknown_loss_error"] = max(errors)
    out["unknown_param_error"] = max((full[k] - p).abs().max().item() for k, p in reference.named_parameters())

    # Data-dependent control flow: capture cannot follow it.
    expect("control_flow", lambda: shardwise.parallelize(_model(Branchy), _batch(), F.cross_entropy, mesh=(2, 1),
                                                         cluster=cpu))
    # Ranks holding different plans: rank 0 data parallel, the others tensor parallel.
    expect("different_plans", lambda: shardwise.parallelize(_model(), _batch(), F.cross_entropy, cluster=cpu,
                                                            mesh=(2, 1) if rank == 0 else (1, 2)))
    # A damaged plan file (through SHARDWISE_PLAN, as `python -m shardwise run --plan` passes it).
    path = os.path.join(tmp, "damaged-plan.json")
    if rank == 0:
        with open(path, "w") as f:
            f.write(engine.plan.to_json()[:60])
    dist.barrier()
    os.environ["SHARDWISE_PLAN"] = path
    try:
        expect("damaged_plan", lambda: shardwise.parallelize(_model(), _batch(), F.cross_entropy))
    finally:
        del os.environ["SHARDWISE_PLAN"]
    # A model that fits under no plan: the least memory any plan needs.
    doc = json.loads(cpu.to_json())
    doc["device_types"][0]["memory_bytes"] = 4096
    tiny = Cluster.from_json(json.dumps(doc))
    expect("no_fit", lambda: shardwise.parallelize(_model(), _batch(), F.cross_entropy, cluster=tiny))
    # A global batch that does not split into micro-batches x data.
    pipeline = {"format": "shardwise.plan", "version": 1, "data": 1, "tensor": 1, "pipeline": 2, "global_batch": 8,
                "micro_batch": 3, "schedule": "1f1b", "virtual_stages": 1, "kfkb_k": 1, "recompute": "none",
                "zero_stage": 0, "layers_per_stage": [], "precision": "f32"}
    expect("micro_batches", lambda: shardwise.parallelize(_model(), _batch(), F.cross_entropy,
                                                          plan=shardwise.Plan.from_json(json.dumps(pipeline))))
    # Every rank is still in step: the errors came before any collective of parallelize.
    ok = torch.ones(1)
    dist.all_reduce(ok)
    out["still_in_step"] = ok.item() == world
    return out


def _run(rank: int, world: int, tmp: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), world), rank=rank,
                            world_size=world)
    try:
        out = _cases(rank, world, tmp)
        with open(os.path.join(tmp, f"result-{rank}.json"), "w") as f:
            json.dump(out, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results():
    with tempfile.TemporaryDirectory() as tmp:
        run_ranks(_run, args=(2, tmp), nprocs=2)
        out = []
        for rank in range(2):
            with open(os.path.join(tmp, f"result-{rank}.json")) as f:
                out.append(json.load(f))
        return out


def test_an_op_with_no_rule_is_replicated_with_a_warning_and_the_result_is_right(results):
    for r in results:
        assert len(r["unknown_warning"]) == 1, r["unknown_warning"]
        assert "shardwise_test_bad_input::mystery" in r["unknown_warning"][0]
        assert r["unknown_loss_error"] < 1e-12 and r["unknown_param_error"] < 1e-12, r


def test_data_dependent_control_flow_names_the_module(results):
    for r in results:
        assert r["control_flow"].startswith("CaptureError") and "Branchy" in r["control_flow"], r["control_flow"]


def test_ranks_holding_different_plans_fail_together(results):
    for r in results:
        assert r["different_plans"].startswith("ValidationError"), r["different_plans"]
        assert "ranks hold different plans" in r["different_plans"] and "rank 1" in r["different_plans"]
    assert all(r["still_in_step"] for r in results)


def test_a_damaged_plan_file_names_the_file(results):
    for r in results:
        assert r["damaged_plan"].startswith("ParseError") and "damaged-plan.json" in r["damaged_plan"], r


def test_a_model_that_fits_under_no_plan_says_the_memory_it_needs(results):
    for r in results:
        assert r["no_fit"].startswith("ValidationError") and "fits in memory under no plan" in r["no_fit"], r
        assert "least any plan needs is" in r["no_fit"] and "the devices have 4.00 KiB" in r["no_fit"], r["no_fit"]


def test_a_global_batch_not_split_into_micro_batches_times_data_is_refused(results):
    for r in results:
        assert r["micro_batches"].startswith("ValidationError"), r
        assert "not divisible by micro_batch 3 x data 1" in r["micro_batches"], r


@pytest.mark.parametrize("field,value,message", [
    (("nodes", 0, "count"), 0, r"nodes\[0\]\.count: device count must be at least 1, got 0"),
    (("device_types", 0, "memory_bytes"), -1, r"device_types\[0\]\.memory_bytes: memory must be positive"),
    (("device_types", 0, "peak_flops", "bf16"), 0, r"device_types\[0\]\.peak_flops.*positive and finite"),
    (("links", 0, "latency"), -1e-6, r"links\[0\]\.latency: latency must be finite seconds >= 0"),
    (("links", 0, "bandwidth"), -5e9, r"links\[0\]\.bandwidth: bandwidth must be positive and finite"),
])
def test_a_cluster_file_with_impossible_values_names_the_file_and_field(tmp_path, field, value, message):
    doc = json.loads(Cluster.preset("dgx-a100", nodes=1).to_json())
    at = doc
    for key in field[:-1]:
        at = at[key]
    at[field[-1]] = value
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(shardwise.ValidationError, match=f"^{str(path)}: " + message):
        Cluster.from_json(path)


def test_a_rank_program_for_a_graph_captured_at_another_batch_names_both_batches():
    """The search scales a graph captured at any batch to the global batch, but a rank's
    program is cut from the graph itself: a graph at another batch is refused up front,
    naming both sizes, not on some node deep inside the rewrite."""
    from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

    model = TinyGPT(TinyGPTConfig(layers=1, hidden=64, heads=2, seq=16))
    small = shardwise.capture(model, model.example_inputs(2))
    plan = shardwise.plan(small, Cluster.preset("cpu", 4), global_batch=8, mesh=(4, 1))
    with pytest.raises(shardwise.ValidationError, match="captured at batch 2 but the plan is for global batch 8"):
        shardwise._C.rank_program(small._core, plan.to_json(), 0)
    whole = shardwise.capture(model, model.example_inputs(8))
    assert shardwise._C.rank_program(whole._core, plan.to_json(), 0)["nodes"]


def test_layers_per_stage_that_do_not_cover_the_model_name_the_counts():
    from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

    model = TinyGPT(TinyGPTConfig(layers=4, hidden=64, heads=2, seq=16))
    graph = shardwise.capture(model, model.example_inputs(2))
    with pytest.raises(shardwise.ValidationError, match="2 entries summing to 6; the graph has 4 layers for 2 stages"):
        shardwise._C.pipeline_stages(graph._core, 2, [3, 3])
    with pytest.raises(shardwise.ValidationError, match="every stage needs a layer"):
        shardwise._C.pipeline_stages(graph._core, 2, [4, 0])
    cut = shardwise._C.pipeline_stages(graph._core, 2, [3, 1])
    assert cut["stage_cost"][0] > cut["stage_cost"][1] > 0
