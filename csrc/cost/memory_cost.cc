// Memory per rank; see memory_cost.h.
#include "cost/memory_cost.h"

#include <fmt/format.h>

#include <algorithm>

#include "analysis/parameter_stats.h"
#include "support/error.h"

namespace shardwise::cost {

MemoryConstants memory_constants(Precision precision) {
  if (precision == Precision::F32 || precision == Precision::TF32)
    return {.weight_bytes = 4, .gradient_bytes = 4, .optimizer_bytes = 8};
  return {};
}

std::optional<MemoryConstants> state_dtype_memory(const std::string& state_dtype) {
  if (state_dtype.empty()) return std::nullopt;
  double b = 0;
  if (state_dtype == "bf16" || state_dtype == "f16") b = 2;
  if (state_dtype == "f32") b = 4;
  if (b == 0)
    throw support::ValidationError(fmt::format("state_dtype: unknown '{}' (known: bf16, f16, f32)", state_dtype));
  return MemoryConstants{.weight_bytes = b, .gradient_bytes = b, .optimizer_bytes = 2 * b};
}

MemoryConstants plan_memory_constants(const plan::Plan& plan, const ir::Graph& graph) {
  if (auto own = state_dtype_memory(plan.state_dtype)) return *own;
  return memory_constants(
      model_state_precision(parse_precision(plan.precision).value_or(Precision::BF16), graph));
}

Precision model_state_precision(Precision precision, const ir::Graph& graph) {
  if (precision != Precision::FP8) return precision;
  return parse_precision(analysis::training_precision(graph)).value_or(Precision::BF16);
}

ModelStateBytes model_state_bytes(double parameters, int data, int zero_stage, const MemoryConstants& constants) {
  if (data < 1) throw support::ValidationError(fmt::format("model_state_bytes: data degree {} < 1", data));
  if (zero_stage < 0 || zero_stage > 3)
    throw support::ValidationError(fmt::format("model_state_bytes: ZeRO stage {} is not in 0..3", zero_stage));
  double d = static_cast<double>(data);
  ModelStateBytes out;
  out.weights = parameters * constants.weight_bytes / (zero_stage >= 3 ? d : 1.0);
  out.gradients = parameters * constants.gradient_bytes / (zero_stage >= 2 ? d : 1.0);
  out.optimizer = parameters * constants.optimizer_bytes / (zero_stage >= 1 ? d : 1.0);
  return out;
}

double stage_micro_batches_in_flight(plan::Schedule schedule, int pipeline, int virtual_stages, int kfkb_k,
                                     std::int64_t micro_batches) {
  double m = static_cast<double>(micro_batches);
  double p = pipeline;
  switch (schedule) {
    case plan::Schedule::GPipe: return m;
    case plan::Schedule::OneFOneB: return std::min(m, p);
    // ZB-H1 holds at most p micro-batches from F to W on every rank (schedules.h), not p - s.
    case plan::Schedule::ZeroBubbleH1: return std::min(m, p);
    // ZB-V: 2p chunks of half a stage, from F to W, on every rank (schedules.h).
    case plan::Schedule::ZeroBubbleV: return std::min(m, p);
    // DualPipeV: up to 2p + 1 chunks of half a stage on a rank (schedules_test.cc measures it).
    case plan::Schedule::DualPipeV: return std::min(m, p + 0.5);
    case plan::Schedule::KFKB: return std::min(m, static_cast<double>(kfkb_k) * p);
    case plan::Schedule::Interleaved1F1B: {
      double v = virtual_stages;
      if (pipeline == 1) return std::min(m, 1.0);  // no pipeline: one micro-batch at a time
      double chunks = std::min(m * v, 2.0 * (p - 1) + (v - 1) * p + 1);
      return chunks / v;
    }
  }
  return m;
}

double stage_activation_bytes(double layer_full_bytes, double layer_kept_bytes, double layers_on_stage,
                              double micro_batches_in_flight, bool recompute) {
  if (!recompute) return micro_batches_in_flight * layers_on_stage * layer_full_bytes;
  return micro_batches_in_flight * layers_on_stage * layer_kept_bytes + (layers_on_stage > 0 ? layer_full_bytes : 0);
}

}  // namespace shardwise::cost
