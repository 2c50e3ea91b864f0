"""Rank programs run through ``torch.compile`` (``parallelize(..., compile=...)``, issue 49).

A rank program is a ``torch.fx.GraphModule``: what ``torch.compile`` takes. The engine keeps
the lowered module (its ``code``, its marks, what the node-for-node check reads) and calls
the compiled one, made once per program (an SPMD program, or a pipeline stage's, per mode and
batch shapes) and compiled on its first call, forward and backward (AOTAutograd). The
runtime's modules that keep state between calls (ZeRO's prefetched gathers and regathers,
asynchronous gradients, collective matmul's rings, an FP8 linear whose input gradient is
all-reduced asynchronously: _stateful_modules) run eagerly: the program is cut at their
calls into pieces (``compiled_in_pieces``), each run of other nodes compiled, each run of
their calls run as it is, rather than left to dynamo's graph breaks, whose resume functions
cost most of a compile. Inside a compiled piece what dynamo cannot trace still breaks it
(the transport's asynchronous collectives and their ``Work.wait``, the runtime's bookkeeping
inside a recomputed block); the core's slice bounds (``reshard.block_bounds``) are a constant
to it at static shapes. Every other FP8 linear is traced,
its amaxes' all-reduce (a split contraction dim) a traced op: inductor fuses its casts (abs,
amax, scale, cast) with the ops around them, which is what the cost model prices for a
compiled plan (csrc/cost/op_cost.h);
the eager pieces and dynamo's breaks are counted and logged with the compile time of each
program. A compiled
pipeline runs without fused weight-gradient accumulation (engine.py turns it off: its in-place
backward would run eagerly between compiled pieces, a break at every linear). A counted loss'
count, a float that changes from step to step, goes in as a 0-dim tensor (dynamo takes a float
for a constant and would recompile the program at the second step's count; neither
``torch.compiler.config.dynamic_sources`` nor ``unbacked_sources`` marks a float). The
zero-bubble B/W split is refused with compile (engine.py).

``compile``: False (eager), True (inductor, torch.compile's defaults), one of torch.compile's
modes ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"), or a dict
of torch.compile's keyword arguments (backend, mode, options, dynamic, fullgraph).
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from .._C import ValidationError
from .._logging import get_logger
from . import transport

log = get_logger("shardwise.engine")

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
KEYWORDS = ("backend", "mode", "options", "dynamic", "fullgraph")


def compile_options(value: Any) -> dict | None:
    """torch.compile's keyword arguments for parallelize's ``compile``; None: eager. Anything
    else is refused, naming the value, before the job does any work."""
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if isinstance(value, str):
        if value not in MODES:
            raise ValidationError(f"parallelize: compile={value!r} is not one of torch.compile's modes "
                                  f"({', '.join(MODES)}); True compiles with its defaults")
        return {"mode": value}
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(KEYWORDS))
        if unknown:
            raise ValidationError(f"parallelize: compile= has {unknown}, which torch.compile does not take here "
                                  f"(it takes {', '.join(KEYWORDS)})")
        if value.get("mode") is not None and value["mode"] not in MODES:
            raise ValidationError(f"parallelize: compile's mode {value['mode']!r} is not one of {', '.join(MODES)}")
        return dict(value)
    raise ValidationError(f"parallelize: compile={value!r}: give True, a torch.compile mode or a dict of its "
                          "keyword arguments")


class CompiledProgram:
    """A rank program's module under torch.compile, compiled on its first call (logged: the
    seconds it took, the graph breaks dynamo made). Calls after the first run the compiled
    code; dynamo recompiles by itself should a guard fail (counted in torch's own log)."""

    def __init__(self, module: torch.fx.GraphModule, options: dict, name: str):
        self.module = module
        self.name = name
        self.compile_seconds: float | None = None
        self.graph_breaks: int | None = None
        _run_eagerly_under_compile()
        self._compiled, self.eager_pieces = compiled_in_pieces(module, options)

    def __call__(self, *args):
        # A counted loss' count (a float: runtime/counted.py) as a 0-dim tensor, which dynamo
        # takes as an input; a float is a constant it would recompile the program for at the
        # next step's count (lower.divide_by_count divides by either alike). On the CPU
        # whatever the program's device: a 0-dim CPU tensor is a scalar to a CUDA kernel.
        args = tuple(torch.tensor(a, dtype=torch.float64, device="cpu") if isinstance(a, float) else a
                     for a in args)
        if self.compile_seconds is not None:
            return self._compiled(*args)
        from torch._dynamo.utils import counters

        breaks = sum(counters["graph_break"].values())
        start = time.perf_counter()
        out = self._compiled(*args)
        self.compile_seconds = time.perf_counter() - start
        self.graph_breaks = sum(counters["graph_break"].values()) - breaks
        log.info("%s: compiled in %.1f s (forward; backward compiles on its first run), %d pieces run eagerly, "
                 "%d graph breaks", self.name, self.compile_seconds, self.eager_pieces, self.graph_breaks)
        return out


def _stateful_modules() -> list[tuple[type, str]]:
    """The runtime's modules that keep Python state between calls or across forward and
    backward: the prefetched gathers in flight and the regathered units (parameter_gathers.py),
    the asynchronous all-reduces beside weight gradients (async_gradients.py), the rings of a
    collective matmul (collective_matmul.py) and the FP8 linears whose input gradient is
    all-reduced asynchronously (fp8.py: ``Fp8Linears.with_collectives``; the others are traced).
    Traced, dynamo guards on that state and recompiles as it changes; past its recompile limit
    it ran part of a step traced and part not, and a 2 x 2 training loop's loss came out 1e-3
    off one device's (ZeRO's prefetch). They run eagerly between compiled pieces."""
    from .async_gradients import AsyncGradient
    from .collective_matmul import CollectiveMatmul
    from .fp8 import Fp8Linears
    from .parameter_gathers import PrefetchStart, PrefetchWait, Regather

    return [(PrefetchStart, "forward"), (PrefetchWait, "forward"), (Regather, "forward"), (AsyncGradient, "forward"),
            (CollectiveMatmul, "forward"), (Fp8Linears, "with_collectives")]


def _run_eagerly_under_compile() -> None:
    """The transport's collectives (transport.EAGER) and each of _stateful_modules()' methods
    replaced by their torch.compiler.disable'd forms, once (when the first program is compiled:
    disable imports dynamo)."""
    import torch._dynamo

    from . import reshard

    torch._dynamo.assume_constant_result(reshard.block_bounds)  # (sets a mark on it; dynamo is imported now)
    owned = [(transport, name) for name in transport.EAGER] + _stateful_modules()
    for owner, name in owned:
        fn = getattr(owner, name)
        if not getattr(fn, "_shardwise_eager", False):
            fn = torch.compiler.disable(fn)
            fn._shardwise_eager = True
            setattr(owner, name, fn)


def runs_eagerly(module: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Whether `node` calls one of the runtime's stateful modules by its forward, or a module
    whose ``calls_eagerly(node.args)`` says this call runs its stateful method (fp8.Fp8Linears)."""
    if node.op != "call_module":
        return False
    target = module.get_submodule(node.target)
    eager = tuple(kind for kind, method in _stateful_modules() if method == "forward")
    calls_eagerly = getattr(target, "calls_eagerly", None)
    return isinstance(target, eager) or (calls_eagerly is not None and calls_eagerly(node.args))


def compiled_in_pieces(module: torch.fx.GraphModule, options: dict) -> tuple[torch.nn.Module, int]:
    """`module` cut at its calls of the runtime's stateful modules (each maximal run of them one
    eager piece, each run of the other nodes between them one piece under torch.compile), and
    the number of eager pieces. Cut here rather than by dynamo's graph breaks: at each break
    dynamo writes a resume function from the whole program's bytecode, which cost most of the
    compile (a tensor-parallel Qwen2 of 2 layers, rank 0 of 4: 70 of 120 s at 31 breaks), and a
    piece's bytecode is a piece's length. A program without such calls is compiled whole."""
    from torch.fx.passes.split_module import split_module

    for sub in module.modules():  # an eager module's own compiled kernels (a ring's FP8 casts)
        if hasattr(sub, "compile_inner"):
            sub.compile_inner(options)
    ops = [n for n in module.graph.nodes if n.op not in ("placeholder", "get_attr", "output")]
    eagerly = [runs_eagerly(module, n) for n in ops]
    if not any(eagerly):
        return torch.compile(module, **options), 0
    piece, eager_of, last = {}, {}, None
    for n, eager in zip(ops, eagerly):
        if eager != last:
            eager_of[len(eager_of)] = eager
            last = eager
        piece[n] = len(eager_of) - 1
    pieces = split_module(module, module, lambda n: piece[n], keep_original_order=True)
    # The program's hooks (lower.py: Regather.new_pass before each forward) run around the
    # pieces as around the program: the same hook tables, not copies.
    for table in ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
                  "_forward_hooks_with_kwargs", "_forward_hooks_always_called"):
        setattr(pieces, table, getattr(module, table))
    for index, eager in eager_of.items():
        if not eager:
            name = f"submod_{index}"
            setattr(pieces, name, torch.compile(getattr(pieces, name), **options))
    return pieces, sum(eager_of.values())


def runner(module: torch.fx.GraphModule, options: dict | None, name: str) -> Callable:
    """What the engine calls to run `module`: the module itself, or its compiled form."""
    return module if options is None else CompiledProgram(module, options, name)
