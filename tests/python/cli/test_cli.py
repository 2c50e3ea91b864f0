"""The README's main job and the CLI, run as a user runs them."""
import re
import subprocess
import sys


def test_inspect_prints_the_summary_of_the_builtin_model(tmp_path):
    out = tmp_path / "g.json"
    proc = subprocess.run([sys.executable, "-m", "shardwise", "inspect", "tiny-gpt", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "captured tiny-gpt" in proc.stdout
    assert "blocks" in proc.stdout
    assert out.read_text().startswith("{")


def test_inspect_reports_a_bad_model_spec_as_an_error():
    proc = subprocess.run([sys.executable, "-m", "shardwise", "inspect", "no-such-model"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "unknown model spec" in proc.stderr


def test_plan_on_a_varying_network_between_stages(tmp_path):
    # 4 DGX A100 nodes of 1.25 GiB devices over 10 Gb/s, bandwidth halved every other 0.1 s:
    # DualPipeV, timed on that network (tests/cpp/search/joint_planner_test.cc's cluster).
    import json

    import shardwise

    doc = json.loads(shardwise.Cluster.preset("dgx-a100", nodes=4).to_json())
    for device in doc["device_types"]:
        device["memory_bytes"] = 5 * 2**28
    doc["links"][1]["bandwidth"] = 1.25e9
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(doc))
    args = [sys.executable, "-m", "shardwise", "plan", "gpt:8,2048,16", "--cluster", str(cluster), "--global-batch",
            "256", "--format", "text", "--network"]
    proc = subprocess.run(args + ["0.1:1,0.1:0.5"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "schedule  DualPipeV" in proc.stdout, proc.stdout
    proc = subprocess.run(args + ["0.1"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "--network '0.1': expected SECONDS:BANDWIDTH_SCALE" in proc.stderr


def test_plan_gpt3_on_a_thousand_gpus_then_simulate_and_show_the_torchrun_line(tmp_path):
    plan_file, svg, trace = tmp_path / "plan.json", tmp_path / "t.svg", tmp_path / "t.json"
    proc = subprocess.run([sys.executable, "-m", "shardwise", "plan", "gpt:96,12288,96", "--cluster", "dgx-a100",
                           "--nodes", "128", "--global-batch", "1536", "--out", str(plan_file)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "1024 devices" in proc.stdout and "predicted step" in proc.stdout
    # MFU beside the A100's bf16 peak; the mesh by what it carries: layers in stages, the batch, the weights
    assert re.search(r"^predicted step [\d.]+ m?s, MFU [\d.]+% of 312 TFLOP/s bf16 peak per device$", proc.stdout,
                     re.M), proc.stdout
    mesh = re.search(r"^plan +1024 x a100-sxm4-80gb: layers in \d+ stages x batch over \d+ x weights over (\d+)$",
                     proc.stdout, re.M)
    assert mesh, proc.stdout
    # the stages priced with the layout searched for their tensor ranks (4 since the fast search
    # prices ZeRO-1 where a combination needs it; 8 before)
    assert f"layout the SPMD search finds for their {mesh.group(1)} tensor ranks" in proc.stdout, proc.stdout
    proc = subprocess.run([sys.executable, "-m", "shardwise", "simulate", str(plan_file), "--svg", str(svg),
                           "--trace", str(trace)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    import json
    import xml.etree.ElementTree as ET

    root = ET.fromstring(svg.read_text())  # an SVG document with drawn shapes
    assert root.tag.endswith("svg") and len(root.findall(".//{*}rect")) > 0
    events = json.loads(trace.read_text())  # Chrome trace: a list, or an object with traceEvents
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert any(e.get("ph") == "X" and e.get("dur", 0) > 0 for e in events), events[:5]
    proc = subprocess.run([sys.executable, "-m", "shardwise", "run", "--plan", str(plan_file), "train.py", "--lr",
                           "1e-3"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # 128 nodes of 8: every node runs 8 processes against one rendezvous, not 1,024 on one.
    assert ('torchrun --nnodes 128 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" '
            '--rdzv-id shardwise train.py --lr 1e-3') in proc.stdout, proc.stdout
    assert "1024 ranks on 128 nodes" in proc.stdout
    assert f"SHARDWISE_PLAN={plan_file}" in proc.stdout


def test_plan_a_captured_model_on_one_node():
    proc = subprocess.run([sys.executable, "-m", "shardwise", "plan", "tiny-gpt", "--cluster", "dgx-a100",
                           "--global-batch", "64"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # One node: the SPMD search's report, its axes named by what the placements split over them.
    assert re.search(r"^plan +8 x a100-sxm4-80gb: .*batch.* over ", proc.stdout, re.M), proc.stdout
    assert "data x tensor" not in proc.stdout and "placement per mesh axis" in proc.stdout


def test_plan_as_rich_tables_names_the_figures_and_writes_the_file_whole(tmp_path):
    out = tmp_path / "plan.json"
    proc = subprocess.run([sys.executable, "-m", "shardwise", "plan", "gpt:4,1024,16,512,50304", "--cluster",
                           "dgx-a100", "--global-batch", "16", "--format", "table", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for heading in ("predicted time per step", "memory per device", "parameters and inputs: placement per mesh axis",
                    "collectives per step", "MFU", "exposed communication", "optimizer state", "device capacity"):
        assert heading in proc.stdout, proc.stdout
    assert re.search(r"MFU +│ [\d.]+% of 312 TFLOP/s bf16 peak per device", proc.stdout), proc.stdout
    assert "TFLOP/s per device" not in proc.stdout and "_total" not in proc.stdout
    assert "(data x tensor)" not in proc.stdout
    assert "transformer.h.*.mlp.c_fc.weight" in proc.stdout  # a parameter group: 4 blocks in one row
    assert out.read_text().startswith("{")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_the_launch_line_follows_the_nodes_the_plan_was_priced_on(tmp_path):
    import json

    import shardwise

    def launch(plan: shardwise.Plan, *extra: str) -> str:
        path = tmp_path / "p.json"
        path.write_text(plan.to_json())
        proc = subprocess.run([sys.executable, "-m", "shardwise", "run", "--plan", str(path), *extra, "train.py"],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    graph = shardwise.models.gpt(layers=2, hidden=64, heads=4, seq=32, vocab=128, batch=8)
    one = shardwise.plan(graph, shardwise.Cluster.preset("cpu", 4), global_batch=8)
    assert json.loads(one.to_json())["predicted"]["ranks_per_node"] == [4]
    assert "torchrun --standalone --nproc-per-node 4 train.py" in launch(one)
    assert "TORCH_DISABLE" not in launch(one)
    # Restarts: torchrun's --max-restarts, with the restarted attempt kept off the failed one's
    # shared store (pytorch/pytorch#135712; test_checkpoint's restart test runs it so).
    restarting = launch(one, "--max-restarts", "3")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node 4 --max-restarts 3 train.py" \
        in restarting, restarting
    # A node of 4 and a node of 2: a line for each kind of node, both counting 2 nodes.
    doc = json.loads(shardwise.Cluster.preset("cpu", 4).to_json())
    doc["nodes"] = [{"count": 4, "device": "cpu"}, {"count": 2, "device": "cpu"}]
    doc["links"].append({"name": "ethernet", "bandwidth": 1e9, "latency": 1e-4})
    mixed = shardwise.plan(graph, shardwise.Cluster.from_json(json.dumps(doc)), global_batch=6, mesh=(6, 1))
    assert json.loads(mixed.to_json())["predicted"]["ranks_per_node"] == [4, 2]
    out = launch(mixed, "--rdzv-endpoint", "10.0.0.1:29400")
    assert "# nodes 0\n" in out and "--nnodes 2 --nproc-per-node 4" in out, out
    assert "# nodes 1\n" in out and "--nnodes 2 --nproc-per-node 2" in out, out
    assert "--rdzv-endpoint 10.0.0.1:29400" in out and "6 ranks on 2 nodes" in out
    # A plan that does not say its nodes (written by hand): its ranks on --nnodes nodes.
    bare = json.loads(one.to_json())
    del bare["predicted"]
    (tmp_path / "bare.json").write_text(json.dumps(bare))
    proc = subprocess.run([sys.executable, "-m", "shardwise", "run", "--plan", str(tmp_path / "bare.json"), "--nnodes",
                           "2", "train.py"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "--nnodes 2 --nproc-per-node 2" in proc.stdout, proc.stdout + proc.stderr


def test_ctrl_c_during_a_search_writes_nothing(tmp_path):
    import os
    import signal

    out = tmp_path / "plan.json"
    # Thorough on the 1T row of Megatron-LM's Table 1 (3,072 GPUs, thousands of plans): seconds
    # of search, interrupted as soon as the core logs that it started pricing.
    # SIGINT as a terminal leaves it: a test run started in the background (`cmd &` in a
    # script) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler.
    proc = subprocess.Popen([sys.executable, "-m", "shardwise", "-v", "plan", "gpt:128,25600,160", "--cluster",
                             "dgx-a100", "--nodes", "384", "--global-batch", "3072", "--level", "thorough", "--out",
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    for line in proc.stderr:  # -v: the core says when the search starts pricing
        seen.append(line)
        if "joint planner (thorough): pricing" in line:
            break
    proc.send_signal(signal.SIGINT)
    stdout, rest = proc.communicate(timeout=120)
    stderr = "".join(seen) + rest
    # The search stops at its next progress callback, long before its end.
    assert proc.returncode == 130, f"rc {proc.returncode} after SIGINT\n{stderr}"
    assert "combinations in" not in stderr  # the line the planner logs when it finishes
    assert "interrupted; nothing was written" in stderr
    assert not out.exists() and not list(tmp_path.iterdir())


def test_inspect_a_transformers_config_and_a_user_function_as_the_readme_shows(tmp_path):
    import os

    proc = subprocess.run([sys.executable, "-m", "shardwise", "inspect", "hf:gpt2", "--seq", "1024"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "124,439,808 parameters" in proc.stdout
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(
        "import torch\n\n"
        "def build():\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))\n"
        "    return model, (torch.randn(8, 16),)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "shardwise", "inspect", "mypkg.models:build"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "676 parameters" in proc.stdout, proc.stdout


def test_hf_configs_get_their_task_head_and_labels(tmp_path):
    """hf:NAME builds the head of the config's task, not only causal / masked LMs: the
    class a checkpoint's config names, else seq2seq for an encoder-decoder, masked LM for an
    encoder, causal LM for a decoder, image classification for a vision model."""
    import transformers

    from shardwise.models.registry import hf_task_head, resolve_model

    expected = {"t5": ("seq2seq-lm", "T5ForConditionalGeneration"),
                "bart": ("seq2seq-lm", "BartForConditionalGeneration"),
                "whisper": ("speech-seq2seq", "WhisperForConditionalGeneration"),
                "bert": ("masked-lm", "BertForMaskedLM"), "gpt2": ("causal-lm", "GPT2LMHeadModel"),
                "vit": ("image-classification", "ViTForImageClassification"),
                "resnet": ("image-classification", "ResNetForImageClassification")}
    for name, head in expected.items():
        assert hf_task_head(transformers.AutoConfig.for_model(name)) == head, name
    model, inputs = resolve_model("hf:vit", batch=2)
    assert {k: tuple(v.shape) for k, v in inputs.items()} == {"pixel_values": (2, 3, 224, 224), "labels": (2,)}
    # A saved config names its class: that one is built.
    cfg = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                  architectures=["BertForSequenceClassification"])
    cfg.save_pretrained(tmp_path)
    model, inputs = resolve_model(f"hf:{tmp_path / 'config.json'}", batch=2, seq=8)
    assert type(model).__name__ == "BertForSequenceClassification" and list(inputs) == ["input_ids"]


def test_inspect_and_plan_seq2seq_and_vision_configs():
    proc = subprocess.run([sys.executable, "-m", "shardwise", "inspect", "hf:t5", "--seq", "32", "--batch", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "60,506,624 parameters" in proc.stdout  # t5-small's shapes
    proc = subprocess.run([sys.executable, "-m", "shardwise", "plan", "hf:vit", "--cluster", "dgx-a100",
                           "--global-batch", "64", "--batch", "2", "--format", "text"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "predicted step" in proc.stdout
