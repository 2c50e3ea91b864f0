#include "transform/pipeline_job.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstddef>
#include <string>

#include "cost/pipeline_transfers.h"
#include "support/error.h"

namespace shardwise::transform {

namespace {

// "2 x data 2 x tensor 1" (every stage alike) or "2 x 1 + 1 x 1" (stage meshes): what the
// plan's stages hold, for the error of a job of another size.
std::string stage_sizes(const plan::Plan& plan, const PipelineBlocks& blocks) {
  if (!plan.stage_meshes.empty()) {
    std::vector<std::string> each;
    for (const auto& mesh : blocks.meshes) each.push_back(fmt::format("{}", fmt::join(mesh, " x ")));
    return fmt::format("{}", fmt::join(each, " + "));
  }
  std::string sizes = fmt::format("{} x data {}", plan.pipeline, plan.data);
  if (plan.context > 1) sizes += fmt::format(" x context {}", plan.context);
  return sizes + fmt::format(" x tensor {}", plan.tensor);
}

}  // namespace

bool schedule_splits_backward(const plan::Plan& plan) { return cost::pipeline_schedule(plan).splits_backward(); }

PipelineJob make_pipeline_job(const plan::Plan& plan, int world, int rank) {
  PipelineJob job;
  job.blocks = pipeline_blocks(plan);
  int ranks = 0;
  for (const auto& block : job.blocks.ranks) ranks += static_cast<int>(block.size());
  if (ranks != world)
    throw support::ValidationError(fmt::format("parallelize: the plan has pipeline {} = {} ranks, the job {}",
                                               stage_sizes(plan, job.blocks), ranks, world));
  if (rank < 0 || rank >= world)
    throw support::ValidationError(fmt::format("parallelize: rank {} of a job of {}", rank, world));
  job.pipeline_rank = plan.stage_of_rank(rank);  // (its block is plan.stage_ranks: from its first rank)
  job.local = rank - plan.stage_first_rank(job.pipeline_rank);
  job.micro_batches = static_cast<int>(plan.num_micro_batches());

  // The schedule the planner priced (one dispatch: cost::pipeline_schedule).
  const schedule::PipelineSchedule schedule = cost::pipeline_schedule(plan);
  for (int g = 0; g < schedule.total_stages(); ++g) job.stage_ranks.push_back(schedule.rank_of_stage(g));
  job.split_backward = schedule.splits_backward();
  for (const schedule::Action& a : schedule.per_rank.at(static_cast<std::size_t>(job.pipeline_rank)))
    if (a.is_compute() || a.is_send() || a.is_recv()) job.actions.push_back(a);
  job.channels = schedule::p2p_channels(schedule);

  // Blocks of one shape share torch's DeviceMesh (pipeline x sub-mesh); blocks of their own
  // sizes make their groups here, every rank every block's.
  bool sub_meshes = false;
  for (const auto& block : job.blocks.ranks) sub_meshes = sub_meshes || block.size() > 1;
  if (!plan.stage_meshes.empty() && sub_meshes) job.groups = sub_mesh_groups(job.blocks);
  for (JobGroup& g : channel_groups(job.blocks, job.channels)) job.groups.push_back(std::move(g));
  return job;
}

}  // namespace shardwise::transform
