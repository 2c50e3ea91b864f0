#include "transform/job_program.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <utility>

#include "ir/printer.h"
#include "search/stage_assignment.h"
#include "support/error.h"
#include "support/fnv1a.h"
#include "transform/job_rank_graph.h"
#include "transform/pipeline_job.h"
#include "transform/stage_rank_graph.h"

namespace shardwise::transform {

plan::Sharding replicated_sharding(const ir::Graph& graph, plan::Recompute recompute) {
  plan::Sharding s;
  s.mesh = {1};
  s.axis_names = {"data"};
  s.level = "replicated";
  s.recompute = recompute;
  for (const ir::Value& v : graph.values()) s.placements[v.name] = {"R"};
  for (const ir::Node& n : graph.nodes())
    if (!n.outputs.empty()) s.strategies[graph.value(n.outputs[0]).name] = {"replicate"};
  return s;
}

RankProgramGraphs build_rank_program(const ir::Graph& graph, const plan::Sharding& sharding, int rank,
                                     const RewriteOptions& options, const StageCutOptions& cut) {
  RankProgramGraphs out;
  out.rank = job_rank_graph(graph, sharding, rank, options);
  if (cut.stages > 0) {
    out.stage_of_node = search::assign_stages(graph, cut.stages, cut.layers_per_stage).stage_of_node;
    out.stages = cut_rank_graph(out.rank, graph, out.stage_of_node, cut.stages);
    for (ir::Graph& stage : out.stages) run_stage_passes(stage, cut.passes);
  }
  return out;
}

RankProgramGraphs job_program(const ir::Graph& graph, const plan::Plan& plan, int rank) {
  if (rank < 0 || rank >= plan.world_size())
    throw support::ValidationError(
        fmt::format("job program: rank {} of a plan of {} ranks", rank, plan.world_size()));
  RewriteOptions options;
  options.fp8 = plan.precision == "fp8";  // the rank graph marks its FP8 linears (rank_graph.h)
  if (plan.sharding) return build_rank_program(graph, *plan.sharding, rank, options);
  // A pipelined plan: the rank's stage sub-mesh program, at its place in its block.
  const int stage = plan.stage_meshes.empty() ? 0 : plan.stage_of_rank(rank);
  const int size = plan.stage_size(stage);
  const plan::Sharding sharding =
      size == 1 ? replicated_sharding(graph, plan.recompute) : *plan::stage_plan(plan, stage).sharding;
  const int local = plan.stage_meshes.empty() ? rank % size : rank - plan.stage_first_rank(stage);
  options.micro_batches = std::max<std::int64_t>(1, plan.num_micro_batches());
  StageCutOptions cut;
  cut.stages = plan.pipeline * plan.virtual_stages;
  cut.layers_per_stage = plan.layers_per_stage;
  cut.passes = {schedule_splits_backward(plan), plan.fused_accumulation};
  return build_rank_program(graph, sharding, local, options, cut);
}

std::uint64_t printed_program_hash(const std::string& rank_graph, const std::vector<std::string>& stages) {
  std::uint64_t h = support::fnv1a64(rank_graph);
  for (const std::string& stage : stages) h = support::fnv1a64(stage, h);
  return h;
}

std::uint64_t program_hash(const RankProgramGraphs& program) {
  std::vector<std::string> stages;
  for (const ir::Graph& stage : program.stages) stages.push_back(ir::print_graph(stage));
  return printed_program_hash(ir::print_graph(program.rank.graph), stages);
}

std::string hex_hash(std::uint64_t hash) { return fmt::format("{:016x}", hash); }

std::string combined_programs_hash(const std::vector<std::string>& per_rank) {
  std::uint64_t h = support::kFnv1aOffsetBasis;
  for (const auto& r : per_rank) h = support::fnv1a64(r, h);
  return hex_hash(h);
}

namespace {

// The first stage of `stage`'s layout: the stage of one sub-mesh and sharding that comes first.
int first_alike_stage(const plan::Plan& p, int stage) {
  const auto at = [](const auto& list, int s) -> const auto& { return list[static_cast<std::size_t>(s)]; };
  for (int s = 0; s < stage; ++s)
    if (at(p.stage_meshes, s) == at(p.stage_meshes, stage) &&
        (p.stage_shardings.empty() || at(p.stage_shardings, s) == at(p.stage_shardings, stage)))
      return s;
  return stage;
}

}  // namespace

std::string plan_programs_hash(const ir::Graph& graph, const plan::Plan& p) {
  const auto hash_of = [&](int rank) { return hex_hash(program_hash(job_program(graph, p, rank))); };
  std::vector<std::string> per_rank;
  if (!p.stage_meshes.empty()) {
    std::map<std::pair<int, int>, std::string> made;  // (first stage of its layout, local rank)
    for (int r = 0; r < p.world_size(); ++r) {
      const int stage = p.stage_of_rank(r);
      const int alike = first_alike_stage(p, stage);
      const std::pair key{alike, r - p.stage_first_rank(stage)};
      if (!made.contains(key)) made.emplace(key, hash_of(p.stage_first_rank(alike) + key.second));
      per_rank.push_back(made.at(key));
    }
    return combined_programs_hash(per_rank);
  }
  // Without stage meshes every stage's block runs its sub-mesh's programs alike.
  const int distinct = p.sharding ? p.world_size() : p.stage_data() * p.tensor;
  std::vector<std::string> made;
  for (int r = 0; r < distinct; ++r) made.push_back(hash_of(r));
  for (int r = 0; r < p.world_size(); ++r) per_rank.push_back(made[static_cast<std::size_t>(r % distinct)]);
  return combined_programs_hash(per_rank);
}

}  // namespace shardwise::transform
