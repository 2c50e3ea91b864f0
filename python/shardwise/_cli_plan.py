"""``python -m shardwise plan | simulate | run``: planning a job on any machine, drawing a
plan's timeline, and the torchrun line that trains it.

    python -m shardwise plan gpt:96,12288,96 --cluster dgx-a100 --nodes 128 --global-batch 1536
    python -m shardwise plan hf:gpt2 --cluster cluster.json --global-batch 64 --out plan.json
    python -m shardwise plan gpt:8,2048,16 --cluster dgx-a100 --nodes 4 --global-batch 256 \
        --network 0.1:1,0.1:0.5      # the links between stages halved every other 0.1 s
    python -m shardwise simulate plan.json --svg timeline.svg --trace trace.json
    python -m shardwise run --plan plan.json train.py --epochs 3   # options before the script

MODEL is one of the `inspect` specs (tiny-gpt, module:function, hf:NAME or hf:config.json,
captured on the meta device: nothing is allocated) or ``gpt:LAYERS,HIDDEN,HEADS[,SEQ,VOCAB]``,
a GPT built directly in the core's IR (no torch: GPT-3 175B plans in seconds).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time


def _graph(spec: str, batch: int, seq: int | None):
    import shardwise

    if spec.startswith("gpt:"):
        numbers = [int(x) for x in spec[4:].split(",")]
        if len(numbers) not in (3, 5):
            raise ValueError(f"model spec {spec!r}: gpt:LAYERS,HIDDEN,HEADS[,SEQ,VOCAB]")
        layers, hidden, heads = numbers[:3]
        seq_len, vocab = (numbers[3], numbers[4]) if len(numbers) == 5 else (seq or 2048, 51200)
        return shardwise.models.gpt(layers=layers, hidden=hidden, heads=heads, seq=seq_len, vocab=vocab,
                                    batch=max(2, batch))
    from shardwise.models.registry import resolve_model

    model, inputs = resolve_model(spec, batch=max(2, batch), seq=seq)
    return shardwise.capture(model, inputs)


def _cluster(text: str, nodes: int):
    import shardwise

    if text in shardwise.Cluster.preset_names():
        return shardwise.Cluster.preset(text, nodes)
    if nodes != 1:
        raise ValueError("--nodes applies to a preset; a cluster file lists its nodes")
    return shardwise.Cluster.from_json(text)


def _network(text: str | None):
    """'0.1:1,0.1:0.5' -> NetworkCondition(durations=(0.1, 0.1), bandwidth=(1.0, 0.5))."""
    import shardwise

    if text is None:
        return None
    try:
        segments = [tuple(float(x) for x in part.split(":")) for part in text.split(",")]
    except ValueError:
        segments = []
    if not segments or any(len(s) != 2 for s in segments):
        raise ValueError(f"--network {text!r}: expected SECONDS:BANDWIDTH_SCALE[,SECONDS:BANDWIDTH_SCALE...], "
                         "e.g. 0.1:1,0.1:0.5")
    return shardwise.NetworkCondition(durations=tuple(s[0] for s in segments), bandwidth=tuple(s[1] for s in segments))


def run_plan(args: argparse.Namespace) -> int:
    import shardwise

    from ._cli_render import interactive, print_plan, search_progress, status, write_whole
    from ._logging import get_logger

    network = _network(args.network)  # checked before any work
    t0 = time.perf_counter()
    with status(f"capturing {args.model}", interactive()):
        graph = _graph(args.model, args.batch, args.seq)
    cluster = _cluster(args.cluster, args.nodes)
    captured = time.perf_counter() - t0
    pipeline = {"auto": None, "yes": True, "no": False}[args.pipeline]
    get_logger("shardwise.cli").info("planning %s on %s (%d devices), level %s", args.model, cluster.name,
                                     cluster.world_size, args.level)
    with search_progress(f"planning ({args.level})", interactive()) as progress:
        plan = shardwise.plan(graph, cluster, global_batch=args.global_batch, level=args.level, pipeline=pipeline,
                              progress=progress, network=network)
    seconds = plan.search_seconds() or 0.0
    print(f"{args.model} on {cluster.name} ({cluster.world_size} devices), global batch {args.global_batch}: "
          f"graph in {captured:.1f} s, plan in {seconds:.2f} s ({args.level})")
    if plan.searched_layout():
        print(f"stages priced with the layout the SPMD search finds for their {plan.tensor} tensor ranks "
              f"({plan._result['stage_layout_searches']} layouts searched)")
    table = args.format == "table" or (args.format == "auto" and sys.stdout.isatty())
    if table:
        print_plan(plan, cluster)
    else:
        print(plan.report())
    if plan.fits is False:
        need = plan.predicted_memory()[0]
        print(f"warning: no plan fits in memory; this is the one that needs the least ({need / 1e9:.2f} GB per "
              f"rank, the devices have {cluster.device_of(0)['memory_bytes'] / 1e9:.2f} GB)")
    if args.out:
        write_whole(args.out, plan.to_json(indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


def run_simulate(args: argparse.Namespace) -> int:
    import shardwise

    with open(args.plan) as f:
        plan = shardwise.Plan.from_json(f.read())
    sim = plan.simulation()
    print(f"{plan.schedule}: {sim.ranks} pipeline ranks, step {sim.step_time:.3f} s, bubble "
          f"{100 * sim.bubble_fraction:.1f}%, peak in-flight micro-batches {max(sim.peak_in_flight)}")
    if args.svg:
        plan.timeline_svg(args.svg)
        print(f"wrote {args.svg}")
    if args.trace:
        plan.chrome_trace(args.trace)
        print(f"wrote {args.trace} (open it in https://ui.perfetto.dev)")
    return 0


def launch_lines(ranks_per_node: list[int], script: list[str], endpoint: str,
                 max_restarts: int = 0) -> list[tuple[str, list[str]]]:
    """torchrun's command for each kind of node the plan runs on: (which nodes, argv). One node:
    --standalone (a free port on this machine). Several: every node runs the same line against
    one c10d rendezvous at `endpoint` (the first node's address and a free port on it); nodes
    with another device count get a line of their own (torchrun's --nnodes counts them all).
    `max_restarts`: torchrun restarts every rank that many times after a failure (the script
    resumes from its checkpoint, README "Restarts")."""
    restarts = ["--max-restarts", str(max_restarts)] if max_restarts else []
    if len(ranks_per_node) == 1:
        return [("this machine", ["torchrun", "--standalone", "--nproc-per-node", str(ranks_per_node[0]), *restarts,
                                  *script])]
    lines = []
    for count in dict.fromkeys(ranks_per_node):  # distinct counts, in node order
        nodes = [i for i, n in enumerate(ranks_per_node) if n == count]
        which = "every node" if len(nodes) == len(ranks_per_node) else f"nodes {_ranges(nodes)}"
        lines.append((which, ["torchrun", "--nnodes", str(len(ranks_per_node)), "--nproc-per-node", str(count),
                              "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "shardwise",
                              *restarts, *script]))
    return lines


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _shell_line(argv: list[str]) -> str:
    """argv as a shell line; an argument naming a variable ($MASTER_ADDR) in double quotes, so
    the shell expands it."""
    return " ".join(f'"{a}"' if a.startswith("$") and '"' not in a else shlex.quote(a) for a in argv)


def run_run(args: argparse.Namespace) -> int:
    """Shows (and with --exec, runs) the torchrun line for a training script: for a plan, the
    nodes it was priced on (its predicted.ranks_per_node) and their device counts."""
    script = [args.script, *args.script_args]
    if args.nproc_per_node is not None:
        ranks_per_node = [args.nproc_per_node] * (args.nnodes or 1)
    elif args.plan:
        with open(args.plan) as f:
            doc = json.load(f)
        world = (sum(a * b for a, b in doc["stage_meshes"]) if doc.get("stage_meshes")
                 else doc["data"] * doc.get("context", 1) * doc["tensor"] * doc["pipeline"])
        ranks_per_node = (doc.get("predicted") or {}).get("ranks_per_node") or []
        if not ranks_per_node:  # an older or hand-written plan: its ranks on nnodes equal nodes
            nodes = args.nnodes or 1
            if world % nodes:
                print(f"shardwise run: the plan's {world} ranks do not divide over {nodes} nodes", file=sys.stderr)
                return 2
            ranks_per_node = [world // nodes] * nodes
            if args.nnodes is None and world > 1:
                print(f"# the plan does not say its nodes: {world} ranks on this machine (--nnodes N to spread them)",
                      file=sys.stderr)
    else:
        ranks_per_node = [1] * (args.nnodes or 1)
    lines = launch_lines(ranks_per_node, script, args.rdzv_endpoint, args.max_restarts)
    env = [f"SHARDWISE_PLAN={os.path.abspath(args.plan)}"] if args.plan else []  # parallelize loads it
    if args.max_restarts:
        # A restarted attempt must not read the failed attempt's addresses from the agent's
        # shared TCP store: its init_process_group then fails or hangs (pytorch/pytorch#135712).
        env.append("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
    env = ["env", *env] if env else []
    if len(ranks_per_node) > 1:
        print(f"# {sum(ranks_per_node)} ranks on {len(ranks_per_node)} nodes; run on each node (the endpoint: the "
              "first node's address and a free port on it)")
    for which, line in lines:
        print((f"# {which}\n" if len(lines) > 1 else "") + _shell_line(env + line))
    if args.exec:
        if len(ranks_per_node) > 1:
            print("shardwise run: --exec starts one machine's processes; this plan spans several nodes: run the line "
                  "above on each", file=sys.stderr)
            return 2
        line = env + lines[0][1]
        os.execvp(line[0], line)
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("plan", help="search a plan for MODEL on a cluster (no GPU needed)")
    p.add_argument("model")
    p.add_argument("--cluster", required=True, help="a preset name or a cluster JSON file")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--level", choices=("fast", "thorough"), default="fast")
    p.add_argument("--pipeline", choices=("auto", "yes", "no"), default="auto",
                   help="the joint pipeline x data x tensor planner (auto: for several nodes)")
    p.add_argument("--batch", type=int, default=2, help="batch the model is captured at (scaled to the global)")
    p.add_argument("--network", metavar="S:SCALE,...",
                   help="the links between pipeline stages over time, repeating: seconds at a fraction of their "
                        "bandwidth (0.1:1,0.1:0.5 halves it every other 0.1 s); pipelined plans are timed on it and "
                        "kFkB competes with 1F1B")
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--out", help="write the plan as JSON")
    p.add_argument("--format", choices=("auto", "table", "text"), default="auto",
                   help="the report as rich tables or as plan.report()'s text (auto: tables on a terminal)")
    p.set_defaults(run=run_plan)
    s = sub.add_parser("simulate", help="simulate a plan's pipeline schedule; draw its timeline")
    s.add_argument("plan")
    s.add_argument("--svg")
    s.add_argument("--trace")
    s.set_defaults(run=run_simulate)
    r = sub.add_parser("run", help="show the torchrun line that trains SCRIPT (with --exec: run it)")
    r.add_argument("script")
    r.add_argument("script_args", nargs=argparse.REMAINDER)
    r.add_argument("--plan")
    r.add_argument("--nproc-per-node", type=int, help="ranks per node (default: the plan's, else 1)")
    r.add_argument("--nnodes", type=int, help="nodes (default: the plan's, else 1)")
    r.add_argument("--rdzv-endpoint", default="$MASTER_ADDR:29500",
                   help="several nodes: the c10d rendezvous, the first node's HOST:PORT (default %(default)s)")
    r.add_argument("--max-restarts", type=int, default=0,
                   help="restart every rank up to N times after a failure (the script must resume from its "
                        "checkpoint); sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (pytorch/pytorch#135712)")
    r.add_argument("--exec", action="store_true")
    r.set_defaults(run=run_run)
