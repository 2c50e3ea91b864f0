#include "ops/distributed_kernels.h"

#include <map>

#include "ops/random_draws.h"

namespace shardwise::ops {
namespace {

struct StatisticsKernel {
  std::string_view name;
  // The most tensor operands the kernel takes: a loss's third is its class weights.
  std::size_t max_inputs;
};

const std::map<std::string, StatisticsKernel, std::less<>>& statistics_table() {
  static const std::map<std::string, StatisticsKernel, std::less<>> table = {
      {"aten::cross_entropy_loss", {"shardwise::vocab_cross_entropy", 2}},
      {"aten::nll_loss", {"shardwise::vocab_nll_loss", 2}},
      {"aten::nll_loss_nd", {"shardwise::vocab_nll_loss", 2}},
      {"aten::nll_loss2d", {"shardwise::vocab_nll_loss", 2}},
      {"aten::softmax.int", {"shardwise::split_softmax", 1}},
      {"aten::_softmax", {"shardwise::split_softmax", 1}},
      {"aten::log_softmax.int", {"shardwise::split_log_softmax", 1}},
      {"aten::_log_softmax", {"shardwise::split_log_softmax", 1}},
      {"aten::layer_norm", {"shardwise::split_layer_norm", 3}},
      {"aten::rms_norm", {"shardwise::split_rms_norm", 2}},
      {"aten::batch_norm", {"shardwise::sync_batch_norm", 5}},
  };
  return table;
}

}  // namespace

const std::set<std::string>& lookup_kernel_ops() {
  static const std::set<std::string> ops = {"aten::embedding"};
  return ops;
}

const std::set<std::string>& statistics_kernel_ops() {
  static const std::set<std::string> ops = [] {
    std::set<std::string> out;
    for (const auto& [op, kernel] : statistics_table()) out.insert(op);
    return out;
  }();
  return ops;
}

std::optional<std::string_view> statistics_kernel(const ir::Node& node, const std::set<std::string>& ops) {
  if (!ops.contains(node.op)) return std::nullopt;
  auto it = statistics_table().find(node.op);
  if (it == statistics_table().end() || node.inputs.size() > it->second.max_inputs) return std::nullopt;
  return it->second.name;
}

bool has_statistics_kernel(const ir::Node& node, const std::set<std::string>& ops) {
  return statistics_kernel(node, ops).has_value();
}

constexpr std::string_view kRingAttention = "shardwise::ring_attention";

bool is_statistics_kernel(std::string_view kernel) {
  if (kernel == kRingAttention || kernel == kExpertsAllToAll) return true;
  for (const auto& [op, entry] : statistics_table())
    if (entry.name == kernel) return true;
  return false;
}

std::optional<std::string_view> ring_kernel(const ir::Node& node) {
  const bool attention = node.op == "aten::scaled_dot_product_attention" && node.inputs.size() >= 3 &&
                         node.inputs.size() <= 4;  // q, k, v and the mask
  if (!attention || draws(node)) return std::nullopt;
  return kRingAttention;
}

std::int64_t ring_rows(const ir::Graph& graph, const ir::Node& node) {
  if (!ring_kernel(node)) return 0;
  const auto& q = graph.value(node.inputs.at(0)).type.shape;
  const auto& k = graph.value(node.inputs.at(1)).type.shape;
  if (q.size() < 2 || k.size() < 2 || q[q.size() - 2] != k[k.size() - 2]) return 0;
  return q[q.size() - 2];
}

}  // namespace shardwise::ops
