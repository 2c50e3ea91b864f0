"""shardwise.plan: the SPMD sharding search on transformers models nobody here wrote,
captured on the meta device at shapes where data parallelism cannot fit."""
from __future__ import annotations

import json

import pytest
import torch

import shardwise

transformers = pytest.importorskip("transformers")


def _small_memory_a100(gib: float) -> shardwise.Cluster:
    """One DGX A100 node (8 GPUs, NVSwitch) whose devices hold only `gib` GiB."""
    doc = json.loads(shardwise.Cluster.preset("dgx-a100").to_json())
    for device in doc["device_types"]:
        device["memory_bytes"] = int(gib * 2**30)
    return shardwise.Cluster.from_json(json.dumps(doc))


def _capture_meta(model_fn, vocab: int):
    with torch.device("meta"):
        model = model_fn()
    ids = torch.randint(0, vocab, (2, 512), device="meta")
    return shardwise.capture(model, {"input_ids": ids, "labels": ids})


@pytest.fixture(scope="module")
def gpt2_graph():
    return _capture_meta(lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=2048, n_head=16, n_positions=512, use_cache=False)), 50257)


@pytest.fixture(scope="module")
def llama_graph():
    return _capture_meta(lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=2048, num_attention_heads=16, num_key_value_heads=8,
        intermediate_size=5504, vocab_size=32000, max_position_embeddings=512, use_cache=False)), 32000)


def test_gpt2_tensor_parallel_with_strided_fused_qkv(gpt2_graph):
    # 0.2B parameters x 16 bytes = 3.3 GB: no room on 2 GiB devices unless the weights are split.
    plan = shardwise.plan(gpt2_graph, _small_memory_a100(2), global_batch=4, mesh=(1, 8))
    assert plan.fits
    placements = plan.placements()
    for layer in range(2):
        block = f"transformer.h.{layer}."
        # c_attn is GPT-2's fused [h, 3h] QKV: each rank holds q, k and v of the same heads.
        assert placements[block + "attn.c_attn.weight"][1] == "S(1,g3)"
        assert placements[block + "mlp.c_fc.weight"][1] == "S(1)"      # column-parallel (Conv1D: [in, out])
        assert placements[block + "mlp.c_proj.weight"][1] == "S(0)"    # row-parallel
    assert "transformer.h.*.attn.c_attn.weight" in plan.report()


def test_llama_megatron_projections(llama_graph):
    plan = shardwise.plan(llama_graph, _small_memory_a100(2), global_batch=4, mesh=(1, 8))
    assert plan.fits
    placements = plan.placements()
    for layer in range(2):
        block = f"model.layers.{layer}."
        # nn.Linear weights are [out, in]: column-parallel = S(0), row-parallel = S(1).
        assert placements[block + "self_attn.q_proj.weight"][1] == "S(0)"
        assert placements[block + "self_attn.o_proj.weight"][1] == "S(1)"
        assert placements[block + "mlp.gate_proj.weight"][1] == "S(0)"
        assert placements[block + "mlp.up_proj.weight"][1] == "S(0)"
        assert placements[block + "mlp.down_proj.weight"][1] == "S(1)"
    # The vocabulary-parallel LM head.
    assert placements["lm_head.weight"][1] == "S(0)"


def test_plan_is_deterministic_survives_json_and_thorough_is_never_worse(llama_graph):
    cluster = _small_memory_a100(4)
    fast = shardwise.plan(llama_graph, cluster, global_batch=8)
    again = shardwise.plan(llama_graph, cluster, global_batch=8)
    assert fast.to_json() == again.to_json() and fast.hash() == again.hash()
    assert shardwise.Plan.from_json(fast.to_json()) == fast
    thorough = shardwise.plan(llama_graph, cluster, global_batch=8, level="thorough")
    assert thorough.sharding["level"] == "thorough"
    assert thorough.predicted_step_time() <= fast.predicted_step_time() * (1 + 1e-12)
    assert {c["mesh"][1] for c in fast.candidates()} == {1, 2, 4, 8}
    print(f"llama search: fast {fast.search_seconds():.2f} s, thorough {thorough.search_seconds():.2f} s; "
          f"step {fast.predicted_step_time() * 1e3:.2f} / {thorough.predicted_step_time() * 1e3:.2f} ms")


def test_clear_errors():
    model = torch.nn.Linear(8, 8)
    graph = shardwise.capture(model, (torch.randn(1, 8),))
    cluster = shardwise.Cluster.preset("dgx-a100")
    with pytest.raises(shardwise.ValidationError, match="batch of at least 2"):
        shardwise.plan(graph, cluster, global_batch=16)
    graph = shardwise.capture(model, (torch.randn(2, 8),))
    with pytest.raises(shardwise.ValidationError, match="search level"):
        shardwise.plan(graph, cluster, global_batch=16, level="slow")
    with pytest.raises(shardwise.ValidationError, match="mesh"):
        shardwise.plan(graph, cluster, global_batch=16, mesh=(3, 2))
