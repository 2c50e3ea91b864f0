"""benchmarks/published.py's rows (issue 46, item 6): published H100 runs priced by the
evaluator. What holds today is asserted: the +-10% throughput bar holds on the 5 priced
calibration rows (benchmarks/README.md, "published.py"; 4 of 5 until pipeline receives were
posted one computation early, 2026-12-05).

These check predictions (arithmetic on transformers' Llama 3 8B captured on the meta device),
never wall-clock time."""
import pytest

from conftest import benchmark_module

pytest.importorskip("transformers")

published = benchmark_module("published_benchmark", "published.py")

GB = 1e9
GIB = 1024 ** 3


@pytest.fixture(scope="module")
def cache():
    return {}


def test_each_models_rows_agree_on_flops_per_token():
    """The transcription: within one source and model, TFLOP/s over tokens/s is the source's
    FLOPs per token, so it is one number for every row of that model and sequence (a typo in
    either column breaks it)."""
    per_model: dict[tuple[str, str, int], list[float]] = {}
    for row in published.CALIBRATION:
        if row.tokens_per_gpu and row.tflops_per_gpu:
            per_model.setdefault((row.source.split()[0], row.model, row.seq), []).append(
                row.tflops_per_gpu * 1e12 / row.tokens_per_gpu)
    assert {key[1] for key in per_model} == {"8B", "70B", "405B"}
    for key, flops in per_model.items():
        assert max(flops) / min(flops) < 1.01, (key, flops)
    # And that number is the model's: 6 x parameters per token is most of it (attention the rest).
    assert 6 * 8.0e9 < per_model[("Megatron-Bridge", "8B", 8192)][0] < 6 * 8.0e9 * 1.2


@pytest.mark.parametrize("index", [0, 1], ids=["25.11", "25.09"])
def test_megatron_bridge_8b_fp8_configuration_is_priced_and_fits(index, cache):
    """The published 8B FP8 configuration (FSDP over 8, 5 of 32 layers recomputed) prices on
    the dgx-h100 preset and is predicted to fit in its 80 GB, as it ran."""
    row = published.CALIBRATION[index]
    graph = published.llama_graph(row.model, row.seq, cache)
    priced = published.price(graph, published.cluster_for(row), row)
    assert priced["plan"].precision == "fp8"
    assert priced["memory"] <= 80 * GB, f"{priced['memory'] / GB:.1f} GB"
    # Within issue 46's 10% of the published tokens per second (0.92x and 0.95x).
    assert 0.9 <= published.published_ratio(row, priced)[1] <= 1.1, published.published_ratio(row, priced)
    # 5 of 32 layers recomputed: between the plans that recompute none and all of them.
    kept = published.price(graph, published.cluster_for(row), published.Row(
        **{**row.__dict__, "recompute_layers": None, "recompute": "none"}))
    assert priced["step"] > kept["step"]


@pytest.mark.parametrize("index", [0, 1], ids=["25.11", "25.09"])
def test_megatron_bridge_8b_fp8_compiled_is_priced_faster_and_smaller_than_eager(index, cache):
    """A calibration row priced as a compiled plan (Transformer Engine's fused kernels; here
    inductor's: memory-bound ops fused, what a fused kernel keeps in registers not saved,
    csrc/analysis/compiled_fusion.h): faster and smaller than the same plan eager, the products'
    FLOPs the same. Its FP8 linears save their gathered weights' float8 W^T for the backward
    (no regather), so they are traced and their casts fused (2026-12-04: 0.92x / 0.95x of the
    published tokens per second compiled at 62.5 GB; 0.69x / 0.71x while FSDP regathered the
    weights and the casts stayed eager)."""
    row = published.CALIBRATION[index]
    assert row.compile and row.zero == 3
    graph = published.llama_graph(row.model, row.seq, cache)
    cluster = published.cluster_for(row)
    priced = published.price(graph, cluster, row)
    eager = published.price(graph, cluster, published.Row(**{**row.__dict__, "compile": False}))
    assert priced["plan"].compile and not eager["plan"].compile
    assert priced["tokens"] > 1.1 * eager["tokens"], (priced["tokens"], eager["tokens"])
    assert priced["memory"] < 0.85 * eager["memory"], (priced["memory"] / GB, eager["memory"] / GB)
    assert priced["plan"].predicted_tflops_per_device() * priced["plan"].predicted_step_time() == pytest.approx(
        eager["plan"].predicted_tflops_per_device() * eager["plan"].predicted_step_time(), rel=1e-9)


@pytest.mark.parametrize("index", [0, 1], ids=["T1 8 GPUs", "T3 128 GPUs"])
def test_torchtitan_8b_memory_at_most_a_fifth_above_published(index, cache):
    """A check row, never fitted on: torchtitan's eager FSDP run of Llama 3.1 8B with
    selective recomputation measured 82.4 GiB on 8 GPUs and 67.0 GiB on 128 (its peak reserved
    memory). The evaluator prices this runtime's selective recomputation, which keeps every
    product's output (analysis/selective_recompute.h), where torchtitan's op policy of 2024-12
    recomputes every other matmul (about 20 GB less here), and the loss' backward over the
    vocabulary (16.8 GB of float32 gradients at 2 x 8,192 tokens): its memory per GPU is at or
    above each published figure, and within a fifth of it. (Until 2026-12-04 the degrees
    evaluator left the loss' gradients out; the rows were then within 10%: 0.93 and 0.93.)"""
    row = published.CHECK[index]
    assert row.memory_gib is not None and row.device == published.TT_DEVICE
    graph = published.llama_graph(row.model, row.seq, cache)
    priced = published.price(graph, published.cluster_for(row), row)
    ratio = priced["memory"] / (row.memory_gib * GIB)
    assert 1.0 <= ratio <= 1.2, f"predicted {priced['memory'] / GIB:.1f} GiB, published {row.memory_gib}"


@pytest.mark.slow
def test_the_search_splits_sequences_only_where_that_is_faster(cache):
    """The Llama 3 paper's 405B row (8,192 tokens, 8,192 H100s): the search with context
    parallelism allowed chose a sequence split priced at 15.4 s a step over the 15.2 s plan
    that the search without it, run for the report's reason, had found (its "why" line said
    0.98x). The plan chosen is now the faster of the two searches' plans."""
    import shardwise

    row = published.CHECK[2]
    graph = published.llama_graph(row.model, row.seq, cache)
    cluster = published.cluster_for(row)
    allowed = shardwise.plan(graph, cluster, global_batch=row.global_batch, precision=row.precision)
    off = shardwise.plan(graph, cluster, global_batch=row.global_batch, precision=row.precision,
                         context_parallel=False)
    assert allowed.predicted_step_time() <= off.predicted_step_time() * (1 + 1e-9), (allowed.report(), off.report())


@pytest.mark.parametrize("index", [0, 1], ids=["25.11", "25.09"])
def test_the_search_beats_the_8b_configuration_by_five_percent_under_the_same_model(index, cache):
    """Issue 46's search bar on the 8B rows: shardwise.plan on the same 8 H100s, batch and
    sequence finds a plan predicted at >= 1.05x the published configuration's tokens/s, and
    predicted to fit. It recomputes nothing, which fits only with the optimizer state sharded
    (ZeRO-1): before the fast search priced ZeRO-1 where a combination needed it, it stopped
    at t2 p2 d2 without ZeRO, 1.00x (2026-12-05)."""
    import shardwise

    row = published.CALIBRATION[index]
    graph = published.llama_graph(row.model, row.seq, cache)
    cluster = published.cluster_for(row)
    priced = published.price(graph, cluster, row)
    found = published.search(graph, cluster, row)
    assert found["fits"], found["plan"].report()
    assert found["tokens"] >= 1.05 * priced["tokens"], (found["tokens"] / priced["tokens"], found["plan"].report())
    plan = found["plan"]
    assert plan.zero_stage == 1 and plan.recompute == "none" and plan.precision == "fp8"
    assert plan.breakdown()["zero_broadcast"] > 0  # priced as the runtime runs ZeRO-1
    assert found["memory"] <= shardwise._C.MEMORY_FRACTION * published.memory_of(cluster)


@pytest.mark.parametrize("index", [2, 4], ids=["25.11 batch 128", "26.02 batch 256"])
def test_the_search_prices_a_layer_a_chunk_on_the_70b_rows(index, cache):
    """Llama 3 70B on 64 H100s: 80 layers on 8 stages cut into 10 chunks a rank (a layer a
    chunk) with ZeRO-1 is predicted 2.7-2.9% faster than the published v = 5, and fits (73.7 GB);
    the search priced interleaved chunks only up to 8 a rank and found 1.003x (batch 128: the
    published layout with ZeRO-1) and 0.977x (batch 256: 1F1B). Not issue 46's 1.05x: the
    best plan of t in {2, 4, 8}, p in {2, 4, 8, 16}, v, micro-batch 1 or 2, ZeRO 0 or 1 and
    recompute none or selective priced by hand is that one (1.038x priced for plans that do
    not fit)."""
    import shardwise

    row = published.CALIBRATION[index]
    graph = published.llama_graph(row.model, row.seq, cache)
    cluster = published.cluster_for(row)
    priced = published.price(graph, cluster, row)
    found = published.search(graph, cluster, row)
    plan = found["plan"]
    assert found["fits"] and found["memory"] <= shardwise._C.MEMORY_FRACTION * published.memory_of(cluster)
    assert (plan.tensor, plan.pipeline, plan.data, plan.virtual_stages) == (4, 8, 2, 10), plan.report()
    assert found["tokens"] >= 1.02 * priced["tokens"], (found["tokens"] / priced["tokens"], plan.report())


def test_the_joint_planner_chooses_among_its_best_plans_priced_as_completed(cache):
    """Llama 3 70B at batch 128 on 64 H100s (the 25.11 calibration row's cluster): t4 p8 d2
    1F1B does not fit under the {1, t} stage layout the joint planner prices its candidates
    with (84 GB against 77.3) and fits completed (`Plan.complete`'s {d, t} layout: 74.6 GB,
    12.90 s). Before the planner completed its best few before choosing, it chose t4 p16 v5 at
    13.21 s (2026-12-05). Its plan is now no slower than that completed plan."""
    import shardwise

    row = published.CALIBRATION[2]
    graph = published.llama_graph(row.model, row.seq, cache)
    cluster = published.cluster_for(row)
    found = shardwise.plan(graph, cluster, global_batch=row.global_batch, precision=row.precision,
                           compile=row.compile)
    other = shardwise.Plan.manual(graph, cluster, tensor=4, pipeline=8, data=2, global_batch=row.global_batch,
                                  micro_batch=1, precision=row.precision, compile=row.compile,
                                  recompute="none").complete(graph, cluster)
    assert other.predicted_memory()[0] <= shardwise._C.MEMORY_FRACTION * published.memory_of(cluster)
    assert found.fits and found.pipeline > 1
    assert found.predicted_step_time() <= other.predicted_step_time() * (1 + 1e-9), (found.report(), other.report())


def test_the_70b_rows_tensor_collectives_run_as_rings_and_are_priced_so(cache):
    """Megatron-Bridge's 70B H100 recipe overlaps its tensor-parallel communication
    (tp_comm_overlap); the rows are priced with the runtime's collective matmuls
    (plan.collective_matmul: the stages' layout searched with the rings, their FP8 products run
    in the ring, runtime/collective_matmul.py's Fp8Products): faster than the same plan without them, and
    within 10% of the published throughput on the three rows (0.93x, 0.92x, 0.94x since each
    pipeline receive is posted one computation early: schedule/early_receives.h; 25.09's
    1,619 tok/s was 0.895x before)."""
    row = published.CALIBRATION[2]
    graph = published.llama_graph(row.model, row.seq, cache)
    cluster = published.cluster_for(row)
    rings = published.price(graph, cluster, row)
    plain = published.price(graph, cluster, published.Row(**{**row.__dict__, "collective_matmul": False}))
    assert rings["plan"].collective_matmul and rings["plan"].stage_sharding["collective_matmul"] is True
    assert rings["step"] < 0.95 * plain["step"], (rings["step"], plain["step"])
    assert rings["memory"] <= 80 * GB
    for index in (2, 3, 4):
        row = published.CALIBRATION[index]
        priced = published.price(published.llama_graph(row.model, row.seq, cache), published.cluster_for(row), row)
        ratio = published.published_ratio(row, priced)[1]
        assert 0.9 <= ratio <= 1.1, (row.label, ratio)


def test_rows_with_context_parallelism_are_listed_not_priced(cache):
    """Context parallelism is not expressible yet (issue 48): such a row is reported with
    the reason, never priced as something else."""
    rows = [r for r in published.CALIBRATION + published.CHECK if r.context > 1]
    assert rows
    out = published.run_rows(rows, "calibration", False, cache)
    assert all("issue 48" in r["note"] and "ratio" not in r for r in out)
