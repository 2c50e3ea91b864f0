// The op table: for each op, its dimension rule (as text, see rule_text.h) and how to
// count its FLOPs. Data, not code: the builtin table is one static array (op_table_builtin.cc)
// and OpTable::add validates every entry as it goes in, so a bad rule fails at once with
// the op's name, not later on some node.
//
// Op names follow the IR: "aten::<name>" plus ".<overload>" unless the overload is
// "default" ("aten::mm", "aten::add.Tensor", "aten::softmax.int"). find() tries the full
// name, then the name without its overload, then any op registered under the same base
// name (the first registered wins), so TorchScript's "aten::softmax" finds
// "aten::softmax.int".
//
// Worked example:
//   OpTable table;
//   table.add("aten::mm", "mk,kn->mn", {FlopsKind::Contraction});
//   table.add("aten::softmax.int", "whole(dim)", {FlopsKind::PerInputElement, 5});
//   table.find("aten::softmax")->rule_text    // "whole(dim)"
//   table.add("aten::bad", "mk,kn->mq2", {})  // throws ValidationError naming aten::bad
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ops/rule_text.h"

namespace shardwise::ops {

// How analysis/flops.h counts an op's forward FLOPs (multiply-add = 2).
enum class FlopsKind : std::uint8_t {
  Zero,              // data movement, views, creation, metadata
  PerOutputElement,  // pointwise: per_element x elements of output 0
  PerInputElement,   // reductions, normalisations, pooling, losses: per_element x elements of input 0
  Contraction,       // 2 x product of every index size of the rule (+ output elements for an
                     // additive operand such as a bias)
  Convolution,       // 2 x output elements x (weight elements / output channels)
  Attention,         // 2*B*s*t*(d + e) for the two products + per_element x B*s*t (softmax)
  Experts,           // a mixture of experts' routed products: 2*T*K*(N*H + H*I) + per_element x T*K*I
};
std::string_view flops_kind_name(FlopsKind kind);

struct FlopsCost {
  FlopsKind kind = FlopsKind::Zero;
  int per_element = 1;  // for PerOutputElement, PerInputElement and Attention's softmax

  friend bool operator==(const FlopsCost&, const FlopsCost&) = default;
};

struct OpSpec {
  std::string name;       // "aten::addmm"
  std::string rule_text;  // "~mn,mk,kn->mn"
  RuleText rule;          // parsed and checked by OpTable::add
  FlopsCost flops;
  // The op is linear in its tensor input(s): f(a + b) = f(a) + f(b), so it may run on
  // Partial(sum) operands and give Partial(sum) outputs without reducing first (a view of
  // a row-parallel product's partial sums, a concatenation of partial sums). Data movement
  // only: views, transposes, copies and casts, slices, cats and splits.
  bool linear = false;
  // The rule looks rows up by another operand's values (ops::Index::lookup; set from the
  // rule template): the backward writes a dense gradient the size of input 0.
  bool lookup = false;
  // How the op treats operands that are sums of parts (a loss summed or averaged over the
  // micro-batches of a batch: analysis/batch_coupling.h). `additive`: jointly linear in every
  // tensor input, f(a + a', b + b') = f(a, b) + f(a', b') (the `linear` ops, add, sub).
  // `linear_in`: bit k set when the op is linear in tensor input k while the others stay
  // fixed (a product in either factor, a quotient in its numerator, a sum or a mean).
  bool additive = false;
  std::uint32_t linear_in = 0;
  // The op's output is all zeros whatever its operands hold (zeros, zeros_like, new_zeros):
  // adding it to a sum over the batch leaves a sum (transformers' routers count tokens per
  // expert into a tensor of zeros).
  bool zeros = false;
};

// OpTable::add's optional facts about an op beyond its rule and FLOPs.
struct OpTraits {
  bool linear = false;          // OpSpec::linear (implies additive)
  bool additive = false;        // OpSpec::additive
  std::uint32_t linear_in = 0;  // OpSpec::linear_in
  bool zeros = false;           // OpSpec::zeros
};

class OpTable {
 public:
  // The ops torch.export and TorchScript emit for common models (transformers, CNNs), built
  // once from a static array on first use.
  static const OpTable& builtin();

  // Parses and checks `rule_text`. Throws support::ValidationError naming the op on a bad
  // rule, an unknown template, or a name already in the table.
  void add(std::string name, std::string_view rule_text, FlopsCost flops = {}, OpTraits traits = {});

  // Full name, then base name (overload stripped), then any overload of the same base.
  // Null when none.
  const OpSpec* find(std::string_view op) const;

  const std::vector<OpSpec>& specs() const { return specs_; }

 private:
  std::vector<OpSpec> specs_;
  std::unordered_map<std::string, std::size_t> by_name_;
  std::unordered_map<std::string, std::size_t> by_base_;  // first spec of each base name
};

// "aten::add.Tensor" -> "aten::add"; a name with no overload is its own base.
std::string_view op_base_name(std::string_view op);

}  // namespace shardwise::ops
