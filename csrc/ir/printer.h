// The text form of a Graph: deterministic, human-readable, and read back exactly by
// ir/parser.h (parse_graph(print_graph(g)) == g).
//
// Contract:
//  - The header lists the graph inputs (role Input) as `%name: type`, in inputs() order.
//  - The body walks values in id order: a leaf value that is not an input prints a
//    declaration line `%name: type role`; the first output of a node prints the node
//    line. Parsing creates values in the printed order, so ids come back identical.
//  - Inputs that are not a prefix of the id order (a capture that created parameters
//    first) additionally get a body line `%name: type input` at their id, so their ids
//    come back too; graphs whose inputs come first never show such lines.
//  - A node with no outputs (none come from a capture, but the IR allows them) prints
//    as `op(...)` without `=`, right before the next node in node-id order.
//  - Attributes print as `{k=v, ...}` in key order (ir::attr_str for the values) and
//    are omitted when empty; operands always print, even `()`; ` @module.path` when the
//    node has a module path.
//  - Names print bare where they match a simple pattern and JSON-quoted otherwise
//    (value names [A-Za-z0-9_.-]+, ops [A-Za-z0-9_:.]+ (but not `return`), module
//    paths and attribute keys [A-Za-z0-9_.]+), so every Graph prints to parseable text.
//  - Known losses: an empty double list prints as `[]` and reads back as an empty int
//    list; NaN attributes read back as NaN (equal text, but NaN != NaN in Graph ==).
//
// Worked example:
//   graph(%x: f32[b2,16]) {
//     %fc.weight: f32[4,16] parameter
//     %fc.bias: f32[4] parameter
//     %linear: f32[b2,4] = aten::linear(%x, %fc.weight, %fc.bias) @fc
//     %split.0: f32[b2,2], %split.1: f32[b2,2] = aten::split.Tensor(%linear) {dim=1, split_size=2} @fc
//     return (%split.0, %split.1)
//   }
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "ir/graph.h"

namespace shardwise::ir {

// The whole graph, ending with "}\n".
std::string print_graph(const Graph& graph);

// One node line without indentation or newline, as it appears in print_graph:
//   %linear: f32[b2,4] = aten::linear(%x, %fc.weight, %fc.bias) @fc
// Handy in error messages of passes ("while checking: <line>").
std::string print_node(const Graph& graph, NodeId id);

// `%name`, quoted as `%"..."` when the name is not a bare value name.
std::string value_ref(std::string_view name);

// JSON-style double-quoted string; escapes '"', '\\' and every control character.
std::string quote_string(std::string_view text);

// The two-character escapes quote_string writes and the parser reads back: escape_letter('\n')
// is 'n' and unescaped_char('n') is '\n'; nullopt for a character without one (quote_string
// writes other control characters as \uXXXX).
std::optional<char> escape_letter(char c);
std::optional<char> unescaped_char(char letter);

// The character classes of bare words in the text form (shared with the parser).
bool is_value_name_char(char c);   // [A-Za-z0-9_.-]
bool is_op_name_char(char c);      // [A-Za-z0-9_:.]
bool is_module_path_char(char c);  // [A-Za-z0-9_.]  (also attribute keys)

}  // namespace shardwise::ir
