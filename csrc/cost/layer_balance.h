// Layers per pipeline chunk that balance the devices' time, not the layer count.
//
//   std::vector<int> chunks = balance_layers({.layers = 24, .pipeline = 4, .virtual_stages = 1,
//                                             .layer = 1.0, .first = 0.1, .last = 2.0});
//   // {6, 7, 7, 4}: the last device also runs the LM head (two layers' worth), the first
//   // the embedding
//
// Device s holds chunks s, s + p, ..., s + (v - 1) p (the interleaved layout; v = 1: one
// chunk each). Its time per micro-batch is (its layers) x `layer`, plus `first` on device 0
// (the embedding) and `last` on device p - 1 (the final norm, LM head and loss). Each chunk
// gets at least one layer. Layers go one at a time to the device whose time grows least
// (ties to the lower device), which minimises the largest device time for this separable
// problem; a device's layers are spread over its chunks, the earlier chunks taking the
// remainder. Deterministic.
//
// On a heterogeneous cluster (device_scale) the same greedy sizes the stages to their
// devices: 8 layers on a full-speed and a half-speed device: {6, 2}, by time, not count.
//
// This is how the joint planner prices uneven stages (plan.layers_per_stage): a model whose
// LM head costs several layers (a 128k vocabulary on a 4k hidden) gets fewer layers on its
// last stage. The evaluator checks each split's memory per stage, so a split that overfills
// the first stage (1F1B keeps p micro-batches there) does not fit and is not chosen.
#pragma once

#include <vector>

namespace shardwise::cost {

struct LayerBalanceProblem {
  int layers = 0;          // the repeated layers to place
  int pipeline = 1;        // p: devices, one pipeline stage each
  int virtual_stages = 1;  // v: chunks per device (interleaved 1F1B; 2 in a V)
  double layer = 0;  // one layer's time per micro-batch
  double first = 0;  // device 0's time outside the layers
  double last = 0;   // the last chunk's device's time outside the layers (p - 1; 0 in a V)
  bool v_shape = false;  // ZB-V's placement (two chunks per device, layers_per_device below)
  // Per device, what its time is multiplied by (a heterogeneous cluster: a stage on devices
  // half as fast takes 2); empty: 1 everywhere. Device s's time is then
  // scale_s x (its layers x layer + its extras), and the faster devices take more layers.
  std::vector<double> device_scale;
};

// Layers per chunk (pipeline x virtual_stages entries, summing to layers); empty when
// layers < pipeline x virtual_stages.
std::vector<int> balance_layers(const LayerBalanceProblem& problem);

// The count split, the evaluator's default: chunk c gets layers / chunks, the first
// layers % chunks one more.
std::vector<int> even_layers(int layers, int chunks);

// Layers per device of a chunk split: device s holds chunks s, s + p, ...; in a V (ZB-V, two
// chunks per device) chunks s and 2p - 1 - s.
std::vector<int> layers_per_device(const std::vector<int>& chunks, int pipeline, bool v_shape = false);

}  // namespace shardwise::cost
