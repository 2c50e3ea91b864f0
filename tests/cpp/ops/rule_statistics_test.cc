// ops::Index::statistics: which Whole indices a normalisation may still split, and how many
// per-row statistics it then combines across ranks.
#include <gtest/gtest.h>

#include <stdexcept>

#include "one_node_graph.h"
#include "ops/node_rule.h"
#include "ops/op_table.h"
#include "ops/rule_templates.h"
#include "support/error.h"

namespace shardwise::ops {
namespace {

using testing::f32;
using testing::i64;
using testing::one_node;
using Ints = std::vector<std::int64_t>;

DimRule rule_of(std::string op, std::vector<ir::TensorType> inputs, std::vector<ir::TensorType> outputs,
                ir::Attributes attrs = {}) {
  const auto g = one_node(std::move(op), std::move(inputs), std::move(outputs), std::move(attrs));
  auto rule = dim_rule_for(OpTable::builtin(), g.graph, g.node());
  if (!rule) throw std::runtime_error("no rule for " + g.node().op);
  return *rule;
}

const Index& index_of(const DimRule& rule, std::string_view label) {
  const int id = rule.find(label);
  if (id < 0) throw std::runtime_error("no index " + std::string(label) + " in " + rule.str());
  return rule.indices[static_cast<std::size_t>(id)];
}

TEST(RuleStatisticsTest, SoftmaxDimCarriesMaxAndSum) {
  for (std::string op : {"aten::softmax.int", "aten::_softmax", "aten::log_softmax.int", "aten::_log_softmax"}) {
    const auto rule = rule_of(op, {f32({2, 12, 16, 16})}, {f32({2, 12, 16, 16})}, {{"dim", std::int64_t{-1}}});
    // The text form is unchanged: statistics are not part of str().
    EXPECT_EQ(rule.str(), "d0 d1 d2 W0 -> d0 d1 d2 W0  [d0=2, d1=12, d2=16, W0=16 whole]") << op;
    EXPECT_EQ(index_of(rule, "W0").statistics, 2) << op;
    for (std::string_view spatial : {"d0", "d1", "d2"}) EXPECT_EQ(index_of(rule, spatial).statistics, 0) << op;
  }
}

TEST(RuleStatisticsTest, OtherUsersOfTheWholeTemplateKeepZero) {
  const auto cumsum = rule_of("aten::cumsum", {i64({2, 16})}, {i64({2, 16})}, {{"dim", std::int64_t{-1}}});
  EXPECT_EQ(cumsum.str(), "d0 W0 -> d0 W0  [d0=2, W0=16 whole]");
  EXPECT_EQ(index_of(cumsum, "W0").statistics, 0);
  const auto sort = rule_of("aten::sort", {f32({2, 16})}, {f32({2, 16}), i64({2, 16})});
  EXPECT_EQ(index_of(sort, "W0").statistics, 0);
  const auto triu = rule_of("aten::triu", {f32({4, 16, 16})}, {f32({4, 16, 16})});
  EXPECT_EQ(index_of(triu, "W0").statistics, 0);
  EXPECT_EQ(index_of(triu, "W1").statistics, 0);
  const auto topk = rule_of("aten::topk", {f32({2, 16})}, {f32({2, 4}), i64({2, 4})});
  for (const auto& index : topk.indices) EXPECT_EQ(index.statistics, 0) << index.label;
}

TEST(RuleStatisticsTest, LayerNormCarriesMeanAndVariance) {
  const auto rule = rule_of("aten::layer_norm", {f32({2, 16, 768}), f32({768}), f32({768})}, {f32({2, 16, 768})},
                            {{"normalized_shape", Ints{768}}});
  EXPECT_EQ(rule.str(), "d0 d1 W0, W0, W0 -> d0 d1 W0  [d0=2, d1=16, W0=768 whole]");
  EXPECT_EQ(index_of(rule, "W0").statistics, 2);
  EXPECT_EQ(index_of(rule, "d0").statistics, 0);

  const auto native = rule_of("aten::native_layer_norm", {f32({2, 8, 4}), f32({8, 4})},
                              {f32({2, 8, 4}), f32({2, 1, 1}), f32({2, 1, 1})}, {{"normalized_shape", Ints{8, 4}}});
  EXPECT_EQ(index_of(native, "W0").statistics, 2);
  EXPECT_EQ(index_of(native, "W1").statistics, 2);

  const auto rms = rule_of("aten::rms_norm", {f32({2, 16, 768}), f32({768})}, {f32({2, 16, 768})},
                           {{"normalized_shape", Ints{768}}});
  EXPECT_EQ(index_of(rms, "W0").statistics, 1);
}

TEST(RuleStatisticsTest, BatchAndGroupNormKeepZero) {
  const auto batch = rule_of("aten::batch_norm", {f32({4, 8, 5, 5}), f32({8}), f32({8})}, {f32({4, 8, 5, 5})});
  for (const auto& index : batch.indices) EXPECT_EQ(index.statistics, 0) << index.label;
  const auto group = rule_of("aten::group_norm", {f32({4, 8, 5, 5}), f32({8}), f32({8})}, {f32({4, 8, 5, 5})});
  for (const auto& index : group.indices) EXPECT_EQ(index.statistics, 0) << index.label;
}

TEST(RuleStatisticsTest, TrainingBatchNormCombinesMeanAndVarianceOverTheBatch) {
  const auto batch = rule_of("aten::batch_norm", {f32({4, 8, 5, 5}), f32({8}), f32({8})}, {f32({4, 8, 5, 5})},
                             {{"training", true}});
  EXPECT_EQ(index_of(batch, "W0").size, 4);
  EXPECT_EQ(index_of(batch, "W0").statistics, 2);
  EXPECT_EQ(index_of(batch, "d0").statistics, 0);  // channels: split freely
}

TEST(RuleStatisticsTest, CrossEntropyClassesCarryThree) {
  const auto rule = rule_of("aten::cross_entropy_loss", {f32({32, 1000}), i64({32})}, {f32({})});
  EXPECT_EQ(rule.str(), "n C, n -> ()  [n=32 reduced(mean), C=1000 whole]");
  EXPECT_EQ(index_of(rule, "C").statistics, 3);
  EXPECT_EQ(index_of(rule, "n").statistics, 0);

  for (std::string op : {"aten::nll_loss", "aten::nll_loss_nd", "aten::nll_loss2d"}) {
    const auto nll = rule_of(op, {f32({32, 1000}), i64({32})}, {f32({})});
    EXPECT_EQ(index_of(nll, "C").statistics, 1) << op;
  }
  // Other losses have no Whole index to carry statistics.
  const auto mse = rule_of("aten::mse_loss", {f32({4, 3}), f32({4, 3})}, {f32({})});
  for (const auto& index : mse.indices) EXPECT_EQ(index.statistics, 0) << index.label;
}

TEST(RuleTemplateStatisticsTest, ParameterIsListedAndChecked) {
  auto params_of = [](std::string_view name) {
    for (const auto& t : rule_templates()) {
      if (t.name == name) return t.params;
    }
    throw std::runtime_error("no template " + std::string(name));
  };
  for (std::string_view name : {"whole", "norm_last", "cross_entropy"}) {
    const auto params = params_of(name);
    ASSERT_EQ(params.size(), 2u) << name;
    EXPECT_EQ(params[1].name, "statistics") << name;
    EXPECT_EQ(params[1].default_value, ir::AttrValue{std::int64_t{0}}) << name;
  }

  OpTable table;
  table.add("aten::softmax.int", "whole(dim, -1)", {FlopsKind::PerInputElement, 5});
  const auto g = one_node("aten::softmax.int", {f32({2, 16})}, {f32({2, 16})}, {{"dim", std::int64_t{-1}}});
  try {
    dim_rule_for(table, g.graph, g.node());
    FAIL() << "expected a ValidationError for negative statistics";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("statistics"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::ops
