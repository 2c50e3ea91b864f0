"""Expert parallelism against the best plan without it (issue 48), side by side in one run.

transformers' Mixtral (2 layers, hidden 128, 8 experts of 1,024, top 2; default experts,
captured as one op: python/shardwise/_moe_experts.py), float32, trained on Gloo processes of
this machine: each world's plan is the SPMD search on a data axis of that many ranks with the
experts' split allowed (``expert_parallel=True``: the search splits them, each rank holding its
block, its routed tokens sent to their experts' ranks and back by all-to-all) and off (every
rank holds every expert, data parallelism for them). Printed per run: the experts' strategy,
the median step after a warm-up, the peak tensor memory of the largest rank
(benchmarks/_tensor_memory.py), the plan's predicted step, and allowed / off ratios.

    python benchmarks/moe.py [--worlds 2 4] [--steps 3] [--record]

``--at-scale`` plans DeepSeek-V3's shape (transformers' DeepseekV3ForCausalLM: 61 layers, the
first 3 dense, 256 routed experts of 2,048 + 1 shared, top 8 of 8 groups, MLA; bf16, meta
device) at 4,096 tokens and DeepSeek-V3's batch of 15,360 sequences on 2,048 H100s
(dgx-h100 x 256): shardwise.plan's plan (completed as parallelize completes it, so the table
says where its experts are split) beside DeepSeek-V3's own degrees with the experts over each
stage's data ranks (Plan.manual(expert=)): the capture's and the plan's CPU seconds, the
degrees, the predicted step, memory and exposed communication by kind.

    python benchmarks/moe.py --at-scale [--nodes 256] [--record]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VOCAB, ROWS, SEQ = 512, 8, 64


def _model():
    """The Mixtral with its loss (shardwise.models.CausalLMWithLoss), so that the graph the plan
    is searched on is the one parallelize captures."""
    import torch
    import transformers

    from shardwise.models import CausalLMWithLoss

    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(num_hidden_layers=2, hidden_size=128, intermediate_size=1024,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                     max_position_embeddings=SEQ, num_local_experts=8, num_experts_per_tok=2)
    return CausalLMWithLoss(transformers.MixtralForCausalLM(cfg))


def _batch() -> tuple:
    import torch

    ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=torch.Generator().manual_seed(1))
    return ids, torch.roll(ids, -1, dims=1)


def _rank(rank: int, store: str, world: int, allowed: bool, steps: int, out: str) -> None:
    """One rank of a run: the search's plan on a data axis of `world` ranks (experts' split
    allowed or not), a warm-up step, `steps` timed, then one more under the peak counter."""
    import torch
    import torch.distributed as dist

    import shardwise
    from _tensor_memory import live_storages
    from _workers import timed_steps_and_peak

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        model, batch = _model(), _batch()
        graph = shardwise.capture(_model(), batch)
        plan = shardwise.Plan.search(graph, shardwise.Cluster.preset("cpu", world), mesh=(world, 1),
                                     global_batch=ROWS, precision="f32", expert_parallel=allowed)
        before = live_storages()
        engine = shardwise.parallelize(model, batch, plan=plan, verify=False)
        optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-4)
        step_seconds, peak = timed_steps_and_peak(engine, optimizer, batch, steps, before)
        strategy = sorted({" / ".join(v) for k, v in plan.sharding["strategies"].items() if k.startswith("experts")})
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"step": step_seconds, "memory": peak, "strategy": ", ".join(strategy),
                           "predicted": plan.predicted_step_time()}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run(world: int, allowed: bool, steps: int) -> dict:
    import tempfile

    from _workers import spawn_ranks

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        spawn_ranks(_rank, (os.path.join(tmp, "store"), world, allowed, steps, out), world)
        with open(out) as f:
            return json.load(f)


def deepseek_v3_module(seq: int, layers: int = 61):
    """transformers' DeepseekV3ForCausalLM at DeepSeek-V3's published configuration (or with
    `layers` of its layers), bf16, on the meta device."""
    import torch
    import transformers

    cfg = transformers.DeepseekV3Config(
        vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
        num_hidden_layers=layers, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
        n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
        v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4, num_experts_per_tok=8,
        first_k_dense_replace=3, max_position_embeddings=seq, use_cache=False)
    with torch.device("meta"):
        return transformers.DeepseekV3ForCausalLM(cfg).to(torch.bfloat16)


def at_scale(nodes: int, seq: int, global_batch: int, record_results: bool) -> None:
    """DeepSeek-V3's shape on `nodes` DGX H100s, planned with the experts' split allowed and
    off, side by side (the module's docstring)."""
    import time

    import torch

    import shardwise
    from _machine import cpu_model, machine_line

    print(machine_line())
    ids = torch.zeros(2, seq, dtype=torch.long, device="meta")
    start = time.process_time()
    graph = shardwise.capture(deepseek_v3_module(seq), {"input_ids": ids, "labels": ids})
    capture = time.process_time() - start
    cluster = shardwise.Cluster.preset("dgx-h100", nodes=nodes)
    header = ["plan", "degrees", "experts split over", "fits", "predicted step (s)", "TFLOP/s per GPU",
              "memory per GPU (GB)", "exposed communication (s)", "plan CPU (s)"]
    table = []
    def planned(expert_parallel: bool):
        start = time.process_time()
        found = shardwise.plan(graph, cluster, global_batch=global_batch, expert_parallel=expert_parallel)
        seconds = time.process_time() - start
        # The stages' layout as parallelize completes it, on a capture at a micro-batch of the
        # data axis: where its experts are split, and the report that says so.
        rows = found.micro_batch * found.data * found.context
        at_rows = torch.zeros(rows, seq, dtype=torch.long, device="meta")
        capture_at_rows = shardwise.capture(deepseek_v3_module(seq), {"input_ids": at_rows, "labels": at_rows})
        return found.complete(capture_at_rows, cluster), seconds

    searched, seconds = planned(True)
    unsplit, unsplit_seconds = planned(False)
    capacity = cluster.device_of(0)["memory_bytes"] * shardwise._C.MEMORY_FRACTION
    # DeepSeek-V3's own degrees (its report: pipeline 16, no tensor parallelism, experts over
    # the data ranks): plan.expert splits them over a stage's whole data axis, 128 ranks here.
    own = shardwise.Plan.manual(graph, cluster, tensor=1, pipeline=16, expert=cluster.world_size // 16,
                                global_batch=global_batch, micro_batch=1, recompute="full", zero=1)
    for name, plan, cpu in (("shardwise.plan", searched, seconds),
                            ("shardwise.plan, expert_parallel=False", unsplit, unsplit_seconds),
                            ("DeepSeek-V3's degrees", own, None)):
        predicted = plan._doc["predicted"]
        kinds = ("expert_parallel", "tensor_parallel", "context_parallel", "pipeline_p2p", "data_parallel",
                 "zero_broadcast")
        comms = ", ".join(f"{k} {predicted['breakdown'][k]:.2f}" for k in kinds if predicted["breakdown"].get(k))
        degrees = (f"t {plan.tensor} p {plan.pipeline} d {plan.data}" + (f" c {plan.context}" if plan.context > 1 else "")
                   + (f" e {plan.expert}" if plan.expert > 1 else "") + f", micro-batch {plan.micro_batch}, "
                   f"{plan.schedule}" + (f" v {plan.virtual_stages}" if plan.virtual_stages > 1 else "")
                   + f", recompute {plan.recompute}, ZeRO {plan.zero_stage}")
        strategies = (plan.stage_sharding or {}).get("strategies", {})
        tensor_split = any(k.startswith("experts") and v[1:] == ["split e"] for k, v in strategies.items())
        where = (f"{plan.expert} data ranks" if plan.expert > 1 else f"{plan.tensor} tensor ranks" if tensor_split
                 else "none")
        fits = predicted["memory_per_rank"] <= capacity  # the planners' bound: memory_fraction of the device
        table.append([name, degrees, where, "yes" if fits else "no", predicted["step_time"],
                      predicted["tflops_per_device"], predicted["memory_per_rank"] / 1e9, comms, cpu])
        print(plan.report(), flush=True)
    print(f"\nDeepSeek-V3 shape (61 layers, {graph.num_parameters() / 1e9:.0f}B parameters), {seq} tokens x "
          f"{global_batch} sequences, dgx-h100 x{nodes} ({8 * nodes} GPUs); capture {capture:.2f} s CPU")
    print("| " + " | ".join(header) + " |\n|" + " --- |" * len(header))
    for row in table:
        cpu = "-" if row[8] is None else f"{row[8]:.2f}"
        print(f"| {row[0]} | {row[1]} | {row[2]} | {row[3]} | {row[4]:.2f} | {row[5]:.1f} | {row[6]:.1f} | {row[7]} | "
              f"{cpu} |")
    if record_results:
        from _results import record

        record("moe_at_scale", table, {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}",
            "columns": header,
            "formats": {"predicted step (s)": ".2f", "TFLOP/s per GPU": ".1f", "memory per GPU (GB)": ".1f",
                        "plan CPU (s)": ".2f"},
            "notes": f"DeepSeek-V3 shape (transformers DeepseekV3ForCausalLM, 61 layers, "
                     f"{graph.num_parameters() / 1e9:.0f}B parameters, bf16, meta device) at {seq} tokens, "
                     f"{global_batch} sequences a step, dgx-h100 x{nodes}: shardwise.plan (its stages' layout "
                     "completed on a capture at its micro-batch, as parallelize does: where the experts are split), "
                     "the same with the experts' split off (expert_parallel=False), "
                     "beside Plan.manual at DeepSeek-V3's degrees with the experts over each stage's data ranks; "
                     f"fits: within {shardwise._C.MEMORY_FRACTION:.0%} of a device's memory, the planners' bound; "
                     f"capture {capture:.2f} s CPU. Exposed communication: the plan's seconds by kind "
                     "(expert_parallel: the experts' all-to-all dispatch and combine, inside compute). "
                     "Predictions of the analytic model, not measurements."})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--record", action="store_true", help="write benchmarks/results/moe_train.json (moe_at_scale.json)")
    ap.add_argument("--at-scale", action="store_true", help="plan DeepSeek-V3's shape on 2,048 H100s instead")
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--global-batch", type=int, default=15360)
    args = ap.parse_args()
    if args.at_scale:
        at_scale(args.nodes, args.seq, args.global_batch, args.record)
        return
    from _machine import machine_line

    print(machine_line())
    header = ["processes", "expert parallelism", "experts' strategy", "step (s)", "peak MB per rank",
              "predicted step (s)", "allowed / off: step", "allowed / off: memory"]
    table = []
    for world in args.worlds:
        runs = {allowed: _run(world, allowed, args.steps) for allowed in (True, False)}
        without = runs[False]
        for allowed, r in runs.items():
            row = [world, "allowed" if allowed else "off", r["strategy"], r["step"], r["memory"] / 1e6,
                   r["predicted"], r["step"] / without["step"] if allowed else None,
                   r["memory"] / without["memory"] if allowed else None]
            table.append(row)
            print(f"  {world} processes, expert parallelism {row[1]}: experts {row[2]}, step {row[3]:.3f} s, peak "
                  f"{row[4]:.1f} MB a rank", flush=True)
    print(f"\nMixtral (2 layers, hidden 128, 8 experts of 1,024, top 2), float32, {ROWS} x {SEQ} tokens, AdamW")
    print("| " + " | ".join(header) + " |\n|" + " --- |" * len(header))
    for row in table:
        cells = [f"{c:.3f}" if isinstance(c, float) else ("-" if c is None else str(c)) for c in row]
        print("| " + " | ".join(cells) + " |")
    if args.record:
        import torch

        from _machine import cpu_model
        from _results import record

        record("moe_train", table, {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}",
            "columns": header,
            "formats": {"step (s)": ".3f", "peak MB per rank": ".1f", "predicted step (s)": ".4f",
                        "allowed / off: step": ".2f", "allowed / off: memory": ".2f"},
            "notes": f"transformers Mixtral (2 layers, hidden 128, 8 experts of 1,024, top 2, vocabulary {VOCAB}), "
                     f"float32, {ROWS} x {SEQ} tokens, Gloo processes on this machine's cores; each world's plan: "
                     "Plan.search on a data axis of that many ranks, the experts' split allowed or not "
                     "(expert_parallel=False); median of the timed steps after a warm-up, peak tensor memory of the "
                     "largest rank (benchmarks/_tensor_memory.py)."})


if __name__ == "__main__":
    main()
