"""Shared fixtures: real models nobody here wrote (Hugging Face transformers, built
from small configs with random weights) and small hand-written ones."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

transformers = pytest.importorskip("transformers")

BATCH, SEQ, VOCAB = 2, 16, 128


def _ids():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids}


def gpt2(layers: int = 3, hidden: int = 64, heads: int = 4):
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=VOCAB,
                                  n_positions=64, use_cache=False)
    return transformers.GPT2LMHeadModel(cfg).eval(), _ids()


def bert(layers: int = 2):
    cfg = transformers.BertConfig(num_hidden_layers=layers, hidden_size=64, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64)
    return transformers.BertForMaskedLM(cfg).eval(), _ids()


def llama(layers: int = 2):
    cfg = transformers.LlamaConfig(num_hidden_layers=layers, hidden_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=128, vocab_size=VOCAB,
                                   max_position_embeddings=64, use_cache=False)
    return transformers.LlamaForCausalLM(cfg).eval(), _ids()


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 4 * 4, classes))

    def forward(self, x, target):
        return nn.functional.cross_entropy(self.head(self.features(x)), target)


class TwoBranch(nn.Module):
    """Two branches that meet again, and a skip connection around both (logits of 8 classes)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.a = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        self.b = nn.Sequential(nn.Linear(32, 32), nn.Tanh())
        self.merge = nn.Linear(64, 32)
        self.head = nn.Linear(32, 8)

    def forward(self, x):
        h = self.inp(x)
        merged = self.merge(torch.cat([self.a(h), self.b(h)], dim=-1))
        return self.head(nn.functional.layer_norm(merged + h, (32,)))


def cnn():
    torch.manual_seed(0)
    return SmallCNN().eval(), (torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,)))


MODELS = {"gpt2": gpt2, "bert": bert, "llama": llama, "cnn": cnn}



TIGHT_PRECISION = "bf16"


def with_memory(cluster, memory: float):
    """`cluster` with `memory` bytes on each device of its first device type."""
    import json

    import shardwise

    doc = json.loads(cluster.to_json())
    doc["device_types"][0]["memory_bytes"] = int(memory)
    return shardwise.Cluster.from_json(json.dumps(doc))


def without_call_overhead(cluster):
    """`cluster` with no per-call overhead on its links: a collective costs its ring steps and
    bytes alone, as on the GPU presets' links. Gloo's own cost per call (the cpu preset's 200 us,
    cost/cluster_presets.cc) makes a tiny model's search keep whole what the tests of the
    tensor axis' runtime need split (sequence parallelism's gathers and scatters, the products
    themselves): those tests plan on this."""
    import json

    import shardwise

    doc = json.loads(cluster.to_json())
    for link in doc["links"]:
        link.pop("call_overhead", None)
    return shardwise.Cluster.from_json(json.dumps(doc))


def tight_cluster(graph, world: int, rows: int, mesh: tuple[int, int]):
    """A CPU cluster whose memory holds `graph` on `mesh` only with weights sharded on the
    mesh's tensor axis: halfway between the least any plan needs and what the replicated
    plan needs (as the cost model predicts them). A tiny model's plan otherwise splits only
    the batch, on both axes. Priced in TIGHT_PRECISION (bf16, CPU's slow rate, where such a
    layout is worth its collectives) and without ZeRO's sharded optimizer states (which save
    a tiny model's memory without sharding any weight): searches on it must state the same
    precision and zero=False (``tight_plan``; ``parallelize(..., zero=False)``). Its links have
    no per-call overhead (``without_call_overhead``)."""
    return memory_between(graph, world, 0.5, global_batch=rows, mesh=mesh, precision=TIGHT_PRECISION, zero=False)


def memory_between(graph, world: int, fraction: float, **search):
    """A CPU cluster of `world` ranks without per-call overhead whose memory for plans is
    `fraction` of the way from the least a plan of `search`'s options (shardwise.plan's keywords)
    needs to what the replicated one needs, as the cost model predicts them."""
    import shardwise
    from shardwise.runtime.engine_base import once_on_rank_zero

    cluster = without_call_overhead(shardwise.Cluster.preset("cpu", world))

    def usable():
        replicated = shardwise.plan(graph, cluster, **search).predicted_memory()[0]
        least = shardwise.plan(graph, with_memory(cluster, 1), **search).predicted_memory()[0]
        return least * (1 - fraction) + replicated * fraction  # 0.5: exactly (least + replicated) / 2

    # The ranks of a test that ask it of one graph: rank 0's two searches serve them all (the
    # ranks of a CPU job share its cores).
    memory = once_on_rank_zero(usable, graph, f"memory_between {world} {fraction} {sorted(search.items())}")
    return with_memory(cluster, memory / shardwise._C.MEMORY_FRACTION)  # what plans may use


def tight_plan(graph, world: int, rows: int, mesh: tuple[int, int]):
    """The search's plan for `graph` on ``tight_cluster``: weights sharded on the tensor axis."""
    import shardwise
    from shardwise.runtime.engine_base import planned_once

    cluster = tight_cluster(graph, world, rows, mesh)
    return planned_once(lambda: shardwise.plan(graph, cluster, global_batch=rows, mesh=mesh, precision=TIGHT_PRECISION,
                                               zero=False), graph, f"tight_plan {world} {rows} {mesh}")


def zero3_plan(plan, model, world: int, precision: str | None = None):
    """`plan` (data parallel on a (world, 1) mesh) with every parameter that a dim of allows it
    sharded over the data axis: ZeRO-3, whatever the search would pick; in `precision` where
    given (unpriced: price it on the graph)."""
    import json

    import shardwise

    doc = json.loads(plan.to_json())
    for key in ("predicted", "programs"):
        doc.pop(key, None)
    placements = doc["sharding"]["placements"]
    for name, tensor in model.named_parameters():
        dims = [d for d in range(tensor.dim()) if tensor.shape[d] % world == 0]
        if name in placements and dims:
            placements[name] = [f"S({dims[0]})", "R"]
    doc["sharding"]["zero"] = {}
    if precision is not None:
        doc["precision"] = precision
    return shardwise.Plan.from_json(json.dumps(doc))


def accumulation_cluster(graph, world: int, rows: int, precision: str | None = TIGHT_PRECISION, zero: bool = False,
                         toward_whole: float = 0.5):
    """A CPU cluster on which no plan of the whole batch `rows` in one micro-batch fits in
    memory but a plan in micro-batches does (the gradient accumulation or pipeline the search
    falls back to when memory is short, as on a real cluster): halfway between the least the
    joint planner's plans need, micro-batches allowed, and the least the SPMD search's need
    (for a graph with batch statistics, also the joint planner's plans of one micro-batch). Priced in
    TIGHT_PRECISION without ZeRO by default, as ``tight_cluster``: parallelize on it with the same
    `precision` and `zero` (None and True: parallelize's defaults). `toward_whole`: where between
    the two (0.5: halfway; less leaves room for fewer plans of micro-batches)."""
    import shardwise

    tiny = with_memory(shardwise.Cluster.preset("cpu", world), 1)
    whole = shardwise.Plan.search(graph, tiny, global_batch=rows, precision=precision,
                                  zero=zero).predicted_memory()[0]
    if shardwise._C.batch_coupling(graph._core)["sites"]:
        # (and the least of the joint planner's plans of one micro-batch, pipeline stages of the
        # whole batch: all a graph with batch statistics may take)
        whole = min(whole, shardwise.Plan.joint(graph, tiny, global_batch=rows, precision=precision,
                                                zero=zero).predicted_memory()[0])
    split = shardwise.Plan.joint(graph, tiny, global_batch=rows, precision=precision, zero=zero,
                                 micro_batch_semantics="per_micro_batch").predicted_memory()[0]
    assert split < whole, f"micro-batches save no memory on this graph ({split} >= {whole} bytes)"
    return with_memory(tiny, (split + toward_whole * (whole - split)) / shardwise._C.MEMORY_FRACTION)


def op_counts():
    """A TorchDispatchMode counting how often each op runs, forward and backward, by its
    packet's name (``counts["aten.mm"]``); what a checkpoint's cache answers for is not run,
    and not counted."""
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.counts = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.counts[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    return OpCounts()


def train_one_device(model, batch_of, steps: int, optimizer) -> list[float]:
    """The reference: `model` trained `steps` steps on one device, batch k = batch_of(k), with
    `optimizer` (over its parameters); returns each step's loss."""
    losses = []
    for step in range(steps):
        loss = model(*batch_of(step))
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad()
    return losses


def train_beside_one_device(engine, reference, batch_of, steps: int, lr: float = 1e-2) -> tuple[list, list]:
    """`engine` and `reference` (the same model on one device) each trained `steps` AdamW steps
    at `lr` on batch k = batch_of(k), step by step; returns (the engine's losses, the reference's)."""
    optimizer = torch.optim.AdamW(engine.parameters(), lr=lr)
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=lr)
    losses, ref_losses = [], []
    for step in range(steps):
        batch = batch_of(step)
        losses.append(float(engine.train_step(*batch)))
        optimizer.step()
        optimizer.zero_grad()
        ref_losses.extend(train_one_device(reference, lambda _: batch, 1, ref_optimizer))
    return losses, ref_losses


def train_engine_counting_ops(engine, batch_of, steps: int, lr: float = 1e-2) -> tuple[list[float], dict]:
    """`engine` trained `steps` steps with AdamW (over its shards) at `lr`, batch k = batch_of(k),
    its ops counted (``op_counts``); returns each step's loss and the counts."""
    import torch

    optimizer = engine.optimizer(torch.optim.AdamW, lr=lr)
    losses, counting = [], op_counts()
    for step in range(steps):
        with counting:
            losses.append(float(engine.train_step(*batch_of(step))))
        optimizer.step()
        optimizer.zero_grad()
    return losses, counting.counts


def regression_batch(step: int, rows: int, features: int = 16):
    """Batch `step` of a float64 regression: inputs and targets, [rows, features] each."""
    g = torch.Generator().manual_seed(step)
    return (torch.randn(rows, features, generator=g, dtype=torch.float64),
            torch.randn(rows, features, generator=g, dtype=torch.float64))


def with_zero(plan):
    """`plan` with the optimizer state of every parameter sharded (ZeRO) over each mesh axis
    of more than one rank that replicates it. The search prices ZeRO's parameter broadcasts,
    so on a tiny model it rarely picks ZeRO itself: tests of ZeRO's runtime set it."""
    import json

    import shardwise

    doc = json.loads(plan.to_json())
    for key in ("predicted", "programs"):
        doc.pop(key, None)
    sharding = doc["sharding"]
    leaves = set(sharding["leaves"]) - set(sharding.get("inputs", []))
    for name in leaves:
        axes = [a for a, (size, p) in enumerate(zip(sharding["mesh"], sharding["placements"][name]))
                if size > 1 and p == "R"]
        if axes and name.endswith(("weight", "bias")):
            sharding.setdefault("zero", {})[name] = axes
    return shardwise.Plan.from_json(json.dumps(doc))


def refusal(fn) -> str | None:
    """What shardwise refuses `fn()` with (the ValidationError's text), or None when it runs."""
    import shardwise

    try:
        fn()
    except shardwise.ValidationError as e:
        return str(e)
    return None


def parameter_error(full: dict, reference: nn.Module) -> float:
    """The largest error of a trained engine's whole parameters (``full_state_dict()``) against
    the one-device model's, relative to each tensor's largest magnitude (floored at 1e-6: a
    parameter whose gradient is zero in theory holds only rounding noise)."""
    return max(((full[n] - p).abs().max() / p.abs().max().clamp_min(1e-6)).item()
               for n, p in reference.named_parameters())


# ---- starting ranks ---------------------------------------------------------------------------------
# What every rank imports before it runs a line of its test: a spawned interpreter paid for these
# again in each rank (about 6 s of CPU for torch, shardwise and transformers' GPT-2 and LLaMA, so
# 24 s for a 4-rank job on 2 cores). A forkserver imports them once a session, and each rank
# is a fork of it. torch.export's tracer (torch.export._trace, with dynamo and sympy behind it) is
# imported by a rank's first capture: 2 s of CPU a rank, 12% of the ranks' time in an 8-rank test
# (py-spy, 2026-12-05).
RANK_PRELOAD = ["torch", "torch.distributed", "torch.distributed.checkpoint", "torch.export._trace", "shardwise",
                "transformers", "transformers.models.gpt2.modeling_gpt2", "transformers.models.llama.modeling_llama"]


def _rank_in_parents_environment(rank: int, environment: dict, fn, *args) -> None:
    # A forked rank inherits the forkserver's environment, taken when it started; a spawned one
    # had the test's at the time of the call (a test may set a variable for its ranks).
    import os

    os.environ.clear()
    os.environ.update(environment)
    fn(rank, *args)


def run_ranks(fn, args: tuple = (), nprocs: int = 1) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs, join=True)``, its ranks forked from a
    forkserver that has imported RANK_PRELOAD, in the test's environment of the moment. As with
    spawn, `fn` and `args` travel pickled and a rank's failure raises here, naming the rank."""
    import multiprocessing
    import os

    import torch.multiprocessing as mp

    multiprocessing.get_context("forkserver").set_forkserver_preload(RANK_PRELOAD)
    mp.start_processes(_rank_in_parents_environment, args=(dict(os.environ), fn, *args), nprocs=nprocs,
                       join=True, start_method="forkserver")


def finish_rank(path: str, rank: int, report: dict) -> None:
    """Writes this rank's report where the test reads it (``{path}.{rank}``) and waits for
    every rank, so no process group is torn down under a rank still using it."""
    import json

    import torch.distributed as dist

    with open(f"{path}.{rank}", "w") as f:
        json.dump(report, f)
    dist.barrier()


def spawn_reports(worker, world: int, *args) -> list[dict]:
    """Runs ``worker(rank, world, store, result, *args)`` on `world` processes (a Gloo job
    over a file store) and returns each rank's report, as ``finish_rank`` wrote it."""
    import json
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result")
        run_ranks(worker, args=(world, os.path.join(tmp, "store"), result, *args), nprocs=world)
        reports = []
        for rank in range(world):
            with open(f"{result}.{rank}") as f:
                reports.append(json.load(f))
    return reports


# ---- scenarios on real Gloo ranks ----------------------------------------------------------------
def _scenario_rank(rank: int, world: int, store: str, module: str, name: str, args: tuple, result: str) -> None:
    import importlib
    import json

    import torch.distributed as dist

    torch.set_num_threads(1)  # one thread a rank: the ranks share this machine's cores
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        out = getattr(importlib.import_module(module), f"_scenario_{name}")(rank, world, *args)
        if rank == 0:
            with open(result, "w") as f:
                json.dump(out, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def train_keyword_batches_beside_one_device(engine, reference, batch_of, steps: int,
                                            loss_of=lambda model, batch: model(**batch).loss, lr: float = 1e-2) -> dict:
    """`steps` AdamW steps of `engine` (its own optimizer, over its shards) and of `reference`
    (the same model on one device) on the keyword batch `batch_of(step)` (a transformers model's
    dict): both runs' losses, the engine's parameters' errors against the reference's (relative
    to each tensor's largest magnitude) and the engine's optimizer. train_beside_one_device is
    the same for positional batches, losses only."""
    optimizer = engine.optimizer(torch.optim.AdamW, lr=lr)
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=lr)
    losses, ref_losses = [], []
    for step in range(steps):
        losses.append(float(engine.train_step(**batch_of(step))))
        optimizer.step()
        optimizer.zero_grad()
        loss = loss_of(reference, batch_of(step))
        loss.backward()
        ref_losses.append(loss.item())
        ref_optimizer.step()
        ref_optimizer.zero_grad()
    state = engine.full_state_dict()
    errors = {key: float((state[key] - t).abs().max() / t.abs().max().clamp_min(1e-6))
              for key, t in reference.state_dict().items() if key in state and t.is_floating_point()}
    return {"losses": losses, "ref_losses": ref_losses, "errors": errors, "optimizer": optimizer}


def spawn_scenario(module: str, world: int, name: str, *args):
    """`world` Gloo processes (a FileStore in a temporary directory) each running
    ``module._scenario_<name>(rank, world, *args)``; returns rank 0's result (JSON). A test file
    passes its ``__name__``: the spawned ranks import it as pytest did."""
    import json
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        run_ranks(_scenario_rank, args=(world, os.path.join(tmp, "store"), module, name, args, result), nprocs=world)
        with open(result) as f:
            return json.load(f)


def benchmark_module(name: str, file: str):
    """benchmarks/<file> imported as the module `name` (registered in sys.modules: dataclasses
    look their module up while a class is built); the benchmarks folder is not a package."""
    import importlib.util
    import pathlib
    import sys

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def token_batch(step: int, rows: int, seq: int, vocab: int) -> dict:
    """A causal-LM keyword batch of random token ids, seeded by `step` (labels = the ids)."""
    ids = torch.randint(0, vocab, (rows, seq), generator=torch.Generator().manual_seed(step))
    return {"input_ids": ids, "labels": ids.clone()}


def experts_trained_beside_one_device(world: int, model, reference, batch_of, steps: int, rows: int, mesh: list,
                                      pipeline: int, expert: int, weights: tuple, loss_of=None) -> dict:
    """A mixture-of-experts model parallelized on `mesh` (or, with `pipeline` > 1, in stages of
    one micro-batch of the data axis, plan.expert `expert`), trained beside `reference` on one
    device (train_keyword_batches_beside_one_device): the losses and errors, each experts op's
    strategy, the stacked expert weights this rank holds (names ending in `weights`: their rows
    and their optimizer state's) and every rank's rows."""
    import re

    import shardwise

    cluster = shardwise.Cluster.preset("cpu", world)
    if pipeline > 1:
        graph = shardwise.capture(model, batch_of(0))
        # One micro-batch: a router's load-balancing loss over a micro-batch is not the batch's.
        plan = shardwise.Plan.manual(graph, cluster, pipeline=pipeline, global_batch=rows,
                                     micro_batch=rows // (world // pipeline), recompute=False, expert=expert)
        engine = shardwise.parallelize(model, batch_of(0), cluster=cluster, plan=plan)
    else:
        engine = shardwise.parallelize(model, batch_of(0), cluster=cluster, mesh=tuple(mesh))
    extra = {} if loss_of is None else {"loss_of": loss_of}
    trained = train_keyword_batches_beside_one_device(engine, reference, batch_of, steps, **extra)
    held = {}
    for n, p in engine.named_parameters():
        if n.endswith(weights):
            state = trained["optimizer"].state.get(p, {})
            held[n] = {"rows": p.shape[0], "state_rows": sorted({t.shape[0] for t in state.values()
                                                                 if isinstance(t, torch.Tensor) and t.dim() == 3})}
    every_rank = [None] * world
    torch.distributed.all_gather_object(every_rank, sorted({h["rows"] for h in held.values()}))
    sharding = engine.plan.stage_sharding or engine.plan.sharding
    strategies = {k: v for k, v in sharding["strategies"].items() if re.fullmatch(r"experts(_\d+)?", k)}
    return {"losses": trained["losses"], "ref_losses": trained["ref_losses"], "errors": trained["errors"],
            "strategies": strategies, "held": held, "mesh": sharding["mesh"], "rows_by_rank": every_rank}
