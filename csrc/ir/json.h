// JSON form of a Graph, the exchange format with the Python capture code.
//
// Schema (version 1):
//   {"format": "shardwise.graph", "version": 1,
//    "values":  [{"id": 1, "name": "fc.weight", "dtype": "f32", "shape": [4,16], "batch_dim": null,
//                 "role": "parameter"}, ...],                      leaf values only
//    "nodes":   [{"op": "aten::linear", "inputs": ["x", "fc.weight"],
//                 "outputs": [{"name": "linear", "dtype": "f32", "shape": [2,4], "batch_dim": 0}],
//                 "attrs": {"dim": -1, "scale": 0.5, "approximate": "tanh", "size": [2,8],
//                           "flag": true, "dtype": null},
//                 "module": "fc"}, ...],
//    "outputs": ["linear"]}
//
// Contract:
//  - graph_from_json(graph_to_json(g)) == g: values are referenced by name, and the
//    optional "id" of a leaf entry (its ValueId, which graph_to_json always writes)
//    says where the leaf goes among the node outputs. Without "id" (hand-written JSON,
//    the Python importer) all leaf values are created first, then the nodes.
//    "id" is given on every leaf entry or on none; "batch_dim" (absent = null),
//    "attrs" (absent = {}) and "module" (absent = "") are optional; unknown keys are
//    ignored so the writer can add fields.
//  - Attribute values: int -> int64, float -> double, string, bool, null -> none,
//    array of ints (or empty) -> int list, array with any float -> double list.
//    JSON has no inf / nan, so a non-finite double is written as {"float": "inf"}
//    (or "-inf", "nan"), alone or as a list element. An empty double list comes back
//    as an empty int list (as in the text form).
//  - Errors: malformed JSON text -> support::ParseError with the byte offset; content
//    that does not fit the schema -> support::ParseError naming the path
//    ("nodes[3].inputs[1]: undefined value 'x'").
//
// Only <nlohmann/json_fwd.hpp> is included here, to keep this header light; a caller
// that touches the returned nlohmann::json includes <nlohmann/json.hpp> itself.
//
// Worked example:
//   nlohmann::json j = graph_to_json(g);
//   std::string text = graph_to_json_string(g, 2);   // pretty-printed
//   Graph back = graph_from_json_string(text);        // back == g
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "ir/graph.h"

namespace shardwise::ir {

nlohmann::json graph_to_json(const Graph& graph);
Graph graph_from_json(const nlohmann::json& json);

// indent < 0: one line; otherwise pretty-printed with that many spaces.
// Throws support::Error when a string is not valid UTF-8 (JSON text must be).
std::string graph_to_json_string(const Graph& graph, int indent = -1);
Graph graph_from_json_string(std::string_view text);

}  // namespace shardwise::ir
