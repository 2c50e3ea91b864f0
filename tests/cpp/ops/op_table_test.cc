#include "ops/op_table.h"

#include <gtest/gtest.h>

#include "ops/rule_templates.h"
#include "support/error.h"

namespace shardwise::ops {
namespace {

TEST(OpTableTest, AddValidatesAndNamesTheOp) {
  OpTable table;
  table.add("aten::mm", "mk,kn->mn", {FlopsKind::Contraction});
  EXPECT_EQ(table.find("aten::mm")->rule_text, "mk,kn->mn");
  EXPECT_TRUE(std::holds_alternative<EinsumPattern>(table.find("aten::mm")->rule));

  auto expect_error = [&](std::string name, std::string_view rule) {
    try {
      table.add(name, rule, {});
      FAIL() << "expected a ValidationError for " << rule;
    } catch (const support::ValidationError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  expect_error("aten::bad_pattern", "mk,kn->mq2");
  expect_error("aten::bad_template", "no_such_template(dim)");
  expect_error("aten::too_many_args", "transpose(dim0, dim1, dim2)");
  expect_error("aten::unbound_param", "transpose(dim0)");  // dim1 has no default
  expect_error("aten::mm", "mk,kn->mn");                   // registered twice
  EXPECT_EQ(table.specs().size(), 1u);                     // failed adds leave nothing behind
}

TEST(OpTableTest, FindFallsBackToTheBaseName) {
  OpTable table;
  table.add("aten::softmax.int", "whole(dim)", {FlopsKind::PerInputElement, 5});
  table.add("aten::split.Tensor", "split(split_size, dim=0)", {});
  table.add("aten::split_with_sizes", "split_sizes(split_sizes, dim=0)", {});
  table.add("aten::add", "elementwise()", {});
  EXPECT_EQ(table.find("aten::softmax")->name, "aten::softmax.int");          // TorchScript spelling
  EXPECT_EQ(table.find("aten::softmax.Dimname")->name, "aten::softmax.int");  // another overload
  EXPECT_EQ(table.find("aten::split")->name, "aten::split.Tensor");
  EXPECT_EQ(table.find("aten::add.Tensor")->name, "aten::add");  // base name registered
  EXPECT_EQ(table.find("aten::split_with_sizes")->name, "aten::split_with_sizes");
  EXPECT_EQ(table.find("aten::nonexistent"), nullptr);
  EXPECT_EQ(op_base_name("aten::add.Tensor"), "aten::add");
  EXPECT_EQ(op_base_name("aten::mm"), "aten::mm");
  EXPECT_EQ(op_base_name("prims::convert_element_type.default"), "prims::convert_element_type");
}

TEST(OpTableTest, BuiltinCoversWhatTorchExportEmitsForCommonModels) {
  const auto& table = OpTable::builtin();
  // GPT-2 / BERT / LLaMA from transformers and a CNN with cross-entropy, through torch.export.
  for (std::string_view op : {
           "aten::__and__.Tensor",
           "aten::_assert_tensor_metadata",
           "aten::add.Tensor",
           "aten::add_.Tensor",
           "aten::addmm",
           "aten::alias",
           "aten::arange",
           "aten::arange.start",
           "aten::arange.start_step",
           "aten::cat",
           "aten::contiguous",
           "aten::cross_entropy_loss",
           "aten::cumsum",
           "aten::diff",
           "aten::dropout",
           "aten::embedding",
           "aten::eq.Tensor",
           "aten::eq.Scalar",
           "aten::expand",
           "aten::gather",
           "aten::ge.Scalar",
           "aten::gelu",
           "aten::index.Tensor",
           "aten::layer_norm",
           "aten::le.Tensor",
           "aten::linear",
           "aten::mean.dim",
           "aten::mul.Tensor",
           "aten::ne.Scalar",
           "aten::neg",
           "aten::new_ones",
           "aten::pad",
           "aten::pow.Tensor_Scalar",
           "aten::reshape",
           "aten::rsqrt",
           "aten::scaled_dot_product_attention",
           "aten::silu",
           "aten::slice.Tensor",
           "aten::split.Tensor",
           "aten::sub.Tensor",
           "aten::tanh",
           "aten::to.dtype",
           "aten::to.dtype_layout",
           "aten::transpose.int",
           "aten::unsqueeze",
           "aten::view",
           "aten::conv2d",
           "aten::batch_norm",
           "aten::relu",
           "aten::max_pool2d",
           "aten::avg_pool2d",
           "aten::adaptive_avg_pool2d",
           "aten::flatten.using_ints",
           // common ones
           "aten::mm",
           "aten::bmm",
           "aten::matmul",
           "aten::baddbmm",
           "aten::softmax.int",
           "aten::_softmax",
           "aten::log_softmax.int",
           "aten::nll_loss",
           "aten::sum.dim_IntList",
           "aten::sum",
           "aten::mean",
           "aten::var.correction",
           "aten::amax",
           "aten::max.dim",
           "aten::exp",
           "aten::log",
           "aten::sqrt",
           "aten::div.Tensor",
           "aten::sigmoid",
           "aten::masked_fill.Scalar",
           "aten::where.self",
           "aten::triu",
           "aten::tril",
           "aten::full",
           "aten::zeros",
           "aten::ones",
           "aten::clone",
           "aten::detach",
           "aten::permute",
           "aten::t",
           "aten::squeeze.dim",
           "aten::select.int",
           "aten::chunk",
           "aten::split_with_sizes",
           "aten::stack",
           "aten::index_select",
           "aten::repeat_interleave.self_int",
           "aten::relu_",
           "aten::sin",
           "aten::cos",
           "aten::abs",
           "aten::clamp",
           "aten::type_as",
           "aten::ones_like",
           "aten::zeros_like",
           "aten::full_like",
           "aten::lt.Tensor",
           "aten::gt.Scalar",
           "aten::logical_not",
           "aten::_to_copy",
           "aten::_unsafe_view",
           // TorchScript spellings
           "aten::softmax",
           "aten::to",
           "aten::split",
           "aten::select",
           "aten::slice",
           "aten::transpose",
           "aten::flatten",
           "aten::max_pool2d",
           "aten::masked_fill",
           "aten::where",
           "aten::add",
       }) {
    EXPECT_NE(table.find(op), nullptr) << op;
  }
  // Folded by the importers, so deliberately absent.
  EXPECT_EQ(table.find("aten::size"), nullptr);
  EXPECT_EQ(table.find("aten::Int"), nullptr);
}

TEST(OpTableTest, BuiltinFlopsKinds) {
  const auto& table = OpTable::builtin();
  EXPECT_EQ(table.find("aten::addmm")->flops.kind, FlopsKind::Contraction);
  EXPECT_EQ(table.find("aten::conv2d")->flops.kind, FlopsKind::Convolution);
  EXPECT_EQ(table.find("aten::scaled_dot_product_attention")->flops.kind, FlopsKind::Attention);
  EXPECT_EQ(table.find("aten::gelu")->flops, (FlopsCost{FlopsKind::PerOutputElement, 1}));
  EXPECT_EQ(table.find("aten::softmax.int")->flops, (FlopsCost{FlopsKind::PerInputElement, 5}));
  EXPECT_EQ(table.find("aten::view")->flops.kind, FlopsKind::Zero);
  EXPECT_EQ(flops_kind_name(FlopsKind::Contraction), "contraction");
}

TEST(OpTableTest, EveryInPlaceOpHasItsFunctionalFormToo) {
  // Capture turns a write into an intermediate tensor (aten::fill_, aten::add_, ...) into its
  // functional form (python/shardwise/_functionalize.py): that op must have a rule as well.
  const auto& table = OpTable::builtin();
  for (const OpSpec& spec : table.specs()) {
    const std::string_view name(spec.name);
    const auto dot = name.find('.');
    const std::string_view base = name.substr(0, dot);
    if (base.size() < 2 || base.back() != '_' || base.ends_with("__")) continue;
    std::string functional(base.substr(0, base.size() - 1));
    if (dot != std::string_view::npos) functional += name.substr(dot);
    EXPECT_NE(table.find(functional), nullptr) << spec.name << " has no " << functional;
  }
}

TEST(OpTableTest, EveryTemplateIsListed) {
  const auto& templates = rule_templates();
  auto has = [&](std::string_view name) {
    return std::any_of(templates.begin(), templates.end(), [&](const RuleTemplateInfo& t) { return t.name == name; });
  };
  for (std::string_view name :
       {"elementwise",   "reduce_sum", "whole",  "transpose", "permute", "reshape",   "flatten",
        "slice",         "cat",        "split",  "conv",      "window",  "norm_last", "attention",
        "cross_entropy", "create",     "arange", "matmul",    "einsum",  "index", "embedding"}) {
    EXPECT_TRUE(has(name)) << name;
  }
}

}  // namespace
}  // namespace shardwise::ops

namespace shardwise::ops {
namespace {

TEST(OpTableTest, LinearOpsAreDataMovementOnly) {
  const OpTable& table = OpTable::builtin();
  for (std::string_view op : {"aten::view", "aten::reshape", "aten::transpose.int", "aten::permute", "aten::cat",
                              "aten::split.Tensor", "aten::_to_copy", "aten::contiguous"})
    EXPECT_TRUE(table.find(op)->linear) << op;
  // Pointwise maths, value picks, fills and contractions are not linear in the sense the
  // search needs (a Partial input would give a wrong output).
  for (std::string_view op : {"aten::gelu", "aten::add.Tensor", "aten::mul.Tensor", "aten::topk", "aten::fill_.Scalar",
                              "aten::constant_pad_nd", "aten::mm", "aten::embedding", "aten::index_put"})
    EXPECT_FALSE(table.find(op)->linear) << op;
  EXPECT_FALSE(OpSpec{}.linear);
}

}  // namespace
}  // namespace shardwise::ops
