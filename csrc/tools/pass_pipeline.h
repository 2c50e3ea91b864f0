// The pass pipeline of shardwise-opt and the golden tests: named passes over an
// ir::Graph, run in the order given, optionally verifying the graph after each.
//
// Passes (available_passes() is the authoritative list, with help text):
//   verify          structural checks (ir/verifier.h); leaves the graph unchanged
//   dce             dead-code elimination (transform/dead_code.h)
//   json-roundtrip  graph -> JSON text -> graph; fails if the graph changed, so a
//                   golden test with it proves the JSON form loses nothing
//   rank-graph      the graph -> one rank's program under a plan's sharding
//                   (transform/rank_graph.h), checked by verify_rank_graph; needs
//                   PipelineOptions::sharding (shardwise-opt --plan, a golden file's
//                   `// PLAN:` lines) and ::rank
//   split-stages    the graph -> stage ::stage of ::stages pipeline stages
//                   (search/stage_assignment.h cuts, transform/stage_split.h rewrites:
//                   boundary values as shardwise::recv / shardwise::send)
//
// Worked example:
//   std::string out = run_pipeline(ir_text, {"dce", "verify"}, /*verify_each=*/true);
//   // `out` is print_graph of the graph after dce, text parsed and verified first.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "plan/plan.h"

namespace shardwise::tools {

struct PassInfo {
  std::string name;
  std::string help;
};

// In pipeline order of the registry (see pass_pipeline.cc for why each sits where it does).
std::vector<PassInfo> available_passes();

struct PipelineOptions {
  bool verify_each = false;  // verify the input graph and the graph after every pass
  // Called after each pass with its name and the resulting graph (--print-after-each).
  std::function<void(std::string_view pass, const ir::Graph& graph)> after_each;
  // What the rank-graph pass rewrites for: a plan's sharding section and a rank of its mesh.
  std::optional<plan::Sharding> sharding;
  int rank = 0;
  // What split-stages cuts: `stages` stages, keeping stage `stage` (a golden file's
  // `// STAGE: 1 of 3`; shardwise-opt --stage=1/3); rank-graph cuts its rank program so.
  int stages = 1;
  int stage = 0;
};

// Runs one pass. Throws support::Error on an unknown name, listing the known ones.
void run_pass(std::string_view name, ir::Graph& graph, const PipelineOptions& options = {});

// Runs `passes` in order on `graph`. Every pass name is checked before the first runs,
// so a typo fails fast. An error from a pass is rethrown with the pass name in front.
void run_passes(ir::Graph& graph, const std::vector<std::string>& passes, const PipelineOptions& options = {});

// Parses `ir_text`, runs the passes, returns the printed result.
std::string run_pipeline(std::string_view ir_text, const std::vector<std::string>& passes, bool verify_each);
std::string run_pipeline(std::string_view ir_text, const std::vector<std::string>& passes,
                         const PipelineOptions& options);

// "a, b,,c" -> {"a", "b", "c"}: the --passes= / `// RUN:` list syntax.
std::vector<std::string> split_pass_list(std::string_view list);

}  // namespace shardwise::tools
