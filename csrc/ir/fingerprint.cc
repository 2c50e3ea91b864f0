#include "ir/fingerprint.h"

#include <fmt/format.h>

#include "support/fnv1a.h"

namespace shardwise::ir {

std::string graph_fingerprint(const Graph& graph) {
  // Fields end with a byte no name holds, so "ab" + "c" and "a" + "bc" differ.
  std::uint64_t hash = support::kFnv1aOffsetBasis;
  auto add = [&](std::string_view text) { hash = support::fnv1a64("\x1f", support::fnv1a64(text, hash)); };
  for (const Value& v : graph.values()) {
    if (v.producer) continue;
    add(v.name);
    add(role_name(v.role));
  }
  for (const Node& node : graph.nodes()) {
    add(node.op);
    for (ValueId in : node.inputs) add(graph.value(in).name);
    add("->");
    for (ValueId out : node.outputs) add(graph.value(out).name);
  }
  for (ValueId out : graph.outputs()) add(graph.value(out).name);
  return fmt::format("{:016x}", hash);
}

}  // namespace shardwise::ir
