// TorchScript importer: a torch::jit::Graph (of a traced or scripted module) -> the
// shardwise core IR (ir::Graph).
//
// TorchScript is deprecated in favour of torch.export (torch 2.11+; torch.jit.trace
// warns from 2.10 on). It is supported because existing code still ships traced
// modules; torch.export is the preferred capture (python/shardwise/capture.py).
//
// What the importer does:
//  - inlines prim::CallMethod / prim::CallFunction (on a copy; the caller's graph is
//    never modified), removes tensor mutation where torch can prove it safe
//    (aten::relu_ -> aten::relu) and dead code;
//  - inlines a torch.autograd.Function's forward (the Subgraph the tracer records on its
//    prim::PythonOp), as torch.export does;
//  - resolves prim::GetAttr chains from the module's `self` input into parameter and
//    buffer leaf values, named by their fully qualified names (tied weights are one
//    value: the caller's table maps every alias to its canonical name);
//  - folds the non-tensor plumbing (constants, lists, tuples, dicts, aten::size on
//    static shapes, prim::NumToTensor/aten::Int, scalar arithmetic, prim::If on a
//    condition known at import time) so that every IR node is a tensor op:
//    `x.view(x.size(0), -1, 12, 64)` becomes aten::view{size=[2,-1,12,64]};
//  - turns every remaining aten op into one ir::Node (conventions in ir/graph.h and
//    python/shardwise/_fx_import.py, shared with the export importer).
//
// Anything it cannot express raises TorchScriptImportError naming the node kind, its
// module path and source location: data-dependent control flow (prim::If on a tensor
// value, prim::Loop), shapes missing from the graph (scripted graphs carry none: trace
// instead), values that depend on tensor data (aten::Int of a computed tensor).
#pragma once

#include <c10/core/ScalarType.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/attribute.h"
#include "ir/graph.h"
#include "support/error.h"

namespace torch::jit {
struct Graph;
}  // namespace torch::jit

namespace shardwise::torchbridge {

// An error raised while importing a TorchScript graph. A support::Error, so the
// bindings turn it into shardwise.ShardwiseError.
class TorchScriptImportError : public support::Error {
 public:
  using support::Error::Error;
};

// One parameter or buffer of the module, under one of its names.
struct ModuleTensor {
  std::string name;       // fully qualified attribute path from the root ("lm_head.weight")
  std::string canonical;  // IR value name: the first name of the same tensor ("transformer.wte.weight")
  ir::ValueRole role = ir::ValueRole::Parameter;  // Parameter or Buffer
  ir::TensorType type;
};

struct TorchScriptImportOptions {
  // Every parameter and buffer, each alias listed (with its canonical name), in
  // module.named_parameters() then named_buffers() order. One leaf value is created
  // per canonical name, in this order, whether or not forward() uses it (the plan must
  // place every weight). A prim::GetAttr that reaches a tensor not listed here is an error.
  std::vector<ModuleTensor> module_tensors;
  // Non-tensor module attributes a scripted graph may read ("encoder.training" -> false),
  // by fully qualified name. Traced graphs never read them.
  std::unordered_map<std::string, ir::AttrValue> module_constants;
  // Names of the graph's tensor inputs (forward() argument names, without `self`).
  // Empty: taken from the graph's debug names ("input_ids.1" -> "input_ids").
  std::vector<std::string> input_names;
  // A 0-dim tensor whose value the importer knows (a Python number the tracer wrapped,
  // `x * 0.5`, or a folded size) passed where the schema wants a Tensor becomes a number
  // attribute under the argument's name, as torch.export records it
  // (aten::mul.Tensor{other=0.5}). false: a Constant-role leaf value instead.
  bool scalar_constants_as_attributes = true;
  // Replace in-place ops by their functional form where torch's RemoveTensorMutation
  // proves it safe (the IR is a pure dataflow graph).
  bool remove_mutation = true;
  // Rewrite aten::_convolution (what the tracer records for nn.ConvNd) into
  // aten::conv{1,2,3}d / aten::conv_transpose{1,2,3}d with their schema attributes,
  // the ops torch.export records.
  bool canonicalize_convolution = true;
  // Drop ops that return their input unchanged and that torch.export does not record
  // either: a full-range aten::slice.Tensor (`x[:, :]`) and aten::contiguous.
  bool elide_no_ops = true;
};

// The IR dtype of a torch dtype; nullopt for one the IR has no name for (quantized, uint16, ...).
std::optional<ir::DType> to_ir_dtype(c10::ScalarType type);

// Imports `graph` (not modified). Throws TorchScriptImportError (a support::Error) on
// anything it cannot express, and ir's ValidationError if the result breaks an IR invariant.
ir::Graph import_torchscript(const std::shared_ptr<torch::jit::Graph>& graph,
                             const TorchScriptImportOptions& options);

}  // namespace shardwise::torchbridge
