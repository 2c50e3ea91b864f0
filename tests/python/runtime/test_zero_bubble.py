"""ZB-H1 (zero bubble) run by the pipeline engine: each stage's backward split into B (the
input gradient the stage before waits for) and W (the weight gradient), W run later as the
schedule places it (csrc/schedule/schedules.h; the split is the core's,
csrc/transform/weight_gradient_split.h, run by runtime/weight_split.py).

On real Gloo processes against one device, float64, 1e-9 relative: Hugging Face GPT-2 (a
tied LM head across the first and last stage, t + addmm linears, layer norms, a positional
embedding of constant positions) and the two-branch model (a skip around two branches), on 2
and 4 stages. Besides the numbers, the split itself: no parameter gradient accumulates during
any B, all of them during the W actions, the engine ran one W per (stage, micro-batch), and B
and W together count the fused backward's FLOPs (torch's FlopCounterMode), W about half.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import shardwise
from conftest import TwoBranch, finish_rank, parameter_error, spawn_reports
from rank_ir_check import engine_against_rank_ir
from shardwise.models import CausalLMWithLoss
from shardwise.runtime import pipeline_engine
from torch.utils.flop_counter import FlopCounterMode

transformers = pytest.importorskip("transformers")

STEPS, ROWS, MICRO, TOLERANCE = 3, 8, 2, 1e-9
V_SHAPED = ("zb-v", "dualpipe-v")  # two chunks per rank in a V


class TwoBranchWithLoss(nn.Module):
    """conftest's two-branch model and its loss in one module."""

    def __init__(self):
        super().__init__()
        self.model = TwoBranch()

    def forward(self, x, target):
        return F.cross_entropy(self.model(x), target)


class WeightAcrossStages(nn.Module):
    """A value made of weights only (the gain, doubled) before the first layer and read after
    the last: the stage that makes it sends it on, a weight output whose gradient comes back
    from the next stage and goes to the gain in W."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, 32))
        self.inp = nn.Linear(16, 32)
        self.mid = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, 8)

    def forward(self, x, target):
        gain = self.gain * 2
        return F.cross_entropy(self.head(self.mid(self.inp(x)) * gain), target)


def _model(case: str) -> nn.Module:
    torch.manual_seed(0)
    if case == "weight_across":
        return WeightAcrossStages().double()
    if case == "gpt2":
        return CausalLMWithLoss(transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=8, n_embd=32, n_head=4, vocab_size=64, n_positions=16, resid_pdrop=0, embd_pdrop=0,
            attn_pdrop=0))).double()
    return TwoBranchWithLoss().double()


def _batch(case: str, step: int):
    g = torch.Generator().manual_seed(step)
    if case == "gpt2":
        ids = torch.randint(0, 64, (ROWS, 16), generator=g)
        return ids, torch.roll(ids, -1, dims=1)
    return torch.randn(ROWS, 16, generator=g, dtype=torch.float64), torch.randint(0, 8, (ROWS,), generator=g)


def _micro(schedule: str) -> int:
    """Rows per micro-batch: DualPipeV needs a micro-batch per stage at least (8 on 4 ranks)."""
    return 1 if schedule == "dualpipe-v" else MICRO


def _plan(stages: int, schedule: str = "zb-h1") -> shardwise.Plan:
    return shardwise.Plan.from_json(json.dumps({
        "format": "shardwise.plan", "version": 1, "data": 1, "tensor": 1, "pipeline": stages, "global_batch": ROWS,
        "micro_batch": _micro(schedule), "schedule": schedule, "virtual_stages": 2 if schedule in V_SHAPED else 1,
        "kfkb_k": 1,
        "recompute": "none", "zero_stage": 0, "layers_per_stage": [], "precision": "f32"}))


def _worker(rank: int, world: int, store: str, result: str, case: str, schedule: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    real_isend, real_irecv = pipeline_engine.transport.isend, pipeline_engine.transport.irecv
    try:
        # Which part of backward is running when a parameter's gradient accumulates.
        phase = {"now": "forward"}
        accumulated = {"B": 0, "W": 0, "BW": 0, "other": 0}
        real_input, real_weight = pipeline_engine.backward_input, pipeline_engine.backward_weight
        real_full = pipeline_engine.full_backward

        flops = {"B": 0, "W": 0, "BW": 0}

        def counted(name, fn):
            def run(*args, **kwargs):
                phase["now"] = name
                try:
                    with FlopCounterMode(display=False) as counter:
                        out = fn(*args, **kwargs)
                    flops[name] += counter.get_total_flops()
                    return out
                finally:
                    phase["now"] = "forward"
            return run

        pipeline_engine.backward_input = counted("B", real_input)
        pipeline_engine.backward_weight = counted("W", real_weight)
        pipeline_engine.full_backward = counted("BW", real_full)  # a B whose W comes next: not split at all
        # Every send and receive between stages: its tag and its group's ranks (a channel of its own per
        # way and kind, tag 0: receives meet sends by order, as on NCCL).
        p2p = set()

        def recorded(fn):
            def call(tensor, *args, group=None, tag=0, **kwargs):
                p2p.add((tag, group.group_name, tuple(dist.get_process_group_ranks(group))) if group is not None
                        else (tag, "default", ()))
                return fn(tensor, *args, group=group, tag=tag, **kwargs)
            return call

        pipeline_engine.transport.isend, pipeline_engine.transport.irecv = recorded(real_isend), recorded(real_irecv)
        model = _model(case)
        engine = shardwise.parallelize(model, _batch(case, 0), plan=_plan(world, schedule))

        def count(_parameter):
            accumulated[phase["now"] if phase["now"] in accumulated else "other"] += 1

        for p in engine.parameters():
            p.register_post_accumulate_grad_hook(count)
        optimizer = torch.optim.AdamW(engine.parameters(), lr=1e-2)
        reference = _model(case)
        ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
        losses, ref_losses, ref_flops = [], [], 0
        for step in range(STEPS):
            batch = _batch(case, step)
            losses.append(float(engine.train_step(*batch)))
            optimizer.step()
            optimizer.zero_grad()
            loss = reference(*batch)
            with FlopCounterMode(display=False) as counter:
                loss.backward()
            ref_flops += counter.get_total_flops()
            ref_optimizer.step()
            ref_optimizer.zero_grad()
            ref_losses.append(loss.item())
        # Forward only (eval): the stages in order, ZB-V's turn handed on within rank p - 1.
        batch = _batch(case, STEPS)
        eval_loss = float(engine.eval_step(*batch))
        with torch.no_grad():
            ref_eval = reference(*batch).item()
        state = engine.full_state_dict()
        kinds = [a[0] for a in engine._actions]
        report = {"rank": rank, "eval": [eval_loss, ref_eval], "flops": flops, "ref_flops": ref_flops,
                  "losses": losses, "ref_losses": ref_losses, "accumulated": accumulated,
                  "W": kinds.count("W"), "B": kinds.count("B"), "stages": sorted(engine._stages),
                  "micro_batches": engine._m, "code": engine.code, "error": parameter_error(state, reference),
                  "weight_outputs": sum(len(s["weight_outputs"]) for s in engine._stages.values()),
                  # Each stage's program against its rank IR: its B/W cuts and fused
                  # accumulations where the stage passes marked them (rank_ir_check.py).
                  "lowered": engine_against_rank_ir(engine), "stage_irs": list(engine.stage_rank_irs.values()),
                  "p2p": sorted([tag, name, list(ranks)] for tag, name, ranks in p2p)}
        finish_rank(result, rank, report)
    finally:
        pipeline_engine.transport.isend, pipeline_engine.transport.irecv = real_isend, real_irecv
        dist.destroy_process_group()


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-v", "dualpipe-v"])
@pytest.mark.parametrize("case,stages", [("gpt2", 2), ("gpt2", 4), ("two_branch", 2), ("two_branch", 4),
                                         ("weight_across", 2)])
@pytest.mark.slow
def test_zero_bubble_splits_backward_and_trains_as_one_device(case, stages, schedule):
    reports = spawn_reports(_worker, stages, case, schedule)
    if case == "weight_across":  # the gain's double is sent on: the weight-output path ran
        assert sum(r["weight_outputs"] for r in reports) > 0, reports
    for r in reports:
        m = r["micro_batches"]
        assert m == ROWS // _micro(schedule)
        assert r["W"] == r["B"] == m * len(r["stages"]), r  # one W per (stage, micro-batch)
        # The V (ZB-V, DualPipeV): rank r holds stages r and 2p - 1 - r (the last beside the first on rank 0).
        assert r["stages"] == ([r["rank"], 2 * stages - 1 - r["rank"]] if schedule in V_SHAPED else [r["rank"]]), r
        assert "weight_split.cut" in r["code"] and "weight_split.site" in r["code"], r["code"]
        assert r["lowered"]["calls"] > 0 and not r["lowered"]["mismatches"], r["lowered"]
        assert "shardwise.weight_cut" in "".join(r["stage_irs"]), r["stage_irs"]
        # The split is real: every parameter gradient accumulates in W (or in a B whose W comes
        # next, run as one: BW), none in a split B or elsewhere.
        assert r["accumulated"]["B"] == 0 and r["accumulated"]["other"] == 0, r["accumulated"]
        assert r["accumulated"]["W"] + r["accumulated"]["BW"] > 0, r["accumulated"]
        # Its sends and receives: tag 0 on two-rank groups, this rank's with each neighbour (ZB-V's and
        # DualPipeV's V: both ways on each link, one group per way and kind).
        neighbours = {n for n in (r["rank"] - 1, r["rank"] + 1) if 0 <= n < stages}
        assert {tag for tag, _, _ in r["p2p"]} == {0}, r["p2p"]
        assert {tuple(ranks) for _, _, ranks in r["p2p"]} == {tuple(sorted((r["rank"], n))) for n in neighbours}, r
        assert len(r["p2p"]) == (4 if schedule in V_SHAPED else 2) * len(neighbours), r["p2p"]
    # B, W and the fused BW together do the fused backward's products, none twice; W does the
    # weight half of the split ones.
    b, w, bw = (sum(r["flops"][k] for r in reports) for k in ("B", "W", "BW"))
    fused = reports[0]["ref_flops"]
    print(f"{schedule} {case} on {stages} stages: backward FLOPs B {b:.3g} + W {w:.3g} + BW {bw:.3g} = "
          f"{(b + w + bw) / fused:.4f} x fused")
    assert abs(b + w + bw - fused) <= 1e-6 * fused, (b, w, bw, fused)
    assert w > 0 and 0.3 * (fused - bw) < w < 0.7 * (fused - bw), (b, w, bw, fused)
    if schedule == "dualpipe-v":  # its steady phase's full backwards
        assert bw > 0, (b, w, bw)
    r = reports[0]
    errors = [abs(a - b) / abs(b) for a, b in zip(r["losses"], r["ref_losses"])]
    print(f"{schedule} {case} on {stages} stages: losses within {max(errors):.1e}, parameters {r['error']:.1e}")
    assert max(errors) <= TOLERANCE, (r["losses"], r["ref_losses"])
    assert abs(r["eval"][0] - r["eval"][1]) <= TOLERANCE * abs(r["eval"][1]), r["eval"]
    assert r["error"] < TOLERANCE, r["error"]


def test_zero_bubble_refuses_a_plan_with_recomputation():
    doc = json.loads(_plan(2).to_json())
    doc["recompute"] = "full"
    with pytest.raises(shardwise.ValidationError, match="zb-h1 with recomputation"):
        shardwise.Plan.from_json(json.dumps(doc))


def test_dualpipe_v_runs_torchs_order():
    """Our DualPipeV (csrc/schedule/schedules.h) computes in the order torch's
    ScheduleDualPipeV plans, on every rank: its F, its B (input gradient) and W, a full
    backward as B then W, an overlapped pair as its forward then its full backward."""
    from torch.distributed.pipelining import schedules as S

    from shardwise import _C

    def torch_order(p: int, m: int, rank: int) -> list:
        schedule = S.ScheduleDualPipeV.__new__(S.ScheduleDualPipeV)  # the order alone: no stages, no group
        schedule.pp_group_size, schedule._n_microbatches = p, m
        kinds = {S.FORWARD: ("F",), S.BACKWARD_INPUT: ("B",), S.BACKWARD_WEIGHT: ("W",), S.FULL_BACKWARD: ("B", "W")}
        out = []
        for action in schedule._calculate_single_rank_operations(rank):
            for a in action.sub_actions or (action,):
                out += [(k, a.stage_index, a.microbatch_index) for k in kinds[a.computation_type]]
        return out

    for p, m in ((1, 2), (2, 4), (2, 7), (4, 8), (4, 11), (8, 16)):
        schedule = _C.simulate_schedule("dualpipe-v", p, m)
        for rank in range(p):
            ours = [(k, g, i) for k, i, g, _ in schedule.action_list(rank) if k in ("F", "B", "W")]
            assert ours == torch_order(p, m, rank), (p, m, rank)


def test_zb_v_runs_torchs_order_from_two_micro_batches_a_stage():
    """Our ZB-V computes in the order torch's ScheduleZBVZeroBubble plans once there are 2p
    micro-batches or more (schedules.h: below that torch pads to 2p - 1 and idles, and ours
    runs its own list schedule, 13.5 units against 15 at p = 4, m = 4)."""
    from torch.distributed.pipelining import schedules as S

    from shardwise import _C

    def torch_order(p: int, m: int, rank: int) -> list:
        schedule = S.ScheduleZBVZeroBubble.__new__(S.ScheduleZBVZeroBubble)  # the order alone: no stages, no group
        schedule.pp_group_size, schedule._n_microbatches, schedule.num_stages = p, m, 2 * p
        kinds = {S.FORWARD: "F", S.BACKWARD_INPUT: "B", S.BACKWARD_WEIGHT: "W"}
        return [(kinds[a.computation_type], a.stage_index, a.microbatch_index)
                for a in schedule._calculate_single_rank_operations(rank) if a is not None]

    for p, m in ((1, 2), (2, 4), (2, 7), (4, 8), (4, 11), (8, 16)):
        schedule = _C.simulate_schedule("zb-v", p, m, virtual_stages=2)
        for rank in range(p):
            ours = [(k, g, i) for k, i, g, _ in schedule.action_list(rank) if k in ("F", "B", "W")]
            assert ours == torch_order(p, m, rank), (p, m, rank)
    # Fewer: the list schedule, at the bound 3m + (p - 1)(F + B - W) / 2 (unit chunk times),
    # where torch's padded order takes 15.
    assert _C.simulate_schedule("zb-v", 4, 4, virtual_stages=2).step_time == 13.5
