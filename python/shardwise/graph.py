"""shardwise.Graph: the captured program in the core IR, with its analyses.

A thin Python face over ``shardwise._C.Graph`` (csrc/ir/graph.h); every number comes
from the C++ core (csrc/analysis) so the planner and the user see the same figures.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import _C


@dataclass(frozen=True)
class UnknownOp:
    """An op with no dimension rule: captured as an opaque node, replicated by plans."""

    op: str
    module_path: str
    count: int


@dataclass(frozen=True)
class RepeatedBlocks:
    """Sibling modules whose subgraphs are identical (e.g. the N layers of a decoder)."""

    parent: str
    module_paths: tuple[str, ...]
    nodes_per_block: int

    def __len__(self) -> int:
        return len(self.module_paths)


class Graph:
    """A captured model: values (tensors), nodes (ops), module paths, shapes."""

    def __init__(self, core: "_C.Graph"):
        self._core = core

    @classmethod
    def _from_core(cls, core: "_C.Graph", batch_dim: int | None = 0) -> "Graph":
        """Post-capture passes shared by every front end, in the order of the pass
        pipeline (csrc/tools/pass_pipeline.cc): dead code first, so the checks and the
        batch propagation see only what the outputs need."""
        _C.eliminate_dead_code(core)
        core.verify()
        _C.check_shapes(core)  # an importer bug or a wrong rule shows here, naming the node
        if batch_dim is not None:
            _C.propagate_batch_dim(core)
        return cls(core)

    # ---- serialisation ------------------------------------------------------
    @classmethod
    def from_json(cls, text: str) -> "Graph":
        core = _C.Graph.from_json(text)
        core.verify()
        return cls(core)

    @classmethod
    def from_text(cls, text: str) -> "Graph":
        core = _C.Graph.from_text(text)
        core.verify()
        return cls(core)

    def to_json(self, indent: int | None = None) -> str:
        return self._core.to_json(-1 if indent is None else indent)

    def __str__(self) -> str:
        return str(self._core)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Graph) and self._core == other._core

    __hash__ = None  # mutable-by-passes object, compared by value

    # ---- structure ----------------------------------------------------------
    def num_nodes(self) -> int:
        return self._core.num_nodes()

    def nodes(self) -> list[dict]:
        """Each node as {op, inputs, outputs, module, attrs} (names of values)."""
        return self._core.nodes()

    def values(self) -> list[dict]:
        """Each value as {name, dtype, shape, batch_dim, role}."""
        return self._core.values()

    def input_names(self) -> list[str]:
        return self._core.input_names()

    def output_names(self) -> list[str]:
        return self._core.output_names()

    # ---- analyses ------------------------------------------------------------
    def num_parameters(self) -> int:
        return _C.parameter_stats(self._core)["parameters"]

    def parameter_bytes(self) -> int:
        return _C.parameter_stats(self._core)["parameter_bytes"]

    def forward_flops(self) -> int:
        return _C.forward_flops(self._core)["total"]

    def matmul_flops(self) -> int:
        """Forward FLOPs of the contraction ops alone (matmul, linear, conv, attention)."""
        return _C.forward_flops(self._core)["matmul_total"]

    def flops_per_node(self) -> list[int]:
        return _C.forward_flops(self._core)["per_node"]

    def activation_bytes(self) -> list[int]:
        return _C.activation_bytes(self._core)

    def unknown_ops(self) -> list[UnknownOp]:
        return [UnknownOp(u["op"], u["module_path"], u["count"]) for u in _C.unknown_ops(self._core)]

    def repeated_blocks(self) -> list[RepeatedBlocks]:
        return [RepeatedBlocks(g["parent"], tuple(g["module_paths"]), g["nodes_per_block"])
                for g in _C.repeated_blocks(self._core)]

    def summary(self) -> str:
        return _C.summary(self._core)
