#include "ops/distributed_kernels.h"

namespace shardwise::ops {

const std::set<std::string>& lookup_kernel_ops() {
  static const std::set<std::string> ops = {"aten::embedding"};
  return ops;
}

const std::set<std::string>& statistics_kernel_ops() {
  static const std::set<std::string> ops = {"aten::cross_entropy_loss"};
  return ops;
}

bool has_statistics_kernel(const ir::Node& node, const std::set<std::string>& ops) {
  // cross_entropy_loss(self, target, weight?): the kernel has no class weights.
  return ops.contains(node.op) && node.inputs.size() == 2;
}

}  // namespace shardwise::ops
