// The text form of an op's dimension rule, as written in the op table, and its parser.
//
// A rule is either an einsum-like *pattern* or a *template call*.
//
// Patterns: "inputs->outputs", operands separated by ',', each operand one term per
// tensor dimension:
//   a..z     an index; Spatial if some output carries it, else Reduced (summed over)
//   A..Z     an index that is Whole: the op needs it entire (must not be split)
//   (hd)     one dimension that factorises into several indices, major to minor
//   ...      any number of dimensions (at most one per operand), broadcast as in numpy:
//            right-aligned across operands, a size-1 input dim broadcasts
//   ()       the whole operand is a rank-0 tensor ("k,k->()" is a dot product)
// and operand markers:
//   +x       (prefix) the operand is a term added to the sum over the reduced indices (a
//            bias), not a factor of every term: under a split of a reduced index it lacks, it
//            enters the partial sums once; every unmarked operand is a factor, as in einsum
//   ~x       (prefix, after any '+') the operand broadcasts against the others: it may lack
//            leading dims and a size-1 dim ties to no index ("~mn" accepts [n], [1,n], [m,n])
//   x?       (suffix) an optional operand, absent when the node omits it; optional
//            operands come last and are matched in order
//   _        an operand read for metadata only (dtype, device, shape), any rank
// An empty side means no operands: "_->" is an op with no outputs, "->ij" creates.
//
// Worked examples:
//   "mk,kn->mn"           aten::mm:     m, n spatial; k reduced (split k: Partial(sum))
//   "+~mn,mk,kn->mn"      aten::addmm:  bias added, broadcast against the product
//   "...k,nk,+n?->...n"   aten::linear: any leading dims, optional bias
//   "Ve,...->...e"        aten::embedding: vocabulary Whole, ids of any rank
//   "...,_?->..."         aten::to.*:   the optional second tensor only gives a dtype
//
// Template calls: "name(arg, arg, ...)" where each arg binds one template parameter,
// positionally, to one of:
//   attr          the node attribute of that schema name ("dim", "normalized_shape")
//   attr=literal  that attribute, or the literal when the node lacks it (schema default)
//   literal       a fixed value: integer, true, false, none, or [int,...]
// Trailing parameters may be left out; the template's own defaults apply. For example
//   "reduce_sum(dim, keepdim=false)"   aten::sum.dim_IntList
//   "transpose(0, 1)"                  aten::t
// rule_templates.h lists the templates and their parameters.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ir/attribute.h"

namespace shardwise::ops {

// One tensor dimension in a pattern: one or more index letters (major to minor), or the
// ellipsis.
struct PatternDim {
  std::string letters;  // empty for the ellipsis
  bool ellipsis = false;

  friend bool operator==(const PatternDim&, const PatternDim&) = default;
};

struct PatternOperand {
  std::vector<PatternDim> dims;
  bool added = false;      // '+'
  bool broadcast = false;  // '~'
  bool optional = false;   // '?'
  bool metadata = false;   // '_'

  bool has_ellipsis() const;
  friend bool operator==(const PatternOperand&, const PatternOperand&) = default;
};

struct EinsumPattern {
  std::vector<PatternOperand> inputs;
  std::vector<PatternOperand> outputs;

  friend bool operator==(const EinsumPattern&, const EinsumPattern&) = default;
};

struct TemplateArg {
  std::string attr;                      // empty: the literal alone
  std::optional<ir::AttrValue> literal;  // fallback, or the fixed value

  friend bool operator==(const TemplateArg&, const TemplateArg&) = default;
};

struct TemplateCall {
  std::string name;
  std::vector<TemplateArg> args;

  friend bool operator==(const TemplateCall&, const TemplateCall&) = default;
};

using RuleText = std::variant<EinsumPattern, TemplateCall>;

// Parses and checks one rule. Throws support::ValidationError naming the problem and its
// position: a bad character, two ellipses in one operand, a letter used twice in one
// operand, a letter used in both cases, a required operand after an optional one, a marker
// on an output, or a factor whose size nothing determines. Template names and arities are
// checked by the op table (see rule_templates.h), not here.
RuleText parse_rule_text(std::string_view text);

// Parses a numpy/torch einsum equation ("bhqd,bhkd->bhqk", "ij,jk", "i,i->") into a
// pattern: an implicit output becomes the letters used once, sorted; an empty output is a
// rank-0 tensor. Letters keep their case, so an uppercase letter is Whole.
EinsumPattern parse_einsum_equation(std::string_view equation);

}  // namespace shardwise::ops
