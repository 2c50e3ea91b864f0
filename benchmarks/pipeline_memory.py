"""Peak activation memory of shardwise's GPipe, 1F1B and ZB-H1, measured, next to the predictions.

    python benchmarks/pipeline_memory.py                 # 2 and 4 Gloo processes (stages)
    python benchmarks/pipeline_memory.py --record        # + its rows into results/ and the README

For each world size p and schedule, a TinyGPT trains under a shardwise pipeline plan (p
stages, m micro-batches) and every rank's stage modules are instrumented from outside,
without touching the library:

- saved-tensor bytes: ``torch.autograd.graph.saved_tensors_hooks`` around each stage
  module's forward counts the bytes of the distinct storages autograd saves for backward
  (parameters excluded), alive until backward frees them; the peak over the step is the
  stage's activation memory. One forward's bytes is one micro-batch's footprint, so
  peak / footprint and the number of micro-batches with saved tensors alive both give the
  micro-batches in flight;
- stage outputs alive: bytes of the stage modules' outputs (the activations sent on) not yet
  freed, at their peak;
- allocator: glibc's bytes in use (``mallinfo2``: arena + mmapped), sampled at every hook,
  peak minus the value when the step started (includes the parameters' gradients, created in
  the step, and receive buffers);
- gradients held from B to W: under a split backward (ZB-H1, ZB-V, DualPipeV) the engine's B
  (``backward_input``, wrapped from outside) leaves a gradient at each weight-reading node's
  output for the micro-batch's W; the bytes of their distinct storages alive, at their peak,
  and the peak of saved tensors and held gradients at once.

Predictions: ``shardwise.simulate(schedule, stages=p, micro_batches=m).peak_in_flight`` (per
rank) and ``Plan.manual(...).predicted_memory()`` 's activations (the most loaded rank, from the
cost model's activation bytes of the captured graph). Expected: the first stage holds m
micro-batches under GPipe and p under 1F1B; under ZB-H1 every stage holds p (a micro-batch's
saved tensors live from its F to its W, which the schedule postpones into the bubbles); under
ZB-V every rank holds 2p chunks (half a stage each), under DualPipeV 2p + 1; under the split
schedules the predicted activations include the held gradients, by liveness over each rank's
list, so they are compared with the saved tensors and held gradients at once. Memory is
deterministic, so oversubscribed cores (4 processes on 2) do not change these figures.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import tempfile
import weakref

import torch
import torch.distributed as dist

from _machine import cpu_model
from _workers import finish_worker, pipeline_plan, spawn_ranks

SCHEDULES = ("gpipe", "1f1b", "zb-h1", "zb-v", "dualpipe-v")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def _allocator_bytes_fn():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return lambda: 0
    return lambda: (lambda m: m.uordblks + m.hblkhd)(libc.mallinfo2())


class Meter:
    """Counts, over a training step, the bytes of the distinct storages autograd keeps for
    backward (by micro-batch) and of the stage outputs, with their peaks."""

    def __init__(self, parameters):
        self._params = {p.untyped_storage().data_ptr() for p in parameters}
        self._storages: dict[int, list] = {}  # storage pointer -> [bytes, references]
        self._by_call: dict[int, int] = {}    # forward call -> saved tensors alive
        self._allocator = _allocator_bytes_fn()
        self.calls = 0
        self.saved = self.saved_peak = 0
        self.in_flight_peak = 0
        self.outputs = self.outputs_peak = 0
        self.per_call: list[int] = []           # bytes saved by each forward call
        self.allocator_start = self.allocator_peak = 0
        self._held: dict[int, list] = {}  # storage pointer -> [bytes, tensors alive]
        self.held = self.held_peak = 0
        self.together_peak = 0  # saved tensors and held gradients at once

    def start_step(self) -> None:
        self.saved_peak, self.in_flight_peak, self.outputs_peak = self.saved, len(self._by_call), self.outputs
        self.per_call = []
        self.allocator_start = self.allocator_peak = self._allocator()
        self.held_peak = self.held
        self.together_peak = self.saved + self.held

    def _sample(self) -> None:
        self.allocator_peak = max(self.allocator_peak, self._allocator())

    # saved tensors
    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self._params or storage.nbytes() == 0:
            return t
        entry = self._storages.get(key)
        if entry is None:
            entry = self._storages[key] = [storage.nbytes(), 0]
            self.saved += entry[0]
            self.per_call[-1] += entry[0]
            self.saved_peak = max(self.saved_peak, self.saved)
            self.together_peak = max(self.together_peak, self.saved + self.held)
        entry[1] += 1
        call = self.calls
        self._by_call[call] = self._by_call.get(call, 0) + 1
        self.in_flight_peak = max(self.in_flight_peak, len(self._by_call))
        self._sample()
        # (detached: a saved output held with its grad_fn would make a cycle through autograd's
        # C++ graph that outlives a graph kept for W (retain_graph), which no collector frees)
        return _Packed(self, t.detach(), key, call)

    def release(self, key: int, call: int) -> None:
        entry = self._storages[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.saved -= entry[0]
            del self._storages[key]
        self._by_call[call] -= 1
        if self._by_call[call] == 0:
            del self._by_call[call]

    def unpack(self, packed):
        self._sample()
        return packed.tensor if isinstance(packed, _Packed) else packed

    # stage outputs
    def output(self, t: torch.Tensor) -> None:
        n = t.untyped_storage().nbytes()
        self.outputs += n
        self.outputs_peak = max(self.outputs_peak, self.outputs)
        weakref.finalize(t, self._output_freed, n)

    def _output_freed(self, n: int) -> None:
        self.outputs -= n

    # gradients held from B to W
    def hold(self, site_grads) -> None:
        """The gradients B left at the weight-reading nodes' outputs, which a zero-bubble schedule
        keeps until the micro-batch's W (runtime/weight_split.py): distinct storages, alive until freed."""
        for t in (g for grads in site_grads for g in grads if isinstance(g, torch.Tensor)):
            key = t.untyped_storage().data_ptr()
            entry = self._held.get(key)
            if entry is None:
                entry = self._held[key] = [t.untyped_storage().nbytes(), 0]
                self.held += entry[0]
                self.held_peak = max(self.held_peak, self.held)
                self.together_peak = max(self.together_peak, self.saved + self.held)
            entry[1] += 1
            weakref.finalize(t, self._unhold, key)
        self._sample()

    def _unhold(self, key: int) -> None:
        entry = self._held[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.held -= entry[0]
            del self._held[key]

    def instrument(self, module: torch.nn.Module) -> None:
        hooks = {}

        def before(_module, _args):
            self.calls += 1
            self.per_call.append(0)
            hooks["ctx"] = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
            hooks["ctx"].__enter__()

        def after(_module, _args, outputs):
            hooks.pop("ctx").__exit__(None, None, None)
            for t in outputs if isinstance(outputs, (tuple, list)) else (outputs,):
                if isinstance(t, torch.Tensor):
                    self.output(t)
            self._sample()

        module.register_forward_pre_hook(before)
        module.register_forward_hook(after)


class _Packed:
    __slots__ = ("tensor", "_release")

    def __init__(self, meter: Meter, tensor: torch.Tensor, key: int, call: int):
        self.tensor = tensor
        self._release = (meter, key, call)

    def __del__(self):
        meter, key, call = self._release
        meter.release(key, call)


def _watch_held_gradients(meter_of):
    """Wraps the pipeline engine's B (from outside the library) so `meter_of()` sees what it leaves for W."""
    from shardwise.runtime import pipeline_engine

    split_b = pipeline_engine.backward_input

    def backward_input(*args, **kwargs):
        input_grads, site_grads = split_b(*args, **kwargs)
        meter_of().hold(site_grads)
        return input_grads, site_grads

    pipeline_engine.backward_input = backward_input


def _worker(rank: int, world: int, store: str, args, out: str) -> None:
    import shardwise
    from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    cfg = TinyGPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg.vocab, (args.batch, cfg.seq), generator=g)
    batch = (idx, torch.roll(idx, -1, dims=1))
    report = {}
    current = {}
    _watch_held_gradients(lambda: current["meter"])
    for schedule in SCHEDULES:
        torch.manual_seed(0)
        plan = pipeline_plan(args.batch, args.micro_batch, schedule, world)
        engine = shardwise.parallelize(TinyGPT(cfg), batch, plan=plan)
        opt = torch.optim.AdamW(engine.parameters(), lr=1e-3)
        meter = current["meter"] = Meter(engine.parameters())
        for stage in engine._stages.values():  # the executor's stage modules (GraphModules)
            meter.instrument(stage["module"])
        for _ in range(2):  # the second step: the optimizer state and gradients exist already
            opt.zero_grad()
            meter.start_step()
            engine.train_step(*batch)
            opt.step()
        blocks = sorted({int(n.split(".")[1]) for n, _ in engine.named_parameters() if n.startswith("blocks.")})
        report[schedule] = {"saved_peak": meter.saved_peak, "per_mb": max(meter.per_call),
                            "in_flight": meter.in_flight_peak, "outputs_peak": meter.outputs_peak,
                            "allocator": meter.allocator_peak - meter.allocator_start, "blocks": blocks,
                            "held_peak": meter.held_peak, "together_peak": meter.together_peak}
    everyone = [None] * world
    dist.all_gather_object(everyone, report)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(everyone, f)
    finish_worker()


def _predicted(args, world: int, m: int) -> dict:
    """The simulator's micro-batches in flight per rank and the cost model's activation bytes."""
    import shardwise
    from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

    cfg = TinyGPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq)
    model = TinyGPT(cfg)
    graph = shardwise.capture(model, model.example_inputs(args.batch))
    out = {}
    for schedule in SCHEDULES:
        sim = shardwise.simulate(schedule, stages=world, micro_batches=m)
        plan = shardwise.Plan.manual(graph, shardwise.Cluster.preset("cpu", world), pipeline=world, tensor=1, data=1,
                                     global_batch=args.batch, micro_batch=args.micro_batch, schedule=schedule,
                                     recompute=False, precision="f32")
        out[schedule] = {"in_flight": sim.peak_in_flight, "activations": plan.predicted_memory()[1]["activations"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,4", help="pipeline stages = processes")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=2)
    from _results import add_record_argument, record

    add_record_argument(parser)
    args = parser.parse_args()
    m = args.batch // args.micro_batch
    rows = []
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, Gloo")
    print(f"TinyGPT layers {args.layers}, hidden {args.hidden}, heads {args.heads}, seq {args.seq}, f32; global batch "
          f"{args.batch} = m {m} micro-batches of {args.micro_batch}; second training step measured")
    mb = 2 ** 20
    print(f"{'p':>2} {'schedule':>8} {'rank':>4} {'blocks':>6}  {'saved peak MiB':>14} {'1 mb MiB':>8}  "
          f"{'in flight':>9} {'peak/1 mb':>9} {'simulated':>9}  {'outputs MiB':>11}  {'allocator MiB':>13}  "
          f"{'predicted act. MiB':>18}  {'B-W grads MiB':>13} {'saved+held MiB':>14}")
    for world in (int(w) for w in args.worlds.split(",")):
        predicted = _predicted(args, world, m)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            spawn_ranks(_worker, (world, os.path.join(tmp, "store"), args, out), world)
            reports = json.load(open(out))
        for schedule in SCHEDULES:
            for rank, report in enumerate(reports):
                r = report[schedule]
                blocks = f"{r['blocks'][0]}-{r['blocks'][-1]}" if r["blocks"] else "-"
                act = f"{predicted[schedule]['activations'] / mb:>18.2f}" if rank == 0 else f"{'':>18}"
                print(f"{world:>2} {schedule:>8} {rank:>4} {blocks:>6}  {r['saved_peak'] / mb:>14.2f} "
                      f"{r['per_mb'] / mb:>8.2f}  {r['in_flight']:>9} {r['saved_peak'] / r['per_mb']:>9.2f} "
                      f"{predicted[schedule]['in_flight'][rank]:>9}  {r['outputs_peak'] / mb:>11.2f}  "
                      f"{r['allocator'] / mb:>13.2f}  {act}  {r['held_peak'] / mb:>13.2f} "
                      f"{r['together_peak'] / mb:>14.2f}")
            saved = max(report[schedule]["saved_peak"] for report in reports) / mb
            # what the cost model's activations stand for: saved tensors, and under a split
            # backward the gradients held from B to W with them, at once
            together = max(report[schedule]["together_peak"] for report in reports) / mb
            rows.append({"p": world, "schedule": schedule,
                         "in flight, measured (per rank)": ", ".join(str(r[schedule]["in_flight"]) for r in reports),
                         "simulated": ", ".join(str(x) for x in predicted[schedule]["in_flight"]),
                         "saved peak MiB (most loaded rank)": saved,
                         "B-W gradients MiB (per rank)": ", ".join(f"{r[schedule]['held_peak'] / mb:.2f}"
                                                                   for r in reports),
                         "saved + held MiB (most loaded rank)": together,
                         "predicted act. MiB": predicted[schedule]["activations"] / mb,
                         "predicted / measured": predicted[schedule]["activations"] / mb / together})
    if args.record:
        # A run of some stage counts replaces only their rows.
        record("pipeline_memory", rows, {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, Gloo",
            "formats": {"saved peak MiB (most loaded rank)": ".2f", "saved + held MiB (most loaded rank)": ".2f",
                        "predicted act. MiB": ".2f",
                        "predicted / measured": ".3f"},
            "notes": f"TinyGPT layers {args.layers}, hidden {args.hidden}, seq {args.seq}, f32; global batch "
                     f"{args.batch} = {m} micro-batches of {args.micro_batch}; the second training step measured. "
                     "In flight: micro-batches with saved tensors alive (chunks, half a stage, under ZB-V and "
                     "DualPipeV). B-W gradients: what a split backward's B leaves at the weight-reading nodes' "
                     "outputs for its W (runtime/weight_split.py), distinct storages at their peak; saved + held: "
                     "both at once, what the predicted activations stand for (liveness over each rank's list, "
                     "schedule::peak_bytes_held)."},
            key=("p", "schedule"))


if __name__ == "__main__":
    main()
