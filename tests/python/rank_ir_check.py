"""The program that runs against the rank IR it was lowered from, node for node (issue 47:
``engine.code`` corresponds to ``engine.rank_ir``), for tests that train a plan on real ranks.

Two sequences are compared, each in program order:

- **calls**: each ATen node of the rank IR against the program's ATen calls: the same op with
  the same arguments (the IR's attributes bound to the op's schema), made through
  ``fused_accumulation`` exactly where the IR marks it ``shardwise.fused_accumulation`` (a
  pipeline stage's weight gradient added into .grad in place), through ``fp8_linear`` with the
  IR's axes exactly where it marks an FP8 linear (``shardwise.fp8_k_axes`` and
  ``shardwise.fp8_n_axes``), and reading as many operands
  through ``weight_split.cut`` as the IR's ``shardwise.weight_cut`` lists (a zero-bubble
  stage's B/W split). The IR's nodes the runtime
  runs as one of its own modules (RUNTIME_MODULE_MARKS) and the value identities the lowering
  calls again (contiguous) are left out; a view runs as reshape on the view's arguments
  (runtime/lower.py: _LAYOUT_FREE).
- **collectives**: as multisets, each resharding region of the rank IR (its chain of ``shardwise::<step>``
  nodes, forward and backward: csrc/transform/rank_graph.h, ``_C.rank_ir_regions``) against the
  program's calls that run one: ``reshard`` and ``prefetch.wait`` (the region's steps),
  ``collective_matmul`` (a ring's one step each way), ``async_gradient`` and an FP8 linear's
  split backward (the gradient's all-reduce), and a state write-back's steps (a buffer updated
  in place by a split node: the IR's ``{write_back=true}`` region before its write_state).
"""
from __future__ import annotations

from collections import Counter

import torch

import shardwise
from shardwise import _C

# The marks of ATen nodes the runtime runs as one of its own modules (rank_graph.h), whose
# region steps the collectives' comparison checks; a node run whole, or in a recomputed block,
# is a plain call.
RING_MARKS = {"shardwise.gather_matmul", "shardwise.matmul_scatter"}  # transform/collective_matmul.h
RUNTIME_MODULE_MARKS = {"shardwise.one_device_random", "shardwise.async_gradient", *RING_MARKS}
TENSOR = "<tensor>"  # every tensor operand, when two calls' other arguments are compared
FUSED_ACCUMULATION = "shardwise.fused_accumulation"  # transform/fused_weight_accumulation.h
WEIGHT_CUT = "shardwise.weight_cut"  # transform/weight_gradient_split.h
FP8_K_AXES, FP8_N_AXES = "shardwise.fp8_k_axes", "shardwise.fp8_n_axes"  # rank_graph.h: an FP8 linear
FP8_FLOAT8_WEIGHT = "shardwise.fp8_saves_float8_weight"  # ... that saves its gathered weight's float8 W^T
# Ops the capture records from the model outside aten (not the rewrite's collectives): called as
# the IR names them, like an ATen op (python/shardwise/_moe_experts.py).
CAPTURED_OPS = {"shardwise_moe::experts"}


def _module(node: torch.fx.Node) -> str | None:
    """The runtime module a node calls, by its name in the root program (``weight_split_cut``
    for ``weight_split.cut``: a recomputed block, runtime/recompute.py, calls the root's modules
    by their paths with '_' for '.'); None for a node that calls no module."""
    return node.target.replace(".", "_") if node.op == "call_module" else None


def _cut_operands(node: torch.fx.Node) -> int:
    """How many of a call's operands it reads through ``weight_split.cut``."""
    cuts = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda a: cuts.append(
        _module(a) == "weight_split_cut"))
    return sum(cuts)


def flat_nodes(module: torch.fx.GraphModule):
    """The program's nodes in order, recomputed blocks (runtime/recompute.py) opened."""
    for node in module.graph.nodes:
        if node.op == "call_module" and node.target.startswith("submod_"):
            block = module.get_submodule(node.target)
            yield from flat_nodes(getattr(block, "block", block))
        else:
            yield node


def _call(node: torch.fx.Node) -> tuple | None:
    """(kind, target, args, kwargs) of a node that calls an op or one of the runtime's modules:
    directly, through ``regather`` (runtime/parameter_gathers.py: the call whose sharded weight
    is gathered again in backward, wrapped), or through ``fused_accumulation`` (a pipeline
    stage's contraction whose weight gradient is added into .grad in place) or ``fp8_linear``
    (its products in float8), either way."""
    if node.op not in ("call_function", "call_module"):
        return None
    kind, target, args, kwargs = node.op, _module(node) or node.target, node.args, node.kwargs
    if _module(node) == "regather":
        fn, args, kwargs = args[0], args[1], args[2]
        if isinstance(fn, torch.fx.Node) and fn.op == "get_attr":
            target = fn.target.replace(".", "_")
        else:
            kind, target = "call_function", fn
    if kind == "call_module" and target == "fused_accumulation":
        from shardwise._fx_import import op_overload

        kind, target, args, kwargs = "call_function", op_overload(args[0]), args[1], args[2]
    if kind == "call_module" and target == "fp8_linear":  # (op, k axes, n axes, gradient step, args, kwargs)
        from shardwise._fx_import import op_overload

        kind, target, args, kwargs = "call_function", op_overload(args[0]), args[4], args[5]
    return kind, target, args, kwargs


def _fp8_args(node: torch.fx.Node) -> tuple | None:
    """The arguments of a call made through ``fp8_linear`` (op, k axes, n axes, the input
    gradient's all-reduce step or None, args, kwargs), directly or through ``regather``; else None."""
    if _module(node) == "regather":
        fn = node.args[0]
        if isinstance(fn, torch.fx.Node) and fn.op == "get_attr" and fn.target.replace(".", "_") == "fp8_linear":
            return node.args[1]
    if _module(node) == "fp8_linear":
        return node.args
    return None


def _fp8_axes(node: torch.fx.Node) -> tuple | None:
    """(k axes, n axes, whether it saves its weight's float8 copy) of a call made through
    ``fp8_linear``, else None."""
    args = _fp8_args(node)
    return None if args is None else (tuple(args[1]), tuple(args[2]), bool(args[6]) if len(args) > 6 else False)


def _aten_call(node: torch.fx.Node) -> tuple | None:
    call = _call(node)
    if call is None or call[0] != "call_function" or not isinstance(call[1], torch._ops.OpOverload):
        return None
    return call[1:]


def _aten_calls(module: torch.fx.GraphModule, rank_ir: str) -> tuple[int, list[str]]:
    from shardwise._aten_call import bound_arguments, call_arguments
    from shardwise._fx_import import VALUE_IDENTITIES, op_overload
    from shardwise.runtime.lower import _LAYOUT_FREE

    # An FP8 linear runs as fp8_linear, its input gradient's all-reduce (an asynchronous
    # gradient) inside it (runtime/lower.py: the FP8 emitter comes first), unless it runs a
    # ring (its products in float8 inside collective_matmul: _ring_fp8 checks those).
    ir_nodes = [n for n in shardwise.Graph.from_text(rank_ir).nodes()
                if (n["op"].startswith("aten::") or n["op"] in CAPTURED_OPS) and (
        (FP8_K_AXES in n["attrs"] and not RING_MARKS.intersection(n["attrs"]))
        or not RUNTIME_MODULE_MARKS.intersection(n["attrs"]))]
    made = [(node, _aten_call(node)) for node in flat_nodes(module)]
    made = [(node, call) for node, call in made if call is not None and call[0] not in VALUE_IDENTITIES]
    calls = [call for _, call in made]
    mismatches = []
    if len(ir_nodes) != len(calls):
        ir_ops = Counter(_LAYOUT_FREE.get(op_overload(n["op"]), op_overload(n["op"])) for n in ir_nodes)
        program_ops = Counter(target for target, _, _ in calls)
        mismatches.append(f"{len(ir_nodes)} ATen nodes in the rank IR, {len(calls)} ATen calls in the program; "
                          f"the IR's alone: {dict(ir_ops - program_ops)}, the program's alone: "
                          f"{dict(program_ops - ir_ops)}")
    for node, (made_by, (target, args, kwargs)) in zip(ir_nodes, made):
        fused = _module(made_by) == "fused_accumulation"
        if fused != (FUSED_ACCUMULATION in node["attrs"]):
            mismatches.append(f"{node['outputs'][0]} ({node['op']}): fused accumulation "
                              f"{'un' if fused else ''}marked in the IR, {'' if fused else 'not '}run so")
        marked = (tuple(node["attrs"][FP8_K_AXES]), tuple(node["attrs"][FP8_N_AXES]),
                  node["attrs"].get(FP8_FLOAT8_WEIGHT) is True) if FP8_K_AXES in node["attrs"] else None
        if _fp8_axes(made_by) != marked:
            mismatches.append(f"{node['outputs'][0]} ({node['op']}): FP8 axes {marked} in the IR, "
                              f"{_fp8_axes(made_by)} in the program")
        if _cut_operands(made_by) != len(node["attrs"].get(WEIGHT_CUT, ())):
            mismatches.append(f"{node['outputs'][0]} ({node['op']}): {node['attrs'].get(WEIGHT_CUT, [])} cut for B/W "
                              f"in the IR, {_cut_operands(made_by)} operands cut in the program")
        op = op_overload(node["op"])
        if _LAYOUT_FREE.get(op, op) is not target:
            mismatches.append(f"{node['outputs'][0]}: {node['op']} in the IR, {target} in the program")
            continue
        expected = bound_arguments(op, *call_arguments(op, node["attrs"], [TENSOR] * len(node["inputs"])))
        program = bound_arguments(op, args, kwargs, operand=lambda _: TENSOR)  # by the IR op's schema
        if expected != program:
            mismatches.append(f"{node['outputs'][0]} ({node['op']}): {expected} in the IR, {program} in the program")
    return min(len(ir_nodes), len(calls)), mismatches


def program_regions(module: torch.fx.GraphModule) -> list[tuple[tuple, tuple]]:
    """The (forward steps, backward steps) of each call of the program that runs a region."""
    out = []
    for node in flat_nodes(module):
        fp8 = _fp8_args(node)
        if fp8 is not None:
            if fp8[3] is not None:
                out.append(((), (fp8[3],)))
            continue
        call = _call(node)
        if call is None or call[0] != "call_module":
            continue
        target, args = call[1], call[2]
        if target == "reshard":
            out.append((tuple(args[1]), tuple(args[2])))
        elif target == "prefetch_wait":
            out.append((tuple(args[3]), tuple(args[4])))
        elif target == "collective_matmul":
            out.append(((args[3],), (args[4],) if args[4] is not None else ()))
        elif target == "async_gradient":
            out.append(((), (args[2],)))
    return out


def _collectives(module: torch.fx.GraphModule, rank_ir: str) -> tuple[int, list[str]]:
    """As multisets: a call that runs a region inside it (a ring, an asynchronous gradient) is
    made after its operands' reshards, where the IR has its operands' regions in operand order."""
    regions = _C.rank_ir_regions(rank_ir)
    ir = Counter((tuple(r["forward"]), tuple(r["backward"])) for r in regions)
    program = Counter(program_regions(module))
    where = {(tuple(r["forward"]), tuple(r["backward"])): f"'{r['value']}' read by '{r['reader']}'" for r in regions}
    mismatches = [f"{where[key]}: {key[0]} / {key[1]}, {n} more in the IR than in the program"
                  for key, n in (ir - program).items()]
    mismatches += [f"{key[0]} / {key[1]}: {n} more in the program than in the IR" for key, n in (program - ir).items()]
    return sum(ir.values()), mismatches


def _ring_fp8(module: torch.fx.GraphModule, rank_ir: str) -> list[str]:
    """As multisets: the FP8 marks (k axes, n axes, float8 weight) of each ring's contraction in
    the rank IR (None for one that is no FP8 linear) against each ``collective_matmul`` call's
    ``fp8`` argument: a ring runs its products in float8 exactly where the IR says so."""
    def marks(attrs: dict):
        if FP8_K_AXES not in attrs:
            return None
        return tuple(attrs[FP8_K_AXES]), tuple(attrs[FP8_N_AXES]), attrs.get(FP8_FLOAT8_WEIGHT) is True

    ir = Counter(marks(n["attrs"]) for n in shardwise.Graph.from_text(rank_ir).nodes()
                 if RING_MARKS.intersection(n["attrs"]))
    rings = [call[2] for call in map(_call, flat_nodes(module)) if call is not None and call[1] == "collective_matmul"]
    program = Counter((tuple(a[7][0]), tuple(a[7][1]), bool(a[7][2])) if len(a) > 7 else None for a in rings)
    return [f"rings with FP8 marks {key}: {ir[key]} in the IR, {program[key]} in the program"
            for key in set(ir) | set(program) if ir[key] != program[key]]


def lowered_against_rank_ir(module: torch.fx.GraphModule, rank_ir: str) -> dict:
    """{calls, collectives: how many were compared; mismatches: each difference, in words}."""
    calls, call_mismatches = _aten_calls(module, rank_ir)
    regions, region_mismatches = _collectives(module, rank_ir)
    return {"calls": calls, "collectives": regions,
            "mismatches": call_mismatches + region_mismatches + _ring_fp8(module, rank_ir)}


def engine_against_rank_ir(engine) -> dict | None:
    """lowered_against_rank_ir for every program of this rank: the SPMD program, or each
    pipeline stage's (against the core's cut of the rank program: ``engine.stage_rank_irs``);
    the mismatches of a stage named by it. None for an engine with neither."""
    if hasattr(engine, "stage_rank_irs"):
        programs = {f"stage {g}": (engine._stages[g]["module"], ir) for g, ir in engine.stage_rank_irs.items()}
    elif getattr(engine, "rank_ir", None) is not None:
        programs = {"": (engine.module, engine.rank_ir)}
    else:
        return None
    out = {"calls": 0, "collectives": 0, "mismatches": [], "programs": len(programs)}
    for name, (module, ir) in programs.items():
        one = lowered_against_rank_ir(module, ir)
        out["calls"] += one["calls"]
        out["collectives"] += one["collectives"]
        out["mismatches"] += [f"{name}: {m}" if name else m for m in one["mismatches"]]
    return out
