#include "cost/optimizer_cost.h"

#include <optional>

namespace shardwise::cost {

double optimizer_step_seconds(const CostModel& model, double elements, double bytes_per_parameter,
                              double memory_bandwidth, double efficiency) {
  if (const std::optional<double> measured = model.optimizer_seconds_per_element()) return elements * *measured;
  return elements * 2.0 * bytes_per_parameter / (memory_bandwidth * efficiency);
}

}  // namespace shardwise::cost
