#include "search/strategy.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>

#include "support/error.h"

namespace shardwise::search {
namespace {

// Where an operand carries index `i`: its dim and the product of the sizes of the indices
// major to i in that dim (the Shard's groups before the strided factor).
struct Carrier {
  int dim = -1;
  std::int64_t major = 1;
};

std::optional<Carrier> find_carrier(const ops::DimRule& rule, const ops::OperandDims& operand, int i) {
  for (std::size_t d = 0; d < operand.size(); ++d) {
    std::int64_t major = 1;
    for (int id : operand[d]) {
      if (id == i) return Carrier{static_cast<int>(d), major};
      major *= rule.indices.at(static_cast<std::size_t>(id)).size;
    }
  }
  return std::nullopt;
}

bool splittable(const ops::Index& index) {
  switch (index.kind) {
    case ops::IndexKind::Spatial:
      return true;
    case ops::IndexKind::Reduced:
      // Max / Min partials are not what the backward of a split needs (the arg of the
      // extreme lives on one rank), so only additive reductions split.
      return index.reduction == ops::Reduction::Sum || index.reduction == ops::Reduction::Mean;
    case ops::IndexKind::Whole:
      return index.statistics > 0 || index.lookup || index.ring;
  }
  return false;
}

// An uneven split is offered only where every rank gets at least this many elements, so the
// largest share is within 1/8 of the mean (3 channels on 2 ranks is not worth a split).
constexpr std::int64_t kUnevenMinimumShare = 8;

// Gives every Shard of the strategy the uneven shares; false when one is strided (an operand
// carries the index under a major one), which the rewrite cannot cut unevenly.
bool make_uneven(Strategy& s, const std::vector<double>& ratios) {
  for (auto* list : {&s.inputs, &s.input_grads, &s.outputs})
    for (Placement& p : *list) {
      if (!p.is_shard()) continue;
      if (p.groups != 1) return false;
      p.ratios = ratios;
    }
  return true;
}

bool outputs_carry(const ops::DimRule& rule, int i) {
  for (const auto& output : rule.outputs)
    if (find_carrier(rule, output, i)) return true;
  return false;
}

// Every index other than `i` that some output carries: the rows a normalisation keeps one
// set of statistics for.
std::int64_t row_count(const ops::DimRule& rule, int i) {
  std::set<int> carried;
  for (const auto& output : rule.outputs) {
    for (const auto& dims : output) carried.insert(dims.begin(), dims.end());
  }
  std::int64_t rows = 1;
  for (int id : carried) {
    if (id != i) rows *= rule.indices.at(static_cast<std::size_t>(id)).size;
  }
  return rows;
}

Strategy replicate_strategy(const ops::DimRule& rule) {
  Strategy s;
  s.inputs.assign(rule.inputs.size(), Placement::replicate());
  s.input_grads = s.inputs;
  s.outputs.assign(rule.outputs.size(), Placement::replicate());
  return s;
}

// `layout`: the rule whose index sizes say where the blocks lie (see enumerate_strategies);
// it has the same indices and operands as `rule`.
Strategy split_strategy(const ops::DimRule& rule, const ops::DimRule& layout, int i, std::int64_t groups) {
  const ops::Index& index = rule.indices.at(static_cast<std::size_t>(i));
  Strategy s;
  s.index = i;
  s.groups = groups;
  for (std::size_t input = 0; input < layout.inputs.size(); ++input) {
    const ops::OperandDims& operand = layout.inputs[input];
    if (auto c = find_carrier(layout, operand, i)) {
      s.inputs.push_back(Placement::shard(c->dim, c->major * groups));
      s.input_grads.push_back(s.inputs.back());
      continue;
    }
    switch (index.kind) {
      case ops::IndexKind::Spatial:
        // Every rank uses the whole operand for its slice, so every rank contributes to its
        // gradient (Megatron's `f`, the data-parallel weight gradient).
        s.inputs.push_back(Placement::replicate());
        s.input_grads.push_back(Placement::partial(ops::Reduction::Sum));
        break;
      case ops::IndexKind::Reduced:
        if (layout.is_added(input)) {
          // An added term (addmm's bias) must enter the partial sum once, not n times.
          s.inputs.push_back(Placement::partial(index.reduction));
          s.input_grads.push_back(Placement::replicate());
        } else {
          // A factor of every term multiplies each rank's partial sum whole, and meets only
          // this rank's terms: its gradient is a partial sum (a mixture of experts' tokens
          // against the experts a rank holds).
          s.inputs.push_back(Placement::replicate());
          s.input_grads.push_back(Placement::partial(ops::Reduction::Sum));
        }
        break;
      case ops::IndexKind::Whole:
        // The combined statistics make every rank's rows exact. Where the outputs keep the
        // split index (batch norm's rows), a replicated operand (its weight) meets only this
        // rank's part of them: its gradient is a partial sum, as under a spatial split. Where
        // they do not (a loss over split classes), every rank's gradient is complete. A
        // lookup's addresses are integers: no gradient.
        s.inputs.push_back(Placement::replicate());
        s.input_grads.push_back(!index.lookup && outputs_carry(layout, i) ? Placement::partial(ops::Reduction::Sum)
                                                                          : Placement::replicate());
        break;
    }
  }
  for (const auto& operand : layout.outputs) {
    if (auto c = find_carrier(layout, operand, i)) {
      s.outputs.push_back(Placement::shard(c->dim, c->major * groups));
    } else if (index.kind == ops::IndexKind::Reduced) {
      s.outputs.push_back(Placement::partial(index.reduction));
    } else if (index.kind == ops::IndexKind::Whole && index.lookup) {
      // Each rank wrote its rows' lookups and zeros elsewhere.
      s.outputs.push_back(Placement::partial(ops::Reduction::Sum));
    } else {
      s.outputs.push_back(Placement::replicate());
    }
  }
  if (index.kind == ops::IndexKind::Whole && !index.lookup) {
    s.statistics_elements = static_cast<std::int64_t>(index.statistics) * row_count(rule, i);
  }
  return s;
}

// Index i split with the index it carries (Index::dispatch) on one axis of n ranks: the
// operands carrying that index take its Shard as well (each rank holds its block of the
// experts, gradients complete: every token routed to them reaches them). Equal blocks of
// both, neither cut by another axis unevenly; else none.
std::optional<Strategy> dispatch_strategy(const ops::DimRule& rule, const ops::DimRule& layout, int i,
                                          std::int64_t n) {
  const ops::Index& index = rule.indices.at(static_cast<std::size_t>(i));
  if (index.dispatch < 0 || index.kind != ops::IndexKind::Spatial) return std::nullopt;
  const ops::Index& carried = rule.indices.at(static_cast<std::size_t>(index.dispatch));
  if (index.uneven || carried.uneven || index.size % n != 0 || carried.size % n != 0) return std::nullopt;
  Strategy s = split_strategy(rule, layout, i, 1);
  const Strategy other = split_strategy(rule, layout, index.dispatch, 1);
  for (std::size_t input = 0; input < s.inputs.size(); ++input) {
    if (!other.inputs[input].is_shard()) continue;
    if (s.inputs[input].is_shard()) return std::nullopt;  // an operand carrying both
    s.inputs[input] = other.inputs[input];
    s.input_grads[input] = other.input_grads[input];
  }
  s.dispatch = true;
  return s;
}

bool same_placements(const Strategy& a, const Strategy& b) {
  return a.inputs == b.inputs && a.input_grads == b.input_grads && a.outputs == b.outputs &&
         a.statistics_elements == b.statistics_elements;
}

void check_axis_size(int axis_size) {
  if (axis_size < 1) throw support::ValidationError(fmt::format("axis size {} must be at least 1", axis_size));
}

}  // namespace

std::string Strategy::str(const ops::DimRule& rule) const {
  if (partial) return "partial";
  if (index < 0) return "replicate";
  if (static_cast<std::size_t>(index) >= rule.indices.size()) {
    throw support::ValidationError(
        fmt::format("strategy splits index {}, the rule has {} indices", index, rule.indices.size()));
  }
  const auto& label = rule.indices[static_cast<std::size_t>(index)].label;
  if (dispatch) return fmt::format("dispatch {}", label);
  if (groups == 1) return fmt::format("split {}", label);
  return fmt::format("split {} g{}", label, groups);
}

std::vector<Strategy> enumerate_strategies(const ops::DimRule& rule, int axis_size, const StrategyOptions& options,
                                           const ops::DimRule* layout) {
  check_axis_size(axis_size);
  if (layout == nullptr) layout = &rule;
  if (layout->indices.size() != rule.indices.size() || layout->inputs.size() != rule.inputs.size() ||
      layout->outputs.size() != rule.outputs.size())
    throw support::ValidationError(fmt::format("layout rule {} does not match the rule {}", layout->str(), rule.str()));
  std::vector<Strategy> out = {replicate_strategy(rule)};
  if (axis_size == 1) return out;
  const auto n = static_cast<std::int64_t>(axis_size);
  for (std::size_t k = 0; k < rule.indices.size(); ++k) {
    const auto& index = rule.indices[k];
    if (!splittable(index) || index.uneven) continue;  // uneven: another axis cut it unevenly
    // Groups to try: contiguous first, then the strided pairs listed for this size, ascending.
    std::set<std::int64_t> strided;
    for (const auto& [size, g] : options.strided) {
      if (size == index.size && g > 1) strided.insert(g);
    }
    std::vector<std::int64_t> groups = {1};
    groups.insert(groups.end(), strided.begin(), strided.end());
    for (auto g : groups) {
      const std::int64_t parts = n * g;
      if (index.size < parts) continue;
      if (index.ring && (g != 1 || index.size % parts != 0)) continue;  // ring attention's blocks are equal
      Strategy s = split_strategy(rule, *layout, static_cast<int>(k), g);
      if (index.size % parts != 0 &&
          (g != 1 || index.size < kUnevenMinimumShare * parts || !make_uneven(s, uneven_ratios(index.size, axis_size))))
        continue;
      const bool seen =
          std::any_of(out.begin(), out.end(), [&](const Strategy& earlier) { return same_placements(earlier, s); });
      if (!seen) out.push_back(std::move(s));
    }
    if (auto s = dispatch_strategy(rule, *layout, static_cast<int>(k), n)) out.push_back(std::move(*s));
  }
  return out;
}

Strategy partial_strategy(const ops::DimRule& rule) {
  Strategy s;
  s.partial = true;
  s.inputs.assign(rule.inputs.size(), Placement::partial(ops::Reduction::Sum));
  s.input_grads.assign(rule.inputs.size(), Placement::replicate());
  s.outputs.assign(rule.outputs.size(), Placement::partial(ops::Reduction::Sum));
  return s;
}

ops::DimRule local_rule(const ops::DimRule& rule, const Strategy& strategy, int axis_size) {
  check_axis_size(axis_size);
  ops::DimRule out = rule;
  if (strategy.index < 0) return out;
  if (static_cast<std::size_t>(strategy.index) >= rule.indices.size()) {
    throw support::ValidationError(
        fmt::format("strategy splits index {}, the rule has {} indices", strategy.index, rule.indices.size()));
  }
  auto& index = out.indices[static_cast<std::size_t>(strategy.index)];
  if (index.size < axis_size) {
    throw support::ValidationError(
        fmt::format("index {} of size {} does not split over {} ranks", index.label, index.size, axis_size));
  }
  index.ring = false;  // one ring: no other axis splits the sequence ring attention splits
  if (strategy.dispatch) {  // both blocks, equal (dispatch_strategy)
    out.indices.at(static_cast<std::size_t>(index.dispatch)).size /= axis_size;
    index.dispatch = -1;  // one all-to-all: no other axis dispatches these tokens
  }
  if (index.size % axis_size != 0) {
    index.size = index.size / axis_size + 1;  // the largest share
    index.uneven = true;
    return out;
  }
  index.size /= axis_size;
  return out;
}

std::vector<double> uneven_ratios(std::int64_t size, int n) {
  if (n < 1 || size < n)
    throw support::ValidationError(fmt::format("an index of size {} does not split over {} ranks", size, n));
  if (size % n == 0) return {};
  std::vector<double> ratios;
  const std::int64_t base = size / n, longer = size % n;
  for (std::int64_t r = 0; r < n; ++r)
    ratios.push_back(static_cast<double>(base + (r < longer ? 1 : 0)) / static_cast<double>(size));
  return ratios;
}

}  // namespace shardwise::search
