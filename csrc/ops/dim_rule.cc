#include "ops/dim_rule.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <unordered_set>

#include "support/error.h"

namespace shardwise::ops {
namespace {

constexpr std::array<std::string_view, 3> kKindNames{"spatial", "reduced", "whole"};
constexpr std::array<std::string_view, 4> kReductionNames{"sum", "mean", "max", "min"};

std::string operand_str(const DimRule& rule, const OperandDims& operand) {
  if (operand.empty()) return "()";
  std::string out;
  for (std::size_t d = 0; d < operand.size(); ++d) {
    if (d) out += ' ';
    const auto& dims = operand[d];
    if (dims.empty()) {
      out += '1';
    } else if (dims.size() == 1) {
      out += rule.indices.at(static_cast<std::size_t>(dims[0])).label;
    } else {
      out += '(';
      for (std::size_t i = 0; i < dims.size(); ++i) {
        if (i) out += ' ';
        out += rule.indices.at(static_cast<std::size_t>(dims[i])).label;
      }
      out += ')';
    }
  }
  return out;
}

std::string operands_str(const DimRule& rule, const std::vector<OperandDims>& operands) {
  std::string out;
  for (std::size_t i = 0; i < operands.size(); ++i) {
    if (i) out += ", ";
    out += operand_str(rule, operands[i]);
  }
  return out;
}

}  // namespace

std::string_view index_kind_name(IndexKind kind) { return kKindNames.at(static_cast<std::size_t>(kind)); }

std::string_view reduction_name(Reduction reduction) { return kReductionNames.at(static_cast<std::size_t>(reduction)); }

int DimRule::find(std::string_view label) const {
  for (std::size_t i = 0; i < indices.size(); ++i) {
    if (indices[i].label == label) return static_cast<int>(i);
  }
  return -1;
}

bool DimRule::reads_metadata_only(std::size_t input) const {
  bool any = false;
  for (const DimIndices& dim : inputs.at(input))
    for (int index : dim) {
      any = true;
      if (indices[static_cast<std::size_t>(index)].kind != IndexKind::Spatial) return false;
      for (const OperandDims& output : outputs)
        for (const DimIndices& out_dim : output)
          if (std::ranges::find(out_dim, index) != out_dim.end()) return false;
    }
  return any;
}

bool DimRule::is_added(std::size_t input) const {
  return std::find(added.begin(), added.end(), static_cast<int>(input)) != added.end();
}

std::int64_t DimRule::dims_size(const DimIndices& dims) const {
  std::int64_t size = 1;
  for (int id : dims) size *= indices.at(static_cast<std::size_t>(id)).size;
  return size;
}

std::vector<std::int64_t> DimRule::shape_of(const OperandDims& operand) const {
  std::vector<std::int64_t> shape;
  shape.reserve(operand.size());
  for (const auto& dims : operand) shape.push_back(dims_size(dims));
  return shape;
}

std::string DimRule::str() const {
  std::string out = operands_str(*this, inputs) + " -> " + operands_str(*this, outputs) + "  [";
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const auto& index = indices[i];
    if (i) out += ", ";
    out += fmt::format("{}={}", index.label, index.size);
    if (index.kind == IndexKind::Whole) out += " whole";
    if (index.kind == IndexKind::Reduced) {
      out += " reduced";
      if (index.reduction != Reduction::Sum) out += fmt::format("({})", reduction_name(index.reduction));
    }
  }
  return out + "]";
}

void check_structure(const DimRule& rule) {
  std::unordered_set<std::string_view> labels;
  for (const auto& index : rule.indices) {
    if (index.label.empty()) throw support::ValidationError("dimension rule: an index has an empty label");
    if (!labels.insert(index.label).second) {
      throw support::ValidationError(fmt::format("dimension rule: index label '{}' repeats", index.label));
    }
  }
  std::vector<bool> used(rule.indices.size(), false);
  auto check_operands = [&](const std::vector<OperandDims>& operands, std::string_view side) {
    for (std::size_t o = 0; o < operands.size(); ++o) {
      std::vector<bool> in_operand(rule.indices.size(), false);
      for (const auto& dims : operands[o]) {
        for (int id : dims) {
          if (id < 0 || static_cast<std::size_t>(id) >= rule.indices.size()) {
            throw support::ValidationError(
                fmt::format("dimension rule: {} {} refers to index {} of {}", side, o, id, rule.indices.size()));
          }
          const auto at = static_cast<std::size_t>(id);
          if (in_operand[at]) {
            throw support::ValidationError(
                fmt::format("dimension rule: {} {} uses index '{}' twice", side, o, rule.indices[at].label));
          }
          in_operand[at] = true;
          used[at] = true;
        }
      }
    }
  };
  check_operands(rule.inputs, "input");
  check_operands(rule.outputs, "output");
  // A reduced index is summed away: an output carrying it would contradict the kind.
  for (const auto& output : rule.outputs) {
    for (const auto& dims : output) {
      for (int id : dims) {
        const auto& index = rule.indices[static_cast<std::size_t>(id)];
        if (index.kind == IndexKind::Reduced) {
          throw support::ValidationError(
              fmt::format("dimension rule: reduced index '{}' appears in an output", index.label));
        }
      }
    }
  }
  for (std::size_t i = 0; i < used.size(); ++i) {
    if (!used[i]) {
      throw support::ValidationError(
          fmt::format("dimension rule: index '{}' is used by no operand", rule.indices[i].label));
    }
  }
  for (int input : rule.added) {
    if (input < 0 || static_cast<std::size_t>(input) >= rule.inputs.size()) {
      throw support::ValidationError(
          fmt::format("dimension rule: added term {} is no input of {}", input, rule.inputs.size()));
    }
  }
}

}  // namespace shardwise::ops
