"""Goldens of what runs (issue 47): a rank program in tests/golden that the C++ golden test
derives from its input graph and plan (tests/cpp/tools/golden_test.cc: IR in, IR out) is
also the program a job lowers and runs here.

Each case is one golden file, tests/golden/run_<case>.ir, and a small model of repeated
blocks trained on real Gloo ranks against one device (float64, 1e-9 relative). The test
asserts, in this order:
1. the golden's input graph is the model's capture, as the engine captures it (at a
   micro-batch's rows for a pipeline);
2. its PLAN is the sharding the job runs (a pipeline stage's sub-mesh sharding);
3. its expected output is the rank IR the engine lowered, on the golden's rank (and stage);
4. that rank's lowered program corresponds to its rank IR node for node, collectives
   included (rank_ir_check.py), on every rank;
5. the job's losses and parameters equal one device's.

The cases: ZeRO-3 units (parameters stored sharded on the data axis, gathered per unit,
their gradients reduce-scattered), a tensor-parallel pipeline stage with its weight gradients
accumulated in place (1F1B), and a zero-bubble stage whose backward is split into B and W
(ZB-H1). ``SHARDWISE_UPDATE_GOLDENS=1`` writes the golden files from what the job runs (the
C++ golden test then checks them against the passes)."""
from __future__ import annotations

import json
import os
import pathlib
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import shardwise
from conftest import finish_rank, parameter_error, spawn_reports, train_beside_one_device
from rank_ir_check import engine_against_rank_ir

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "golden"
UPDATE = os.environ.get("SHARDWISE_UPDATE_GOLDENS") == "1"
ROWS, MICRO, STEPS, TOLERANCE = 8, 4, 3, 1e-9


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x)))


class Blocks(nn.Module):
    def __init__(self, layers: int = 2):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(layers))

    def forward(self, x, y):
        for block in self.blocks:
            x = block(x)
        return ((x - y) ** 2).mean()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return Blocks().double()


def _batch(step: int, rows: int = ROWS):
    g = torch.Generator().manual_seed(100 + step)
    return (torch.randn(rows, 16, generator=g, dtype=torch.float64),
            torch.randn(rows, 16, generator=g, dtype=torch.float64))


class Case(NamedTuple):
    world: int
    rank: int  # the golden's job rank
    passes: str  # the golden's RUN line
    about: str  # the golden's comment


CASES = {
    "zero3": Case(2, 1, "rank-graph",
                  "ZeRO-3 units on a data axis of 2, rank 1: every parameter stored as its half (S(0) on the\n"
                  "data axis), gathered before its use in its module's unit group (prefetched beside the\n"
                  "forward; a weight gathered again for backward) and its gradient reduce-scattered back to\n"
                  "the half beside the backward. tests/python/runtime/test_golden_runs.py trains this program."),
    "tensor_pipeline_stage": Case(4, 3, "rank-graph",
                                  "Two blocks on 2 pipeline stages x a tensor axis of 2 (1F1B), rank 3 of the job:\n"
                                  "stage 1's rank 1 of its sub-mesh, the rank program rewritten for the sub-mesh and\n"
                                  "cut (transform/stage_rank_graph.h), the stage passes run as the plan's defaults\n"
                                  "run them: each contraction reading its weight shard as it is adds its weight\n"
                                  "gradient into .grad in place (fused accumulation). The input is the capture at a\n"
                                  "micro-batch of 4 rows. tests/python/runtime/test_golden_runs.py trains this program."),
    "zero_bubble_stage": Case(2, 1, "rank-graph,weight-gradient-split",
                              "Two blocks on 2 pipeline stages under ZB-H1, rank 1 (stage 1): the stage's backward\n"
                              "split into B and W at each weight read (weight_cut), the weights' gradients added\n"
                              "into .grad in place. The input is the capture at a micro-batch of 4 rows.\n"
                              "tests/python/runtime/test_golden_runs.py trains this program."),
}


def _plan(case: str) -> shardwise.Plan:
    if case == "zero3":
        graph = shardwise.capture(_model(), _batch(0))
        plan = shardwise.Plan.search(graph, shardwise.Cluster.preset("cpu", 2), mesh=(2, 1), global_batch=ROWS,
                                     precision="f32")
        doc = json.loads(plan.to_json())
        for key in ("predicted", "programs"):
            doc.pop(key, None)
        sharding = doc["sharding"]
        for name in set(sharding["leaves"]) - set(sharding["inputs"]):
            sharding["placements"][name] = ["S(0)", "R"]  # every parameter's rows halved on the data axis
        return shardwise.Plan.from_json(json.dumps(doc))
    graph = shardwise.capture(_model(), _batch(0, MICRO))
    tensor, schedule = (2, "1f1b") if case == "tensor_pipeline_stage" else (1, "zb-h1")
    cluster = shardwise.Cluster.preset("cpu", CASES[case].world)
    plan = shardwise.Plan.manual(graph, cluster, pipeline=2, tensor=tensor, data=1, global_batch=ROWS,
                                 micro_batch=MICRO, schedule=schedule, recompute=False, precision="f32")
    plan = plan if plan.is_complete() else plan.complete(graph, cluster)
    if tensor == 1:
        return plan
    # Megatron's layout on each stage's tensor axis (the search keeps a model this small
    # replicated): up column-parallel, down row-parallel, its output a partial sum.
    doc = json.loads(plan.to_json())
    doc.pop("predicted", None)
    stage = doc["stage_sharding"]
    for k, (up, gelu, down) in enumerate((("linear", "gelu", "linear_1"), ("linear_2", "gelu_1", "linear_3"))):
        stage["placements"].update({f"blocks.{k}.up.weight": ["R", "S(0)"], f"blocks.{k}.up.bias": ["R", "S(0)"],
                                    f"blocks.{k}.down.weight": ["R", "S(1)"], up: ["R", "S(1)"],
                                    gelu: ["R", "S(1)"], down: ["R", "P(sum)"]})
        stage["strategies"].update({up: ["replicate", "split n"], gelu: ["replicate", "split d1"],
                                    down: ["replicate", "split k"]})
    return shardwise.Plan.from_json(json.dumps(doc))


def _golden_plan(case: str, plan: shardwise.Plan, graph) -> dict:
    """The sharding the golden's rank-graph pass takes: the plan's, or its stages' sub-mesh's
    (a stage of one rank: every value replicated on a one-rank mesh, as the binding makes it:
    csrc/python/bind_transform.cc, replicated)."""
    if plan.sharding:
        return plan.sharding
    if plan.data * plan.tensor > 1:
        return plan.stage_plan().sharding
    return {"mesh": [1], "axis_names": ["data"], "level": "replicated",
            "placements": {v["name"]: ["R"] for v in graph.values()},
            "strategies": {node["outputs"][0]: ["replicate"] for node in graph.nodes() if node["outputs"]}}


def _worker(rank: int, world: int, store: str, result: str, case: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        engine = shardwise.parallelize(_model(), _batch(0), plan=_plan(case))
        reference = _model()
        losses, ref_losses = train_beside_one_device(engine, reference, _batch, STEPS)
        irs = engine.stage_rank_irs if hasattr(engine, "stage_rank_irs") else {0: engine.rank_ir}
        finish_rank(result, rank, {"losses": losses, "ref_losses": ref_losses,
                                   "irs": {str(g): ir for g, ir in irs.items()},
                                   "error": parameter_error(engine.full_state_dict(), reference),
                                   "lowered": engine_against_rank_ir(engine)})
    finally:
        dist.destroy_process_group()


def _read_golden(path: pathlib.Path) -> dict:
    """The parts of a golden file (tests/cpp/tools/golden_test.cc's format)."""
    head, expect = path.read_text().split("// EXPECT:\n")
    lines = head.splitlines()
    plan = "".join(line[len("// PLAN:"):] for line in lines if line.startswith("// PLAN:"))
    rank = next((int(line.split(":")[1]) for line in lines if line.startswith("// RANK:")), 0)
    stage = next((line.split(":")[1].split()[0] for line in lines if line.startswith("// STAGE:")), None)
    graph = "".join(line + "\n" for line in lines if not line.startswith("//"))
    return {"run": lines[0][len("// RUN:"):].strip(), "plan": json.loads(plan) if plan else None, "rank": rank,
            "stage": None if stage is None else int(stage), "graph": graph, "expect": expect}


def _write_golden(path: pathlib.Path, case: Case, rank: int, stage: tuple[int, int] | None, plan: dict,
                  graph: str, expect: str) -> None:
    lines = [f"// RUN: {case.passes}", f"// RANK: {rank}"]
    if stage is not None:
        lines.append(f"// STAGE: {stage[0]} of {stage[1]}")
    lines += [f"// PLAN: {line}" for line in json.dumps(plan, indent=1, sort_keys=True).splitlines()]
    lines += [f"// {line}" for line in case.about.splitlines()]
    path.write_text("\n".join(lines) + "\n" + graph + "// EXPECT:\n" + expect)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_golden_rank_program_is_the_program_a_job_lowers_and_runs(case):
    spec = CASES[case]
    plan = _plan(case)
    pipelined = not plan.sharding
    rows = MICRO if pipelined else ROWS
    graph = shardwise.capture(_model(), _batch(0, rows))
    size = plan.data * plan.tensor
    stage, local = divmod(spec.rank, size) if pipelined else (0, spec.rank)
    reports = spawn_reports(_worker, spec.world, case)
    ran = reports[spec.rank]["irs"][str(stage)]
    path = GOLDEN / f"run_{case}.ir"
    sharding = _golden_plan(case, plan, graph)
    if UPDATE:
        _write_golden(path, spec, local, (stage, plan.pipeline) if pipelined else None, sharding, str(graph), ran)
    golden = _read_golden(path)
    assert golden["run"] == spec.passes
    assert golden["graph"] == str(graph), "the golden's input is not the model's capture"
    assert golden["plan"] == json.loads(json.dumps(sharding)), "the golden's PLAN is not the job's"
    assert (golden["rank"], golden["stage"]) == (local, stage if pipelined else None)
    assert golden["expect"] == ran, "the golden's expected program is not the rank IR the job ran"
    for r, report in enumerate(reports):
        assert report["lowered"]["calls"] > 0 and not report["lowered"]["mismatches"], (r, report["lowered"])
        for a, b in zip(report["losses"], report["ref_losses"]):
            assert abs(a - b) <= TOLERANCE * abs(b), (r, report["losses"], report["ref_losses"])
        assert report["error"] < TOLERANCE, (r, report["error"])
    # What each case is a golden of is in the program the job ran.
    marks = {"zero3": ("shardwise::all_gather", "unit_group=", "shardwise::reduce_scatter"),
             "tensor_pipeline_stage": ("shardwise::recv", "shardwise::all_reduce", "shardwise.fused_accumulation="),
             "zero_bubble_stage": ("shardwise.weight_cut=", "shardwise.fused_accumulation=")}[case]
    assert all(mark in ran for mark in marks), (marks, ran)


def test_a_stage_takes_and_hands_on_what_its_rank_ir_says():
    # pipeline_engine.stage_io reads the stage's I/O off its rank IR (the core's cut): here the
    # zero-bubble golden's stage 1, which receives the first block's output and sends nothing.
    from shardwise.runtime.pipeline_engine import stage_io

    ir = _read_golden(GOLDEN / "run_zero_bubble_stage.ir")["expect"]
    io = stage_io(ir, ["x", "y"])
    assert io["inputs"] == ["y"] and io["received"] == ["add"] and io["sent"] == []
    assert io["leaves"] == [f"blocks.1.{m}.{p}" for m in ("up", "down") for p in ("weight", "bias")]
    # The tensor-parallel stage reads the same through its sub-mesh's shards and collectives.
    tp = stage_io(_read_golden(GOLDEN / "run_tensor_pipeline_stage.ir")["expect"], ["x", "y"])
    assert (tp["inputs"], tp["received"], tp["sent"], tp["leaves"]) == (["y"], ["add"], [], io["leaves"])
