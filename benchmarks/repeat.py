"""Clean exits, counted: the README's job and the examples run again and again under torchrun.

    python benchmarks/repeat.py                 # 50 runs of each job
    python benchmarks/repeat.py --runs 5 --jobs readme
    python benchmarks/repeat.py --record        # + the table into results/repeat.json and the README

Each run is a fresh `torchrun --standalone` (a free port) of one job:

- readme:      `-m shardwise train` (scripts/quickstart.sh's job: TinyGPT on 4 processes)
- train_gpt2:  examples/train_gpt2.py on 2 processes
- user_groups: a script that makes process groups of its own (a subgroup and an all-reduce on it)
               beside a shardwise engine, and leaves them to the interpreter's exit

A run is an abort when torchrun's exit code is not 0 or a rank printed torch's teardown crash
("terminate called", SIGABRT), and a hang when it outlives --timeout (then it is killed). The
table says, per job, runs, clean exits, aborts, hangs and the median wall time; the first
output of a failed run is printed below it. Nothing here is asserted: a benchmark counts.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

USER_GROUPS = """
import torch
import torch.distributed as dist

import shardwise

dist.init_process_group("gloo")
mine = dist.new_group(list(range(dist.get_world_size())))  # the user's own group, never destroyed
t = torch.ones(1)
dist.all_reduce(t, group=mine)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
engine = shardwise.parallelize(model, batch, torch.nn.functional.cross_entropy)
optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-3)
for _ in range(3):
    optimizer.zero_grad()
    loss = engine.train_step(*batch)
    optimizer.step()
if dist.get_rank() == 0:
    print(f"loss {float(loss):.4f}, all-reduce on the user's group {float(t):.0f}")
"""


def _jobs(workdir: pathlib.Path) -> dict[str, list[str]]:
    script = workdir / "user_groups.py"
    script.write_text(USER_GROUPS)
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return {
        "readme": [*run, "--nproc-per-node", "4", "-m", "shardwise", "train", "--steps", "3"],
        "train_gpt2": [*run, "--nproc-per-node", "2", str(ROOT / "examples" / "train_gpt2.py")],
        "user_groups": [*run, "--nproc-per-node", "2", str(script)],
    }


def run_once(argv: list[str], timeout: float, env: dict) -> tuple[str, float, str]:
    """('clean' | 'abort' | 'hang', seconds, output)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        return "hang", time.perf_counter() - start, out
    seconds = time.perf_counter() - start
    crashed = "terminate called" in out or "SIGABRT" in out or "Signals.SIGABRT" in out
    return ("abort" if proc.returncode != 0 or crashed else "clean"), seconds, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="runs of each job")
    parser.add_argument("--jobs", nargs="+", default=["readme", "train_gpt2", "user_groups"])
    parser.add_argument("--timeout", type=float, default=300, help="seconds before a run counts as hung")
    from _results import add_record_argument, record

    add_record_argument(parser)
    args = parser.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "python"),
                                                                      os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as tmp:
        jobs = _jobs(pathlib.Path(tmp))
        unknown = [j for j in args.jobs if j not in jobs]
        if unknown:
            parser.error(f"unknown jobs {unknown}; known: {sorted(jobs)}")
        rows, failures = [], []
        for name in args.jobs:
            counts = {"clean": 0, "abort": 0, "hang": 0}
            times = []
            for i in range(args.runs):
                outcome, seconds, out = run_once(jobs[name], args.timeout, env)
                counts[outcome] += 1
                times.append(seconds)
                print(f"{name} run {i + 1}/{args.runs}: {outcome} in {seconds:.1f} s", file=sys.stderr, flush=True)
                if outcome != "clean" and len(failures) < 3:
                    failures.append((name, i + 1, outcome, out[-3000:]))
            rows.append((name, args.runs, counts, statistics.median(times)))
    print(f"torch {__import__('torch').__version__}, {os.cpu_count()} cores; each run a fresh torchrun --standalone")
    print(f"{'job':<12} {'runs':>5} {'clean':>6} {'aborts':>7} {'hangs':>6} {'median s':>9}")
    for name, runs, counts, median in rows:
        print(f"{name:<12} {runs:>5} {counts['clean']:>6} {counts['abort']:>7} {counts['hang']:>6} {median:>9.1f}")
    total = {k: sum(r[2][k] for r in rows) for k in ("clean", "abort", "hang")}
    print(f"in all: {sum(r[1] for r in rows)} runs, {total['abort']} aborts, {total['hang']} hangs")
    for name, i, outcome, out in failures:
        print(f"\n--- {name} run {i}: {outcome}; the end of its output ---\n{out}")
    if args.record:
        record("repeat", [[name, runs, counts["clean"], counts["abort"], counts["hang"], median]
                          for name, runs, counts, median in rows], {
            "columns": ["job", "runs", "clean", "aborts", "hangs", "median s"],
            "formats": {"median s": ".1f"},
            "notes": f"{sum(r[1] for r in rows)} runs, {total['abort']} aborts, {total['hang']} hangs; each a fresh "
                     f"torchrun --standalone; a hang: past {args.timeout:g} s."})
    return 0


if __name__ == "__main__":
    sys.exit(main())
