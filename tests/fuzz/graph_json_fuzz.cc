// Fuzzes the graph JSON reader (ir/json.h, the exchange format of the Python capture
// code): any input ends in a Graph or a support::ParseError (malformed JSON and content
// that does not fit the schema alike); a Graph it reads then goes through the verifier
// and the print / JSON round trips of graph_round_trip.h.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "graph_round_trip.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  shardwise::ir::Graph graph;
  try {
    graph = shardwise::ir::graph_from_json_string(text);
  } catch (const shardwise::support::ParseError&) {
    return 0;  // the documented rejection
  }
  shardwise::fuzz::check_graph_round_trips(graph);
  return 0;
}
