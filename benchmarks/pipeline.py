"""shardwise's pipeline plans against torch.distributed.pipelining, side by side.

    python benchmarks/pipeline.py                       # 2 Gloo processes on this machine
    python benchmarks/pipeline.py --profile             # + torch.profiler of one step of rank 0
    torchrun-free on GPUs: python benchmarks/pipeline.py --device cuda   # NCCL, one GPU per stage
    python benchmarks/pipeline.py --record              # + its row into results/pipeline.json and the README

The same TinyGPT, the same global batch, micro-batches and Gloo world of ``--stages`` processes
(one per stage), the same AdamW; six trainings from the same weights, alternating step by step:

- ours: ``shardwise.parallelize(model, batch, plan=...)`` with a pipeline plan (pipeline p,
  micro_batch b, schedule "gpipe", "1f1b", "zb-h1", "zb-v" or "dualpipe-v", data = tensor = 1):
  shardwise cuts the captured graph into p FLOPs-balanced stages at block boundaries (2p for
  the V-shaped zb-v and dualpipe-v) and runs its schedule's action list;
- torch: ``torch.distributed.pipelining.PipelineStage`` over hand-split stage modules cut at
  the same block boundaries shardwise chose (read from its stage modules), driven by
  ``ScheduleGPipe`` / ``Schedule1F1B`` / ``ScheduleInterleavedZeroBubble`` (one stage per
  rank: its ZB1P is ZB-H1) / ``ScheduleZBVZeroBubble`` / ``ScheduleDualPipeV`` (two stages
  per rank in a V) with the same number of micro-batches.

Both zero-bubble sides split each backward into B and W: shardwise where the core cuts it
(csrc/transform/weight_gradient_split.h, runtime/weight_split.py), torch by autograd-graph
surgery (torch/distributed/pipelining/_backward.py).

Every shardwise stage adds each micro-batch's weight gradient of its linears into ``.grad``
inside the product that makes it (runtime/fused_accumulation.py); torch's make it in a fresh
tensor that AccumulateGrad adds in (benchmarks/fused_accumulation.py measures the difference).

TinyGPT ties its LM head to its embedding: shardwise holds the weight on the first and the
last stage and all-reduces its gradient between them; the torch side does the same by hand
(an ``all_reduce`` of the two copies' gradients after ``schedule.step``). All six compute the
same losses (the largest difference is printed). Printed: the median step time of each, the
throughput (samples / s) and the ratio ours / torch of throughputs (the issue's target: >= 1.0).

Nothing hangs: the process group has a timeout (``--timeout``) and the parent kills its
workers past ``--deadline``. If one of torch's schedules fails, its error text is printed and
the run is repeated without it (``--skip-torch-schedules``): shardwise's figure for that
schedule stands alone, the others stay side by side. Timing never fails anything.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from _machine import cpu_model
from _workers import gpt2_token_table, pipeline_plan, profile_steps

SCHEDULES = ("gpipe", "1f1b", "zb-h1", "zb-v", "dualpipe-v")
V_SHAPED = (("zb-v", "ScheduleZBVZeroBubble"), ("dualpipe-v", "ScheduleDualPipeV"))  # two stages per rank in a V


class TorchStage(nn.Module):
    """Blocks [lo, hi) of a TinyGPT, with its embeddings on the first stage and its final norm
    and LM head (an untied copy of the embedding; gradients summed by hand) on the last."""

    def __init__(self, model: nn.Module, lo: int, hi: int, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.wte, self.wpe = model.wte, model.wpe
        self.blocks = nn.ModuleList(model.blocks[lo:hi])
        if last:
            self.ln_f = model.ln_f
            self.lm_head = nn.Linear(model.cfg.hidden, model.cfg.vocab, bias=False)
            with torch.no_grad():
                self.lm_head.weight.copy_(model.wte.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x

    def tied(self) -> list[torch.Tensor]:
        return ([self.wte.weight] if self.first else []) + ([self.lm_head.weight] if self.last else [])


def _span(blocks: list[int]) -> tuple[int, int]:
    """[lo, hi) of a stage's blocks; (0, 0) for a stage without any (a last one of norm and head)."""
    return (blocks[0], blocks[-1] + 1) if blocks else (0, 0)


def _shown(blocks: list[int]) -> str:
    return f"{blocks[0]}-{blocks[-1]}" if blocks else "none"


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _blocks_of(engine) -> dict[int, list[int]]:
    """Block indices of each of this rank's shardwise stages (read off its modules' parameter names)."""
    out = {}
    for g, stage in engine._stages.items():
        out[g] = sorted({int(name.split(".")[1]) for name, _ in stage["module"].named_parameters()
                         if name.startswith("blocks.")})
    return out


def _worker(rank: int, world: int, store: str, args, out: str) -> None:
    import shardwise
    from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    device = torch.device(f"cuda:{rank % max(1, torch.cuda.device_count())}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.FileStore(store, world), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=args.timeout))
    cfg = TinyGPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq, vocab=args.vocab)
    torch.manual_seed(0)
    reference = TinyGPT(cfg)
    gpt2_token_table(reference)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg.vocab, (args.batch, cfg.seq), generator=g)
    batch = tuple(t.to(device) for t in (idx, torch.roll(idx, -1, dims=1)))
    m = args.batch // args.micro_batch
    last = rank == world - 1
    report = {"rank": rank, "errors": {}, "times": {}, "cpu": {}, "losses": {}, "profiles": {}}

    steps = {}  # name -> callable returning the loss on the last rank (None elsewhere)
    cuts = {}   # schedule -> {stage: blocks} on this rank (ZB-V cuts 2p stages, the others p)
    for schedule in SCHEDULES:
        name = f"shardwise {schedule}"
        try:
            model = TinyGPT(cfg).to(device)
            model.load_state_dict(reference.state_dict())
            engine = shardwise.parallelize(model, batch, plan=pipeline_plan(args.batch, args.micro_batch, schedule,
                                                                           world))
            opt = torch.optim.AdamW(engine.parameters(), lr=1e-3)
            cuts[schedule] = _blocks_of(engine)

            def ours(engine=engine, opt=opt):
                opt.zero_grad()
                loss = engine.train_step(*batch)
                opt.step()
                return loss.item()

            steps[name] = ours
        except Exception as e:  # noqa: BLE001 - recorded and printed by the parent
            report["errors"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
    # The same stage boundaries for torch: every rank's block ranges, per schedule.
    everyone = [None] * world
    dist.all_gather_object(everyone, cuts)
    stages_of = {s: {g: blocks for rank_cuts in everyone for g, blocks in rank_cuts.get(s, {}).items()}
                 for s in SCHEDULES}
    report["cut"] = [everyone[r].get("1f1b", {}).get(r) for r in range(world)]
    report["cut_v"] = {s: [stages_of[s].get(g) for g in range(2 * world)] for s, _ in V_SHAPED}
    ranges = report["cut"]
    if not args.skip_torch and all(r is not None for r in ranges):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleavedZeroBubble

        def zero_bubble(stage, n_microbatches, loss_fn):  # torch's ZB1P, one stage per rank: ZB-H1
            return ScheduleInterleavedZeroBubble([stage], n_microbatches=n_microbatches, loss_fn=loss_fn)

        tied_group = dist.new_group(sorted({0, world - 1}))
        for schedule, cls in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B), ("zb-h1", zero_bubble)):
            name = f"torch {schedule}"
            if schedule in args.skip_torch_schedules:
                continue
            try:
                model = TinyGPT(cfg)
                model.load_state_dict(reference.state_dict())
                lo, hi = _span(ranges[rank])
                module = TorchStage(model, lo, hi, rank == 0, last).to(device)
                stage = PipelineStage(module, rank, world, device)
                sched = cls(stage, n_microbatches=m, loss_fn=lm_loss)
                opt = torch.optim.AdamW(module.parameters(), lr=1e-3)

                def theirs(module=module, sched=sched, opt=opt):
                    opt.zero_grad()
                    losses = []
                    if rank == 0:
                        sched.step(batch[0], target=batch[1] if last else None, losses=losses if last else None)
                    elif last:
                        sched.step(target=batch[1], losses=losses)
                    else:
                        sched.step()
                    for w in module.tied():
                        dist.all_reduce(w.grad, group=tied_group)
                    opt.step()
                    return torch.stack(losses).mean().item() if last else None

                steps[name] = theirs
            except Exception as e:  # noqa: BLE001
                report["errors"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
        # ZB-V and DualPipeV: two stages per rank in a V (rank r holds stages r and 2p - 1 - r),
        # cut where ours is.
        import torch.distributed.pipelining as pipelining

        for v_schedule, cls_name in V_SHAPED:
            name = f"torch {v_schedule}"
            if v_schedule in args.skip_torch_schedules:
                continue
            try:
                if v_schedule not in cuts or any(c is None for c in report["cut_v"][v_schedule]):
                    raise RuntimeError(f"shardwise's {v_schedule} cut is missing")
                held = [b for blocks in report["cut_v"][v_schedule] for b in blocks]
                if len(held) != len(set(held)):  # torch's stages hold whole blocks: one would run twice
                    raise RuntimeError(f"shardwise cut a block across two of {v_schedule}'s {2 * world} stages "
                                       f"(blocks per stage: {report['cut_v'][v_schedule]}); torch's stages hold whole "
                                       f"blocks: give --layers at least {2 * world}")
                model = TinyGPT(cfg)
                model.load_state_dict(reference.state_dict())
                mine = [rank, 2 * world - 1 - rank]
                modules = []
                for g in mine:
                    lo, hi = _span(report["cut_v"][v_schedule][g])
                    modules.append(TorchStage(model, lo, hi, g == 0, g == 2 * world - 1).to(device))
                stages = [PipelineStage(mod, g, 2 * world, device) for mod, g in zip(modules, mine)]
                sched = getattr(pipelining, cls_name)(stages, n_microbatches=m, loss_fn=lm_loss)
                params = [p for mod in modules for p in mod.parameters()]
                opt = torch.optim.AdamW(params, lr=1e-3)

                def theirs_v(modules=modules, sched=sched, opt=opt):
                    opt.zero_grad()
                    losses = []
                    if rank == 0:  # the first and the last stage
                        sched.step(batch[0], target=batch[1], losses=losses)
                    else:
                        sched.step()
                    tied = [w for mod in modules for w in mod.tied()]  # both on rank 0: summed there
                    if len(tied) == 2:
                        tied[0].grad.add_(tied[1].grad)
                        tied[1].grad.copy_(tied[0].grad)
                    opt.step()
                    return torch.stack(losses).mean().item() if rank == 0 else None

                steps[name] = theirs_v
            except Exception as e:  # noqa: BLE001
                report["errors"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"

    failed = set()
    for step in range(args.warmup + args.steps):
        for name, fn in steps.items():
            if name in failed:
                continue
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                loss = fn()
            except Exception as e:  # noqa: BLE001 - a failed collective: this side is done
                report["errors"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"
                failed.add(name)
                break
            dist.barrier()
            if step >= args.warmup:
                report["times"].setdefault(name, []).append(time.perf_counter() - t0)
                report["cpu"].setdefault(name, []).append(time.process_time() - c0)
            report["losses"].setdefault(name, []).append(loss)
        if failed:
            break
    if args.profile and not failed:
        report["profiles"] = profile_steps(steps, args.profile_rank in (rank, -1), width=44)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(report, f)
    if not failed:
        dist.destroy_process_group()


def _spawn(world: int, args) -> list[dict]:
    """Runs the workers with a deadline; returns every rank's report (a killed rank: none)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        ctx = mp.start_processes(_worker, args=(world, os.path.join(tmp, "store"), args, out), nprocs=world,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + args.deadline
        try:
            while not ctx.join(timeout=5):
                if time.monotonic() > deadline:
                    print(f"deadline of {args.deadline} s passed: stopping the workers")
                    for p in ctx.processes:
                        if p.is_alive():
                            p.terminate()
                    break
        except mp.ProcessRaisedException as e:
            print(f"a worker failed: {e}")
        reports = []
        for r in range(world):
            try:
                reports.append(json.load(open(f"{out}.{r}")))
            except OSError:
                reports.append({"rank": r, "errors": {"all": "no report (killed or crashed)"}, "times": {}, "cpu": {},
                                "losses": {}, "profiles": {}})
        return reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=2, help="pipeline stages = processes")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=256,
                        help="token table rows (GPT-2's: 50257; other than 256, initialised as GPT-2's)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--timeout", type=float, default=300, help="process group timeout, seconds")
    parser.add_argument("--deadline", type=float, default=1800, help="seconds before the workers are killed")
    parser.add_argument("--skip-torch", action="store_true", help="shardwise only")
    parser.add_argument("--skip-torch-schedules", type=lambda text: set(filter(None, text.split(","))),
                        default=set(), help="comma-separated schedules torch does not run (shardwise still does)")
    parser.add_argument("--profile", action="store_true", help="torch.profiler table of one step of each")
    parser.add_argument("--profile-rank", type=int, default=0, help="-1: every rank")
    from _results import add_record_argument, record

    add_record_argument(parser)
    args = parser.parse_args()
    if not args.skip_torch_schedules <= set(SCHEDULES):
        parser.error(f"--skip-torch-schedules: unknown {sorted(args.skip_torch_schedules - set(SCHEDULES))} "
                     f"(schedules: {', '.join(SCHEDULES)})")
    world = args.stages
    m = args.batch // args.micro_batch
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, torch "
          f"{torch.__version__}, {'NCCL' if args.device == 'cuda' else 'Gloo'}, world {world}")
    print(f"TinyGPT layers {args.layers}, hidden {args.hidden}, heads {args.heads}, seq {args.seq}, vocab "
          f"{args.vocab}; global batch {args.batch} = {m} micro-batches of {args.micro_batch}, {world} stages, "
          f"AdamW; median of {args.steps} steps after {args.warmup} of warm-up, {args.threads} thread(s) per process")
    reports = _spawn(world, args)
    errors = {name: text for r in reports for name, text in r["errors"].items()}
    # A failed torch schedule stops every rank's loop (its collectives may be left half done), so
    # the run is repeated without it; the other schedules keep their side-by-side comparison.
    # A crashed rank ("all") leaves nothing to tell which one failed: then shardwise alone.
    latest = dict(errors)
    while not args.skip_torch:
        failed = {name.split(" ", 1)[1] for name in latest if name.startswith("torch ")}
        if not failed and "all" not in latest:
            break
        for name, text in latest.items():
            print(f"FAILED {name} (torch {torch.__version__}):\n{text}")
        if "all" in latest:
            print("measuring shardwise alone")
            args.skip_torch = True
        else:
            args.skip_torch_schedules |= failed
            print(f"measuring again without torch's {', '.join(sorted(args.skip_torch_schedules))}")
        reports = _spawn(world, args)
        latest = {name: text for r in reports for name, text in r["errors"].items()}
        errors.update(latest)
    if reports[0].get("cut"):
        print("stage blocks (shardwise's cut, used for both): "
              + ", ".join(f"rank {r}: {_shown(c)}" for r, c in enumerate(reports[0]["cut"]) if c is not None))
    for v_schedule, _ in V_SHAPED:
        if all(c is not None for c in (reports[0].get("cut_v") or {}).get(v_schedule) or [None]):
            print(f"{v_schedule} stage blocks: " + ", ".join(
                f"stage {g} (rank {min(g, 2 * world - 1 - g)}): {_shown(c)}"
                for g, c in enumerate(reports[0]["cut_v"][v_schedule])))
    times = {name: statistics.median(v) for name, v in reports[0]["times"].items()}
    cpu = {name: sum(statistics.median(r["cpu"][name]) for r in reports) for name in times
           if all(name in r.get("cpu", {}) for r in reports)}
    losses = {}  # each training's losses from a rank that has them (torch's ZB-V: rank 0, the others' last)
    for r in reversed(reports):
        for name, values in r["losses"].items():
            if name not in losses and values and values[0] is not None:
                losses[name] = values
    walls = reports[0]["times"]
    paired = {s: statistics.median(t / o for o, t in zip(walls[f"shardwise {s}"], walls[f"torch {s}"]))
              for s in SCHEDULES if f"shardwise {s}" in walls and f"torch {s}" in walls}
    print("ms: median wall time of a step (rank 0); paired: median over steps of torch's step time / ours in the same "
          "round (robust to load that drifts); CPU ms: median CPU time of a step, summed over the ranks (less "
          "sensitive to other load); ratios: ours / torch of throughput (torch time / our time)")
    print(f"{'schedule':>8}  {'shardwise ms':>12}  {'torch ms':>9}  {'ours samples/s':>14}  {'torch samples/s':>15}  "
          f"{'ours / torch':>12}  {'paired':>6}  {'CPU ours ms':>11}  {'CPU torch ms':>12}  {'CPU ratio':>9}")

    def cell(x, width, fmt):
        return f"{x:>{width}{fmt}}" if x else f"{'-':>{width}}"

    recorded = {"stages": world, "model": f"{args.layers} x {args.hidden}, vocab {args.vocab}"}
    for schedule in SCHEDULES:
        ours, theirs = times.get(f"shardwise {schedule}"), times.get(f"torch {schedule}")
        ours_cpu, theirs_cpu = cpu.get(f"shardwise {schedule}"), cpu.get(f"torch {schedule}")
        cells = [cell(ours and ours * 1e3, 12, ".1f"), cell(theirs and theirs * 1e3, 9, ".1f"),
                 cell(ours and args.batch / ours, 14, ".1f"), cell(theirs and args.batch / theirs, 15, ".1f"),
                 cell(ours and theirs and theirs / ours, 12, ".2f"), cell(paired.get(schedule), 6, ".2f"),
                 cell(ours_cpu and ours_cpu * 1e3, 11, ".1f"),
                 cell(theirs_cpu and theirs_cpu * 1e3, 12, ".1f"),
                 cell(ours_cpu and theirs_cpu and theirs_cpu / ours_cpu, 9, ".2f")]
        print(f"{schedule:>8}  " + "  ".join(cells))
        # One cell per schedule: ours / torch by throughput (paired, CPU), or our step alone.
        recorded[schedule] = (
            f"{theirs / ours:.2f} ({paired[schedule]:.2f}, "
            f"{theirs_cpu / ours_cpu:.2f})" if ours and theirs and ours_cpu and theirs_cpu and schedule in paired
            else f"{theirs / ours:.2f}" if ours and theirs
            else f"ours {ours * 1e3:.1f} ms, torch -" if ours else None)
    if len(losses) > 1:
        names = sorted(losses)
        n = min(len(v) for v in losses.values())
        diff = max(abs(losses[a][i] - losses[b][i]) for i in range(n) for a in names for b in names)
        print(f"losses: {', '.join(f'{k} {v[n - 1]:.4f}' for k, v in sorted(losses.items()))} after {n} steps; "
              f"largest difference between any two at any step: {diff:.2e}")
    for name, text in errors.items():
        print(f"FAILED {name}:\n{text}")
    for r in reports:
        for name, table in r["profiles"].items():
            print(f"--- profile of rank {r['rank']}, one step, {name} ---\n{table}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.record:
        # One row per (stages, model): a run at 4 stages or another size replaces only its own row.
        recorded["date"] = time.strftime("%Y-%m-%d")
        record("pipeline", [recorded], {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, "
                       f"{'NCCL' if args.device == 'cuda' else 'Gloo'}",
            "notes": "Each cell: ours / torch by throughput (torch's step time / ours; above 1 ours is faster), "
                     "then in parentheses the paired ratio (median over rounds) and the CPU ratio; target >= 1.0. "
                     f"Global batch {args.batch} in micro-batches of {args.micro_batch}, median of {args.steps} "
                     f"steps after {args.warmup}."},
            key=("stages", "model"))


if __name__ == "__main__":
    main()
