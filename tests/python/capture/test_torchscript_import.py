"""TorchScript importer (csrc/torch/torchscript_import.cc) on real models nobody here
wrote: Hugging Face GPT-2, BERT and LLaMA built from small configs with random
weights, and a small CNN; plus the plumbing folds and the errors on what the IR cannot
express (data-dependent control flow, missing shapes).

Most checks use `_C._torchscript_import_debug`, which returns the imported graph as plain
Python data; `import_torchscript` itself returns a `_C.Graph` (checked at the end).
"""
from __future__ import annotations

import collections
import math
import re
import warnings

import pytest
import torch
import torch.nn as nn

import shardwise
from shardwise import _C
from shardwise._torchscript import (
    import_graph_debug,
    import_torchscript,
    import_torchscript_debug,
    trace,
)
from shardwise.capture import _tensor_leaves  # the flattening capture itself applies to outputs

transformers = pytest.importorskip("transformers")

# jit.trace's DeprecationWarning is asserted once (test_trace_keeps_deprecation_warning);
# here it would only repeat. The tracer's warnings about Python-side branches in the
# Hugging Face code are expected: tracing bakes those branches in.
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

BATCH, SEQ, VOCAB = 2, 8, 128


# ---- helpers ----------------------------------------------------------------------------


class Imported:
    """The debug form of an imported graph, with lookups."""

    def __init__(self, doc: dict):
        self.doc = doc
        self.values = {v["name"]: v for v in doc["values"]}
        self.nodes = doc["nodes"]

    def ops(self) -> collections.Counter:
        return collections.Counter(n["op"] for n in self.nodes)

    def nodes_of(self, op: str) -> list[dict]:
        return [n for n in self.nodes if n["op"] == op]

    def shape(self, name: str) -> list[int]:
        return self.values[name]["shape"]

    def role(self, role: str) -> list[dict]:
        return [v for v in self.doc["values"] if v["role"] == role]

    def module_paths(self) -> set[str]:
        return {n["module"] for n in self.nodes}

    def parameter_count(self) -> int:
        return sum(math.prod(v["shape"]) for v in self.role("parameter"))


def check_common(g: Imported, model: nn.Module, inputs: tuple, input_names: list[str]) -> None:
    """What every imported model must satisfy."""
    # Only tensor ops are left: the plumbing (constants, lists, GetAttr, sizes) is folded.
    assert all(not op.startswith("prim::") for op in g.ops()), g.ops()
    assert all(op.startswith("aten::") for op in g.ops()), g.ops()
    # Every weight once, tied weights included once, named as named_parameters() names it.
    assert g.parameter_count() == sum(p.numel() for p in model.parameters())
    assert [v["name"] for v in g.role("parameter")] == [n for n, _ in model.named_parameters()]
    assert [v["name"] for v in g.role("buffer")] == [n for n, _ in model.named_buffers()]
    for v in g.role("parameter") + g.role("buffer"):
        assert v["shape"] == list(model.get_parameter(v["name"]).shape if v["role"] == "parameter"
                                  else model.get_buffer(v["name"]).shape)
    # Inputs: forward() argument names, batch dimension 0.
    assert g.doc["inputs"] == input_names
    for name, x in zip(input_names, inputs):
        assert g.values[name]["role"] == "input"
        assert g.shape(name) == list(x.shape)
        assert g.values[name]["batch_dim"] == 0
    # Every value name is unique and sanitised.
    names = [v["name"] for v in g.doc["values"]]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"[A-Za-z0-9_.]+", n) for n in names)
    # Each node's inputs exist before it (topological order).
    seen = {v["name"] for v in g.doc["values"] if v["role"] != "activation"}
    for n in g.nodes:
        assert all(i in seen for i in n["inputs"]), n
        seen.update(n["outputs"])


def check_outputs(g: Imported, model: nn.Module, inputs: tuple) -> None:
    with torch.no_grad():
        expected = _tensor_leaves(model(*inputs))
    assert [g.shape(o) for o in g.doc["outputs"]] == [list(t.shape) for t in expected]


def linear_like(g: Imported) -> list[tuple[str, list[list[int]], list[int], str]]:
    """(op, input shapes, output shape, module path) of every contraction node."""
    out = []
    for n in g.nodes:
        if n["op"] in ("aten::linear", "aten::addmm", "aten::matmul", "aten::mm", "aten::bmm"):
            out.append((n["op"], [g.shape(i) for i in n["inputs"]], g.shape(n["outputs"][0]), n["module"]))
    return out


# ---- models -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_ids():
    torch.manual_seed(0)
    return torch.randint(0, VOCAB, (BATCH, SEQ))


@pytest.fixture(scope="module")
def gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=32,
                                  use_cache=False, torchscript=True)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.fixture(scope="module")
def gpt2_graph(gpt2, token_ids):
    return Imported(import_torchscript_debug(gpt2, (token_ids,)))


@pytest.fixture(scope="module")
def bert():
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=32, torchscript=True)
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(cfg).eval()


@pytest.fixture(scope="module")
def llama():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   use_cache=False, torchscript=True)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(inplace=True),  # in place: the importer makes it functional
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = self.features(x)
        x = torch.flatten(x, 1)
        return self.head(x)


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    return SmallCNN().eval()


@pytest.fixture(scope="module")
def images():
    torch.manual_seed(0)
    return torch.randn(BATCH, 3, 8, 8)


# ---- GPT-2 -----------------------------------------------------------------------------------


def test_gpt2_structure(gpt2, gpt2_graph, token_ids):
    g = gpt2_graph
    check_common(g, gpt2, (token_ids,), ["input_ids"])
    check_outputs(g, gpt2, (token_ids,))
    # GPT-2's Conv1D is addmm over the flattened tokens; the LM head a linear on the
    # tied embedding (one value: transformer.wte.weight, no lm_head.weight).
    tokens = BATCH * SEQ
    expected = []
    for layer in range(2):
        p = f"transformer.h.{layer}"
        expected += [
            ("aten::addmm", [[192], [tokens, 64], [64, 192]], [tokens, 192], f"{p}.attn.c_attn"),
            ("aten::addmm", [[64], [tokens, 64], [64, 64]], [tokens, 64], f"{p}.attn.c_proj"),
            ("aten::addmm", [[256], [tokens, 64], [64, 256]], [tokens, 256], f"{p}.mlp.c_fc"),
            ("aten::addmm", [[64], [tokens, 256], [256, 64]], [tokens, 64], f"{p}.mlp.c_proj"),
        ]
    expected.append(("aten::linear", [[BATCH, SEQ, 64], [VOCAB, 64]], [BATCH, SEQ, VOCAB], "lm_head"))
    assert linear_like(g) == expected
    (head,) = g.nodes_of("aten::linear")
    assert head["inputs"][1] == "transformer.wte.weight"
    assert head["attrs"]["bias"] is None  # a missing optional tensor: no input, a None attribute
    assert "lm_head.weight" not in g.values
    assert g.parameter_count() == sum(p.numel() for p in gpt2.parameters())


def test_gpt2_module_paths(gpt2_graph):
    paths = gpt2_graph.module_paths()
    for p in ("transformer", "transformer.wte", "transformer.wpe", "transformer.h.0.ln_1", "transformer.h.0.attn",
              "transformer.h.0.attn.c_attn", "transformer.h.1.mlp.c_proj", "transformer.h.1.mlp.act",
              "transformer.ln_f", "lm_head"):
        assert p in paths, p
    # The attention core (split/view/transpose/sdpa) runs in the attention module itself.
    (sdpa0, sdpa1) = gpt2_graph.nodes_of("aten::scaled_dot_product_attention")
    assert (sdpa0["module"], sdpa1["module"]) == ("transformer.h.0.attn", "transformer.h.1.attn")


def test_gpt2_plumbing_is_folded(gpt2_graph):
    g = gpt2_graph
    # x.view(x.size(0), x.size(1), -1, head_dim): sizes folded into the attribute.
    views = [n for n in g.nodes_of("aten::view") if n["module"] == "transformer.h.0.attn"]
    assert [n["attrs"]["size"] for n in views] == [[BATCH, SEQ, -1, 16]] * 3
    # Tensor.split(64, dim=2) + ListUnpack: one node with three outputs.
    (split0, split1) = g.nodes_of("aten::split.Tensor")
    assert split0["attrs"] == {"split_size": 64, "dim": 2}
    assert [g.shape(o) for o in split0["outputs"]] == [[BATCH, SEQ, 64]] * 3
    # Python numbers the tracer wrapped into 0-dim tensors are attributes, as torch.export
    # records them (NewGELU: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))).
    act = [n for n in g.nodes if n["module"] == "transformer.h.0.mlp.act"]
    assert [n["op"] for n in act] == ["aten::mul.Tensor", "aten::pow.Tensor_Scalar", "aten::mul.Tensor",
                                      "aten::add.Tensor", "aten::mul.Tensor", "aten::tanh", "aten::add.Tensor",
                                      "aten::mul.Tensor"]
    assert act[0]["attrs"]["other"] == 0.5 and len(act[0]["inputs"]) == 1
    assert act[2]["attrs"]["other"] == pytest.approx(0.044715)
    assert act[4]["attrs"]["other"] == pytest.approx(math.sqrt(2 / math.pi))
    assert not g.role("constant")
    # dtype / layout / device arguments are spelled as the export importer spells them.
    (to,) = [n for n in g.nodes if n["op"] == "aten::to.dtype_layout" and n["module"] == "transformer"
             and g.shape(n["outputs"][0]) == [1, SEQ, 64]]
    assert (to["attrs"]["dtype"], to["attrs"]["layout"], to["attrs"]["device"]) == ("f32", "torch.strided", "cpu")
    # x[:, :, :] and .contiguous() return their input: dropped, as torch.export drops them.
    assert "aten::contiguous" not in g.ops()
    for n in g.nodes_of("aten::slice.Tensor"):
        assert g.shape(n["outputs"][0]) != g.shape(n["inputs"][0])


def test_gpt2_op_names(gpt2_graph):
    """The op spellings (for the comparison with the export importer)."""
    assert set(gpt2_graph.ops()) == {
        "aten::view", "aten::embedding", "aten::arange", "aten::add.Tensor", "aten::unsqueeze",
        "aten::to.dtype_layout", "aten::expand", "aten::slice.Tensor", "aten::sub.Tensor", "aten::diff",
        "aten::ne.Scalar", "aten::cumsum", "aten::index.Tensor", "aten::new_ones", "aten::eq.Tensor",
        "aten::__and__.Tensor", "aten::le.Tensor", "aten::dropout", "aten::layer_norm", "aten::addmm",
        "aten::split.Tensor", "aten::transpose.int", "aten::scaled_dot_product_attention", "aten::reshape",
        "aten::mul.Tensor", "aten::pow.Tensor_Scalar", "aten::tanh", "aten::linear",
    }


def test_gpt2_from_script_module_is_the_same(gpt2, gpt2_graph, token_ids):
    """An already traced module imports to the same graph (tied weights found through
    the ScriptModule's own parameters)."""
    traced = trace(gpt2, (token_ids,))
    again = Imported(import_torchscript_debug(traced, (token_ids,)))
    assert again.doc == gpt2_graph.doc


def test_gpt2_keyword_inputs_with_loss(gpt2, token_ids):
    """A dict of example inputs is traced as keyword arguments (the tracer then leaves
    the graph's input types incomplete; they are filled in from the examples)."""
    inputs = {"input_ids": token_ids, "labels": token_ids}
    g = Imported(import_torchscript_debug(gpt2, inputs))
    assert g.doc["inputs"] == ["input_ids", "labels"]
    assert g.shape("labels") == [BATCH, SEQ] and g.values["labels"]["dtype"] == "i64"
    (loss,) = g.nodes_of("aten::cross_entropy_loss")
    assert loss["attrs"] == {"weight": None, "reduction": 1, "ignore_index": -100, "label_smoothing": 0.0}
    assert g.shape(loss["outputs"][0]) == []
    # outputs: (loss, logits), as the model returns them
    assert [g.shape(o) for o in g.doc["outputs"]] == [[], [BATCH, SEQ, VOCAB]]
    assert g.doc["outputs"][0] == loss["outputs"][0]
    assert g.parameter_count() == sum(p.numel() for p in gpt2.parameters())


# ---- BERT ------------------------------------------------------------------------------------


def test_bert(bert, token_ids):
    g = Imported(import_torchscript_debug(bert, (token_ids,)))
    check_common(g, bert, (token_ids,), ["input_ids"])
    check_outputs(g, bert, (token_ids,))
    lin = linear_like(g)
    per_layer = [("query", 64), ("key", 64), ("value", 64)]
    expected = []
    for layer in range(2):
        p = f"bert.encoder.layer.{layer}"
        expected += [("aten::linear", [[BATCH, SEQ, 64], [64, 64], [64]], [BATCH, SEQ, d], f"{p}.attention.self.{name}")
                     for name, d in per_layer]
        expected += [
            ("aten::linear", [[BATCH, SEQ, 64], [64, 64], [64]], [BATCH, SEQ, 64], f"{p}.attention.output.dense"),
            ("aten::linear", [[BATCH, SEQ, 64], [128, 64], [128]], [BATCH, SEQ, 128], f"{p}.intermediate.dense"),
            ("aten::linear", [[BATCH, SEQ, 128], [64, 128], [64]], [BATCH, SEQ, 64], f"{p}.output.dense"),
        ]
    expected += [
        ("aten::linear", [[BATCH, SEQ, 64], [64, 64], [64]], [BATCH, SEQ, 64], "cls.predictions.transform.dense"),
        ("aten::linear", [[BATCH, SEQ, 64], [VOCAB, 64], [VOCAB]], [BATCH, SEQ, VOCAB], "cls.predictions.decoder"),
    ]
    assert lin == expected
    # The MLM decoder is tied to the word embeddings: one value.
    decoder = g.nodes_of("aten::linear")[-1]
    assert decoder["inputs"][1] == "bert.embeddings.word_embeddings.weight"
    assert {"bert.embeddings.word_embeddings", "bert.encoder.layer.1.attention.self",
            "bert.encoder.layer.0.output.LayerNorm", "cls.predictions.transform.LayerNorm"} <= g.module_paths()
    # The registered buffers (position_ids, token_type_ids) are Buffer leaves.
    assert [v["name"] for v in g.role("buffer")] == ["bert.embeddings.position_ids", "bert.embeddings.token_type_ids"]


# ---- LLaMA -----------------------------------------------------------------------------------


def test_llama(llama, token_ids):
    g = Imported(import_torchscript_debug(llama, (token_ids,)))
    check_common(g, llama, (token_ids,), ["input_ids"])
    check_outputs(g, llama, (token_ids,))
    expected = []
    for layer in range(2):
        p = f"model.layers.{layer}"
        expected += [
            ("aten::linear", [[BATCH, SEQ, 64], [64, 64]], [BATCH, SEQ, 64], f"{p}.self_attn.q_proj"),
            ("aten::linear", [[BATCH, SEQ, 64], [32, 64]], [BATCH, SEQ, 32], f"{p}.self_attn.k_proj"),
            ("aten::linear", [[BATCH, SEQ, 64], [32, 64]], [BATCH, SEQ, 32], f"{p}.self_attn.v_proj"),
            ("aten::linear", [[BATCH, SEQ, 64], [64, 64]], [BATCH, SEQ, 64], f"{p}.self_attn.o_proj"),
            ("aten::linear", [[BATCH, SEQ, 64], [128, 64]], [BATCH, SEQ, 128], f"{p}.mlp.gate_proj"),
            ("aten::linear", [[BATCH, SEQ, 64], [128, 64]], [BATCH, SEQ, 128], f"{p}.mlp.up_proj"),
            ("aten::linear", [[BATCH, SEQ, 128], [64, 128]], [BATCH, SEQ, 64], f"{p}.mlp.down_proj"),
        ]
    expected.append(("aten::linear", [[BATCH, SEQ, 64], [VOCAB, 64]], [BATCH, SEQ, VOCAB], "lm_head"))
    assert linear_like(g) == expected
    assert {"model.embed_tokens", "model.rotary_emb", "model.layers.0.input_layernorm", "model.layers.1.self_attn",
            "model.layers.1.mlp.act_fn", "model.norm", "lm_head"} <= g.module_paths()
    attn = [n for n in g.nodes if n["module"] == "model.layers.0.self_attn"]
    # rotate_half: x[..., : x.shape[-1] // 2] is traced as NumToTensor / floor_divide /
    # Int on 0-dim tensors; folded to the slice bound.
    halves = [n["attrs"] for n in attn if n["op"] == "aten::slice.Tensor" and n["attrs"]["dim"] == 3]
    assert {"dim": 3, "start": 0, "end": 8, "step": 1} in halves
    assert {"dim": 3, "start": 8, "end": 2**63 - 1, "step": 1} in halves
    # repeat_kv: reshape(batch, num_key_value_heads * n_rep, ...) with the product folded.
    reshapes = [n["attrs"]["shape"] for n in attn if n["op"] == "aten::reshape"]
    assert [BATCH, 4, SEQ, 16] in reshapes
    # x[batch_idx, q_idx] -> aten::index.Tensor with both index tensors as inputs.
    (index, *_) = g.nodes_of("aten::index.Tensor")
    assert len(index["inputs"]) == 3 and "indices_present" not in index["attrs"]
    # The rotary inv_freq buffers are Buffer leaves.
    assert {"model.rotary_emb.inv_freq"} <= {v["name"] for v in g.role("buffer")}


# ---- CNN -------------------------------------------------------------------------------------


def test_cnn(cnn, images):
    g = Imported(import_torchscript_debug(cnn, (images,)))
    check_common(g, cnn, (images,), ["x"])
    check_outputs(g, cnn, (images,))
    assert [(n["op"], n["module"]) for n in g.nodes] == [
        ("aten::conv2d", "features.0"),
        ("aten::batch_norm", "features.1"),
        ("aten::relu", "features.2"),  # ReLU(inplace=True): relu_ made functional
        ("aten::max_pool2d", "features.3"),
        ("aten::flatten.using_ints", ""),
        ("aten::linear", "head"),
    ]
    conv, bn, relu, pool, flat, head = g.nodes
    # aten::_convolution (what the tracer records) becomes conv2d with its schema attributes.
    assert conv["inputs"] == ["x", "features.0.weight", "features.0.bias"]
    assert conv["attrs"] == {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1}
    assert g.shape(conv["outputs"][0]) == [BATCH, 8, 8, 8]
    assert bn["inputs"][1:] == ["features.1.weight", "features.1.bias", "features.1.running_mean",
                                "features.1.running_var"]
    assert bn["attrs"]["training"] is False
    assert pool["attrs"]["kernel_size"] == [2, 2]
    assert flat["attrs"] == {"start_dim": 1, "end_dim": -1}
    assert linear_like(g) == [("aten::linear", [[BATCH, 128], [10, 128], [10]], [BATCH, 10], "head")]
    assert [v["name"] for v in g.role("buffer")] == ["features.1.running_mean", "features.1.running_var",
                                                      "features.1.num_batches_tracked"]


def test_cnn_options_keep_torchscript_spelling(cnn, images):
    g = Imported(import_torchscript_debug(cnn, (images,), canonicalize_convolution=False, remove_mutation=False))
    assert [n["op"] for n in g.nodes][:3] == ["aten::_convolution", "aten::batch_norm", "aten::relu_"]
    assert g.nodes[0]["attrs"]["transposed"] is False


# ---- folding and multi-output ops on a small model ------------------------------------------


class Heads(nn.Module):
    """chunk / unbind (multi-output), size arithmetic, nested tuple output."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 192)

    def forward(self, x, mask):
        q, k, v = self.proj(x).chunk(3, dim=-1)
        q = q.view(x.size(0), -1, 4, x.size(-1) // 4)
        a, b = torch.unbind(k.view(x.size(0), x.size(1), 2, 32), dim=2)
        s = q.sum() * (x.size(-1) ** -0.5)
        return q, (a, b), s + mask.float().mean(), v.masked_fill(mask.unsqueeze(-1), 0.0)


def test_multi_output_ops_and_size_folding():
    x, mask = torch.randn(BATCH, SEQ, 64), torch.zeros(BATCH, SEQ, dtype=torch.bool)
    model = Heads().eval()
    g = Imported(import_torchscript_debug(model, (x, mask)))
    check_common(g, model, (x, mask), ["x", "mask"])
    check_outputs(g, model, (x, mask))  # the nested tuple is flattened: q, a, b, s, masked
    (chunk,) = g.nodes_of("aten::chunk")
    assert chunk["attrs"] == {"chunks": 3, "dim": -1} and len(chunk["outputs"]) == 3
    (unbind,) = g.nodes_of("aten::unbind.int")
    assert [g.shape(o) for o in unbind["outputs"]] == [[BATCH, SEQ, 32]] * 2
    assert unbind["outputs"] == g.doc["outputs"][1:3]
    assert g.nodes_of("aten::view")[0]["attrs"]["size"] == [BATCH, -1, 4, 16]
    # x.size(-1) ** -0.5 is folded to a number (pow of a known 0-dim tensor).
    scale = [n for n in g.nodes_of("aten::mul.Tensor") if len(n["inputs"]) == 1]
    assert [n["attrs"]["other"] for n in scale] == [0.125]
    # A known number passed as a Tensor operand can be kept as a Constant leaf instead.
    g2 = Imported(import_torchscript_debug(model, (x, mask), scalar_constants_as_attributes=False))
    (const,) = g2.role("constant")
    assert const["shape"] == [] and const["dtype"] == "f32"  # the traced 0-dim result of pow
    assert g2.ops() == g.ops()


def test_optional_tensor_list_records_positions():
    class Pick(nn.Module):
        def forward(self, x, idx):
            return x[:, idx] * 2

    x, idx = torch.randn(BATCH, 5, 3), torch.tensor([0, 4, 1])
    g = Imported(import_torchscript_debug(Pick(), (x, idx)))
    (index,) = g.nodes_of("aten::index.Tensor")
    # indices=[None, idx]: the tensors are inputs, the positions an attribute (as the
    # export importer records them).
    assert index["inputs"] == ["x", "idx"]
    assert index["attrs"] == {"indices_present": [0, 1]}
    assert g.shape(index["outputs"][0]) == [BATCH, 3, 3]
    assert "aten::slice.Tensor" not in g.ops()  # the leading `:` is a full-range slice: dropped


class _TanhGelu(torch.autograd.Function):
    """Bloom's GeLUFunction, trimmed: a forward of ATen ops and a hand-written backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
        return grad * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.79788456 * (1 + 3 * 0.044715 * x * x))


def test_autograd_function_forward_is_inlined():
    """The tracer records a torch.autograd.Function as prim::PythonOp with its traced forward
    as a Subgraph: the importer takes the forward's ATen ops, in the function's module, as
    torch.export does (Bloom's MLP)."""

    class Act(nn.Module):
        def forward(self, x):
            return _TanhGelu.apply(x)

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act = nn.Linear(8, 8), Act()

        def forward(self, x):
            return self.act(self.fc(x)) + 1

    x = torch.randn(BATCH, 8)
    g = Imported(import_torchscript_debug(Mlp(), (x,)))
    assert "aten::tanh" in g.ops() and not any(op.startswith("prim::") for op in g.ops())
    assert {n["module"] for n in g.nodes if n["op"] == "aten::tanh"} == {"act"}
    assert g.shape(g.doc["outputs"][0]) == [BATCH, 8]


def test_traced_function_without_module():
    fn = torch.jit.trace(lambda a, b: torch.relu(a @ b), (torch.randn(3, 4), torch.randn(4, 5)))
    g = Imported(import_graph_debug(fn.graph))
    assert [n["op"] for n in g.nodes] == ["aten::matmul", "aten::relu"]
    assert g.doc["inputs"] == ["a", "b"] and g.shape(g.doc["outputs"][0]) == [3, 5]


# ---- errors -----------------------------------------------------------------------------------


def test_data_dependent_if_is_an_error_naming_node_and_line():
    class Gate(nn.Module):
        def forward(self, x):
            if bool(x.sum() > 0):  # the line the error must name
                return x * 2
            return x

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = Gate()

        def forward(self, x):
            return self.gate(x)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block(), Block()])

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x + 1

    scripted = torch.jit.script(Outer())
    with pytest.raises(shardwise.ShardwiseError) as info:
        import_torchscript_debug(scripted, (torch.randn(2, 3),))
    msg = str(info.value)
    assert msg.startswith("prim::If in module 'blocks.0.gate' at ")
    assert f"test_torchscript_import.py:{Gate.forward.__code__.co_firstlineno + 1}" in msg
    assert "data-dependent control flow" in msg and "torch.jit.trace" in msg
    assert "no static shape" in msg  # the second problem of scripted graphs, as a note


def test_a_list_attribute_with_a_run_time_value_says_where_it_comes_from():
    """Swin pads by torch.min(torch.tensor(sizes)) when tracing: a value the importer does not
    fold. The error names the list's unknown elements by their cause, not "unknown value"."""

    class Pad(nn.Module):
        def forward(self, x):
            width = (x.size(-1) + 1) // 2  # traced size arithmetic
            window = torch.min(torch.tensor([4, 6]))  # a reduction the importer does not fold
            return nn.functional.pad(x, (0, (window - width % window) % window))

    with pytest.raises(shardwise.ShardwiseError, match=r"'pad'.*<the value of tensor .* computed at run time"):
        shardwise.capture(Pad(), (torch.randn(2, 3),), method="torchscript")


def test_loop_is_an_error():
    def repeat(x, n: int):
        for _ in range(n):
            x = x + 1
        return x

    with pytest.raises(shardwise.ShardwiseError, match=r"^prim::Loop in module '' at .*test_torchscript_import\.py"):
        import_graph_debug(torch.jit.script(repeat).graph)


def test_runtime_bool_condition_is_an_error():
    def choose(x, flag: bool):
        if flag:
            return x * 2
        return x

    with pytest.raises(shardwise.ShardwiseError, match="graph input 'flag' of type bool"):
        import_graph_debug(torch.jit.script(choose).graph)


def test_scripted_module_without_shapes_says_trace(cnn, images):
    # BatchNorm's `if self.training` folds (the module flag is passed in); its
    # `if input.dim() != 4: raise` needs the shape the scripted graph does not have.
    with pytest.raises(shardwise.ShardwiseError) as info:
        import_torchscript_debug(torch.jit.script(cnn), (images,))
    msg = str(info.value)
    assert msg.startswith("prim::If in module 'features.1' at ") and "batchnorm.py:" in msg
    assert "depends on the shape of" in msg and "torch.jit.trace" in msg
    assert "data-dependent" not in msg


def test_scripted_graph_without_shapes_says_trace():
    def double(x):
        return x * 2

    with pytest.raises(shardwise.ShardwiseError, match=r"^graph input 'x' has no static shape.*torch\.jit\.trace"):
        import_graph_debug(torch.jit.script(double).graph)


def test_tensor_attribute_missing_from_table(cnn, images):
    traced = trace(cnn, (images,))
    with pytest.raises(shardwise.ShardwiseError, match=r"module attribute 'features\.0\.(weight|bias)' is a tensor that is neither"):
        import_graph_debug(traced.graph)


def test_bad_table_rows_are_errors(cnn, images):
    traced = trace(cnn, (images,))
    with pytest.raises(shardwise.ShardwiseError, match="role must be"):
        _C._torchscript_import_debug(traced.graph, [("features.0.weight", "features.0.weight", "weight",
                                                     cnn.features[0].weight)])


# ---- the public entry point -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bert", "llama", "cnn"])
def test_core_graph_verifies(name, request, token_ids, images):
    model = request.getfixturevalue(name)
    g = import_torchscript(model, (images if name == "cnn" else token_ids,))
    g.verify()  # the core's own invariants (csrc/ir)
    assert g.num_nodes() > 0


def test_import_torchscript_returns_core_graph(gpt2, gpt2_graph, token_ids):
    g = import_torchscript(gpt2, (token_ids,))
    assert isinstance(g, _C.Graph)
    g.verify()
    assert g.num_nodes() == len(gpt2_graph.nodes)
    assert g.input_names() == ["input_ids"]
    assert "aten::addmm" in str(g)


@pytest.mark.filterwarnings("default::DeprecationWarning")
def test_trace_keeps_deprecation_warning():
    """TorchScript is deprecated; shardwise does not hide torch's warning."""
    model = nn.Linear(4, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import_torchscript_debug(model, (torch.randn(2, 4),))
    assert any(issubclass(w.category, DeprecationWarning) and "torch.jit.trace" in str(w.message) for w in caught)
