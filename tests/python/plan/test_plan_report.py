"""plan.report() for people (issue 50, item 6): the step by what a user recognises (compute,
exposed communication by kind, the pipeline bubble, the optimizer step), MFU beside the
devices' peak, memory per device by kind beside its capacity, and mesh axes named by what
the plan's placements split over them; no internal key of the breakdown in the text. The
machine-readable figures (breakdown(), predicted_memory()) keep the core's keys."""
from __future__ import annotations

import json
import re

import pytest
import torch

import shardwise
from shardwise._report import bytes_text, flops_text, memory_parts, percent_text, seconds_text, time_parts

# A word in snake_case standing alone (a parameter's dotted name, "blocks.0.ln_1.weight", is the
# user's own and not matched).
SNAKE = re.compile(r"(?<![\w.])[a-z]+(?:_[a-z0-9]+)+(?![\w.])")


@pytest.fixture(scope="module")
def tiny_gpt():
    """The quickstart's model (python -m shardwise train's defaults) on its 4 CPU processes."""
    from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

    torch.manual_seed(0)
    cfg = TinyGPTConfig(layers=2, hidden=64, heads=4)
    model = TinyGPT(cfg).to(torch.float64)
    idx = torch.randint(0, cfg.vocab, (8, cfg.seq), generator=torch.Generator().manual_seed(1))
    graph = shardwise.capture(model, (idx, torch.roll(idx, -1, dims=1)))
    return graph, shardwise.Cluster.preset("cpu", 4)


@pytest.fixture(scope="module")
def pipelined():
    graph = shardwise.models.gpt(layers=8, hidden=1024, heads=16, seq=1024, vocab=51200)
    cluster = shardwise.Cluster.preset("dgx-a100", nodes=2)
    plan = shardwise.Plan.manual(graph, cluster, tensor=2, pipeline=2, data=4, global_batch=64, micro_batch=2,
                                 schedule="interleaved-1f1b", virtual_stages=2, zero=1)
    return plan, cluster


def _line(report: str, pattern: str) -> re.Match:
    found = re.search(pattern, report, re.M)
    assert found, f"no line matching {pattern!r} in\n{report}"
    return found


def _head(report: str) -> str:
    """The report before the placements table (parameter names are the user's)."""
    return report.split("parameters and inputs (")[0]


def _no_internal_keys(plan, report: str) -> None:
    keys = set(plan.breakdown()) | set(plan.predicted_memory()[1])
    assert {k for k in keys if "_" in k}, "the plan has internal keys to look for"
    for key in keys:
        if "_" in key:
            assert key not in report, (key, report)
    assert "_total" not in report and "_overlapped" not in report
    assert not SNAKE.findall(_head(report)), (SNAKE.findall(_head(report)), report)
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        assert kind not in report


def _mfu(plan, cluster, report: str) -> None:
    """MFU = model FLOP/s per device over the device's peak in the plan's precision, beside it."""
    precision = plan.precision
    peak = cluster.device_of(0)["peak_flops"][precision]
    expected = plan.predicted_tflops_per_device() * 1e12 / peak
    assert 0 < expected < 1
    found = _line(report, r"^predicted step ([\d.]+ (?:s|ms|us)), MFU ([\d.]+)% of (.+) (\w+) peak per device$")
    assert found.group(1) == seconds_text(plan.predicted_step_time())
    assert f"{found.group(2)}%" == percent_text(expected)
    assert found.group(3) == flops_text(peak) and found.group(4) == precision
    assert "0.0 TFLOP/s" not in report and "TFLOP/s per device" not in report


def _memory(plan, cluster, report: str, kinds: list[str]) -> None:
    """Memory per device beside the device's capacity, then one line per kind; the kinds add up
    to the most loaded rank's bytes."""
    memory, _ = plan.predicted_memory()
    capacity = cluster.device_of(0)["memory_bytes"]
    _line(report, rf"^memory per device {re.escape(bytes_text(memory))} of {re.escape(bytes_text(capacity))} "
                  rf"\({re.escape(percent_text(memory / capacity))}\)")
    parts, _ = memory_parts(plan, plan._report_values())
    assert [k for k, _ in parts] == kinds
    assert sum(v for _, v in parts) == pytest.approx(memory, rel=1e-9)
    for kind, value in parts:
        _line(report, rf"^  {re.escape(kind)} +{re.escape(bytes_text(value))} +[\d.]+%$")


def test_searched_tiny_gpt_report(tiny_gpt):
    graph, cluster = tiny_gpt
    plan = shardwise.plan(graph, cluster, global_batch=8)
    assert plan.sharding and plan.pipeline == 1
    report = plan.report()
    print(report)
    # The mesh by what its axes carry: the labels are cut along the batch on every axis of more than one rank.
    mesh = plan.sharding["mesh"]
    labels = plan.placements()["labels"]
    assert all(p.startswith("S(0)") for p, n in zip(labels, mesh) if n > 1) and max(mesh) > 1, (labels, mesh)
    found = _line(report, r"^plan {6}4 x cpu: (.*)$")
    assert found.group(1).startswith("batch over " + " x ".join(str(n) for n in mesh if n > 1)), found.group(1)
    assert "data x tensor" not in report and "(data" not in report
    _mfu(plan, cluster, report)
    # The step: compute, the communication it waits for by kind, no bubble, the optimizer step.
    step = plan.predicted_step_time()
    b = plan.breakdown()
    _line(report, rf"^  compute +{re.escape(seconds_text(b['compute']))} +{100 * b['compute'] / step:.1f}%$")
    _line(report, rf"^  optimizer step +{re.escape(seconds_text(b['optimizer']))} ")
    exposed = b["activations"] + b["statistics"] + b["gradient_sync"] + b["zero_broadcast"]
    _line(report, rf"^  exposed communication +{re.escape(seconds_text(exposed))} ")
    _line(report, rf"^    gradient sync +{re.escape(seconds_text(b['gradient_sync']))} +[\d.]+%  "
                  rf"of {re.escape(seconds_text(b['gradient_sync_total']))} in all; the rest runs beside")
    assert "pipeline sends" not in report and "parameter gathers" not in report
    _line(report, r"^  pipeline bubble +none  \(one pipeline stage\)$")
    parts, bubble = time_parts(plan, plan._report_values())
    assert bubble is None and sum(p.seconds for p in parts) == pytest.approx(step, rel=1e-9)
    # Memory by kind: the search's parameter states split into weights, gradients, optimizer state.
    # The backward's gradients in flight count where they exceed the parameters' (not here:
    # TinyGPT's loss is small beside its weights' gradients), and are shown only then.
    beyond = plan.predicted_memory()[1]["backward_working"]
    _memory(plan, cluster, report, ["weights", "gradients", "optimizer state", "activations"]
            + (["backward working set (gradients in flight)"] if beyond > 0 else []))
    _no_internal_keys(plan, report)
    assert "all-reduce" in report  # the collectives table, by the names NCCL's users know
    # The machine-readable figures keep the core's keys.
    assert {"gradient_sync", "gradient_sync_total", "activations_beside_backward_total"} <= set(b)
    # The core splits the model states by kind, with a manual plan's keys; the parts add up.
    total, memory = plan.predicted_memory()
    assert set(memory) == {"weights", "gradients", "optimizer", "activations", "backward_working",
                           "gathered_parameters"}
    assert sum(memory.values()) == pytest.approx(total, rel=1e-12)
    # A float32 plan: Adam's two moments, 8 bytes a parameter, to its weight's 4 (no master copy).
    # The gradients are those the step holds at its peak moment (ShardingMemory::step_peak), at
    # most the weights'.
    assert json.loads(plan.to_json())["precision"] == "f32"
    assert memory["optimizer"] == pytest.approx(2 * memory["weights"], rel=1e-9)
    assert 0 <= memory["gradients"] <= memory["weights"]


def test_mesh_axes_are_named_by_their_placements(tiny_gpt):
    """One mesh shape, named by what the placements split: a fixed data axis carries the batch,
    a fixed tensor axis (which does not split the batch) the token ids' sequence."""
    graph, cluster = tiny_gpt
    data = shardwise.plan(graph, cluster, global_batch=8, mesh=(4, 1))
    assert data.placements()["labels"][0].startswith("S(0)")
    _line(data.report(), r"^plan {6}4 x cpu: batch over 4 ranks$")
    tensor = shardwise.plan(graph, cluster, global_batch=8, mesh=(1, 4))
    assert tensor.placements()["idx"] == ["R", "S(1)"]
    found = _line(tensor.report(), r"^plan {6}4 x cpu: (.*)$")
    assert found.group(1).startswith("sequence over 4 ranks") and "batch" not in found.group(1)


def test_pipelined_manual_plan_report(pipelined):
    plan, cluster = pipelined
    report = plan.report()
    print(report)
    _line(report, r"^plan {6}16 x a100-sxm4-80gb: layers in 2 stages x batch over 4 x weights over 2$")
    _line(report, r"^batch {5}global 64: 8 micro-batches of 2 on each of 4 batch ranks$")
    _line(report, r"^schedule  interleaved 1F1B, 2 virtual stages per rank; full recomputation; ZeRO-1: "
                  r"optimizer state sharded over the batch ranks$")
    _mfu(plan, cluster, report)
    step = plan.predicted_step_time()
    b = plan.breakdown()

    def row(label: str, seconds: float, indent: str = "  ") -> str:
        return rf"^{indent}{re.escape(label)} +{re.escape(seconds_text(seconds))} +{100 * seconds / step:.1f}%"

    _line(report, row("compute", b["compute"]) + "$")
    _line(report, row("pipeline bubble", b["pipeline_bubble"]) + "$")
    _line(report, row("optimizer step", b["optimizer"]) + "$")
    # ZeRO-1: each owner broadcasts the parameters it stepped, after the step (runtime/optim.py)
    assert b["zero_broadcast"] > 0
    # The tied embedding and head on the two stages: its gradient summed between them after the step
    assert b["shared_weight_sync"] > 0
    exposed = (b["tensor_parallel"] + b["pipeline_p2p"] + b["data_parallel"] + b["zero_broadcast"]
               + b["shared_weight_sync"])
    _line(report, row("exposed communication", exposed) + "$")
    _line(report, row("parameter broadcasts (ZeRO)", b["zero_broadcast"], "    ") + "$")
    _line(report, row("tied weights' gradient sync", b["shared_weight_sync"], "    ") + "$")
    _line(report, row("tensor-parallel", b["tensor_parallel"], "    ") + "$")
    _line(report, row("pipeline sends", b["pipeline_p2p"], "    ")
          + rf"  {re.escape(seconds_text(b['pipeline_transfer']))} each$")
    _line(report, row("gradient sync", b["data_parallel"], "    ")
          + rf"  of {re.escape(seconds_text(b['data_parallel_total']))} in all; the rest runs beside the backward$")
    assert "parameter gathers" not in report  # ZeRO-1 gathers no parameters
    parts, bubble = time_parts(plan)
    assert bubble is not None and sum(p.seconds for p in parts) == pytest.approx(step, rel=1e-9)
    # The most loaded stage here is the last, whose loss' backward holds the vocabulary's
    # gradients beyond the parameters' (the degrees evaluator prices them as the search does).
    beyond = plan.predicted_memory()[1]["backward_working"]
    _memory(plan, cluster, report, ["weights", "gradients", "optimizer state", "activations"]
            + (["backward working set (gradients in flight)"] if beyond > 0 else []))
    stage = int(plan.predicted_memory()[1]["stage"])
    _line(report, rf"^memory per device .*, pipeline stage {stage}, the most loaded$")
    _no_internal_keys(plan, report)


def test_zero3_names_its_parameter_gathers(pipelined):
    _, cluster = pipelined
    graph = shardwise.models.gpt(layers=8, hidden=1024, heads=16, seq=1024, vocab=51200)
    plan = shardwise.Plan.manual(graph, cluster, tensor=2, pipeline=1, data=8, global_batch=64, micro_batch=8,
                                 zero=3)
    report = plan.report()
    _line(report, r"^training  full recomputation; ZeRO-3: optimizer state, gradients and weights sharded over "
                  r"the batch ranks$")
    _line(report, rf"^    parameter gathers and gradient sync +"
                  rf"{re.escape(seconds_text(plan.breakdown()['data_parallel']))} ")
    _line(report, r"^  pipeline bubble +none  \(one pipeline stage\)$")
    assert "pipeline sends" not in report
    _line(report, r"^plan {6}16 x a100-sxm4-80gb: batch over 8 x weights over 2$")


def test_a_plan_read_back_says_why_it_has_no_mfu_until_told_its_devices(pipelined):
    plan, cluster = pipelined
    back = shardwise.Plan.from_json(plan.to_json())
    report = back.report()
    _line(report, r"^predicted step [\d.]+ ms, MFU not available: the plan does not say which devices it runs on "
                  rf"\({re.escape(flops_text(plan.predicted_tflops_per_device() * 1e12))} of model FLOPs per device")
    _line(report, r"^memory per device [\d.]+ [MG]B \(device capacity unknown")
    assert "0.0 TFLOP/s" not in report
    assert back.report(cluster) == plan.report()


def test_cli_tables_name_the_same_figures(pipelined):
    from rich.console import Console

    from shardwise._cli_render import print_plan

    plan, cluster = pipelined
    console = Console(record=True, width=200)
    print_plan(plan, cluster, console)
    text = console.export_text()
    assert re.search(r"MFU +│ [\d.]+% of 312 TFLOP/s bf16 peak per device", text), text
    assert "layers in 2 stages x batch over 4 x weights over 2" in text
    for label in ("exposed communication", "pipeline sends", "pipeline bubble", "optimizer state", "device capacity"):
        assert label in text, (label, text)
    assert "TFLOP/s per device" not in text and "pipeline_p2p" not in text and "data x tensor" not in text


def test_a_sequence_split_says_why_beside_the_best_plan_without_it():
    # Llama 3 405B's width (16 of its layers) at 131,072 tokens, 16 sequences on 2,048 H100s:
    # the joint planner splits each sequence, and its report names the plan it was chosen over,
    # the one it chooses with context parallelism off.
    from conftest import benchmark_module

    llama_module = benchmark_module("published_benchmark", "published.py").llama_module
    ids = torch.zeros(2, 131072, dtype=torch.long, device="meta")
    graph = shardwise.capture(llama_module("405B", 131072, layers=16), {"input_ids": ids, "labels": ids})
    cluster = shardwise.Cluster.preset("dgx-h100", nodes=256)
    split = shardwise.plan(graph, cluster, global_batch=16)
    off = shardwise.plan(graph, cluster, global_batch=16, context_parallel=False)
    assert split.context > 1 and off.context == 1
    why = [line for line in split.report().splitlines() if line.startswith("why")]
    assert len(why) == 1, split.report()
    degrees = f"{off.data} data x {off.tensor} tensor, {off.pipeline} stages"
    assert why[0].startswith("why       sequence split: ") and f"the best plan without it ({degrees})" in why[0], why
    ratio = float(re.search(r"\(([\d.]+)x the step\)", why[0]).group(1))
    assert ratio > 1, why
    assert not [line for line in off.report().splitlines() if line.startswith("why")], off.report()


def test_an_experts_split_reason_names_the_same_degrees_with_every_expert_whole():
    from shardwise._report import _reason_line

    reason = {"split": "experts", "with": {"plan": "{}", "step_time": 43.8, "memory_per_rank": 63.6e9, "fits": True},
              "without": {"plan": "{}", "step_time": 99.3, "memory_per_rank": 375e9, "fits": False}}
    assert _reason_line(reason) == ("why       experts split: 43.8 s a step, 63.6 GB a GPU as the search priced it; "
                                    "the same degrees with every expert on every rank: 99.3 s a step, 375 GB a GPU, "
                                    "does not fit (2.3x the step)")
