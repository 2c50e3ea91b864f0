"""The CLI's terminal side: a plan as rich tables, a search's progress bar, files written whole.

``plan.report()`` stays the plain-text form (logs, tests, files); these tables show the same
figures on a terminal (named by ``_report``): the devices and what each mesh axis carries, the
predicted step time and its parts, MFU beside the devices' peak, memory per device by kind
against the device's capacity, placements per parameter group and the collectives of one step.
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
from ._report import (bytes_text, collective_totals, devices_text, hardware_of, memory_parts, mesh_text, mfu,
                      percent_text, seconds_text, time_parts, world_size)


def _group(name: str) -> str:
    """Names that differ only in a block number are one parameter group."""
    return re.sub(r"\.\d+\.", ".*.", name)


def plan_tables(plan, cluster) -> list[Table]:
    """The plan as tables: summary, time, memory, placements per group (SPMD plans), collectives."""
    hardware = hardware_of(cluster) if cluster is not None else plan._context()["hardware"]
    values = plan._report_values()
    out = []
    summary = Table(title="plan", show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("devices", f"{devices_text(hardware, world_size(plan))}: {mesh_text(plan, values)}")
    if plan.pipeline > 1:
        stages = plan.layers_per_stage
        summary.add_row("stages", f"{plan.pipeline} x {plan.virtual_stages} virtual"
                        + (f", layers {list(stages)}" if stages else ", layers balanced by FLOPs"))
        schedule = plan.schedule + (f" (k={plan.kfkb_k})" if plan.schedule == "kfkb" else "")
        summary.add_row("schedule", schedule)
    if not plan.sharding:
        m = plan.num_micro_batches()
        summary.add_row("batch", f"global {plan.global_batch}, {m} micro-batch{'es' if m != 1 else ''} of "
                        f"{plan.micro_batch}" + (f" on each of {plan.data} batch ranks" if plan.data > 1 else ""))
    else:
        summary.add_row("batch", f"global {plan.global_batch}")
    step = plan.predicted_step_time()
    summary.add_row("predicted step", seconds_text(step))
    _, utilisation = mfu(plan, hardware)
    summary.add_row("MFU", utilisation.removeprefix("MFU "))
    memory, _ = plan.predicted_memory()
    capacity = hardware["memory_bytes"] if hardware else None
    used = f"{bytes_text(memory)} per device" + (f" of {bytes_text(capacity)} ({percent_text(memory / capacity)})"
                                                 if capacity else "")
    summary.add_row("memory", used + ("" if plan.fits is not False else "  [red]fits under no plan[/red]"))
    if plan.search_seconds() is not None:
        summary.add_row("search", f"{plan.search_seconds():.2f} s")
    out.append(summary)

    time = Table(title="predicted time per step", title_justify="left")
    time.add_column("part")
    time.add_column("time", justify="right")
    time.add_column("share", justify="right")
    time.add_column("")
    parts, bubble = time_parts(plan, values)
    for part in parts:
        time.add_row(part.label, seconds_text(part.seconds), f"{100 * part.seconds / step:.1f}%" if step else "",
                     part.note)
        for inner in part.parts:
            time.add_row("  " + inner.label, seconds_text(inner.seconds),
                         f"{100 * inner.seconds / step:.1f}%" if step else "", inner.note)
    if bubble is None:
        time.add_row("pipeline bubble", "none", "", "one pipeline stage")
    out.append(time)

    kinds, note = memory_parts(plan, values)
    table = Table(title="memory per device" + (f" ({note})" if note else ""), title_justify="left")
    table.add_column("kind")
    table.add_column("bytes", justify="right")
    table.add_column("share", justify="right")
    for kind, value in kinds:
        table.add_row(kind, bytes_text(value), f"{100 * value / memory:.1f}%" if memory else "")
    if capacity:
        table.add_row("[dim]device capacity[/dim]", bytes_text(capacity), "")
    out.append(table)

    sharding = plan.sharding
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
        collectives = collective_totals(plan)
        table = Table(title="collectives per step", title_justify="left")
        for column in ("kind", "mesh axis", "phase"):
            table.add_column(column)
        for column in ("calls", "bytes", "time"):
            table.add_column(column, justify="right")
        for (kind, axis, phase), (count, size, seconds) in sorted(collectives.items(), key=lambda kv: -kv[1][2]):
            table.add_row(kind.replace("_", "-"), str(axis), phase, f"{count:g}", bytes_text(size),
                          seconds_text(seconds))
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
