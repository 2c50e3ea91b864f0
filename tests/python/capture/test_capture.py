"""Capture of real models into the core IR: parameters, FLOPs, repeated blocks,
unknown ops, round trips, batch dimensions and errors."""
from __future__ import annotations

import json
import time
import warnings

import pytest
import torch
import torch.nn as nn

import shardwise
from conftest import BATCH, MODELS, SEQ, VOCAB, _ids, gpt2, llama, transformers


def _numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields tied weights once


@pytest.mark.parametrize("name,method", [(m, method) for m in sorted(MODELS) for method in ("export", "fx")])
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


def test_meta_gpt2_xl_captures_with_48_repeated_blocks():
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(n_layer=48, n_embd=1600, n_head=25, use_cache=False))
    ids = torch.randint(0, 50257, (1, 1024), device="meta")
    start = time.perf_counter()
    graph = shardwise.capture(model, {"input_ids": ids, "labels": ids})
    elapsed = time.perf_counter() - start  # printed; benchmarks/capture.py measures capture time
    assert graph.num_parameters() == _numel(model)
    groups = graph.repeated_blocks()
    assert len(max(groups, key=len)) == 48
    print(f"GPT-2 XL shape on meta: captured in {elapsed:.1f} s, {graph.num_nodes()} nodes")


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_meta_and_cpu_captures_name_the_same_nodes(arch):
    """A plan searched on a meta-device model runs on the CPU or GPU capture of the same model,
    by node name: the two graphs must be the same node for node. SDPA's meta kernel leaves
    `out.transpose(1, 2)` non-contiguous where the CPU kernel does not (so `.contiguous()` is a
    node on meta only), and torch.tensor(data) is a lift_fresh_copy node on CPU only."""
    transformers = pytest.importorskip("transformers")

    def build():
        if arch == "gpt2":
            return transformers.GPT2LMHeadModel(transformers.GPT2Config(
                n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ))
        config = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": VOCAB, "max_position_embeddings": SEQ}
        if arch == "llama":
            return transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**config))

    def nodes(device):
        with torch.device(device):
            model = build()
        ids = torch.zeros(BATCH, SEQ, dtype=torch.long, device=device)
        doc = json.loads(shardwise.capture(model, {"input_ids": ids, "labels": ids}).to_json())
        for n in doc["nodes"]:
            n["attrs"].pop("device", None)  # arange(device=...) spells the device, as it should
        return doc

    on_cpu, on_meta = nodes("cpu"), nodes("meta")
    ops = {n["op"] for n in on_cpu["nodes"]}
    assert "aten::contiguous" not in ops and "aten::lift_fresh_copy" not in ops
    assert on_meta == on_cpu


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


# ---- architectures whose ops needed rules or rule fixes ------------------------------------

METHODS = ("export", "fx", "torchscript")


def _values(graph) -> dict:
    return {v["name"]: v for v in graph.values()}


def _capture_quietly(model, inputs, method):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation notice; tracer warnings
        return shardwise.capture(model, inputs, method=method)


def falcon(**config):
    cfg = transformers.FalconConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, vocab_size=VOCAB,
                                    use_cache=False, **config)
    return transformers.FalconForCausalLM(cfg).eval(), _ids()


class _FusedQkvAttention(nn.Module):
    """Falcon's multi-query split as transformers 4.x wrote it (5.x slices instead):
    fused_qkv[..., [-2], :] picks the key head through aten::index.Tensor with None entries."""

    def __init__(self, hidden: int = 64, heads: int = 4):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query_key_value = nn.Linear(hidden, hidden + 2 * self.head_dim)

    def forward(self, x):
        b, s, _ = x.shape
        fused = self.query_key_value(x).view(b, s, self.heads + 2, self.head_dim)
        return fused[..., :-2, :].sum(-2) * fused[..., [-2], :].squeeze(-2) + fused[..., [-1], :].squeeze(-2)


class _WithFusedQkv(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = _FusedQkvAttention()

    def forward(self, x):
        return self.attention(x).square().mean()


@pytest.mark.parametrize("method", ["export", "torchscript"])
def test_a_list_index_after_an_ellipsis_indexes_the_right_dim(method):
    """fused_qkv[..., [-2], :] indexes a trailing dim through aten::index.Tensor with None
    entries; the rule reads indices_present, so the shape check infers [b, s, 1, d] rather
    than indexing dim 0, and the batch dim runs through."""
    graph = _capture_quietly(_WithFusedQkv(), (torch.randn(BATCH, 8, 64),), method)
    assert graph.unknown_ops() == []
    values = _values(graph)
    picks = [n for n in graph.nodes() if n["op"] == "aten::index.Tensor" and "attention" in n["module"]]
    assert len(picks) == 2, [n["op"] for n in graph.nodes() if "attention" in n["module"]]  # the key's and the value's
    for node in picks:
        present = node["attrs"]["indices_present"]
        assert present[-1] == 1 and not any(present[:-1])
        out = values[node["outputs"][0]]
        assert out["shape"][0] == BATCH and out["shape"][-2] == 1 and out["batch_dim"] == 0
    plan = shardwise.plan(graph, shardwise.Cluster.preset("cpu", 4), global_batch=4, mesh=(1, 4))
    assert plan.strategies()


@pytest.mark.parametrize("config", [{"multi_query": True}, {"new_decoder_architecture": True, "num_kv_heads": 2}],
                         ids=["multi-query", "grouped-kv"])
@pytest.mark.parametrize("method", ["export", "torchscript"])
def test_falcon_captures_and_plans(config, method):
    model, inputs = falcon(**config)
    graph = _capture_quietly(model, inputs, method)
    assert graph.unknown_ops() == []
    plan = shardwise.plan(graph, shardwise.Cluster.preset("cpu", 4), global_batch=4, mesh=(1, 4))
    assert plan.strategies()


class _MinMax(nn.Module):
    def forward(self, a, b):
        return torch.min(a, b) * torch.max(a, b)


@pytest.mark.parametrize("method", METHODS)
def test_binary_min_and_max_are_elementwise(method):
    """torch.min(a, b) / torch.max(a, b) are aten::min.other / max.other: pointwise, not
    the full reductions aten::min / aten::max whose rule they used to borrow."""
    graph = _capture_quietly(_MinMax(), (torch.randn(4, 8), torch.randn(4, 1)), method)
    assert {n["op"] for n in graph.nodes()} >= {"aten::min.other", "aten::max.other"}
    assert graph.unknown_ops() == []
    (out,) = graph.output_names()
    assert _values(graph)[out]["shape"] == [4, 8] and _values(graph)[out]["batch_dim"] == 0


def test_t5_relative_position_buckets_capture():
    """T5 computes its relative position buckets with torch.min(a, b)."""
    cfg = transformers.T5Config(num_layers=1, num_decoder_layers=1, d_model=64, d_kv=16, d_ff=128, num_heads=4,
                                vocab_size=VOCAB, decoder_start_token_id=0, use_cache=False)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    ids = _ids()["input_ids"]
    graph = shardwise.capture(model, {"input_ids": ids, "labels": ids[:, : SEQ // 2].contiguous()})
    assert "aten::min.other" in {n["op"] for n in graph.nodes()}
    assert graph.unknown_ops() == []
    assert graph.num_parameters() == _numel(model)


def _freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    freqs = torch.outer(torch.arange(end, dtype=torch.float32), freqs)
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64, as the Llama reference code builds it


def _apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class ComplexRopeAttention(nn.Module):
    """The attention of the Llama reference code and torchtitan's llama, trimmed: rotary
    embeddings as a complex product with a complex64 buffer."""

    def __init__(self, dim: int = 64, heads: int = 4, max_seq: int = 32):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.register_buffer("freqs_cis", _freqs_cis(self.head_dim, max_seq), persistent=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim)
        k = self.wk(x).view(b, s, self.heads, self.head_dim)
        v = self.wv(x).view(b, s, self.heads, self.head_dim)
        q, k = _apply_rotary_emb(q, k, self.freqs_cis[:s])
        out = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                         is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


@pytest.mark.parametrize("method", ["export", "torchscript"])
def test_complex_rotary_embeddings_have_rules_and_complex_values(method):
    torch.manual_seed(0)
    graph = _capture_quietly(ComplexRopeAttention().eval(), (torch.randn(4, 16, 64),), method)
    assert graph.unknown_ops() == []
    ops = {n["op"] for n in graph.nodes()}
    assert {"aten::view_as_complex", "aten::view_as_real"} <= ops
    values = _values(graph)
    assert values["freqs_cis"]["dtype"] == "c64"
    product = [values[n["outputs"][0]] for n in graph.nodes() if n["op"] == "aten::mul.Tensor"]
    assert product and all(v["dtype"] == "c64" and v["batch_dim"] == 0 for v in product)
    (out,) = graph.output_names()
    assert values[out]["batch_dim"] == 0
    # Priced in bf16 (the CPU's slow rate): a layout that splits the complex nodes beats
    # replicating them; the rules must allow it. In the model's f32 the tiny model stays whole.
    plan = shardwise.plan(graph, shardwise.Cluster.preset("cpu", 4), global_batch=4, mesh=(1, 4), precision="bf16")
    assert any(s != "replicate" for texts in plan.strategies().values() for s in texts)


# ---- binding inputs, non-tensor outputs, errors -------------------------------------------


class _StarArgs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, *xs):
        return sum(self.fc(x) for x in xs)


class _ArgThenStarArgs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, *rest, scale: float = 2.0):
        return self.fc(x) * scale + sum(rest)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("model_cls,names", [(_StarArgs, ["xs_0", "xs_1"]), (_ArgThenStarArgs, ["x", "rest_0"])])
def test_forward_star_args_are_bound_and_passed_positionally(method, model_cls, names):
    """The items of forward(*xs) are inputs xs_0, xs_1, ...; every front end calls the model
    back with them (and any argument before them) positionally."""
    torch.manual_seed(0)
    model = model_cls()
    graph = _capture_quietly(model, (torch.randn(2, 8), torch.randn(2, 8)), method)
    inputs = [v["name"] for v in graph.values() if v["role"] == "input"]
    assert inputs == names
    assert [v["name"] for v in graph.values() if v["role"] == "parameter"] == ["fc.weight", "fc.bias"]
    assert graph.unknown_ops() == []
    assert "aten::linear" in {n["op"] for n in graph.nodes()}


def test_transformers_default_use_cache_captures_through_torchscript():
    """With its default use_cache=True a transformers model returns a Cache object, which
    the TorchScript tracer cannot type; capture traces the output's tensors only, as export
    does, so both give the same outputs."""
    cfg = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64)
    assert cfg.use_cache
    model = transformers.LlamaForCausalLM(cfg).eval()
    by_ts = _capture_quietly(model, _ids(), "torchscript")
    by_export = shardwise.capture(model, _ids())
    out_shapes = lambda g: [_values(g)[o]["shape"] for o in g.output_names()]  # noqa: E731
    assert out_shapes(by_ts) == out_shapes(by_export) == [[], [BATCH, SEQ, VOCAB]]  # loss, logits
    assert by_ts.unknown_ops() == [] and by_ts.num_parameters() == _numel(model)
    assert "forward" not in model.__dict__  # the traced copy's forward, not the user's model's


class _NoFake(nn.Module):
    def forward(self, x):
        return torch.ops.shardwise_test_nofake.double(x)


class _WithNoFake(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.inner = nn.Sequential(nn.ReLU(), _NoFake())

    def forward(self, x):
        return self.inner(self.fc(x)).sum()


@pytest.fixture(scope="module")
def op_without_fake_kernel():
    lib = torch.library.Library("shardwise_test_nofake", "FRAGMENT")
    lib.define("double(Tensor x) -> Tensor")
    lib.impl("double", lambda x: x * 2, "CPU")  # no Meta / fake kernel: shapes cannot be traced
    yield
    del lib


@pytest.mark.parametrize("method", ["export", "fx"])
def test_an_op_that_cannot_be_traced_is_named_with_its_module(op_without_fake_kernel, method):
    with pytest.raises(shardwise.CaptureError) as info:
        shardwise.capture(_WithNoFake(), (torch.randn(2, 4),), method=method)
    first = str(info.value).splitlines()[0]
    assert "shardwise_test_nofake::double" in first and "in module 'inner.1' (_NoFake)" in first, first
    assert "register_fake" in str(info.value)


def test_an_op_that_cannot_be_traced_is_kept_by_torchscript(op_without_fake_kernel):
    graph = _capture_quietly(_WithNoFake(), (torch.randn(2, 4),), "torchscript")
    assert [(u.op, u.module_path) for u in graph.unknown_ops()] == [("shardwise_test_nofake::double", "inner.1")]


class _DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return y[torch.nonzero(y > 0)[:, 0]].sum()


@pytest.mark.parametrize("method", ["export", "fx"])
def test_a_data_dependent_shape_names_the_node(method):
    with pytest.raises(shardwise.CaptureError, match=r"node 'nonzero' \(aten::nonzero\).*depends on tensor values"):
        shardwise.capture(_DataDependent(), (torch.randn(2, 4),), method=method)


class _TableAndListIndex(nn.Module):
    """A buffer sliced by a traced size (rotary tables, causal masks) and a list index
    (a tensor made from a Python list): the two things plain symbolic_trace + make_fx lost."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("table", torch.randn(32, 8))

    def forward(self, x):
        y = self.fc(x) + self.table[: x.size(1)]
        return y.view(x.size(0), x.size(1), 2, 4)[..., [-1], :]


def test_fx_reads_buffers_and_constant_tensors():
    graph = shardwise.capture(_TableAndListIndex(), (torch.randn(2, 16, 8),), method="fx")
    values = _values(graph)
    assert values["table"]["role"] == "buffer"
    assert [v["shape"] for v in graph.values() if v["role"] == "constant"] == [[1]]
    (out,) = graph.output_names()
    assert values[out]["shape"] == [2, 16, 1, 4] and values[out]["batch_dim"] == 0


class _Flagged(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, double=False, *, scale=1.0):
        y = self.fc(x) * scale
        return y * 2 if double else y


@pytest.mark.parametrize("method", METHODS)
def test_python_constant_inputs_are_specialised(method):
    """Flags and numbers among the inputs (use_cache=False, output_attentions=True) are part
    of the program: every front end bakes them in, and only tensors become inputs."""
    graph = _capture_quietly(_Flagged(), {"x": torch.randn(2, 4), "double": True, "scale": 3.0}, method)
    assert [v["name"] for v in graph.values() if v["role"] == "input"] == ["x"]
    assert [(n["op"], n["attrs"].get("other")) for n in graph.nodes()] == [
        ("aten::linear", None), ("aten::mul.Tensor", 3.0), ("aten::mul.Tensor", 2)]


@pytest.mark.parametrize("method", METHODS)
def test_mixture_of_experts_captures_by_every_method(method):
    """Mixtral's experts take transformers' traceable grouped-mm path under every tracer
    (fx traces with torch.compiler.is_compiling() true, as export does). The expert
    dispatch (aten::histc, transformers::grouped_mm_fallback) has no rule yet: reported,
    replicated."""
    cfg = transformers.MixtralConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64,
                                     num_local_experts=4, num_experts_per_tok=2)
    model = transformers.MixtralForCausalLM(cfg).eval()
    graph = _capture_quietly(model, _ids(), method)
    assert graph.num_parameters() == _numel(model)
    assert {u.module_path for u in graph.unknown_ops()} <= {"model.layers.0.mlp.experts"}


# ---- causal masks: a constant of the graph given back to attention as is_causal -------------------
def _attention_nodes(graph):
    return [n for n in graph.nodes() if n["op"] == "aten::scaled_dot_product_attention"]


@pytest.mark.parametrize("method", ["export", "fx"])
def test_a_causal_mask_built_from_shapes_becomes_is_causal(method):
    # transformers' SDPA attention passes is_causal=True eagerly, but under tracing it builds a
    # [batch, 1, seq, seq] mask from arange: the capture gives the call back its is_causal.
    model, batch = gpt2()
    graph = shardwise.capture(model, batch, method=method)
    nodes = _attention_nodes(graph)
    assert nodes and all(n["attrs"]["is_causal"] is True and len(n["inputs"]) == 3 for n in nodes), nodes[:1]
    assert not any(n["op"] == "aten::cumsum" for n in graph.nodes())  # the mask's own ops are gone


def test_a_padding_mask_stays_a_mask():
    model, batch = gpt2()
    mask = torch.ones_like(batch["input_ids"])
    mask[0, -3:] = 0  # padding: the mask depends on the input, not only on shapes
    graph = shardwise.capture(model, {**batch, "attention_mask": mask})
    nodes = _attention_nodes(graph)
    assert nodes and all(n["attrs"]["is_causal"] is False and len(n["inputs"]) == 4 for n in nodes), nodes[:1]


class _ShapeMask(nn.Module):
    """Attention whose mask is built from shapes alone, as transformers builds one under
    tracing: broadcast comparisons of a query row's positions against a key column's."""

    def __init__(self, kind: str, batched: bool = True):
        super().__init__()
        self.kind, self.batched = kind, batched
        self.proj = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.proj(x).unsqueeze(1).chunk(3, dim=-1)
        i = torch.arange(x.shape[1], device=x.device)
        rows, cols = i[:, None], i[None, :]  # [seq, 1] and [1, seq]
        if self.batched:  # [batch, 1, seq, 1] and [batch, 1, 1, seq]
            rows, cols = rows.expand(x.shape[0], 1, -1, 1), cols.expand(x.shape[0], 1, 1, -1)
        mask = {"causal": cols <= rows, "reversed": rows >= cols, "strict": cols < rows,
                "shifted": cols <= rows + 1, "same-document": (cols <= rows) & (cols * 0 == rows * 0),
                "band": (cols <= rows) & (rows - cols < 2)}[self.kind]
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum()


@pytest.mark.parametrize("band", [False, True])
def test_only_a_mask_equal_to_the_causal_one_is_folded(band):
    x = torch.randn(2, 6, 8)
    model = _ShapeMask("band" if band else "causal", batched=False)
    graph = shardwise.capture(model, (x,))
    (node,) = _attention_nodes(graph)
    assert node["attrs"]["is_causal"] is (not band), node
    assert len(node["inputs"]) == (4 if band else 3), node


@pytest.mark.parametrize("kind,causal", [("causal", True), ("reversed", True), ("same-document", True),
                                         ("strict", False), ("shifted", False), ("band", False)])
def test_a_large_mask_is_judged_without_building_it(kind, causal, monkeypatch):
    # Above _WHOLE_LIMIT elements the mask is never built whole (at 131,072 tokens it would be
    # 17 GB): a causal one is proved so in linear time, any other is compared in blocks of rows
    # or left a mask, and only the causal one is folded.
    from shardwise import _causal_masks

    monkeypatch.setattr(_causal_masks, "_WHOLE_LIMIT", 16)  # every [2, 1, 6, 6] mask is "large"
    graph = shardwise.capture(_ShapeMask(kind), (torch.randn(2, 6, 8),))
    (node,) = _attention_nodes(graph)
    assert node["attrs"]["is_causal"] is causal, node
    assert len(node["inputs"]) == (3 if causal else 4), node
    # Nor compared in blocks when too large to compare: a mask it cannot prove stays a mask.
    monkeypatch.setattr(_causal_masks, "_COMPARED_LIMIT", 16)
    graph = shardwise.capture(_ShapeMask(kind), (torch.randn(2, 6, 8),))
    (node,) = _attention_nodes(graph)
    proved = kind in ("causal", "reversed", "same-document")
    assert node["attrs"]["is_causal"] is proved, node


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_the_mask_fold_holds_memory_linear_in_the_sequence(model, monkeypatch):
    # transformers' masks at two lengths on the meta device: folded at both, and no value the
    # fold builds on the host has more elements than a few per token or the whole limit
    # (issue 48: capture of a 131,072-token Llama built [seq, seq] masks and did not finish in
    # 24 GiB).
    from shardwise import _causal_masks

    largest = []
    built = _causal_masks._constant

    def measured(node, values):
        out = built(node, values)
        largest.append(max((v.numel() for v in values.values() if isinstance(v, torch.Tensor)), default=0))
        return out

    monkeypatch.setattr(_causal_masks, "_constant", measured)
    for seq in (2048, 8192):  # [2, 1, seq, seq] masks of 8.4M and 134M elements: above _WHOLE_LIMIT
        largest.clear()
        if model == "gpt2":
            cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=seq)
            make = transformers.GPT2LMHeadModel
        else:
            cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                           num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
                                           max_position_embeddings=seq)
            make = transformers.LlamaForCausalLM
        with torch.device("meta"):
            module = make(cfg)
        ids = torch.zeros(2, seq, dtype=torch.long, device="meta")
        graph = shardwise.capture(module, {"input_ids": ids, "labels": ids})
        nodes = _attention_nodes(graph)
        assert nodes and all(n["attrs"]["is_causal"] is True for n in nodes), (seq, nodes[:1])
        # (values up to _WHOLE_LIMIT elements are built whole: 2048 x 2048 is that limit)
        bound = max(_causal_masks._WHOLE_LIMIT, 4 * seq)
        assert largest and max(largest) <= bound < seq * seq * 2, (seq, max(largest))


class _WritesThroughATranspose(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x) * 2
        y.transpose(0, 1).add_(1)  # no functional form for a write through a transpose
        return y.sum()


def test_export_traces_without_stack_traces_and_errors_still_name_the_line(monkeypatch):
    # Extracting a Python stack trace per ATen node was a sixth of capturing a 32-layer Llama at
    # 16 x 8,192 (issue 48): export runs without them, and with lazy GraphModules (their code
    # generated when first run, not after every export pass). A capture error, traced again with
    # stack traces, still names the model's source line.
    import torch.fx._lazy_graph_module as lazy
    import torch.fx.config as fx_config

    export, seen = torch.export.export, []

    def recording(*args, **kwargs):
        seen.append(fx_config.do_not_emit_stack_traces)
        assert lazy._use_lazy_graph_module_flag is seen[-1]
        return export(*args, **kwargs)

    monkeypatch.setattr(torch.export, "export", recording)
    shardwise.capture(nn.Linear(4, 4), (torch.randn(2, 4),))
    assert seen == [True] and fx_config.do_not_emit_stack_traces is False
    seen.clear()
    with pytest.raises(shardwise.CaptureError, match=r"no functional form .*test_capture\.py\", line \d+, in forward"):
        shardwise.capture(_WritesThroughATranspose(), (torch.randn(4, 4),))
    assert seen == [True, False] and fx_config.do_not_emit_stack_traces is False
    assert lazy._use_lazy_graph_module_flag is False
