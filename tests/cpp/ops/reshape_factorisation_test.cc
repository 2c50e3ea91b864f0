#include "ops/reshape_factorisation.h"

#include <gtest/gtest.h>

#include "support/error.h"

namespace shardwise::ops {
namespace {

std::vector<std::int64_t> sizes(const DimRule& rule) {
  std::vector<std::int64_t> out;
  for (const auto& index : rule.indices) out.push_back(index.size);
  return out;
}

TEST(ReshapeFactorisationTest, SplitKeepsHeadsAsMajorFactor) {
  const auto rule = factorise_reshape({2, 8, 768}, {2, 8, 12, 64});
  EXPECT_EQ(sizes(rule), (std::vector<std::int64_t>{2, 8, 12, 64}));
  EXPECT_EQ(rule.inputs[0], (OperandDims{{0}, {1}, {2, 3}}));
  EXPECT_EQ(rule.outputs[0], (OperandDims{{0}, {1}, {2}, {3}}));
  for (const auto& index : rule.indices) EXPECT_EQ(index.kind, IndexKind::Spatial);
}

TEST(ReshapeFactorisationTest, MergeIsTheReverse) {
  const auto rule = factorise_reshape({2, 16, 768}, {32, 768});
  EXPECT_EQ(rule.inputs[0], (OperandDims{{0}, {1}, {2}}));
  EXPECT_EQ(rule.outputs[0], (OperandDims{{0, 1}, {2}}));
}

TEST(ReshapeFactorisationTest, OverlappingPiecesFactorFinely) {
  const auto rule = factorise_reshape({2, 6}, {4, 3});
  EXPECT_EQ(sizes(rule), (std::vector<std::int64_t>{2, 2, 3}));
  EXPECT_EQ(rule.inputs[0], (OperandDims{{0}, {1, 2}}));
  EXPECT_EQ(rule.outputs[0], (OperandDims{{0, 1}, {2}}));
}

TEST(ReshapeFactorisationTest, UnitDims) {
  const auto squeeze = factorise_reshape({1, 16}, {16});
  EXPECT_EQ(squeeze.inputs[0], (OperandDims{{}, {0}}));
  EXPECT_EQ(squeeze.outputs[0], (OperandDims{{0}}));
  // A unit dim on both sides stays tied (a batch of 1 is still the batch).
  const auto same = factorise_reshape({1, 16, 768}, {1, 16, 12, 64});
  EXPECT_EQ(same.inputs[0], (OperandDims{{0}, {1}, {2, 3}}));
  EXPECT_EQ(same.outputs[0], (OperandDims{{0}, {1}, {2}, {3}}));
  const auto inner = factorise_reshape({2, 1, 3}, {6});
  EXPECT_EQ(inner.inputs[0], (OperandDims{{0}, {}, {1}}));
  EXPECT_EQ(inner.outputs[0], (OperandDims{{0, 1}}));
  const auto unsqueeze = factorise_reshape({16}, {1, 16, 1});
  EXPECT_EQ(unsqueeze.outputs[0], (OperandDims{{}, {0}, {}}));
}

TEST(ReshapeFactorisationTest, UnfactorisableStretchIsWhole) {
  const auto rule = factorise_reshape({4, 6, 5}, {6, 4, 5});
  // [4,6] -> [6,4] has no common pieces: Whole on each side; the trailing 5 passes through.
  EXPECT_EQ(rule.indices.size(), 5u);
  EXPECT_EQ(rule.indices[rule.inputs[0][0][0]].kind, IndexKind::Whole);
  EXPECT_EQ(rule.indices[rule.outputs[0][1][0]].kind, IndexKind::Whole);
  EXPECT_NE(rule.inputs[0][0], rule.outputs[0][0]);
  EXPECT_EQ(rule.inputs[0][2], rule.outputs[0][2]);
  EXPECT_EQ(rule.indices[rule.inputs[0][2][0]].kind, IndexKind::Spatial);
}

TEST(ReshapeFactorisationTest, ElementCountsMustAgree) {
  EXPECT_THROW(factorise_reshape({2, 8, 768}, {2, 8, 12, 32}), support::ValidationError);
  EXPECT_NO_THROW(factorise_reshape({0, 4}, {0, 2, 2}));
  EXPECT_NO_THROW(factorise_reshape({}, {1, 1}));
}

}  // namespace
}  // namespace shardwise::ops
