"""shardwise.simulate: cost a pipeline schedule with the discrete-event simulator.

Example::

    sim = shardwise.simulate("1f1b", stages=4, micro_batches=8)
    sim.step_time            # 33.0 (forward 1 s, backward 2 s per stage, free network)
    sim.bubble_fraction      # 3 / 11
    sim.peak_in_flight       # [4, 3, 2, 1]
    sim.timeline_svg("1f1b.svg")    # one row per rank, GPipe / 1F1B paper style
    sim.chrome_trace("1f1b.json")   # open in https://ui.perfetto.dev

`forward` / `backward` are the seconds of one micro-batch through one pipeline stage;
with `virtual_stages` v each of a rank's v chunks takes 1/v of them. `comm` is the
seconds of every point-to-point transfer (0 = free network); a transfer starts once its
receive is posted, as Gloo and NCCL start one (csrc/schedule/simulator.h).
"""
from __future__ import annotations

import os
from typing import List, Union

from . import _C
from ._core_property import core_property

SCHEDULES = tuple(_C.schedule_names())  # the plan's names (csrc/plan/plan.h), "interleaved" accepted too

PathLike = Union[str, "os.PathLike[str]"]


def _written(path: PathLike, text: str) -> str:
    with open(os.fspath(path), "w", encoding="utf-8") as f:
        f.write(text)
    return text


class Simulation:
    """Result of :func:`simulate`: figures of one simulated training step and its pictures."""

    def __init__(self, sim: "_C.Simulation", schedule: str) -> None:
        self._sim = sim
        self.schedule = schedule

    step_time = core_property("step_time", "Seconds of the simulated step.", holder="_sim")
    bubble_fraction = core_property("bubble_fraction", holder="_sim")
    bubble_overhead = core_property("bubble_overhead", holder="_sim")
    busy = core_property("busy", "Seconds each rank computes (forward, backward, weight gradient) in the step.",
                         holder="_sim", convert=list)
    peak_in_flight = core_property("peak_in_flight", "Micro-batches each rank holds at most at once.",
                                   holder="_sim", convert=list)
    ranks = core_property("ranks", holder="_sim")
    trace_event_count = core_property(
        "trace_event_count", 'Number of "X" events :meth:`chrome_trace` writes (every non-idle interval).',
        holder="_sim")

    def actions(self, rank: int) -> str:
        """The rank's action list as text, e.g. ``"F0@s0 SA0@s0->r1 ..."``."""
        return self._sim.actions(rank)

    def timeline_svg(self, path: PathLike, title: str = "", width: float = 1000.0) -> str:
        """Writes the timeline as SVG to `path`; returns the SVG text."""
        return _written(path, self._sim.timeline_svg(title, width))

    def chrome_trace(self, path: PathLike) -> str:
        """Writes the timeline as Chrome trace JSON to `path`; returns the JSON text."""
        return _written(path, self._sim.chrome_trace())

    def __repr__(self) -> str:
        return (f"Simulation({self.schedule!r}, ranks={self.ranks}, step_time={self.step_time:.4g}, "
                f"bubble_fraction={self.bubble_fraction:.4f})")


def simulate(schedule: str = "1f1b", stages: int = 4, micro_batches: int = 8, virtual_stages: int = 1, k: int = 1,
             forward: float = 1.0, backward: float = 2.0, comm: float = 0.0,
             optimizer_step: float = 0.0, weight_fraction: float = 0.5,
             stage_scale: List[float] | None = None, devices: List[str] | None = None) -> Simulation:
    """Simulates one step of `schedule` ("1f1b", "gpipe", "interleaved-1f1b", "kfkb", "zb-h1",
    "zb-v" or "dualpipe-v"). "zb-h1", "zb-v" (zero bubble, csrc/schedule/schedules.h) and
    "dualpipe-v" (DeepSeek's DualPipeV; zb-v and dualpipe-v: two chunks per rank in a V,
    whatever `virtual_stages` says) split each backward: its
    `weight_fraction` computes the weights' gradients (W), run later to fill the bubbles, the
    rest the input's (B). Plans take it too (``Plan.manual(schedule="zb-h1")``, the joint
    planner's candidates without recomputation); the runtime splits each stage's backward where
    csrc/transform/weight_gradient_split.h says (runtime/weight_split.py).
    A heterogeneous pipeline: ``stage_scale`` (one per rank) multiplies that rank's times (a
    stage on devices half as fast: 2), and ``devices`` (one per rank) names each row of the
    timeline and each thread of the trace ("rank 1 a100-half")."""
    try:
        schedule = _C.canonical_schedule(schedule)
    except _C.ValidationError:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}") from None
    sim = _C.simulate_schedule(schedule, stages, micro_batches, virtual_stages, k, forward, backward, comm,
                               optimizer_step, weight_fraction, [float(x) for x in stage_scale or []],
                               [str(x) for x in devices or []])
    return Simulation(sim, schedule)
