// Fuzzes the IR text parser (ir/parser.h): any input ends in a Graph or a
// support::ParseError; a Graph it reads then goes through the verifier and the
// print / JSON round trips of graph_round_trip.h.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "graph_round_trip.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  shardwise::ir::Graph graph;
  try {
    graph = shardwise::ir::parse_graph(text);
  } catch (const shardwise::support::ParseError&) {
    return 0;  // the documented rejection
  }
  shardwise::fuzz::check_graph_round_trips(graph);
  return 0;
}
