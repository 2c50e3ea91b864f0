// The dimension rule of a reshape (view, reshape, flatten, unflatten, squeeze, unsqueeze):
// both shapes factorised into one list of indices, so each dim of either side is a group of
// indices, major to minor.
//
// Row-major order makes this a matter of cumulative products: walking both shapes from the
// major side, every point where either side's running product stops is a boundary; the
// indices are the pieces between consecutive boundaries. A split dim maps to the group of
// its pieces, a merge the reverse, so a [b, s, 768] -> [b, s, 12, 64] view maps input dim 2
// to (i2 i3) = (heads, d) and heads stays splittable.
//
// Worked examples (index sizes in brackets):
//   [2,8,768]   -> [2,8,12,64]   in  {0},{1},{2,3}      out {0},{1},{2},{3}   [2,8,12,64]
//   [2,16,768]  -> [32,768]      in  {0},{1},{2}        out {0,1},{2}         [2,16,768]
//   [2,6]       -> [4,3]         in  {0},{1,2}          out {0,1},{2}         [2,2,3]
//   [1,16]      -> [16]          in  {},{0}             out {0}               (unit dims tie to nothing,
//   [1,16]      -> [1,16]        in  {0},{1}            out {0},{1}            unless both sides have one)
// When the pieces of a stretch of dims do not divide ([4,6] -> [6,4]) that stretch gets Whole
// indices of its own on each side: no split of it is expressible.
#pragma once

#include "ops/dim_rule.h"
#include "ops/rule_operands.h"

namespace shardwise::ops {

// A rule with one input and one output; all indices Spatial except those of an
// unfactorisable stretch (Whole). Labels are "i0", "i1", ... (Whole ones "W0", ...).
// Throws support::ValidationError when the element counts differ.
DimRule factorise_reshape(const Shape& input, const Shape& output);

}  // namespace shardwise::ops
