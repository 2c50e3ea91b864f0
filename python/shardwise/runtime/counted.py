"""The counts of losses whose mean the data counts, from the global batch.

A cross entropy (or nll_loss) over class-index targets with reduction "mean" divides its sum
by the total weight of the targets that are not ``ignore_index``: a batch of labels padded
with -100 counts only its real tokens, and the ranks of a split batch count different numbers
(some none at all). The rewrite marks such a node ``counted`` (csrc/transform/spmd_rewrite.h)
and the lowering runs it as the sum over the rank's rows times shares / G (runtime/lower.py).
G is the count over the whole global batch, and every rank holds the whole global batch
(``train_step`` is called with it), so every rank computes G itself, with no collective:

    counter = Counter.build(graph, builder, tensors, trainable, counted_nodes)
    G = counter(batch_tensors)   # [count per counted node], floats

The counter is the part of the single-device program that computes the targets (and class
weights) of those nodes, from the batch inputs and the model's constants: for a transformers
causal LM, the labels shifted and padded with -100. A count that would depend on a trainable
parameter (learned class weights) is refused when the engine is built: the engine holds only
shards of it.
"""
from __future__ import annotations

import torch

from .. import _C
from .._C import ValidationError
from .._fx_import import op_overload
from .lower import _build_module, _schema_call


class Counter:
    """G of each counted node, in the order given, computed from a (micro-)batch."""

    def __init__(self, module: torch.fx.GraphModule | None, input_names: list[str], spec: list[tuple[int, int, int]]):
        self._module = module
        self._inputs = input_names
        self._spec = spec  # per node: (output position of its targets, of its weights or -1, ignore_index)

    @classmethod
    def build(cls, graph, builder, tensors: dict[str, torch.Tensor], trainable: set[str],
              counted: list[str], batch_inputs: list[str]) -> "Counter":
        """`counted`: the first output names of the counted nodes; `batch_inputs`: the IR names
        of the batch tensors."""
        if not counted:
            return cls(None, [], [])
        program = _C.rank_program(graph._core, "", 0)  # the whole graph, replicated: as one device runs it
        by_output = {n["outputs"][0]["value"]: n for n in program["nodes"]}
        producer = {o["value"]: n for n in program["nodes"] for o in n["outputs"]}
        wanted: list[str] = []  # values the counter returns
        spec = []
        for name in counted:
            node = by_output[name]
            info = node["counted"]
            target = node["inputs"][info["target"]]["value"]
            weight = node["inputs"][info["weight"]]["value"] if info["weight"] >= 0 else None
            # the loss call's ignore_index (its schema default where the IR node leaves it out)
            arguments = _schema_call(node, op_overload(node["op"]), node["inputs"], named=True)
            ignore_index = arguments.get("ignore_index", -100)
            positions = []
            for value in (target, weight):
                if value is None:
                    positions.append(-1)
                    continue
                if value not in wanted:
                    wanted.append(value)
                positions.append(wanted.index(value))
            spec.append((positions[0], positions[1], int(ignore_index)))
        # The nodes the targets need, in graph order; their leaves must be batch inputs or constants.
        needed: set[str] = set()
        stack = list(wanted)
        nodes = set()
        while stack:
            value = stack.pop()
            if value in needed:
                continue
            needed.add(value)
            node = producer.get(value)
            if node is None:  # a leaf
                if value in trainable:
                    raise ValidationError(f"parallelize: the count that a mean divides by (loss node '{counted[0]}') "
                                          f"depends on the trainable parameter '{value}'; a rank holds only a shard "
                                          "of it (make it a buffer, or compute the loss with reduction='sum')")
                continue
            nodes.add(id(node))
            stack.extend(op["value"] for op in node["inputs"])
        inputs = [n for n in batch_inputs if n in needed]
        module = _build_module(program, builder.sources, None, tensors, inputs, set(),
                               nodes=[n for n in program["nodes"] if id(n) in nodes],
                               outputs=[{"value": v} for v in wanted], class_name="Counts")
        return cls(module, inputs, spec)

    def __call__(self, batch: dict[str, torch.Tensor]) -> list[float]:
        if self._module is None:
            return []
        with torch.no_grad():
            values = self._module(*[batch[n] for n in self._inputs])
        counts = []
        for target_at, weight_at, ignore_index in self._spec:
            counts.append(target_weight(values[target_at], values[weight_at] if weight_at >= 0 else None,
                                        ignore_index))
        return counts


def target_weight(target: torch.Tensor, weight: torch.Tensor | None, ignore_index: int) -> float:
    """What nll_loss's mean divides by: the class weights of the targets that are not
    ignore_index, summed (1 each without weights)."""
    counted = target != ignore_index
    if weight is None:
        return float(counted.sum().item())
    picked = weight.double()[target.masked_fill(~counted, 0)]
    return float(picked.masked_fill(~counted, 0.0).sum().item())
