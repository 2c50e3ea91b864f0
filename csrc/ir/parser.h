// Reads the text form written by ir/printer.h back into a Graph.
//
// Contract:
//  - parse_graph(print_graph(g)) == g, and print_graph(parse_graph(t)) == t for printed t.
//  - Every malformed input throws support::ParseError whose message starts with
//    "line L, column C: " (1-based, columns in bytes) followed by what is wrong:
//    unknown dtype, bad number, undefined or duplicate %value, missing brace, trailing
//    junk... Any input, however broken, ends in a Graph or a ParseError: no crash, no
//    hang, no recursion whose depth depends on the input (it is fuzzed).
//  - Whitespace (newlines included) separates tokens freely, except after `%` and `@`,
//    which bind to the name that follows; `//` and `#` start a comment that runs to
//    the end of the line (outside strings).
//  - Values are created in the order they appear, so ids follow the text; the header
//    inputs come first, except those re-declared in the body with role `input` (see
//    printer.h), which must be the last header inputs, in header order, with the same type.
//  - A value must be declared before it is used (the text is in topological order).
//  - The graph must end with `return (...)` and the closing `}`; nothing but comments
//    and whitespace may follow.
//
// Grammar (informally):
//   graph      := 'graph' '(' [decl {',' decl}] ')' '{' {statement} 'return' '(' [ref {',' ref}] ')' '}'
//   statement  := decl role                                      leaf value
//               | decl {',' decl} '=' op '(' [ref {',' ref}] ')' [attrs] ['@' path]
//               | op '(' [ref {',' ref}] ')' [attrs] ['@' path]  node without outputs
//   decl       := ref ':' dtype '[' [['b'] int {',' ['b'] int}] ']'
//   ref        := '%' (bare-name | "quoted")
//   role       := 'parameter' | 'buffer' | 'constant' | 'input'
//   attrs      := '{' [key '=' attr {',' key '=' attr}] '}'
//   attr       := int | double | inf | -inf | nan | "string" | true | false | none
//               | '[' [number {',' number}] ']'     (any double makes a double list; [] is int)
//
// Worked example:
//   Graph g = parse_graph(R"(graph(%x: f32[b2,16]) {
//     %fc.weight: f32[4,16] parameter
//     %linear: f32[b2,4] = aten::linear(%x, %fc.weight) @fc
//     return (%linear)
//   })");
//   // g.values().size() == 3, g.node(0).module_path == "fc"
#pragma once

#include <string_view>

#include "ir/graph.h"

namespace shardwise::ir {

Graph parse_graph(std::string_view text);

}  // namespace shardwise::ir
