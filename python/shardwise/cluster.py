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

import json
import os
from typing import Iterable

from . import _C

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
    def detect(cls) -> "Cluster":
        """This machine (and, under torchrun, its peers, assumed alike).

        World size: ``torch.distributed`` when it is initialised, else 1 rank. Ranks per
        node: ``LOCAL_WORLD_SIZE`` (set by torchrun), else all of them on one node.
        Devices: the current CUDA device when CUDA is available, described from the
        catalogue when its name is known (A100, H100, V100) and roughly from its
        properties otherwise; else one CPU process per rank, sharing this machine's cores
        and memory. Link numbers are not measured: they come from the matching preset,
        or conservative PCIe / network figures.
        """
        world, per_node = _world_and_local_sizes()
        try:
            import torch

            cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
        except ImportError:  # pragma: no cover - torch is a dependency
            cuda = False
        doc = _detect_cuda(world, per_node) if cuda else _detect_cpu(world, per_node)
        return cls(_C.Cluster.from_json(json.dumps(doc)))

    # ---- serialisation ------------------------------------------------------
    def to_json(self, indent: int | None = None) -> str:
        return self._core.to_json(-1 if indent is None else indent)

    def save(self, path: "str | os.PathLike[str]") -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json(indent=2))
            f.write("\n")

    # ---- queries ------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._core.name

    @property
    def world_size(self) -> int:
        return self._core.world_size

    @property
    def num_nodes(self) -> int:
        return self._core.num_nodes

    @property
    def heterogeneous(self) -> bool:
        return self._core.heterogeneous

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


def _detect_cpu(world: int, per_node: int) -> dict:
    """One CPU process per rank. The catalogue's "cpu" type is about one core; each of
    the node's processes gets cores / processes of it in FLOP/s (fractions when the
    machine is oversubscribed) and memory / processes. Memory bandwidth is never scaled
    up: one process rarely streams faster than one core's share of the channels."""
    base = _catalogue("cpu")
    share = _machine_cores() / per_node
    device = {
        "name": "cpu",
        "peak_flops": {k: v * share for k, v in base["peak_flops"].items()},
        "memory_bytes": max(1, _machine_memory() // per_node),
        "memory_bandwidth": base["memory_bandwidth"] * min(share, 1.0),
    }
    # Between machines: 10 GbE, a conservative guess for CPU clusters.
    network = {"name": "ethernet", "bandwidth": 1.25e9 / per_node, "latency": 5e-5}
    return _uniform(f"detected cpu ({world} process{'es' if world != 1 else ''})", device, world, per_node,
                    _preset_links("cpu") + [network])


# torch's device names ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB",
# "NVIDIA A100 80GB PCIe", ...) -> (catalogue type, preset whose links a node of them has).
def _match_gpu(name: str) -> tuple[str, str | None] | None:
    upper = name.upper()
    pcie = "PCIE" in upper
    if "H100" in upper and not pcie:
        return "h100-sxm5-80gb", "dgx-h100"
    if "A100" in upper:
        return ("a100-pcie-80gb", None) if pcie else ("a100-sxm4-80gb", "dgx-a100")
    if "V100" in upper:
        return ("v100-pcie-32gb", None) if pcie else ("v100-sxm2-32gb", "v100")
    return None


def _detect_cuda(world: int, per_node: int) -> dict:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    match = _match_gpu(props.name)
    if match is not None:
        device = _catalogue(match[0])
    else:
        # Unknown GPU: a rough, low estimate from its properties at an assumed 1.4 GHz,
        # 64 FP32 lanes per SM, and tensor cores as on V100 (sm70) / A100 (sm80+).
        sms, clock = props.multi_processor_count, 1.4e9
        f32 = sms * 64 * 2 * clock
        tensor = sms * (1024 if props.major >= 8 else 512 if props.major >= 7 else 0) * 2 * clock
        half = max(tensor, f32)
        device = {"peak_flops": {"f32": f32, "tf32": half / 2 if props.major >= 8 else f32,
                                 "bf16": half if props.major >= 8 else f32, "f16": half},
                  "memory_bandwidth": 5e11}
    # Name from torch and capacity as torch reports it: the GPU may be a variant of the
    # catalogue entry (40GB A100) and usable memory is what the planner must fit in.
    device["name"] = "-".join(props.name.lower().replace("nvidia", "").split()) or "cuda"
    device["memory_bytes"] = int(props.total_memory)
    if match is not None and match[1] is not None:
        links = _preset_links(match[1])
    else:
        # PCIe Gen3 x16 inside the node, a 100 Gb/s NIC shared by the node between nodes.
        links = [{"name": "pcie", "bandwidth": 16e9, "latency": 5e-6},
                 {"name": "network", "bandwidth": 12.5e9 / per_node, "latency": 1e-5}]
    return _uniform(f"detected {props.name} x{world}", device, world, per_node, links)
