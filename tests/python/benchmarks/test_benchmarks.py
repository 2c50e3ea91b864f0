"""The side-by-side benchmarks run as their README commands say, at toy sizes (their figures
are in benchmarks/README.md; timing never fails anything, so only what they print is
checked): DDP, FSDP2, DTensor tensor parallelism and torch.distributed.pipelining next to ours, and
the measured pipeline memory next to the simulator's."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
TINY = ["--layers", "2", "--hidden", "64", "--heads", "2", "--seq", "16"]


def _run(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _row(out: str, first: str) -> list[str]:
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == [first]]
    assert rows, out
    return rows[0]


def test_ddp_side_by_side():
    out = _run("ddp.py", "--worlds", "2", "--batch", "4", "--steps", "2", "--warmup", "1", *TINY)
    row = _row(out, "2")
    assert float(row[8]) < 1e-5  # relative, the losses at every step: ours and DDP's, from the same weights


def test_tensor_parallel_side_by_side_computes_the_same_loss():
    out = _run("tensor_parallel.py", "--worlds", "2", "--batch", "4", "--steps", "2", "--warmup", "1", *TINY)
    row = _row(out, "2")
    assert float(row[8]) < 1e-5  # the first step's loss: ours and DTensor's, same weights


def test_fsdp2_side_by_side_computes_the_same_loss():
    out = _run("fsdp.py", "--worlds", "2", "--batch", "4", "--steps", "2", "--warmup", "1", *TINY)
    row = _row(out, "2")
    assert int(row[5]) > 0 and int(row[6]) > 0, out  # our plan shards weights and prefetches their gathers
    assert 0 < int(row[7]) < int(row[6]), out  # in unit groups: fewer flattened all-gathers than weights
    assert float(row[10]) < 1e-5, out  # the losses at every step: ours and FSDP2's, from the same weights


def test_async_tp_split_and_fused_backward_compute_the_same_loss():
    out = _run("async_tp.py", "--worlds", "2", "--layers", "2", "--hidden", "32", "--ffn", "64", "--rows", "16",
               "--steps", "2", "--warmup", "1")
    line = next(line for line in out.splitlines() if line.startswith("world 2:"))
    assert "2 linears split" in line, out  # every up projection's backward split
    difference = float(line.rsplit("losses differ by ", 1)[1])
    assert difference < 1e-6, out  # the same products: float32 rounding at most


# GPT-2's Conv1D rings run strided blocks. At TINY's hidden 64 and sequence 16 the search keeps
# the plain layout for both models (an all-reduce, one Gloo call, against a gather and a scatter
# the products are too small to hide); at 128 and 64 it takes sequence parallelism with its rings.
@pytest.mark.parametrize("model, size", [("tiny-gpt", ["--hidden", "128", "--seq", "64"]),
                                         ("gpt2", ["--hidden", "128", "--seq", "64"])])
def test_collective_matmul_runs_the_searched_rings_and_matches_the_plain_plan(model, size):
    out = _run("collective_matmul.py", "--worlds", "2", "--batch", "4", "--steps", "2", "--warmup", "1", *TINY,
               *size, "--model", model)
    line = next(line for line in out.splitlines() if line.startswith("world 2:"))
    gathers = int(line.split(" gathers and ")[0].rsplit(" ", 1)[1])
    assert gathers > 0, out  # the search picked sequence parallelism with its gathers in rings
    difference = float(line.rsplit("losses differ by ", 1)[1])
    assert difference < 1e-4, out  # the same sums in another order: float32 rounding


def test_pipeline_side_by_side_runs_torch_pipelining_and_matches_losses():
    # (4 layers: ZB-V cuts 2 x 2 stages at block boundaries)
    out = _run("pipeline.py", "--batch", "4", "--micro-batch", "1", "--steps", "1", "--warmup", "1", *TINY,
               "--layers", "4")
    assert "FAILED" not in out
    assert {"gpipe", "1f1b", "zb-h1", "zb-v", "dualpipe-v"} <= {line.split()[0] for line in out.splitlines()
                                                                if line.split()}, out
    # 0 on this CPU (MKL rounds addmm_'s product, then its sum with .grad, as mm and add_ do:
    # runtime/fused_accumulation.py); a GEMM that folds the add into its accumulation may not.
    assert float(out.split("largest difference between any two at any step: ")[1].split()[0]) < 1e-4, out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()}
    for schedule in ("gpipe", "1f1b", "zb-h1", "zb-v", "dualpipe-v"):
        float(rows[schedule][2])  # torch's step time: every schedule ran side by side


def test_pipeline_cuts_torch_as_ours_with_the_layers_split_evenly_as_priced():
    # At 4,096 token rows the tied head outweighs the 4 blocks: the FLOPs-balanced cut left the
    # last stage (and the V's) the final norm and head alone, while every price assumed the
    # layers split evenly; the cut is the even one now (2 and 2, one a stage in the V). Torch's
    # stages are cut the same way, and every schedule runs side by side with the same losses.
    out = _run("pipeline.py", "--batch", "4", "--micro-batch", "1", "--steps", "1", "--warmup", "1", "--hidden", "32",
               "--heads", "2", "--seq", "16", "--layers", "4", "--vocab", "4096")
    assert "rank 0: 0-1, rank 1: 2-3" in out and "stage 3 (rank 0): 3-3" in out, out
    assert "FAILED" not in out, out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()}
    for schedule in ("gpipe", "1f1b", "zb-h1", "zb-v", "dualpipe-v"):
        float(rows[schedule][2])  # torch's step time: it ran
    assert float(out.split("largest difference between any two at any step: ")[1].split()[0]) < 1e-4, out


def test_fused_accumulation_side_by_side_fuses_and_matches_the_plain_stages():
    out = _run("fused_accumulation.py", "--batch", "4", "--micro-batch", "1", "--steps", "1", "--warmup", "1", *TINY,
               "--schedules", "1f1b,zb-h1")
    for schedule in ("1f1b", "zb-h1"):
        line = next(line for line in out.splitlines() if f"stages, {schedule:>10}:" in line)
        fused = int(line.split(" weight gradients accumulated in place")[0].rsplit(" ", 1)[1])
        assert fused >= 4 * 4, out  # rank 0's block of 4 linears (and the head on the last), 4 micro-batches
        assert float(line.rsplit("losses differ by ", 1)[1]) < 1e-4, out  # (0 on this CPU, as above)


@pytest.mark.slow
def test_pipeline_skips_only_the_torch_schedules_named():
    # What the benchmark does when one of torch's schedules fails (torch 2.11's ZBV on Gloo):
    # the run is repeated without that one, and every other schedule stays side by side.
    out = _run("pipeline.py", "--batch", "4", "--micro-batch", "1", "--steps", "1", "--warmup", "1", *TINY,
               "--layers", "4", "--skip-torch-schedules", "zb-v")
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()}
    assert rows["zb-v"][2] == "-" and float(rows["zb-v"][1]) > 0, out  # shardwise's ZB-V alone
    for schedule in ("gpipe", "1f1b", "zb-h1", "dualpipe-v"):
        assert float(rows[schedule][2]) > 0, out
    assert "torch zb-v" not in out.split("losses:")[1], out


def test_pipeline_memory_matches_the_simulator():
    out = _run("pipeline_memory.py", "--worlds", "2", "--batch", "8", "--micro-batch", "1", *TINY, "--layers", "4")
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == ["2"]]
    assert len(rows) == 10, out  # (gpipe, 1f1b, zb-h1, zb-v, dualpipe-v) x 2 ranks
    for row in rows:
        in_flight, simulated = int(row[6]), int(row[8])
        assert in_flight == simulated, row
    # ZB-V and DualPipeV count chunks (half a stage each): 2p on every rank, and 2p + 1
    assert [int(r[6]) for r in rows] == [8, 8, 2, 1, 2, 2, 4, 4, 5, 5]


@pytest.mark.slow
def test_model_zoo_captures_and_plans_by_every_method(tmp_path):
    import json

    out = _run("model_zoo.py", "falcon", "t5", "vit", "--columns", "ir calls", "--json", str(tmp_path / "zoo.json"))
    assert "models; captured by export" in out
    results = {r["name"]: r for r in json.loads((tmp_path / "zoo.json").read_text())}
    assert set(results) == {"falcon", "falcon-gqa", "t5", "vit"}
    for name, r in results.items():
        assert r["captured"] == ["export", "fx", "torchscript"], (name, r["errors"])
        assert r["plans"] == [[1, 4], [2, 2]] and r["errors"] == {} and r["unknown_ops"] == [], name
        # Every node's call, eval and training mode, rebuilt from the IR alone (what the lowering does).
        rebuilt, nodes = map(int, r["columns"]["ir calls"].split("/"))
        assert rebuilt == nodes > 100 and r["details"]["ir calls"] == [], (name, r["details"])


@pytest.mark.slow
def test_gpu_check_runs_its_cpu_parts(tmp_path):
    """scripts/gpu_check.sh on this CPU machine (--no-build: the shardwise already installed;
    --smoke: benchmarks/gpu.py at toy size): the GPU tests are collected and skipped with their
    reason, the benchmark prints every figure it can without CUDA, and the report is written."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("OUT", None)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--no-build", "--smoke", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = (tmp_path / "gpu_check.md").read_text()
    assert "status: ok" in report, report
    tests = (tmp_path / "tests.log").read_text()
    assert "needs CUDA" in tests and " skipped" in tests and "failed" not in tests, tests
    import json

    # A later command imports the build from a shell without library paths: the extension needs
    # no library beyond torch's (no env.sh to source any more).
    bare = {k: v for k, v in env.items() if k != "LD_LIBRARY_PATH"}
    later = subprocess.run([sys.executable, "-c", "import shardwise"], capture_output=True, text=True, env=bare, cwd=ROOT)
    assert later.returncode == 0, later.stdout + later.stderr
    assert not (tmp_path / "env.sh").exists()
    figures = json.loads((tmp_path / "gpu.json").read_text())
    assert figures["device"] == "cpu" and figures["step ratio engine / eager"] > 0, figures
    losses = figures["first losses (engine, eager)"]
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in losses), losses  # the engine computes what eager does
    llama = json.loads((tmp_path / "gpu_llama.json").read_text())  # the LLaMA beside GPT-2
    assert llama["model"].startswith("LLaMA") and llama["predicted step ms"] > 0, llama
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in llama["first losses (engine, eager)"]), llama


@pytest.mark.slow
def test_fidelity_profiles_the_machine_and_measures_each_plan_beside_its_prediction(tmp_path):
    import json

    out = _run("fidelity.py", "--smoke", "--json", str(tmp_path / "fidelity.json"))
    assert "step time predicted / measured" in out and "Kendall tau, step time: " in out
    assert "median of 1 steps after 1 untimed, every plan a step a round" in out
    result = json.loads((tmp_path / "fidelity.json").read_text())
    # The cluster the plans are priced on was measured here, not taken from the catalogue.
    assert "measured: " in result["cluster"]["name"] and "peak_flops" in result["cluster"]["name"].split(";")[0]
    rows = {r["plan"]: r for r in result["rows"]}
    assert set(rows) == {"gpt2 data 4", "gpt2 pipeline 2 x data 2, 1F1B"}
    for r in rows.values():
        assert r["step"] > 0 and r["predicted_step"] > 0 and r["memory"] > 0 and r["predicted_memory"] > 0, r
        assert r["memory"] > r["held"] > 0 and r["resident"] > 0, r  # a step allocates beyond what is held
        assert r["warmup"] == 1 and len(r["steps"]) == 1, r  # --smoke: one untimed step, one timed
    # Counted by the collective calls: every kind of collective the data-parallel plan lists
    # (which ones depends on the layout searched on the measured cluster) moved bytes, and the
    # pipeline sends between its stages.
    data = rows["gpt2 data 4"]
    assert data["predicted_traffic"], data
    for kind, nbytes in data["predicted_traffic"].items():
        assert nbytes <= 0 or data["traffic"].get(kind, {}).get("bytes", 0) > 0, (kind, data)
    assert rows["gpt2 pipeline 2 x data 2, 1F1B"]["traffic"]["send"]["calls"] > 0
    # The wait a blocking collective adds is the run's, measured beside the op passes in the plans'
    # processes (the median of the passes'): every plan is priced with the same figure (each
    # measuring its own had scattered them), and it is shown.
    assert len({r["profile"].get("sync_wait", -1.0) for r in rows.values()}) == 1, rows
    assert rows["gpt2 data 4"]["profile"]["sync_wait"] >= 0.0, rows
    # Every plan's ops were timed together, once, and the plans' steps in the same rounds: one
    # profile prices both plans.
    profiles = [r["profile"] for r in rows.values()]
    assert profiles[0] == profiles[1] and all(r["interleaved"] for r in rows.values()), rows
    assert all(r["ops_measured"] == len(profiles[0]["ops"]) for r in rows.values()), rows
    assert "beyond its fit (sync_wait, " in out

    # step_cpu.py runs the saved plans again: a row per rank, the engine's actions for the
    # pipeline's ranks only, and the ranks' CPU over the cores beside each plan's prediction.
    out = _run("step_cpu.py", "--from-json", str(tmp_path / "fidelity.json"), "--steps", "1", "--warmup", "1",
               "gpt2 data 4", "gpt2 pipeline 2 x data 2, 1F1B")
    lines = [line for line in out.splitlines() if line.startswith("| gpt2")]
    ranks = {(line.split(" | ")[0][2:], line.split(" | ")[1]): line for line in lines}
    assert set(ranks) == {(p, r) for p in rows for r in ("0", "1", "2", "3", "pool")}, out
    for plan in rows:
        assert f"predicted {rows[plan]['predicted_step']:.3f} s" in ranks[(plan, "pool")], out
    pipeline = [ranks[("gpt2 pipeline 2 x data 2, 1F1B", r)] for r in "0123"]
    assert all(" F " in line and " B " in line for line in pipeline), out
    assert not any(" F " in ranks[("gpt2 data 4", r)] for r in "0123"), out
    # The pipeline's two stages as priced, beside its ranks' actions; one stage has none.
    assert ranks[("gpt2 pipeline 2 x data 2, 1F1B", "pool")].count(" ms a micro-batch") == 1, out
    priced = ranks[("gpt2 pipeline 2 x data 2, 1F1B", "pool")].split("stages priced ")[1].split(" ms")[0]
    assert len(priced.split(", ")) == 2 and all(float(t) > 0 for t in priced.split(", ")), out
    assert "stages priced" not in ranks[("gpt2 data 4", "pool")], out


def test_peak_tensor_bytes_counts_what_is_held_and_the_largest_step_allocation_without_excluded_tensors():
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("tensor_memory", ROOT / "benchmarks" / "_tensor_memory.py")
    tensor_memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tensor_memory)
    users = torch.ones(1_000_000)  # before the snapshot: the user's, not counted
    before = tensor_memory.live_storages()
    assert before[users.untyped_storage().data_ptr()] == 4_000_000
    held = torch.ones(250_000)  # 1 MB held when the window opens
    with tensor_memory.PeakTensorBytes(exclude=before) as m:
        a = torch.empty(500_000)  # 2 MB, freed
        del a
        b = torch.empty(750_000)  # 3 MB ...
        c = torch.empty(250_000)  # ... + 1 MB alive together: the peak
        del b, c
        del held  # allocated before the window: its free is not seen, and changes nothing
    assert (m.live, m.grown, m.peak) == (1_000_000, 4_000_000, 5_000_000)
    assert users.sum() == 1_000_000


def test_fidelity_states_issue_46s_bar_from_its_rows():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fidelity_benchmark", ROOT / "benchmarks" / "fidelity.py")
    fidelity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fidelity)
    assert fidelity.kendall_tau([(1, 10), (2, 20), (3, 30)]) == 1.0
    assert fidelity.kendall_tau([(1, 30), (2, 20), (3, 10)]) == -1.0
    assert fidelity.kendall_tau([(1, 10), (2, 30), (3, 20)]) == 1 / 3
    rows = [  # gpt2: the plan predicted fastest ("b") measures 1.5 x the fastest ("a")
        {"plan": "gpt2 a", "step": 1.0, "predicted_step": 2.0, "memory": 100.0, "predicted_memory": 90.0},
        {"plan": "gpt2 b", "step": 1.5, "predicted_step": 1.6, "memory": 100.0, "predicted_memory": 50.0},
        {"plan": "llama a", "step": 2.0, "predicted_step": 2.2, "memory": 200.0, "predicted_memory": 210.0},
    ]
    bar = fidelity.against_the_bar(rows)
    assert "Within 25% in step time: 2 of 3; within 15% in memory: 2 of 3." in bar, bar
    assert "Kendall tau, step time: 0.333; peak memory: 0.67." in bar, bar  # (3 places: 0.6985 < 0.7)
    assert "measured against the fastest measured: gpt2 1.50, llama 1.00." in bar, bar


def test_long_context_captures_and_plans_each_length_in_its_own_process():
    out = _run("long_context.py", "--layers", "2", "--lengths", "2048", "8192", "--no-batch16")
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| 2048 |") or line.startswith("| 8192 |")]
    assert len(rows) == 2, out
    for row in rows:
        assert row[6] == "2", out  # both layers' attention given back is_causal at both lengths
        assert float(row[5]) > 0 and float(row[2]) > 0, out  # each process's own peak resident set and CPU time


def test_moe_runs_expert_parallelism_beside_the_plan_without_it():
    out = _run("moe.py", "--worlds", "2", "--steps", "1")
    rows = {line.split(" | ")[1]: line.split(" | ") for line in out.splitlines() if line.startswith("| 2 |")}
    assert set(rows) == {"allowed", "off"}, out
    # Allowed: each rank's tokens sent to its experts' ranks by all-to-all (the data axis
    # divides both the tokens and the 8 experts).
    assert rows["allowed"][2] == "dispatch t / replicate" and rows["off"][2] == "split t / replicate", out
    # Each rank holds half the experts: its peak tensor memory is below the replicated plan's.
    assert float(rows["allowed"][7].strip(" |")) < 1, out


def test_heterogeneous_plans_beat_equal_shares_and_match_the_exhaustive_split():
    out = _run("heterogeneous.py", "--quick")
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| a100+half") or
            line.startswith("| mixed-a100-v100")]
    speedups = [float(r[5]) for r in rows if len(r) == 6]
    assert len(speedups) == 2 and min(speedups) >= 1.3, out  # ours against equal shares and stages
    exhaustive = [float(r[6]) for r in rows if len(r) == 7]
    assert exhaustive and max(exhaustive) <= 1.05, out  # the joint planner's split against every split


def test_p2p_rendezvous_prints_the_waits_of_a_late_receive():
    out = _run("p2p_rendezvous.py", "--mb", "1", "--delay", "0.05")
    row = _row(out, "1.0")
    assert len(row) == 5 and all(float(x) >= 0 for x in row[1:]), out


# ---- benchmarks/README.md's tables: generated from benchmarks/results/*.json (benchmarks/_results.py) ----

def _results():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _results

    return _results


def test_readme_tables_are_the_rendered_results():
    results = _results()
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    # Rendering the committed results reproduces the README exactly: every table is the
    # benchmark's own record, none edited by hand.
    assert results.render(readme) == readme, "run python benchmarks/_results.py --render"
    blocks = results.names_in(readme)
    files = sorted(p.stem for p in (ROOT / "benchmarks" / "results").glob("*.json"))
    assert len(blocks) == len(set(blocks)), blocks
    assert sorted(blocks) == files  # a block for every results file and a results file for every block
    assert results.check() == []


def test_record_then_render_puts_the_new_row_into_a_readme_copy(tmp_path):
    import json
    import shutil

    results = _results()
    readme, store = tmp_path / "README.md", tmp_path / "results"
    shutil.copy(ROOT / "benchmarks" / "README.md", readme)
    shutil.copytree(ROOT / "benchmarks" / "results", store)
    before = readme.read_text()
    old = json.loads((store / "ddp.json").read_text())
    meta = {"machine": "test box", "date": "2000-01-01", "command": "python benchmarks/ddp.py --worlds 8"}
    results.record("ddp", [{"world": 8, "shardwise ms": 12.34, "DDP ms": 12.0, "ours / DDP": 12.34 / 12.0}], meta,
                   key=("world",), results_dir=store, readme=readme)
    after = readme.read_text()
    assert "| 8 | 12.3 | 12.0 | 1.03 | - |" in after  # the columns' formats, "-" where the run gave none
    assert "*2000-01-01, test box: `python benchmarks/ddp.py --worlds 8`.*" in after
    assert f"`{old['command']}`" in after.split("<!-- results:ddp -->")[1]  # the earlier run's rows still named
    doc = json.loads((store / "ddp.json").read_text())
    assert len(doc["rows"]) == len(old["rows"]) + 1 and doc["rows"][:-1] == old["rows"]
    # Only the ddp block moved, and rendering again changes nothing.
    head, tail = ([part.split(marker)[i] for part in (before, after)]
                  for marker, i in (("<!-- results:ddp -->", 0), ("<!-- /results:ddp -->", -1)))
    assert head[0] == head[1] and tail[0] == tail[1]
    assert results.render(after, store) == after and results.check(readme, store) == []
    # Without a key the run replaces the table.
    results.record("ddp", [[2, 1.0]], {**meta, "columns": ["world", "shardwise ms"]}, results_dir=store, readme=readme)
    block = readme.read_text().split("<!-- results:ddp -->")[1].split("<!-- /results:ddp -->")[0]
    assert block.splitlines()[1:4] == ["| world | shardwise ms |", "| --- | --- |", "| 2 | 1.0 |"], block
    assert (ROOT / "benchmarks" / "README.md").read_text() == before  # the real one untouched


def test_a_benchmark_records_its_table_with_record(tmp_path):
    import shutil

    readme = tmp_path / "README.md"
    shutil.copy(ROOT / "benchmarks" / "README.md", readme)
    shutil.copytree(ROOT / "benchmarks" / "results", tmp_path / "results")
    env = {**os.environ, "SHARDWISE_RESULTS_DIR": str(tmp_path / "results"), "SHARDWISE_RESULTS_README": str(readme)}
    env["PYTHONPATH"] = str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "p2p_rendezvous.py"), "--mb", "0.5", "--delay",
                           "0.01", "--record"], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    block = readme.read_text().split("<!-- results:p2p_rendezvous -->")[1].split("<!-- /results:p2p_rendezvous -->")[0]
    assert block.splitlines()[2] == "| --- | --- | --- | --- | --- |" and block.splitlines()[3].startswith("| 0.5 |")
    assert "`python benchmarks/p2p_rendezvous.py --mb 0.5 --delay 0.01`" in block, block
