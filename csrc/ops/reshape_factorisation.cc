#include "ops/reshape_factorisation.h"

#include <fmt/format.h>

#include <algorithm>

#include "support/error.h"

namespace shardwise::ops {
namespace {

std::int64_t numel(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

class Factoriser {
 public:
  Factoriser(const Shape& input, const Shape& output) : input_(input), output_(output) {
    rule_.inputs.assign(1, OperandDims(input.size()));
    rule_.outputs.assign(1, OperandDims(output.size()));
  }

  DimRule run() {
    if (numel(input_) != numel(output_)) {
      throw support::ValidationError(fmt::format("a reshape of [{}] ({} elements) cannot give [{}] ({} elements)",
                                                 fmt::join(input_, ","), numel(input_), fmt::join(output_, ","),
                                                 numel(output_)));
    }
    if (numel(input_) == 0) {
      // Nothing to split in an empty tensor: every dim on its own.
      whole_stretch(0, input_.size(), 0, output_.size());
      return std::move(rule_);
    }
    std::size_t i = 0, j = 0;
    while (i < input_.size() || j < output_.size()) {
      const bool in_unit = i < input_.size() && input_[i] == 1;
      const bool out_unit = j < output_.size() && output_[j] == 1;
      if (in_unit && out_unit) {
        // A unit dim on both sides at the same place: keep them tied (a batch of 1 stays
        // the batch dim through the view).
        const int id = add_index(1, IndexKind::Spatial);
        input_dims()[i++] = {id};
        output_dims()[j++] = {id};
        continue;
      }
      if (in_unit) {
        ++i;
        continue;
      }
      if (out_unit) {
        ++j;
        continue;
      }
      // A stretch of dims on each side with the same product.
      std::size_t i_end = i, j_end = j;
      std::int64_t in_product = input_[i], out_product = output_[j];
      while (in_product != out_product) {
        if (in_product < out_product) {
          in_product *= input_[++i_end];
        } else {
          out_product *= output_[++j_end];
        }
      }
      stretch(i, i_end + 1, j, j_end + 1);
      i = i_end + 1;
      j = j_end + 1;
    }
    return std::move(rule_);
  }

 private:
  OperandDims& input_dims() { return rule_.inputs[0]; }
  OperandDims& output_dims() { return rule_.outputs[0]; }

  int add_index(std::int64_t size, IndexKind kind) {
    const int id = static_cast<int>(rule_.indices.size());
    const bool whole = kind == IndexKind::Whole;
    rule_.indices.push_back(Index{fmt::format("{}{}", whole ? 'W' : 'i', whole ? whole_count_++ : spatial_count_++),
                                  size, kind, Reduction::Sum});
    return id;
  }

  // Cumulative products, from the major side, at the end of each non-unit dim.
  static std::vector<std::int64_t> boundaries(const Shape& shape, std::size_t begin, std::size_t end) {
    std::vector<std::int64_t> out;
    std::int64_t product = 1;
    for (std::size_t d = begin; d < end; ++d) {
      product *= shape[d];
      if (shape[d] != 1) out.push_back(product);
    }
    return out;
  }

  void stretch(std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) {
    const auto in_bounds = boundaries(input_, i0, i1);
    const auto out_bounds = boundaries(output_, j0, j1);
    std::vector<std::int64_t> all = in_bounds;
    all.insert(all.end(), out_bounds.begin(), out_bounds.end());
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    // Each piece must be a whole number of elements of the previous boundary.
    std::int64_t previous = 1;
    for (auto b : all) {
      if (b % previous != 0) {
        whole_stretch(i0, i1, j0, j1);
        return;
      }
      previous = b;
    }
    std::vector<int> ids;
    previous = 1;
    for (auto b : all) {
      ids.push_back(add_index(b / previous, IndexKind::Spatial));
      previous = b;
    }
    assign(input_, input_dims(), i0, i1, all, ids);
    assign(output_, output_dims(), j0, j1, all, ids);
  }

  // Gives each non-unit dim of a stretch the pieces between its previous boundary and its own.
  static void assign(const Shape& shape, OperandDims& dims, std::size_t begin, std::size_t end,
                     const std::vector<std::int64_t>& all, const std::vector<int>& ids) {
    std::int64_t product = 1;
    std::size_t piece = 0;
    for (std::size_t d = begin; d < end; ++d) {
      if (shape[d] == 1) continue;
      product *= shape[d];
      while (piece < all.size() && all[piece] <= product) dims[d].push_back(ids[piece++]);
    }
  }

  void whole_stretch(std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) {
    for (std::size_t d = i0; d < i1; ++d) {
      if (input_[d] != 1) input_dims()[d] = {add_index(input_[d], IndexKind::Whole)};
    }
    for (std::size_t d = j0; d < j1; ++d) {
      if (output_[d] != 1) output_dims()[d] = {add_index(output_[d], IndexKind::Whole)};
    }
  }

  const Shape& input_;
  const Shape& output_;
  DimRule rule_;
  int spatial_count_ = 0;
  int whole_count_ = 0;
};

}  // namespace

DimRule factorise_reshape(const Shape& input, const Shape& output) { return Factoriser(input, output).run(); }

}  // namespace shardwise::ops
