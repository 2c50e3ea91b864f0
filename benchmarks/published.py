"""Published 2024-2026 H100 training runs against shardwise's evaluator (issue 46, item 6).

Two sets of rows, kept apart (docs/cost-model.md, "Calibration on published runs"):

- CALIBRATION: Megatron-Bridge's performance summary, DGX-H100 dense Llama rows
  (docs/performance-summary.md and its archive, NeMo containers 25.09, 25.11, 26.02). A
  constant may be fitted on these rows and on nothing else.
- CHECK, never fitted on: torchtitan's H100 benchmarks of 2024-12
  (benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3: eager FSDP) and the Llama 3
  paper's Table 4 (Grattafiori et al. 2024, 405B on 8,192 and 16,384 H100s, BF16).

For every row: the published configuration is priced with ``Plan.manual`` on the dgx-h100
preset (the graph is transformers' LlamaForCausalLM at the row's size, built on the meta
device and captured), giving predicted tokens per second per GPU and memory per GPU; then
``shardwise.plan`` searches the same cluster, batch and sequence and its plan is priced the
same way, with its CPU seconds. Ratios are predicted / published. Never fails.

Rows the runtime cannot express are listed with the reason and not priced (context
parallelism beside data parallelism: ``plan.context`` runs with data 1 only, issue 48).

    python benchmarks/published.py [--rows calibration|check|all] [--no-search] [--record]
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import shardwise

# Llama 3 / 3.1 sizes (the models' config.json): layers, hidden, heads, kv heads, ffn.
LLAMA3 = {
    "8B": (32, 4096, 32, 8, 14336),
    "70B": (80, 8192, 64, 8, 28672),
    "405B": (126, 16384, 128, 8, 53248),
}
VOCAB = 128256
GB = 1e9
GIB = 1024 ** 3


@dataclass
class Row:
    """One published measurement and the configuration it ran."""
    source: str                 # where the figure is published
    model: str                  # key of LLAMA3
    gpus: int
    precision: str              # "fp8" or "bf16"
    global_batch: int           # sequences
    micro_batch: int
    seq: int
    tensor: int = 1
    pipeline: int = 1
    virtual_stages: int = 1
    zero: int = 0               # 3: FSDP / ZeRO-3 over the data ranks
    recompute: str = "none"     # "none", "full", "selective"
    recompute_layers: int | None = None  # Megatron's recompute_num_layers: that many layers fully recomputed
    context: int = 1            # context-parallel degree (plan.context: with data 1 only)
    tokens_per_gpu: float | None = None   # published tokens / s / GPU
    tflops_per_gpu: float | None = None   # published model TFLOP/s / GPU (the source's accounting)
    memory_gib: float | None = None       # published peak memory per GPU
    device: str = "h100-sxm5-80gb"
    # Priced as a compiled plan (Plan.manual's compile: memory-bound ops fused, an FP8 linear's
    # casts too where its weight is whole on the rank): the runs that use fused kernels
    # (Megatron-Bridge's Transformer Engine), the nearest this runtime runs being torch.compile.
    compile: bool = False
    # The tensor-parallel collectives run inside their products (Megatron's tp_comm_overlap,
    # Transformer Engine's userbuffers): priced as the runtime's collective matmuls
    # (Plan.manual's collective_matmul), the stages' layout searched with them.
    collective_matmul: bool = False
    choose: bool = False        # the source leaves v and recomputation out: price_unpublished picks
    notes: list[str] = field(default_factory=list)

    @property
    def data(self) -> int:
        return self.gpus // (self.tensor * self.pipeline * self.context)

    @property
    def label(self) -> str:
        return f"{self.source} {self.model} {self.gpus} {self.precision}"


MB = "Megatron-Bridge"
CALIBRATION = [
    # DGX-H100, FP8 current scaling; 8B: FSDP over 8, MBS 1, GA 16, recompute_num_layers 5 (the
    # H100 FP8-CS recipe, llama3_workload_base_configs.py).
    Row(f"{MB} 25.11", "8B", 8, "fp8", 128, 1, 8192, zero=3, recompute_layers=5, tokens_per_gpu=14451,
        tflops_per_gpu=744, compile=True),
    Row(f"{MB} 25.09", "8B", 8, "fp8", 128, 1, 8192, zero=3, recompute_layers=5, tokens_per_gpu=14079,
        tflops_per_gpu=725, compile=True),
    # 70B: TP 4, PP 8, VP 5, DP 2, MBS 1; TP communication overlap (llama3_llm_pretrain.py's
    # llama3_70b_h100_config: tp_comm_overlap_cfg userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192).
    Row(f"{MB} 25.11", "70B", 64, "fp8", 128, 1, 8192, tensor=4, pipeline=8, virtual_stages=5,
        tokens_per_gpu=1602, tflops_per_gpu=719, compile=True, collective_matmul=True),
    Row(f"{MB} 25.09", "70B", 64, "fp8", 128, 1, 8192, tensor=4, pipeline=8, virtual_stages=5,
        tokens_per_gpu=1619, tflops_per_gpu=727, compile=True, collective_matmul=True),
    Row(f"{MB} 26.02", "70B", 64, "fp8", 256, 1, 8192, tensor=4, pipeline=8, virtual_stages=5,
        tokens_per_gpu=1621, tflops_per_gpu=728, compile=True, collective_matmul=True),
    # 405B: TP 8, PP 8, CP 2, VP 8 (TP communication overlap, as 70B's).
    Row(f"{MB} 25.11", "405B", 1024, "fp8", 512, 1, 8192, tensor=8, pipeline=8, virtual_stages=8, context=2,
        tokens_per_gpu=292, tflops_per_gpu=737, compile=True, collective_matmul=True),
]

TT = "torchtitan 2024-12"
# torchtitan's H100s: 96 GB HBM2e, 2.4 TB/s, 500 W (the benchmark's "Hardware" section).
TT_DEVICE = "h100-96gb-hbm2e"
LLAMA3_PAPER = "Llama 3 paper T4"
CHECK = [
    Row(f"{TT} T1", "8B", 8, "bf16", 16, 2, 8192, zero=3, recompute="selective", tokens_per_gpu=5762,
        memory_gib=82.4, device=TT_DEVICE),
    Row(f"{TT} T3", "8B", 128, "bf16", 256, 2, 8192, zero=3, recompute="selective", tokens_per_gpu=5605,
        memory_gib=67.0, device=TT_DEVICE),
    # Table 4: TP 8, CP 1, PP 16, 16M tokens per batch (2048 sequences of 8192), BF16 TFLOP/s per GPU.
    # Section 3.3.2: FSDP that keeps the weights after the forward (ZeRO-2 here), micro-batch 1 (the
    # table's "batch size per DP" is micro-batches). Interleaving and recomputation are not in the
    # table: price_unpublished picks them.
    Row(LLAMA3_PAPER, "405B", 8192, "bf16", 2048, 1, 8192, tensor=8, pipeline=16, zero=2,
        choose=True, tflops_per_gpu=430),
    Row(LLAMA3_PAPER, "405B", 16384, "bf16", 2048, 1, 8192, tensor=8, pipeline=16, zero=2, choose=True,
        tflops_per_gpu=400),
    Row(LLAMA3_PAPER, "405B", 16384, "bf16", 2048, 1, 131072, tensor=8, pipeline=16, context=16,
        tflops_per_gpu=380),
]


def llama_module(model: str, seq: int, layers: int | None = None):
    """transformers' LlamaForCausalLM at the published size (or with `layers` of its layers),
    bf16, on the meta device, for sequences of `seq` tokens."""
    import torch
    import transformers

    depth, hidden, heads, kv, ffn = LLAMA3[model]
    cfg = transformers.LlamaConfig(hidden_size=hidden, num_hidden_layers=layers or depth, num_attention_heads=heads,
                                   num_key_value_heads=kv, intermediate_size=ffn, vocab_size=VOCAB,
                                   max_position_embeddings=seq, rope_theta=500000.0, use_cache=False)
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)


def llama_graph(model: str, seq: int, cache: dict):
    """llama_module captured at two sequences of `seq` tokens (every planner scales the batch)."""
    key = (model, seq)
    if key not in cache:
        import torch

        module = llama_module(model, seq)
        ids = torch.zeros(2, seq, dtype=torch.long, device="meta")  # the SPMD search needs a batch >= 2
        cache[key] = shardwise.capture(module, {"input_ids": ids, "labels": ids})
    return cache[key]


def cluster_for(row: Row):
    """The dgx-h100 preset with enough nodes; torchtitan's 96 GB HBM2e parts as their own device."""
    import json

    cluster = shardwise.Cluster.preset("dgx-h100", nodes=max(1, row.gpus // 8))
    if row.device == "h100-sxm5-80gb":
        return cluster
    doc = json.loads(cluster.to_json())
    device = dict(doc["device_types"][0], name=row.device, memory_bytes=96 * GIB, memory_bandwidth=2.4e12)
    doc["device_types"] = [device]
    for node in doc["nodes"]:
        node["device"] = row.device
    doc["name"] = f"torchtitan's H100 96GB x{max(1, row.gpus // 8)} (dgx-h100 links; peaks as SXM)"
    return shardwise.Cluster.from_json(json.dumps(doc))


def memory_of(cluster) -> float:
    """Bytes of memory per GPU of the row's cluster (one device type: cluster_for's)."""
    import json

    return float(json.loads(cluster.to_json())["device_types"][0]["memory_bytes"])


def as_run(graph, cluster, plan):
    """A pipelined tensor-parallel plan priced with the layout its stages run: ``Plan.complete``
    (what ``parallelize`` does with it first) searches the stages' {data, tensor} layout under
    the first stage's memory and prices the plan with it, sequence parallelism included, where
    ``Plan.manual`` prices Megatron's layout without it. It applies where the graph was
    captured at one micro-batch of the data axis (the 70B rows: 1 x 2 rows); elsewhere the
    plan is as ``Plan.manual`` priced it."""
    if plan.pipeline > 1 and plan.tensor > 1:
        return plan.complete(graph, cluster)
    return plan


def price(graph, cluster, row: Row) -> dict:
    """The published configuration priced: step, tokens/s/GPU, memory per GPU. A Megatron
    recompute_num_layers of k of L layers is priced as none + k/L of (full - none), in time
    and in memory alike (the runtime recomputes every repeated block or none, so the plan
    itself cannot say k of L)."""
    common = dict(tensor=row.tensor, pipeline=row.pipeline, data=row.data, context=row.context,
                  global_batch=row.global_batch,
                  micro_batch=row.micro_batch, zero=row.zero, precision=row.precision,
                  schedule="interleaved-1f1b" if row.virtual_stages > 1 else "1f1b",
                  virtual_stages=row.virtual_stages, compile=row.compile,
                  collective_matmul=row.collective_matmul)
    if row.recompute_layers is None:
        plan = as_run(graph, cluster, shardwise.Plan.manual(graph, cluster, recompute=row.recompute, **common))
        step, memory = plan.predicted_step_time(), plan.predicted_memory()[0]
    else:
        layers = LLAMA3[row.model][0]
        kept = as_run(graph, cluster, shardwise.Plan.manual(graph, cluster, recompute="none", **common))
        full = as_run(graph, cluster, shardwise.Plan.manual(graph, cluster, recompute="full", **common))
        share = row.recompute_layers / layers
        step = kept.predicted_step_time() + share * (full.predicted_step_time() - kept.predicted_step_time())
        memory = kept.predicted_memory()[0] - share * (kept.predicted_memory()[0] - full.predicted_memory()[0])
        plan = kept
    tokens = row.global_batch * row.seq / step / row.gpus
    return {"plan": plan, "step": step, "tokens": tokens, "memory": memory,
            "tflops": plan.predicted_tflops_per_device() * plan.predicted_step_time() / step}


def price_unpublished(graph, cluster, row: Row, capacity: float) -> dict:
    """A row whose source leaves the schedule and recomputation out (the Llama 3 paper's
    Table 4): the best predicted of 1F1B or interleaved 1F1B (v in 2, 3, 4, 6, 8) and
    recompute none, selective or full among those that fit in `capacity`; the best of all
    when none fits. The rule is megatron.py's for Table 1's missing micro-batch and v."""
    best = None
    for v in (1, 2, 3, 4, 6, 8) if row.pipeline > 1 else (1,):
        for recompute in ("none", "selective", "full"):
            candidate = Row(**{**row.__dict__, "virtual_stages": v, "recompute": recompute, "choose": False})
            try:
                priced = price(graph, cluster, candidate)
            except shardwise.ValidationError:
                continue
            key = (priced["memory"] <= capacity, -priced["step"])
            if best is None or key > best[0]:
                best = (key, priced, candidate)
    if best is None:
        raise shardwise.ValidationError(f"{row.label}: no schedule or recomputation prices")
    return {**best[1], "chosen": f"v{best[2].virtual_stages} rc {best[2].recompute}"}


def search(graph, cluster, row: Row) -> dict:
    """shardwise.plan on the same cluster, batch and sequence: its plan, tokens/s/GPU, CPU s."""
    cpu, wall = time.process_time(), time.perf_counter()
    plan = shardwise.plan(graph, cluster, global_batch=row.global_batch, precision=row.precision,
                          compile=row.compile, collective_matmul=row.collective_matmul)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    step = plan.predicted_step_time()
    return {"plan": plan, "tokens": row.global_batch * row.seq / step / row.gpus, "cpu": cpu, "wall": wall,
            "memory": plan.predicted_memory()[0], "fits": plan.fits}


def describe(plan) -> str:
    parts = [f"t{plan.tensor} p{plan.pipeline} d{plan.data}" + (f" cp{plan.context}" if plan.context > 1 else "")]
    if plan.pipeline > 1:
        parts.append(f"{plan.schedule} v{plan.virtual_stages}")
    parts.append(f"mb {plan.micro_batch} rc {plan.recompute} z{plan.zero_stage} {plan.precision}"
                 + (" compiled" if plan.compile else "") + (" tp-overlap" if plan.collective_matmul else ""))
    return " ".join(parts)


def published_ratio(row: Row, priced: dict) -> tuple[str, float]:
    """(what was compared, predicted / published): tokens/s where published, else TFLOP/s."""
    if row.tokens_per_gpu:
        return "tok/s", priced["tokens"] / row.tokens_per_gpu
    return "TFLOP/s", priced["tflops"] / row.tflops_per_gpu


def run_rows(rows: list[Row], kind: str, with_search: bool, cache: dict) -> list[dict]:
    out = []
    for row in rows:
        base = {"set": kind, "source": row.source, "model": row.model, "GPUs": row.gpus, "precision": row.precision,
                "config": (f"t{row.tensor} p{row.pipeline} v{'?' if row.choose else row.virtual_stages} d{row.data} "
                           f"cp{row.context} mb{row.micro_batch} B{row.global_batch} s{row.seq} z{row.zero} "
                           + (f"rc {row.recompute_layers}/{LLAMA3[row.model][0]} layers" if row.recompute_layers
                              else "rc ?" if row.choose else f"rc {row.recompute}")
                           + (" compiled" if row.compile else "")
                           + (" tp-overlap" if row.collective_matmul else "")),
                "published": row.tokens_per_gpu or row.tflops_per_gpu,
                "unit": "tok/s" if row.tokens_per_gpu else "TFLOP/s"}
        if row.context > 1 and row.data > 1:
            note = "context parallelism beside data parallelism: plan.context runs with data 1 only (issue 48); not priced"
            out.append({**base, "note": note})
            print(f"{row.label:<40} {base['config']}: not priced ({note})", flush=True)
            continue
        graph = llama_graph(row.model, row.seq, cache)
        cluster = cluster_for(row)
        capacity = memory_of(cluster)
        priced = price_unpublished(graph, cluster, row, capacity) if row.choose else price(graph, cluster, row)
        if priced.get("chosen"):
            base["config"] += f" (chosen: {priced['chosen']})"
        unit, ratio = published_ratio(row, priced)
        predicted = priced["tokens"] if unit == "tok/s" else priced["tflops"]
        result = {**base, "predicted": predicted, "ratio": ratio, "memory GB": priced["memory"] / GB,
                  "fits": priced["memory"] <= capacity,
                  "memory ratio": (priced["memory"] / (row.memory_gib * GIB)) if row.memory_gib else None}
        print(f"{row.label:<40} {base['config']}: published {base['published']:g} {unit}, predicted "
              f"{predicted:.0f} ({ratio:.2f}x), memory {priced['memory'] / GB:.1f} GB"
              + (f" (published {row.memory_gib} GiB)" if row.memory_gib else ""), flush=True)
        if with_search:
            found = search(graph, cluster, row)
            found_unit = found["tokens"] / row.tokens_per_gpu if unit == "tok/s" else (
                found["plan"].predicted_tflops_per_device() / row.tflops_per_gpu)
            result.update({"search": describe(found["plan"]), "search ratio": found_unit,
                           "search CPU s": found["cpu"], "search fits": bool(found["fits"])})
            print(f"{'':<40} shardwise.plan: {describe(found['plan'])}: {found_unit:.2f}x published, "
                  f"{found['cpu']:.1f} s CPU, memory {found['memory'] / GB:.1f} GB", flush=True)
        out.append(result)
    return out


def summary(results: list[dict], kind: str) -> str:
    priced = [r for r in results if r["set"] == kind and r.get("ratio") is not None]
    if not priced:
        return f"{kind}: no rows priced"
    within = sum(1 for r in priced if abs(r["ratio"] - 1) <= 0.10)
    fits = sum(1 for r in priced if r["fits"])
    text = (f"{kind}: {within} of {len(priced)} priced rows within +-10% "
            f"(ratios {min(r['ratio'] for r in priced):.2f} to {max(r['ratio'] for r in priced):.2f}); "
            f"{fits} of {len(priced)} predicted to fit")
    searched = [r for r in priced if r.get("search ratio") is not None]
    if searched:
        better = sum(1 for r in searched if r["search ratio"] >= 1.05 * r["ratio"])
        text += (f"; shardwise.plan >= 1.05x the published configuration's prediction on {better} of "
                 f"{len(searched)}, CPU {min(r['search CPU s'] for r in searched):.1f} to "
                 f"{max(r['search CPU s'] for r in searched):.1f} s")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", choices=("calibration", "check", "all"), default="all")
    ap.add_argument("--no-search", action="store_true", help="price the published configurations only")
    from _results import add_record_argument, record

    add_record_argument(ap)
    args = ap.parse_args()
    cache: dict = {}
    results = []
    if args.rows in ("calibration", "all"):
        print("Calibration rows (Megatron-Bridge performance summary, DGX-H100)")
        results += run_rows(CALIBRATION, "calibration", not args.no_search, cache)
    if args.rows in ("check", "all"):
        print("\nCheck rows, never fitted on (torchtitan 2024-12, Llama 3 paper Table 4)")
        results += run_rows(CHECK, "check", not args.no_search, cache)
    print()
    lines = [summary(results, kind) for kind in ("calibration", "check")]
    for line in lines:
        print(line)
    if args.record:
        record("published", results, {
            "formats": {"predicted": ".0f", "ratio": ".2f", "memory GB": ".1f", "memory ratio": ".2f",
                        "search ratio": ".2f", "search CPU s": ".1f"},
            "notes": " ".join(line + "." for line in lines)})


if __name__ == "__main__":
    main()
