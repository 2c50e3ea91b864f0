"""Profiled mode: measuring a captured graph's ops on this device and a live Gloo group's
collectives, and costing plans with the measurements (python/shardwise/profile.py,
csrc/cost/profiled_cost.h)."""
from __future__ import annotations

import json
import math
from collections import Counter
from datetime import timedelta

import pytest
import torch

import shardwise
from shardwise import _C
from shardwise.models import TinyGPT
from shardwise.profile import _fit_alpha_beta, cores_shared, measure_collectives, measure_sync_wait, ranks_share_cores


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = TinyGPT()
    idx = torch.randint(0, model.cfg.vocab, (2, model.cfg.seq))
    graph = shardwise.capture(model, (idx, idx))
    prof = shardwise.profile(graph, budget_s=20, repeats=3, progress=False)
    return graph, prof


def test_most_nodes_are_measured_with_positive_times(tiny):
    graph, prof = tiny
    cov = prof.coverage(graph)
    total = cov["nodes_measured"] + cov["nodes_analytic"]
    assert total == graph.num_nodes()
    assert cov["nodes_measured"] / total > 0.8, (cov, prof.skipped)
    assert prof.ops and all(t["forward"] > 0 and t["backward"] >= 0 for t in prof.ops.values())
    # Differentiable contractions have a real backward.
    linears = [t for sig, t in prof.ops.items() if sig.startswith("aten::linear(")]
    assert linears and all(t["backward"] > 0 for t in linears)
    assert prof.device == "cpu"


def test_repeated_blocks_share_one_measurement(tiny):
    graph, prof = tiny
    sigs = _C.node_signatures(graph._core)
    counts = Counter(sigs)
    layers = TinyGPT().cfg.layers
    # Each block's layer norm / linear / attention appears once per layer under one key.
    ln = [s for s in counts if s.startswith("aten::layer_norm(")]
    assert any(counts[s] >= layers for s in ln)
    assert len(prof.ops) + len(prof.skipped) == len(counts) < graph.num_nodes()
    prov = prof.provenance(graph)
    for sig, p in zip(sigs, prov):
        assert p == ("measured" if sig in prof.ops else "analytic")


def test_json_round_trip(tiny, tmp_path):
    _, prof = tiny
    back = shardwise.Profile.from_json(prof.to_json())
    assert back == prof
    path = tmp_path / "p.json"
    prof.save(path)
    assert shardwise.Profile.load(path) == prof
    doc = json.loads(prof.to_json())
    doc["ops"][next(iter(doc["ops"]))]["forward"] = -1.0
    with pytest.raises(shardwise.ValidationError, match="forward"):
        shardwise.Profile.from_json(json.dumps(doc))


def test_profiled_plan_differs_from_analytic(tiny):
    graph, prof = tiny
    cluster = shardwise.Cluster.preset("cpu", nodes=1)
    kw = dict(global_batch=4, micro_batch=2, precision="f32")
    analytic = shardwise.Plan.manual(graph, cluster, **kw)
    profiled = shardwise.Plan.manual(graph, cluster, profile=prof, **kw)
    t = profiled.predicted_step_time()
    assert math.isfinite(t) and t > 0
    assert t != pytest.approx(analytic.predicted_step_time(), rel=1e-6)
    assert analytic.cost_coverage() is None
    cov = profiled.cost_coverage()
    assert cov["nodes_measured"] > 0 and cov["node_calls_measured"] > 0
    # Same plan either way: only the predictions differ.
    assert profiled.hash() == analytic.hash()
    # cost_model= is the same parameter.
    same = shardwise.Plan.manual(graph, cluster, cost_model=prof, **kw)
    assert same.predicted_step_time() == pytest.approx(t)


def test_unmeasured_ops_stay_analytic_with_a_reason():
    graph = shardwise.Graph.from_text(
        "graph(%x: f32[b4,8]) {\n"
        "  %y: f32[b4,8] = aten::relu(%x)\n"
        "  %z: f32[b4,8] = aten::some_op_that_does_not_exist(%y)\n"
        "  return (%z)\n"
        "}\n")
    prof = shardwise.profile(graph, budget_s=5, repeats=2, progress=False)
    assert prof.provenance(graph) == ["measured", "analytic"]
    (reason,) = prof.skipped.values()
    assert "has no some_op_that_does_not_exist" in reason


def test_zero_budget_leaves_everything_analytic(tiny):
    graph, _ = tiny
    prof = shardwise.profile(graph, budget_s=0, progress=False)
    assert not prof.ops
    assert all("budget" in why for why in prof.skipped.values())


def test_alpha_beta_fit_is_constrained():
    alpha, beta = _fit_alpha_beta([1000, 2000, 4000], [1e-5 + 1e-9 * x for x in (1000, 2000, 4000)])
    assert alpha == pytest.approx(1e-5) and beta == pytest.approx(1e-9)
    alpha, beta = _fit_alpha_beta([1000, 2000], [2e-6, 1e-6])  # noisy, decreasing: a constant
    assert beta == 0 and alpha == pytest.approx(1.5e-6)
    alpha, beta = _fit_alpha_beta([1000, 2000], [0.0, 3e-6])  # negative intercept: through 0
    assert alpha == 0 and beta > 0


# ---- collectives of a live 2-process Gloo group -------------------------------------------


def _join_or_fail(ctx) -> None:
    """Waits up to 10 minutes for spawned workers; kills them and fails the test if they hang."""
    try:
        for _ in range(600):
            if ctx.join(timeout=1):  # True once every worker has exited
                return
        pytest.fail("the workers hung")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()


def _gloo_worker(rank: int, world: int, store_path: str, out_path: str, subgroups: bool = False) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=20))
    try:
        kinds = ("all_reduce", "all_gather") if subgroups else ("all_reduce", "all_gather", "broadcast",
                                                                "reduce_scatter")
        measured = measure_collectives(sizes=(4 << 10, 64 << 10, 1 << 20), repeats=3, kinds=kinds,
                                       subgroups=subgroups)
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(measured, f)
    finally:
        dist.destroy_process_group()


def test_gloo_collectives_fit_alpha_beta(tmp_path):
    import torch.multiprocessing as mp

    store, out = str(tmp_path / "store"), str(tmp_path / "out.json")
    ctx = mp.spawn(_gloo_worker, args=(2, store, out), nprocs=2, join=False)
    _join_or_fail(ctx)  # a hang guard, not a timing claim: the workers' own collective timeout is 20 s
    with open(out) as f:
        measured = json.load(f)
    # Every kind asked for is measured or skipped with its reason (unsupported by Gloo), and
    # Gloo measures all-reduce; the fit is not a timing claim (on a loaded machine the larger
    # messages need not come out slower: a CI run saw beta clipped to 0), only that a 1 MiB
    # all-reduce takes some time.
    for kind, reason in measured["skipped"].items():
        assert kind.startswith("collective:") and reason
    asked = {"all_reduce", "all_gather", "broadcast", "reduce_scatter"}
    assert set(measured["collectives"]) | {k.split(":", 1)[1] for k in measured["skipped"]} == asked, measured
    fit = measured["collectives"]["all_reduce"]["2"]
    assert fit["alpha"] + fit["beta"] * (1 << 20) > 0
    doc = {"device": "cpu", "ops": {}, "collectives": measured["collectives"], "skipped": measured["skipped"]}
    prof = shardwise.Profile.from_json(json.dumps(doc))
    cluster = shardwise.Cluster.preset("cpu", nodes=2)
    seconds, provenance = prof.collective_time(cluster, "all_reduce", [0, 1], 1 << 20)
    assert provenance == "measured"
    assert seconds == pytest.approx(fit["alpha"] + fit["beta"] * (1 << 20))
    _, provenance = prof.collective_time(cluster, "all_to_all", [0, 1], 1 << 20)
    assert provenance == "analytic"


def test_gloo_collectives_fit_every_group_size_a_mesh_axis_runs(tmp_path):
    """subgroups=True: on 4 ranks, each kind fitted on the 4 and on two pairs at once; a plan's
    2-rank group (a mesh axis of a 2 x 2 plan) is then priced by the pairs' fit, not the
    analytic link model."""
    import torch.multiprocessing as mp

    store, out = str(tmp_path / "store"), str(tmp_path / "out.json")
    ctx = mp.spawn(_gloo_worker, args=(4, store, out, True), nprocs=4, join=False)
    _join_or_fail(ctx)
    with open(out) as f:
        measured = json.load(f)
    assert not measured["skipped"], measured
    for kind in ("all_reduce", "all_gather"):
        assert set(measured["collectives"][kind]) == {"2", "4"}, measured
    doc = {"device": "cpu", "ops": {}, "collectives": measured["collectives"], "skipped": {}}
    prof = shardwise.Profile.from_json(json.dumps(doc))
    cluster = shardwise.Cluster.preset("cpu", nodes=4)
    fit = measured["collectives"]["all_gather"]["2"]
    seconds, provenance = prof.collective_time(cluster, "all_gather", [2, 3], 1 << 20)
    assert provenance == "measured"
    assert seconds == pytest.approx(fit["alpha"] + fit["beta"] * (1 << 20))
    _, provenance = prof.collective_time(cluster, "all_gather", [0, 1, 2], 1 << 20)
    assert provenance == "analytic"  # no fit of 3 ranks: 3 does not divide 4


def _sync_wait_worker(rank: int, world: int, store_path: str, out_path: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=20))
    try:
        torch.set_num_threads(1)
        # Both estimators, and the host's own choice: each is collective (a rank that took the
        # other branch would leave its peer waiting: a hang, which _join_or_fail reports).
        waits = [measure_sync_wait(compute_s=0.002, iterations=4, rounds=3, shared_cores=shared)
                 for shared in (True, False, None)]
        with open(f"{out_path}.{rank}", "w") as f:
            json.dump(waits + [ranks_share_cores()], f)
    finally:
        dist.destroy_process_group()


def test_the_sync_wait_is_measured_by_every_rank_together_and_agreed(tmp_path):
    """measure_sync_wait is collective: both ranks run it (no hang) and answer one figure, the
    ranks' figures agreed (a rank alone would answer its own); a finite time >= 0, whether the
    ranks are taken to share cores (the step's growth) or not (each call's time after the
    compute). Its size is the host's (no bound asserted); without a process group it is 0.
    ranks_share_cores answers the same on every rank."""
    import torch.multiprocessing as mp

    store, out = str(tmp_path / "store"), str(tmp_path / "wait")
    ctx = mp.spawn(_sync_wait_worker, args=(2, store, out), nprocs=2, join=False)
    _join_or_fail(ctx)
    answers = [json.load(open(f"{out}.{r}")) for r in range(2)]
    assert answers[0] == answers[1], answers
    for wait in answers[0][:3]:
        assert math.isfinite(wait) and wait >= 0
    assert isinstance(answers[0][3], bool)
    assert measure_sync_wait() == 0.0  # no process group in this process


def test_ranks_share_cores_when_their_threads_outnumber_the_cores():
    """The choice of measure_sync_wait's estimator: 2 ranks of 1 thread on 2 cores each have one
    (a waiting rank's core idles); 4 on 2, or 2 of 2 threads on 2, share them."""
    assert not cores_shared(2, 1, 2)
    assert not cores_shared(1, 8, 8)
    assert cores_shared(4, 1, 2)
    assert cores_shared(2, 2, 2)
    assert cores_shared(3, 0, 2)  # no threads reported: one each


def test_a_profiles_sync_wait_is_paid_by_each_collective_a_plan_waits_on(tiny):
    """Profile.sync_wait (csrc/cost/profiled_cost.h) is added to every collective call: a
    tensor-parallel plan, which waits on collectives inside every layer, is priced higher by
    it, more than a data-parallel one, whose gradient buckets run beside backward; and each
    call by exactly the wait."""
    graph, prof = tiny
    cluster = shardwise.Cluster.preset("cpu", 2)
    fits = {"all_reduce": {"2": {"alpha": 1e-4, "beta": 1e-9}}, "all_gather": {"2": {"alpha": 1e-4, "beta": 1e-9}},
            "reduce_scatter": {"2": {"alpha": 1e-4, "beta": 1e-9}}}
    doc = json.loads(prof.to_json())
    without = shardwise.Profile.from_json(json.dumps({**doc, "collectives": fits}))
    wait = 5e-3
    waiting = shardwise.Profile.from_json(json.dumps({**doc, "collectives": fits, "sync_wait": wait}))
    assert waiting.sync_wait == wait and without.sync_wait == 0.0
    assert "sync wait: 5.00 ms" in waiting.summary()
    for kind in ("all_reduce", "all_to_all"):  # a fitted kind and an analytic one
        assert waiting.collective_time(cluster, kind, [0, 1], 1 << 20)[0] == pytest.approx(
            without.collective_time(cluster, kind, [0, 1], 1 << 20)[0] + wait)
    rise = {}
    for name, kwargs in {"tensor": {"tensor": 2}, "data": {"data": 2}}.items():
        plan = shardwise.Plan.manual(graph, cluster, global_batch=2, recompute=False, **kwargs)
        rise[name] = (plan.price(graph, cluster, profile=waiting).predicted_step_time() -
                      plan.price(graph, cluster, profile=without).predicted_step_time())
    assert rise["tensor"] >= 4 * wait, rise  # at least a forward and a backward collective in each of 2 layers
    assert rise["tensor"] > rise["data"] >= 0, rise


def test_the_planners_price_with_a_profile_and_price_their_plans_again_so(tiny):
    """Issue 46, item 7 (in part): shardwise.plan / Plan.search / Plan.joint take profile=, and
    the plan's figures are what Plan.price gives it again with the same profile (one
    evaluator: csrc/search/plan_price.h)."""
    graph, prof = tiny
    cluster = shardwise.Cluster.preset("cpu", nodes=4)
    world = cluster.world_size
    assert world == 4
    # Each data rank at the captured rows (2): the shapes the profile measured.
    kw = dict(global_batch=2 * world, mesh=(world, 1), recompute=False, zero=False, precision="f32")
    analytic = shardwise.plan(graph, cluster, **kw)
    profiled = shardwise.plan(graph, cluster, profile=prof, **kw)
    assert profiled.predicted_step_time() != pytest.approx(analytic.predicted_step_time(), rel=1e-6)
    again = shardwise.Plan.from_json(profiled.to_json()).price(graph, cluster, profile=prof)
    assert again.predicted_step_time() == pytest.approx(profiled.predicted_step_time(), rel=1e-12)
    assert again.predicted_memory()[0] == pytest.approx(profiled.predicted_memory()[0], rel=1e-12)
    assert again.cost_coverage()["node_calls_measured"] > 0
    # The analytic plan (its decisions may differ: the profile's times steer the search) priced
    # again without the profile and with it.
    plain = shardwise.Plan.from_json(analytic.to_json())
    assert plain.price(graph, cluster).predicted_step_time() == pytest.approx(analytic.predicted_step_time(),
                                                                              rel=1e-12)
    assert plain.price(graph, cluster, profile=prof).predicted_step_time() != pytest.approx(
        analytic.predicted_step_time(), rel=1e-6)

    joint = shardwise.Plan.joint(graph, cluster, global_batch=4 * world, precision="f32", profile=prof,
                                 stage_layouts=False)
    joint_analytic = shardwise.Plan.joint(graph, cluster, global_batch=4 * world, precision="f32",
                                          stage_layouts=False)
    assert joint.predicted_step_time() != pytest.approx(joint_analytic.predicted_step_time(), rel=1e-6)
    assert joint.price(graph, cluster, profile=prof).predicted_step_time() == pytest.approx(
        joint.predicted_step_time(), rel=1e-12)


# ---- per-rank shapes (issue 46, item 7) ---------------------------------------------------


@pytest.fixture(scope="module")
def data_plan(tiny):
    graph, _ = tiny
    cluster = shardwise.Cluster.preset("cpu", 2)
    plan = shardwise.plan(graph, cluster, global_batch=2, mesh=(2, 1), zero=False, recompute=False)
    return graph, cluster, plan


def test_a_plans_specs_are_its_ops_at_the_shapes_one_rank_runs(data_plan):
    from shardwise.profile import plan_specs

    graph, cluster, plan = data_plan
    specs = plan_specs(graph, cluster, [plan])
    values = {v["name"]: v for v in graph.values()}
    for spec in specs:
        assert spec["check_outputs"]  # a rank's shapes: a call that gives others is not timed
        for v in spec["inputs"] + spec["outputs"]:
            assert all(n >= 1 for n in v["shape"]), spec
    # 2 rows over 2 ranks: every activation with a batch dim holds 1 row; weights whole.
    weights = {tuple(v["shape"]) for v in values.values() if v["role"] == "parameter"}
    linear = [s for s in specs if s["op"] == "aten::linear"]
    assert linear and all(tuple(s["inputs"][1]["shape"]) in weights for s in linear)
    assert all(s["inputs"][0]["shape"][0] == 1 for s in linear)
    assert len({s["signature"] for s in specs}) == len(specs)  # one per distinct call


def test_an_fp8_plans_linears_are_marked_to_be_timed_as_fp8_runs_them(data_plan):
    """The core says which calls are FP8 linears (plan_local_ops' "fp8", keyed "fp8:..."):
    those are timed through runtime/fp8.py, the rest as the model's dtype runs them."""
    from shardwise.profile import plan_specs

    graph, cluster, _ = data_plan
    plan = shardwise.plan(graph, cluster, global_batch=2, mesh=(2, 1), zero=False, recompute=False, precision="fp8")
    specs = plan_specs(graph, cluster, [plan])
    assert any(s["fp8"] for s in specs) and not all(s["fp8"] for s in specs)
    for spec in specs:
        assert spec["fp8"] == spec["signature"].startswith("fp8:"), spec["signature"]
        assert not spec["fp8"] or spec["op"] == "aten::linear", spec["op"]
    assert not any(s["fp8"] for s in plan_specs(graph, cluster, [data_plan[2]]))  # the float32 plan


def test_a_selective_plans_ops_are_timed_under_its_policy_and_priced_so(data_plan):
    """A plan that recomputes selectively runs its blocks' ops under the policy's dispatch mode
    (runtime/recompute.py): plan_local_ops marks its calls, the profile times each under the
    runtime's own contexts too ("selective": the forward in the caching mode and its replay),
    and the evaluator charges what that adds beyond the forward in the backward of each node
    run again (csrc/cost/op_cost.h, OpTime::selective_extra), kept nodes included."""
    from shardwise.profile import measure_specs, plan_specs

    graph, cluster, plain = data_plan
    plan = shardwise.plan(graph, cluster, global_batch=2, mesh=(2, 1), zero=False, recompute="selective")
    specs = plan_specs(graph, cluster, [plan])
    assert specs and all(s["selective"] for s in specs)
    assert not any(s["selective"] for s in plan_specs(graph, cluster, [plain]))
    doc = measure_specs(specs, budget_s=30, repeats=3, progress=False)
    ops = doc["ops"]
    assert ops and all("selective" in op for op in ops.values())
    # Timed (seconds of the forward in its mode and the replay), not copied from the forward.
    assert all(math.isfinite(op["selective"]) and op["selective"] > 0 for op in ops.values())
    assert any(op["selective"] != op["forward"] for op in ops.values())
    prof = shardwise.Profile.from_json(json.dumps({"format": "shardwise.profile", "version": 1, **doc}))
    assert prof.ops == ops  # the core keeps the key
    without = {**doc, "ops": {sig: {"forward": op["forward"], "backward": op["backward"]} for sig, op in ops.items()}}
    rule = shardwise.Profile.from_json(json.dumps({"format": "shardwise.profile", "version": 1, **without}))
    # Priced from the entries, not from how this machine's timings fell (the measured extra is
    # near the rule's forward for a recomputed op, and a loaded run may time it under): each op's
    # extra 1 ms above its forward prices every node run again above the rule (the rule: a
    # recomputed node its forward, a kept one nothing).
    above = {**doc, "ops": {sig: {**op, "selective": 2 * op["forward"] + 1e-3} for sig, op in ops.items()}}
    above = shardwise.Profile.from_json(json.dumps({"format": "shardwise.profile", "version": 1, **above}))
    assert plan.price(graph, cluster, profile=above).predicted_step_time() > \
        plan.price(graph, cluster, profile=rule).predicted_step_time()
    # A plan without selective recomputation never reads it.
    assert plain.price(graph, cluster, profile=prof).predicted_step_time() == pytest.approx(
        plain.price(graph, cluster, profile=rule).predicted_step_time(), rel=1e-12)


def test_a_selective_ops_calls_are_timed_inside_one_pair_of_modes_as_a_block_runs_them(monkeypatch):
    """A recomputed block enters the policy's modes once and runs its ops one after the other
    in them: a cheap op is timed as many calls inside one forward mode and one replay (each
    kept output taken back in order), and one call's seconds are the sample's over its calls,
    not one call a pair of modes entered cold."""
    import importlib

    from shardwise.runtime import recompute

    profile = importlib.import_module("shardwise.profile")  # (shardwise.profile is the function)
    pairs, calls = [0], [0]
    real = recompute._selective_contexts

    def counted():
        pairs[0] += 1
        return real()

    monkeypatch.setattr(recompute, "_selective_contexts", counted)
    x = torch.randn(4, 8, requires_grad=True)

    def view(t):
        calls[0] += 1
        return torch.ops.aten.view.default(t, [8, 4])

    seconds = profile._selective_seconds(view, (x,), {}, torch.device("cpu"), 3, 1e-2, [x])
    assert math.isfinite(seconds) and seconds > 0
    assert calls[0] > 4 * pairs[0]  # (forward and replay: 2 calls a pair when one call a pair)
    # The kept outputs come back in order: a kept op's replay under many calls is its cache.
    mm_calls, pairs_before = [], pairs[0]
    w = torch.randn(8, 8, requires_grad=True)

    def mm(a, b):
        mm_calls.append(1)
        return torch.ops.aten.mm.default(a, b)

    assert profile._selective_seconds(mm, (x, w), {}, torch.device("cpu"), 2, 1e-2, [x]) > 0
    assert len(mm_calls) > 4 * (pairs[0] - pairs_before)


def test_a_profile_at_the_ranks_shapes_prices_the_plan_from_its_measurements(data_plan):
    from shardwise.profile import measure_specs, plan_specs

    graph, cluster, plan = data_plan
    specs = plan_specs(graph, cluster, [plan])
    doc = measure_specs(specs, budget_s=30, repeats=3, progress=False)
    # A view whose size attribute is the whole graph's cannot run at a rank's rows: skipped
    # with the reason, never timed at the wrong size.
    views = [s for s in specs if s["op"] in ("aten::view", "aten::reshape") and s["signature"] in doc["skipped"]]
    assert all("whole graph" in doc["skipped"][s["signature"]] or "failed" in doc["skipped"][s["signature"]]
               for s in views)
    assert len(doc["ops"]) > 0.7 * len(specs), doc["skipped"]
    prof = shardwise.Profile.from_json(json.dumps({"format": "shardwise.profile", "version": 1, **doc,
                                                   "collectives": {}}))
    result = _C.evaluate_plan_profiled(graph._core, cluster._core, plan.to_json(), prof.to_json())
    calls = result["coverage"]
    measured = sum(1 for s in specs if s["signature"] in doc["ops"])
    assert calls["node_calls_measured"] >= measured
    assert calls["node_calls_analytic"] <= len(doc["skipped"]) * 4, (calls, doc["skipped"])
    # The graph's own signatures (2 rows) were not measured: the profile held only the rank's.
    assert not set(prof.ops) & set(_C.node_signatures(graph._core)) - {s["signature"] for s in specs}
    priced = plan.price(graph, cluster, profile=prof)
    assert priced.predicted_step_time() != plan.price(graph, cluster).predicted_step_time()


def _specs_worker(rank: int, world: int, store_path: str, specs: list, budget: float, out_path: str) -> None:
    import torch.distributed as dist

    from shardwise.profile import measure_specs

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    try:
        doc = measure_specs(specs, budget_s=budget, repeats=2, progress=False, group=dist.group.WORLD)
        with open(f"{out_path}.{rank}", "w") as f:
            json.dump(doc, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("budget", [0.0, 30.0])
def test_a_groups_first_rank_times_a_plans_specs_for_every_rank(data_plan, tmp_path, budget):
    """Every rank of the group gets the first rank's figures (ranks sharing cores would time
    each other's time slices), and no rank waits on one that stopped."""
    import torch.multiprocessing as mp

    from shardwise.profile import plan_specs

    graph, cluster, plan = data_plan
    specs = plan_specs(graph, cluster, [plan])[:12]
    store, out = str(tmp_path / "store"), str(tmp_path / "out")
    ctx = mp.spawn(_specs_worker, args=(2, store, specs, budget, out), nprocs=2, join=False)
    _join_or_fail(ctx)  # a hang guard, not a timing claim
    docs = [json.load(open(f"{out}.{r}")) for r in range(2)]
    assert docs[0] == docs[1]
    if budget == 0:
        assert not docs[0]["ops"] and all("budget" in why for why in docs[0]["skipped"].values())
    else:
        assert docs[0]["ops"] and set(docs[0]["ops"]) | set(docs[0]["skipped"]) == {s["signature"] for s in specs}


def test_shared_by_states_the_times_at_the_rate_ranks_sharing_cores_compute(data_plan, monkeypatch):
    import sys

    from shardwise.profile import measure_specs, plan_specs

    profile_module = sys.modules["shardwise.profile"]  # the module (shardwise.profile is the function)

    graph, cluster, plan = data_plan
    specs = plan_specs(graph, cluster, [plan])[:3]
    monkeypatch.setattr(profile_module, "_measure_node", lambda *a, **k: (1e-3, 3e-3, 5e-3))
    monkeypatch.setattr(profile_module, "_autograd_overhead", lambda *a: 1e-3)
    alone = measure_specs(specs, progress=False)
    shared = measure_specs(specs, progress=False, shared_by=2.0)
    for s in specs:
        assert alone["ops"][s["signature"]] == {"forward": 1e-3, "backward": 2e-3, "selective": 5e-3}
        assert shared["ops"][s["signature"]] == {"forward": 2e-3, "backward": 4e-3, "selective": 1e-2}


def _slicing_worker(rank: int, world: int, store_path: str, specs: list, out_path: str) -> None:
    import torch.distributed as dist

    from shardwise.profile import measure_time_slicing

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        torch.set_num_threads(1)
        got = {"sliced": measure_time_slicing(specs, concurrent=1, seconds=0.2, rounds=1),
               "one_a_core": measure_time_slicing(specs, concurrent=world, seconds=0.2, rounds=1)}
        with open(f"{out_path}.{rank}", "w") as f:
            json.dump(got, f)
    finally:
        dist.destroy_process_group()


def test_the_time_slicing_factor_is_measured_by_every_rank_together_and_agreed(data_plan, tmp_path):
    """measure_time_slicing is collective: with fewer ranks at a time than the group has
    (concurrent=1 of 2) both ranks run the passes (no hang) and answer one figure, a factor in
    [1, 2]; with a core a rank (concurrent = the group) there is no slicing to measure: 1.0,
    as without a process group."""
    import torch.multiprocessing as mp

    from shardwise.profile import measure_time_slicing, plan_specs

    graph, cluster, plan = data_plan
    specs = plan_specs(graph, cluster, [plan])
    store, out = str(tmp_path / "store"), str(tmp_path / "slicing")
    ctx = mp.spawn(_slicing_worker, args=(2, store, specs, out), nprocs=2, join=False)
    _join_or_fail(ctx)
    got = [json.load(open(f"{out}.{r}")) for r in range(2)]
    assert got[0] == got[1], got
    assert 1.0 <= got[0]["sliced"] <= 2.0 and got[0]["one_a_core"] == 1.0
    assert measure_time_slicing(specs, concurrent=1) == 1.0  # no process group in this process


def test_the_time_slicing_pass_runs_an_fp8_plans_linears_as_its_program_calls_them(data_plan, monkeypatch):
    """The pass measure_time_slicing times holds every spec it can rebuild, an FP8 linear
    through runtime/fp8.py's call (left out, an FP8 plan's pass held its elementwise ops only)."""
    from shardwise.profile import _op_pass, plan_specs
    from shardwise.runtime import fp8

    graph, cluster, _ = data_plan
    plan = shardwise.plan(graph, cluster, global_batch=2, mesh=(2, 1), zero=False, recompute=False, precision="fp8")
    specs = plan_specs(graph, cluster, [plan])
    scaled = []
    real = fp8.fp8_call
    monkeypatch.setattr(fp8, "fp8_call", lambda op, a, k: scaled.append(op) or real(op, a, k))
    run = _op_pass(specs, torch.device("cpu"))
    assert run is not None
    scaled.clear()
    run()
    assert len(scaled) == sum(1 for s in specs if s["fp8"]) > 0
    assert _op_pass([], torch.device("cpu")) is None


def test_measured_time_slicing_multiplies_the_shared_rate_and_is_recorded(data_plan, tmp_path, monkeypatch):
    """Where a group's ranks outnumber the ranks that time at once, measure_specs multiplies
    its times by measure_time_slicing's factor beside shared_by, and the document (and the
    Profile, which the C++ core reads) says so; with time_slicing=False, or a factor of 1,
    neither."""
    import sys

    import torch.distributed as dist

    from shardwise.profile import measure_specs, plan_specs

    profile_module = sys.modules["shardwise.profile"]
    graph, cluster, plan = data_plan
    specs = plan_specs(graph, cluster, [plan])[:3]
    monkeypatch.setattr(profile_module, "_measure_node", lambda *a, **k: (1e-3, 3e-3, None))
    monkeypatch.setattr(profile_module, "_autograd_overhead", lambda *a: 1e-3)
    asked = []
    monkeypatch.setattr(profile_module, "measure_time_slicing",
                        lambda specs, concurrent, group, device: asked.append(concurrent) or 1.25)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        sliced = measure_specs(specs, progress=False, group=dist.group.WORLD, shared_by=2.0, concurrent=1)
        unsliced = measure_specs(specs, progress=False, group=dist.group.WORLD, shared_by=2.0, concurrent=1,
                                 time_slicing=False)
    finally:
        dist.destroy_process_group()
    assert asked == [1]
    for s in specs:
        assert sliced["ops"][s["signature"]] == {"forward": 2.5e-3, "backward": 5e-3}
        assert unsliced["ops"][s["signature"]] == {"forward": 2e-3, "backward": 4e-3}
    assert sliced["time_slicing"] == 1.25 and "time_slicing" not in unsliced
    doc = {"format": "shardwise.profile", "version": 1, "collectives": {}, **sliced}
    prof = shardwise.Profile.from_json(json.dumps(doc))
    assert prof.time_slicing == 1.25 and "x1.250" in prof.summary()
    priced = plan.price(graph, cluster, profile=prof)  # the core reads the key
    assert priced.predicted_step_time() > 0


def test_an_ops_samples_are_taken_one_per_pass_and_their_median_kept(data_plan, monkeypatch):
    # A machine that runs slow for a while must slow one sample of every op, not every sample
    # of a few: the list is walked `repeats` times, one sample of each op per pass.
    import sys

    from shardwise.profile import measure_specs, plan_specs

    profile_module = sys.modules["shardwise.profile"]
    graph, cluster, plan = data_plan
    specs = plan_specs(graph, cluster, [plan])[:3]
    calls = []

    def one_sample(spec, device, warmup, repeats, min_sample_s):
        assert repeats == 1
        calls.append(spec["signature"])
        slow = 10.0 if len(calls) <= len(specs) else 1.0  # the whole first pass ran slow
        return 1e-3 * slow, 3e-3 * slow, None  # not a selective plan's: no policy timing

    monkeypatch.setattr(profile_module, "_measure_node", one_sample)
    monkeypatch.setattr(profile_module, "_autograd_overhead", lambda *a: 1e-3)
    doc = measure_specs(specs, progress=False, repeats=3)
    order = [s["signature"] for s in specs]
    assert calls == order * 3
    for s in order:
        assert doc["ops"][s] == pytest.approx({"forward": 1e-3, "backward": 2e-3})


def test_an_op_is_timed_after_the_caches_are_flushed_and_its_produced_inputs_read(monkeypatch):
    # In a step, the ops between two uses of a tensor evict it; an activation was just written
    # by its producer. Every sample starts so: the flush, then a read of the activations (in
    # backward, of the output gradients), never of the parameters.
    import sys

    profile_module = sys.modules["shardwise.profile"]
    seen = []
    real = profile_module._flush_caches

    def flush(device, produced=()):
        seen.append([tuple(t.shape) for t in produced])
        real(device, produced)

    monkeypatch.setattr(profile_module, "_flush_caches", flush)
    spec = {"op": "aten::mm", "attrs": {}, "signature": "mm",
            "inputs": [{"shape": [8, 4], "dtype": "f32", "role": "activation"},
                       {"shape": [4, 6], "dtype": "f32", "role": "parameter"}],
            "outputs": [{"shape": [8, 6], "dtype": "f32"}]}
    fwd, bwd, _ = profile_module._measure_node(spec, torch.device("cpu"), 1, 3, 0.0)
    assert fwd > 0 and bwd > 0
    assert seen[:3] == [[(8, 4)]] * 3  # forward: the activation only
    assert seen[3:] == [[(8, 6)]] * 4  # backward (a warm-up and 3 samples): the output gradient


def test_the_optimizer_step_is_timed_cold_and_prices_the_plans_optimizer(tiny, monkeypatch):
    """measure_optimizer times AdamW's step after a cache flush per sample; a profile holding it
    prices a plan's optimizer as the rank's parameter elements x its seconds per element
    (the analytic rule, without it, is another figure)."""
    import sys

    profile_module = sys.modules["shardwise.profile"]  # the module (shardwise.profile is the function)
    flushes = []
    real_flush = profile_module._flush_caches
    monkeypatch.setattr(profile_module, "_flush_caches", lambda device, produced=(): (flushes.append(device),
                                                                                       real_flush(device)))
    step = torch.optim.AdamW.step
    steps = []
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, *a, **k: (steps.append(len(flushes)),
                                                                           step(self, *a, **k))[1])
    measured = profile_module.measure_optimizer(1 << 16, tensors=4, repeats=3)
    assert measured["name"] == "AdamW" and measured["seconds_per_element"] > 0
    assert steps == [0, 1, 2, 3]  # the states made, then each timed step after its own flush
    graph, prof = tiny
    doc = json.loads(prof.to_json())
    doc["optimizer"] = {"name": "AdamW", "seconds_per_element": 1e-6}
    with_optimizer = shardwise.Profile.from_json(json.dumps(doc))
    assert json.loads(with_optimizer.to_json())["optimizer"] == doc["optimizer"]
    cluster = shardwise.Cluster.preset("cpu", nodes=1)
    kw = dict(global_batch=4, micro_batch=4, precision="f32")
    plan = shardwise.Plan.manual(graph, cluster, profile=with_optimizer, **kw)
    elements = sum(math.prod(p.shape) for p in TinyGPT().parameters())
    assert plan.breakdown()["optimizer"] == pytest.approx(elements * 1e-6, rel=1e-9)
    assert "optimizer" in json.loads(prof.to_json())  # shardwise.profile measures it by default
    doc.pop("optimizer")
    without = shardwise.Plan.manual(graph, cluster, profile=shardwise.Profile.from_json(json.dumps(doc)), **kw)
    assert without.breakdown()["optimizer"] == pytest.approx(
        shardwise.Plan.manual(graph, cluster, **kw).breakdown()["optimizer"])  # the analytic rule
