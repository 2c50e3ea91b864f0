#include "ops/dim_rule.h"

#include <gtest/gtest.h>

#include "support/error.h"

namespace shardwise::ops {
namespace {

DimRule mm_rule() {
  DimRule rule;
  rule.indices = {{"m", 32, IndexKind::Spatial}, {"k", 768, IndexKind::Reduced}, {"n", 2304, IndexKind::Spatial}};
  rule.inputs = {{{0}, {1}}, {{1}, {2}}};
  rule.outputs = {{{0}, {2}}};
  return rule;
}

TEST(DimRuleTest, PrintsOneLine) {
  EXPECT_EQ(mm_rule().str(), "m k, k n -> m n  [m=32, k=768 reduced, n=2304]");
  DimRule view;
  view.indices = {
      {"b", 2}, {"h", 12}, {"d", 64}, {"W", 5, IndexKind::Whole}, {"r", 3, IndexKind::Reduced, Reduction::Max}};
  view.inputs = {{{0}, {1, 2}, {3}, {4}}};
  view.outputs = {{{0}, {}, {1}, {2}, {3}}, {}};
  EXPECT_EQ(view.str(), "b (h d) W r -> b 1 h d W, ()  [b=2, h=12, d=64, W=5 whole, r=3 reduced(max)]");
}

TEST(DimRuleTest, SizesAndLookups) {
  const auto rule = mm_rule();
  EXPECT_EQ(rule.find("k"), 1);
  EXPECT_EQ(rule.find("z"), -1);
  EXPECT_EQ(rule.dims_size({0, 1}), 32 * 768);
  EXPECT_EQ(rule.dims_size({}), 1);
  EXPECT_EQ(rule.shape_of(rule.outputs[0]), (std::vector<std::int64_t>{32, 2304}));
  EXPECT_EQ(index_kind_name(IndexKind::Whole), "whole");
  EXPECT_EQ(reduction_name(Reduction::Mean), "mean");
}

TEST(DimRuleTest, StructureCheckCatchesMalformedRules) {
  EXPECT_NO_THROW(check_structure(mm_rule()));
  auto out_of_range = mm_rule();
  out_of_range.outputs[0][1] = {7};
  EXPECT_THROW(check_structure(out_of_range), support::ValidationError);
  auto twice = mm_rule();
  twice.inputs[0] = {{0}, {0}};
  EXPECT_THROW(check_structure(twice), support::ValidationError);
  auto unused = mm_rule();
  unused.indices.push_back({"z", 4});
  EXPECT_THROW(check_structure(unused), support::ValidationError);
  auto reduced_out = mm_rule();
  reduced_out.outputs[0][1] = {1};
  EXPECT_THROW(check_structure(reduced_out), support::ValidationError);
  auto repeated = mm_rule();
  repeated.indices[2].label = "m";
  EXPECT_THROW(check_structure(repeated), support::ValidationError);
}

}  // namespace
}  // namespace shardwise::ops
