"""shardwise.Cluster: the machines a plan runs on, and what collectives cost on them.

A thin Python face over ``shardwise._C.Cluster`` (csrc/cost/cluster.h); every number,
the presets and the alpha-beta collective model (csrc/cost/collective_cost.h) come from
the C++ core, so the planner and the user see the same figures.

    >>> c = Cluster.preset("dgx-a100", nodes=2)
    >>> c.world_size, c.devices[:2]
    (16, ['a100-sxm4-80gb', 'a100-sxm4-80gb'])
    >>> c.collective_time("all_reduce", list(range(16)), 1 << 30)   # seconds
    0.01168...

``bytes`` is always a whole buffer: the all-reduce buffer, the all-gather *output*, the
reduce-scatter *input*, each rank's all-to-all buffer, the broadcast buffer, the message
of a send/recv (see csrc/cost/collective_cost.h).
"""
from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import statistics
import time
from typing import Iterable

from . import _C
from ._core_property import core_property
from ._logging import get_logger

log = get_logger(__name__)

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
ALGORITHMS = ("auto", "ring", "hierarchical")


class Cluster:
    """Device types, nodes and the link hierarchy; immutable, compared by value."""

    def __init__(self, core: "_C.Cluster"):
        self._core = core

    # ---- construction -------------------------------------------------------
    @classmethod
    def preset(cls, name: str, nodes: int = 1) -> "Cluster":
        """A named cluster with published hardware numbers (``Cluster.preset_names()``).
        For ``"cpu"`` the count is the number of processes on the one machine."""
        return cls(_C.Cluster.preset(name, nodes))

    @staticmethod
    def preset_names() -> list[str]:
        return list(_C.cluster_preset_names())

    @classmethod
    def from_json(cls, text_or_path: "str | os.PathLike[str]") -> "Cluster":
        """From JSON text, or from the path of a JSON file (a ``str`` that does not start
        with ``{`` is taken as a path)."""
        if isinstance(text_or_path, os.PathLike) or not str(text_or_path).lstrip().startswith("{"):
            with open(text_or_path, encoding="utf-8") as f:
                text = f.read()
            try:
                return cls(_C.Cluster.from_json(text))
            except _C.ShardwiseError as e:  # the same error, naming the file
                raise type(e)(f"{os.fspath(text_or_path)}: {e}") from None
        return cls(_C.Cluster.from_json(str(text_or_path)))

    @classmethod
    def detect(cls, *, measure_links: bool = False, measure_compute: bool | None = None) -> "Cluster":
        """This machine and, under torchrun, its peers: every rank describes its own device,
        and ranks that find different kinds (an A100 node and a V100 node, torch's device
        names) make a mixed cluster, each node with its runs of kinds ("detected mixed 8 x
        a100-sxm4-80gb + 8 x v100-sxm2-32gb"), a kind's link speeds under per_device where its
        own description differs from rank 0's. Measured figures agree across the ranks of one
        kind. A device slower than its kind (throttled, partly failed) is declared in a cluster
        file instead: a device type ``{"name", "like", "speed"}`` (docs/cost-model.md).

        World size: ``torch.distributed`` when it is initialised, else 1 rank. Ranks per
        node: ``LOCAL_WORLD_SIZE`` (set by torchrun), else all of them on one node.

        CUDA (the current device, when CUDA is available):
          - peak_flops: measured, per precision (f32 with TF32 off, tf32, bf16, f16, and fp8 where
            the device has FP8 units: torch._scaled_mm with rowwise scales), from a
            timed square GEMM (n = 4096, less when free memory is short; the median of a few
            runs after warm-ups; well under a second on an H100), written in the cost model's
            terms: the peak under which it prices that GEMM at the measured time
            (``_C.peak_for_measured_gemm``; a measured memory bandwidth likewise,
            ``_C.bandwidth_for_measured_copy``), not the achieved rate, to which the model
            would apply its efficiencies a second time. A precision whose timing
            fails keeps the catalogue's figure (A100, H100, V100) or, for an unknown GPU, a
            rough estimate from the device's properties.
          - memory_bytes: the device's total memory, as torch reports it.
          - memory_bandwidth: the catalogue's figure, else a conservative guess (not measured).
        CPU (otherwise): one process per rank, sharing this machine's cores and memory; FLOP/s
        and memory bandwidth are estimates from the catalogue's per-core figures, or, with
        ``measure_compute``, measured as on CUDA: a timed square GEMM per precision (n = 1024,
        or the largest power of two from 256 whose run takes at most 0.1 s: a CPU's f16 without
        half-precision units; tf32 is f32 on a CPU) and a timed copy, on every rank at once, so
        that ranks sharing cores measure their share (about a second).
        When the processes share fewer cores than their threads, a process computing alone
        (a pipeline stage while the others wait) runs faster than its share: the node's
        ``compute_alone`` is min(threads, cores) / (cores / processes), and the evaluator
        prices a pipeline's compute as the larger of its path at that rate and the node's
        cores kept busy (docs/cost-model.md).
        ``measure_compute``: None (default) measures on CUDA only; False never measures.

        Links: with ``measure_links`` (and an initialised process group of several ranks), an
        all-reduce and an all-gather are timed at a few sizes on each link level the job's ranks
        use (inside a node, and between nodes: one rank per node), and the link's bandwidth,
        latency and call overhead (what every collective pays once) are fitted so that the cost
        model's ring all-reduce and all-gather reproduce the measured times. Levels
        not measured (or whose fit fails) keep the matching preset's figures, or conservative
        PCIe / network ones. On CPU processes it also measures what a collective run beside
        compute costs (the nodes' ``overlap_interference``): a GEMM loop and an all-reduce of
        about the same length, timed alone and together on every rank at once; each second
        of all-reduce beside the loop adds (together - the longer alone) / the shorter alone
        to the step (Gloo's threads take the cores the compute needs; on 2 cores, 2
        processes measured 0.8 to 1.0, 4 processes 0.8 to 1.4). On CUDA it keeps the constant
        (cost/constants.h: kOverlapInterference).

        Collective: under an initialised process group of several ranks every rank must call
        ``detect`` together, with the same ``measure_links``: measured figures are agreed
        across the ranks (the slowest rank's), so that every rank plans on the same cluster.
        How each figure was obtained is recorded in the cluster's name
        ("detected ... [measured: peak_flops, links.nvswitch; device: memory_bytes; ...]").
        """
        world, per_node = _world_and_local_sizes()
        try:
            import torch

            cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
        except ImportError:  # pragma: no cover - torch is a dependency
            cuda = False
        if cuda:
            doc, sources = _detect_cuda(world, per_node, measure_compute is not False)
        else:
            doc, sources = _detect_cpu(world, per_node, bool(measure_compute))
        if world > 1 and _distributed():
            doc = _mixed_job(doc, world, per_node)
        if measure_links and world > 1:
            _measure_links(doc["links"], world, per_node, sources)
            if not cuda:
                _measure_overlap(doc, world, sources)
        doc["name"] += f" [{_describe_sources(sources)}]"
        return cls(_C.Cluster.from_json(json.dumps(doc)))

    # ---- serialisation ------------------------------------------------------
    def to_json(self, indent: int | None = None) -> str:
        return self._core.to_json(-1 if indent is None else indent)

    def save(self, path: "str | os.PathLike[str]") -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json(indent=2))
            f.write("\n")

    # ---- queries ------------------------------------------------------------
    name = core_property("name", "The cluster's name (a preset's, or what Cluster.detect measured).")
    world_size = core_property("world_size", "Devices in all (ranks).")
    num_nodes = core_property("num_nodes")
    heterogeneous = core_property("heterogeneous", "Whether its ranks have more than one device type.")

    @property
    def devices(self) -> list[str]:
        """The device type name of every rank, in rank order."""
        return self._core.devices()

    def device_of(self, rank: int) -> dict:
        """The device type of a rank: name, peak_flops (per precision), memory_bytes,
        memory_bandwidth."""
        return self._core.device_of(rank)

    def node_of(self, rank: int) -> int:
        return self._core.node_of(rank)

    def local_rank(self, rank: int) -> int:
        return self._core.local_rank(rank)

    def span_of(self, ranks: Iterable[int]) -> dict:
        """The outermost link level a group crosses and the nodes it covers."""
        return self._core.span_of(list(ranks))

    # ---- collective cost ----------------------------------------------------
    def collective_time(self, kind: str, ranks: Iterable[int], bytes: int, algorithm: str = "auto") -> float:
        """Seconds for one collective (``kind`` in COLLECTIVES, ``algorithm`` in ALGORITHMS)."""
        return self._core.collective_time(kind, list(ranks), int(bytes), algorithm)

    def collective_estimate(self, kind: str, ranks: Iterable[int], bytes: int,
                            algorithm: str = "auto") -> tuple[float, str]:
        """(seconds, algorithm priced): "auto" resolves to "ring" or "hierarchical"."""
        return self._core.collective_estimate(kind, list(ranks), int(bytes), algorithm)

    # ---- value semantics ----------------------------------------------------
    def first_ranks(self, count: int) -> "Cluster":
        """The cluster of this one's first ``count`` ranks (whole nodes, then part of the next):
        one pipeline stage's sub-mesh under Megatron's rank layout."""
        return Cluster(self._core.first_ranks(int(count)))

    def rank_range(self, first: int, count: int) -> "Cluster":
        """The cluster of ranks ``first`` .. ``first + count - 1``: a pipeline stage's sub-mesh of
        its own size (``Plan.stage_meshes``)."""
        return Cluster(self._core.rank_range(int(first), int(count)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cluster) and self._core == other._core

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        return f"<Cluster {self._core.summary()}>"


# ---- detection -----------------------------------------------------------------

def _world_and_local_sizes() -> tuple[int, int]:
    world = 1
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            world = dist.get_world_size()
    except ImportError:  # pragma: no cover
        pass
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    except ValueError:
        local = world
    if local < 1 or local > world or world % local != 0:
        local = world  # inconsistent environment: one node
    return world, local


def _distributed() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return False
    return dist.is_available() and dist.is_initialized()


def _mixed_job(doc: dict, world: int, per_node: int) -> dict:
    """The cluster every rank describes, from each rank's own device: `doc` as it is when
    every rank found the same kind of device, else a mixed cluster: each kind its device type
    (its ranks' figures agreed, _measure_device), each node its ranks' runs of kinds, and the
    links of rank 0's description, with a kind whose own description puts another speed on a
    level recorded under that level's per_device. Collective over the default group."""
    import torch.distributed as dist

    every: list = [None] * world
    dist.all_gather_object(every, (doc["device_types"][0], doc["links"]))
    kinds: dict[str, dict] = {}
    for device, _ in every:
        known = kinds.setdefault(device["name"], dict(device))
        known["memory_bytes"] = min(known["memory_bytes"], device["memory_bytes"])
    if len(kinds) == 1:
        return doc
    nodes = []
    for n in range(world // per_node):
        runs: list[dict] = []
        for device, _ in every[n * per_node:(n + 1) * per_node]:
            if runs and runs[-1]["device"] == device["name"]:
                runs[-1]["count"] += 1
            else:
                runs.append({"device": device["name"], "count": 1})
        nodes.append({"devices": runs})
    links = [dict(level) for level in every[0][1]]
    for device, own in every:
        for level, theirs in zip(links, own):
            speed = {"bandwidth": theirs["bandwidth"], "latency": theirs["latency"]}
            if device["name"] != every[0][0]["name"] and speed != {k: level[k] for k in speed}:
                level.setdefault("per_device", {})[device["name"]] = speed
    counts = collections.Counter(device["name"] for device, _ in every)
    name = "detected mixed " + " + ".join(f"{c} x {k}" for k, c in counts.items())
    return {**doc, "name": name, "device_types": list(kinds.values()), "nodes": nodes, "links": links}


def _catalogue(name: str) -> dict:
    for t in _C.known_device_types():
        if t["name"] == name:
            return dict(t)
    raise KeyError(name)


def _preset_links(name: str) -> list[dict]:
    return json.loads(_C.Cluster.preset(name, 1).to_json())["links"]


def _uniform(name: str, device: dict, world: int, per_node: int, links: list[dict]) -> dict:
    nodes = [{"device": device["name"], "count": per_node} for _ in range(world // per_node)]
    if len(nodes) == 1:
        links = links[:1]  # one machine: the inner level is the whole hierarchy
    return {"format": "shardwise.cluster", "version": 1, "name": name,
            "device_types": [device], "nodes": nodes, "links": links}


def _machine_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 4 << 30


def _machine_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _compute_alone(per_node: int) -> float:
    """How many times faster one of a node's processes computes while the others idle than
    its share of the cores (the node's "compute_alone", csrc/cost/cluster.h): a process
    uses at most its threads' worth of cores; its share is cores / processes."""
    import torch

    cores = _machine_cores()
    share = cores / max(1, per_node)
    return max(1.0, min(torch.get_num_threads(), cores) / share)


def _detect_cpu(world: int, per_node: int, measure: bool = False) -> tuple[dict, dict[str, str]]:
    """One CPU process per rank. The catalogue's "cpu" type is about one core; each of
    the node's processes gets cores / processes of it in FLOP/s (fractions when the
    machine is oversubscribed) and memory / processes. Memory bandwidth is never scaled
    up: one process rarely streams faster than one core's share of the channels.
    Returns the cluster document and how each figure was obtained (``_describe_sources``)."""
    base = _catalogue("cpu")
    share = _machine_cores() / per_node
    device = {
        "name": "cpu",
        "peak_flops": {k: v * share for k, v in base["peak_flops"].items()},
        "memory_bytes": max(1, _machine_memory() // per_node),
        "memory_bandwidth": base["memory_bandwidth"] * min(share, 1.0),
    }
    # Between machines: 10 GbE, a conservative guess for CPU clusters; Gloo's own cost per call
    # as on loopback (the preset's, measured: cost/cluster_presets.cc).
    loopback = _preset_links("cpu")
    network = {"name": "ethernet", "bandwidth": 1.25e9 / per_node, "latency": 5e-5,
               "call_overhead": loopback[0].get("call_overhead", 0.0)}
    doc = _uniform(f"detected cpu ({world} process{'es' if world != 1 else ''})", device, world, per_node,
                   loopback + [network])
    alone = _compute_alone(per_node)
    if alone > 1.0:
        for node in doc["nodes"]:
            node["compute_alone"] = alone
    sources = {"peak_flops": "estimated", "memory_bytes": "machine", "memory_bandwidth": "catalogue",
               "links.loopback": "preset"}
    if len(doc["links"]) > 1:
        sources["links.ethernet"] = "estimated"
    if measure:
        import torch

        del sources["peak_flops"]
        _measure_device(doc["device_types"][0], torch.device("cpu"), world, sources, "estimated")
    return doc, sources


# torch's device names ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB",
# "NVIDIA A100 80GB PCIe", ...) -> (catalogue type, preset whose links a node of them has).
def _match_gpu(name: str) -> tuple[str, str | None] | None:
    upper = name.upper()
    pcie = "PCIE" in upper
    # H200: H100's compute and NVLink with more and faster HBM (capacity from the device, and
    # the bandwidth measured, so the H100 entry's are not used).
    if ("H100" in upper or "H200" in upper) and not pcie:
        return "h100-sxm5-80gb", "dgx-h100"
    if "A100" in upper:
        return ("a100-pcie-80gb", None) if pcie else ("a100-sxm4-80gb", "dgx-a100")
    if "V100" in upper:
        return ("v100-pcie-32gb", None) if pcie else ("v100-sxm2-32gb", "v100")
    return None


def _estimate_from_properties(props) -> dict:
    """Unknown GPU: a rough, low estimate from its properties at an assumed 1.4 GHz, 64 FP32
    lanes per SM, and tensor cores as on V100 (sm70) / A100 (sm80+)."""
    sms, clock = props.multi_processor_count, 1.4e9
    f32 = sms * 64 * 2 * clock
    tensor = sms * (1024 if props.major >= 8 else 512 if props.major >= 7 else 0) * 2 * clock
    half = max(tensor, f32)
    return {"peak_flops": {"f32": f32, "tf32": half / 2 if props.major >= 8 else f32,
                           "bf16": half if props.major >= 8 else f32, "f16": half},
            "memory_bandwidth": 5e11}


def _detect_cuda(world: int, per_node: int, measure: bool = True) -> tuple[dict, dict[str, str]]:
    """The current CUDA device, ``world`` of them, ``per_node`` to a node (``Cluster.detect``
    says which figures are measured). Returns the cluster document and how each figure was
    obtained (``_describe_sources``)."""
    import torch

    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    match = _match_gpu(props.name)
    device = _catalogue(match[0]) if match is not None else _estimate_from_properties(props)
    estimate_source = "catalogue" if match is not None else "estimated"
    sources = {"memory_bytes": "device", "memory_bandwidth": estimate_source}
    # Name from torch and capacity as torch reports it: the GPU may be a variant of the
    # catalogue entry (40GB A100) and usable memory is what the planner must fit in. The name
    # is the kind measured figures agree over (_measure_device).
    device["name"] = "-".join(props.name.lower().replace("nvidia", "").split()) or "cuda"
    device["memory_bytes"] = int(props.total_memory)
    if measure:
        _measure_device(device, torch.device("cuda", index), world, sources, estimate_source)
    else:
        sources["peak_flops"] = estimate_source
    if match is not None and match[1] is not None:
        links = _preset_links(match[1])
        link_source = "preset"
    else:
        # PCIe Gen3 x16 inside the node, a 100 Gb/s NIC shared by the node between nodes.
        links = [{"name": "pcie", "bandwidth": 16e9, "latency": 5e-6},
                 {"name": "network", "bandwidth": 12.5e9 / per_node, "latency": 1e-5}]
        link_source = "estimated"
    doc = _uniform(f"detected {props.name} x{world}", device, world, per_node, links)
    sources.update({f"links.{link['name']}": link_source for link in doc["links"]})
    return doc, sources


# ---- measurement -----------------------------------------------------------------------

def _measure_device(device: dict, where, world: int, sources: dict[str, str], estimate_source: str) -> None:
    """`device`'s peak FLOP/s per precision and memory bandwidth measured on `where` (in place),
    agreed across the ranks: every rank must describe the same cluster (each plans on it and
    the plans' hashes are compared), so the slowest rank's figures, and "measured" only where
    every rank measured."""
    measured = _measure_peak_flops(where, device["peak_flops"])
    precisions = sorted(device["peak_flops"])
    agreed = _agree_across_ranks([measured.get(p, device["peak_flops"][p]) for p in precisions] +
                                 [1.0 if p in measured else 0.0 for p in precisions], world, "min", device["name"])
    flops, was_measured = agreed[:len(precisions)], agreed[len(precisions):]
    device["peak_flops"] = dict(zip(precisions, flops))
    for p, ok in zip(precisions, was_measured):
        sources[f"peak_flops.{p}"] = "measured" if ok else estimate_source
    bandwidth = _measure_memory_bandwidth(where)
    bandwidth, bandwidth_measured = _agree_across_ranks([bandwidth or device["memory_bandwidth"],
                                                        1.0 if bandwidth else 0.0], world, "min", device["name"])
    device["memory_bandwidth"] = bandwidth
    if bandwidth_measured:
        sources["memory_bandwidth"] = "measured"


GEMM_SIZE = 4096  # large enough for cuBLAS to reach its peak on an A100 / H100, ~0.2 GB in f32
CPU_GEMM_SIZE = 1024  # a CPU's BLAS is near its peak here; 2 GFLOP, ~0.02-0.1 s per f32 run on a core
_GEMM_WARMUPS, _GEMM_REPEATS = 2, 5


def _gemm_dtype(precision: str):
    import torch

    dtypes = {"f32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    if precision not in dtypes:
        raise ValueError(f"no GEMM for precision {precision!r} (known: {', '.join(dtypes)})")
    return dtypes[precision]


@contextlib.contextmanager
def _tf32_matmul(enabled: bool):
    """TF32 on or off for cuBLAS matmuls in the block, restored after. Through the
    ``fp32_precision`` setting where torch has it: torch refuses to read the legacy
    ``allow_tf32`` flag once the new setting was used, so the legacy one is only the fallback."""
    import torch

    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        saved = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if enabled else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = saved
    else:  # pragma: no cover - torch before the fp32_precision setting
        saved = matmul.allow_tf32
        matmul.allow_tf32 = enabled
        try:
            yield
        finally:
            matmul.allow_tf32 = saved


def _gemm_size(device) -> int:
    """GEMM_SIZE, halved until the three n x n f32 matrices take at most a quarter of the
    device's free memory (another process may be using the rest); at least 512."""
    import torch

    if device.type == "cpu":
        return CPU_GEMM_SIZE
    try:
        free, _ = torch.cuda.mem_get_info(device)
    except (RuntimeError, AttributeError):  # no figure: assume room for the full size
        return GEMM_SIZE
    n = GEMM_SIZE
    while n > 512 and 3 * n * n * 4 > free / 4:
        n //= 2
    return n


def _median_seconds(run, device) -> float:
    """Seconds of one ``run()`` on ``device``: the median of _GEMM_REPEATS runs timed with CUDA
    events (a CPU device: the wall clock), after _GEMM_WARMUPS untimed ones (cuBLAS picks and
    loads its kernel on the first)."""
    import torch

    for _ in range(_GEMM_WARMUPS):
        run()
    if device.type == "cpu":
        times = []
        for _ in range(_GEMM_REPEATS):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    events = []
    for _ in range(_GEMM_REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize(device)
    return statistics.median(start.elapsed_time(end) for start, end in events) / 1e3  # ms -> s


def _time_square_gemm(n: int, precision: str, device) -> float:
    """Seconds of one n x n by n x n matmul at ``precision`` on ``device`` (_median_seconds)."""
    import torch

    if precision == "fp8":
        return _time_fp8_gemm(n, device)
    dtype = _gemm_dtype(precision)
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    out = torch.empty(n, n, dtype=dtype, device=device)
    if device.type == "cpu":  # no TF32 on a CPU: the f32 GEMM
        return _median_seconds(lambda: torch.mm(a, b, out=out), device)
    with _tf32_matmul(precision == "tf32"):
        return _median_seconds(lambda: torch.mm(a, b, out=out), device)


def _time_fp8_gemm(n: int, device) -> float:
    """Seconds of the product an fp8 plan's linears run (runtime/fp8.py): torch._scaled_mm of
    two n x n float8_e4m3fn matrices with rowwise scales, the second column-major, into bf16."""
    import torch

    fp8 = torch.float8_e4m3fn
    a = torch.randn(n, n, device=device).to(fp8)
    b = torch.randn(n, n, device=device).to(fp8).t()
    scale_a = torch.ones(n, 1, device=device)
    scale_b = torch.ones(1, n, device=device)
    return _median_seconds(lambda: torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b,
                                                    out_dtype=torch.bfloat16), device)


# A CPU's GEMM is timed at the largest size up to CPU_GEMM_SIZE whose run is predicted (n^3 from
# the size below) to take at most this long: a CPU without half-precision units runs f16 through
# a slow path (a 1024 x 1024 product in 2.2 s on a 2-core Xeon, against 0.02 s in f32), and detect
# times _GEMM_WARMUPS + _GEMM_REPEATS runs of each precision on every rank at once.
_CPU_GEMM_RUN_SECONDS = 0.1
_CPU_GEMM_SMALLEST = 256


def _time_cpu_gemm(precision: str, device) -> tuple[int, float]:
    """(n, seconds of one n x n GEMM at ``precision``): timed at 256, then at each doubling up to
    CPU_GEMM_SIZE while the next size's run is predicted within _CPU_GEMM_RUN_SECONDS."""
    n = _CPU_GEMM_SMALLEST
    seconds = _time_square_gemm(n, precision, device)
    while n < CPU_GEMM_SIZE and seconds * 8 <= _CPU_GEMM_RUN_SECONDS:
        n *= 2
        seconds = _time_square_gemm(n, precision, device)
    return n, seconds


def _measure_peak_flops(device, precisions: Iterable[str]) -> dict[str, float]:
    """FLOP/s of a square GEMM (2 n^3 floating-point operations) on ``device`` for each
    precision; a precision whose timing fails, or gives no positive finite figure, is left
    out (with a warning) for the caller to estimate."""
    size = _gemm_size(device)
    measured = {}
    for precision in precisions:
        n = size
        try:
            if device.type == "cpu":
                n, seconds = _time_cpu_gemm(precision, device)
            else:
                seconds = _time_square_gemm(n, precision, device)
        except Exception as e:  # noqa: BLE001 - any failure leaves the estimate, never breaks detect()
            log.warning("detect: timing a %dx%d %s GEMM on %s failed (%s: %s); using the estimate",
                        n, n, precision, device, type(e).__name__, e)
            continue
        flops = 2.0 * n ** 3 / seconds if seconds > 0 else float("nan")
        if not math.isfinite(flops) or flops <= 0:
            log.warning("detect: a %dx%d %s GEMM on %s timed %r s; using the estimate", n, n, precision, device,
                        seconds)
            continue
        # In the model's terms: the peak under which it prices this GEMM at this rate
        # (csrc/cost/op_cost.h, peak_for_measured_gemm); the achieved rate itself would have
        # the model's GEMM efficiency applied a second time.
        measured[precision] = _C.peak_for_measured_gemm(flops, n)
    return measured


COPY_BYTES = 256 << 20  # a device-to-device copy long enough to reach HBM's bandwidth
CPU_COPY_BYTES = 64 << 20  # well past the caches


def _time_device_copy(nbytes: int, device) -> float:
    """Seconds of one copy of `nbytes` between two buffers on ``device`` (_median_seconds)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return _median_seconds(lambda: dst.copy_(src), device)


def _measure_memory_bandwidth(device) -> float | None:
    """Bytes per second a device-to-device copy moves, counting what it reads and what it
    writes (as the cost model's memory-bound ops count both), or None when the timing fails
    or gives no positive finite figure (the caller keeps its estimate)."""
    nbytes = COPY_BYTES
    try:
        import torch

        if device.type == "cpu":
            nbytes = CPU_COPY_BYTES
        else:
            free, _ = torch.cuda.mem_get_info(device)
            while nbytes > (1 << 20) and 2 * nbytes > free // 4:
                nbytes //= 2
        seconds = _time_device_copy(nbytes, device)
    except Exception as e:  # noqa: BLE001 - any failure leaves the estimate, never breaks detect()
        log.warning("detect: timing a %d-byte copy on %s failed (%s: %s); using the estimate", nbytes, device,
                    type(e).__name__, e)
        return None
    bandwidth = 2.0 * nbytes / seconds if seconds > 0 else float("nan")
    if not math.isfinite(bandwidth) or bandwidth <= 0:
        log.warning("detect: a %d-byte copy on %s timed %r s; using the estimate", nbytes, device, seconds)
        return None
    return _C.bandwidth_for_measured_copy(bandwidth)  # in the model's terms, as the GEMM's peak


def _agree_across_ranks(values: list[float], world: int, how: str, kind: str | None = None) -> list[float]:
    """``values`` reduced over the default process group (``how``: "min" or "max"), so that
    every rank ends with the same figures; as they are without a group of several ranks.
    ``kind``: reduced over the ranks of the same kind only (a device type's name: an A100's
    measured figures are not a V100's). Collective: every rank must call it, with as many
    values."""
    if world < 2 or not values:
        return list(values)
    import torch
    import torch.distributed as dist

    if kind is not None:
        every: list = [None] * world
        dist.all_gather_object(every, (kind, list(values)))
        alike = [v for k, v in every if k == kind]
        pick = min if how == "min" else max
        return [float(pick(column)) for column in zip(*alike)]

    op = {"min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[how]
    t = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    dist.all_reduce(t, op=op)
    return [float(v) for v in t.cpu()]


def _collective_device():
    """Where the default group's collectives run: the current CUDA device when NCCL serves it
    ("nccl", or "cpu:gloo,cuda:nccl" for a group of several backends), else the CPU."""
    import torch
    import torch.distributed as dist

    if "nccl" in str(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# Buffer sizes of the link measurement's all-reduces: the largest long enough for the bandwidth
# term to stand well above the latency and the timing noise (NVSwitch: ~1 ms at 256 MiB; Gloo on
# a few busy CPU cores: milliseconds of noise, ~10 ms at 32 MiB), all of them quick.
_LINK_SIZES_CUDA = (1 << 20, 8 << 20, 64 << 20, 256 << 20)
_LINK_SIZES_CPU = (64 << 10, 1 << 20, 8 << 20, 32 << 20)


def _ring_all_reduce_terms(ranks: int) -> tuple[float, float]:
    """(seconds per byte at 1 B/s, seconds per unit of latency) of a ring all-reduce over
    ``ranks`` ranks of one link, as the C++ cost model prices it (2 (p-1)/p and 2 (p-1)), so
    that a fitted link reproduces the measured times in the planner."""
    cpu = _catalogue("cpu")

    def flat(bandwidth: float, latency: float) -> Cluster:
        return Cluster(_C.Cluster.from_json(json.dumps({
            "name": "unit", "device_types": [cpu], "nodes": [{"device": "cpu", "count": ranks}],
            "links": [{"name": "unit", "bandwidth": bandwidth, "latency": latency}]})))

    per_byte = flat(1.0, 0.0).collective_time("all_reduce", range(ranks), 1 << 30, "ring") / (1 << 30)
    per_latency = flat(1e30, 1.0).collective_time("all_reduce", range(ranks), 1, "ring")
    return per_byte, per_latency


def _split_alpha(alpha: float, gather_alpha: float, per_latency: float) -> tuple[float, float]:
    """(call overhead, per-step latency) from the fitted intercepts of an all-reduce and an
    all-gather (a negative ``gather_alpha``: none measured). An all-reduce is call + 2(n-1)
    steps, an all-gather call + (n-1) steps (cost/collective_cost.h), so call = 2 x the
    gather's alpha - the all-reduce's. Both intercepts carry the timing's noise (on busy
    cores a gather's can exceed the all-reduce's, or an intercept fall below 0): the call is
    held within [0, the all-reduce's alpha] and the latency at >= 0, so that the noise moves
    a figure but never makes a cluster the model refuses."""
    alpha = max(0.0, alpha)
    call = min(alpha, max(0.0, 2 * gather_alpha - alpha)) if gather_alpha >= 0 else 0.0
    return call, (alpha - call) / per_latency


def _measure_links(links: list[dict], world: int, per_node: int, sources: dict[str, str]) -> None:
    """Replaces the bandwidth, latency and call overhead of the link levels the job's ranks use
    with measured ones (in ``links``, in place), and records it in ``sources``: an all-reduce
    and an all-gather fitted to alpha + beta x bytes, the call overhead what both pay once (2 x
    the gather's alpha - the all-reduce's, at least 0), the rest of the all-reduce's alpha its
    ring steps' latency. Inside a node: an all-reduce
    over each node's ranks; between nodes: over the ranks of one local index, one per node. All
    groups run at once, as a job's traffic does (a node's ranks share its NIC: the figure is
    per device, as the presets' are). Every rank takes the slowest group's fit, so all agree.
    Collective over the default group: every rank must call it together."""
    import torch.distributed as dist

    from .profile import measure_collectives

    if not (dist.is_available() and dist.is_initialized()) or world < 2:
        return
    nodes, rank = world // per_node, dist.get_rank()
    device = _collective_device()
    sizes = _LINK_SIZES_CUDA if device.type == "cuda" else _LINK_SIZES_CPU
    # (level index in `links`, this rank's group over that level, the group's size)
    levels = []
    created = []
    if per_node > 1:
        if nodes == 1:
            levels.append((0, None, per_node))
        else:
            # new_group is collective: every rank creates every node's group, in the same order.
            groups = [dist.new_group(list(range(n * per_node, (n + 1) * per_node))) for n in range(nodes)]
            created += groups
            levels.append((0, groups[rank // per_node], per_node))
    if nodes > 1:
        groups = [dist.new_group([n * per_node + local for n in range(nodes)]) for local in range(per_node)]
        created += groups
        levels.append((len(links) - 1, groups[rank % per_node], nodes))
    try:
        for level, group, ranks in levels:
            result = measure_collectives(sizes=sizes, kinds=("all_reduce", "all_gather"), group=group,
                                         device=device)
            fit = result["collectives"].get("all_reduce", {}).get(str(ranks))
            gather = result["collectives"].get("all_gather", {}).get(str(ranks))
            failed = fit is None
            if failed:
                log.warning("detect: measuring link %r failed (%s); keeping its %s figures", links[level]["name"],
                            result["skipped"].get("collective:all_reduce", "no fit"),
                            sources.get(f"links.{links[level]['name']}", "preset"))
            alpha, beta, gather_alpha, any_failed = _agree_across_ranks(
                [0.0, 0.0, 0.0, 1.0] if failed else
                [fit["alpha"], fit["beta"], gather["alpha"] if gather else -1.0, 0.0], world, "max")
            if any_failed or not (beta > 0 and math.isfinite(beta)):
                continue  # a flat or failed fit says nothing about bandwidth: keep the figures
            per_byte, per_latency = _ring_all_reduce_terms(ranks)
            link = links[level]
            link["bandwidth"] = per_byte / beta
            link["call_overhead"], link["latency"] = _split_alpha(alpha, gather_alpha, per_latency)
            link.pop("per_device", None)  # a measured figure holds for every device of this job
            sources[f"links.{link['name']}"] = "measured"
    finally:
        for group in created:
            dist.destroy_process_group(group)


# The overlap measurement's all-reduce: long enough to stand above Gloo's latency and
# noise (milliseconds to tens of milliseconds on busy CPU cores).
_OVERLAP_BYTES = 8 << 20


def _interference_of_rounds(rounds: list[tuple[float, float, float]]) -> float | None:
    """What a collective beside compute adds, from rounds of (collective alone, compute alone,
    both together) seconds: each round's (together - the longer alone) / the shorter alone,
    clamped to [0, 20], and the median over the rounds; None without a round to read. Each
    round's three figures are timed one after the other, so a host that changes speed (a
    neighbour's load, a frequency step) moves a round's three together; one figure read slow
    in a round moves only that round, which the median sets aside."""
    per_round = []
    for reduce_alone, compute_alone, together in rounds:
        shorter, longer = sorted((compute_alone, reduce_alone))
        if shorter > 0 and math.isfinite(together):
            per_round.append(min(20.0, max(0.0, (together - longer) / shorter)))
    return statistics.median(per_round) if per_round else None


def _measure_overlap(doc: dict, world: int, sources: dict[str, str], rounds: int = 9) -> None:
    """Sets every node's ``overlap_interference`` (csrc/cost/cluster.h) from a GEMM loop and
    an all-reduce over the default group timed alone and together, on every rank at once
    (the slowest rank's times), in `rounds` rounds of the three: ``_interference_of_rounds``.
    Timed as three blocks of medians (every all-reduce first, then the GEMMs, then both), one
    fidelity run read 0.11 where the runs beside it read 0.96 and 1.01, and a plan with its
    collectives beside compute was priced as if they cost nothing (docs/cost-model.md). A
    failure leaves the constant and logs why. Collective: every rank must call it."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or world < 2:
        return
    try:
        cpu = torch.device("cpu")  # measured on CPU processes only (detect skips CUDA)
        buffer = torch.ones(_OVERLAP_BYTES // 4, device=cpu)
        a, b = torch.randn(256, 256, device=cpu), torch.randn(256, 256, device=cpu)

        def timed_once(run) -> float:
            dist.barrier()
            start = time.perf_counter()
            run()
            return time.perf_counter() - start

        reduce_first = statistics.median(timed_once(lambda: dist.all_reduce(buffer)) for _ in range(3))
        one = statistics.median(timed_once(lambda: torch.mm(a, b)) for _ in range(3))
        # Every rank runs the same number of GEMMs (the slowest rank's count).
        count = int(_agree_across_ranks([max(1.0, reduce_first / max(one, 1e-9))], world, "max")[0])

        def compute() -> None:
            for _ in range(count):
                torch.mm(a, b)

        def both() -> None:
            work = dist.all_reduce(buffer, async_op=True)
            compute()
            work.wait()

        samples = []
        for _ in range(rounds):
            samples += [timed_once(lambda: dist.all_reduce(buffer)), timed_once(compute), timed_once(both)]
        samples = _agree_across_ranks(samples, world, "max")
        timed = [tuple(samples[i:i + 3]) for i in range(0, len(samples), 3)]
        interference = _interference_of_rounds(timed)
    except Exception as e:  # noqa: BLE001 - a failed measurement keeps the constant, never breaks detect()
        log.warning("detect: measuring a collective beside compute failed (%s: %s); keeping the constant",
                    type(e).__name__, e)
        return
    if interference is None or not math.isfinite(interference):
        return
    reduce_alone, compute_alone, together = (statistics.median(t[i] for t in timed) for i in range(3))
    log.info("detect: a %d-byte all-reduce beside %d GEMMs, %d rounds: %.1f ms alone, compute %.1f ms alone, "
             "%.1f ms together (medians): overlap_interference %.2f", _OVERLAP_BYTES, count, rounds,
             reduce_alone * 1e3, compute_alone * 1e3, together * 1e3, interference)
    for node in doc["nodes"]:
        node["overlap_interference"] = interference
    sources["overlap_interference"] = "measured"


def _describe_sources(sources: dict[str, str]) -> str:
    """{figure: how it was obtained} as one line, grouped by how, e.g.
    ``measured: peak_flops, links.nvswitch; device: memory_bytes; catalogue: memory_bandwidth``
    (the four peak_flops.<precision> collapse into peak_flops when they agree)."""
    flops = {k: v for k, v in sources.items() if k.startswith("peak_flops.")}
    if flops and len(set(flops.values())) == 1:
        sources = {k: v for k, v in sources.items() if k not in flops}
        sources["peak_flops"] = next(iter(flops.values()))
    by_source: dict[str, list[str]] = {}
    for figure, source in sources.items():
        by_source.setdefault(source, []).append(figure)
    order = ("measured", "device", "machine", "catalogue", "preset", "estimated")
    ranked = sorted(by_source, key=lambda s: (order.index(s) if s in order else len(order), s))
    return "; ".join(f"{source}: {', '.join(sorted(by_source[source]))}" for source in ranked)
