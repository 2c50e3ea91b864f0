#include "ir/fingerprint.h"

#include <fmt/format.h>

#include <vector>

#include "support/fnv1a.h"

namespace shardwise::ir {

namespace {

// A capture names a reader's operand by the Python tensor it was handed, and aten::to returns
// its operand itself when the dtype is already the one asked for: in a float32 Llama the
// RMSNorm's `x.to(float32)` is x, so the residual add that reads x is recorded as reading the
// cast, while in a float64 model it reads x. The fingerprint sees through casts (a reader of
// `to(v)` counts as a reader of v, through chains of casts), so one model in two dtypes has one
// fingerprint; the cast nodes themselves still count, with their names.
bool is_cast(const Node& node) {
  return node.op.starts_with("aten::to.") && !node.inputs.empty() && node.outputs.size() == 1;
}

}  // namespace

std::string graph_fingerprint(const Graph& graph) {
  // Fields end with a byte no name holds, so "ab" + "c" and "a" + "bc" differ.
  std::uint64_t hash = support::kFnv1aOffsetBasis;
  auto add = [&](std::string_view text) { hash = support::fnv1a64("\x1f", support::fnv1a64(text, hash)); };
  std::vector<ValueId> same(graph.values().size());  // each value, or what the casts it came through cast
  for (std::size_t v = 0; v < same.size(); ++v) same[v] = static_cast<ValueId>(v);
  for (const Node& node : graph.nodes()) {  // graph order: an operand's root is known first
    if (is_cast(node)) same[static_cast<std::size_t>(node.outputs.front())] =
        same[static_cast<std::size_t>(node.inputs.front())];
  }
  for (const Value& v : graph.values()) {
    if (v.producer) continue;
    add(v.name);
    add(role_name(v.role));
  }
  for (const Node& node : graph.nodes()) {
    add(node.op);
    for (ValueId in : node.inputs) add(graph.value(same[static_cast<std::size_t>(in)]).name);
    add("->");
    for (ValueId out : node.outputs) add(graph.value(out).name);
  }
  for (ValueId out : graph.outputs()) add(graph.value(out).name);
  return fmt::format("{:016x}", hash);
}

}  // namespace shardwise::ir
