#include "transform/fused_weight_accumulation.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ir/parser.h"
#include "ir/printer.h"
#include "transform/rank_passes.h"

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

// The pass on a stage's rank graph: the weight operand the rank reads decides. A shard held
// as the parameter is marked; the same product reading it through a gather (ZeRO), from a recv,
// or with its backward split for an asynchronous gradient is not.
constexpr const char* kStageRankGraph = R"(graph(%x: f32[8,16]) {
  %w: f32[16,16] parameter
  %v: f32[8,16] parameter
  %u: f32[16,16] parameter
  %r: f32[16,16] = shardwise::recv() {from=0, stage=1} @fc3
  %a: f32[8,16] = aten::mm(%x, %w) @fc1
  %v.r1: f32[16,16] = shardwise::all_gather(%v) {axis=0, dim=0, group=[0,1], overlap="exposed"} @fc2
  %b: f32[8,16] = aten::mm(%a, %v.r1) @fc2
  %c: f32[8,16] = aten::mm(%b, %r) @fc3
  %c.r1: f32[8,16] = shardwise::all_reduce(%c) {axis=0, group=[0,1], overlap="backward", pass="backward", reduce="sum"} @fc4
  %d: f32[8,16] = aten::mm(%c.r1, %u) {shardwise.async_gradient=0} @fc4
  return (%d)
})";

const ir::Node& producer(const ir::Graph& g, const std::string& value) {
  return g.node(*g.value(*g.find_value(value)).producer);
}

TEST(FusedAccumulationPass, MarksOnlyAWeightTheRankHoldsAsTheParameter) {
  ir::Graph g = ir::parse_graph(kStageRankGraph);
  mark_fused_accumulations(g);
  EXPECT_EQ(fused_accumulation_operand(producer(g, "a")), 1);
  EXPECT_EQ(fused_accumulation_operand(producer(g, "b")), -1);  // gathered
  EXPECT_EQ(fused_accumulation_operand(producer(g, "c")), -1);  // received
  EXPECT_EQ(fused_accumulation_operand(producer(g, "d")), -1);  // its own split backward
  const std::string once = ir::print_graph(g);
  mark_fused_accumulations(g);
  EXPECT_EQ(ir::print_graph(g), once);
}

TEST(FusedAccumulationPass, IsTheStagePassThePlansOptionSwitches) {
  ASSERT_EQ(stage_passes().size(), 2u);
  EXPECT_EQ(stage_passes()[1].name, "fused-accumulation");
  ir::Graph off = ir::parse_graph(kStageRankGraph);
  run_stage_passes(off, {.fused_accumulation = false});
  EXPECT_EQ(ir::print_graph(off), ir::print_graph(ir::parse_graph(kStageRankGraph)));
  ir::Graph on = ir::parse_graph(kStageRankGraph);
  run_stage_passes(on, {});
  EXPECT_EQ(fused_accumulation_operand(producer(on, "a")), 1);
}

}  // namespace
}  // namespace shardwise::transform
