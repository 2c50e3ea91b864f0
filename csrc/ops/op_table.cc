#include "ops/op_table.h"

#include <fmt/format.h>

#include <array>

#include "ops/rule_templates.h"
#include "support/error.h"

namespace shardwise::ops {
namespace {

constexpr std::array<std::string_view, 7> kFlopsKindNames{"zero",        "per_output_element", "per_input_element",
                                                          "contraction", "convolution",        "attention",
                                                          "experts"};

}  // namespace

std::string_view flops_kind_name(FlopsKind kind) { return kFlopsKindNames.at(static_cast<std::size_t>(kind)); }

std::string_view op_base_name(std::string_view op) {
  // The overload follows the last '.' after the namespace separator.
  const auto ns = op.rfind("::");
  const auto dot = op.find('.', ns == std::string_view::npos ? 0 : ns + 2);
  return dot == std::string_view::npos ? op : op.substr(0, dot);
}

void OpTable::add(std::string name, std::string_view rule_text, FlopsCost flops, OpTraits traits) {
  if (name.empty()) throw support::ValidationError("op table: an op needs a name");
  if (by_name_.count(name)) throw support::ValidationError(fmt::format("op table: {} is registered twice", name));
  RuleText rule;
  try {
    rule = parse_rule_text(rule_text);
    if (const auto* call = std::get_if<TemplateCall>(&rule)) check_template_call(*call);
  } catch (const support::ValidationError& e) {
    throw support::ValidationError(fmt::format("op table: {}: {}", name, e.what()));
  }
  if (flops.per_element < 0) {
    throw support::ValidationError(fmt::format("op table: {}: negative FLOPs per element", name));
  }
  const auto at = specs_.size();
  by_name_.emplace(name, at);
  by_base_.emplace(std::string(op_base_name(name)), at);  // keeps the first of a base
  const auto* call = std::get_if<TemplateCall>(&rule);
  const bool lookup = call != nullptr && template_has_lookup(call->name);
  specs_.push_back(OpSpec{std::move(name), std::string(rule_text), std::move(rule), flops, traits.linear, lookup,
                          traits.linear || traits.additive, traits.linear_in, traits.zeros});
}

const OpSpec* OpTable::find(std::string_view op) const {
  const std::string key(op);
  if (auto it = by_name_.find(key); it != by_name_.end()) return &specs_[it->second];
  const std::string base(op_base_name(op));
  if (auto it = by_name_.find(base); it != by_name_.end()) return &specs_[it->second];
  if (auto it = by_base_.find(base); it != by_base_.end()) return &specs_[it->second];
  return nullptr;
}

}  // namespace shardwise::ops
