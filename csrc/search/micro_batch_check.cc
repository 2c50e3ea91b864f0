#include "search/micro_batch_check.h"

#include <fmt/format.h>

#include "support/error.h"

namespace shardwise::search {

void check_micro_batches(const analysis::BatchCoupling& coupling, const plan::Plan& plan) {
  const std::int64_t m = plan.num_micro_batches();
  if (m <= 1 || plan.micro_batch_semantics == plan::MicroBatchSemantics::PerMicroBatch || !coupling.coupled()) return;
  const std::int64_t rows = plan.stage_meshes.empty() ? plan.micro_batch * plan.data : plan.micro_batch;
  throw support::ValidationError(fmt::format(
      "plan: {} micro-batches of {} rows change what the model computes: {}. A plan of one micro-batch "
      "(micro_batch x data = the global batch {}) computes the batch's step; or micro_batch_semantics="
      "'per_micro_batch' accepts statistics over each micro-batch and a loss averaged over them (gradient "
      "accumulation's usual meaning)",
      m, rows, coupling.describe(), plan.global_batch));
}

void check_micro_batches(const ops::OpTable& table, const ir::Graph& graph, const plan::Plan& plan) {
  if (plan.num_micro_batches() <= 1 || plan.micro_batch_semantics == plan::MicroBatchSemantics::PerMicroBatch) return;
  check_micro_batches(analysis::batch_coupling(table, graph), plan);
}

}  // namespace shardwise::search
