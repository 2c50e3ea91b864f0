"""Capture of real models into the core IR: parameters, FLOPs, repeated blocks,
unknown ops, round trips, batch dimensions and errors."""
from __future__ import annotations

import json
import time

import pytest
import torch
import torch.nn as nn

import shardwise
from conftest import BATCH, MODELS, SEQ, VOCAB, gpt2, llama


def _numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields tied weights once


# transformers models branch on Python values while building masks, which
# symbolic_trace cannot follow; the fx path is covered by the CNN and TinyGPT.
@pytest.mark.parametrize("name,method", [(m, "export") for m in sorted(MODELS)] + [("cnn", "fx")])
def test_capture_counts_parameters_and_knows_every_op(name, method):
    model, inputs = MODELS[name]()
    graph = shardwise.capture(model, inputs, method=method)
    assert graph.unknown_ops() == []
    assert graph.num_parameters() == _numel(model)
    assert graph.num_nodes() > 0
    assert graph.forward_flops() > 0


def test_tied_weights_are_one_value():
    model, inputs = gpt2(layers=1)
    assert model.lm_head.weight is model.transformer.wte.weight
    graph = shardwise.capture(model, inputs)
    names = [v["name"] for v in graph.values() if v["role"] == "parameter"]
    assert "transformer.wte.weight" in names and "lm_head.weight" not in names
    lm_head = [n for n in graph.nodes() if n["module"] == "lm_head"]
    assert lm_head and "transformer.wte.weight" in lm_head[0]["inputs"]


def test_gpt2_matmul_flops_match_the_analytic_count():
    layers, hidden, heads = 3, 64, 4
    model, inputs = gpt2(layers, hidden, heads)
    graph = shardwise.capture(model, inputs)
    b, s, h, v = BATCH, SEQ, hidden, VOCAB
    # per layer: QKV 6bsh^2, out proj 2bsh^2, MLP 16bsh^2, QK^T and AV 4bs^2h; plus the LM head
    analytic = layers * (24 * b * s * h * h + 4 * b * s * s * h) + 2 * b * s * h * v
    assert graph.matmul_flops() == pytest.approx(analytic, rel=0.01)


@pytest.mark.parametrize("factory,parent,count", [(gpt2, "transformer.h", 3), (llama, "model.layers", 2)])
def test_decoder_layers_are_found_as_repeated_blocks(factory, parent, count):
    model, inputs = factory()
    groups = shardwise.capture(model, inputs).repeated_blocks()
    assert groups, "no repeated blocks found"
    top = max(groups, key=len)
    assert top.parent == parent
    assert top.module_paths == tuple(f"{parent}.{i}" for i in range(count))
    assert top.nodes_per_block > 5


def test_tiny_gpt_export_and_fx_give_the_same_graph():
    model = shardwise.models.TinyGPT()
    inputs = model.example_inputs()
    by_export = shardwise.capture(model, inputs, method="export")
    by_fx = shardwise.capture(model, inputs, method="fx")
    ops = lambda g: [(n["op"], n["module"]) for n in g.nodes()]  # noqa: E731
    assert ops(by_export) == ops(by_fx)
    assert by_export.num_parameters() == by_fx.num_parameters() == _numel(model)
    assert by_export.forward_flops() == by_fx.forward_flops()
    assert [len(g) for g in by_export.repeated_blocks()] == [model.cfg.layers]


def test_round_trips_through_json_and_text():
    model, inputs = llama()
    graph = shardwise.capture(model, inputs)
    again = shardwise.Graph.from_json(graph.to_json())
    assert again == graph
    assert str(again) == str(graph)
    parsed = shardwise.Graph.from_text(str(graph))
    assert parsed == graph
    doc = json.loads(graph.to_json())
    assert doc["format"] == "shardwise.graph"


def test_batch_dimension_reaches_the_logits():
    model, inputs = gpt2(layers=1)
    graph = shardwise.capture(model, inputs)
    values = {v["name"]: v for v in graph.values()}
    assert values["input_ids"]["batch_dim"] == 0
    logits = [v for v in graph.values() if v["shape"] == [BATCH, SEQ, VOCAB]]
    assert logits and all(v["batch_dim"] == 0 for v in logits)
    no_batch = shardwise.capture(model, inputs, batch_dim=None)
    assert all(v["batch_dim"] is None for v in no_batch.values())


def test_summary_names_the_numbers():
    model, inputs = gpt2()
    graph = shardwise.capture(model, inputs)
    text = graph.summary()
    assert "transformer.h" in text
    assert str(graph.num_nodes()) in text


def test_unknown_op_becomes_an_opaque_node_and_is_reported():
    lib = torch.library.Library("shardwise_test", "FRAGMENT")
    lib.define("mystery(Tensor x) -> Tensor")
    lib.impl("mystery", lambda x: x * 2, "CompositeExplicitAutograd")
    lib.impl("mystery", lambda x: torch.empty_like(x), "Meta")

    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return torch.ops.shardwise_test.mystery(self.fc(x)).sum()

    graph = shardwise.capture(Odd(), (torch.randn(2, 4),))
    unknown = graph.unknown_ops()
    assert [(u.op, u.module_path) for u in unknown] == [("shardwise_test::mystery", "")]
    assert graph.num_parameters() == 20


def test_data_dependent_control_flow_is_a_clear_error():
    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # depends on the data: no static graph exists
                return x * 2
            return x - 1

    with pytest.raises(shardwise.CaptureError, match="Branchy"):
        shardwise.capture(Branchy(), (torch.randn(3),))


def test_bad_arguments_are_rejected():
    model, inputs = gpt2(layers=1)
    with pytest.raises(ValueError, match="method"):
        shardwise.capture(model, inputs, method="onnx")
    with pytest.raises(shardwise.CaptureError, match="do not match"):
        shardwise.capture(model, (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18))
    with pytest.raises(TypeError):
        shardwise.capture(lambda x: x, (torch.randn(2),))


def test_meta_gpt2_xl_captures_quickly_with_48_repeated_blocks():
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(n_layer=48, n_embd=1600, n_head=25, use_cache=False))
    ids = torch.randint(0, 50257, (1, 1024), device="meta")
    start = time.perf_counter()
    graph = shardwise.capture(model, {"input_ids": ids, "labels": ids})
    elapsed = time.perf_counter() - start
    assert elapsed < 60, f"capture took {elapsed:.1f} s"
    assert graph.num_parameters() == _numel(model)
    groups = graph.repeated_blocks()
    assert len(max(groups, key=len)) == 48
    print(f"GPT-2 XL shape on meta: captured in {elapsed:.1f} s, {graph.num_nodes()} nodes")


_CONTRACTIONS = {"aten::linear", "aten::addmm", "aten::matmul", "aten::mm", "aten::bmm",
                 "aten::scaled_dot_product_attention", "aten::conv2d", "aten::embedding"}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_export_and_torchscript_give_the_same_ir_modulo_op_spelling(name):
    """The two importers agree on what matters to a planner: the parameters (names,
    shapes), the sequence of heavy ops with their module paths and shapes, the FLOPs
    of the contractions, the repeated blocks and the output types. They may differ in
    the mask-building plumbing that transformers emits differently under tracing."""
    model, inputs = MODELS[name]()
    with pytest.warns((DeprecationWarning, FutureWarning)):  # TorchScript's status stays visible
        by_ts = shardwise.capture(model, inputs, method="torchscript")
    by_export = shardwise.capture(model, inputs, method="export")

    def params(g):
        return {v["name"]: v["shape"] for v in g.values() if v["role"] in ("parameter", "buffer")}

    def heavy(g):
        shapes = {v["name"]: v["shape"] for v in g.values()}
        return [(n["op"], n["module"], [shapes[o] for o in n["outputs"]])
                for n in g.nodes() if n["op"] in _CONTRACTIONS]

    assert params(by_ts) == params(by_export)
    assert heavy(by_ts) == heavy(by_export)
    assert by_ts.matmul_flops() == by_export.matmul_flops()
    assert by_ts.num_parameters() == by_export.num_parameters() == _numel(model)
    assert by_ts.unknown_ops() == [] and by_export.unknown_ops() == []
    assert [g.module_paths for g in by_ts.repeated_blocks()] == [g.module_paths for g in by_export.repeated_blocks()]
    out_types = lambda g: [(v["shape"], v["dtype"]) for v in g.values() if v["name"] in g.output_names()]  # noqa: E731
    assert sorted(out_types(by_ts)) == sorted(out_types(by_export))
