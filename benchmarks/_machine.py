"""What the benchmarks print about the machine they ran on (shared by planner_scaling.py,
plan_quality.py and end_to_end.py)."""
from __future__ import annotations

import os
import platform
import time


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load() -> str:
    try:
        one, five, fifteen = os.getloadavg()
        return f"{one:.2f} {five:.2f} {fifteen:.2f}"
    except OSError:
        return "n/a"


def machine_line() -> str:
    import torch

    return (f"machine: {cpu_model()}, {os.cpu_count()} cores, {platform.machine()}, torch {torch.__version__}, "
            f"load average {load()} (1, 5, 15 min), {time.strftime('%Y-%m-%d %H:%M')}")


class Timer:
    """Wall and CPU seconds of a block: `with Timer() as t: ...; t.wall, t.cpu`."""

    def __enter__(self) -> "Timer":
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu
