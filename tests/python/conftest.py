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


def cnn():
    torch.manual_seed(0)
    return SmallCNN().eval(), (torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,)))


MODELS = {"gpt2": gpt2, "bert": bert, "llama": llama, "cnn": cnn}



TIGHT_PRECISION = "bf16"


def tight_cluster(graph, world: int, rows: int, mesh: tuple[int, int]):
    """A CPU cluster whose memory holds `graph` on `mesh` only with weights sharded on the
    mesh's tensor axis: halfway between the least any plan needs and what the replicated
    plan needs (as the cost model predicts them). A tiny model's plan otherwise splits only
    the batch, on both axes. Priced in TIGHT_PRECISION (bf16, CPU's slow rate, where such a
    layout is worth its collectives) and without ZeRO's sharded optimizer states (which save
    a tiny model's memory without sharding any weight): searches on it must state the same
    precision and zero=False (``tight_plan``; ``parallelize(..., zero=False)``)."""
    import json

    import shardwise

    def with_memory(cluster, memory: float):
        doc = json.loads(cluster.to_json())
        doc["device_types"][0]["memory_bytes"] = int(memory)
        return shardwise.Cluster.from_json(json.dumps(doc))

    cluster = shardwise.Cluster.preset("cpu", world)
    replicated = shardwise.plan(graph, cluster, global_batch=rows, mesh=mesh, precision=TIGHT_PRECISION,
                                zero=False).predicted_memory()[0]
    least = shardwise.plan(graph, with_memory(cluster, 1), global_batch=rows, mesh=mesh, precision=TIGHT_PRECISION,
                           zero=False).predicted_memory()[0]
    return with_memory(cluster, (least + replicated) / 2 / shardwise._C.MEMORY_FRACTION)  # what plans may use


def tight_plan(graph, world: int, rows: int, mesh: tuple[int, int]):
    """The search's plan for `graph` on ``tight_cluster``: weights sharded on the tensor axis."""
    import shardwise

    return shardwise.plan(graph, tight_cluster(graph, world, rows, mesh), global_batch=rows, mesh=mesh,
                          precision=TIGHT_PRECISION, zero=False)


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
