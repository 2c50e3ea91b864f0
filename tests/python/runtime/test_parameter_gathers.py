"""Parameters held sharded and read whole run as the plan prices them
(search/parameter_collectives.h): gathered for the read, released after it, gathered again
when backward needs them, their gradients reduce-scattered where backward reaches the read; a replicated
parameter's gradient reduced in buckets beside backward; the sharded parameters' gradients
reduce-scattered beside backward too, each issued asynchronously where backward makes it and
waited for at the next (FSDP2's post-backward reduce-scatter).

A data-parallel plan whose weights are sharded over the data axis and read whole (ZeRO-3),
priced by the cost model, on 2 Gloo ranks in float64: training equals one device, the rank program
marks each parameter collective with where it runs, and the bytes the collectives count in a
step equal the plan's own list of collectives, kind by kind (before the weights were released
after their read, the run gathered each once where the plan counted twice).
"""
from __future__ import annotations

import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import shardwise
from conftest import run_ranks, train_one_device, zero3_plan

ROWS, STEPS, TOLERANCE = 8, 3, 1e-9
MLP_ROWS = 64  # enough rows that the search splits the batch (at 8 it splits the products)
PRECISION_BYTES = 4  # the plan's float32: it counts bytes at its precision; the run is float64


class WideBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 256)

    def forward(self, h):
        return F.gelu(self.fc(h))


class MLP(nn.Module):
    """A stem, two repeated blocks and a head: a parameter unit per block, so each block's gathers
    run prefetched beside the unit before (the stem's, the first unit's, are exposed: nothing runs
    before its read)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.blocks = nn.ModuleList([WideBlock(), WideBlock()])
        self.fc3 = nn.Linear(256, 10)

    def forward(self, x, y):
        h = F.gelu(self.fc1(x))
        for block in self.blocks:
            h = block(h)
        return F.cross_entropy(self.fc3(h), y)


def _model():
    torch.manual_seed(0)
    return MLP().double()


def _batch(step: int):
    g = torch.Generator().manual_seed(step)
    return (torch.randn(MLP_ROWS, 64, generator=g, dtype=torch.float64),
            torch.randint(0, 10, (MLP_ROWS,), generator=g))


def _case(name: str):
    """(model factory, batch of step k, the plan for `world` ranks from the model's graph)."""
    if name == "mlp":  # the data-parallel plan with every weight ZeRO-3 sharded, priced so
        def plan(graph, world):
            cluster = shardwise.Cluster.preset("cpu", world)
            searched = shardwise.plan(graph, cluster, global_batch=MLP_ROWS, mesh=(world, 1), precision="f32",
                                      zero=False, recompute=False)
            # The plan's collectives are what the run must move (the search itself picks ZeRO-3
            # only where memory asks and the gathers beat splitting the products).
            return zero3_plan(searched, _model(), world).price(graph, cluster)

        return _model, _batch, plan

    def zero3(graph, world):  # every weight sharded over the data axis, whatever the search picks
        searched = shardwise.plan(graph, shardwise.Cluster.preset("cpu", world), global_batch=ROWS, mesh=(world, 1),
                                  zero=False, recompute=False)
        return zero3_plan(searched, _layers(), world)

    return _layers, _layers_batch, zero3


def _worker(rank: int, world: int, store: str, result: str, name: str) -> None:
    from shardwise.runtime import traffic

    model_of, batch_of, plan_of = _case(name)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        plan = plan_of(shardwise.capture(model_of(), batch_of(0)), world)
        engine = shardwise.parallelize(model_of(), batch_of(0), plan=plan)
        scatters = engine.module.scatters
        in_backward = []  # for each gradient the scatters took: was autograd running a node then?
        issue = scatters.issue

        def recorded(*args):
            in_backward.append(torch._C._current_autograd_node() is not None)
            issue(*args)

        scatters.issue = recorded
        optimizer = engine.optimizer(torch.optim.SGD, lr=0.1)
        losses, moved = [], None
        for step in range(STEPS):
            traffic.reset()
            losses.append(float(engine.train_step(*batch_of(step))))
            optimizer.step()
            optimizer.zero_grad()
            moved = traffic.snapshot()
        state = engine.full_state_dict()
        reference = model_of()
        ref_losses = train_one_device(reference, batch_of, STEPS, torch.optim.SGD(reference.parameters(), lr=0.1))
        if rank == 0:
            predicted: dict[str, float] = {}
            for c in plan.collectives():
                predicted[c["kind"]] = predicted.get(c["kind"], 0.0) + c["bytes"] * c["count"]
            with open(result, "w") as f:
                json.dump({"losses": losses, "ref_losses": ref_losses, "moved": moved, "predicted": predicted,
                           "error": max((state[n] - p).abs().max().item() for n, p in reference.named_parameters()),
                           "placements": plan.placements(), "rank_ir": engine.rank_ir, "code": engine.code,
                           "events": scatters.events, "in_backward": in_backward}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run(name: str, world: int = 2) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        run_ranks(_worker, args=(world, os.path.join(tmp, "store"), result, name), nprocs=world)
        with open(result) as f:
            return json.load(f)


def test_sharded_weights_are_gathered_released_and_gathered_again_as_priced():
    r = _run("mlp")
    for a, b in zip(r["losses"], r["ref_losses"]):
        assert abs(a - b) <= TOLERANCE * abs(b), (r["losses"], r["ref_losses"])
    assert r["error"] < TOLERANCE, r["error"]
    sharded = [n for n, p in r["placements"].items() if n.endswith("weight") and p[0].startswith("S")]
    assert sharded, r["placements"]  # the cluster leaves no room for replicated weights
    # Each gather of a weight read whole is marked: prefetched beside the forward, released
    # after the read and gathered again for backward; the gradients' reduce-scatters beside
    # backward, each one.
    assert 'overlap="forward", regather=true' in r["rank_ir"], r["rank_ir"]
    parameters = [f"%{n}." for n, _ in _model().named_parameters()]
    scatters = [line for line in r["rank_ir"].splitlines() if "shardwise::reduce_scatter" in line
                and any(p in line.split("=", 1)[1] for p in parameters)]
    assert scatters and all('overlap="backward", pass="backward"' in line for line in scatters), scatters
    assert "self.regather(" in r["code"] and "self.prefetch.wait(" in r["code"], r["code"]
    # ... and run there: each issued inside backward (autograd running a node), asynchronously,
    # and waited for when the next is issued, the last when backward ends (an order a scatter
    # waited for at once, or all at the end, does not have).
    issued = [group for kind, group in r["events"] if kind == "issue"]
    unit_groups = {line.split("unit_group=")[1].split("}")[0] for line in scatters}
    assert len(issued) == len(unit_groups) and len(set(issued)) == len(issued), (r["events"], scatters)
    assert r["in_backward"] and all(r["in_backward"]), r["in_backward"]
    expected = [("issue", issued[0])]
    for earlier, later in zip(issued, issued[1:]):
        expected += [("issue", later), ("wait", earlier)]
    expected.append(("wait", issued[-1]))
    assert [tuple(e) for e in r["events"]] == expected, r["events"]
    assert "scatter = (" in r["code"], r["code"]
    # The run moves what the plan lists, kind by kind (elements: the plan counts float32 bytes).
    for kind in ("all_gather", "reduce_scatter"):
        predicted = r["predicted"].get(kind, 0.0) / PRECISION_BYTES
        measured = r["moved"].get(kind, {}).get("bytes", 0) / 8
        print(f"{kind}: {measured:.0f} elements moved per step, {predicted:.0f} in the plan")
        assert predicted > 0 and measured == predicted, (kind, r["moved"], r["predicted"])


# ---- FSDP2's units: a layer's gathers and reduce-scatters flattened -----------------------------
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, h):
        return h + F.gelu(self.fc(h))


class Layers(nn.Module):
    """Three repeated blocks between an input projection and a head: five units."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(32, 5)

    def forward(self, x, y):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return F.cross_entropy(self.head(h), y)


def _layers():
    torch.manual_seed(0)
    return Layers().double()


def _layers_batch(step: int):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(ROWS, 16, generator=g, dtype=torch.float64), torch.randint(0, 5, (ROWS,), generator=g)


def test_a_units_gathers_and_reduce_scatters_are_one_flattened_collective_each():
    r = _run("layers")
    for a, b in zip(r["losses"], r["ref_losses"]):
        assert abs(a - b) <= TOLERANCE * abs(b), (r["losses"], r["ref_losses"])
    assert r["error"] < TOLERANCE, r["error"]
    # The collectives of parameters: their operand a parameter or a step of one.
    parameters = [f"(%{n}{end}" for n, _ in _layers().named_parameters() for end in (")", ".")]
    lines = [line for line in r["rank_ir"].splitlines() if any(p in line for p in parameters)]

    def groups(kind: str, mark: str) -> tuple[set[str], int]:
        marked = [line for line in lines if f"shardwise::{kind}" in line and f'overlap="{mark}"' in line]
        assert marked and all("unit_group=" in line for line in marked), marked
        return {line.split("unit_group=")[1].split("}")[0] for line in marked}, len(marked)

    # The rank program groups each unit's parameters: the input projection's, each block's and
    # the head's (five units), one group each for the forward gathers and the gradients.
    gathers, gather_lines = groups("all_gather", "forward")
    scatters, scatter_lines = groups("reduce_scatter", "backward")
    assert len(gathers) == 5 and len(scatters) == 5, (gathers, scatters)
    assert gather_lines > len(gathers) and scatter_lines > len(scatters), (gather_lines, scatter_lines)
    # The run issues one collective per group: five reduce-scatters a step; five gathers in
    # forward and at most one more per unit for backward, fewer than one per parameter.
    calls = {kind: r["moved"].get(kind, {}).get("calls", 0) for kind in ("all_gather", "reduce_scatter")}
    assert calls["reduce_scatter"] == len(scatters), (calls, scatters)
    assert len(gathers) < calls["all_gather"] <= 2 * len(gathers), (calls, gathers)
    # ... and each weight at most twice in them (once for forward, once more where backward
    # reads it), however many views of it autograd saves; each gradient scattered once.
    sharded = sum(p.numel() * 8 for p in _layers().parameters() if any(size % 2 == 0 for size in p.shape))
    assert sharded < r["moved"]["all_gather"]["bytes"] <= 2 * sharded, (r["moved"], sharded)
    assert r["moved"]["reduce_scatter"]["bytes"] == sharded, (r["moved"], sharded)
    # Each group's reduce-scatter issued once its last gradient arrives and waited for at the
    # next group's, the last at the end of backward.
    assert r["in_backward"] and all(r["in_backward"]), r["in_backward"]  # every gradient taken in backward
    issued = [g for kind, g in r["events"] if kind == "issue"]
    assert len(issued) == 5 and len(set(issued)) == 5, r["events"]
    expected = [["issue", issued[0]]]
    for earlier, later in zip(issued, issued[1:]):
        expected += [["issue", later], ["wait", earlier]]
    expected.append(["wait", issued[-1]])
    assert r["events"] == expected, r["events"]
