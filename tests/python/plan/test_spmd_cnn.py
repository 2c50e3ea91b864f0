"""shardwise.plan on a ResNet-like CNN (issue requirement): data parallel at a large batch;
with a 100k-class final layer, that layer sharded.

The model is a small ResNet-18-shaped network (7x7 stem, four stages of one basic residual
block, stride-2 downsampling, global average pool, nn.Linear head) with the loss inside the
graph: nn.functional.cross_entropy on labels given as a second input. The loss being part
of the graph is what lets the search split the head over its classes (vocabulary-parallel
cross entropy: a few bytes of max / sum-exp statistics all-reduced) instead of gathering
the logits.

Captured on the meta device at batch 2 (scaled by the search to the global batch), 224x224
images: the capture takes a few seconds and the search well under one.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import shardwise

GLOBAL_BATCH = 1024  # 128 images per GPU of a DGX A100 node


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + (x if self.down is None else self.down(x)))


class ResNetLike(nn.Module):
    def __init__(self, classes: int):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.layer1 = BasicBlock(64, 64, 1)
        self.layer2 = BasicBlock(64, 128, 2)
        self.layer3 = BasicBlock(128, 256, 2)
        self.layer4 = BasicBlock(256, 512, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)

    def forward(self, x, labels):
        x = self.layer4(self.layer3(self.layer2(self.layer1(self.stem(x)))))
        return F.cross_entropy(self.fc(torch.flatten(self.pool(x), 1)), labels)


def _capture(classes: int):
    with torch.device("meta"):
        model = ResNetLike(classes)
    x = torch.empty(2, 3, 224, 224, device="meta")
    labels = torch.empty(2, dtype=torch.long, device="meta")
    graph = shardwise.capture(model, (x, labels))
    assert graph.input_names() == ["x", "labels"]
    assert graph.unknown_ops() == []
    return model, graph


def _split_ways(plan, name: str, placement: str) -> int:
    """How many ranks `name` is split over with `placement`: the product of the mesh sizes
    of the axes where it has that placement."""
    mesh = plan.sharding["mesh"]
    return math.prod(size for size, p in zip(mesh, plan.placements()[name]) if p == placement)


def _conv_weights(model: nn.Module) -> list[str]:
    return [f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]


def _summary(plan, model) -> str:
    placements = plan.placements()
    conv = _conv_weights(model)[-1]
    return (f"mesh {plan.sharding['mesh']}, step {plan.predicted_step_time() * 1e3:.2f} ms, "
            f"memory {plan.predicted_memory()[0] / 1e9:.2f} GB; x {placements['x']}, "
            f"labels {placements['labels']}, fc.weight {placements['fc.weight']}, "
            f"fc.bias {placements['fc.bias']}, {conv} {placements[conv]}")


def _assert_trunk_data_parallel(plan, model, weights: list[str]) -> None:
    """Every convolution computes its batch shard and nothing less (no tensor split of its
    channels); each of `weights` is whole, or held sharded on the batch's axis and gathered for
    its reads (FSDP: a reduce-scatter and a gather priced against the all-reduce)."""
    placements, mesh = plan.placements(), plan.sharding["mesh"]
    batch_axes = [a for a, p in enumerate(placements["x"]) if p == "S(0)"]
    convs = {k: v for k, v in plan.sharding["strategies"].items() if k.startswith("conv2d")}
    assert convs
    for node, per_axis in convs.items():
        assert all(s == "split n" for s, size in zip(per_axis, mesh) if size > 1), (node, per_axis)
    for name in weights:
        assert all(p == "R" or (a in batch_axes and p.startswith("S(")) for a, p in enumerate(placements[name])), \
            (name, placements[name], plan.report())


@pytest.fixture(scope="module")
def imagenet_1k():
    return _capture(1000)


def test_resnet_large_batch_is_pure_data_parallel(imagenet_1k):
    # 5.4M parameters (87 MB of weights, gradients and Adam state) and 1.4 GB of activations
    # per rank at 128 images each: a data-parallel step costs only its gradient all-reduce, which
    # no tensor split of a convolution (whose activations are far larger than its weight) beats.
    # Training batch norm over a batch split on two mesh axes would run whole (its statistics
    # kernel combines one axis: search/sharding_strategies.cc), so the batch takes one axis of 8.
    model, graph = imagenet_1k
    plan = shardwise.plan(graph, shardwise.Cluster.preset("dgx-a100"), global_batch=GLOBAL_BATCH)
    print(_summary(plan, model))
    assert plan.fits
    placements = plan.placements()
    # The images are split on their batch dimension over all 8 GPUs of the node.
    assert _split_ways(plan, "x", "S(0)") == 8, (placements["x"], plan.report())
    # The 1000-class head may split its classes on another axis (a few us either way); batch
    # norm's weights are whole.
    _assert_trunk_data_parallel(plan, model, [n for n, _ in model.named_parameters() if not n.startswith("fc.")])
    norms = [f"{m}.{p}" for m, mod in model.named_modules() if isinstance(mod, nn.BatchNorm2d)
             for p in ("weight", "bias")]
    assert norms
    for name in norms:
        assert placements[name] == ["R"] * len(plan.sharding["mesh"]), (name, placements[name])


@pytest.fixture(scope="module")
def classes_100k():
    return _capture(102_400)


def test_resnet_100k_class_head_is_sharded(classes_100k):
    # The head is 102400 x 512 = 52M parameters, 10x the whole trunk, yet it reads only
    # 1024 x 512 features a step. Data parallelism would reduce its 105 MB bf16 gradient every
    # step and keep 52M x 16 bytes of state on every rank; splitting its classes costs an
    # all-gather of the features, a reduce-scatter of their gradient and a few bytes of
    # cross-entropy statistics. The devices keep their full 80 GB: time decides, not memory.
    model, graph = classes_100k
    plan = shardwise.plan(graph, shardwise.Cluster.preset("dgx-a100"), global_batch=GLOBAL_BATCH)
    print(_summary(plan, model))
    assert plan.fits
    placements = plan.placements()
    assert any(p.startswith("S(0)") for p in placements["fc.weight"]), (placements["fc.weight"], plan.report())
    # Every rank computes its share of the classes, so the head's gradient is complete where it
    # is made: no collective moves the whole of it.
    whole_gradient = 102_400 * 512 * 2
    head_traffic = [c for c in plan.collectives() if c["value"] == "fc.weight"]
    assert all(c["bytes"] < whole_gradient for c in head_traffic), head_traffic
    # The trunk stays data parallel, the images split over all 8 GPUs.
    assert _split_ways(plan, "x", "S(0)") == 8, (placements["x"], plan.report())
    _assert_trunk_data_parallel(plan, model, _conv_weights(model))
