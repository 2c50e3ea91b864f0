// A plan as text for people: what `shardwise.Plan.report()` and the CLI print.
//
//   plan     mesh [1, 8] (data x tensor), level fast, global batch 16, recompute no
//   predicted step 61.2 ms, 148.3 TFLOP/s per device, memory 9.26 GB per rank (of 72.0 GB)
//   time     compute 58.5 ms | activations 6.1 ms | gradient_sync 0.5 ms | statistics 0.5 ms
//   parameters (placement per mesh axis; names that differ only in a block number are one row)
//     transformer.h.*.attn.c_attn.weight  x12  [R, S(1,g3)]
//     ...
//   collectives per step (kind, axis, phase: calls, bytes per call, seconds in all)
//     all_gather      axis 1  forward   48 calls   64.0 MiB   12.3 ms
//     ...
//
// Plans without a sharding (given by degrees) print their degrees, schedule and predictions.
// `memory_capacity` (bytes, 0 = unknown) is printed next to the memory per rank.
#pragma once

#include <string>

#include "plan/plan.h"

namespace shardwise::search {

std::string plan_report(const plan::Plan& plan, double memory_capacity = 0);

// A placement's text for people: uneven shares to 5 decimals, equal neighbours run together
// ("S(0)[0.12502, 0.12500 x7]" for 50257 words on 8 ranks); other placements unchanged.
// The plan's JSON keeps the exact text, which reads back to the same doubles.
std::string readable_placement(const std::string& text);

}  // namespace shardwise::search
