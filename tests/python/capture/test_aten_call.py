"""An IR node carries its ATen call exactly: the lowering builds every call of a rank program
from the node's op and attributes (python/shardwise/_aten_call.py), never from the captured
FX call's arguments, so what capture wrote into the attributes must bind back to the same
arguments, for real models' every node."""
from __future__ import annotations

import pytest
import torch

from conftest import MODELS
from shardwise._aten_call import CallRebuildError, bound_arguments, call_arguments
from shardwise._fx_import import op_overload, operand_nodes
from shardwise._inputs import bind_inputs
from shardwise.capture import _capture_with_sources


class _Operand:
    """A tensor operand's place: calls are compared by which operand sits where."""

    def __init__(self, fx_node):
        self.fx_node = fx_node

    def __eq__(self, other):
        return isinstance(other, _Operand) and other.fx_node is self.fx_node

    def __repr__(self):
        return f"<operand {self.fx_node.name}>"


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_every_node_of_a_real_model_rebuilds_its_captured_call(name, training):
    model, inputs = MODELS[name]()
    model.train(training)  # dropout's and batch norm's training arguments
    named = bind_inputs(model, inputs if isinstance(inputs, tuple) else (), inputs if isinstance(inputs, dict) else None)
    graph, builder = _capture_with_sources(model, named, "export", 0)
    checked, ops = 0, set()
    for node in graph.nodes():
        fx_node, _ = builder.sources[node["outputs"][0]]
        if not isinstance(fx_node.target, torch._ops.OpOverload):
            continue
        op = op_overload(node["op"])
        assert op is fx_node.target, node["op"]
        args, kwargs = call_arguments(op, node["attrs"], [_Operand(n) for n in operand_nodes(fx_node)])
        captured = bound_arguments(op, fx_node.args, fx_node.kwargs, operand=_Operand)
        assert bound_arguments(op, args, kwargs) == captured, f"{node['op']} in '{node['module']}'"
        checked += 1
        ops.add(node["op"])
    assert checked == len(graph.nodes()) and checked >= 10
    # Arguments that are not plain numbers or lists, carried by name: dtypes, devices, layouts.
    if name in ("gpt2", "llama"):
        assert any("device" in n["attrs"] or "dtype" in n["attrs"] for n in graph.nodes()), sorted(ops)


def test_dtypes_devices_layouts_and_memory_formats_come_back_as_torch_objects():
    args, kwargs = call_arguments(torch.ops.aten.arange.start_step,
                                  {"start": 0, "end": 6, "step": 2, "dtype": "i32", "layout": "torch.strided",
                                   "device": "cpu", "pin_memory": False}, [])
    assert args == [0, 6, 2]
    assert kwargs == {"dtype": torch.int32, "layout": torch.strided, "device": torch.device("cpu"),
                      "pin_memory": False}
    assert torch.equal(torch.ops.aten.arange.start_step(*args, **kwargs), torch.tensor([0, 2, 4], dtype=torch.int32))
    x = torch.ones(2, 3)
    _, kwargs = call_arguments(torch.ops.aten.clone.default, {"memory_format": "torch.contiguous_format"}, [x])
    assert kwargs == {"memory_format": torch.contiguous_format}
    # A bool list is stored as integers; the schema's List[bool] gets bools back.
    args, _ = call_arguments(torch.ops.aten.native_layer_norm_backward.default,
                             {"normalized_shape": [3], "output_mask": [1, 0, 1]}, [x, x, x, x, x, x])
    assert args[-1] == [True, False, True] and all(type(v) is bool for v in args[-1])


def test_a_positional_argument_after_one_left_at_its_default_goes_by_name():
    x = torch.arange(6.0).view(2, 3)
    args, kwargs = call_arguments(torch.ops.aten.sum.dim_IntList, {"dim": [1], "dtype": None}, [x])
    assert args == [x, [1]] and kwargs == {"dtype": None}  # keepdim (before dtype) left at its default
    assert torch.equal(torch.ops.aten.sum.dim_IntList(*args, **kwargs), torch.tensor([3.0, 12.0]))


def test_what_the_ir_cannot_carry_is_refused_naming_the_argument():
    x = torch.ones(4)
    with pytest.raises(CallRebuildError, match="'generator'"):
        call_arguments(torch.ops.aten.bernoulli.p, {"p": 0.5, "generator": "<torch._C.Generator object>"}, [x])
    with pytest.raises(CallRebuildError, match="'dim'.*text"):
        call_arguments(torch.ops.aten.softmax.int, {"dim": "[None, 1]", "dtype": None}, [x])
    with pytest.raises(CallRebuildError, match="unknown dtype"):
        call_arguments(torch.ops.aten.softmax.int, {"dim": 0, "dtype": "f4x"}, [x])
    with pytest.raises(CallRebuildError, match="left over"):
        call_arguments(torch.ops.aten.relu.default, {}, [x, x])
