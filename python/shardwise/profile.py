"""Profiled mode: measure a captured graph's ops on this device and the live process
group's collectives, and cost plans with those numbers (csrc/cost/profiled_cost.h).

    >>> g = shardwise.capture(model, (idx, labels))
    >>> prof = shardwise.profile(g, budget_s=30)          # CPU now, CUDA when present
    >>> prof.coverage(g)["nodes_measured"], prof.coverage(g)["nodes_analytic"]
    (83, 4)
    >>> plan = shardwise.Plan.manual(g, shardwise.Cluster.preset("cpu"), global_batch=8, profile=prof)
    >>> prof.save("tinygpt.profile.json"); shardwise.Profile.load("tinygpt.profile.json")

How an op is measured. Every node has a signature (op, input/output dtypes and shapes,
attributes; computed by the C++ core, ``_C.node_signatures``): nodes with the same
signature (the same op at the same shapes in repeated layers) are measured once. For each
distinct signature the ATen call is rebuilt from the IR node: ``torch.ops.aten.<name>.<overload>``,
tensor operands in schema order from random tensors of the recorded shapes and dtypes
(integer operands: indices in a valid range where the op says what that is: embedding
rows, loss classes; zeros for other indexing ops, which are always in range; small values
for elementwise ops; anything else is skipped), other arguments from the node's attributes
(keyed by schema argument name; ``<arg>_present`` marks which slots of a ``Tensor?[]`` held
tensors). Forward: the median of ``repeats`` timed calls after a warm-up. Backward: the
median of ``torch.autograd.grad`` of the floating outputs (ones-like gradients) with respect
to the floating parameter and activation operands, less the fixed cost of one
``autograd.grad`` call (measured once on a one-element graph: a model's backward pays it
once per step, not once per op). A node that cannot be rebuilt or run is
recorded in ``Profile.skipped`` with the reason and stays analytic; so does every signature
left when ``budget_s`` runs out.

Collectives: when ``torch.distributed`` is initialised, all_reduce, all_gather
(``all_gather_into_tensor``), reduce_scatter (``reduce_scatter_tensor``), all_to_all
(``all_to_all_single``) and broadcast are timed at a few sizes (4 KiB - 4 MiB by default;
``bytes`` as in csrc/cost/collective_cost.h: the whole buffer), the slowest rank's median per
size is taken (every rank then fits the same line), and alpha (s) and beta (s/byte) are fitted
by least squares with alpha >= 0 and beta >= 0. A collective the backend does not support
(e.g. Gloo's reduce_scatter) is skipped under the key ``collective:<kind>``.
"""
from __future__ import annotations

import json
import os
import statistics
import time
import warnings
from typing import Any, Callable, Iterable

import torch

from . import _C
from ._aten_call import _TORCH_DTYPES, CallRebuildError, call_arguments
from ._fx_import import op_overload
from ._logging import get_logger

log = get_logger(__name__)

__all__ = ["Profile", "profile", "measure_collectives", "measure_optimizer", "measure_specs", "plan_specs",
           "graph_specs", "sharing", "measure_time_slicing", "DEFAULT_COLLECTIVE_SIZES"]

# Up to 16 MB: a step's gradient buckets are 25 MB (DDP's cap, _C.GRADIENT_BUCKET_BYTES) and its
# tensor-parallel activations several MB. Fitted on 4 KB to 4 MB only, the slope came from the two
# largest points and a shared host's noise there: four Gloo ranks on 2 cores (2026-12-06) priced
# a 17 MB all-reduce at 18 to 22 ms where it ran 28 to 32; with 16 MB in the fit, 26 to 34.
DEFAULT_COLLECTIVE_SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)
_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


# Integer operands with a known valid range: op -> (index of the integer operand among the
# node's inputs, a function (input shapes) -> exclusive upper bound of the values).
_INDEX_RANGES: dict[str, tuple[int, Callable[[list[list[int]]], int]]] = {
    "aten::embedding": (1, lambda shapes: shapes[0][0]),
    "aten::cross_entropy_loss": (1, lambda shapes: shapes[0][1] if len(shapes[0]) > 1 else shapes[0][0]),
    "aten::nll_loss": (1, lambda shapes: shapes[0][1] if len(shapes[0]) > 1 else shapes[0][0]),
    "aten::nll_loss_forward": (1, lambda shapes: shapes[0][1] if len(shapes[0]) > 1 else shapes[0][0]),
    "aten::nll_loss2d_forward": (1, lambda shapes: shapes[0][1]),
}
# Indexing ops whose integer operands index some dimension: zeros are always in range.
_ZERO_INDEX_OPS = {
    "aten::gather", "aten::index.Tensor", "aten::index_select", "aten::take_along_dim",
    "aten::scatter.src", "aten::scatter.value", "aten::scatter_add", "aten::index_put",
    "aten::embedding_dense_backward",
}
# Ops for which any small integer values are valid (no value is an index or a divisor).
_VALUE_SAFE_OPS = {
    "aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::eq.Tensor", "aten::ne.Tensor",
    "aten::lt.Tensor", "aten::le.Tensor", "aten::gt.Tensor", "aten::ge.Tensor", "aten::eq.Scalar",
    "aten::ne.Scalar", "aten::lt.Scalar", "aten::gt.Scalar", "aten::where.self", "aten::masked_fill.Scalar",
    "aten::view", "aten::reshape", "aten::_unsafe_view", "aten::transpose.int", "aten::permute",
    "aten::expand", "aten::unsqueeze", "aten::squeeze.dim", "aten::slice.Tensor", "aten::select.int",
    "aten::cat", "aten::stack", "aten::clone", "aten::contiguous", "aten::_to_copy", "aten::to.dtype",
    "aten::detach", "aten::alias", "aten::sum", "aten::sum.dim_IntList", "aten::cumsum",
    "aten::ones_like", "aten::zeros_like", "aten::full_like", "aten::copy", "aten::flatten.using_ints",
    "aten::bitwise_and.Tensor", "aten::bitwise_or.Tensor", "aten::logical_not", "aten::logical_and",
    "aten::tril", "aten::triu",
}


class Profile:
    """Measured op and collective times (the JSON document of csrc/cost/profiled_cost.h).

    Usable wherever a cost model is accepted: ``Plan.manual(..., profile=prof)``."""

    def __init__(self, doc: dict):
        self._doc = doc

    # ---- serialisation ------------------------------------------------------
    @classmethod
    def from_json(cls, text: str) -> "Profile":
        """Validated by the core: bad values raise shardwise.ValidationError / ParseError."""
        return cls(json.loads(_C.profile_normalise(text)))

    def to_json(self, indent: int | None = None) -> str:
        return _C.profile_normalise(json.dumps(self._doc), -1 if indent is None else indent)

    def save(self, path: "str | os.PathLike[str]") -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json(indent=2))

    @classmethod
    def load(cls, path: "str | os.PathLike[str]") -> "Profile":
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Profile) and json.loads(self.to_json()) == json.loads(other.to_json())

    __hash__ = None

    # ---- contents -------------------------------------------------------------
    @property
    def device(self) -> str:
        return self._doc["device"]

    @property
    def ops(self) -> dict[str, dict]:
        """signature -> {"forward": s, "backward": s} (and "selective": s where timed under that policy)."""
        return dict(self._doc.get("ops", {}))

    @property
    def skipped(self) -> dict[str, str]:
        """signature (or ``collective:<kind>``) -> why it was not measured."""
        return dict(self._doc.get("skipped", {}))

    @property
    def collectives(self) -> dict[str, dict[int, dict]]:
        """kind -> group size -> {"alpha": s, "beta": s/byte}."""
        return {k: {int(n): dict(f) for n, f in v.items()} for k, v in self._doc.get("collectives", {}).items()}

    @property
    def sync_wait(self) -> float:
        """Seconds a blocking collective waits in a program beyond its fit (measure_sync_wait; 0: not measured)."""
        return float(self._doc.get("sync_wait", 0.0))

    @property
    def time_slicing(self) -> float:
        """What the op times were multiplied by for the CPU a rank loses when its node's ranks
        outnumber its cores (measure_time_slicing; already in ``ops``); 1.0: none."""
        return float(self._doc.get("time_slicing", 1.0))

    def coverage(self, graph) -> dict:
        """{nodes_measured, nodes_analytic, provenance: ["measured" | "analytic", per node]}
        of ``graph`` under this profile (as the core model sees it)."""
        out = dict(_C.profile_coverage(graph._core, json.dumps(self._doc)))
        for k in ("node_calls_measured", "node_calls_analytic", "collective_calls_measured",
                  "collective_calls_analytic"):
            out.pop(k, None)  # static question: no calls were made
        return out

    def provenance(self, graph) -> list[str]:
        """"measured" or "analytic" for every node of ``graph``, in node order."""
        return list(_C.profile_coverage(graph._core, json.dumps(self._doc))["provenance"])

    def collective_time(self, cluster, kind: str, ranks: Iterable[int], bytes: int) -> tuple[float, str]:
        """(seconds, "measured" | "analytic") of one collective under this profile."""
        r = _C.profile_collective_time(cluster._core, kind, list(ranks), int(bytes), json.dumps(self._doc))
        return r["seconds"], r["provenance"]

    def summary(self, graph=None) -> str:
        lines = [f"profile on {self.device}: {len(self.ops)} op signatures measured, {len(self.skipped)} skipped"]
        if graph is not None:
            c = self.coverage(graph)
            total = c["nodes_measured"] + c["nodes_analytic"]
            lines.append(f"  nodes: {c['nodes_measured']}/{total} measured, {c['nodes_analytic']} analytic")
        for kind, fits in sorted(self.collectives.items()):
            for n, f in sorted(fits.items()):
                lines.append(f"  {kind} x{n}: alpha {f['alpha'] * 1e6:.1f} us, beta {f['beta'] * 1e9:.3f} ns/B "
                             f"({1 / f['beta'] / 1e9 if f['beta'] > 0 else float('inf'):.2f} GB/s)")
        if self.sync_wait > 0:
            lines.append(f"  sync wait: {self.sync_wait * 1e3:.2f} ms a blocking collective, beyond its fit")
        if self.time_slicing > 1.0:
            lines.append(f"  op times include x{self.time_slicing:.3f} for cores time-sliced between ranks")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Profile(device={self.device!r}, ops={len(self._doc.get('ops', {}))}, "
                f"skipped={len(self._doc.get('skipped', {}))}, collectives={sorted(self.collectives)})")


# ---- op measurement ---------------------------------------------------------------


class _Skip(Exception):
    """An op that cannot be rebuilt safely: stays analytic, with this reason."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _resolve_op(name: str):
    if not name.startswith("aten::"):
        raise _Skip(f"not an ATen op ({name})")
    op = op_overload(name)
    if op is None:
        raise _Skip(f"torch.ops.aten has no {name[len('aten::'):]}")
    return op


def _make_tensor(v: dict, device: torch.device, op: str, position: int, shapes: list, requires_grad: bool):
    dtype = _TORCH_DTYPES.get(v["dtype"])
    if dtype is None:
        raise _Skip(f"operand {position}: dtype {v['dtype']} cannot be generated")
    shape = list(v["shape"])
    if dtype.is_floating_point:
        t = torch.randn(shape, dtype=dtype, device=device)
        return t.requires_grad_(requires_grad)
    if dtype == torch.bool:
        return torch.rand(shape, device=device) < 0.5
    if op in _INDEX_RANGES and _INDEX_RANGES[op][0] == position:
        high = int(_INDEX_RANGES[op][1](shapes))
        if high < 1:
            raise _Skip(f"operand {position}: empty index range")
        return torch.randint(0, high, shape, dtype=dtype, device=device)
    if op in _ZERO_INDEX_OPS:
        return torch.zeros(shape, dtype=dtype, device=device)
    if op in _VALUE_SAFE_OPS:
        return torch.randint(0, 2, shape, dtype=dtype, device=device)
    raise _Skip(f"integer operand {position} ({v['dtype']}) of an op with no known valid range")


def _build_call(spec: dict, device: torch.device):
    """(op, args, kwargs, differentiable inputs, activations) rebuilding a spec's ATen call
    (_spec); activations: the inputs an earlier op of the step produced (not parameters)."""
    op = _resolve_op(spec["op"])
    attrs = spec["attrs"]
    shapes = [list(v["shape"]) for v in spec["inputs"]]
    tensors = []
    for i, v in enumerate(spec["inputs"]):
        grad = v["role"] in ("parameter", "activation")
        tensors.append(_make_tensor(v, device, spec["op"], i, shapes, grad))

    try:
        args, kwargs = call_arguments(op, attrs, tensors)
    except CallRebuildError as e:
        raise _Skip(str(e)) from None
    # Creation ops with a device argument: put the result on the profiling device.
    names = [a.name for a in op._schema.arguments]
    if "device" in names:
        position = names.index("device")
        if position < len(args):
            args[position] = device
        else:
            kwargs["device"] = device
    grads_wrt = [t for t in tensors if isinstance(t, torch.Tensor) and t.requires_grad]
    activations = [t for t, v in zip(tensors, spec["inputs"])
                   if isinstance(t, torch.Tensor) and v["role"] == "activation"]
    return op, args, kwargs, grads_wrt, activations


def _spec(node: dict, values: dict, signature: str, shapes: "list[list[int]] | None" = None) -> dict:
    """A self-contained, picklable description of one call to measure: the node's op and
    attributes, its operands' dtypes and roles, and their shapes (the graph's, or ``shapes``:
    inputs then outputs, as one rank runs the node). ``check_outputs`` when the shapes are a
    rank's: a call whose attributes still say the whole graph's sizes (a view, an expand)
    does not produce them and is skipped rather than timed at the wrong size."""
    ins = [values[name] for name in node["inputs"]]
    outs = [values[name] for name in node["outputs"]]
    rank_shapes = shapes is not None
    if not rank_shapes:
        shapes = [v["shape"] for v in ins + outs]
    return {"signature": signature, "op": node["op"], "attrs": node["attrs"],
            "inputs": [{"dtype": v["dtype"], "role": v["role"], "shape": list(s)} for v, s in zip(ins, shapes)],
            "outputs": [{"dtype": v["dtype"], "shape": list(s)} for v, s in zip(outs, shapes[len(ins):])],
            "check_outputs": rank_shapes}


def graph_specs(graph) -> list[dict]:
    """One spec per distinct node signature of ``graph``, at the graph's shapes."""
    values = {v["name"]: v for v in graph.values()}
    first: dict[str, dict] = {}
    for sig, node in zip(_C.node_signatures(graph._core), graph.nodes()):
        first.setdefault(sig, node)
    return [_spec(node, values, sig) for sig, node in first.items()]


def plan_specs(graph, cluster, plans: Iterable) -> list[dict]:
    """One spec per distinct call the evaluator prices for ``plans`` (``shardwise.Plan``s of
    ``graph``), each at the shapes one rank runs it (csrc/cost/recording_cost.h): what a
    profile must hold for ``Plan.price(..., profile=)`` to price the plans at their per-rank
    shapes (issue 46, item 7). Plain data: measure them in the processes that will run the
    plans (``measure_specs(..., group=)``), so ranks that share cores are timed sharing them."""
    values = {v["name"]: v for v in graph.values()}
    nodes = graph.nodes()
    out: dict[str, dict] = {}
    for plan in plans:
        for op in _C.plan_local_ops(graph._core, cluster._core, plan.to_json()):
            if op["signature"] not in out:
                spec = _spec(nodes[op["node"]], values, op["signature"], op["shapes"])
                spec["fp8"] = op["fp8"]  # an FP8 linear of an fp8 plan: timed as runtime/fp8.py runs it
                out[op["signature"]] = spec
            # Under selective recomputation's policy too, where any plan recomputes so (_selective_seconds).
            out[op["signature"]]["selective"] = out[op["signature"]].get("selective", False) or op["selective"]
    return list(out.values())


def _floating_outputs(out) -> list[torch.Tensor]:
    items = out if isinstance(out, (list, tuple)) else [out]
    return [t for t in items if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]


# Bytes written between samples so that an op's inputs are not still in the caches from its
# last call: in a step, the ops between two uses of a tensor have evicted it. Then the inputs
# an earlier op produced (activations; in backward the output gradients) are read once, as
# their producer just wrote them: what fits in the caches is hot, as in the step, the rest is
# not, and parameters stay cold. On this CPU (2 MiB of L2 a core) a float32 mul of 4 MiB
# operands ran 0.48 ms timed hot, 1.18 ms after a 64 MiB write, and 0.85 ms on average in a
# GPT-2 step's own profile; timed hot, that step's elementwise ops were priced at about half of
# what they took (GPT-2 data 2: 0.72x to 0.84x of the measured step in three runs), and flushed
# without the read, a pipeline's micro-batch-sized ops at 1.13x to 1.52x. A GPU's L2 (50 MiB
# on an H100) is flushed the same way (Triton's do_bench writes 256 MiB).
_FLUSH_BYTES = {"cpu": 64 << 20, "cuda": 256 << 20}
_flush_buffers: dict[str, torch.Tensor] = {}


def _flush_caches(device: torch.device, produced: "list[torch.Tensor]" = ()) -> None:
    """Evicts the caches, then reads ``produced`` (the tensors the op's producers just wrote)."""
    key = str(device)
    buf = _flush_buffers.get(key)
    if buf is None:
        buf = _flush_buffers[key] = torch.empty(_FLUSH_BYTES.get(device.type, 64 << 20) // 4, device=device)
    buf.fill_(1.0)
    with torch.no_grad():
        for t in produced:
            if t.numel():
                t.sum()
    _sync(device)


def _calls_per_sample(fn: Callable[[], Any], device: torch.device, min_sample_s: float) -> int:
    """How many calls of ``fn`` (timed once, now) make a sample of at least ``min_sample_s``, at most 100."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return max(1, min(100, int(min_sample_s / max(time.perf_counter() - t0, 1e-7))))


def _median_time(fn: Callable[[], Any], device: torch.device, repeats: int, min_sample_s: float,
                 produced: "list[torch.Tensor]" = ()) -> float:
    """Median seconds of one call, each sample started as a step would (_flush_caches); calls
    are batched so a sample lasts >= min_sample_s (a microsecond op is otherwise lost in the
    clock's and Python's noise)."""
    inner = _calls_per_sample(fn, device, min_sample_s)
    samples = []
    for _ in range(repeats):
        _flush_caches(device, produced)
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def _autograd_overhead(device: torch.device, repeats: int) -> float:
    """Seconds of one torch.autograd.grad call on a one-element graph after _flush_caches: the
    engine's fixed start-up cost. A standalone backward pays it once per op; a model's backward
    pays it once per step, so it is subtracted from every op's measured backward (on this CPU it is
    ~100 us, more than the whole backward of a small elementwise op)."""
    x = torch.ones(1, device=device, requires_grad=True)
    g = torch.ones(1, device=device)

    def one() -> float:
        y = x.view(1)
        _flush_caches(device)  # as every op's backward is timed: the engine's start-up, cold
        t0 = time.perf_counter()
        torch.autograd.grad([y], [x], grad_outputs=[g])
        _sync(device)
        return time.perf_counter() - t0

    one()
    return statistics.median(one() for _ in range(max(3, repeats)))


def _selective_seconds(op, args, kwargs, device, repeats, min_sample_s, activations) -> float:
    """Seconds of one call as a selectively recomputed block runs it (runtime/recompute.py): its
    forward in the policy's caching mode, then its replay in the recompute mode (the output
    returned from the cache where the policy keeps it, computed again otherwise). The mode is a
    Python TorchDispatchMode: on a CPU it costs 20 to 180 us an op beyond the op itself, more
    than the cheap ops the policy recomputes (2026-12-06: a GPT-2 block of 35 ops, 4 x 128 rows,
    6 ms a block with every output kept), which the op's forward alone does not show."""
    from .runtime.recompute import _selective_contexts

    def both(calls: int):
        def run():
            forward, replay = _selective_contexts()
            with forward:
                for _ in range(calls):
                    op(*args, **kwargs)
            with replay:
                for _ in range(calls):
                    op(*args, **kwargs)
        return run

    # A block runs its ops one after the other inside one pair of modes, the mode's Python warm
    # from the op before: the calls of a sample run inside one pair too (the policy keeps each
    # kept call's output in order and the replay takes them back in order). One call a pair,
    # after _flush_caches, timed the mode's code cold: 0.2 ms on a view op that costs 5 us
    # (2026-12-08, AMD EPYC), the selective plans of fidelity.py priced 1.08-1.12x of measured.
    once = both(1)
    once()  # (warm: the pair timed below is not the first)
    calls = _calls_per_sample(once, device, min_sample_s)
    return _median_time(both(calls), device, repeats, min_sample_s, activations) / calls


def _as_ranks_call(spec: dict, op):
    """``op`` as the rank program calls it: an FP8 linear (the spec's "fp8") through
    runtime/fp8.py's scaled call, anything else as rebuilt."""
    if not spec.get("fp8"):
        return op
    from .runtime.fp8 import fp8_call

    return lambda *a, **k: fp8_call(op, a, k)


def _measure_node(spec, device, warmup, repeats, min_sample_s) -> tuple[float, float, float | None]:
    op, args, kwargs, wrt, activations = _build_call(spec, device)
    op = _as_ranks_call(spec, op)
    try:
        for _ in range(warmup):
            out = op(*args, **kwargs)
    except _Skip:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the rebuilt call leaves the op analytic
        raise _Skip(f"the rebuilt call failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    if spec.get("check_outputs") and warmup:
        got = [list(t.shape) for t in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(t, torch.Tensor)]
        want = [list(o["shape"]) for o in spec["outputs"]]
        if got != want:
            raise _Skip(f"the rebuilt call gives shapes {got}, the rank runs {want} (an attribute holds the "
                        "whole graph's sizes)")
    forward = _median_time(lambda: op(*args, **kwargs), device, repeats, min_sample_s, activations)

    backward = 0.0
    outs = _floating_outputs(op(*args, **kwargs)) if wrt else []
    if outs:
        grads = [torch.ones_like(x) for x in outs]

        def run_backward():
            o = _floating_outputs(op(*args, **kwargs))
            _flush_caches(device, grads)  # a step's backward runs long after its forward
            t0 = time.perf_counter()
            torch.autograd.grad(o, wrt, grad_outputs=grads, allow_unused=True)
            _sync(device)
            return time.perf_counter() - t0

        try:
            run_backward()  # warm-up; also finds an op with no derivative
        except Exception as e:  # noqa: BLE001
            raise _Skip(f"backward failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        backward = statistics.median(run_backward() for _ in range(repeats))
    selective = (_selective_seconds(op, args, kwargs, device, repeats, min_sample_s, activations)
                 if spec.get("selective") else None)
    return forward, backward, selective


def _progress(total: int, enabled: bool):
    """A tqdm bar if tqdm is installed and wanted; else a no-op with the same face."""
    if enabled:
        try:
            from tqdm.auto import tqdm

            return tqdm(total=total, desc="shardwise.profile", unit="op", leave=False)
        except ImportError:
            pass

    class _Null:
        def update(self, n=1): ...
        def set_postfix_str(self, s): ...
        def close(self): ...

    return _Null()


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def measure_ops(graph, *, device: "str | torch.device | None" = None, budget_s: float = 30.0, warmup: int = 1,
                repeats: int = 5, min_sample_s: float = 2e-4, progress: bool = True) -> dict:
    """The op part of a profile document: {"device", "ops", "skipped"}."""
    return measure_specs(graph_specs(graph), device=device, budget_s=budget_s, warmup=warmup, repeats=repeats,
                         min_sample_s=min_sample_s, progress=progress)


def measure_specs(specs: list[dict], *, device: "str | torch.device | None" = None, budget_s: float = 30.0,
                  warmup: int = 1, repeats: int = 5, min_sample_s: float = 2e-4, progress: bool = True,
                  group=None, shared_by: float = 1.0, concurrent: int = 1, time_slicing: bool = True) -> dict:
    """Times each spec (graph_specs, plan_specs) once: {"device", "ops", "skipped"}.

    ``group``: a process group whose every rank calls this with the same specs (collective);
    every rank gets the first rank's figures. Its first ``concurrent`` ranks time the specs
    together, call by call (an all-reduce over the group before each, which is also where
    the ranks agree that the budget is spent), the others wait: as many ranks as the node has
    cores for, so that they share its memory bandwidth and caches as a step's ranks do, but
    never more, or they would time each other's scheduler slices (a short sample runs within
    one, alone on a core). ``shared_by``: what the times are multiplied by, how many times
    slower a rank computes when its node runs all its ranks than when it runs ``concurrent``
    of them: the node's compute_alone (cost/cluster.h: 2 for 4 single-threaded processes on 2
    cores), so the figures are the rate every rank shares, as Cluster.detect's peak FLOP/s.
    Where the group has more ranks than ``concurrent`` (and ``time_slicing``), that rate is
    also what the slices cost: ``measure_time_slicing`` over the same specs, first, multiplies
    ``shared_by`` and is recorded as the document's "time_slicing" (above 1 only)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if group is not None:
        import torch.distributed as dist

        sliced = measure_time_slicing(specs, concurrent=concurrent, group=group, device=device) \
            if time_slicing else 1.0
        doc = [_measure_specs(specs, device, budget_s, warmup, repeats, min_sample_s, progress, shared_by * sliced,
                              group, dist.get_rank(group) < max(1, concurrent))]
        if sliced > 1.0:
            doc[0]["time_slicing"] = sliced
        dist.broadcast_object_list(doc, src=dist.get_global_rank(group, 0), group=group)
        return doc[0]
    return _measure_specs(specs, device, budget_s, warmup, repeats, min_sample_s, progress, shared_by, None, True)


def _measure_specs(specs, device, budget_s, warmup, repeats, min_sample_s, progress, shared_by, group,
                   timing: bool) -> dict:
    """measure_specs's loop; with a group every rank runs it, those not ``timing`` only agreeing
    on the budget with the rest, call by call.

    The ``repeats`` samples of an op are taken in as many passes over the whole list, one
    each, and their median kept: a machine that runs slower for a few seconds (a shared host
    does; on this 2-core VM the same plan's profile moved by 30% from one run to the next
    when each op's samples were taken back to back) then slows one sample of every op, not
    every sample of a few."""
    if group is not None:
        import torch.distributed as dist
    samples: dict[str, list[tuple[float, float, float | None]]] = {}
    skipped: dict[str, str] = {}
    overheads = []
    start = time.perf_counter()
    passes = max(1, repeats)
    bar = _progress(len(specs) * passes, progress and timing)
    try:
        for _ in range(passes):
            if timing:
                overheads.append(_autograd_overhead(device, 1))
            for spec in specs:
                sig = spec["signature"]
                over = time.perf_counter() - start > budget_s
                if group is not None:
                    flag = torch.tensor([1.0 if over and timing else 0.0], device=device)
                    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
                    over = bool(flag.item())
                if over and sig not in samples and sig not in skipped:
                    skipped[sig] = f"time budget of {budget_s:g} s exhausted"
                if over or not timing or sig in skipped:
                    bar.update()
                    continue
                bar.set_postfix_str(spec["op"])
                try:
                    sample = _measure_node(spec, device, warmup, 1, min_sample_s)
                except _Skip as why:
                    skipped[sig] = str(why)
                except (RuntimeError, ValueError, TypeError, IndexError) as e:  # rebuilding itself failed
                    skipped[sig] = (f"could not rebuild: {type(e).__name__}: "
                                    f"{str(e).splitlines()[0] if str(e) else ''}")
                else:
                    samples.setdefault(sig, []).append(sample)
                bar.update()
    finally:
        bar.close()
    overhead = statistics.median(overheads) if overheads else 0.0
    ops = {}
    for sig, taken in samples.items():
        if sig in skipped:  # a later pass failed where an earlier did not
            continue
        fwd = statistics.median(f for f, _, _ in taken)
        bwd = statistics.median(b for _, b, _ in taken)
        # An op with a backward keeps a floor of 1 ns: measured, not "free".
        ops[sig] = {"forward": max(fwd, 1e-9) * shared_by,
                    "backward": max(bwd - overhead, 1e-9) * shared_by if bwd > 0 else 0.0}
        if taken[0][2] is not None:
            ops[sig]["selective"] = max(statistics.median(s for _, _, s in taken), 1e-9) * shared_by
    log.info("shardwise.profile: %d signatures measured, %d skipped in %.1f s (autograd overhead %.1f us "
             "subtracted from each backward)", len(ops), len(skipped), time.perf_counter() - start, overhead * 1e6)
    return {"device": _device_name(device), "ops": ops, "skipped": skipped}


def _op_pass(specs: list[dict], device: torch.device) -> "Callable[[], None] | None":
    """One pass over ``specs``' rebuilt calls, forward, without autograd: the ops a step runs
    at its shapes, on inputs of their own (a step's working set, about); None when none runs."""
    calls = []
    for spec in specs:
        try:
            op, args, kwargs, _, _ = _build_call(spec, device)
            op = _as_ranks_call(spec, op)
            with torch.no_grad():
                op(*args, **kwargs)
        except Exception:  # noqa: BLE001 - what cannot be rebuilt is left out of the pass
            continue
        calls.append((op, args, kwargs))
    if not calls:
        return None

    def run() -> None:
        with torch.no_grad():
            for op, args, kwargs in calls:
                op(*args, **kwargs)
    return run


def measure_time_slicing(specs: list[dict], *, concurrent: int, group=None, seconds: float = 1.0,
                         rounds: int = 2, device: "str | torch.device | None" = None) -> float:
    """How many times more CPU a rank's ops take when its node runs all its ranks on fewer
    cores than ranks (the scheduler slices each core between them) than when ``concurrent``
    of them run, one a core: ``measure_specs``'s figures come from short samples, each within
    one slice, which never pay for the caches another process left cold at every switch. Every
    rank of ``group`` runs passes over ``specs``' calls (``_op_pass``) for ``seconds``, first
    the group's first ``concurrent`` ranks alone (the others wait), then all of them; the
    ranks' mean CPU a pass (the thread's clock), all over alone, the median of ``rounds``,
    clamped to [1, 2]. 1.0 where torch.distributed is not initialised, where the group (None:
    the default one) has ``concurrent`` ranks or fewer, or on a CUDA device (a GPU is no CPU
    slice). On this 2-core box, 4 Gloo processes (2026-12-06):
    a forward and backward of fidelity.py's GPT-2 at 4 rows took 1.05x the CPU of 2
    processes, at 2 rows 1.075x. Collective: every rank of the group calls it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 1.0
    size = dist.get_world_size(group)
    device = torch.device(device or "cpu")
    if device.type != "cpu" or size <= max(1, concurrent):
        return 1.0
    run = _op_pass(specs, device)
    ran = torch.tensor([1.0 if run is not None else 0.0], dtype=torch.float64, device=device)
    dist.all_reduce(ran, op=dist.ReduceOp.MIN, group=group)
    if not ran.item():
        return 1.0
    mine = dist.get_rank(group)

    def cpu_per_pass(active: bool) -> torch.Tensor:
        dist.barrier(group=group)
        if not active:
            out = torch.zeros(2, dtype=torch.float64, device=device)
        else:
            run()  # after the wait: the caches as the pass leaves them
            passes, cpu0, wall0 = 0, time.thread_time(), time.perf_counter()
            while time.perf_counter() - wall0 < seconds:
                run()
                passes += 1
            out = torch.tensor([(time.thread_time() - cpu0) / passes, 1.0], dtype=torch.float64, device=device)
        dist.all_reduce(out, group=group)
        return out[0] / out[1]

    ratios = []
    for _ in range(max(1, rounds)):
        alone = cpu_per_pass(mine < concurrent)
        together = cpu_per_pass(True)
        ratios.append(float(together / alone))
    return min(2.0, max(1.0, statistics.median(ratios)))


# ---- collective measurement -----------------------------------------------------------


def _fit_alpha_beta(sizes: list[int], times: list[float]) -> tuple[float, float]:
    """Least squares t = alpha + beta x bytes, constrained to alpha >= 0 and beta >= 0."""
    n = len(sizes)
    mx = sum(sizes) / n
    mt = sum(times) / n
    sxx = sum((x - mx) ** 2 for x in sizes)
    beta = sum((x - mx) * (t - mt) for x, t in zip(sizes, times)) / sxx if sxx > 0 else 0.0
    alpha = mt - beta * mx
    if beta < 0:  # flat or noisy: a constant
        return max(mt, 0.0), 0.0
    if alpha < 0:  # the line through the origin that fits best
        sxx0 = sum(x * x for x in sizes)
        return 0.0, (sum(x * t for x, t in zip(sizes, times)) / sxx0 if sxx0 > 0 else 0.0)
    return alpha, beta


def _collective_call(kind: str, nbytes: int, world: int, device: torch.device, group):
    import torch.distributed as dist

    elem = 4  # float32
    per = max(1, nbytes // (elem * world))  # a multiple of the world size in elements
    numel = per * world
    if kind == "all_reduce":
        buf = torch.ones(numel, device=device)
        return (lambda: dist.all_reduce(buf, group=group)), numel * elem
    if kind == "all_gather":
        inp, out = torch.ones(per, device=device), torch.empty(numel, device=device)
        return (lambda: dist.all_gather_into_tensor(out, inp, group=group)), numel * elem
    if kind == "reduce_scatter":
        inp, out = torch.ones(numel, device=device), torch.empty(per, device=device)
        return (lambda: dist.reduce_scatter_tensor(out, inp, group=group)), numel * elem
    if kind == "all_to_all":
        inp, out = torch.ones(numel, device=device), torch.empty(numel, device=device)
        return (lambda: dist.all_to_all_single(out, inp, group=group)), numel * elem
    if kind == "broadcast":
        buf = torch.ones(numel, device=device)
        return (lambda: dist.broadcast(buf, src=dist.get_global_rank(group, 0) if group is not None else 0,
                                       group=group)), numel * elem
    raise ValueError(f"unknown collective {kind!r} (known: {_COLLECTIVES})")


def measure_collectives(*, sizes: Iterable[int] = DEFAULT_COLLECTIVE_SIZES, kinds: Iterable[str] = _COLLECTIVES,
                        repeats: int = 5, group=None, device: "str | torch.device | None" = None,
                        subgroups: bool = False) -> dict:
    """The collective part of a profile document: {"collectives", "skipped"}; every rank of
    the group must call it (it is collective). Empty when torch.distributed is not initialised
    or the group has one rank. Each kind is fitted per group size (the cost model prices a
    plan's group by the fit of its size). ``subgroups``: also every smaller size that divides
    the group, as a plan's mesh axes run them: the group cut into consecutive blocks of that
    size, every block measuring at once (on shared cores, four ranks in two pairs do not move
    bytes as one pair alone does). Needs ``group`` to be the default group (new groups are
    made from global ranks)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return {"collectives": {}, "skipped": {}}
    world = dist.get_world_size(group)
    if world < 2:
        return {"collectives": {}, "skipped": {}}
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" \
            else torch.device("cpu")
    device = torch.device(device)
    if subgroups and group not in (None, dist.group.WORLD):
        raise ValueError("measure_collectives: subgroups=True measures blocks of the default group; pass group=None")
    # (size, this rank's group of that size); every rank makes every group, in one order.
    groups = [(world, group)]
    if subgroups:
        rank = dist.get_rank()
        for size in range(2, world):
            if world % size:
                continue
            blocks = [dist.new_group(list(range(first, first + size))) for first in range(0, world, size)]
            groups.append((size, blocks[rank // size]))
    fits, skipped = {}, {}
    for kind in kinds:
        for size, mine in groups:
            try:
                alpha, beta = _fit_kind(kind, sizes, size, mine, group, device, repeats)
            except (RuntimeError, NotImplementedError, ValueError) as e:
                # Every rank fails the same way on an unsupported collective (same backend).
                skipped[f"collective:{kind}"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                fits.pop(kind, None)
                break
            fits.setdefault(kind, {})[str(size)] = {"alpha": alpha, "beta": beta}
    return {"collectives": fits, "skipped": skipped}


def _fit_kind(kind: str, sizes: Iterable[int], size: int, mine, everyone, device: torch.device,
              repeats: int) -> tuple[float, float]:
    """alpha + beta x bytes of ``kind`` on ``mine`` (a group of ``size`` ranks), every group of
    ``everyone`` running its own at once, each sample started together."""
    import torch.distributed as dist

    xs, ts = [], []
    for nbytes in sizes:
        raw, moved = _collective_call(kind, int(nbytes), size, device, mine)

        def call(raw=raw):
            # torch >= 2.13 deprecates the *_tensor names; they still run the same
            # collective, and the replacements do not exist in older releases.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                raw()

        call()  # warm-up (and the first connection)
        # The slowest rank's median: a collective ends when its last member does, and every
        # rank then fits the same line.
        xs.append(moved)
        ts.append(_slowest_median(call, device, repeats, everyone if everyone is not None else dist.group.WORLD))
    return _fit_alpha_beta(xs, ts)


def _timed_calls(call: Callable[[], Any], device: torch.device, repeats: int,
                 before: Callable[[], Any] = lambda: None) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``call``, each after ``before`` (untimed)."""
    samples = []
    for _ in range(repeats):
        before()
        _sync(device)
        t0 = time.perf_counter()
        call()
        _sync(device)
        samples.append(time.perf_counter() - t0)
    return samples


def _slowest_median(call: Callable[[], Any], device: torch.device, repeats: int, group,
                    prepare: Callable[[], Any] = lambda: None) -> float:
    """Median seconds of ``call``, each sample after ``prepare`` (untimed); with ``group`` (a
    process group whose every rank calls this) each sample starts with its ranks together and
    the slowest rank's median is returned on all of them. ``group`` None: this process alone."""
    import torch.distributed as dist

    def before() -> None:
        if group is not None:
            dist.barrier(group=group)
        prepare()

    seconds = statistics.median(_timed_calls(call, device, repeats, before))
    if group is not None:
        t = torch.tensor([seconds], dtype=torch.float64, device=device)  # NCCL reduces CUDA tensors only
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        seconds = float(t.item())
    return seconds


def measure_sync_wait(*, compute_s: float = 0.01, iterations: int = 12, rounds: int = 5, group=None,
                      device: "str | torch.device | None" = None, shared_cores: bool | None = None) -> float:
    """Seconds a blocking collective costs in a program beyond its fit (``Profile.sync_wait``;
    csrc/cost/profiled_cost.h): every rank of ``group`` computes about ``compute_s`` (a matmul
    loop, all ranks at once, as a program's ranks run), then all-reduces a small buffer. A fit
    times each collective back to back, its ranks started together; in a program each rank
    arrives after its own compute and waits for the last one and for the library's threads to
    wake. Every rank must call it (collective); 0 when torch.distributed is not initialised or
    the group has one rank. The median of ``rounds`` (one round's figure moves by a millisecond).

    How the wait costs the step depends on whether the ranks share cores (``shared_cores``;
    None: decided by ``ranks_share_cores``, every rank the same way):

    - each rank on its own core (or GPU): a waiting rank's core idles, so the step pays each
      call's whole time after the compute. Measured per call: the mean over calls (a program
      pays the slow ones too) less the call's median alone, started together, as a fit times it.
      On this 2-core CPU, 2 Gloo processes (2026-12-07): 0.9 to 1.7 ms, where a tensor-parallel
      plan's 2 MB gathers and reduce-scatters ran 1.1 to 2.2 ms over their fits and copies
      (torch.profiler, rank programs of benchmarks/fidelity.py).
    - ranks sharing cores: a waiting rank's core runs another rank's compute, which the op times
      already price at the shared rate; the per-call time would count it twice (6 to 8 ms at 4
      processes). Measured as the step grows instead: the loop of compute and all-reduce less
      the compute loop and the all-reduce loop, each timed alone. 0.8 to 3.3 ms at 4 processes.

    ``rounds`` x ``iterations`` of each loop: about 1 s at 2 processes, 3 s at 4."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) < 2:
        return 0.0
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" \
            else torch.device("cpu")
    device = torch.device(device)
    if shared_cores is None:
        shared_cores = ranks_share_cores(group, device)
    a = torch.randn(256, 256, device=device)
    small = torch.zeros(256, device=device)

    def timed(fn) -> float:
        fn()  # warm-up
        dist.barrier(group=group)
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(iterations):
            fn()
        _sync(device)
        return (time.perf_counter() - t0) / iterations

    def mean_over_ranks(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(t, group=group)
        return float(t.item()) / dist.get_world_size(group)

    # The compute's length in products, as the ranks run them together (on shared cores, slower).
    one = mean_over_ranks(timed(lambda: a @ a))
    products = max(1, round(compute_s / max(one, 1e-7)))

    def compute():
        for _ in range(products):
            a @ a

    def collective():
        dist.all_reduce(small, group=group)

    def both():
        compute()
        collective()

    # Each the ranks' mean: a rank's compute is what the evaluator prices; a synchronised loop's
    # ranks agree anyway.
    waits = []
    for _ in range(rounds):
        if shared_cores:
            alone = mean_over_ranks(timed(compute))
            reduce = mean_over_ranks(timed(collective))
            together = mean_over_ranks(timed(both))
            waits.append(together - alone - reduce)
        else:
            collective()  # warm-up
            started = _timed_calls(collective, device, iterations, lambda: dist.barrier(group=group))
            dist.barrier(group=group)
            after = _timed_calls(collective, device, iterations, compute)
            waits.append(mean_over_ranks(statistics.mean(after)) - mean_over_ranks(statistics.median(started)))
    return max(0.0, statistics.median(waits))


def ranks_share_cores(group=None, device: "str | torch.device | None" = None) -> bool:
    """Whether some rank of ``group`` shares its host's cores with others (collective: every
    rank answers the same). CUDA ranks each have their device: False. Otherwise a host whose
    ranks x torch threads exceed the cores this process may run on."""
    import socket

    import torch.distributed as dist

    if device is None:
        device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    if torch.device(device).type == "cuda":
        return False
    hosts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    here = hosts.count(socket.gethostname())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    mine = torch.tensor([1.0 if cores_shared(here, torch.get_num_threads(), cores) else 0.0], device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=group)
    return bool(mine.item() > 0)


def cores_shared(ranks: int, threads: int, cores: int) -> bool:
    """True when `ranks` processes of `threads` torch threads each outnumber `cores`."""
    return ranks * max(1, threads) > max(1, cores)


def measure_optimizer(elements: int = 4 << 20, *, tensors: int = 16, dtype: torch.dtype = torch.float32,
                      device: "str | torch.device | None" = None, repeats: int = 5, group=None) -> dict:
    """The optimizer part of a profile document: {"name": "AdamW", "seconds_per_element": s}.
    ``torch.optim.AdamW`` (its default implementation) steps ``elements`` parameters of
    ``dtype`` in ``tensors`` tensors, each sample after a cache flush (a step's optimizer
    finds its states cold); the median sample over the elements. With ``group`` (a process
    group, ``dist.group.WORLD`` for the default one; every rank of it must call this), its
    ranks step at once, as a step's ranks do (on shared cores they share them), and the
    slowest rank's median is kept: every rank's profile says the same. Without, this process
    alone. The cost model prices a rank's optimizer as the elements it holds the state of
    times this (the analytic rule reads and writes the states at 75% of the memory
    bandwidth; on this 2-core machine, 4 processes, AdamW's step took over twice that)."""
    import torch.distributed as dist

    if elements < tensors or tensors < 1:
        raise ValueError(f"measure_optimizer: {elements} elements in {tensors} tensors")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    each = elements // tensors
    params = [torch.nn.Parameter(torch.randn(each, dtype=dtype, device=device)) for _ in range(tensors)]
    for q in params:
        q.grad = torch.randn_like(q)
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    optimizer.step()  # the states made (the first step allocates them)
    live = group is not None and dist.is_available() and dist.is_initialized()
    seconds = _slowest_median(optimizer.step, device, repeats, group if live else None,
                              prepare=lambda: _flush_caches(device))
    return {"name": "AdamW", "seconds_per_element": max(seconds, 1e-12) / (each * tensors)}


# ---- the entry point ---------------------------------------------------------------------


def sharing(cluster, rank: int) -> tuple[float, int]:
    """(shared_by, concurrent) of measure_specs for ``rank``'s node of ``cluster``: its
    compute_alone (1 where it has none), and how many of its ranks run at once without
    sharing a core (its ranks / compute_alone)."""
    doc = json.loads(cluster.to_json())
    node = doc["nodes"][cluster.node_of(rank)]
    alone = float(node.get("compute_alone", 1.0))
    ranks = sum(run["count"] for run in node["devices"]) if "devices" in node else node["count"]
    return alone, max(1, round(ranks / alone))


def profile(model_or_graph, example_inputs: Any = (), *, budget_s: float = 30.0,
            device: "str | torch.device | None" = None, warmup: int = 1, repeats: int = 5,
            collectives: bool | None = None, collective_sizes: Iterable[int] = DEFAULT_COLLECTIVE_SIZES,
            group=None, progress: bool = True, plans: Iterable | None = None, cluster=None,
            optimizer: bool = True, **capture_kwargs) -> Profile:
    """Measures a graph's ops on this device (and, when torch.distributed is initialised,
    the process group's collectives) into a ``shardwise.Profile``.

    model_or_graph: a ``shardwise.Graph``, or an ``nn.Module`` captured first with
    ``shardwise.capture(model, example_inputs, **capture_kwargs)``. budget_s bounds the op
    measurement (what is left stays analytic). collectives: None measures them when a process
    group is initialised; every rank must then call profile() (the collectives are collective).
    optimizer: also time AdamW's step (``measure_optimizer``), which then prices the plans'
    optimizer.

    plans (with ``cluster``): ``shardwise.Plan``s of the graph; their ops are measured first
    at the shapes one rank of each runs them (``plan_specs``), so ``Plan.price(...,
    profile=)`` prices what each rank runs rather than scaling the whole graph's times (issue
    46, item 7). With a process group, its first ranks (as many as the node has cores for)
    measure them together for all, at the rate its node's ranks share (``measure_specs``:
    ``shared_by`` is the cluster's compute_alone).
    """
    from .graph import Graph

    if isinstance(model_or_graph, Graph):
        graph = model_or_graph
    elif isinstance(model_or_graph, torch.nn.Module):
        from .capture import capture

        graph = capture(model_or_graph, example_inputs, **capture_kwargs)
    else:
        raise TypeError(f"profile expects a shardwise.Graph or a torch.nn.Module, got {type(model_or_graph).__name__}")

    import torch.distributed as dist

    live = dist.is_available() and dist.is_initialized()
    specs = []
    if plans is not None:
        if cluster is None:
            raise TypeError("profile(plans=...) needs cluster= (the plans' per-rank shapes are priced on it)")
        specs = plan_specs(graph, cluster, plans)
    seen = {s["signature"] for s in specs}
    specs += [s for s in graph_specs(graph) if s["signature"] not in seen]
    doc = {"format": "shardwise.profile", "version": 1}
    shared = plans is not None and live
    shared_by, concurrent = sharing(cluster, dist.get_rank()) if shared else (1.0, 1)
    doc.update(measure_specs(specs, device=device, budget_s=budget_s, warmup=warmup, repeats=repeats,
                             progress=progress, group=(group or dist.group.WORLD) if shared else None,
                             shared_by=shared_by, concurrent=concurrent))
    if collectives is None:
        collectives = live
    if collectives:
        measured = measure_collectives(sizes=collective_sizes, repeats=repeats, group=group)
        doc["collectives"] = measured["collectives"]
        doc["skipped"].update(measured["skipped"])
        # Where the plans' cluster says how the ranks share cores, that; else this host's count.
        doc["sync_wait"] = measure_sync_wait(group=group, shared_cores=shared_by > 1 if shared else None)
    else:
        doc["collectives"] = {}
    if optimizer:  # with the group's ranks at once only where all of them call profile() (collectives)
        doc["optimizer"] = measure_optimizer(repeats=repeats, device=device,
                                             group=(group or dist.group.WORLD) if live and collectives else None)
    return Profile.from_json(json.dumps(doc))
