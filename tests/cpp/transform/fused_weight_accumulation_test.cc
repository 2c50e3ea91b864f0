#include "transform/fused_weight_accumulation.h"

#include <gtest/gtest.h>

#include <vector>

#include "ir/parser.h"

namespace shardwise::transform {
namespace {

// torch.export's linear (t + addmm), a linear kept whole, an mm of a parameter read
// directly, and the products that must not be marked: two activations, a weight made by a
// cast, a transpose that is not of the two dims of a 2-D parameter.
constexpr const char* kContractions = R"(graph(%x: f32[b8,16]) {
  %w1: f32[32,16] parameter
  %b1: f32[32] parameter
  %w2: f32[16,32] parameter
  %w3: f32[16,16] parameter
  %w4: f32[16,16] parameter
  %wt: f32[16,32] = aten::t(%w1) @fc1
  %h: f32[b8,32] = aten::addmm(%b1, %x, %wt) {alpha=1, beta=1} @fc1
  %y: f32[b8,16] = aten::linear(%h, %w2) @fc2
  %z: f32[b8,16] = aten::mm(%y, %w3) @fc3
  %g: f32[16,b8] = aten::t(%z) @gram
  %gram: f32[16,16] = aten::mm(%g, %z) @gram
  %w4h: f16[16,16] = aten::to.dtype(%w4) {dtype="torch.float16"} @fc4
  %w4f: f32[16,16] = aten::to.dtype(%w4h) {dtype="torch.float32"} @fc4
  %o: f32[b8,16] = aten::mm(%z, %w4f) @fc4
  %w4s: f32[16,16] = aten::transpose.int(%w4) {dim0=1, dim1=-2} @fc5
  %p: f32[b8,16] = aten::mm(%o, %w4s) @fc5
  return (%gram, %p)
})";

TEST(FusedWeightAccumulation, MarksContractionsOfAParameterOrItsTranspose) {
  const std::vector<FusedWeightAccumulation> marks = fused_weight_accumulations(ir::parse_graph(kContractions));
  ASSERT_EQ(marks.size(), 4u);
  EXPECT_EQ(marks[0].node, "h");  // addmm(b, x, t(w1)): weight at 2, transposed
  EXPECT_EQ(marks[0].weight_input, 2);
  EXPECT_EQ(marks[0].parameter, "w1");
  EXPECT_TRUE(marks[0].transposed);
  EXPECT_EQ(marks[1].node, "y");  // linear(h, w2): weight at 1
  EXPECT_EQ(marks[1].weight_input, 1);
  EXPECT_EQ(marks[1].parameter, "w2");
  EXPECT_FALSE(marks[1].transposed);
  EXPECT_EQ(marks[2].node, "z");  // mm(y, w3)
  EXPECT_EQ(marks[2].parameter, "w3");
  EXPECT_FALSE(marks[2].transposed);
  // mm of two activations (gram) and of a cast weight (o): not marked.
  EXPECT_EQ(marks[3].node, "p");  // transpose(w4, 1, -2) swaps a 2-D parameter's two dims
  EXPECT_EQ(marks[3].parameter, "w4");
  EXPECT_TRUE(marks[3].transposed);
}

TEST(FusedWeightAccumulation, ATransposeOfOtherDimsIsNotTheParametersTranspose) {
  const std::vector<FusedWeightAccumulation> marks = fused_weight_accumulations(ir::parse_graph(R"(graph(%x: f32[b8,16]) {
  %w: f32[16,16] parameter
  %same: f32[16,16] = aten::transpose.int(%w) {dim0=1, dim1=1} @fc
  %y: f32[b8,16] = aten::mm(%x, %same) @fc
  return (%y)
})"));
  EXPECT_TRUE(marks.empty());
}

// A lookup of a parameter table is marked at its input 0; one scaled by frequency, a sparse
// one, and one of a table made by a cast are not (their backward is not a scatter-add into
// the leaf's .grad).
TEST(FusedWeightAccumulation, MarksALookupOfAParameterTable) {
  const std::vector<FusedWeightAccumulation> marks = fused_weight_accumulations(ir::parse_graph(R"(graph(%ids: i64[b2,8]) {
  %wte: f32[64,16] parameter
  %e: f32[b2,8,16] = aten::embedding(%wte, %ids) {padding_idx=-1, scale_grad_by_freq=false, sparse=false} @wte
  %f: f32[b2,8,16] = aten::embedding(%wte, %ids) {padding_idx=-1, scale_grad_by_freq=true, sparse=false} @freq
  %s: f32[b2,8,16] = aten::embedding(%wte, %ids) {padding_idx=-1, scale_grad_by_freq=false, sparse=true} @sparse
  %half: f16[64,16] = aten::to.dtype(%wte) {dtype="torch.float16"} @cast
  %c: f16[b2,8,16] = aten::embedding(%half, %ids) {padding_idx=-1, scale_grad_by_freq=false, sparse=false} @cast
  return (%e, %f, %s, %c)
})"));
  ASSERT_EQ(marks.size(), 1u);
  EXPECT_EQ(marks[0].node, "e");
  EXPECT_EQ(marks[0].weight_input, 0);
  EXPECT_EQ(marks[0].parameter, "wte");
  EXPECT_FALSE(marks[0].transposed);
}

}  // namespace
}  // namespace shardwise::transform
