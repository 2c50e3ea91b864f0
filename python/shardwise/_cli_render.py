"""The CLI's terminal side: a plan as rich tables, a search's progress bar, files written whole.

``plan.report()`` stays the plain-text form (logs, tests, files); these tables show the same
figures on a terminal: the mesh and stages, the predicted step time and its parts, TFLOP/s
per device, memory per rank against the device's capacity, placements per parameter group
and the collectives of one step.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import _C



def _seconds(s: float) -> str:
    return f"{s:.3g} s" if s >= 1 else f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} us"


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _group(name: str) -> str:
    """Names that differ only in a block number are one parameter group."""
    return re.sub(r"\.\d+\.", ".*.", name)


def plan_tables(plan, cluster) -> list[Table]:
    """The plan as tables: summary, time, placements per group (SPMD plans), collectives."""
    out = []
    summary = Table(title="plan", show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    sharding = plan.sharding
    if sharding:
        summary.add_row("mesh", " x ".join(str(s) for s in sharding["mesh"]) + " (data x tensor)")
    elif plan.stage_meshes:
        summary.add_row("mesh", "stages on " + ", ".join(f"data {a} x tensor {b}" for a, b in plan.stage_meshes))
    else:
        summary.add_row("mesh", f"data {plan.data} x tensor {plan.tensor} x pipeline {plan.pipeline}")
    if plan.pipeline > 1:
        stages = plan.layers_per_stage
        summary.add_row("stages", f"{plan.pipeline} x {plan.virtual_stages} virtual"
                        + (f", layers {list(stages)}" if stages else ", layers balanced by FLOPs"))
        schedule = plan.schedule + (f" (k={plan.kfkb_k})" if plan.schedule == "kfkb" else "")
        summary.add_row("schedule", schedule)
        summary.add_row("batch", f"global {plan.global_batch}, micro-batch {plan.micro_batch}, "
                        f"{plan.global_batch // max(1, plan.micro_batch * plan.data)} micro-batches")
    else:
        summary.add_row("batch", f"global {plan.global_batch}")
    summary.add_row("step", _seconds(plan.predicted_step_time()))
    summary.add_row("TFLOP/s per device", f"{plan.predicted_tflops_per_device():.1f}")
    memory, parts = plan.predicted_memory()
    capacity = cluster.device_of(0)["memory_bytes"] if cluster is not None else None
    used = f"{_bytes(memory)} per rank" + (f" of {_bytes(capacity)} ({100 * memory / capacity:.0f}%)"
                                           if capacity else "")
    summary.add_row("memory", used + ("" if plan.fits is not False else "  [red]fits under no plan[/red]"))
    summary.add_row("memory parts", ", ".join(f"{k} {_bytes(v)}" for k, v in sorted(parts.items())
                                              if v and k != "stage"))  # stage: the most loaded one, a number
    if plan.search_seconds() is not None:
        summary.add_row("search", f"{plan.search_seconds():.2f} s")
    out.append(summary)

    time = Table(title="predicted time per step", title_justify="left")
    time.add_column("part")
    time.add_column("time", justify="right")
    time.add_column("share", justify="right")
    step = plan.predicted_step_time()
    for part, seconds in sorted(plan.breakdown().items(), key=lambda kv: -kv[1]):
        # *_total: the time before overlap, not on the step; *_overlapped: a flag, not seconds
        if seconds > 0 and not part.endswith(("_total", "_overlapped")):
            time.add_row(part, _seconds(seconds), f"{100 * seconds / step:.1f}%" if step else "")
    out.append(time)

    if sharding:
        groups: dict[tuple, list] = {}
        zero = sharding.get("zero", {})
        placements = plan.placements()
        for name in sharding.get("leaves") or placements:  # parameters and inputs
            placement = placements[name]
            key = (_group(name), tuple(placement), tuple(zero.get(name, ())))
            groups.setdefault(key, []).append(name)
        table = Table(title="parameters and inputs: placement per mesh axis", title_justify="left")
        table.add_column("parameter group")
        table.add_column("count", justify="right")
        table.add_column("placement")
        table.add_column("optimizer state")
        for (group, placement, axes), names in groups.items():
            table.add_row(group, str(len(names)), "[" + ", ".join(map(_C.readable_placement, placement)) + "]",
                          f"sharded on axis {','.join(map(str, axes))}" if axes else "")
        out.append(table)
        collectives: dict[tuple, list[float]] = {}
        for c in plan.collectives():
            total = collectives.setdefault((c["kind"], c["axis"], c["phase"]), [0.0, 0.0, 0.0])
            total[0] += c["count"]
            total[1] += c["bytes"] * c["count"]
            total[2] += c["seconds"]
        table = Table(title="collectives per step", title_justify="left")
        for column in ("kind", "mesh axis", "phase"):
            table.add_column(column)
        for column in ("calls", "bytes", "time"):
            table.add_column(column, justify="right")
        for (kind, axis, phase), (count, size, seconds) in sorted(collectives.items(), key=lambda kv: -kv[1][2]):
            table.add_row(kind, str(axis), phase, f"{count:g}", _bytes(size), _seconds(seconds))
        out.append(table)
    return out


def print_plan(plan, cluster, console: Console | None = None) -> None:
    console = console or Console()
    for table in plan_tables(plan, cluster):
        console.print(table)


@contextlib.contextmanager
def search_progress(description: str, enabled: bool):
    """A progress bar on stderr fed by the search's progress(done, total) callback; yields
    the callback (one that draws nothing when disabled: no terminal)."""
    if not enabled:
        # Still a callback: the search calls back into Python between candidates, which is
        # where a pending Ctrl-C raises KeyboardInterrupt (a search given none runs to its end).
        yield lambda done, total: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


@contextlib.contextmanager
def status(message: str, enabled: bool):
    """A spinner on stderr while something without steps runs (capturing a large model)."""
    if not enabled:
        yield
        return
    with Console(stderr=True).status(message):
        yield


def write_whole(path: str, text: str) -> None:
    """Writes `text` to `path` through a temporary file in the same directory, renamed at the
    end: an interrupted write leaves the previous file (or none), never half of one."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".shardwise-", suffix=".partial")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # as open(path, "w") would make it, not mkstemp's 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def interactive() -> bool:
    return sys.stderr.isatty()
