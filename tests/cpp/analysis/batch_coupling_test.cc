#include "analysis/batch_coupling.h"

#include <gtest/gtest.h>

#include <string>

#include "ir/parser.h"

namespace shardwise::analysis {
namespace {

BatchCoupling coupling(const std::string& body, const std::string& inputs = "%x: f32[b4,8], %y: i64[b4]") {
  const ir::Graph g = ir::parse_graph("graph(" + inputs + ") {\n" + body + "\n}");
  return batch_coupling(ops::OpTable::builtin(), g);
}

constexpr const char* kHead = R"(
  %fc.weight: f32[3,8] parameter
  %logits: f32[b4,3] = aten::linear(%x, %fc.weight) @fc
)";

TEST(BatchCouplingTest, AMeanLossCombinesAsTheMicroBatchesMean) {
  const auto c = coupling(std::string(kHead) + R"(
  %loss: f32[] = aten::cross_entropy_loss(%logits, %y) {reduction=1, ignore_index=-100}
  return (%loss))");
  EXPECT_EQ(c.batch, 4);
  EXPECT_FALSE(c.coupled()) << c.describe();
  EXPECT_EQ(c.loss, LossCombination::Mean);
}

TEST(BatchCouplingTest, ASumLossScaledAndCastStaysASum) {
  // torchtitan's loss: cross entropy with reduction "sum" in float32, divided by a count the
  // loop fixes (a constant here), cast back.
  const auto c = coupling(std::string(kHead) + R"(
  %as_f32: f32[b4,3] = aten::_to_copy(%logits) {dtype=6}
  %sum: f32[] = aten::cross_entropy_loss(%as_f32, %y) {reduction=2, ignore_index=-100}
  %scaled: f32[] = aten::div.Tensor(%sum) {other=512.0}
  %neg: f32[] = aten::neg(%scaled)
  %loss: f32[] = aten::mul.Tensor(%neg) {other=-1.0}
  return (%loss))");
  EXPECT_FALSE(c.coupled()) << c.describe();
  EXPECT_EQ(c.loss, LossCombination::Sum);
}

TEST(BatchCouplingTest, PerRowLossesSummedOverAFlattenedBatchAreASum) {
  // [b, s] losses flattened to [b s] (the batch is the major factor), then summed.
  const auto c = coupling(R"(
  %w: f32[5,8] parameter
  %logits: f32[b4,6,5] = aten::linear(%x, %w)
  %flat: f32[24,5] = aten::view(%logits) {size=[24,5]}
  %labels: i64[24] = aten::view(%y) {size=[24]}
  %per_token: f32[24] = aten::cross_entropy_loss(%flat, %labels) {reduction=0}
  %loss: f32[] = aten::sum(%per_token)
  return (%loss))",
                          "%x: f32[b4,6,8], %y: i64[b4,6]");
  EXPECT_FALSE(c.coupled()) << c.describe();
  EXPECT_EQ(c.loss, LossCombination::Sum);
}

TEST(BatchCouplingTest, TwoMeansAddedStayAMean) {
  const auto c = coupling(std::string(kHead) + R"(
  %ce: f32[] = aten::cross_entropy_loss(%logits, %y) {reduction=1}
  %sq: f32[b4,3] = aten::mul.Tensor(%logits, %logits)
  %aux: f32[] = aten::mean(%sq)
  %loss: f32[] = aten::add.Tensor(%ce, %aux) {alpha=0.01}
  return (%loss))");
  EXPECT_FALSE(c.coupled()) << c.describe();
  EXPECT_EQ(c.loss, LossCombination::Mean);
}

TEST(BatchCouplingTest, BatchNormInTrainingCouplesAndNamesItsModule) {
  const auto c = coupling(R"(
  %bn.weight: f32[8] parameter
  %bn.bias: f32[8] parameter
  %bn.running_mean: f32[8] buffer
  %bn.running_var: f32[8] buffer
  %bn.num_batches_tracked: i64[] buffer
  %add_: i64[] = aten::add_.Tensor(%bn.num_batches_tracked) {alpha=1, other=1} @bn
  %normed: f32[b4,8] = aten::batch_norm(%x, %bn.weight, %bn.bias, %bn.running_mean, %bn.running_var) {training=true, momentum=0.1, eps=1e-05, cudnn_enabled=false} @bn
  %fc.weight: f32[3,8] parameter
  %logits: f32[b4,3] = aten::linear(%normed, %fc.weight) @fc
  %loss: f32[] = aten::cross_entropy_loss(%logits, %y) {reduction=1}
  return (%loss))");
  ASSERT_EQ(c.sites.size(), 2u) << c.describe();
  EXPECT_EQ(c.sites[0].op, "aten::batch_norm");  // the statistics first,
  EXPECT_EQ(c.sites[0].module_path, "bn");
  EXPECT_EQ(c.sites[0].node, "normed");
  EXPECT_EQ(c.sites[1].op, "aten::add_.Tensor");  // then the counter, written once per micro-batch
  EXPECT_NE(c.describe().find("batch norm in training mode"), std::string::npos) << c.describe();
  // In eval mode the rows are independent.
  const auto eval = coupling(R"(
  %bn.weight: f32[8] parameter
  %bn.bias: f32[8] parameter
  %bn.running_mean: f32[8] buffer
  %bn.running_var: f32[8] buffer
  %normed: f32[b4,8] = aten::batch_norm(%x, %bn.weight, %bn.bias, %bn.running_mean, %bn.running_var) {training=false, momentum=0.1, eps=1e-05, cudnn_enabled=false} @bn
  %fc.weight: f32[3,8] parameter
  %logits: f32[b4,3] = aten::linear(%normed, %fc.weight) @fc
  %loss: f32[] = aten::cross_entropy_loss(%logits, %y) {reduction=1}
  return (%loss))");
  EXPECT_FALSE(eval.coupled()) << eval.describe();
}

TEST(BatchCouplingTest, ALoadBalancingLossMultipliesTwoMeansOverTheTokens) {
  // Switch / Mixtral: the fraction of tokens per expert times the mean router probability.
  const auto c = coupling(std::string(kHead) + R"(
  %ce: f32[] = aten::cross_entropy_loss(%logits, %y) {reduction=1}
  %probs: f32[b4,3] = aten::softmax.int(%logits) {dim=-1} @router
  %fraction: f32[3] = aten::mean.dim(%probs) {dim=[0]} @router
  %p: f32[3] = aten::mean.dim(%logits) {dim=[0]} @router
  %product: f32[3] = aten::mul.Tensor(%fraction, %p) @router
  %balance: f32[] = aten::sum(%product) @router
  %loss: f32[] = aten::add.Tensor(%ce, %balance) {alpha=0.02}
  return (%loss))");
  ASSERT_EQ(c.sites.size(), 1u) << c.describe();
  EXPECT_EQ(c.sites[0].op, "aten::mul.Tensor");
  EXPECT_EQ(c.sites[0].module_path, "router");
  EXPECT_NE(c.sites[0].reason.find("not linear in 'fraction'"), std::string::npos) << c.sites[0].reason;
}

TEST(BatchCouplingTest, CountsAddedIntoZerosStayASum) {
  // transformers' routers: tokens per expert counted with histc into a tensor of zeros.
  const auto c = coupling(R"(
  %zeros: f32[3] = aten::zeros() {size=[3]}
  %flat: f32[32] = aten::view(%x) {size=[32]}
  %counts: f32[3] = aten::histc(%flat) {bins=3, min=0, max=3}
  %total: f32[3] = aten::add.Tensor(%zeros, %counts)
  %loss: f32[] = aten::sum(%total)
  return (%loss))");
  EXPECT_FALSE(c.coupled()) << c.describe();
  EXPECT_EQ(c.loss, LossCombination::Sum);
}

TEST(BatchCouplingTest, AMeanOverTheMicroBatchsOwnCountCouples) {
  // sum over the mask / the mask's sum: the denominator is the micro-batch's own count.
  const auto c = coupling(std::string(kHead) + R"(
  %m: f32[b4,3] = aten::mul.Tensor(%logits, %mask)
  %num: f32[] = aten::sum(%m)
  %den: f32[] = aten::sum(%mask)
  %loss: f32[] = aten::div.Tensor(%num, %den)
  return (%loss))",
                          "%x: f32[b4,8], %mask: f32[b4,3]");
  ASSERT_EQ(c.sites.size(), 1u) << c.describe();
  EXPECT_EQ(c.sites[0].op, "aten::div.Tensor");
}

TEST(BatchCouplingTest, RowsMeetingAStatisticOfTheBatchCouple) {
  // x - mean(x, 0): each row sees the batch's mean.
  const auto c = coupling(R"(
  %mu: f32[8] = aten::mean.dim(%x) {dim=[0]}
  %centred: f32[b4,8] = aten::sub.Tensor(%x, %mu)
  %loss: f32[] = aten::sum(%centred)
  return (%loss))");
  ASSERT_EQ(c.sites.size(), 1u) << c.describe();
  EXPECT_EQ(c.sites[0].op, "aten::sub.Tensor");
  EXPECT_NE(c.sites[0].reason.find("per-row values"), std::string::npos);
}

TEST(BatchCouplingTest, ASumAddedToAMeanOrToAConstantCouples) {
  const auto mixed = coupling(std::string(kHead) + R"(
  %ce: f32[] = aten::cross_entropy_loss(%logits, %y) {reduction=2}
  %aux: f32[] = aten::mean(%logits)
  %loss: f32[] = aten::add.Tensor(%ce, %aux)
  return (%loss))");
  ASSERT_EQ(mixed.sites.size(), 1u);
  EXPECT_NE(mixed.sites[0].reason.find("a sum over the batch to a mean"), std::string::npos);
  const auto constant = coupling(std::string(kHead) + R"(
  %ce: f32[] = aten::cross_entropy_loss(%logits, %y) {reduction=2}
  %reg: f32[3,8] = aten::mul.Tensor(%fc.weight, %fc.weight)
  %l2: f32[] = aten::sum(%reg)
  %loss: f32[] = aten::add.Tensor(%ce, %l2)
  return (%loss))");
  ASSERT_EQ(constant.sites.size(), 1u);
  EXPECT_NE(constant.sites[0].reason.find("m times"), std::string::npos);
}

TEST(BatchCouplingTest, AMaxOverTheBatchAndAnUnknownOpCouple) {
  const auto max = coupling(R"(
  %top: f32[8] = aten::amax(%x) {dim=[0]}
  %loss: f32[] = aten::sum(%top)
  return (%loss))");
  ASSERT_EQ(max.sites.size(), 1u);
  EXPECT_NE(max.sites[0].reason.find("max over the batch"), std::string::npos) << max.sites[0].reason;
  const auto unknown = coupling(R"(
  %h: f32[b4,8] = mylib::mix(%x) @mixer
  %loss: f32[] = aten::sum(%h)
  return (%loss))");
  ASSERT_EQ(unknown.sites.size(), 1u);
  EXPECT_EQ(unknown.sites[0].module_path, "mixer");
}

TEST(BatchCouplingTest, AnOperandReadForItsDtypeAloneIsNotCoupling) {
  // Gemma's RMSNorm: the result cast back to the input's dtype with type_as(x).
  const auto c = coupling(R"(
  %sq: f32[b4,8] = aten::mul.Tensor(%x, %x) @norm
  %cast: f32[b4,8] = aten::type_as(%sq, %x) @norm
  %loss: f32[] = aten::mean(%cast)
  return (%loss))");
  EXPECT_FALSE(c.coupled()) << c.describe();
  EXPECT_EQ(c.loss, LossCombination::Mean);
}

TEST(BatchCouplingTest, APaddingMaskReadAtTheRowsOwnPositionsIsTheRows) {
  // transformers' masks: padding_mask[arange(b)[:, None, None, None], kv_positions].
  const auto c = coupling(R"(
  %rows: i64[4] = aten::arange() {end=4}
  %r1: i64[4,1] = aten::unsqueeze(%rows) {dim=1}
  %r2: i64[4,1,1] = aten::unsqueeze(%r1) {dim=2}
  %kv: i64[6] = aten::arange() {end=6}
  %k1: i64[1,1,6] = aten::view(%kv) {size=[1,1,6]}
  %picked: bool[4,1,6] = aten::index.Tensor(%mask, %r2, %k1) {indices_present=[1,1]}
  %f: f32[4,1,6] = aten::_to_copy(%picked) {dtype=6}
  %loss: f32[] = aten::mean(%f)
  return (%loss))",
                          "%mask: bool[b4,6]");
  EXPECT_FALSE(c.coupled()) << c.describe();
  // An arange as long as the batch used as values is a constant (a sequence's positions, as
  // T5's relative position buckets at a decoder length equal to the batch): it stays so.
  const auto values = coupling(R"(
  %pos: i64[4] = aten::arange() {end=4}
  %q: i64[4,1] = aten::unsqueeze(%pos) {dim=1}
  %k: i64[1,4] = aten::unsqueeze(%pos) {dim=0}
  %relative: i64[4,4] = aten::sub.Tensor(%k, %q)
  %bias: f32[4,4] = aten::_to_copy(%relative) {dtype=6}
  %h: f32[b4,4,4] = aten::add.Tensor(%x, %bias)
  %loss: f32[] = aten::sum(%h)
  return (%loss))",
                          "%x: f32[b4,4,4]");
  EXPECT_FALSE(values.coupled()) << values.describe();
  EXPECT_EQ(values.loss, LossCombination::Sum);
}

TEST(BatchCouplingTest, ABatchOfOneRowIsNotFollowed) {
  const auto c = coupling(R"(
  %top: f32[8] = aten::amax(%x) {dim=[0]}
  return (%top))",
                          "%x: f32[b1,8]");
  EXPECT_EQ(c.batch, 1);
  EXPECT_FALSE(c.coupled());
}

}  // namespace
}  // namespace shardwise::analysis
