"""shardwise.models.gpt against a capture of the transformers GPT2LMHeadModel it mirrors:
parameters, heavy ops, every node, FLOPs, repeated blocks; and the Megatron-LM scale it exists for, without torch allocating anything."""
from __future__ import annotations


import pytest
import torch

import shardwise

transformers = pytest.importorskip("transformers")

HEAVY = {"aten::addmm", "aten::linear", "aten::scaled_dot_product_attention", "aten::embedding",
         "aten::layer_norm"}
TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}

# (layers, hidden, heads, seq, vocab, batch, dtype, ffn_hidden, tie, with_loss, positions)
CONFIGS = {
    "f32-batch1": dict(layers=2, hidden=64, heads=4, seq=16, vocab=128, batch=1, dtype="f32",
                       positions=32),
    "bf16-batch2": dict(layers=3, hidden=64, heads=4, seq=16, vocab=128, batch=2, dtype="bf16"),
    "f16-untied-ffn-noloss": dict(layers=2, hidden=48, heads=6, seq=8, vocab=96, batch=3, dtype="f16",
                                  ffn_hidden=80, tie_embeddings=False, with_loss=False, positions=24),
}

_captures: dict[str, shardwise.Graph] = {}


def captured(name: str) -> shardwise.Graph:
    """The capture of the GPT2LMHeadModel a config describes, on the meta device (cached)."""
    if name not in _captures:
        c = CONFIGS[name]
        cfg = transformers.GPT2Config(
            n_layer=c["layers"], n_embd=c["hidden"], n_head=c["heads"], vocab_size=c["vocab"],
            n_positions=c.get("positions") or c["seq"], n_inner=c.get("ffn_hidden"),
            tie_word_embeddings=c.get("tie_embeddings", True), use_cache=False,
            attn_implementation="sdpa")
        with torch.device("meta"):
            model = transformers.GPT2LMHeadModel(cfg).to(TORCH_DTYPES[c["dtype"]]).eval()
        shape = (c["batch"], c["seq"])
        inputs = {"input_ids": torch.randint(0, c["vocab"], shape, device="meta")}
        if c.get("with_loss", True):
            # A tensor of its own: passing input_ids twice lets export alias the two inputs.
            inputs["labels"] = torch.randint(0, c["vocab"], shape, device="meta")
        _captures[name] = shardwise.capture(model, inputs)
    return _captures[name]


def built(name: str) -> shardwise.Graph:
    return shardwise.models.gpt(**CONFIGS[name])


def _types(graph: shardwise.Graph) -> dict[str, tuple]:
    return {v["name"]: (v["dtype"], tuple(v["shape"]), v["batch_dim"]) for v in graph.values()}


def _parameters(graph: shardwise.Graph) -> list[tuple[str, str, tuple]]:
    return [(v["name"], v["dtype"], tuple(v["shape"])) for v in graph.values() if v["role"] == "parameter"]


def _heavy_ops(graph: shardwise.Graph) -> list[tuple]:
    types = _types(graph)
    return [(n["op"], n["module"], tuple(types[o][1] for o in n["outputs"]))
            for n in graph.nodes() if n["op"] in HEAVY]


def _is_mask_plumbing(node: dict, types: dict) -> bool:
    # Integer and boolean tensors computed in GPT2Model itself: position ids and the mask.
    return node["module"] == "transformer" and all(types[o][0] in ("i64", "bool") for o in node["outputs"])


def _structure(graph: shardwise.Graph) -> tuple[list, list]:
    """Every node but the mask plumbing as (op, module, attrs, output types, operands), with
    operands named structurally: leaves by name, activations by (node index, output index),
    plumbing values by their type. Activation names are left out: fx's counters drift where
    the plumbing differs."""
    types = _types(graph)
    kept, where = [], {}
    for node in graph.nodes():
        if _is_mask_plumbing(node, types):
            continue
        for k, out in enumerate(node["outputs"]):
            where[out] = (len(kept), k)
        kept.append(node)
    leaves = {v["name"] for v in graph.values() if v["role"] != "activation"}

    def operand(name):
        if name in where:
            return ("node",) + where[name]
        if name in leaves:
            return ("leaf", name)
        return ("plumbing",) + types[name]

    nodes = [(n["op"], n["module"], sorted(n["attrs"].items()), [types[o] for o in n["outputs"]],
              [operand(i) for i in n["inputs"]]) for n in kept]
    return nodes, [operand(o) for o in graph.output_names()]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameters_match_the_capture(name):
    ours, theirs = built(name), captured(name)
    assert _parameters(ours) == _parameters(theirs)
    assert ours.num_parameters() == theirs.num_parameters()
    assert ours.parameter_bytes() == theirs.parameter_bytes()
    assert ours.input_names() == theirs.input_names()
    assert [_types(ours)[i] for i in ours.input_names()] == [_types(theirs)[i] for i in theirs.input_names()]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_heavy_ops_match_the_capture_in_order(name):
    ours, theirs = _heavy_ops(built(name)), _heavy_ops(captured(name))
    assert ours == theirs
    layers = CONFIGS[name]["layers"]
    assert len(ours) == 2 + 7 * layers + 2  # wte, wpe; 2 norms, 4 addmm, sdpa per layer; ln_f, lm_head


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_node_matches_the_capture(name):
    ours, theirs = _structure(built(name)), _structure(captured(name))
    assert len(ours[0]) == len(theirs[0])
    for i, (a, b) in enumerate(zip(ours[0], theirs[0])):
        assert a == b, f"node {i} differs"
    assert ours[1] == theirs[1]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_flops_and_repeated_blocks_match_the_capture(name):
    ours, theirs = built(name), captured(name)
    assert ours.matmul_flops() == theirs.matmul_flops()
    assert ours.repeated_blocks() == theirs.repeated_blocks()
    assert ours.unknown_ops() == theirs.unknown_ops() == []
    # The capture's mask is folded into is_causal (python/shardwise/_causal_masks.py): no
    # mask plumbing is left on either side.
    assert ours.forward_flops() == theirs.forward_flops()


def test_gpt3_175b_builds():
    graph = shardwise.models.gpt(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)
    # 12 l h^2 + 13 l h + (V + P) h + 2 h, tied embeddings, 2048 positions.
    l, h, v, p = 96, 12288, 51200, 2048
    assert graph.num_parameters() == 12 * l * h * h + 13 * l * h + (v + p) * h + 2 * h == 174_615_846_912
    assert graph.parameter_bytes() == 2 * 174_615_846_912  # bf16
    b, s = 1, 2048
    assert graph.matmul_flops() == l * (24 * b * s * h * h + 4 * b * s * s * h) + 2 * b * s * h * v
    (layers,) = graph.repeated_blocks()
    assert layers.parent == "transformer.h" and len(layers) == 96 and layers.nodes_per_block == 37


def test_megatron_1t_builds_too():
    graph = shardwise.models.gpt(layers=128, hidden=25600, heads=160, seq=2048, vocab=51200, batch=8)
    assert graph.num_parameters() == 1_008_038_758_400
    assert graph.unknown_ops() == []


def test_dtype_spellings_and_defaults():
    assert shardwise.models.gpt(layers=1, hidden=8, heads=2, seq=4, vocab=16).values()[0]["dtype"] == "bf16"
    for spelling, dtype in [("float16", "f16"), ("fp32", "f32"), ("BF16", "bf16")]:
        g = shardwise.models.gpt(layers=1, hidden=8, heads=2, seq=4, vocab=16, dtype=spelling)
        assert g.values()[0]["dtype"] == dtype


@pytest.mark.parametrize("kwargs,message", [
    (dict(layers=0), "GptConfig.layers must be positive"),
    (dict(heads=3), "GptConfig.hidden (8) must be a multiple of GptConfig.heads (3)"),
    (dict(positions=2), "GptConfig.positions (2) must be at least GptConfig.seq (4)"),
    (dict(batch=-1), "GptConfig.batch must be positive"),
    (dict(dtype="int8"), "dtype must be one of"),
])
def test_bad_configurations_name_the_field(kwargs, message):
    args = dict(layers=1, hidden=8, heads=2, seq=4, vocab=16) | kwargs
    with pytest.raises(shardwise.ValidationError) as info:
        shardwise.models.gpt(**args)
    assert message in str(info.value)


def test_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        shardwise.models.gpt(1, 8, 2, 4, 16)  # type: ignore[misc]
