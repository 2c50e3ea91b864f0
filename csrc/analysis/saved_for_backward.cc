#include "analysis/saved_for_backward.h"

#include <algorithm>
#include <iterator>
#include <string_view>
#include <utility>

#include "analysis/gradient_flow.h"
#include "ops/op_table.h"
#include "ops/random_draws.h"

namespace shardwise::analysis {
namespace {

// Ops whose output 0.. is a view of input 0 (a cast to the same dtype returns its input).
constexpr std::string_view kViews[] = {
    "aten::alias",           "aten::detach",          "aten::view",            "aten::_unsafe_view",
    "aten::_reshape_alias",  "aten::reshape",         "aten::flatten",         "aten::unflatten",
    "aten::unsqueeze",       "aten::squeeze",         "aten::transpose",       "aten::swapaxes",
    "aten::swapdims",        "aten::t",               "aten::permute",         "aten::numpy_T",
    "aten::mT",              "aten::expand",          "aten::broadcast_to",    "aten::slice",
    "aten::narrow",          "aten::select",          "aten::split",           "aten::split_with_sizes",
    "aten::unsafe_split",    "aten::chunk",           "aten::unbind"};

// Products: input k saved when another input requires a gradient.
constexpr std::string_view kProducts[] = {"aten::mul",    "aten::div",    "aten::mm",    "aten::bmm",
                                          "aten::matmul", "aten::linear", "aten::addmm", "aten::baddbmm",
                                          "aten::mv",     "aten::dot"};

// Ops whose backward reads their output only.
constexpr std::string_view kSaveOutput[] = {"aten::tanh",    "aten::sigmoid",  "aten::exp",
                                            "aten::rsqrt",   "aten::sqrt",     "aten::relu",
                                            "aten::softmax", "aten::_softmax", "aten::log_softmax"};

// Ops that save nothing beyond what kViews and the table's linear / additive ops cover:
// reductions whose backward broadcasts the gradient back, creation ops.
constexpr std::string_view kSaveNothing[] = {"aten::sum",    "aten::mean",  "aten::neg",
                                             "aten::arange", "aten::zeros", "aten::ones"};

template <std::size_t N>
bool listed(const std::string_view (&names)[N], std::string_view base) {
  return std::find(std::begin(names), std::end(names), base) != std::end(names);
}

bool is_view(const ir::Graph& graph, const ir::Node& node) {
  const std::string_view base = ops::op_base_name(node.op);
  if (base == "aten::to" || base == "aten::contiguous")  // a copy only when the dtype changes
    return !node.inputs.empty() && !node.outputs.empty() &&
           graph.value(node.inputs[0]).type.dtype == graph.value(node.outputs[0]).type.dtype;
  return listed(kViews, base) && !node.inputs.empty();
}

}  // namespace

std::vector<ir::ValueId> view_roots(const ir::Graph& graph) {
  std::vector<ir::ValueId> root(graph.values().size());
  for (const ir::Value& value : graph.values()) root[static_cast<std::size_t>(value.id)] = value.id;
  for (const ir::Node& node : graph.nodes())
    if (is_view(graph, node))
      for (ir::ValueId out : node.outputs)
        root[static_cast<std::size_t>(out)] = root[static_cast<std::size_t>(node.inputs[0])];
  return root;
}

SavedTensors saved_tensors(const ir::Graph& graph) {
  const std::size_t num_values = graph.values().size();
  const std::vector<bool> requires_grad = gradient_flow(graph);
  std::vector<ir::ValueId> root(num_values);
  for (const ir::Value& value : graph.values()) root[static_cast<std::size_t>(value.id)] = value.id;
  std::vector<std::int64_t> saved(num_values, 0);
  std::vector<std::int64_t> masks(num_values, 0);  // dropout's, beside whatever else keeps the output
  std::vector<bool> saves(graph.nodes().size(), false);
  ir::NodeId current = 0;
  // A kept value keeps its whole base (a view of a slice still holds the storage).
  auto keep = [&](ir::ValueId id) {
    saves[static_cast<std::size_t>(current)] = true;  // a weight too: autograd saves it
    const ir::ValueId base = root[static_cast<std::size_t>(id)];
    const ir::Value& value = graph.value(base);
    if (value.role == ir::ValueRole::Parameter || value.role == ir::ValueRole::Buffer ||
        value.role == ir::ValueRole::Constant)
      return;  // model state, counted as such
    saved[static_cast<std::size_t>(base)] = value.type.bytes();
  };
  const ops::OpTable& table = ops::OpTable::builtin();
  for (const ir::Node& node : graph.nodes()) {
    bool grad = false;
    for (ir::ValueId in : node.inputs) grad = grad || requires_grad[static_cast<std::size_t>(in)];
    if (is_view(graph, node)) {
      const ir::ValueId base = root[static_cast<std::size_t>(node.inputs[0])];
      for (ir::ValueId out : node.outputs) root[static_cast<std::size_t>(out)] = base;
    }
    if (!grad) continue;  // no autograd node: nothing kept
    current = node.id;

    const std::string_view base = ops::op_base_name(node.op);
    const ops::OpSpec* spec = table.find(node.op);
    if (listed(kProducts, base)) {
      for (std::size_t k = 0; k < node.inputs.size(); ++k) {
        // addmm / baddbmm's first operand is added, not multiplied: never saved.
        const bool added = (base == "aten::addmm" || base == "aten::baddbmm") && k == 0;
        if (partner_needs_gradient(node, k, requires_grad) && !added) keep(node.inputs[k]);
      }
    } else if (listed(kSaveOutput, base)) {
      for (ir::ValueId out : node.outputs) keep(out);
    } else if (base == "aten::cross_entropy_loss") {
      keep(node.inputs[0]);  // its log_softmax, input-sized
    } else if (base == "aten::dropout" || base == "aten::feature_dropout" || base == "aten::native_dropout") {
      if (ops::draws(node)) {
        saves[static_cast<std::size_t>(node.id)] = true;
        const ir::ValueId out = node.outputs[0];
        masks[static_cast<std::size_t>(out)] = graph.value(out).type.numel();  // a bool mask
      }
    } else if (base == "aten::embedding") {
      if (node.inputs.size() > 1) keep(node.inputs[1]);
    } else if (base.find("scaled_dot_product") != base.npos) {
      // every output too: the log-sum-exp of a fused kernel, the probabilities of the math one
      for (ir::ValueId in : node.inputs) keep(in);
      for (ir::ValueId out : node.outputs) keep(out);
    } else if (is_view(graph, node) || listed(kSaveNothing, base) ||
               (spec != nullptr && (spec->linear || spec->additive))) {
      // data movement, sums and differences: the backward needs no operand
    } else {
      for (ir::ValueId in : node.inputs) keep(in);
    }
  }
  for (std::size_t v = 0; v < num_values; ++v) saved[v] += masks[v];
  return {std::move(saved), std::move(saves)};
}

std::vector<std::int64_t> saved_for_backward(const ir::Graph& graph) { return saved_tensors(graph).bytes; }

std::vector<std::int64_t> saved_bytes_by_node(const ir::Graph& graph) {
  const std::vector<std::int64_t> saved = saved_for_backward(graph);
  std::vector<std::int64_t> out(graph.nodes().size(), 0);
  for (const ir::Node& node : graph.nodes())
    for (ir::ValueId v : node.outputs) out[static_cast<std::size_t>(node.id)] += saved[static_cast<std::size_t>(v)];
  return out;
}

}  // namespace shardwise::analysis
