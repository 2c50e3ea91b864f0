#include "ops/rule_text.h"

#include <gtest/gtest.h>

#include "support/error.h"

namespace shardwise::ops {
namespace {

EinsumPattern pattern(std::string_view text) { return std::get<EinsumPattern>(parse_rule_text(text)); }

std::string letters(const PatternOperand& operand) {
  std::string out;
  for (const auto& dim : operand.dims)
    out += dim.ellipsis ? "..." : (dim.letters.size() > 1 ? "(" + dim.letters + ")" : dim.letters);
  return out;
}

TEST(RuleTextTest, ParsesAMatmulPattern) {
  auto p = pattern("mk,kn->mn");
  ASSERT_EQ(p.inputs.size(), 2u);
  ASSERT_EQ(p.outputs.size(), 1u);
  EXPECT_EQ(letters(p.inputs[0]), "mk");
  EXPECT_EQ(letters(p.inputs[1]), "kn");
  EXPECT_EQ(letters(p.outputs[0]), "mn");
  EXPECT_FALSE(p.inputs[0].broadcast || p.inputs[0].optional || p.inputs[0].metadata);
}

TEST(RuleTextTest, ParsesMarkersEllipsisGroupsAndScalars) {
  auto linear = pattern("...k, nk, n? -> ...n");  // spaces are ignored
  EXPECT_TRUE(linear.inputs[0].has_ellipsis());
  EXPECT_TRUE(linear.inputs[2].optional);
  EXPECT_EQ(letters(linear.outputs[0]), "...n");

  auto addmm = pattern("+~mn,mk,kn->mn");
  EXPECT_TRUE(addmm.inputs[0].broadcast);
  EXPECT_TRUE(addmm.inputs[0].added);
  EXPECT_FALSE(addmm.inputs[1].added);
  auto biased = pattern("...k,nk,+n?->...n");
  EXPECT_TRUE(biased.inputs[2].added && biased.inputs[2].optional);
  EXPECT_FALSE(linear.inputs[2].added);  // unmarked: a factor, as in einsum

  auto heads = pattern("bs(hd)->bshd");
  EXPECT_EQ(letters(heads.inputs[0]), "bs(hd)");

  auto dot = pattern("k,k->()");
  ASSERT_EQ(dot.outputs.size(), 1u);
  EXPECT_TRUE(dot.outputs[0].dims.empty());

  auto cast = pattern("...,_?->...");
  EXPECT_TRUE(cast.inputs[1].metadata);
  EXPECT_TRUE(cast.inputs[1].optional);

  EXPECT_TRUE(pattern("_->").outputs.empty());  // an op with no outputs
  EXPECT_TRUE(pattern("->").inputs.empty());
  EXPECT_EQ(pattern("->ij").outputs.size(), 1u);  // creation
}

TEST(RuleTextTest, ParsesTemplateCalls) {
  auto call = std::get<TemplateCall>(parse_rule_text("slice(dim=0, start, end, step=1)"));
  EXPECT_EQ(call.name, "slice");
  ASSERT_EQ(call.args.size(), 4u);
  EXPECT_EQ(call.args[0].attr, "dim");
  EXPECT_EQ(call.args[0].literal, ir::AttrValue{std::int64_t{0}});
  EXPECT_EQ(call.args[1].attr, "start");
  EXPECT_FALSE(call.args[1].literal);

  auto t = std::get<TemplateCall>(parse_rule_text("transpose(0, -1)"));
  EXPECT_TRUE(t.args[0].attr.empty());
  EXPECT_EQ(t.args[1].literal, ir::AttrValue{std::int64_t{-1}});

  auto triu = std::get<TemplateCall>(parse_rule_text("whole([-2,-1])"));
  EXPECT_EQ(triu.args[0].literal, (ir::AttrValue{std::vector<std::int64_t>{-2, -1}}));

  auto reduce = std::get<TemplateCall>(parse_rule_text("reduce_max(dim=[], keepdim=false)"));
  EXPECT_EQ(reduce.args[0].literal, ir::AttrValue{std::vector<std::int64_t>{}});
  EXPECT_EQ(reduce.args[1].literal, ir::AttrValue{false});

  EXPECT_TRUE(std::get<TemplateCall>(parse_rule_text("elementwise()")).args.empty());
  EXPECT_EQ(std::get<TemplateCall>(parse_rule_text("create(size=none)")).args[0].literal,
            ir::AttrValue{ir::NoneAttr{}});
}

TEST(RuleTextTest, RejectsMalformedRules) {
  for (std::string_view bad : {
           "mk,kn",         // no arrow, not a call
           "mk,k2->m",      // digit
           "m...k...->m",   // two ellipses in one operand
           "mm->m",         // a letter twice in one operand
           "kK->k",         // one letter in both cases
           "a?,b->ab",      // required after optional
           "ab->~ab",       // marker on an output
           "ab->a?b",       // marker on an output
           "(h)d->hd",      // one-letter group
           "(hd)->(hd)",    // nothing sizes h or d
           "a,,b->ab",      // empty operand
           "a->b->c",       // two arrows
           "m.k->m",        // a lone dot
           "(ab->ab",       // unclosed group
           "~_->",          // a metadata operand does not broadcast
           "+_,ab->ab",     // nor is it a term of a sum
           "ab->+ab",       // marker on an output
           "slice(dim=",    // unclosed call
           "slice(1x)",     // neither name nor literal
           "slice(dim=x)",  // fallback is not a literal
       }) {
    EXPECT_THROW(parse_rule_text(bad), support::ValidationError) << bad;
  }
}

TEST(RuleTextTest, ErrorsSayWhereAndWhat) {
  try {
    parse_rule_text("mk,kN->mn?");
    FAIL() << "expected a ValidationError";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("mk,kN->mn?"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("column"), std::string::npos) << e.what();
  }
}

TEST(RuleTextTest, GroupFactorsSizedByAnotherOperand) {
  // h is sized by the output, so d can be the dim divided by h.
  EXPECT_NO_THROW(parse_rule_text("bs(hd)->bsh"));
  EXPECT_NO_THROW(parse_rule_text("(hd),d->h"));
}

TEST(RuleTextTest, ParsesEinsumEquations) {
  auto explicit_out = parse_einsum_equation("bhqd,bhkd->bhqk");
  EXPECT_EQ(letters(explicit_out.outputs[0]), "bhqk");
  auto implicit = parse_einsum_equation("ij,jk");
  EXPECT_EQ(letters(implicit.outputs[0]), "ik");
  auto scalar = parse_einsum_equation("i,i->");
  EXPECT_TRUE(scalar.outputs[0].dims.empty());
  auto batched = parse_einsum_equation("...ij,...jk->...ik");
  EXPECT_TRUE(batched.outputs[0].has_ellipsis());
  // 'a' and 'A' are two labels in torch: the uppercase one moves to a free uppercase letter.
  auto mixed = parse_einsum_equation("aA->Aa");
  EXPECT_EQ(letters(mixed.inputs[0])[0], 'a');
  EXPECT_NE(letters(mixed.inputs[0])[1], 'A');
}

}  // namespace
}  // namespace shardwise::ops
