#include "ops/einsum_rule.h"

#include <fmt/format.h>

#include <cctype>
#include <set>

#include "support/error.h"

namespace shardwise::ops {
namespace {

// One tensor dim of a bound operand: the indices the pattern gives it and whether a size
// of 1 may broadcast (tie to no index).
struct Slot {
  std::vector<int> ids;
  bool broadcastable = false;
};

struct BoundOperand {
  const PatternOperand* pattern = nullptr;
  const Shape* shape = nullptr;  // null for outputs in infer mode
  std::vector<Slot> slots;
};

int named_dims(const PatternOperand& operand) {
  return static_cast<int>(operand.dims.size()) - (operand.has_ellipsis() ? 1 : 0);
}

// The ellipsis length an operand's rank implies, or -1 when it has no ellipsis. Throws when
// the rank cannot fit the pattern.
int ellipsis_length(const PatternOperand& pattern, int rank, std::string_view side, std::size_t index) {
  const int named = named_dims(pattern);
  if (pattern.has_ellipsis()) {
    if (rank < named) {
      throw support::ValidationError(
          fmt::format("{} {} has rank {} but the rule names {} dims besides '...'", side, index, rank, named));
    }
    return rank - named;
  }
  if (rank != named && !(pattern.broadcast && rank < named)) {
    throw support::ValidationError(
        fmt::format("{} {} has rank {} but the rule gives it {} dims", side, index, rank, named));
  }
  return -1;
}

// The operand counts the pattern takes against the node's.
void check_arity(const EinsumPattern& pattern, const RuleOperands& operands) {
  std::size_t required = 0;
  for (const auto& in : pattern.inputs) required += in.optional ? 0 : 1;
  const std::size_t n_inputs = operands.inputs.size();
  if (n_inputs < required || n_inputs > pattern.inputs.size()) {
    throw support::ValidationError(
        required == pattern.inputs.size()
            ? fmt::format("the rule takes {} tensor input(s), the node has {}", required, n_inputs)
            : fmt::format("the rule takes {} to {} tensor inputs, the node has {}", required, pattern.inputs.size(),
                          n_inputs));
  }
  if (static_cast<std::size_t>(operands.output_count) != pattern.outputs.size()) {
    throw support::ValidationError(
        fmt::format("the rule gives {} output(s), the node has {}", pattern.outputs.size(), operands.output_count));
  }
}

// Ellipsis length: the longest over inputs (numpy broadcasting), which outputs must match;
// -1 when no operand has one.
int broadcast_ellipsis(const EinsumPattern& pattern, const RuleOperands& operands) {
  int ellipsis = -1;
  for (std::size_t i = 0; i < operands.inputs.size(); ++i) {
    if (pattern.inputs[i].metadata) continue;
    ellipsis = std::max(ellipsis, ellipsis_length(pattern.inputs[i], operands.input_rank(i), "input", i));
  }
  const bool input_has_ellipsis = ellipsis >= 0;
  if (operands.outputs_known) {
    for (std::size_t o = 0; o < pattern.outputs.size(); ++o) {
      const int len = ellipsis_length(pattern.outputs[o], operands.outputs[o]->rank(), "output", o);
      if (len < 0) continue;
      if (!input_has_ellipsis && ellipsis < 0) ellipsis = len;
      if (len != ellipsis) {
        throw support::ValidationError(
            fmt::format("output {} has {} dims in '...' but the inputs broadcast to {}", o, len, ellipsis));
      }
    }
  }
  return ellipsis;
}

// The rule's indices as the pattern's letters meet the operands: each letter an index in
// order of first appearance (sizes unknown, -1, for now), the ellipsis' dims indices of their
// own, each operand's dims bound to them.
class PatternBinder {
 public:
  PatternBinder(DimRule& rule, std::set<char> output_letters, bool output_has_ellipsis, int ellipsis)
      : rule_(rule),
        output_letters_(std::move(output_letters)),
        output_has_ellipsis_(output_has_ellipsis),
        ellipsis_(ellipsis) {
    std::fill(std::begin(letter_ids_), std::end(letter_ids_), -1);
  }

  BoundOperand bind(const PatternOperand& pat, const Shape* shape, int rank, bool is_input, std::size_t position) {
    BoundOperand bound{&pat, shape, {}};
    if (pat.metadata) {
      for (int d = 0; d < rank; ++d) {
        const int id = static_cast<int>(rule_.indices.size());
        rule_.indices.push_back(
            Index{fmt::format("m{}.{}", position, d), shape->at(static_cast<std::size_t>(d)), IndexKind::Spatial});
        bound.slots.push_back(Slot{{id}, false});
      }
      return bound;
    }
    // A '~' operand with fewer dims takes the pattern's trailing ones.
    const int skip = pat.broadcast ? static_cast<int>(pat.dims.size()) - rank : 0;
    for (int p = skip; p < static_cast<int>(pat.dims.size()); ++p) {
      const auto& dim = pat.dims[static_cast<std::size_t>(p)];
      if (dim.ellipsis) {
        ensure_ellipsis();
        const int len = rank - named_dims(pat);
        for (int k = 0; k < len; ++k) {
          bound.slots.push_back(Slot{{ellipsis_ids_[static_cast<std::size_t>(ellipsis_ - len + k)]}, is_input});
        }
        continue;
      }
      Slot slot{{}, is_input && pat.broadcast};
      for (char c : dim.letters) slot.ids.push_back(id_of(c));
      bound.slots.push_back(std::move(slot));
    }
    return bound;
  }

 private:
  int id_of(char c) {
    auto& id = letter_ids_[static_cast<unsigned char>(c)];
    if (id < 0) {
      id = static_cast<int>(rule_.indices.size());
      IndexKind kind = IndexKind::Whole;
      if (std::islower(static_cast<unsigned char>(c))) {
        kind = output_letters_.count(c) ? IndexKind::Spatial : IndexKind::Reduced;
      }
      rule_.indices.push_back(Index{std::string(1, c), -1, kind, Reduction::Sum});
    }
    return id;
  }
  void ensure_ellipsis() {
    if (!ellipsis_ids_.empty() || ellipsis_ <= 0) return;
    for (int k = 0; k < ellipsis_; ++k) {
      ellipsis_ids_.push_back(static_cast<int>(rule_.indices.size()));
      rule_.indices.push_back(Index{fmt::format("_{}", k), -1,
                                    output_has_ellipsis_ ? IndexKind::Spatial : IndexKind::Reduced, Reduction::Sum});
    }
  }

  DimRule& rule_;
  const std::set<char> output_letters_;
  const bool output_has_ellipsis_;
  const int ellipsis_;
  int letter_ids_[128];
  std::vector<int> ellipsis_ids_;
};

// The indices' sizes: a dim that cannot broadcast (or is not 1) decides its index first; a
// size-1 broadcasting dim only when nothing else does; then group factors; then outputs.
void size_indices(DimRule& rule, const std::vector<BoundOperand>& inputs, const std::vector<BoundOperand>& outputs) {
  auto size_of = [&](int id) -> std::int64_t& { return rule.indices[static_cast<std::size_t>(id)].size; };
  auto visit_single = [&](const std::vector<BoundOperand>& side, bool weak) {
    for (const auto& bound : side) {
      if (!bound.shape) continue;
      for (std::size_t d = 0; d < bound.slots.size(); ++d) {
        const auto& slot = bound.slots[d];
        const auto dim = (*bound.shape)[d];
        const bool is_weak = slot.broadcastable && dim == 1;
        if (slot.ids.size() != 1 || is_weak != weak) continue;
        if (size_of(slot.ids[0]) < 0) size_of(slot.ids[0]) = dim;
      }
    }
  };
  auto visit_groups = [&](const std::vector<BoundOperand>& side) {
    bool progress = false;
    for (const auto& bound : side) {
      if (!bound.shape) continue;
      for (std::size_t d = 0; d < bound.slots.size(); ++d) {
        const auto& ids = bound.slots[d].ids;
        if (ids.size() < 2) continue;
        std::int64_t known = 1;
        int unknown = -1, n_unknown = 0;
        for (int id : ids) {
          if (size_of(id) < 0) {
            unknown = id;
            ++n_unknown;
          } else {
            known *= size_of(id);
          }
        }
        if (n_unknown != 1) continue;
        const auto dim = (*bound.shape)[d];
        if (known == 0 || dim % known != 0) {
          throw support::ValidationError(
              fmt::format("dim {} of size {} does not factor into known factors of {}", d, dim, known));
        }
        size_of(unknown) = dim / known;
        progress = true;
      }
    }
    return progress;
  };
  visit_single(inputs, false);
  visit_single(inputs, true);
  while (visit_groups(inputs)) {
  }
  visit_single(outputs, false);
  while (visit_groups(inputs) || visit_groups(outputs)) {
  }
}

}  // namespace

std::optional<DimRule> instantiate_pattern(const EinsumPattern& pattern, const RuleOperands& operands) {
  check_arity(pattern, operands);
  const int ellipsis = broadcast_ellipsis(pattern, operands);
  bool output_has_ellipsis = false;
  std::set<char> output_letters;
  for (const auto& out : pattern.outputs) {
    output_has_ellipsis |= out.has_ellipsis();
    for (const auto& dim : out.dims) output_letters.insert(dim.letters.begin(), dim.letters.end());
  }
  if (output_has_ellipsis && ellipsis < 0) return std::nullopt;  // infer mode, nothing sizes '...'

  DimRule rule;
  PatternBinder binder(rule, std::move(output_letters), output_has_ellipsis, ellipsis);
  std::vector<BoundOperand> inputs, outputs;
  for (std::size_t i = 0; i < operands.inputs.size(); ++i) {
    inputs.push_back(binder.bind(pattern.inputs[i], &operands.input_shape(i), operands.input_rank(i), true, i));
  }
  for (std::size_t o = 0; o < pattern.outputs.size(); ++o) {
    const Shape* shape = operands.output_shape(o);
    const int rank = shape ? static_cast<int>(shape->size())
                           : named_dims(pattern.outputs[o]) + (pattern.outputs[o].has_ellipsis() ? ellipsis : 0);
    outputs.push_back(binder.bind(pattern.outputs[o], shape, rank, false, o));
  }
  size_indices(rule, inputs, outputs);
  for (const auto& index : rule.indices) {
    if (index.size < 0) {
      if (!operands.outputs_known) return std::nullopt;
      throw support::ValidationError(fmt::format("nothing determines the size of index '{}'", index.label));
    }
  }

  auto to_dims = [&](const BoundOperand& bound) {
    OperandDims dims;
    for (std::size_t d = 0; d < bound.slots.size(); ++d) {
      const auto& slot = bound.slots[d];
      const bool broadcast =
          slot.broadcastable && bound.shape && (*bound.shape)[d] == 1 && rule.dims_size(slot.ids) != 1;
      dims.push_back(broadcast ? DimIndices{} : slot.ids);
    }
    return dims;
  };
  for (const auto& bound : inputs) rule.inputs.push_back(to_dims(bound));
  for (std::size_t i = 0; i < operands.inputs.size(); ++i)
    if (pattern.inputs[i].added) rule.added.push_back(static_cast<int>(i));
  for (const auto& bound : outputs) rule.outputs.push_back(to_dims(bound));
  return rule;
}

}  // namespace shardwise::ops
