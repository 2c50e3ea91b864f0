// What every Graph read by a fuzz target (from IR text or from JSON) must satisfy, by
// the contracts of ir/verifier.h, ir/printer.h, ir/parser.h and ir/json.h:
//  - verify_graph either passes or throws support::ValidationError (a reader is
//    syntactic: "f32[-1]" reads, and the verifier rejects it), and it answers the same
//    for the graph read back from its printed text;
//  - print -> parse gives an equal Graph and the same text (parse_graph(print_graph(g))
//    == g; print_graph(parse_graph(t)) == t for printed t);
//  - graph_to_json_string either throws support::Error (a name that is not valid UTF-8,
//    possible from the text form only) or graph_from_json_string reads it back equal.
// NaN attributes compare unequal to themselves (a documented loss); the text then.
#pragma once

#include <optional>
#include <string>

#include "fuzz_check.h"
#include "ir/graph.h"
#include "ir/json.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "support/error.h"

namespace shardwise::fuzz {

// nullopt when the graph verifies, else the ValidationError's message.
inline std::optional<std::string> verify_message(const ir::Graph& graph) {
  try {
    ir::verify_graph(graph);
    return std::nullopt;
  } catch (const support::ValidationError& e) {
    return std::string(e.what());
  }
}

inline void check_graph_round_trips(const ir::Graph& graph) {
  const bool comparable = !has_nan_attribute(graph);
  const std::optional<std::string> verified = verify_message(graph);
  for (std::size_t i = 0; i < graph.nodes().size(); ++i)
    (void)must("print_node", [&] { return ir::print_node(graph, static_cast<ir::NodeId>(i)); });

  // Text form.
  const std::string text = must("print_graph", [&] { return ir::print_graph(graph); });
  const ir::Graph from_text = must("parse_graph(print_graph(g))", [&] { return ir::parse_graph(text); });
  FUZZ_CHECK(ir::print_graph(from_text) == text, text, ir::print_graph(from_text));
  if (comparable) FUZZ_CHECK(from_text == graph, text);
  FUZZ_CHECK(verify_message(from_text) == verified, text, verified.value_or("(verifies)"));

  // JSON form.
  std::string json;
  try {
    json = ir::graph_to_json_string(graph);
  } catch (const support::Error&) {
    return;  // a name or string attribute that is not valid UTF-8 (documented)
  }
  const ir::Graph from_json = must("graph_from_json_string(graph_to_json_string(g))",
                                   [&] { return ir::graph_from_json_string(json); });
  FUZZ_CHECK(ir::graph_to_json_string(from_json) == json, json);
  if (comparable) FUZZ_CHECK(from_json == graph, text, json);
  FUZZ_CHECK(ir::print_graph(from_json) == text, text, json);
}

}  // namespace shardwise::fuzz
