// Time-balanced layers per pipeline chunk; the model is in layer_balance.h.
#include "cost/layer_balance.h"

#include <cstddef>

namespace shardwise::cost {

std::vector<int> balance_layers(const LayerBalanceProblem& problem) {
  const int p = problem.pipeline, v = problem.virtual_stages;
  if (p < 1 || v < 1 || problem.layers < p * v) return {};
  std::vector<int> device(static_cast<std::size_t>(p), v);  // every chunk at least one layer
  const int last_device = problem.v_shape ? 0 : p - 1;
  auto extra = [&](int s) { return (s == 0 ? problem.first : 0.0) + (s == last_device ? problem.last : 0.0); };
  auto scale = [&](int s) {
    return problem.device_scale.empty() ? 1.0 : problem.device_scale.at(static_cast<std::size_t>(s));
  };
  for (int left = problem.layers - p * v; left > 0; --left) {
    int best = 0;
    double best_time = 0;
    for (int s = 0; s < p; ++s) {
      double time = scale(s) * ((device[static_cast<std::size_t>(s)] + 1) * problem.layer + extra(s));
      if (s == 0 || time < best_time) best = s, best_time = time;
    }
    ++device[static_cast<std::size_t>(best)];
  }
  std::vector<int> chunks(static_cast<std::size_t>(p * v));
  for (int s = 0; s < p; ++s) {
    const int n = device[static_cast<std::size_t>(s)];
    for (int k = 0; k < v; ++k) {
      // Round-robin: chunk s + k p; in a V (v = 2): chunks s and 2p - 1 - s.
      const int chunk = problem.v_shape ? (k == 0 ? s : 2 * p - 1 - s) : s + k * p;
      chunks[static_cast<std::size_t>(chunk)] = n / v + (k < n % v ? 1 : 0);
    }
  }
  return chunks;
}

std::vector<int> even_layers(int layers, int chunks) {
  std::vector<int> out;
  for (int c = 0; c < chunks; ++c) out.push_back(layers / chunks + (c < layers % chunks ? 1 : 0));
  return out;
}

std::vector<int> layers_per_device(const std::vector<int>& chunks, int pipeline, bool v_shape) {
  std::vector<int> out(static_cast<std::size_t>(pipeline), 0);
  const auto p = static_cast<std::size_t>(pipeline);
  for (std::size_t c = 0; c < chunks.size(); ++c) out[v_shape ? (c < p ? c : 2 * p - 1 - c) : c % p] += chunks[c];
  return out;
}

}  // namespace shardwise::cost
