"""shardwise.simulate: figures of the pipeline simulator and its pictures (issue 5)."""
import json
import xml.etree.ElementTree as ET

import pytest

import shardwise

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
