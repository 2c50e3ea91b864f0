"""Lowering a rank program's rank IR (csrc/transform/rank_graph.h) into a torch.fx.GraphModule.

The lowering walks the rank IR node by node. Each call of a program node becomes one call of
its op, built from the node's attributes as the core made them local (_aten_call.py binds
them to the op's schema): its operands resharded as the IR's step nodes say, once per region
(``self.reshard(x, forward_steps, backward_steps)``), shape arguments made local, a
vocabulary-parallel lookup as ``self.vocab_lookup``, a split the core gave a distributed
kernel as ``self.statistics(kernel, ...)`` (runtime/kernels.py). A node the rank graph adds
has an emitter of its own: a loss whose mean the data counts (``shardwise::counted_mean``)
runs as a sum times shares / G, G an input of the module.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.fx

from .. import _C
from .._C import ValidationError
from .._aten_call import CallRebuildError, call_arguments, named_arguments
from .._fx_import import WRITES, is_value_identity, op_overload, operand_nodes
from .._logging import get_logger
from ..materialize import local_index, local_tensor, take
from .async_gradients import ASYNC_GRADIENT_EMITTER
from .collective_matmul import RING_EMITTER
from .fp8 import FP8_EMITTER
from .fused_accumulation import FUSED_ACCUMULATION_EMITTER, FUSED_ACCUMULATION_MARK
from .kernels import StatisticsKernels, VocabLookup
from .mesh import _Mesh
from .parameter_gathers import DeferredScatters, PrefetchStart, PrefetchWait, Regather, _Prefetches, _released_after
from .recompute import checkpoint_blocks
from .reshard import Reshard
from .weight_split import WeightSplit

log = get_logger("shardwise.engine")


# ---- random ops: drawn as one device draws them ---------------------------------------------
# The core decides which seeded ops draw on a block as one device does (csrc/ops/random_draws.h,
# NodeRewrite::one_device_random) and runs any other on shards whole. Such a node's rank draws
# the mask (a dropout: the op run on ones, its output the scaled mask) or the values (a *_like
# op) of the whole operand, from the generator state one device has at that point (every rank
# runs the same seeded ops in the same order on the same global shapes), and keeps its block.
_MASKS = {torch.ops.aten.dropout.default, torch.ops.aten.feature_dropout.default}
_LIKE = {torch.ops.aten.rand_like.default, torch.ops.aten.randn_like.default}


class OneDeviceRandom(torch.nn.Module):
    """``self.one_device_random(x, op, args, kwargs, shape, index)``: `op` (a dropout or a
    *_like op) on this rank's block `x` of a tensor of `shape`, drawn as one device draws it."""

    def forward(self, x, op: str, args, kwargs, shape, index):
        op = _BY_NAME[op]
        drawn = op(torch.ones(shape, dtype=x.dtype, device=x.device), *args, **kwargs)
        block = take(drawn, tuple(torch.tensor(i, dtype=torch.long, device=x.device) if isinstance(i, tuple) else i
                                  for i in index))
        return x * block if op in _MASKS else block


_BY_NAME = {str(op): op for op in _MASKS | _LIKE}


# The feature passes' emitters (csrc/transform/rank_passes.h: one pass, one emitter), in the
# order they are asked. Each has a name (the module its calls run through: root.<name>, made
# by the lowering the first time the feature takes a call), module(lowering) (that module),
# operand(lowering, read, i, op) (True: it runs operand i's region inside a call, so _read
# leaves the value as it is; what it took goes into read.taken[name]), takes(lowering, read)
# (it makes this call) and emit(lowering, read, args, kwargs) (the call). It reads the rank IR
# only: the call's marks (read.marks) and its operands' regions (_C.rank_ir_operands), and it
# uses the lowering's mesh, graph, root, reshards, step_texts and region_read_from.
# The order, and why: the ring first (it runs an FP8 linear's products in float8 itself, and
# the core never marks a ring beside an asynchronous all-reduce: the ring refuses it); FP8 next
# (it runs an asynchronous all-reduce itself); fused accumulation last (a stage's call that
# runs one of the others keeps autograd's accumulation: speed, not numbers).
FEATURES = (RING_EMITTER,  # collective matmul (transform/collective_matmul.h)
            FP8_EMITTER,  # an FP8 linear (runtime/fp8.py; the rank graph's marks where the plan runs in fp8)
            ASYNC_GRADIENT_EMITTER,  # an all-reduce beside a weight gradient (transform/async_gradients.h)
            FUSED_ACCUMULATION_EMITTER)  # a stage's weight gradient into .grad (fused_weight_accumulation.h)

# The marks and kernels of a call in the rank IR (csrc/transform/rank_graph.h) the lowering reads.
WHOLE = "shardwise.whole"  # run on whole (gathered) operands
RECOMPUTE, RECOMPUTE_KEEPS = "shardwise.recompute", "shardwise.recompute_keeps"  # its recomputed block
ONE_DEVICE_RANDOM = "shardwise.one_device_random"  # drawn whole, as one device draws it, and cut
LOOKUP = "shardwise::embedding_lookup"  # a vocabulary-parallel lookup: its block [start, stop) of the table
# The stage passes' marks (transform/rank_passes.h, stage_passes).
WEIGHT_CUT = "shardwise.weight_cut"  # operands B/W cuts (weight_gradient_split.h)
WEIGHT_OUTPUT = "shardwise.weight_output"  # a send of a weight value: its gradient is W's


# ---- views that must not depend on the traced layout --------------------------------------
# A captured view reads its operand through the strides the single-device trace happened to
# give it, and the IR keeps no strides. torch.export even drops a `.contiguous()` that was a
# no-op there (nanoGPT's `y.transpose(1, 2).contiguous().view(B, T, C)`: CPU attention lays
# its output out so that the transpose is contiguous already), so nothing in the program
# records that the view needs that layout. On a rank the operand may arrive otherwise laid
# out (a reshard gathered the heads into a fresh contiguous tensor, which the transpose then
# leaves strided) and aten::view fails ("view size is not compatible with input tensor's size
# and stride"). Such a view runs as aten::reshape: the same values and shape, a view of the
# operand whenever view would have succeeded (so any aliasing the trace relied on holds), a
# copy only where view would have raised; its backward is view's (a reshape of the gradient).
# (view's and _unsafe_view's operands are (self, size), reshape's (self, shape): positional.)
_LAYOUT_FREE = {torch.ops.aten.view.default: torch.ops.aten.reshape.default,
                torch.ops.aten._unsafe_view.default: torch.ops.aten.reshape.default}


def _whole_index(placement: list[str]) -> list[str]:
    """A placement's Partial entries as Replicate: the block a rank holds of a Partial value is whole."""
    partial = _C.partial_axes(placement)
    return ["R" if a in partial else p for a, p in enumerate(placement)]


# ---- lowering one IR node back to its ATen call --------------------------------------------
def _substitute(value: Any, operands) -> Any:
    if isinstance(value, torch.fx.Node):
        return next(operands)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.fx.Node) for v in value):
        return type(value)(next(operands) if isinstance(v, torch.fx.Node) else v for v in value)
    return value


def _target(node: dict, src: torch.fx.Node):
    """The op a rank-IR node calls: its ATen overload by the IR's name (which may be another
    overload than the captured one: an arange split into blocks runs arange.start_step), or
    the captured callable for a call without a schema, which the IR cannot name."""
    if not isinstance(src.target, torch._ops.OpOverload):
        return src.target
    target = op_overload(node["op"])
    if target is None:
        raise ValidationError(f"parallelize: '{node['outputs'][0]['value']}' calls {node['op']}, "
                              "which this torch does not have")
    return target


def _node_call(node: dict, read: "_Read") -> tuple[list, dict]:
    """(args, kwargs) of the rank-IR node's call: its tensor operands (the lowered inputs, in
    the IR's order) and its attributes as the core left them for this rank (shape arguments at
    the local sizes, spmd_rewrite.h), built by the op's schema (_aten_call.py). A call the
    capture kept without a schema (a Python callable, named `arg<i>` / by keyword in the IR) is
    the captured call with the operands substituted: the core runs such an op only whole."""
    target, src, operands = read.target, read.src, read.operands
    if isinstance(target, torch._ops.OpOverload):
        return _schema_call(node, target, operands)
    if WHOLE not in read.marks and any(p != "R" for op in node["inputs"] for p in op["required"]):
        raise ValidationError(f"parallelize: '{node['outputs'][0]['value']}' ({node['op']}) has no schema "
                              "and reads a block; the runtime can call it only on whole operands")
    it = iter(operands)
    return [_substitute(a, it) for a in src.args], {k: _substitute(v, it) for k, v in src.kwargs.items()}


def _schema_call(node: dict, target: torch._ops.OpOverload, operands: list, named: bool = False):
    """call_arguments (named: named_arguments) of the node, its failure named after the node."""
    try:
        return (named_arguments if named else call_arguments)(target, node["attrs"], operands)
    except CallRebuildError as e:
        raise ValidationError(f"parallelize: '{node['outputs'][0]['value']}' ({node['op']}): {e}") from None


def _tensor_outputs(result: Any, indices: list[int] | None) -> list[torch.Tensor]:
    return [result] if indices is None else [result[i] for i in indices]


def _identifier(name: str) -> str:
    """A value's name as a Python identifier (a placeholder's): every other character as '_'."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def _set_attr(root: torch.nn.Module, qualified: str, value) -> None:
    *path, last = qualified.split(".")
    module = root
    for part in path:
        if not hasattr(module, part):
            module.add_module(part, torch.nn.Module())
        module = getattr(module, part)
    if isinstance(value, torch.nn.Parameter):
        module.register_parameter(last, value)
    else:
        module.register_buffer(last, value)


def _build_module(program: dict, sources: dict, mesh: _Mesh | None, tensors: dict[str, torch.Tensor],
                  input_names: list[str], trainable: set[str], *, nodes: list[dict] | None = None,
                  outputs: list[dict] | None = None, parameters: dict[str, torch.Tensor] | None = None,
                  class_name: str | None = None,
                  compute_dtypes: dict[str, torch.dtype] | None = None,
                  split_backward: bool = False,
                  rank_ir: str | None = None) -> torch.fx.GraphModule:
    """The GraphModule of the rank IR `rank_ir` (default: the program's, ``program["rank_ir"]``;
    a pipeline stage's: the core's cut of it), walked node by node (``_Lowering.ir_node``): each
    call of a program node made from the node's facts in `program`, each node the rank graph
    adds by its emitter; `nodes`: only those of the program's nodes (what the counts of a
    counted loss need, runtime/counted.py). The module takes `input_names` as arguments and
    returns `outputs` (default: the program's outputs, each {"value", "forward", "backward"}).
    Leaves the nodes read become the module's parameters
    and buffers: this rank's shards of `tensors`, or the objects in `parameters` (created and
    recorded there when missing: stages on one rank share a tied weight).

    A counted loss (a mean over the targets the data counts) whose rows are split, over mesh
    axes or into the step's micro-batches, runs as its sum (the core set its reduction) and
    the rank IR's ``shardwise::counted_mean(sum, count) {shares}``, sum x shares / G: the module
    takes one more argument per such node, after the inputs, G (the IR's `<loss>.count`) the
    count of its targets over the whole global batch (runtime/counted.py computes it), and
    lists those nodes in ``module.counted`` in that order.

    `compute_dtypes`: a leaf the program computes in another dtype than the tensor held (the
    master weights of a mixed-precision policy, runtime/precision.py) is cast at its use.

    `split_backward` (a pipeline stage under a zero-bubble schedule): the operands the core's
    weight-gradient-split pass marks (transform/weight_gradient_split.h: a call's
    ``{shardwise.weight_cut=[i, ...]}``) are read through ``self.weight_split.cut`` and the
    call's outputs recorded by ``self.weight_split.site``, so that the engine runs the stage's
    backward as B and W (runtime/weight_split.py); the values its sends marked
    ``{shardwise.weight_output=true}`` are listed in ``module.weight_outputs``.

    A call the fused-accumulation pass marks (transform/fused_weight_accumulation.h:
    ``{shardwise.fused_accumulation=i}``, i its weight operand) runs as
    ``self.fused_accumulation``, its weight gradient added into the parameter's ``.grad`` by
    the product (runtime/fused_accumulation.py)."""
    ir_graph = _C.Graph.from_text(program["rank_ir"] if rank_ir is None else rank_ir)
    ir_nodes = ir_graph.nodes()
    operands = _C.rank_ir_operands(ir_graph)  # how the IR runs each call's operands: their regions
    calls = {node["call"]: node for node in program["nodes"]}  # a program node by its call's name in the IR
    subset = None if nodes is None else {id(node) for node in nodes}
    walked = []
    for ir_node in ir_nodes:
        # (a stage's recv of a value gives it the name of the call that made it on its stage)
        made_here = ir_node["outputs"] and ir_node["op"] not in _NOT_CALLED
        node = calls.get(ir_node["outputs"][0]) if made_here else None
        if subset is None or (node is not None and id(node) in subset):
            if node is not None:
                node = {**node, "inputs": _with_regions(node["inputs"], operands["calls"][ir_node["outputs"][0]],
                                                        ir_node["outputs"][0])}
            walked.append((ir_node, node))
    own = outputs is None
    outputs = program["outputs"] if own else outputs
    # The IR's outputs made whole by their regions; values it does not return (what a stage
    # sends, the targets a count reads: runtime/counted.py) are taken as they are made.
    if own or [out["value"] for out in outputs] == [region["value"] for region in operands["outputs"]]:
        outputs = _with_regions(outputs, operands["outputs"], "the program's outputs")
    lowering = _Lowering(program, sources, mesh, [node for _, node in walked if node is not None],
                         compute_dtypes or {}, split_backward, operands["writes"])
    counted = [(calls[n["inputs"][0]], n["inputs"][1]) for n, _ in walked if n["op"] == _COUNTED_MEAN]
    lowering.leaves(tensors, input_names, trainable, {} if parameters is None else parameters, outputs, counted)
    for ir_node, node in walked:
        lowering.ir_node(ir_node, node)
    return lowering.module(outputs, class_name)


def _with_regions(operands: list[dict], regions: list[dict], reader: str) -> list[dict]:
    """The program's operands of `reader` (their values and placements) with how the rank IR
    runs each (``_C.rank_ir_operands``: its resharding region, by id, with its steps and marks)."""
    if len(operands) != len(regions) or any(op["value"] != r["value"] for op, r in zip(operands, regions)):
        raise ValidationError(f"parallelize: the rank IR's '{reader}' reads {[r['value'] for r in regions]}, the "
                              f"program's {[op['value'] for op in operands]}")
    return [{**op, **region} for op, region in zip(operands, regions)]


@dataclass
class _Read:
    """What lowering one node learns from its operands, for the emitter of its call."""

    first: str  # the node's first output (its name)
    target: Any  # the op it calls
    src: torch.fx.Node  # the captured node
    kernel: str  # the op its call in the rank IR names (a distributed kernel's, or the ATen op's)
    marks: dict  # that call's attributes: the core's marks on it (shardwise.*), a kernel's bounds
    operands: list = field(default_factory=list)
    regathers: list = field(default_factory=list)  # (gathered parameter, its shard, steps, unit group)
    taken: dict = field(default_factory=dict)  # a feature emitter's name -> what it took of the operands


class _Lowering:
    """One rank program lowered into a GraphModule, node by node: each node's operands read as
    the core resharded them (``_read``), then its call made by the first emitter of
    ``_EMITTERS`` that takes it, then what follows the call (``node``)."""

    def __init__(self, program: dict, sources: dict, mesh: _Mesh | None, nodes: list[dict],
                 compute_dtypes: dict, split_backward: bool, write_regions: dict):
        self.program, self.sources, self.mesh, self.nodes = program, sources, mesh, nodes
        self.compute_dtypes, self.split_backward = compute_dtypes, split_backward
        self.weight_outputs: list[str] = []  # the values a stage sends whose gradient is W's
        self.graph = torch.fx.Graph()
        self.root = self._root()
        self.env: dict[str, torch.fx.Node] = {}
        self.leaf_docs = {leaf["value"]: leaf for leaf in program["leaves"]}
        self.attrs: dict[str, torch.fx.Node] = {}  # a leaf's get_attr (before a mixed-precision cast)
        self.sizes, self.rank = (mesh.sizes, mesh.rank) if mesh is not None else ([1] * len(program["mesh"]), 0)
        # Readers that want a value the same way share one reshard (q, k and v read one
        # gathered norm output): its backward then runs once, on the sum of their gradients
        # (every step is linear). The search's evaluation counts it once too (sharding_model.cc).
        self.reshards: dict[str, torch.fx.Node] = {}
        self.sites = 0  # weight_split sites so far
        self.block_of: dict[torch.fx.Node, int] = {}  # recomputation: the FX nodes of each checkpointed block
        self.selective: set[int] = set()  # the blocks with nodes whose outputs are kept (selective recomputation)
        self.first_waits: set[int] = set()
        self.counted: list[dict] = []  # the program nodes a counted_mean of the IR reads, in order
        self.block_of_value: dict[str, int] = {}  # a call's outputs (IR names) -> its recomputed block
        # The copies of leaves that calls write in place (the IR's shardwise.writes), by the
        # value the call reads in the IR (its region's id), for the write_state that follows.
        self.written: dict[str, torch.fx.Node] = {}
        self.write_regions = write_regions  # write_state's value -> its region (_C.rank_ir_operands' "writes")
        self._prefetch_plan()

    def _root(self) -> torch.nn.Module:
        """The module the calls run through: the runtime's kernels this program needs."""
        root, mesh = torch.nn.Module(), self.mesh
        if mesh is not None:
            root.reshard = Reshard(mesh)
        root.vocab_lookup = VocabLookup()
        if mesh is not None:
            root.statistics = StatisticsKernels(mesh)
        root.one_device_random = OneDeviceRandom()
        if self.split_backward:
            root.weight_split = WeightSplit()
        if mesh is not None:
            root.reshard.scatters = DeferredScatters(root.reshard)
            root.regather = Regather(root.reshard)
            prefetches = _Prefetches(root.reshard)
            root.prefetch = torch.nn.Module()
            root.prefetch.start = PrefetchStart(prefetches)
            root.prefetch.wait = PrefetchWait(prefetches)
        return root

    def feature_call(self, feature, read: "_Read", args: list, kwargs: dict) -> torch.fx.Node:
        """The call `feature` (one of FEATURES) makes of `read`, its module made on first use."""
        if feature.name not in self.root._modules:
            setattr(self.root, feature.name, feature.module(self))
        return feature.emit(self, read, args, kwargs)

    def leaves(self, tensors: dict, input_names: list[str], trainable: set[str], parameters: dict,
               outputs: list[dict], counted: list[tuple[dict, str]]) -> None:
        """The module's arguments (the inputs, then the count of each counted loss: `counted`,
        its program node and the IR's name of its count) and the leaves the nodes read: this
        rank's shards of `tensors`, or the objects in `parameters`."""
        graph, env = self.graph, self.env
        for name in input_names:
            env[name] = graph.placeholder(_identifier(name))
        for node, count in counted:
            env[count] = graph.placeholder("count_" + _identifier(node["outputs"][0]["value"]))
            self.counted.append(node)
        needed = [op["value"] for node in self.nodes for op in node["inputs"]] + [out["value"] for out in outputs]
        for name in dict.fromkeys(needed):
            if name in env or name not in self.leaf_docs:
                continue
            if name not in parameters:
                if name not in tensors:
                    raise ValidationError(f"parallelize: the program needs '{name}', which the model does not have")
                shard = local_tensor(tensors[name].detach(), self.leaf_docs[name]["placement"], self.sizes, self.rank)
                parameters[name] = torch.nn.Parameter(shard, requires_grad=True) if name in trainable else shard
            _set_attr(self.root, name, parameters[name])
            env[name] = self.attrs[name] = graph.get_attr(name)
            dtype = self.compute_dtypes.get(name)
            if dtype is not None and dtype != parameters[name].dtype:
                env[name] = graph.call_method("to", (env[name], dtype))
        if self.prefetch_groups:
            self._start_prefetch(0)

    def _prefetch_plan(self) -> None:
        """The prefetched gathers by unit group (the core's gather_group: one flattened
        all-gather each), the groups in order of first read, each group's members (region,
        leaf, forward step text) in order of first read; and the reads whose gradients each
        unit group's flattened reduce-scatter waits for (parameter_gathers.DeferredScatters)."""
        prefetched: dict[int, list[tuple]] = {}
        scattered: dict[int, set] = {}
        for node in self.nodes:
            for op in node["inputs"]:
                if self.mesh is None:
                    continue
                key = op["region"]
                if op.get("prefetch"):
                    members = prefetched.setdefault(op["gather_group"], [])
                    if key not in [m[0] for m in members]:
                        members.append((key, op["value"], _step_texts(self.root, op["forward"])[0]))
                if op.get("scatter_in_backward"):
                    scattered.setdefault(op["scatter_group"], set()).add(key)
        self.prefetch_groups = list(prefetched.values())
        self.prefetch_index = {member[0]: (k, j) for k, members in enumerate(self.prefetch_groups)
                               for j, member in enumerate(members)}
        self.unit_group = {member[0]: g for g, members in prefetched.items() for member in members}
        if self.mesh is not None:
            self.root.reshard.scatters.members = {g: len(keys) for g, keys in scattered.items()}

    def step_texts(self, steps: list[dict]) -> tuple[str, ...]:
        """The texts the program names resharding `steps` by (registered with root.reshard)."""
        return _step_texts(self.root, steps)

    def region_read_from(self, value: str, overlap: str) -> dict:
        """The one region of the IR being lowered that starts at `value` with steps marked
        `overlap` (a feature's: runtime/collective_matmul.py's scatter ring), as its reader's
        operand reads it."""
        found = [op for node in self.nodes for op in node["inputs"]
                 if op["value"] == value and op.get("overlap") == overlap]
        regions = {op["region"] for op in found}
        if len(regions) != 1:
            raise ValidationError(f"parallelize: '{value}' is read through {len(regions)} regions marked "
                                  f"overlap={overlap!r} in this program; its call runs one")
        return found[0]

    def _start_prefetch(self, k: int) -> None:
        members = self.prefetch_groups[k]
        self.graph.call_module("prefetch.start", (k, tuple(self.env[leaf] for _, leaf, _ in members),
                                                  tuple(text for _, _, text in members)))

    def ir_node(self, ir_node: dict, node: dict | None) -> None:
        """One node of the rank IR: the call of the program's `node`, or the emitter of a node
        the rank graph adds (_IR_EMITTERS); a resharding step (run at its reader: ``_read``), a
        stage's recv and send (the stage module's inputs and outputs) and a gradient reduction
        (the engine's, after backward) make no call."""
        op, outputs = ir_node["op"], ir_node["outputs"]
        if node is not None:
            self.node(node, ir_node)
        elif op == _WRITE_STATE:
            last = next(iter(reversed(self.graph.nodes)), None)
            _emit_write_state(self, ir_node)
            self._in_block(ir_node["attrs"].get(RECOMPUTE, -1), last)  # the writing call's block
        elif op in _STEP_OPS or op in _NOT_CALLED:
            if op == "shardwise::recv" and outputs[0] not in self.env:
                raise ValidationError(f"parallelize: the stage receives '{outputs[0]}', which its module does not take")
            if op == "shardwise::send" and ir_node["attrs"].get(WEIGHT_OUTPUT):
                self.weight_outputs.append(ir_node["inputs"][0])
        elif {WEIGHT_CUT, FUSED_ACCUMULATION_MARK} & set(ir_node["attrs"]):  # never a gradient B, W or .grad misses
            raise ValidationError(f"parallelize: the core marks the rank IR's {op} node '{outputs[0]}' "
                                  f"{sorted({WEIGHT_CUT, FUSED_ACCUMULATION_MARK} & set(ir_node['attrs']))}, a call "
                                  "the program does not make")
        elif op in _IR_EMITTERS or op.startswith("aten::"):
            last = next(iter(reversed(self.graph.nodes)), None)
            self.env[outputs[0]] = _IR_EMITTERS.get(op, _emit_ir_call)(self, ir_node)
            # A node the rank graph adds after a recomputed call runs in the call's block.
            self._in_block(self.block_of_value.get(ir_node["inputs"][0], -1) if ir_node["inputs"] else -1, last)
        else:
            raise ValidationError(f"parallelize: the rank IR's {op} node '{outputs[0] if outputs else ''}' has no "
                                  "emitter in the runtime (runtime/lower.py)")

    def _in_block(self, block: int, last) -> None:
        """The FX nodes made after `last` belong to recomputed block `block` (none: -1)."""
        if block < 0:
            return
        for fx_node in reversed(self.graph.nodes):  # the nodes made since `last`, newest first
            if fx_node is last:
                break
            self.block_of[fx_node] = block

    def node(self, node: dict, ir_call: dict) -> None:
        """`node`'s call (`ir_call`, the rank IR's node), and what follows it: state written back,
        a B/W site, its outputs bound by their names in the rank IR, a recomputed block's nodes
        marked."""
        graph = self.graph
        first = node["outputs"][0]["value"]
        src, indices = self.sources[first]
        names, marks = ir_call["outputs"], ir_call["attrs"]
        block = marks.get(RECOMPUTE, -1)
        last = next(iter(reversed(graph.nodes)), None)  # the program's last node before this one's
        read = self._read(node, first, src, block, ir_call)
        call = next(emit for takes, emit in _EMITTERS if takes(self, node, read))(self, node, read)
        if read.regathers:  # around the call that runs the op: a ring, not the getitem of its product
            runs = call.args[0] if call.op == "call_function" and call.target is operator.getitem else call
            if runs.op in ("call_function", "call_module"):
                wrapped = _released_after(graph, runs, read.regathers)
                call = wrapped if runs is call else call
        if self.split_backward and marks.get(WEIGHT_CUT):
            call = graph.call_module("weight_split.site", (call, self.sites))
            self.sites += 1
        if indices is None:
            self.env[names[0]] = call
        else:
            for name, i in zip(names, indices):
                self.env[name] = graph.call_function(operator.getitem, (call, i))
        self.block_of_value.update((name, block) for name in names)
        if block >= 0 and marks.get(RECOMPUTE_KEEPS):
            self.selective.add(block)
        self._in_block(block, last)

    def _read(self, node: dict, first: str, src: torch.fx.Node, block: int, ir_call: dict) -> _Read:
        """Each operand of `node` as its call takes it (resharded, written through a copy, cut
        for B/W), and what the operands ask of the call."""
        target = _target(node, src)
        read = _Read(first, target, src, ir_call["op"], ir_call["attrs"])
        captured_operands = operand_nodes(src)
        written = set(read.marks.get(WRITES, ()))  # the capture's mark: operands it writes in place
        for i, op in enumerate(node["inputs"]):
            captured = captured_operands[i] if i < len(captured_operands) else None
            value = self.env[op["value"]]
            fwd = _step_texts(self.root, op["forward"])
            bwd = _step_texts(self.root, op["backward"])
            if any(feature.operand(self, read, i, op) for feature in FEATURES):
                fwd = bwd = ()  # the region runs inside a call: this one's, or the value's producer's
            # In a recomputed block a write into the model's state (batch norm's running
            # statistics, num_batches_tracked += 1) goes through a copy: the copy back is
            # skipped when backward runs the block again, or the state would update twice.
            if i in written and op["value"] in self.leaf_docs and (fwd or value.op != "get_attr" or block >= 0):
                # The call writes a copy of the rank's buffer (its block for a split node, or a
                # cast), which the IR's write_state after it writes back (_emit_write_state).
                # A copy of its own, as a slice may be a view of the buffer that the copy back
                # would change under the call's saved operands.
                value = self.graph.call_module("reshard", (value, fwd, bwd)) if fwd or bwd else value
                value = self.written[op["region"]] = self.graph.call_method("clone", (value,))
            elif fwd or bwd:
                value = self._resharded(op, value, fwd, bwd, read)
            value = _identities_again(self.graph, captured, value)
            if self.split_backward and i in read.marks.get(WEIGHT_CUT, ()):
                value = self.graph.call_module("weight_split.cut", (value, self.sites))
            read.operands.append(value)
        return read

    def _resharded(self, op: dict, value: torch.fx.Node, fwd: tuple, bwd: tuple, read: _Read) -> torch.fx.Node:
        """`value` resharded for `op`: once per resharding region (the core's, rank_graph.h),
        through the unit group's prefetch where the core prefetches it."""
        key = op["region"]
        # A parameter's gradient reduce-scattered beside backward (DeferredScatters):
        # delivered into the leaf's gradient, not through the cast before the gather.
        scatter = {}
        if op.get("scatter_in_backward") and self.mesh is not None:
            scatter = {"scatter": (op["value"], self.attrs[op["value"]], op["scatter_group"])}
        if key not in self.reshards and key in self.prefetch_index:
            k, j = self.prefetch_index[key]
            self.reshards[key] = self.graph.call_module("prefetch.wait", (k, j, value, fwd, bwd), scatter)
            if k not in self.first_waits:  # the group's first read: the next group issued
                self.first_waits.add(k)
                if k + 1 < len(self.prefetch_groups):
                    self._start_prefetch(k + 1)
        elif key not in self.reshards:
            self.reshards[key] = self.graph.call_module("reshard", (value, fwd, bwd), scatter)
        if op.get("regather"):  # gathered again with its unit group where it was prefetched
            read.regathers.append((self.reshards[key], value, fwd, self.unit_group.get(key, -1)))
        return self.reshards[key]

    def module(self, outputs: list[dict], class_name: str | None) -> torch.fx.GraphModule:
        """The finished module: its outputs resharded as the program says, its recomputed
        blocks checkpointed, and what the engines read of it."""
        graph, root, mesh = self.graph, self.root, self.mesh
        results = []
        for out in outputs:
            value = self.env[out["value"]]
            fwd = _step_texts(root, out.get("forward", ()))
            bwd = _step_texts(root, out.get("backward", ()))
            results.append(graph.call_module("reshard", (value, fwd, bwd)) if fwd or bwd else value)
        graph.output(tuple(results))
        module = torch.fx.GraphModule(root, graph, class_name=class_name or f"Rank{self.rank}Program")
        if self.block_of:
            module = checkpoint_blocks(module, self.block_of, frozenset(self.selective))
        module.counted = [n["outputs"][0]["value"] for n in self.counted]
        module.weight_split = root.weight_split if self.split_backward else None
        module.weight_outputs = list(self.weight_outputs)
        # The gradient reduce-scatters this program issues in backward: the engine starts them
        # with the step and finishes them after its backward (parameter_gathers.DeferredScatters).
        module.scatters = root.reshard.scatters if mesh is not None else None
        if mesh is not None:  # each forward pass saves its own unit groups to gather again
            module.register_forward_pre_hook(lambda _module, _args: root.regather.new_pass())
        return module


def _identities_again(graph: torch.fx.Graph, captured, value: torch.fx.Node) -> torch.fx.Node:
    """An operand the capture read through a value identity the IR leaves out
    (_fx_import.VALUE_IDENTITIES: contiguous(), a constant's fresh copy), called again on the
    local operand, so a view after contiguous() still finds its layout."""
    identities = []
    while is_value_identity(captured):
        identities.append(captured)
        captured = captured.args[0]
    for identity in reversed(identities):
        value = graph.call_function(identity.target, (value,), dict(identity.kwargs))
    return value


# ---- emitters: how each kind of node's call is made -----------------------------------------------
def _emit_lookup(lowering: _Lowering, node: dict, read: _Read) -> torch.fx.Node:
    """A vocabulary-parallel lookup over the core's block of the table (kernels.VocabLookup)."""
    bound = _schema_call(node, read.target, read.operands, named=True)  # embedding's, defaults filled
    padding_idx, scale, sparse = bound["padding_idx"], bound["scale_grad_by_freq"], bound["sparse"]
    return lowering.graph.call_module("vocab_lookup", (read.operands[0], read.operands[1], read.marks["start"],
                                                       read.marks["stop"], padding_idx, scale, sparse))


def _emit_statistics(lowering: _Lowering, node: dict, read: _Read) -> torch.fx.Node:
    """The core's kernel for a split of statistics (csrc/ops/distributed_kernels.h): the IR's
    call names it, the mesh axis, the dim, its whole size and this rank's block [start, stop)."""
    marks = read.marks
    args, kwargs = _node_call(node, read)
    return lowering.graph.call_module("statistics", (read.kernel, marks["axis"], marks["dim"], marks["size"],
                                                     marks["start"], marks["stop"], tuple(args), kwargs))


def _emit_one_device_random(lowering: _Lowering, node: dict, read: _Read) -> torch.fx.Node:
    """A seeded op drawn whole, as one device draws it, and cut to this rank's block."""
    if read.target not in _MASKS | _LIKE:
        raise ValidationError(f"parallelize: the core draws '{read.first}' ({read.target}) whole and cuts it, "
                              f"which the runtime can do only for {', '.join(sorted(_BY_NAME))}")
    args, kwargs = _node_call(node, read)
    whole_shape = tuple(node["input_shapes"][0])
    index = local_index(whole_shape, _whole_index(node["inputs"][0]["required"]), lowering.sizes, lowering.rank)
    index = tuple(tuple(i.tolist()) if isinstance(i, torch.Tensor) else i for i in index)
    return lowering.graph.call_module("one_device_random", (args[0], str(read.target), tuple(args[1:]), kwargs,
                                                            whole_shape, index))


def _emit_call(lowering: _Lowering, node: dict, read: _Read) -> torch.fx.Node:
    """The op itself, on its local operands."""
    args, kwargs = _node_call(node, read)
    return lowering.graph.call_function(_LAYOUT_FREE.get(read.target, read.target), tuple(args), kwargs)


# Which emitter makes a node's call: the first whose test takes it, in this order.
_EMITTERS = (
    (lambda lowering, node, read: read.kernel == LOOKUP, _emit_lookup),
    # a kernel of its own (the captured op's own name is no kernel: shardwise_moe::experts)
    (lambda lowering, node, read: read.kernel.startswith("shardwise::") and read.kernel != node["op"],
     _emit_statistics),
    (lambda lowering, node, read: read.marks.get(ONE_DEVICE_RANDOM, False), _emit_one_device_random),
    *((lambda lowering, node, read, feature=feature: feature.takes(lowering, read),
       lambda lowering, node, read, feature=feature: lowering.feature_call(feature, read, *_node_call(node, read)))
      for feature in FEATURES),
    (lambda lowering, node, read: True, _emit_call),
)


# ---- emitters of the nodes the rank graph adds (no program node of their own) ----------------
_COUNTED_MEAN = "shardwise::counted_mean"
# A resharding step runs at its reader (the region of the reader's operand, _Lowering._read).
_STEP_OPS = frozenset(_C.step_ops())
# A stage's recv and send are its module's inputs and outputs; a gradient reduction is the
# engine's, after backward (runtime/buckets.py).
_NOT_CALLED = frozenset({"shardwise::recv", "shardwise::send", "shardwise::reduce_gradient"})


def _emit_counted_mean(lowering: _Lowering, ir_node: dict) -> torch.fx.Node:
    """``%out = shardwise::counted_mean(%out.sum, %out.count) {shares}`` (rank_graph.h): the
    sum of this rank's rows (the call's reduction is sum) times its shares of G, over G."""
    total, count = (lowering.env[v] for v in ir_node["inputs"])
    graph = lowering.graph
    return graph.call_function(divide_by_count, (
        graph.call_function(operator.mul, (total, float(ir_node["attrs"]["shares"]))), count))


# What ATen computes a reduced-precision tensor's arithmetic with a Python scalar in.
_OPMATH = {torch.bfloat16: torch.float32, torch.float16: torch.float32}


def divide_by_count(total: torch.Tensor, count: "float | torch.Tensor") -> torch.Tensor:
    """`total` / G, G the count of a counted loss (runtime/counted.py): a float eagerly, a 0-dim
    float64 tensor in a compiled program (runtime/compiled.py: a float argument is a constant
    dynamo specialises on and recompiles at the next step's count). The tensor divides as
    the float does: both cast to the op's compute dtype (float32 for bf16 / f16, else the
    total's), the quotient rounded to the total's dtype."""
    if not isinstance(count, torch.Tensor):
        return total / count
    compute = _OPMATH.get(total.dtype, total.dtype)
    return (total.to(compute) / count.to(compute)).to(total.dtype)


def _emit_ir_call(lowering: _Lowering, ir_node: dict) -> torch.fx.Node:
    """An ATen node the rank graph adds (an uneven batch share's mean scaled: aten::mul.Scalar
    into `<out>` from `<out>.share`): its op on its operands, its attributes bound to the op's
    schema."""
    target = op_overload(ir_node["op"])
    operands = [lowering.env[v] for v in ir_node["inputs"]]
    try:
        args, kwargs = call_arguments(target, ir_node["attrs"], operands)
    except (CallRebuildError, TypeError) as e:
        raise ValidationError(f"parallelize: the rank IR's '{ir_node['outputs'][0]}' ({ir_node['op']}): {e}") from None
    return lowering.graph.call_function(target, tuple(args), kwargs)


_IR_EMITTERS = {_COUNTED_MEAN: _emit_counted_mean}
_WRITE_STATE = "shardwise::write_state"


def _emit_write_state(lowering: _Lowering, ir_node: dict) -> None:
    """``shardwise::write_state(%leaf, %written)`` (rank_graph.h): the copy of the leaf the
    call before it wrote, through the IR's write-back steps (a block all-gathered), copied into
    the leaf. Nothing where the call wrote the leaf itself (it read the leaf, uncast, outside a
    recomputed block: no copy was made)."""
    leaf, written = ir_node["inputs"]
    region = lowering.write_regions[written]
    value = lowering.written.get(region["value"])
    steps = lowering.step_texts(region["forward"])
    if value is None:
        if steps:
            raise ValidationError(f"parallelize: the rank IR writes '{leaf}' back from '{region['value']}', "
                                  "which no call before it wrote")
        return
    graph = lowering.graph
    if steps:
        value = graph.call_module("reshard", (value, steps, ()))
    graph.call_function(_write_state, (graph.get_attr(leaf), value))


def program_code(module: torch.fx.GraphModule) -> str:
    """The rank program's Python source: the flat program, also where recomputed blocks split
    it into checkpointed segments."""
    return getattr(module, "flat_code", None) or module.code




def _step_texts(root: torch.nn.Module, steps) -> tuple[str, ...]:
    """The texts the program names `steps` by, each registered with root.reshard."""
    return tuple(root.reshard.step(s) for s in steps)


def _write_state(leaf: torch.Tensor, value: torch.Tensor) -> None:
    """Copies a call's write into the model's state, except while backward runs a recomputed
    block again (the write happened in forward)."""
    if torch._C._current_graph_task_id() == -1:
        with torch.no_grad():
            leaf.copy_(value)


class StageCut(NamedTuple):
    """How a pipelined job cuts its rank program (transform/stage_rank_graph.h): how many
    stages, the plan's layers per stage (none: the core balances them by forward FLOPs; the
    core assigns every node its stage either way, search/stage_assignment.h), and which stage
    passes run (transform/rank_passes.h): fused weight-gradient accumulation (the plan's
    fused_accumulation) and the B/W split of backward (a zero-bubble schedule's)."""

    count: int = 0
    layers_per_stage: tuple = ()
    fused_accumulation: bool = False
    split_backward: bool = False


def _rank_program(graph, plan_json: str, rank: int, adapt_to_shapes: bool = False,
                  group=None, micro_batches: int = 1, stages: StageCut = StageCut()) -> tuple[dict, list[str]]:
    """The core's program for `rank` (of the plan's mesh) as the job runs it: a node that any
    rank runs whole runs whole on every rank (csrc/transform/job_rank_graph.h decides it, for
    the whole mesh, on every rank alike).

    A node whole on one rank and split on another would make the two run different
    collectives, and a rank whose core raised would leave the others waiting at the first one:
    so the ranks (of `group`: a pipeline stage's sub-mesh where stages have layouts of their
    own) compare their lists once, and an error on any rank is raised on every rank, naming
    it. `micro_batches`: the step's (a pipelined plan's; spmd_rewrite.h). `stages`: the program's
    stage graphs too, cut as it says."""
    import torch.distributed as dist

    error, program, whole = None, None, []
    try:
        program, whole = _local_rank_program(graph, plan_json, rank, adapt_to_shapes, micro_batches, stages)
    except ValidationError as e:
        error = e
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1):
        if error is not None:
            raise error
        return program, whole
    every: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, (str(error) if error is not None else None, sorted(whole)), group=group)
    if error is not None:
        raise error
    failed = [(r, message) for r, (message, _) in enumerate(every) if message is not None]
    if failed:
        r, message = failed[0]
        raise ValidationError(f"rank {r}: {message}")
    differ = [r for r, (_, names) in enumerate(every) if names != sorted(whole)]
    if differ:
        r = differ[0]
        raise ValidationError(
            f"parallelize: rank {rank} runs whole {', '.join(sorted(whole)[:8]) or 'no node'}, rank {r} of its group "
            f"{', '.join(every[r][1][:8]) or 'no node'}: the core's rewrite decided by rank where "
            "transform::job_rank_graph expects it not to (csrc/transform/job_rank_graph.h); the job stops "
            "before its first collective")
    return program, whole


def _local_rank_program(graph, plan_json: str, rank: int, adapt_to_shapes: bool,
                        micro_batches: int = 1, stages: StageCut = StageCut()) -> tuple[dict, list[str]]:
    """The core's program for `rank`, and the nodes it runs whole (rank_graph.h: the splits
    with no distributed kernel, the local calls its ops' shape rules refuse on any rank's
    block, and the seeded random ops whose draws on a block could not be one device's).
    `adapt_to_shapes`: the plan was made at other batch shapes (spmd_rewrite.h)."""
    program = _C.rank_program(graph._core, plan_json, rank, adapt_to_shapes=adapt_to_shapes,
                              micro_batches=micro_batches, stages=stages.count,
                              layers_per_stage=list(stages.layers_per_stage),
                              fused_accumulation=stages.fused_accumulation,
                              split_backward=stages.split_backward)
    whole = program["whole"]
    if whole:
        log.info("rank %d: %d nodes run whole on gathered operands (no local form): %s", rank, len(whole),
                 ", ".join(whole[:8]) + (" ..." if len(whole) > 8 else ""))
    return program, whole
