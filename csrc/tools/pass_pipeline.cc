#include "tools/pass_pipeline.h"

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join lives here from fmt 11 on

#include <utility>

#include "analysis/batch_dim.h"
#include "analysis/shape_check.h"
#include "ir/json.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "ops/op_table.h"
#include "search/stage_assignment.h"
#include "support/error.h"
#include "transform/dead_code.h"
#include "transform/job_rank_graph.h"
#include "transform/rank_graph.h"
#include "transform/rank_passes.h"
#include "transform/stage_rank_graph.h"
#include "transform/stage_split.h"

namespace shardwise::tools {
namespace {

struct PassEntry {
  PassInfo info;
  std::function<void(ir::Graph&, const PipelineOptions&)> run;
};

void json_roundtrip(ir::Graph& graph) {
  ir::Graph back = ir::graph_from_json_string(ir::graph_to_json_string(graph));
  // Compared as text rather than with Graph ==, so a NaN attribute (NaN != NaN) does
  // not count as a change; the text shows every field that matters.
  const std::string before = ir::print_graph(graph);
  const std::string after = ir::print_graph(back);
  if (before != after) {
    std::size_t line = 1;
    std::size_t i = 0;
    while (i < before.size() && i < after.size() && before[i] == after[i]) line += before[i++] == '\n';
    throw support::Error(fmt::format("the graph changed across a JSON round trip (first difference on line {} of the "
                                     "printed graph)",
                                     line));
  }
  graph = std::move(back);
}

void check_stage(const PipelineOptions& options, std::string_view pass) {
  if (options.stage < 0 || options.stage >= options.stages)
    throw support::ValidationError(
        fmt::format("{}: stage {} of {} (give --stage=K/N with 0 <= K < N)", pass, options.stage, options.stages));
}

void rank_graph_pass(ir::Graph& graph, const PipelineOptions& options) {
  if (!options.sharding)
    throw support::Error("rank-graph needs a plan's sharding (shardwise-opt --plan FILE, or `// PLAN:` lines in a "
                         "golden file)");
  transform::RankGraph rank = transform::job_rank_graph(graph, *options.sharding, options.rank);
  transform::verify_rank_graph(rank.graph, graph, *options.sharding, options.rank);
  if (options.stages > 1) {  // a pipeline stage's part, cut as the runtime cuts (stage_rank_graph.h)
    check_stage(options, "rank-graph");
    const search::StageAssignment cut = search::assign_stages(graph, options.stages);
    graph = std::move(transform::cut_rank_graph(rank, graph, cut.stage_of_node,
                                                options.stages)[static_cast<std::size_t>(options.stage)]);
    transform::run_stage_passes(graph, {});  // as a pipelined job with the plan's defaults
    return;
  }
  graph = std::move(rank.graph);
}

void split_stages_pass(ir::Graph& graph, const PipelineOptions& options) {
  check_stage(options, "split-stages");
  const search::StageAssignment cut = search::assign_stages(graph, options.stages);
  graph = std::move(transform::split_stages(graph, cut.stage_of_node, options.stages)[static_cast<std::size_t>(options.stage)]);
}

// The one place passes are registered, in the order a full pipeline runs them (and
// --help lists them). Why each sits where it does:
std::vector<PassEntry> make_registry() {
  std::vector<PassEntry> passes;
  // verify first: every later pass indexes values and nodes by id and trusts the
  // invariants of ir/graph.h, so a broken graph must stop here with a clear message.
  passes.push_back({{"verify", "check the structural invariants of the graph (ids, roles, topological order)"},
                    [](ir::Graph& g, const PipelineOptions&) { ir::verify_graph(g); }});
  // dce before the analyses: nodes that reach no output are removed first, so the
  // analyses neither spend time on them nor fail on a dead op they have no rule for.
  passes.push_back({{"dce", "remove nodes whose outputs reach no graph output (leaf values stay)"},
                    [](ir::Graph& g, const PipelineOptions&) { transform::eliminate_dead_code(g); }});
  // ---- analysis passes ----
  // check-shapes after dce: it checks every node against the op rules of csrc/ops,
  // so it must see the final set of nodes.
  passes.push_back({{"check-shapes", "check every node's shapes against its op's dimension rule"},
                    [](ir::Graph& g, const PipelineOptions&) { analysis::check_shapes(ops::OpTable::builtin(), g); }});
  // propagate-batch-dim after check-shapes: it reads shapes and assumes the op rules
  // hold, and it annotates types (batch_dim) that the passes below must keep.
  passes.push_back({{"propagate-batch-dim", "mark the batch dimension of every value reachable from a batch-marked one"},
                    [](ir::Graph& g, const PipelineOptions&) { analysis::propagate_batch_dim(ops::OpTable::builtin(), g); }});
  // ---- checks of the final form ----
  // json-roundtrip last: it proves the JSON form keeps everything the earlier passes
  // produced, annotations included.
  passes.push_back({{"json-roundtrip", "write the graph as JSON and read it back; fail if anything changed"},
                    [](ir::Graph& g, const PipelineOptions&) { json_roundtrip(g); }});
  // ---- rewrites under a plan ----
  // rank-graph last: its output is another program (one rank's), and the passes above are
  // for the captured one. It verifies its result against the global graph and the plan.
  // With --stage=K/N it keeps stage K of the rank program cut into N, as a pipelined job runs it.
  passes.push_back({{"rank-graph", "rewrite into one rank's program under a plan (needs --plan, --rank; with "
                                   "--stage=K/N, stage K of it cut into N)"},
                    rank_graph_pass});
  // The feature passes over a rank graph, in their order (transform/rank_passes.h says why).
  // rank-graph already runs those its plan switches on, as the job does; each runs alone on a
  // rank graph under its own name.
  for (const transform::RankPass& pass : transform::rank_passes())
    passes.push_back({{std::string(pass.name), std::string(pass.summary)},
                      [run = pass.run](ir::Graph& g, const PipelineOptions&) { run(g); }});
  // Then those over a pipeline stage's rank graph (rank-graph --stage=K/N runs them too).
  for (const transform::StagePass& pass : transform::stage_passes())
    passes.push_back({{std::string(pass.name), std::string(pass.summary)},
                      [run = pass.run](ir::Graph& g, const PipelineOptions&) { run(g); }});
  // split-stages cuts the captured graph and keeps one stage. The runtime cuts in the other
  // order: it rewrites the whole graph for the stage's sub-mesh, then cuts that rank program by
  // the same stage assignment (python/shardwise/runtime/README.md says why; issue 47).
  passes.push_back({{"split-stages", "cut into pipeline stages balanced by FLOPs and keep one (needs --stage=K/N)"},
                    split_stages_pass});
  return passes;
}

const std::vector<PassEntry>& registry() {
  static const std::vector<PassEntry> passes = make_registry();
  return passes;
}

const PassEntry& find_pass(std::string_view name) {
  for (const PassEntry& p : registry()) {
    if (p.info.name == name) return p;
  }
  std::vector<std::string_view> known;
  for (const PassEntry& p : registry()) known.push_back(p.info.name);
  throw support::Error(fmt::format("unknown pass '{}' (known passes: {})", name, fmt::join(known, ", ")));
}

// Rethrows a pass failure with the pass name in front, keeping the error type (the
// Python bindings map each type to its own exception).
template <typename F>
void with_context(std::string_view what, F&& body) {
  try {
    body();
  } catch (const support::ParseError& e) {
    throw support::ParseError(fmt::format("{}: {}", what, e.what()));
  } catch (const support::ValidationError& e) {
    throw support::ValidationError(fmt::format("{}: {}", what, e.what()));
  } catch (const support::Error& e) {
    throw support::Error(fmt::format("{}: {}", what, e.what()));
  }
}

}  // namespace

std::vector<PassInfo> available_passes() {
  std::vector<PassInfo> out;
  for (const PassEntry& p : registry()) out.push_back(p.info);
  return out;
}

void run_pass(std::string_view name, ir::Graph& graph, const PipelineOptions& options) {
  find_pass(name).run(graph, options);
}

void run_passes(ir::Graph& graph, const std::vector<std::string>& passes, const PipelineOptions& options) {
  std::vector<const PassEntry*> resolved;
  for (const std::string& name : passes) resolved.push_back(&find_pass(name));
  if (options.verify_each) with_context("verifying the input graph", [&] { ir::verify_graph(graph); });
  for (const PassEntry* pass : resolved) {
    with_context(fmt::format("pass '{}'", pass->info.name), [&] { pass->run(graph, options); });
    if (options.verify_each) {
      with_context(fmt::format("verifying after pass '{}'", pass->info.name), [&] { ir::verify_graph(graph); });
    }
    if (options.after_each) options.after_each(pass->info.name, graph);
  }
}

std::string run_pipeline(std::string_view ir_text, const std::vector<std::string>& passes, bool verify_each) {
  PipelineOptions options;
  options.verify_each = verify_each;
  return run_pipeline(ir_text, passes, options);
}

std::string run_pipeline(std::string_view ir_text, const std::vector<std::string>& passes,
                         const PipelineOptions& options) {
  ir::Graph graph = ir::parse_graph(ir_text);
  run_passes(graph, passes, options);
  return ir::print_graph(graph);
}

std::vector<std::string> split_pass_list(std::string_view list) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t end = list.find(',', start);
    if (end == std::string_view::npos) end = list.size();
    std::string_view item = list.substr(start, end - start);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t' || item.back() == '\r')) item.remove_suffix(1);
    if (!item.empty()) out.emplace_back(item);
    start = end + 1;
  }
  return out;
}

}  // namespace shardwise::tools
