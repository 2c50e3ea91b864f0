"""shardwise.simulate: figures of the pipeline simulator and its pictures (issue 5)."""
import json
import xml.etree.ElementTree as ET

import pytest
import torch

import shardwise
from shardwise import _C

SVG_NS = "{http://www.w3.org/2000/svg}"


def test_1f1b_bubble_and_memory():
    sim = shardwise.simulate("1f1b", stages=4, micro_batches=8)
    assert sim.bubble_fraction == pytest.approx(3 / 11, rel=0.01)
    assert sim.step_time == pytest.approx(33.0)
    assert sim.peak_in_flight == [4, 3, 2, 1]
    gpipe = shardwise.simulate("gpipe", stages=4, micro_batches=8)
    assert gpipe.bubble_fraction == pytest.approx(3 / 11, rel=0.01)
    assert gpipe.peak_in_flight[0] == 8


def test_interleaved_and_kfkb_run():
    inter = shardwise.simulate("interleaved-1f1b", stages=4, micro_batches=8, virtual_stages=2)
    base = shardwise.simulate("1f1b", stages=4, micro_batches=8)
    assert inter.bubble_fraction < base.bubble_fraction
    k2 = shardwise.simulate("kfkb", stages=4, micro_batches=8, k=2, comm=0.1)
    assert k2.peak_in_flight[0] == 8
    with pytest.raises(ValueError):
        shardwise.simulate("zigzag")


def test_a_plan_and_the_simulator_take_the_same_schedule_names():
    # One list (csrc/plan/plan.h): "interleaved" once planned but did not simulate.
    graph = shardwise.capture(shardwise.models.TinyGPT(), torch.zeros(2, 8, dtype=torch.long))
    cluster = shardwise.Cluster.preset("cpu", 4)
    for name in [*_C.schedule_names(), "interleaved", "Interleaved-1F1B"]:
        v = 2 if "interleaved" in name.lower() else 1
        plan = shardwise.Plan.manual(graph, cluster, pipeline=2, data=2, global_batch=8, micro_batch=1,
                                     schedule=name, virtual_stages=v, recompute="none")
        sim = shardwise.simulate(name.lower(), stages=2, micro_batches=4, virtual_stages=v)
        assert sim.schedule == plan.schedule, name
    assert shardwise.simulate("interleaved", 4, 8, 2).step_time == shardwise.simulate("interleaved-1f1b", 4, 8, 2).step_time
    with pytest.raises(shardwise.ValidationError, match=r"unknown schedule 'zigzag' \(known: gpipe, 1f1b, "):
        shardwise.Plan.manual(graph, cluster, pipeline=2, global_batch=8, micro_batch=1, schedule="zigzag")


def test_the_channels_a_schedules_sends_travel_on():
    # (sender, receiver, gradient) in pipeline ranks: one per way and kind of a link, what the
    # pipeline engine opens a process group for (runtime/stage_links.py).
    from shardwise import _C
    assert _C.simulate_schedule("1f1b", 3, 4).p2p_channels() == [
        (0, 1, False), (1, 0, True), (1, 2, False), (2, 1, True)]
    # ZB-V's V: stages 0 1 2 3 on ranks 0 1 1 0, both ways and both kinds on the one link.
    assert _C.simulate_schedule("zb-v", 2, 4).p2p_channels() == [
        (0, 1, False), (0, 1, True), (1, 0, False), (1, 0, True)]
    # Interleaved 1F1B's wrap: stage 1 (rank 1) hands on to stage 2 (rank 0).
    assert (1, 0, False) in _C.simulate_schedule("interleaved-1f1b", 2, 4, virtual_stages=2).p2p_channels()


def test_pictures(tmp_path):
    sim = shardwise.simulate("1f1b", stages=4, micro_batches=8, comm=0.1, optimizer_step=0.5)
    svg_path = tmp_path / "t.svg"
    sim.timeline_svg(svg_path, title="1F1B <p=4, m=8>")
    root = ET.parse(svg_path).getroot()
    assert root.tag == SVG_NS + "svg"
    rows = [g for g in root.iter(SVG_NS + "g") if g.get("class") == "rank"]
    assert len(rows) == 4
    rects = [r for r in root.iter(SVG_NS + "rect") if r.get("class", "").startswith("interval ")]
    assert sum(r.get("class") == "interval forward" for r in rects) == 32
    assert sum(r.get("class") == "interval backward" for r in rects) == 32

    trace_path = tmp_path / "t.json"
    sim.chrome_trace(trace_path)
    doc = json.loads(trace_path.read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    # forward + backward (64) + sends (3 boundaries x 8 mb x 2 directions = 48) + recv waits + updates (4).
    cats = {c: sum(e["cat"] == c for e in xs) for c in ("forward", "backward", "send", "recv_wait", "update")}
    assert cats["forward"] == 32 and cats["backward"] == 32
    assert cats["send"] == 48
    assert cats["update"] == 4
    assert len(xs) == sim.trace_event_count == sum(cats.values())
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"rank 0", "rank 1", "rank 2", "rank 3"}


def test_zero_bubble_h1_fills_1f1bs_bubble_with_weight_gradients(tmp_path):
    # p = 8, m = 16, F = 1 and a backward of 2 split evenly into B and W (the zero-bubble
    # paper's T_B = T_W): 57 against 1F1B's (m + p - 1)(F + B + W) = 69, with the pipeline's
    # peak activation memory unchanged (csrc/schedule/schedules.h states the bound).
    zb = shardwise.simulate("zb-h1", stages=8, micro_batches=16, forward=1.0, backward=2.0)
    base = shardwise.simulate("1f1b", stages=8, micro_batches=16, forward=1.0, backward=2.0)
    assert base.step_time == pytest.approx(69.0)
    assert zb.step_time == pytest.approx(57.0) and zb.step_time <= 0.85 * base.step_time
    assert max(zb.peak_in_flight) <= max(base.peak_in_flight)
    assert "W0@s0" in zb.actions(0) and "W" not in base.actions(0).replace("->", "")
    svg = zb.timeline_svg(tmp_path / "zb.svg")
    assert "weight gradient" in svg
    # All of the backward in B: no bubble to fill, the 1F1B step again.
    assert shardwise.simulate("zb-h1", stages=8, micro_batches=16, weight_fraction=0.0).step_time >= 69.0
    with pytest.raises(shardwise.ValidationError, match="weight_fraction"):
        shardwise.simulate("zb-h1", stages=2, micro_batches=2, weight_fraction=1.5)


def test_a_homogeneous_pipelines_stages_are_simulated_at_their_own_times():
    # The first stage holds the embedding, the last the head and the loss over a large
    # vocabulary: their times differ from a middle stage's, and the plan's simulation (its
    # timeline, its Chrome trace) draws each rank at its own stage's time, not all at the
    # slowest's (before: stage times were written for heterogeneous clusters only).
    graph = shardwise.models.gpt(layers=8, hidden=256, heads=4, seq=128, vocab=50304, batch=8)
    cluster = shardwise.Cluster.preset("dgx-a100", 1)
    plan = shardwise.Plan.manual(graph, cluster, tensor=1, pipeline=4, data=2, global_batch=16, micro_batch=1,
                                 schedule="1f1b")
    times = json.loads(plan.to_json())["predicted"]["stage_times"]
    assert len(times) == 4 and min(times) > 0
    assert times[3] > 1.2 * times[1], times  # the head and the loss over 50,304 classes
    busy = plan.simulation().busy
    for rank in range(4):
        assert busy[rank] / busy[1] == pytest.approx(times[rank] / times[1], rel=1e-6), (busy, times)
    spmd = shardwise.Plan.manual(graph, cluster, tensor=1, pipeline=1, data=8, global_batch=16)
    assert "stage_times" not in json.loads(spmd.to_json())["predicted"]  # one stage: nothing to scale
