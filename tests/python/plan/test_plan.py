
import json

import pytest

import shardwise


def test_manual_plan_on_tiny_gpt_round_trips():
    g = shardwise.models.gpt(layers=4, hidden=64, heads=4, seq=16, vocab=128)
    c = shardwise.Cluster.preset("dgx-a100", nodes=1)
    p = shardwise.Plan.manual(g, c, tensor=2, pipeline=2, data=2, global_batch=8, micro_batch=1)
    assert p.predicted_step_time() > 0
    assert p.predicted_tflops_per_device() > 0
    mem, parts = p.predicted_memory()
    assert mem > 0 and {"weights", "gradients", "optimizer", "activations"} <= set(parts)
    assert p.breakdown()["pipeline_bubble"] > 0
    back = shardwise.Plan.from_json(p.to_json())
    assert back == p and back.hash() == p.hash() and len(p.hash()) == 16
    with pytest.raises(shardwise.ValidationError, match="not divisible"):
        shardwise.Plan.manual(g, c, tensor=2, pipeline=2, data=2, global_batch=7)


def test_costing_175b_on_interleaved_1f1b():
    # benchmarks/planner_scaling.py times this; here the costed plan itself.
    g = shardwise.models.gpt(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)
    c = shardwise.Cluster.preset("dgx-a100", nodes=192)
    p = shardwise.Plan.manual(g, c, tensor=8, pipeline=8, data=24, global_batch=1536, micro_batch=1,
                              schedule="interleaved-1f1b", virtual_stages=2, recompute=True)
    print(f"175B plan: {p.predicted_tflops_per_device():.1f} TFLOP/s")
    assert 100 < p.predicted_tflops_per_device() < 200  # Megatron-LM's measured 175B run: 140
    assert p.predicted_memory()[0] < 80e9


def test_llama_gated_mlp_and_separate_qkv_are_tensor_parallel_groups():
    """A transformers LLaMA (separate q/k/v projections with grouped-query attention, SwiGLU
    gate/up/down): the cost model finds two tensor-parallel groups per layer, as in GPT-2,
    and every projection's weight is stored 1/t per rank."""
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=8,
                                   num_key_value_heads=4, intermediate_size=768, vocab_size=512,
                                   max_position_embeddings=64, use_cache=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.zeros(8, 32, dtype=torch.long, device="meta")
    g = shardwise.capture(model, {"input_ids": ids, "labels": ids})
    c = shardwise.Cluster.preset("dgx-a100", nodes=1)

    def plan(t):
        return shardwise.Plan.manual(g, c, tensor=t, global_batch=8, micro_batch=1, recompute=False, precision="f32")

    whole, four = plan(1), plan(4)
    assert four._result["tensor_parallel_pairs_per_layer"] == 2
    # Per rank at t = 4: the layers' projections and the (vocabulary-parallel) embedding and
    # LM head are a quarter; the norms' weights (256 each) stay whole.
    params = dict(model.named_parameters())
    norms = sum(p.numel() for n, p in params.items() if "norm" in n)
    matrices = sum(p.numel() for n, p in params.items() if "norm" not in n)
    bytes_whole, bytes_four = whole.predicted_memory()[1]["weights"], four.predicted_memory()[1]["weights"]
    per_param = bytes_whole / (norms + matrices)  # the weights' bytes (bf16 copies under mixed precision)
    assert per_param == pytest.approx(round(per_param))
    assert bytes_four == pytest.approx(per_param * (norms + matrices / 4))


def test_a_plan_is_priced_in_the_models_precision_unless_told():
    # The model's dtype as captured: float32 -> f32, bf16 -> bf16, float64 -> f32 (no f64 rate);
    # an explicit precision wins. On the CPU preset f32 runs 50 GFLOP/s and bf16 15, so the
    # f32 plan of the same graph is predicted faster.
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    x = torch.randn(16, 64)
    cluster = shardwise.Cluster.preset("cpu", 2)
    f32 = shardwise.plan(shardwise.capture(model, (x,)), cluster, global_batch=16)
    assert f32.precision == "f32"
    told = shardwise.plan(shardwise.capture(model, (x,)), cluster, global_batch=16, precision="bf16")
    assert told.precision == "bf16" and told.predicted_step_time() > f32.predicted_step_time()
    bf16 = shardwise.plan(shardwise.capture(model.to(torch.bfloat16), (x.to(torch.bfloat16),)), cluster,
                          global_batch=16)
    assert bf16.precision == "bf16"
    f64 = shardwise.plan(shardwise.capture(model.double(), (x.double(),)), cluster, global_batch=16)
    assert f64.precision == "f32"
    g = shardwise.models.gpt(layers=2, hidden=64, heads=4, seq=16, vocab=128, dtype="f32")
    assert shardwise.Plan.manual(g, cluster, data=2, global_batch=8).precision == "f32"
    assert shardwise.Plan.manual(shardwise.models.gpt(layers=2, hidden=64, heads=4, seq=16, vocab=128), cluster,
                                 data=2, global_batch=8).precision == "bf16"


def test_tflops_are_model_flops_for_every_planner_and_megatrons_accounting_is_beside_it():
    # GPT-3 175B on 128 DGX-A100 nodes, Megatron's configuration with full recomputation:
    # model FLOPs leave the recomputed forward out (3/4 of the layers' share), Megatron-LM's
    # accounting counts it (its paper: 140 for this run).
    g = shardwise.models.gpt(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)
    c = shardwise.Cluster.preset("dgx-a100", nodes=128)
    p = shardwise.Plan.manual(g, c, tensor=8, pipeline=16, data=8, global_batch=1536, micro_batch=1,
                              schedule="interleaved-1f1b", virtual_stages=2, recompute=True)
    model, megatron = p.predicted_tflops_per_device(), p.predicted_megatron_tflops_per_device()
    assert 0.74 < model / megatron < 0.76 and 100 < megatron < 200
    assert shardwise.Plan.from_json(p.to_json()).predicted_megatron_tflops_per_device() == megatron
    # The SPMD search prices model FLOPs only: the same definition, and no Megatron figure.
    small = shardwise.models.gpt(layers=2, hidden=256, heads=4, seq=128, vocab=1024, batch=4)
    searched = shardwise.plan(small, shardwise.Cluster.preset("dgx-a100"), global_batch=64, mesh=(8, 1))
    assert searched.predicted_tflops_per_device() > 0
    with pytest.raises(shardwise.ValidationError, match="no Megatron-LM accounting"):
        searched.predicted_megatron_tflops_per_device()


def test_a_degrees_plan_completed_on_its_mesh_says_whether_it_fits():
    # Pipeline 1 and one micro-batch: completion is the SPMD search on the plan's mesh, and
    # keeps its verdict, so parallelize can refuse a plan that fits nowhere (as for a search).
    import json

    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    graph = shardwise.capture(model, (torch.randn(16, 64),))
    degrees = shardwise.Plan.from_json(json.dumps({"data": 2, "tensor": 1, "pipeline": 1, "global_batch": 16,
                                                   "micro_batch": 8, "schedule": "1f1b", "precision": "f32"}))
    assert degrees.fits is None and not degrees.is_complete()
    done = degrees.complete(graph, shardwise.Cluster.preset("cpu", 2))
    assert done.is_complete() and done.sharding["mesh"] == [2, 1] and done.fits is True
    doc = json.loads(shardwise.Cluster.preset("cpu", 2).to_json())
    doc["device_types"][0]["memory_bytes"] = 1000
    assert degrees.complete(graph, shardwise.Cluster.from_json(json.dumps(doc))).fits is False


def test_stage_meshes_give_each_stage_its_own_ranks_and_layout():
    # plan.stage_meshes: a stage of one rank and a stage of a data pair, 3 ranks in all.
    import torch
    model = shardwise.models.TinyGPT(shardwise.models.TinyGPTConfig(layers=4)).double()
    ids = torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(1))
    graph = shardwise.capture(model, (ids, ids))
    cluster = shardwise.Cluster.preset("cpu", 3)
    plan = shardwise.Plan.manual(graph, cluster, stage_meshes=[[1, 1], [2, 1]], global_batch=8, micro_batch=4,
                                 recompute=False)
    assert plan.pipeline == 2 and plan.data == 1 and plan.num_micro_batches() == 2
    assert [plan.stage_ranks(s) for s in range(2)] == [[0], [1, 2]]
    assert "stage_meshes=[[1, 1], [2, 1]]" in repr(plan)
    assert plan.predicted_step_time() > 0 and not plan.is_complete()
    # Completed on a graph captured at one micro-batch: each stage's layout on its own mesh.
    micro = shardwise.capture(model, (ids[:4], ids[:4]))
    done = plan.complete(micro, cluster)
    assert done.is_complete() and [s["mesh"] for s in done.stage_shardings] == [[1, 1], [2, 1]]
    assert done.stage_plan(1).sharding["mesh"] == [2, 1]
    assert shardwise.Plan.from_json(done.to_json()) == done
    with pytest.raises(shardwise.ValidationError, match="data 3 does not divide the micro-batch's 4 rows"):
        shardwise.Plan.manual(graph, shardwise.Cluster.preset("cpu", 4), stage_meshes=[[1, 1], [3, 1]],
                              global_batch=8, micro_batch=4)
    with pytest.raises(shardwise.ValidationError, match="world size 4 != the stage meshes' 3 ranks"):
        shardwise.Plan.manual(graph, shardwise.Cluster.preset("cpu", 4), stage_meshes=[[1, 1], [2, 1]],
                              global_batch=8, micro_batch=4)


def test_stage_links_serve_every_receiving_rank_once():
    # Between stages of different layouts each receiving rank gets the whole value from one
    # sending rank, and each sending rank sends to exactly the receivers that name it.
    from shardwise.runtime.stage_links import StageLinks
    for blocks in ([[0], [1, 2]], [[0, 1], [2]], [[0, 1], [2, 3, 4]], [[0, 1, 2], [3, 4]], [[0, 1, 2, 3], [4, 5]]):
        layouts = [(len(b),) for b in blocks]
        for me, other in ((0, 1), (1, 0)):
            sent = sorted(r for local in range(len(blocks[me]))
                          for r in StageLinks(blocks, layouts, me, local).destinations(other))
            assert sent == blocks[other], (blocks, me)
            for local in range(len(blocks[other])):
                source = StageLinks(blocks, layouts, other, local).source(me)
                mine = blocks[me].index(source)
                assert blocks[other][local] in StageLinks(blocks, layouts, me, mine).destinations(other)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_every_planner_records_the_price_the_one_evaluator_gives_its_plan(family):
    """Issue 46, item 5: Plan.manual, Plan.complete (sharded, and pipelined with the layout its
    stages run), the SPMD search (any mesh and recomputation) and the joint planner (stages
    priced by their degrees) record for a plan the figures Plan.price gives it again from its
    JSON (csrc/search/plan_price.h)."""
    transformers = pytest.importorskip("transformers")
    import torch

    if family == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=256, n_head=8, vocab_size=512, n_positions=64,
                                      use_cache=False)
        model_class = transformers.GPT2LMHeadModel
    else:
        cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=8,
                                       num_key_value_heads=4, intermediate_size=768, vocab_size=512,
                                       max_position_embeddings=64, use_cache=False)
        model_class = transformers.LlamaForCausalLM
    with torch.device("meta"):
        model = model_class(cfg).eval()
    ids = torch.zeros(8, 32, dtype=torch.long, device="meta")
    g = shardwise.capture(model, {"input_ids": ids, "labels": ids})
    c = shardwise.Cluster.preset("dgx-a100", nodes=1)
    plans = {
        "manual 2x2x2": shardwise.Plan.manual(g, c, tensor=2, pipeline=2, data=2, global_batch=8,
                                              recompute="selective"),
        "completed 2x4": shardwise.Plan.manual(g, c, tensor=4, data=2, global_batch=8, micro_batch=4,
                                               recompute=False).complete(g, c),
        "completed pipeline 2x2x2": shardwise.Plan.manual(g, c, tensor=2, pipeline=2, data=2, global_batch=16,
                                                          micro_batch=4, recompute="selective").complete(g, c),
        "search 2x4 selective": shardwise.Plan.search(g, c, global_batch=8, mesh=(2, 4), recompute="selective"),
        "search 1x8 full": shardwise.Plan.search(g, c, global_batch=8, mesh=(1, 8), recompute="full"),
        "search 4x2 collective matmul": shardwise.Plan.search(g, c, global_batch=8, mesh=(4, 2),
                                                              collective_matmul=True),
        "search": shardwise.Plan.search(g, c, global_batch=8),
        "joint": shardwise.Plan.joint(g, c, global_batch=8, stage_layouts=False),
        "manual 2x2x2 compiled": shardwise.Plan.manual(g, c, tensor=2, pipeline=2, data=2, global_batch=8,
                                                       recompute="selective", compile=True),
        "completed pipeline 2x2x2 compiled": shardwise.Plan.manual(
            g, c, tensor=2, pipeline=2, data=2, global_batch=16, micro_batch=4, compile=True).complete(g, c),
        "search 2x4 compiled": shardwise.Plan.search(g, c, global_batch=8, mesh=(2, 4), compile=True),
    }
    assert all(plan.compile == name.endswith("compiled") for name, plan in plans.items())
    assert plans["completed 2x4"].sharding is not None
    assert plans["completed pipeline 2x2x2"].stage_sharding is not None
    tensor_split = sum(s[1] != "replicate" for p in plans.values() if p.sharding for s in p.strategies().values())
    assert tensor_split > 0
    for name, plan in plans.items():
        again = shardwise.Plan.from_json(plan.to_json()).price(g, c)
        assert again.predicted_step_time() == pytest.approx(plan.predicted_step_time(), rel=1e-12), name
        assert again.predicted_memory()[0] == pytest.approx(plan.predicted_memory()[0], rel=1e-12), name
        assert again.breakdown() == pytest.approx(plan.breakdown(), rel=1e-12), name
        if plan.sharding is not None:
            assert again.fits is not None


def test_the_joint_planners_pipelined_plan_is_priced_with_the_stage_layout_it_writes():
    """A joint plan of t = 2 in micro-batches, the graph at one micro-batch of its data axis
    (16 rows): the planner writes its stages' layout (stage_sharding) and records that
    layout's price, the one Plan.price gives it again; a graph at other rows gets no layout
    and the figure of the planner's own {1, t} search (docs/cost-model.md, "One evaluator")."""
    c = shardwise.Cluster.preset("dgx-a100", nodes=1)
    at_rows = shardwise.models.gpt(layers=8, hidden=4096, heads=32, seq=2048, vocab=50304, batch=16)
    # zero=False: with ZeRO-1 a plan of t = 1 fits here (the optimizer state sharded over 8 data
    # ranks) and has no stage layout to write.
    joint = shardwise.Plan.joint(at_rows, c, global_batch=32, memory_fraction=0.3, zero=False)
    assert joint.tensor > 1 and joint.num_micro_batches() > 1 and joint.searched_layout()
    assert joint.stage_sharding is not None
    again = shardwise.Plan.from_json(joint.to_json()).price(at_rows, c)
    assert again.predicted_step_time() == pytest.approx(joint.predicted_step_time(), rel=1e-12)
    assert again.predicted_memory()[0] == pytest.approx(joint.predicted_memory()[0], rel=1e-12)
    other_rows = shardwise.models.gpt(layers=8, hidden=4096, heads=32, seq=2048, vocab=50304, batch=2)
    unlaid = shardwise.Plan.joint(other_rows, c, global_batch=32, memory_fraction=0.3, zero=False)
    assert unlaid.stage_sharding is None and unlaid.searched_layout()


def test_a_compiled_plan_is_priced_with_its_memory_bound_ops_fused():
    """plan.compile (parallelize(compile=True)): inductor fuses the memory-bound ops between the
    products (csrc/analysis/compiled_fusion.h), so the same degrees are priced with less
    compute time and fewer saved activations (AOTAutograd recomputes what a fused kernel kept
    in registers: RMSNorm's float32 copies, SwiGLU's SiLU); the products' FLOPs are the same.
    The plan says so in its JSON and hash."""
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=8, num_key_value_heads=4,
                                   intermediate_size=768, vocab_size=512, max_position_embeddings=64, use_cache=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    ids = torch.zeros(8, 64, dtype=torch.long, device="meta")
    g = shardwise.capture(model, {"input_ids": ids, "labels": ids})
    c = shardwise.Cluster.preset("dgx-a100", nodes=1)
    for degrees in ({"data": 8}, {"tensor": 2, "data": 4}, {"tensor": 2, "pipeline": 2, "data": 2}):
        eager = shardwise.Plan.manual(g, c, global_batch=32, recompute=False, **degrees)
        compiled = shardwise.Plan.manual(g, c, global_batch=32, recompute=False, compile=True, **degrees)
        assert not eager.compile and compiled.compile and json.loads(compiled.to_json())["compile"] is True
        assert "compile" not in json.loads(eager.to_json()) and compiled.hash() != eager.hash()
        assert shardwise.Plan.from_json(compiled.to_json()).compile
        assert compiled.breakdown()["compute"] < 0.95 * eager.breakdown()["compute"], degrees
        assert compiled.predicted_memory()[1]["activations"] < 0.9 * eager.predicted_memory()[1]["activations"], degrees
        assert compiled.predicted_tflops_per_device() * compiled.predicted_step_time() == pytest.approx(
            eager.predicted_tflops_per_device() * eager.predicted_step_time(), rel=1e-9)
    searched = shardwise.plan(g, c, global_batch=32, compile=True)
    assert searched.compile

