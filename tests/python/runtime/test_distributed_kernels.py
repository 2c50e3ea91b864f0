"""Plans that split a dim an op normalises over run the runtime's distributed kernel for it
(csrc/ops/distributed_kernels.h, python/shardwise/runtime/kernels.py), not the op on gathered
operands, and train as one device does.

Each kernel's own values and gradients are checked in test_collectives.py; here they run
inside whole training steps: layer norm, RMS norm, softmax and log-softmax split over their
last dim, nll over split classes, and training batch norm split over the batch (the plan a
data-parallel CNN gets from the search, with its running statistics and eval mode), on
real Gloo ranks in float64 against one device.
"""
from __future__ import annotations

import json
import os
import re
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import shardwise
from conftest import run_ranks, train_one_device

STEPS, ROWS, TOLERANCE = 3, 8, 1e-9

# The node each kernel runs and the index its plan splits (the rule's label for it).
SPLITS = {"layer_norm": "W0", "rms_norm": "W0", "softmax": "W0", "log_softmax": "W0", "nll_loss_nd": "C"}
KERNELS = ("split_layer_norm", "split_rms_norm", "split_softmax", "split_log_softmax", "vocab_nll_loss")


class Statistics(nn.Module):
    """Every statistics op a transformer's layer and head have, on a hidden dim of 24."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 24)
        self.ln = nn.LayerNorm(24)
        self.rms = nn.RMSNorm(24)
        self.fc2 = nn.Linear(24, 10)

    def forward(self, x, y):
        h = self.rms(self.ln(self.fc1(x)))
        h = h * torch.softmax(h, -1)
        return F.nll_loss(torch.log_softmax(self.fc2(h), -1), y, ignore_index=3)


class BatchNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)  # ResNet's: a bias before a norm has no gradient
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 5)

    def forward(self, x, y):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        return F.cross_entropy(self.fc(h.mean((2, 3))), y)


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return (Statistics() if name == "statistics" else BatchNormNet()).double().train()


def _batch(name: str, step: int):
    g = torch.Generator().manual_seed(step)
    if name == "statistics":
        return torch.randn(ROWS, 16, generator=g, dtype=torch.float64), torch.randint(0, 10, (ROWS,), generator=g)
    return torch.randn(ROWS, 3, 64, 64, generator=g, dtype=torch.float64), torch.randint(0, 5, (ROWS,), generator=g)


def _plan(name: str, world: int, mesh: tuple[int, int]):
    model, batch = _model(name), _batch(name, 0)
    graph = shardwise.capture(model, batch)
    plan = shardwise.Plan.search(graph, shardwise.Cluster.preset("cpu", world), mesh=mesh, global_batch=ROWS,
                                 precision="f32")
    if name != "statistics":
        return plan  # the search's own plan
    doc = json.loads(plan.to_json())
    doc.pop("predicted", None)
    doc.pop("programs", None)
    for node, label in SPLITS.items():  # each statistics op split over its normalised dim on the tensor axis
        doc["sharding"]["strategies"][node] = ["replicate", f"split {label}"]
    return shardwise.Plan.from_json(json.dumps(doc))


def _worker(rank: int, world: int, store: str, name: str, mesh: tuple[int, int], result: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        plan = _plan(name, world, mesh)
        engine = shardwise.parallelize(_model(name), _batch(name, 0), plan=plan)
        optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-2)
        losses = []
        for step in range(STEPS):
            losses.append(float(engine.train_step(*_batch(name, step))))
            optimizer.step()
            optimizer.zero_grad()
        state = engine.full_state_dict()
        engine.eval()
        eval_loss = float(engine.eval_step(*_batch(name, 9)))

        reference = _model(name)
        ref_losses = train_one_device(reference, lambda step: _batch(name, step), STEPS,
                                      torch.optim.AdamW(reference.parameters(), lr=1e-2))
        reference.eval()
        with torch.no_grad():
            ref_eval = float(reference(*_batch(name, 9)))
        errors = {key: ((state[key].double() - t.double()).abs().max() / t.double().abs().max().clamp_min(1e-6)).item()
                  for key, t in reference.state_dict().items()}
        if rank == 0:
            with open(result, "w") as f:
                json.dump({"errors": errors, "losses": losses, "ref_losses": ref_losses,
                           "eval": abs(eval_loss - ref_eval) / abs(ref_eval), "whole": engine.whole_nodes,
                           "rank_ir": engine.rank_ir, "code": engine.code, "strategies": engine.plan.strategies()}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(name: str, mesh: tuple[int, int]) -> dict:
    world = mesh[0] * mesh[1]
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        run_ranks(_worker, args=(world, os.path.join(tmp, "store"), name, mesh, result), nprocs=world)
        with open(result) as f:
            return json.load(f)


def _check(r: dict) -> None:
    for a, b in zip(r["losses"], r["ref_losses"]):
        assert abs(a - b) <= TOLERANCE * abs(b), r["losses"]
    for key, error in r["errors"].items():  # parameters, and batch norm's running statistics
        assert error < TOLERANCE, (key, r["errors"])
    assert r["eval"] < TOLERANCE, r["eval"]
    assert r["whole"] == [], r["whole"]  # no node ran on gathered operands


def test_norms_softmax_and_nll_split_over_their_dim_run_their_kernels_and_equal_one_device():
    r = _spawn("statistics", (1, 2))
    _check(r)
    for node, label in SPLITS.items():
        assert r["strategies"][node] == ["replicate", f"split {label}"], (node, r["strategies"])
    for kernel in KERNELS:
        assert f"shardwise::{kernel}(" in r["rank_ir"], kernel
        assert f"'shardwise::{kernel}'" in r["code"], kernel
    # No kernel's operand is gathered: it arrives as this rank's block (sliced from a
    # replicated value, or as its producer left it).
    forward_steps = {m.group(1): m.group(2) for m in re.finditer(r"(\w+) = self\.reshard\(\w+, \(([^)]*\)?)", r["code"])}
    operands = re.findall(r"self\.statistics\('[\w:]+', [\d, ]+\((\w+),", r["code"])
    assert len(operands) == len(KERNELS), operands
    for operand in operands:
        assert "all_gather" not in forward_steps.get(operand, ""), (operand, r["code"])


def test_data_parallel_batch_norm_syncs_its_statistics_and_equals_one_device():
    # The search's plan for a CNN on 2 data ranks splits batch norm over the batch: the kernel
    # combines the two halves' statistics (SyncBatchNorm), so training, the running statistics
    # and eval equal one device's on the whole batch.
    r = _spawn("batchnorm", (2, 1))
    for node in ("batch_norm", "batch_norm_1"):
        assert r["strategies"][node] == ["split W0", "replicate"], r["strategies"]
    _check(r)
    assert r["rank_ir"].count("shardwise::sync_batch_norm(") == 2
