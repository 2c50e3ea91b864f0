// Seeded random ops, and how a rank that holds a block of their operand draws what one device
// draws.
//
// Every rank runs the same seeded ops in the same order from the same generator state (the
// engine seeds every rank alike), so an op run on whole operands draws on each rank exactly
// the values one device draws. On a block it would draw a smaller tensor: other values. Two
// kinds of op can still draw as one device on a block, since their draws do not depend on the
// operand's values:
//   - Mask (aten::dropout, aten::feature_dropout): the rank draws the mask of the whole
//     operand (the op run on ones: the scaled mask) and multiplies its block by its block of
//     the mask. The same holds for a Partial operand: each rank's summand is scaled by the
//     same mask, so the sum is.
//   - Like (aten::rand_like, aten::randn_like): the values ignore the operand; the rank draws
//     the whole tensor and keeps its block. A Partial operand would make the output Partial
//     too, which random values are not: such a node runs whole.
//   - Other seeded ops (dropout_, native_dropout, bernoulli, attention with dropout, rand,
//     randn, randint, ...) run whole on any split or Partial operand.
// The rewrite decides this (transform/spmd_rewrite.h: NodeRewrite::one_device_random and the
// Whole mode) and the runtime lowers the decision (python/shardwise/runtime/lower.py:
// OneDeviceRandom). The list below is torch's `nondeterministic_seeded` tag for these ops;
// tests/python/runtime/test_random_ops.py checks every op of the builtin table against the tag.
//
// Worked example:
//   random_draw("aten::dropout")        // RandomDraw::Mask
//   random_draw("aten::bernoulli.p")    // RandomDraw::Other (by the base name)
//   draws(node)                         // false for dropout {p=0.0} or {train=false}
//   draws(node)                         // true for native_dropout {p=0.0, train=true}
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace shardwise::ops {

enum class RandomDraw : std::uint8_t { None, Mask, Like, Other };
std::string_view random_draw_name(RandomDraw kind);  // "none", "mask", "like", "other"

// The kind of the op's draws, by its full name, then its base name (the overload stripped):
// every overload of a seeded op here is seeded.
RandomDraw random_draw(std::string_view op);

// Does the node draw random numbers? A dropout out of training (train=false), ATen's composite
// dropouts at p = 0 and attention at dropout_p = 0 draw nothing; native_dropout and bernoulli
// draw even at p = 0 (so on a block they would move the generator less than one device).
bool draws(const ir::Node& node);

// The seeded ops by base name, each with its kind (for the check against torch's tags).
std::vector<std::pair<std::string_view, RandomDraw>> seeded_ops();

}  // namespace shardwise::ops
