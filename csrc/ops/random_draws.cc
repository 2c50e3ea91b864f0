#include "ops/random_draws.h"

#include <array>
#include <utility>
#include <variant>

#include "ops/op_table.h"
#include "support/enum_names.h"

namespace shardwise::ops {
namespace {

// Base names (aten::<name>) whose overloads carry torch's nondeterministic_seeded tag, the
// composite dropouts (dropout_, feature_dropout, whose tag torch sets too) among them.
constexpr std::array<std::pair<std::string_view, RandomDraw>, 41> kSeeded = {{
    {"aten::dropout", RandomDraw::Mask},
    {"aten::feature_dropout", RandomDraw::Mask},
    {"aten::rand_like", RandomDraw::Like},
    {"aten::randn_like", RandomDraw::Like},
    {"aten::dropout_", RandomDraw::Other},
    {"aten::native_dropout", RandomDraw::Other},
    {"aten::_fused_dropout", RandomDraw::Other},
    {"aten::alpha_dropout", RandomDraw::Other},
    {"aten::bernoulli", RandomDraw::Other},
    {"aten::bernoulli_", RandomDraw::Other},
    {"aten::randint_like", RandomDraw::Other},
    {"aten::rand", RandomDraw::Other},
    {"aten::randn", RandomDraw::Other},
    {"aten::randint", RandomDraw::Other},
    {"aten::randperm", RandomDraw::Other},
    {"aten::normal", RandomDraw::Other},
    {"aten::normal_", RandomDraw::Other},
    {"aten::uniform", RandomDraw::Other},
    {"aten::uniform_", RandomDraw::Other},
    {"aten::exponential", RandomDraw::Other},
    {"aten::exponential_", RandomDraw::Other},
    {"aten::geometric", RandomDraw::Other},
    {"aten::geometric_", RandomDraw::Other},
    {"aten::log_normal", RandomDraw::Other},
    {"aten::log_normal_", RandomDraw::Other},
    {"aten::cauchy", RandomDraw::Other},
    {"aten::cauchy_", RandomDraw::Other},
    {"aten::multinomial", RandomDraw::Other},
    {"aten::poisson", RandomDraw::Other},
    {"aten::_standard_gamma", RandomDraw::Other},
    {"aten::rrelu_with_noise", RandomDraw::Other},
    {"aten::rrelu_with_noise_functional", RandomDraw::Other},
    // Attention with a dropout probability (dropout_p = 0 draws nothing: draws()).
    {"aten::scaled_dot_product_attention", RandomDraw::Other},
    {"aten::_scaled_dot_product_flash_attention", RandomDraw::Other},
    {"aten::_scaled_dot_product_flash_attention_for_cpu", RandomDraw::Other},
    {"aten::_scaled_dot_product_efficient_attention", RandomDraw::Other},
    {"aten::_scaled_dot_product_attention_math", RandomDraw::Other},
    {"aten::_scaled_dot_product_cudnn_attention", RandomDraw::Other},
    {"aten::_efficient_attention_forward", RandomDraw::Other},
    {"aten::_flash_attention_forward", RandomDraw::Other},
    {"aten::_scaled_dot_product_fused_attention_overrideable", RandomDraw::Other},
}};

constexpr auto kDrawNames = support::enum_names<RandomDraw>({
    {RandomDraw::None, "none"},
    {RandomDraw::Mask, "mask"},
    {RandomDraw::Like, "like"},
    {RandomDraw::Other, "other"},
});

RandomDraw find(std::string_view name) {
  for (const auto& [op, kind] : kSeeded)
    if (op == name) return kind;
  return RandomDraw::None;
}

// A number attribute equal to 0 (p=0.0, dropout_p=0.0).
bool zero(const ir::Attributes& attrs, std::string_view key) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return false;
  if (const auto* d = std::get_if<double>(&it->second)) return *d == 0.0;
  if (const auto* i = std::get_if<std::int64_t>(&it->second)) return *i == 0;
  return false;
}

}  // namespace

std::string_view random_draw_name(RandomDraw kind) { return kDrawNames.name(kind, "none"); }

RandomDraw random_draw(std::string_view op) {
  const RandomDraw full = find(op);
  return full != RandomDraw::None ? full : find(op_base_name(op));
}

bool draws(const ir::Node& node) {
  if (random_draw(node.op) == RandomDraw::None) return false;
  // ATen's composite dropouts return their input at p = 0 (native_dropout and bernoulli
  // still draw there); attention draws its dropout only for dropout_p > 0; every dropout
  // out of training is the identity.
  const std::string_view base = op_base_name(node.op);
  const bool composite = base == "aten::dropout" || base == "aten::dropout_" || base == "aten::feature_dropout" ||
                         base == "aten::alpha_dropout";
  if ((composite && zero(node.attrs, "p")) || zero(node.attrs, "dropout_p")) return false;
  auto train = node.attrs.find("train");
  return !(train != node.attrs.end() && std::holds_alternative<bool>(train->second) && !std::get<bool>(train->second));
}

std::vector<std::pair<std::string_view, RandomDraw>> seeded_ops() { return {kSeeded.begin(), kSeeded.end()}; }

}  // namespace shardwise::ops
