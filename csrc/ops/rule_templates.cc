#include "ops/rule_templates.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "ops/einsum_rule.h"
#include "ops/reshape_factorisation.h"
#include "support/error.h"

namespace shardwise::ops {
namespace {

using ir::AttrValue;
using Ints = std::vector<std::int64_t>;

[[noreturn]] void fail(const std::string& message) { throw support::ValidationError(message); }

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ",")); }

std::int64_t product(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// A dim argument against a rank, negative dims counting from the end.
int normalise_dim(std::int64_t dim, int rank) {
  if (dim < -rank || dim >= rank) fail(fmt::format("dim {} is out of range for rank {}", dim, rank));
  return static_cast<int>(dim < 0 ? dim + rank : dim);
}

// ---- bound arguments -------------------------------------------------------

struct TemplateDef;

// The arguments of one template call on one node: each parameter's value is the named
// attribute, else the rule's literal, else the template's default.
class Args {
 public:
  Args(const TemplateDef& def, const TemplateCall& call, const ir::Attributes& attrs)
      : def_(def), call_(call), attrs_(attrs) {}

  std::optional<AttrValue> get(std::size_t p) const;
  // An explicit none (the attribute, the rule's literal or the template's default). A
  // parameter with no value at all is not none: reading it reports it missing.
  bool is_none(std::size_t p) const {
    auto v = get(p);
    return v && std::holds_alternative<ir::NoneAttr>(*v);
  }
  std::int64_t integer(std::size_t p) const {
    auto v = require(p);
    if (auto* i = std::get_if<std::int64_t>(&v)) return *i;
    if (auto* b = std::get_if<bool>(&v)) return *b ? 1 : 0;
    fail(fmt::format("{} must be an integer, not {}", describe(p), ir::attr_str(v)));
  }
  double number(std::size_t p) const {
    auto v = require(p);
    if (auto* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
    if (auto* d = std::get_if<double>(&v)) return *d;
    fail(fmt::format("{} must be a number, not {}", describe(p), ir::attr_str(v)));
  }
  bool boolean(std::size_t p) const {
    auto v = require(p);
    if (auto* b = std::get_if<bool>(&v)) return *b;
    if (auto* i = std::get_if<std::int64_t>(&v)) return *i != 0;
    fail(fmt::format("{} must be a bool, not {}", describe(p), ir::attr_str(v)));
  }
  Ints ints(std::size_t p) const {
    auto v = require(p);
    if (auto* list = std::get_if<Ints>(&v)) return *list;
    if (auto* i = std::get_if<std::int64_t>(&v)) return {*i};
    fail(fmt::format("{} must be a list of integers, not {}", describe(p), ir::attr_str(v)));
  }
  std::optional<Ints> optional_ints(std::size_t p) const {
    if (is_none(p)) return std::nullopt;
    return ints(p);
  }
  std::string string(std::size_t p) const {
    auto v = require(p);
    if (auto* s = std::get_if<std::string>(&v)) return *s;
    fail(fmt::format("{} must be a string, not {}", describe(p), ir::attr_str(v)));
  }

 private:
  AttrValue require(std::size_t p) const {
    auto v = get(p);
    if (!v) fail(fmt::format("{} is missing", describe(p)));
    return *v;
  }
  std::string describe(std::size_t p) const;

  const TemplateDef& def_;
  const TemplateCall& call_;
  const ir::Attributes& attrs_;
};

// ---- building rules --------------------------------------------------------

class Builder {
 public:
  int add(std::string label, std::int64_t size, IndexKind kind = IndexKind::Spatial,
          Reduction reduction = Reduction::Sum) {
    rule.indices.push_back(Index{std::move(label), size, kind, reduction});
    return static_cast<int>(rule.indices.size()) - 1;
  }
  // A new index labelled stem + a counter ("d0", "W3").
  int fresh(char stem, std::int64_t size, IndexKind kind = IndexKind::Spatial, Reduction reduction = Reduction::Sum) {
    return add(fmt::format("{}{}", stem, counters_[stem]++), size, kind, reduction);
  }
  // A Whole index for a dim only one operand has; a unit dim needs none.
  DimIndices whole_or_unit(std::int64_t size) {
    if (size == 1) return {};
    return {fresh('W', size, IndexKind::Whole)};
  }
  std::int64_t size(const DimIndices& dims) const { return rule.dims_size(dims); }
  // Each dim of an operand the op reads for metadata only: a Spatial index no output carries.
  OperandDims metadata(const Shape& shape, std::size_t operand) {
    OperandDims out;
    for (std::size_t d = 0; d < shape.size(); ++d) out.push_back({add(fmt::format("m{}.{}", operand, d), shape[d])});
    return out;
  }
  // `shape` right-aligned against `reference`: a dim of the reference's size takes its
  // indices, a unit dim broadcasts, any other size gets a Whole index of its own (lenient)
  // or the reference's indices so the shape check reports it (strict).
  OperandDims align(const OperandDims& reference, const Shape& shape, bool strict) {
    OperandDims out;
    const auto offset = static_cast<std::ptrdiff_t>(reference.size()) - static_cast<std::ptrdiff_t>(shape.size());
    for (std::size_t d = 0; d < shape.size(); ++d) {
      const auto r = static_cast<std::ptrdiff_t>(d) + offset;
      if (r < 0) {
        out.push_back(strict ? DimIndices{fresh('W', shape[d], IndexKind::Whole)} : whole_or_unit(shape[d]));
        continue;
      }
      const auto& ids = reference[static_cast<std::size_t>(r)];
      if (size(ids) == shape[d]) {
        out.push_back(ids);
      } else if (shape[d] == 1) {
        out.push_back({});
      } else {
        out.push_back(strict ? ids : whole_or_unit(shape[d]));
      }
    }
    return out;
  }

  DimRule rule;

 private:
  std::map<char, int> counters_;
};

// The replicate-only rule of a node whose output shape depends on data (or on every
// dim at once): every dim of every operand and of output 0 is Whole. Needs the node's
// own output shape, so it is only available when checking a node.
DimRule all_whole_rule(const RuleOperands& ops) {
  Builder b;
  for (std::size_t i = 0; i < ops.inputs.size(); ++i) {
    OperandDims dims;
    for (auto s : ops.input_shape(i)) dims.push_back(b.whole_or_unit(s));
    b.rule.inputs.push_back(std::move(dims));
  }
  OperandDims out;
  for (auto s : *ops.output_shape(0)) out.push_back(b.whole_or_unit(s));
  b.rule.outputs.push_back(std::move(out));
  return std::move(b.rule);
}

// The shape output `o` is built with: the node's own in check mode, else `computed`.
std::optional<Shape> out_shape(const RuleOperands& ops, std::size_t o, const std::optional<Shape>& computed) {
  if (ops.outputs_known) return *ops.output_shape(o);
  return computed;
}

std::optional<Shape> broadcast_shapes(const std::vector<const Shape*>& shapes) {
  std::size_t rank = 0;
  for (const auto* s : shapes) rank = std::max(rank, s->size());
  Shape out(rank, 1);
  for (const auto* s : shapes) {
    for (std::size_t d = 0; d < s->size(); ++d) {
      auto& o = out[rank - s->size() + d];
      const auto v = (*s)[d];
      if (v == 1 || v == o) continue;
      if (o != 1) return std::nullopt;
      o = v;
    }
  }
  return out;
}

std::vector<const Shape*> input_shapes(const RuleOperands& ops, std::size_t begin = 0, std::size_t end = SIZE_MAX) {
  std::vector<const Shape*> out;
  for (std::size_t i = begin; i < std::min(end, ops.inputs.size()); ++i) out.push_back(&ops.input_shape(i));
  return out;
}

// Every input broadcast against `result`; every output `result` (the shape check compares).
DimRule broadcast_rule(const RuleOperands& ops, const Shape& result) {
  Builder b;
  OperandDims dims;
  for (auto d : result) dims.push_back({b.fresh('d', d)});
  for (std::size_t i = 0; i < ops.inputs.size(); ++i) b.rule.inputs.push_back(b.align(dims, ops.input_shape(i), true));
  for (int o = 0; o < ops.output_count; ++o) {
    const Shape* shape = ops.output_shape(static_cast<std::size_t>(o));
    b.rule.outputs.push_back(shape ? b.align(dims, *shape, true) : dims);
  }
  return std::move(b.rule);
}

// ---- the templates ---------------------------------------------------------

using Build = std::optional<DimRule> (*)(const Args&, const RuleOperands&);

std::optional<DimRule> elementwise(const Args&, const RuleOperands& ops) {
  auto computed = broadcast_shapes(input_shapes(ops));
  if (!computed && ops.outputs_known) {
    std::vector<std::string> shapes;
    for (const auto* s : input_shapes(ops)) shapes.push_back(shape_str(*s));
    fail(fmt::format("inputs {} do not broadcast", fmt::join(shapes, ", ")));
  }
  auto result = ops.output_count > 0 ? out_shape(ops, 0, computed) : computed;
  if (!result) return std::nullopt;
  return broadcast_rule(ops, *result);
}

std::optional<DimRule> expand(const Args& args, const RuleOperands& ops) {
  std::optional<Shape> computed;
  if (!args.is_none(0)) {
    Shape size = args.ints(0);
    const Shape& in = ops.input_shape(0);
    if (size.size() < in.size())
      fail(fmt::format("expand to {} has fewer dims than {}", shape_str(size), shape_str(in)));
    for (std::size_t d = 0; d < in.size(); ++d) {
      auto& s = size[size.size() - in.size() + d];
      if (s == -1) s = in[d];
    }
    computed = size;
  }
  auto result = out_shape(ops, 0, computed);
  if (!result) return std::nullopt;
  return broadcast_rule(ops, *result);
}

// Dims listed by parameter 0 (none or [] = all) of a tensor of rank `rank`.
std::set<int> listed_dims(const Args& args, std::size_t p, int rank) {
  std::set<int> out;
  auto dims = args.optional_ints(p);
  if (!dims || dims->empty()) {
    for (int d = 0; d < rank; ++d) out.insert(d);
    return out;
  }
  for (auto d : *dims) {
    if (rank == 0 && (d == 0 || d == -1)) continue;  // torch lets a scalar name dim 0 / -1
    out.insert(normalise_dim(d, rank));
  }
  return out;
}

// A `statistics` parameter (ops::Index::statistics): how many per-row statistics the op
// combines across ranks when one of its Whole indices is split; 0 = not splittable. The
// bound only catches typos in the table: no normalisation keeps dozens of values per row.
int statistics_arg(const Args& args, std::size_t p) {
  const auto n = args.integer(p);
  if (n < 0 || n > 64) fail(fmt::format("statistics {} must be between 0 and 64", n));
  return static_cast<int>(n);
}

std::optional<DimRule> whole_impl(const Args& args, const RuleOperands& ops, bool resized, int statistics) {
  const Shape& in = ops.input_shape(0);
  const int rank = static_cast<int>(in.size());
  const auto listed = listed_dims(args, 0, rank);
  Builder b;
  OperandDims dims;
  for (int d = 0; d < rank; ++d) {
    const bool whole = listed.count(d) > 0;
    dims.push_back(
        {b.fresh(whole ? 'W' : 'd', in[static_cast<std::size_t>(d)], whole ? IndexKind::Whole : IndexKind::Spatial)});
    if (whole) b.rule.indices.back().statistics = statistics;
  }
  // Other operands: the listed dims take the input's index when the sizes agree, an index
  // of their own otherwise; the rest broadcast.
  auto map = [&](const Shape& shape) {
    OperandDims out = b.align(dims, shape, true);
    const int offset = rank - static_cast<int>(shape.size());
    for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
      const int r = d + offset;
      if (r >= 0 && listed.count(r) && shape[static_cast<std::size_t>(d)] != in[static_cast<std::size_t>(r)]) {
        out[static_cast<std::size_t>(d)] = b.whole_or_unit(shape[static_cast<std::size_t>(d)]);
      }
    }
    return out;
  };
  b.rule.inputs.push_back(dims);
  for (std::size_t i = 1; i < ops.inputs.size(); ++i) b.rule.inputs.push_back(map(ops.input_shape(i)));
  for (int o = 0; o < ops.output_count; ++o) {
    const Shape* shape = ops.output_shape(static_cast<std::size_t>(o));
    if (!shape && resized) return std::nullopt;
    b.rule.outputs.push_back(shape ? map(*shape) : dims);
  }
  return std::move(b.rule);
}

std::optional<DimRule> whole(const Args& args, const RuleOperands& ops) {
  return whole_impl(args, ops, false, statistics_arg(args, 1));
}
std::optional<DimRule> whole_resized(const Args& args, const RuleOperands& ops) {
  return whole_impl(args, ops, true, 0);
}

std::optional<DimRule> reduce_impl(const Args& args, const RuleOperands& ops, IndexKind kind, Reduction reduction) {
  const Shape& in = ops.input_shape(0);
  const int rank = static_cast<int>(in.size());
  const auto reduced = listed_dims(args, 0, rank);
  const bool keepdim = args.boolean(1);
  Builder b;
  OperandDims in_dims, out_dims;
  for (int d = 0; d < rank; ++d) {
    const auto size = in[static_cast<std::size_t>(d)];
    if (reduced.count(d)) {
      in_dims.push_back({b.fresh(kind == IndexKind::Whole ? 'W' : 'r', size, kind, reduction)});
      if (keepdim) out_dims.push_back({});
    } else {
      in_dims.push_back({b.fresh('d', size)});
      out_dims.push_back(in_dims.back());
    }
  }
  b.rule.inputs.push_back(in_dims);
  // Further inputs (rare: a weight) broadcast against the input.
  for (std::size_t i = 1; i < ops.inputs.size(); ++i)
    b.rule.inputs.push_back(b.align(in_dims, ops.input_shape(i), true));
  for (int o = 0; o < ops.output_count; ++o) b.rule.outputs.push_back(out_dims);
  return std::move(b.rule);
}

std::optional<DimRule> reduce_sum(const Args& a, const RuleOperands& o) {
  return reduce_impl(a, o, IndexKind::Reduced, Reduction::Sum);
}
std::optional<DimRule> reduce_mean(const Args& a, const RuleOperands& o) {
  return reduce_impl(a, o, IndexKind::Reduced, Reduction::Mean);
}
std::optional<DimRule> reduce_max(const Args& a, const RuleOperands& o) {
  return reduce_impl(a, o, IndexKind::Reduced, Reduction::Max);
}
std::optional<DimRule> reduce_min(const Args& a, const RuleOperands& o) {
  return reduce_impl(a, o, IndexKind::Reduced, Reduction::Min);
}
std::optional<DimRule> reduce_whole(const Args& a, const RuleOperands& o) {
  return reduce_impl(a, o, IndexKind::Whole, Reduction::Sum);
}

// Input dims reordered: output dim k is input dim order[k].
DimRule permuted(const RuleOperands& ops, const std::vector<int>& order) {
  const Shape& in = ops.input_shape(0);
  Builder b;
  OperandDims in_dims;
  for (auto size : in) in_dims.push_back({b.fresh('d', size)});
  OperandDims out_dims;
  for (int d : order) out_dims.push_back(in_dims[static_cast<std::size_t>(d)]);
  b.rule.inputs.push_back(std::move(in_dims));
  for (int o = 0; o < ops.output_count; ++o) b.rule.outputs.push_back(out_dims);
  return std::move(b.rule);
}

std::optional<DimRule> transpose(const Args& args, const RuleOperands& ops) {
  const int rank = ops.input_rank(0);
  std::vector<int> order(static_cast<std::size_t>(rank));
  for (int d = 0; d < rank; ++d) order[static_cast<std::size_t>(d)] = d;
  if (rank >= 2) {
    std::swap(order[static_cast<std::size_t>(normalise_dim(args.integer(0), rank))],
              order[static_cast<std::size_t>(normalise_dim(args.integer(1), rank))]);
  }
  return permuted(ops, order);
}

std::optional<DimRule> permute(const Args& args, const RuleOperands& ops) {
  const int rank = ops.input_rank(0);
  if (args.is_none(0)) {  // numpy's .T: every dim, reversed
    std::vector<int> order;
    for (int q = rank - 1; q >= 0; --q) order.push_back(q);
    return permuted(ops, order);
  }
  const auto dims = args.ints(0);
  if (static_cast<int>(dims.size()) != rank) {
    fail(fmt::format("permute dims [{}] do not match rank {}", fmt::join(dims, ","), rank));
  }
  std::vector<int> order;
  std::set<int> seen;
  for (auto d : dims) {
    order.push_back(normalise_dim(d, rank));
    if (!seen.insert(order.back()).second) fail(fmt::format("permute dims [{}] repeat a dim", fmt::join(dims, ",")));
  }
  return permuted(ops, order);
}

// Reshapes: the expected output shape from the attributes (when they tell), then the
// factorisation between the input and the node's (or expected) output shape.
std::optional<DimRule> reshape_to(const RuleOperands& ops, const std::optional<Shape>& computed) {
  auto result = out_shape(ops, 0, computed);
  if (!result) return std::nullopt;
  // A second input (view_as, reshape_as) only lends its shape.
  Builder b;
  b.rule = factorise_reshape(ops.input_shape(0), *result);
  for (std::size_t i = 1; i < ops.inputs.size(); ++i) b.rule.inputs.push_back(b.metadata(ops.input_shape(i), i));
  return std::move(b.rule);
}

std::optional<DimRule> reshape(const Args& args, const RuleOperands& ops) {
  std::optional<Shape> computed;
  if (!args.is_none(0)) {
    Shape size = args.ints(0);
    const auto minus = std::count(size.begin(), size.end(), -1);
    if (minus > 1) fail(fmt::format("view size {} has more than one -1", shape_str(size)));
    if (minus == 1) {
      std::int64_t known = 1;
      for (auto s : size) known *= s == -1 ? 1 : s;
      *std::find(size.begin(), size.end(), -1) = known == 0 ? 0 : product(ops.input_shape(0)) / known;
    }
    computed = size;
  } else if (ops.inputs.size() > 1) {
    computed = ops.input_shape(1);
  }
  return reshape_to(ops, computed);
}

std::optional<DimRule> flatten(const Args& args, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  const int rank = static_cast<int>(in.size());
  if (rank == 0) return reshape_to(ops, Shape{1});
  const int start = normalise_dim(args.integer(0), rank), end = normalise_dim(args.integer(1), rank);
  if (start > end) fail(fmt::format("flatten start_dim {} is after end_dim {}", start, end));
  Shape out(in.begin(), in.begin() + start);
  std::int64_t merged = 1;
  for (int d = start; d <= end; ++d) merged *= in[static_cast<std::size_t>(d)];
  out.push_back(merged);
  out.insert(out.end(), in.begin() + end + 1, in.end());
  return reshape_to(ops, out);
}

std::optional<DimRule> unflatten(const Args& args, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  const int d = normalise_dim(args.integer(0), static_cast<int>(in.size()));
  Shape sizes = args.ints(1);
  if (auto it = std::find(sizes.begin(), sizes.end(), -1); it != sizes.end()) {
    std::int64_t known = 1;
    for (auto s : sizes) known *= s == -1 ? 1 : s;
    *it = known == 0 ? 0 : in[static_cast<std::size_t>(d)] / known;
  }
  Shape out(in.begin(), in.begin() + d);
  out.insert(out.end(), sizes.begin(), sizes.end());
  out.insert(out.end(), in.begin() + d + 1, in.end());
  return reshape_to(ops, out);
}

std::optional<DimRule> unsqueeze(const Args& args, const RuleOperands& ops) {
  Shape out = ops.input_shape(0);
  const int d = normalise_dim(args.integer(0), static_cast<int>(out.size()) + 1);
  out.insert(out.begin() + d, 1);
  return reshape_to(ops, out);
}

std::optional<DimRule> squeeze(const Args& args, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  const auto listed = listed_dims(args, 0, static_cast<int>(in.size()));
  Shape out;
  for (std::size_t d = 0; d < in.size(); ++d) {
    if (!(listed.count(static_cast<int>(d)) && in[d] == 1)) out.push_back(in[d]);
  }
  return reshape_to(ops, out);
}

// One dim of input 0 changes size (slice, narrow, pad): every other dim passes through; the
// changed dim is Whole on both sides unless its size is kept.
DimRule resized_dims(const RuleOperands& ops, const Shape& out) {
  const Shape& in = ops.input_shape(0);
  Builder b;
  OperandDims in_dims, out_dims;
  for (std::size_t d = 0; d < in.size(); ++d) {
    if (d < out.size() && in[d] == out[d]) {
      in_dims.push_back({b.fresh('d', in[d])});
      out_dims.push_back(in_dims.back());
    } else {
      in_dims.push_back(b.whole_or_unit(in[d]));
      out_dims.push_back(d < out.size() ? b.whole_or_unit(out[d]) : DimIndices{});
    }
  }
  b.rule.inputs.push_back(std::move(in_dims));
  for (std::size_t i = 1; i < ops.inputs.size(); ++i) b.rule.inputs.push_back(b.metadata(ops.input_shape(i), i));
  b.rule.outputs.push_back(std::move(out_dims));
  return std::move(b.rule);
}

std::optional<DimRule> slice(const Args& args, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  const int d = normalise_dim(args.integer(0), static_cast<int>(in.size()));
  const auto n = in[static_cast<std::size_t>(d)];
  auto bound = [&](std::size_t p, std::int64_t fallback) {
    std::int64_t v = args.is_none(p) ? fallback : args.integer(p);
    if (v < 0) v += n;
    return std::clamp<std::int64_t>(v, 0, n);
  };
  const auto start = bound(1, 0), end = bound(2, n), step = args.integer(3);
  if (step <= 0) fail(fmt::format("slice step {} must be positive", step));
  Shape computed = in;
  computed[static_cast<std::size_t>(d)] = end > start ? (end - start + step - 1) / step : 0;
  auto result = out_shape(ops, 0, computed);
  return resized_dims(ops, *result);
}

std::optional<DimRule> narrow(const Args& args, const RuleOperands& ops) {
  Shape computed = ops.input_shape(0);
  computed[static_cast<std::size_t>(normalise_dim(args.integer(0), static_cast<int>(computed.size())))] =
      args.integer(1);
  return resized_dims(ops, *out_shape(ops, 0, computed));
}

std::optional<DimRule> pad(const Args& args, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  const auto pads = args.ints(0);
  if (pads.size() % 2 != 0 || pads.size() / 2 > in.size()) {
    fail(fmt::format("pad [{}] does not fit rank {}", fmt::join(pads, ","), in.size()));
  }
  Shape computed = in;
  for (std::size_t k = 0; k < pads.size() / 2; ++k) computed[in.size() - 1 - k] += pads[2 * k] + pads[2 * k + 1];
  return resized_dims(ops, *out_shape(ops, 0, computed));
}

// The dims of a tensor of `shape` with dim `d` Whole (`all`), and its other dims alone
// (`others`): what it shares with a tensor that lacks `d`, as select's output.
struct OneDimWhole {
  OperandDims all;
  OperandDims others;
};

OneDimWhole one_dim_whole(Builder& b, const Shape& shape, int d) {
  OneDimWhole out;
  for (int k = 0; k < static_cast<int>(shape.size()); ++k) {
    const auto size = shape[static_cast<std::size_t>(k)];
    if (k == d) {
      out.all.push_back(b.whole_or_unit(size));
    } else {
      out.all.push_back({b.fresh('d', size)});
      out.others.push_back(out.all.back());
    }
  }
  return out;
}

std::optional<DimRule> select(const Args& args, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  const int d = normalise_dim(args.integer(0), static_cast<int>(in.size()));
  Builder b;
  auto [in_dims, out_dims] = one_dim_whole(b, in, d);
  b.rule.inputs.push_back(std::move(in_dims));
  b.rule.outputs.push_back(std::move(out_dims));
  return std::move(b.rule);
}

// select_scatter(self, src, dim, index): self with its slice at `index` of `dim` replaced
// by src (self's shape without `dim`): the functional form of `self[:, t] = src`. The dim is
// Whole (its positions are addressed); every other dim is shared with src.
std::optional<DimRule> select_scatter(const Args& args, const RuleOperands& ops) {
  const Shape& self = ops.input_shape(0);
  const int d = normalise_dim(args.integer(0), static_cast<int>(self.size()));
  if (ops.input_shape(1).size() + 1 != self.size())
    fail(fmt::format("select_scatter of {} along dim {} takes a source of {} dims", shape_str(self), d,
                     self.size() - 1));
  Builder b;
  auto [self_dims, src_dims] = one_dim_whole(b, self, d);
  b.rule.inputs.push_back(self_dims);
  b.rule.inputs.push_back(std::move(src_dims));
  b.rule.outputs.push_back(std::move(self_dims));
  return std::move(b.rule);
}

// Joining (cat) or parting (split) tensors along one dim. `whole` has the joined dim; each
// of `parts` has its piece of it (or lacks the dim when `parts_drop_dim`, as stack and
// unbind). Equal pieces make the whole dim (P c), P Whole over the parts, c Spatial.
struct JoinedRule {
  OperandDims whole;
  std::vector<OperandDims> parts;
};

JoinedRule joined(Builder& b, const Shape& whole, const std::vector<Shape>& parts, int d, bool parts_drop_dim) {
  JoinedRule out;
  if (d < 0 || static_cast<std::size_t>(d) >= whole.size()) {
    fail(fmt::format("dim {} is out of range for the joined tensor {}", d, shape_str(whole)));
  }
  const auto n = static_cast<std::int64_t>(parts.size());
  OperandDims dims;
  for (std::size_t k = 0; k < whole.size(); ++k) {
    dims.push_back(static_cast<int>(k) == d ? DimIndices{} : DimIndices{b.fresh('d', whole[k])});
  }
  bool equal = n >= 2;
  for (const auto& part : parts) {
    equal = equal && !parts_drop_dim && static_cast<std::size_t>(d) < part.size() &&
            static_cast<std::size_t>(d) < parts[0].size() &&
            part[static_cast<std::size_t>(d)] == parts[0][static_cast<std::size_t>(d)] &&
            part[static_cast<std::size_t>(d)] * n == whole[static_cast<std::size_t>(d)];
  }
  const auto whole_size = whole[static_cast<std::size_t>(d)];
  int piece = -1;
  if (equal && whole_size / n > 1) {
    const int p = b.add("P", n, IndexKind::Whole);
    piece = b.add("c", whole_size / n);
    dims[static_cast<std::size_t>(d)] = {p, piece};
  } else if (parts.size() == 1 && !parts_drop_dim && parts[0].size() == whole.size() &&
             parts[0][static_cast<std::size_t>(d)] == whole_size) {
    piece = b.fresh('d', whole_size);
    dims[static_cast<std::size_t>(d)] = {piece};
  } else if (parts_drop_dim && whole_size > 1) {
    dims[static_cast<std::size_t>(d)] = {b.add("P", whole_size, IndexKind::Whole)};
  } else {
    dims[static_cast<std::size_t>(d)] = b.whole_or_unit(whole_size);
  }
  out.whole = dims;
  for (const auto& part : parts) {
    OperandDims part_dims;
    for (std::size_t k = 0; k < whole.size(); ++k) {
      if (static_cast<int>(k) == d) {
        if (parts_drop_dim) continue;
        const auto size = k < part.size() ? part[k] : 1;
        part_dims.push_back(piece >= 0 && b.size({piece}) == size ? DimIndices{piece} : b.whole_or_unit(size));
      } else {
        part_dims.push_back(dims[k]);
      }
    }
    out.parts.push_back(std::move(part_dims));
  }
  return out;
}

std::optional<DimRule> cat(const Args& args, const RuleOperands& ops) {
  // Legacy: torch.cat skips 1-D empty tensors among higher-rank ones.
  int rank = 0;
  for (std::size_t i = 0; i < ops.inputs.size(); ++i) {
    const auto& s = ops.input_shape(i);
    if (!(s.size() == 1 && s[0] == 0)) rank = std::max(rank, static_cast<int>(s.size()));
  }
  if (rank == 0) rank = 1;
  const int d = normalise_dim(args.integer(0), rank);
  std::vector<Shape> parts;
  std::vector<bool> skipped;
  Shape computed;
  for (std::size_t i = 0; i < ops.inputs.size(); ++i) {
    const auto& s = ops.input_shape(i);
    const bool skip = static_cast<int>(s.size()) != rank && s.size() == 1 && s[0] == 0;
    skipped.push_back(skip);
    if (skip) continue;
    if (static_cast<int>(s.size()) != rank) fail(fmt::format("cat input {} has rank {}, not {}", i, s.size(), rank));
    parts.push_back(s);
    if (computed.empty()) {
      computed = s;
    } else {
      computed[static_cast<std::size_t>(d)] += s[static_cast<std::size_t>(d)];
    }
  }
  auto result = out_shape(ops, 0, computed);
  Builder b;
  auto j = joined(b, *result, parts, d, false);
  std::size_t next = 0;
  for (std::size_t i = 0; i < ops.inputs.size(); ++i) {
    b.rule.inputs.push_back(skipped[i] ? OperandDims{DimIndices{b.fresh('W', 0, IndexKind::Whole)}} : j.parts[next++]);
  }
  b.rule.outputs.push_back(j.whole);
  return std::move(b.rule);
}

std::optional<DimRule> stack(const Args& args, const RuleOperands& ops) {
  const Shape& first = ops.input_shape(0);
  const int d = normalise_dim(args.integer(0), static_cast<int>(first.size()) + 1);
  Shape computed = first;
  computed.insert(computed.begin() + d, static_cast<std::int64_t>(ops.inputs.size()));
  auto result = out_shape(ops, 0, computed);
  std::vector<Shape> parts;
  for (std::size_t i = 0; i < ops.inputs.size(); ++i) parts.push_back(ops.input_shape(i));
  Builder b;
  auto j = joined(b, *result, parts, d, true);
  b.rule.inputs = j.parts;
  b.rule.outputs.push_back(j.whole);
  return std::move(b.rule);
}

// The parts of a split along dim d: the node's outputs, or `sizes` in infer mode.
std::optional<DimRule> split_into(const RuleOperands& ops, int d, const std::optional<std::vector<std::int64_t>>& sizes,
                                  bool drop_dim) {
  const Shape& in = ops.input_shape(0);
  std::vector<Shape> parts;
  if (ops.outputs_known) {
    for (int o = 0; o < ops.output_count; ++o) parts.push_back(*ops.output_shape(static_cast<std::size_t>(o)));
  } else {
    if (!sizes) return std::nullopt;
    if (static_cast<int>(sizes->size()) != ops.output_count) {
      fail(fmt::format("the split gives {} parts, the node has {} outputs", sizes->size(), ops.output_count));
    }
    for (auto size : *sizes) {
      Shape part = in;
      if (drop_dim) {
        part.erase(part.begin() + d);
      } else {
        part[static_cast<std::size_t>(d)] = size;
      }
      parts.push_back(part);
    }
  }
  Builder b;
  auto j = joined(b, in, parts, d, drop_dim);
  b.rule.inputs.push_back(j.whole);
  b.rule.outputs = j.parts;
  return std::move(b.rule);
}

std::optional<DimRule> split(const Args& args, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  const int d = normalise_dim(args.integer(1), static_cast<int>(in.size()));
  const auto n = in[static_cast<std::size_t>(d)], size = args.integer(0);
  std::vector<std::int64_t> sizes;
  if (size <= 0) fail(fmt::format("split_size {} must be positive", size));
  for (std::int64_t at = 0; at < n; at += size) sizes.push_back(std::min(size, n - at));
  if (sizes.empty()) sizes.push_back(0);
  return split_into(ops, d, sizes, false);
}

std::optional<DimRule> split_sizes(const Args& args, const RuleOperands& ops) {
  const int d = normalise_dim(args.integer(1), ops.input_rank(0));
  return split_into(ops, d, args.ints(0), false);
}

std::optional<DimRule> chunk(const Args& args, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  const int d = normalise_dim(args.integer(1), static_cast<int>(in.size()));
  const auto n = in[static_cast<std::size_t>(d)], chunks = args.integer(0);
  if (chunks <= 0) fail(fmt::format("chunks {} must be positive", chunks));
  const auto size = (n + chunks - 1) / chunks;
  std::vector<std::int64_t> sizes;
  for (std::int64_t at = 0; at < n; at += size) sizes.push_back(std::min(size, n - at));
  if (sizes.empty()) sizes.push_back(0);
  return split_into(ops, d, sizes, false);
}

std::optional<DimRule> unbind(const Args& args, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  const int d = normalise_dim(args.integer(0), static_cast<int>(in.size()));
  return split_into(ops, d, std::vector<std::int64_t>(static_cast<std::size_t>(in[static_cast<std::size_t>(d)]), 1),
                    true);
}

std::optional<DimRule> index_select(const Args& args, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  const int d = normalise_dim(args.integer(0), std::max<int>(1, static_cast<int>(in.size())));
  const Shape& index = ops.input_shape(1);
  const std::int64_t picked = index.empty() ? 1 : index[0];
  Shape computed = in;
  if (!computed.empty()) computed[static_cast<std::size_t>(d)] = picked;
  auto result = out_shape(ops, 0, computed);
  Builder b;
  OperandDims in_dims, out_dims;
  const DimIndices k = picked == 1 ? DimIndices{} : DimIndices{b.add("k", picked)};
  for (int q = 0; q < static_cast<int>(in.size()); ++q) {
    const auto size = in[static_cast<std::size_t>(q)];
    if (q == d) {
      in_dims.push_back(b.whole_or_unit(size));
      if (!in_dims.back().empty()) b.rule.indices[static_cast<std::size_t>(in_dims.back().front())].lookup = true;
      out_dims.push_back(k);
    } else {
      in_dims.push_back({b.fresh('d', size)});
      out_dims.push_back(in_dims.back());
    }
  }
  b.rule.inputs.push_back(std::move(in_dims));
  b.rule.inputs.push_back(index.empty() ? OperandDims{} : OperandDims{k});
  b.rule.outputs.push_back(result->size() == out_dims.size() ? out_dims : b.align(out_dims, *result, true));
  return std::move(b.rule);
}

// aten::embedding(weight [V, e], ids [...]) -> [..., e]: each id picks a row of the weight.
std::optional<DimRule> embedding(const Args&, const RuleOperands& ops) {
  const Shape& weight = ops.input_shape(0);
  const Shape& ids = ops.input_shape(1);
  if (weight.size() != 2) fail(fmt::format("embedding weight must be 2-D, got {} dims", weight.size()));
  Shape computed = ids;
  computed.push_back(weight[1]);
  auto result = out_shape(ops, 0, computed);
  Builder b;
  const int v = b.add("V", weight[0], IndexKind::Whole);
  b.rule.indices[static_cast<std::size_t>(v)].lookup = true;
  const int e = b.add("e", weight[1]);
  OperandDims id_dims;
  for (std::size_t q = 0; q < ids.size(); ++q) id_dims.push_back({b.add(fmt::format("_{}", q), ids[q])});
  OperandDims out_dims = id_dims;
  out_dims.push_back({e});
  b.rule.inputs = {{{v}, {e}}, id_dims};
  b.rule.outputs.push_back(result->size() == out_dims.size() ? out_dims : b.align(out_dims, *result, true));
  return std::move(b.rule);
}

std::optional<DimRule> gather(const Args& args, const RuleOperands& ops) {
  const Shape& self = ops.input_shape(0);
  const Shape& index = ops.input_shape(1);
  const int d = normalise_dim(args.integer(0), std::max<int>(1, static_cast<int>(self.size())));
  Builder b;
  OperandDims self_dims, index_dims;
  for (std::size_t q = 0; q < index.size(); ++q) {
    index_dims.push_back({b.fresh('d', index[q])});
    const bool shared = static_cast<int>(q) != d && q < self.size() && self[q] == index[q];
    self_dims.push_back(shared ? index_dims.back() : (q < self.size() ? b.whole_or_unit(self[q]) : DimIndices{}));
  }
  for (std::size_t q = index.size(); q < self.size(); ++q) self_dims.push_back(b.whole_or_unit(self[q]));
  b.rule.inputs = {self_dims, index_dims};
  b.rule.outputs.push_back(index_dims);
  return std::move(b.rule);
}

std::optional<DimRule> scatter(const Args& args, const RuleOperands& ops) {
  const Shape& self = ops.input_shape(0);
  const int d = normalise_dim(args.integer(0), std::max<int>(1, static_cast<int>(self.size())));
  Builder b;
  OperandDims self_dims;
  for (std::size_t q = 0; q < self.size(); ++q) {
    self_dims.push_back(static_cast<int>(q) == d ? b.whole_or_unit(self[q]) : DimIndices{b.fresh('d', self[q])});
  }
  b.rule.inputs.push_back(self_dims);
  for (std::size_t i = 1; i < ops.inputs.size(); ++i) {
    const Shape& s = ops.input_shape(i);
    OperandDims dims;
    for (std::size_t q = 0; q < s.size(); ++q) {
      const bool shared = static_cast<int>(q) != d && q < self.size() && s[q] == self[q] && s.size() == self.size();
      dims.push_back(shared ? self_dims[q] : b.whole_or_unit(s[q]));
    }
    b.rule.inputs.push_back(std::move(dims));
  }
  b.rule.outputs.push_back(self_dims);
  return std::move(b.rule);
}

// Which dims of `self` an advanced index reads: parameter 0 is the node's
// `indices_present` (both importers record it when `indices` holds a None: 1 where entry q
// is a tensor indexing dim q, 0 where a None keeps dim q). Without it the `count` tensors
// index the leading dims, as ATen reads a list with no None; nullopt when the list does
// not fit `self` (more tensors than dims, a count that disagrees with the operands).
std::optional<std::vector<std::size_t>> indexed_dims(const Args& args, std::size_t count, std::size_t rank) {
  std::vector<std::size_t> dims;
  if (args.is_none(0)) {
    for (std::size_t q = 0; q < count; ++q) dims.push_back(q);
  } else {
    const Ints present = args.ints(0);
    for (std::size_t q = 0; q < present.size(); ++q) {
      if (present[q] != 0) dims.push_back(q);
    }
    if (dims.size() != count) return std::nullopt;
  }
  if (!dims.empty() && dims.back() >= rank) return std::nullopt;
  return dims;
}

// Advanced indexing self[i0, i1, ...] (aten::index.Tensor) as numpy and ATen define it: the
// index tensors broadcast together; when the dims they index are adjacent
// (x[:, idx], Falcon's fused_qkv[..., [-2], :]) the broadcast dims replace them in place,
// otherwise (x[idx, :, idx2]) they go first, before every dim left unindexed. Which dims
// are indexed comes from `indices_present` (indexed_dims); without it, an old IR whose
// Nones were dropped, the run of indexed dims starts where it explains the output shape
// (in infer mode: at dim 0, which is right for a list with no None). A bool mask, or
// shapes nothing explains, gets an opaque rule: all Whole.
std::optional<DimRule> index(const Args& args, const RuleOperands& ops) {
  const Shape& self = ops.input_shape(0);
  const std::size_t k = ops.inputs.size() - 1;
  bool mask = false;
  for (std::size_t i = 1; i < ops.inputs.size(); ++i) {
    mask |= ops.inputs[i]->dtype == ir::DType::Bool || ops.inputs[i]->dtype == ir::DType::U8;
  }
  auto broadcast = broadcast_shapes(input_shapes(ops, 1));
  auto opaque = [&]() -> std::optional<DimRule> {
    if (!ops.outputs_known) return std::nullopt;
    return all_whole_rule(ops);
  };
  if (mask || !broadcast || k > self.size() || k == 0) return opaque();
  std::optional<std::vector<std::size_t>> dims;
  if (!args.is_none(0)) {
    dims = indexed_dims(args, k, self.size());
  } else {
    // No record of the Nones: the first run of k consecutive dims that explains the output.
    auto expected = [&](std::size_t start) {
      Shape out(self.begin(), self.begin() + static_cast<std::ptrdiff_t>(start));
      out.insert(out.end(), broadcast->begin(), broadcast->end());
      out.insert(out.end(), self.begin() + static_cast<std::ptrdiff_t>(start + k), self.end());
      return out;
    };
    for (std::size_t s = 0; s + k <= self.size() && !dims; ++s) {
      if (!ops.outputs_known || expected(s) == *ops.output_shape(0)) {
        dims.emplace();
        for (std::size_t q = s; q < s + k; ++q) dims->push_back(q);
      }
    }
  }
  if (!dims) return opaque();
  const bool adjacent = dims->back() - dims->front() + 1 == k;
  Builder b;
  OperandDims self_dims, out_dims, index_dims;
  for (auto size : *broadcast) index_dims.push_back({b.fresh('i', size)});
  if (!adjacent) out_dims = index_dims;
  for (std::size_t q = 0; q < self.size(); ++q) {
    if (std::find(dims->begin(), dims->end(), q) != dims->end()) {
      self_dims.push_back(b.whole_or_unit(self[q]));
      if (adjacent && q == dims->front()) out_dims.insert(out_dims.end(), index_dims.begin(), index_dims.end());
    } else {
      self_dims.push_back({b.fresh('d', self[q])});
      out_dims.push_back(self_dims.back());
    }
  }
  // Index operand j addresses self's dim dims[j] (a size-1 dim has no index to address).
  for (std::size_t j = 0; j < dims->size(); ++j)
    if (!self_dims[(*dims)[j]].empty())
      b.rule.addressed.push_back({static_cast<int>(j + 1), self_dims[(*dims)[j]].front()});
  b.rule.inputs.push_back(std::move(self_dims));
  for (std::size_t i = 1; i < ops.inputs.size(); ++i)
    b.rule.inputs.push_back(b.align(index_dims, ops.input_shape(i), true));
  b.rule.outputs.push_back(std::move(out_dims));
  return std::move(b.rule);
}

// self[indices] = values: the indexed dims of self (indexed_dims) Whole, the others
// Spatial and shared with the outputs; index and value operands Whole.
std::optional<DimRule> index_put(const Args& args, const RuleOperands& ops) {
  const Shape& self = ops.input_shape(0);
  const std::size_t k = ops.inputs.size() >= 2 ? ops.inputs.size() - 2 : 0;
  auto dims = indexed_dims(args, k, self.size());
  if (!dims) {
    if (!ops.outputs_known) return std::nullopt;
    return all_whole_rule(ops);
  }
  Builder b;
  OperandDims self_dims;
  for (std::size_t q = 0; q < self.size(); ++q) {
    const bool indexed = std::find(dims->begin(), dims->end(), q) != dims->end();
    self_dims.push_back(indexed ? b.whole_or_unit(self[q]) : DimIndices{b.fresh('d', self[q])});
  }
  b.rule.inputs.push_back(self_dims);
  for (std::size_t i = 1; i < ops.inputs.size(); ++i) {
    OperandDims dims_i;
    for (auto s : ops.input_shape(i)) dims_i.push_back(b.whole_or_unit(s));
    b.rule.inputs.push_back(std::move(dims_i));
  }
  for (int o = 0; o < ops.output_count; ++o) b.rule.outputs.push_back(self_dims);
  return std::move(b.rule);
}

// Channel dims of a (grouped) convolution: with g > 1 groups, channels are (g c/g).
DimIndices channel_dims(int groups_id, int per_group_id) {
  DimIndices dims;
  if (groups_id >= 0) dims.push_back(groups_id);
  if (per_group_id >= 0) dims.push_back(per_group_id);
  return dims;
}

std::optional<DimRule> conv(const Args& args, const RuleOperands& ops) {
  if (!ops.outputs_known) return std::nullopt;  // output windows depend on stride/padding/dilation
  const Shape& in = ops.input_shape(0);
  const Shape& weight = ops.input_shape(1);
  const auto groups = args.integer(0);
  const bool transposed = args.boolean(1);
  const int window = static_cast<int>(weight.size()) - 2;
  if (window < 0) fail(fmt::format("convolution weight {} has fewer than 2 dims", shape_str(weight)));
  const bool batched = static_cast<int>(in.size()) == window + 2;
  if (!batched && static_cast<int>(in.size()) != window + 1) {
    fail(fmt::format("convolution input {} does not fit weight {}", shape_str(in), shape_str(weight)));
  }
  const std::size_t c_at = batched ? 1 : 0;
  const Shape& out = *ops.output_shape(0);
  if (out.size() != in.size())
    fail(fmt::format("convolution output {} has another rank than input {}", shape_str(out), shape_str(in)));
  const auto in_channels = in[c_at], out_channels = out[c_at];
  if (groups <= 0 || in_channels % groups != 0 || out_channels % groups != 0) {
    fail(fmt::format("{} groups do not divide {} input and {} output channels", groups, in_channels, out_channels));
  }
  Builder b;
  const int n = batched ? b.add("n", in[0]) : -1;
  const int g = groups > 1 ? b.add("g", groups) : -1;
  const int ci = in_channels / groups > 1 ? b.add("c", in_channels / groups, IndexKind::Reduced) : -1;
  const int co = out_channels / groups > 1 ? b.add("o", out_channels / groups) : -1;
  OperandDims in_dims, weight_dims, out_dims;
  if (batched) {
    in_dims.push_back({n});
    out_dims.push_back({n});
  }
  in_dims.push_back(channel_dims(g, ci));
  out_dims.push_back(channel_dims(g, co));
  weight_dims.push_back(transposed ? channel_dims(g, ci) : channel_dims(g, co));
  weight_dims.push_back(transposed ? (co >= 0 ? DimIndices{co} : DimIndices{})
                                   : (ci >= 0 ? DimIndices{ci} : DimIndices{}));
  // Window dims (input, kernel, output) are unrelated sizes, each Whole.
  for (int w = 0; w < window; ++w) in_dims.push_back(b.whole_or_unit(in[c_at + 1 + static_cast<std::size_t>(w)]));
  for (int w = 0; w < window; ++w) weight_dims.push_back(b.whole_or_unit(weight[2 + static_cast<std::size_t>(w)]));
  for (int w = 0; w < window; ++w) out_dims.push_back(b.whole_or_unit(out[c_at + 1 + static_cast<std::size_t>(w)]));
  b.rule.inputs = {in_dims, weight_dims};
  if (ops.inputs.size() > 2) {
    b.rule.inputs.push_back({channel_dims(g, co)});  // the bias, added once
    b.rule.added.push_back(2);
  }
  b.rule.outputs.push_back(std::move(out_dims));
  return std::move(b.rule);
}

std::optional<DimRule> window(const Args& args, const RuleOperands& ops) {
  if (!ops.outputs_known) return std::nullopt;
  const Shape& in = ops.input_shape(0);
  const auto rank = static_cast<std::size_t>(args.integer(0));
  if (in.size() < rank) fail(fmt::format("pooling input {} has fewer than {} dims", shape_str(in), rank));
  const std::size_t lead = in.size() - rank;
  Builder b;
  OperandDims in_dims;
  for (std::size_t d = 0; d < in.size(); ++d) {
    in_dims.push_back(d < lead ? DimIndices{b.fresh('d', in[d])} : b.whole_or_unit(in[d]));
  }
  b.rule.inputs.push_back(in_dims);
  for (int o = 0; o < ops.output_count; ++o) {
    const Shape& out = *ops.output_shape(static_cast<std::size_t>(o));
    OperandDims dims;
    for (std::size_t d = 0; d < out.size(); ++d) dims.push_back(d < lead ? in_dims[d] : b.whole_or_unit(out[d]));
    b.rule.outputs.push_back(std::move(dims));
  }
  return std::move(b.rule);
}

// Normalisations: input 0's dims from `whole_from` on are Whole (normalised over); further
// inputs (weight, bias, running stats) align with input 0 from the right, or with its
// channel dim when `channel_params`; extra outputs (mean, rstd) align where they can.
// `statistics` goes on every normalised (Whole) index of input 0.
std::optional<DimRule> normalisation(const RuleOperands& ops, const std::vector<IndexKind>& leading_kinds,
                                     std::size_t whole_from, bool channel_params, const std::vector<Shape>& inferred,
                                     int statistics = 0) {
  const Shape& in = ops.input_shape(0);
  Builder b;
  OperandDims dims;
  for (std::size_t d = 0; d < in.size(); ++d) {
    const IndexKind kind = d < whole_from ? leading_kinds.at(d) : IndexKind::Whole;
    dims.push_back({b.fresh(kind == IndexKind::Whole ? 'W' : 'd', in[d], kind)});
    if (kind == IndexKind::Whole) b.rule.indices.back().statistics = statistics;
  }
  b.rule.inputs.push_back(dims);
  for (std::size_t i = 1; i < ops.inputs.size(); ++i) {
    const Shape& s = ops.input_shape(i);
    if (channel_params && s.size() == 1 && in.size() >= 2) {
      b.rule.inputs.push_back(s[0] == in[1] ? OperandDims{dims[1]} : OperandDims{b.whole_or_unit(s[0])});
    } else {
      b.rule.inputs.push_back(b.align(dims, s, true));
    }
  }
  for (int o = 0; o < ops.output_count; ++o) {
    const Shape* shape = ops.output_shape(static_cast<std::size_t>(o));
    if (!shape) {
      if (static_cast<std::size_t>(o) >= inferred.size()) return std::nullopt;
      shape = &inferred[static_cast<std::size_t>(o)];
    }
    if (o == 0) {
      b.rule.outputs.push_back(b.align(dims, *shape, true));
    } else if (channel_params && shape->size() == 1 && in.size() >= 2 && (*shape)[0] == in[1]) {
      b.rule.outputs.push_back({dims[1]});
    } else {
      // Statistics keep the leading dims and reduce the rest to unit dims.
      OperandDims out;
      for (std::size_t d = 0; d < shape->size(); ++d) {
        if (d < in.size() && d < whole_from && (*shape)[d] == in[d]) {
          out.push_back(dims[d]);
        } else {
          out.push_back(b.whole_or_unit((*shape)[d]));
        }
      }
      b.rule.outputs.push_back(std::move(out));
    }
  }
  return std::move(b.rule);
}

std::optional<DimRule> norm_last(const Args& args, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  const auto normalised = args.ints(0).size();
  if (normalised > in.size())
    fail(fmt::format("normalized_shape has {} dims, the input {}", normalised, shape_str(in)));
  const std::size_t lead = in.size() - normalised;
  Shape stats(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(lead));
  stats.resize(in.size(), 1);
  return normalisation(ops, std::vector<IndexKind>(lead, IndexKind::Spatial), lead, false, {in, stats, stats},
                       statistics_arg(args, 1));
}

std::optional<DimRule> batch_norm(const Args& args, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  if (in.size() < 2) fail(fmt::format("batch norm input {} has fewer than 2 dims", shape_str(in)));
  if (args.boolean(0)) {
    // Training: each channel's mean and variance run over N and the spatial dims, so N is
    // Whole like them; split, the two statistics are combined across ranks (SyncBatchNorm),
    // which is what keeps the result that of one device.
    return normalisation(ops, {IndexKind::Whole, IndexKind::Spatial}, 2, true, {in}, 2);
  }
  return normalisation(ops, {IndexKind::Spatial, IndexKind::Spatial}, 2, true, {in});
}

std::optional<DimRule> group_norm(const Args&, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  if (in.size() < 2) fail(fmt::format("group norm input {} has fewer than 2 dims", shape_str(in)));
  return normalisation(ops, {IndexKind::Spatial}, 1, true, {in});
}

std::optional<DimRule> attention(const Args& args, const RuleOperands& ops) {
  if (ops.inputs.size() < 3)
    fail(fmt::format("attention takes query, key and value; the node has {} inputs", ops.inputs.size()));
  const Shape& q = ops.input_shape(0);
  const Shape& k = ops.input_shape(1);
  const Shape& v = ops.input_shape(2);
  if (q.size() < 2 || k.size() != q.size() || v.size() != q.size()) {
    fail(fmt::format("attention query {}, key {}, value {} need one rank of at least 2", shape_str(q), shape_str(k),
                     shape_str(v)));
  }
  const std::size_t batch = q.size() - 2;
  Builder b;
  // Batch dims: b and h for the usual rank 4, else _0, _1, ...
  OperandDims q_dims, k_batch, v_batch;
  for (std::size_t d = 0; d < batch; ++d) {
    const bool heads = d + 1 == batch;
    std::string label = batch == 2 ? (d == 0 ? "b" : "h") : fmt::format("_{}", d);
    if (heads && args.boolean(0) && k[d] != q[d] && k[d] > 0 && q[d] % k[d] == 0) {
      // Grouped-query attention: q heads are (g r), k/v heads g.
      const int g = b.add("g", k[d]);
      const int r = b.add("r", q[d] / k[d]);
      q_dims.push_back({g, r});
      k_batch.push_back({g});
      v_batch.push_back({g});
      continue;
    }
    q_dims.push_back({b.add(label, q[d])});
    // A key or value batch dim of 1 against a larger query dim broadcasts (the kernels
    // batch their products as matmul does): multi-query attention's single k/v head
    // (Falcon-7B) is read whole by every shard of the query heads.
    k_batch.push_back(k[d] == 1 && q[d] != 1 ? DimIndices{} : q_dims.back());
    v_batch.push_back(v[d] == 1 && q[d] != 1 ? DimIndices{} : q_dims.back());
  }
  // is_causal masks score (i, j) by j > i in the shard's own positions: a local split of s
  // would mask by its local row numbers, not the global ones, so causal attention keeps s
  // whole for the local kernels. Self-attention that is causal or masked (where a split of the
  // query rows alone would read whole keys and values beside its mask rows) shares s between
  // the query, key and value rows instead: ring attention splits them together (Index::ring,
  // ops/distributed_kernels.h); the mask's key columns keep T, whole. Unmasked, non-causal
  // attention keeps its local split of the query rows.
  const bool causal = args.boolean(1);
  const bool ring = q[batch] == k[batch] && k[batch] == v[batch] && (causal || ops.inputs.size() > 3);
  const int s = b.add("s", q[batch], causal || ring ? IndexKind::Whole : IndexKind::Spatial);
  b.rule.indices[static_cast<std::size_t>(s)].ring = ring;
  const int d = b.add("D", q[batch + 1], IndexKind::Whole);
  // The keys' own index, for the key and value rows apart from the queries' and for the
  // scores' columns (a mask's, the math kernel's probabilities): a rule has no unused index.
  bool probabilities = false;
  for (int o = 1; o < ops.output_count; ++o) {
    const Shape* shape = ops.output_shape(static_cast<std::size_t>(o));
    probabilities = probabilities || (shape && shape->size() == q.size() && shape->back() == k[batch] &&
                                      (*shape)[shape->size() - 2] == q[batch]);
  }
  const int t = !ring || ops.inputs.size() > 3 || probabilities ? b.add("T", k[batch], IndexKind::Whole) : -1;
  const int e = b.add("e", v[batch + 1]);
  const int rows = ring ? s : t;  // the key and value rows' index
  OperandDims scores = q_dims, k_dims = k_batch, v_dims = v_batch, out = q_dims;
  q_dims.insert(q_dims.end(), {{s}, {d}});
  k_dims.insert(k_dims.end(), {{rows}, {d}});
  v_dims.insert(v_dims.end(), {{rows}, {e}});
  scores.insert(scores.end(), {{s}, t >= 0 ? DimIndices{t} : DimIndices{}});
  b.rule.inputs = {q_dims, k_dims, v_dims};
  for (std::size_t i = 3; i < ops.inputs.size(); ++i)
    b.rule.inputs.push_back(b.align(scores, ops.input_shape(i), true));
  out.push_back({s});
  OperandDims stats = out;  // logsumexp of the fused kernels: [..., s]
  out.push_back({e});
  for (int o = 0; o < ops.output_count; ++o) {
    const Shape* shape = ops.output_shape(static_cast<std::size_t>(o));
    if (o == 0) {
      b.rule.outputs.push_back(out);
    } else if (!shape) {
      return std::nullopt;
    } else if (b.rule.shape_of(stats) == *shape) {
      b.rule.outputs.push_back(stats);
    } else if (t >= 0 && b.rule.shape_of(scores) == *shape) {
      b.rule.outputs.push_back(scores);  // the math kernel's probabilities: [..., s, t]
    } else {
      OperandDims dims;
      for (auto size : *shape) dims.push_back(b.whole_or_unit(size));
      b.rule.outputs.push_back(std::move(dims));
    }
  }
  return std::move(b.rule);
}

// How a loss combines over the dims it sums: reduction 0 = none, 1 = mean, 2 = sum.
std::pair<IndexKind, Reduction> loss_kind(std::int64_t reduction) {
  switch (reduction) {
    case 0:
      return {IndexKind::Spatial, Reduction::Sum};
    case 1:
      return {IndexKind::Reduced, Reduction::Mean};
    case 2:
      return {IndexKind::Reduced, Reduction::Sum};
    default:
      fail(fmt::format("loss reduction {} is not 0 (none), 1 (mean) or 2 (sum)", reduction));
  }
}

std::optional<DimRule> cross_entropy(const Args& args, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  const auto [kind, reduction] = loss_kind(args.integer(0));
  Builder b;
  OperandDims in_dims, target_dims, out_dims;
  if (in.empty()) fail("cross entropy logits need a class dim");
  const std::size_t class_at = in.size() == 1 ? 0 : 1;
  int classes = -1;
  for (std::size_t d = 0; d < in.size(); ++d) {
    if (d == class_at) {
      classes = b.add("C", in[d], IndexKind::Whole);
      b.rule.indices.back().statistics = statistics_arg(args, 1);
      in_dims.push_back({classes});
      continue;
    }
    in_dims.push_back({b.add(d == 0 ? std::string("n") : fmt::format("d{}", d), in[d], kind, reduction)});
    target_dims.push_back(in_dims.back());
    out_dims.push_back(in_dims.back());
  }
  b.rule.inputs.push_back(in_dims);
  bool class_indices = false;
  if (ops.inputs.size() > 1) {
    // Class indices [N, d...], or class probabilities shaped like the logits.
    const Shape& target = ops.input_shape(1);
    class_indices = target.size() != in.size();
    b.rule.inputs.push_back(class_indices ? target_dims : in_dims);
  }
  for (std::size_t i = 2; i < ops.inputs.size(); ++i) b.rule.inputs.push_back({{classes}});  // class weights
  // A mean over class-index targets divides by the weight of the targets not ignored
  // (dim_rule.h: CountedMean); over class probabilities, by the number of rows.
  if (class_indices && reduction == Reduction::Mean && kind == IndexKind::Reduced)
    b.rule.counted_mean = CountedMean{1, ops.inputs.size() > 2 ? 2 : -1};
  for (int o = 0; o < ops.output_count; ++o) {
    b.rule.outputs.push_back(kind == IndexKind::Spatial && o == 0 ? out_dims : OperandDims{});
  }
  return std::move(b.rule);
}

std::optional<DimRule> loss(const Args& args, const RuleOperands& ops) {
  const auto [kind, reduction] = loss_kind(args.integer(0));
  auto shape = broadcast_shapes(input_shapes(ops));
  if (!shape) fail("loss operands do not broadcast");
  Builder b;
  OperandDims dims;
  for (auto size : *shape) dims.push_back({b.fresh(kind == IndexKind::Spatial ? 'd' : 'r', size, kind, reduction)});
  for (std::size_t i = 0; i < ops.inputs.size(); ++i) b.rule.inputs.push_back(b.align(dims, ops.input_shape(i), true));
  for (int o = 0; o < ops.output_count; ++o)
    b.rule.outputs.push_back(kind == IndexKind::Spatial ? dims : OperandDims{});
  return std::move(b.rule);
}

std::optional<DimRule> create_with(const RuleOperands& ops, const std::optional<Shape>& computed) {
  Builder b;
  for (std::size_t i = 0; i < ops.inputs.size(); ++i) b.rule.inputs.push_back(b.metadata(ops.input_shape(i), i));
  for (int o = 0; o < ops.output_count; ++o) {
    auto shape = out_shape(ops, static_cast<std::size_t>(o), computed);
    if (!shape) return std::nullopt;
    OperandDims dims;
    for (auto size : *shape) dims.push_back({b.fresh('d', size)});
    b.rule.outputs.push_back(std::move(dims));
  }
  return std::move(b.rule);
}

std::optional<DimRule> create(const Args& args, const RuleOperands& ops) {
  std::optional<Shape> computed;
  if (!args.is_none(0)) computed = args.ints(0);
  return create_with(ops, computed);
}

std::optional<DimRule> arange(const Args& args, const RuleOperands& ops) {
  const double end = args.number(0), start = args.number(1), step = args.number(2);
  if (step == 0) fail("arange step is 0");
  const double length = std::ceil((end - start) / step);
  if (!std::isfinite(length) || length > 1e15) {
    fail(fmt::format("arange({}, {}, {}) has no sensible length", start, end, step));
  }
  return create_with(ops, Shape{std::max<std::int64_t>(0, static_cast<std::int64_t>(length))});
}

std::optional<DimRule> repeat(const Args& args, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  const auto repeats = args.ints(0);
  if (repeats.size() < in.size())
    fail(fmt::format("repeat [{}] has fewer dims than {}", fmt::join(repeats, ","), shape_str(in)));
  const std::size_t extra = repeats.size() - in.size();
  Builder b;
  OperandDims in_dims, out_dims;
  for (std::size_t d = 0; d < repeats.size(); ++d) {
    DimIndices dims;
    if (repeats[d] != 1) dims.push_back(b.fresh('r', repeats[d]));
    if (d >= extra) {
      const auto size = in[d - extra];
      in_dims.push_back(size == 1 ? DimIndices{} : DimIndices{b.fresh('d', size)});
      dims.insert(dims.end(), in_dims.back().begin(), in_dims.back().end());
    }
    out_dims.push_back(std::move(dims));
  }
  b.rule.inputs.push_back(std::move(in_dims));
  b.rule.outputs.push_back(std::move(out_dims));
  return std::move(b.rule);
}

std::optional<DimRule> repeat_interleave(const Args& args, const RuleOperands& ops) {
  const Shape& in = ops.input_shape(0);
  if (ops.inputs.size() > 1 || args.is_none(1)) {
    // Tensor repeats, or a flattened input: the output length depends on data or on every dim.
    if (!ops.outputs_known) return std::nullopt;
    return all_whole_rule(ops);
  }
  const auto repeats = args.integer(0);
  const int d = normalise_dim(args.integer(1), static_cast<int>(in.size()));
  Builder b;
  OperandDims in_dims, out_dims;
  for (std::size_t q = 0; q < in.size(); ++q) {
    in_dims.push_back(in[q] == 1 ? DimIndices{} : DimIndices{b.fresh('d', in[q])});
    DimIndices dims = in_dims.back();
    if (static_cast<int>(q) == d && repeats != 1) dims.push_back(b.fresh('r', repeats));
    out_dims.push_back(std::move(dims));
  }
  b.rule.inputs.push_back(std::move(in_dims));
  b.rule.outputs.push_back(std::move(out_dims));
  return std::move(b.rule);
}

const EinsumPattern& pattern(std::string_view text) {
  // The handful of fixed patterns matmul picks from, parsed once.
  static const std::map<std::string_view, EinsumPattern> parsed = [] {
    std::map<std::string_view, EinsumPattern> out;
    for (std::string_view p : {"k,k->()", "mk,kn->mn", "k,...kn->...n", "...mk,k->...m", "...mk,...kn->...mn"}) {
      out.emplace(p, std::get<EinsumPattern>(parse_rule_text(p)));
    }
    return out;
  }();
  return parsed.at(text);
}

std::optional<DimRule> matmul(const Args&, const RuleOperands& ops) {
  if (ops.inputs.size() != 2) fail(fmt::format("matmul takes 2 tensors, the node has {}", ops.inputs.size()));
  const int a = ops.input_rank(0), b = ops.input_rank(1);
  if (a == 0 || b == 0) fail("matmul operands need at least one dim");
  if (a == 1 && b == 1) return instantiate_pattern(pattern("k,k->()"), ops);
  if (a == 2 && b == 2) return instantiate_pattern(pattern("mk,kn->mn"), ops);
  if (a == 1) return instantiate_pattern(pattern("k,...kn->...n"), ops);
  if (b == 1) return instantiate_pattern(pattern("...mk,k->...m"), ops);
  return instantiate_pattern(pattern("...mk,...kn->...mn"), ops);
}

std::optional<DimRule> einsum(const Args& args, const RuleOperands& ops) {
  return instantiate_pattern(parse_einsum_equation(args.string(0)), ops);
}

// ---- the table -------------------------------------------------------------

// How many tensor inputs and outputs a template accepts (kAny: no bound).
constexpr int kAny = -1;
struct Arity {
  int min_inputs = 1, max_inputs = 1, min_outputs = 1, max_outputs = 1;
};

struct TemplateDef {
  RuleTemplateInfo info;
  Build build;
  Arity arity;
};

TemplateParam required(std::string name) { return TemplateParam{std::move(name), std::nullopt}; }
TemplateParam with_default(std::string name, AttrValue value) {
  return TemplateParam{std::move(name), std::move(value)};
}

const std::vector<TemplateDef>& definitions() {
  static const std::vector<TemplateDef> defs = [] {
    const AttrValue none{ir::NoneAttr{}};
    const auto reduce_params = std::vector<TemplateParam>{with_default("dim", none), with_default("keepdim", false)};
    const auto dim0 = with_default("dim", std::int64_t{0});
    const auto statistics = with_default("statistics", std::int64_t{0});
    std::vector<TemplateDef> out = {
        {{"elementwise", {}}, elementwise, {1, kAny, 0, kAny}},
        {{"expand", {required("size")}}, expand, {1, 1, 1, 1}},
        {{"whole", {required("dim"), statistics}}, whole, {1, kAny, 1, kAny}},
        {{"whole_resized", {with_default("dim", std::int64_t{-1})}}, whole_resized, {1, kAny, 1, kAny}},
        {{"reduce_sum", reduce_params}, reduce_sum, {1, 2, 1, kAny}},
        {{"reduce_mean", reduce_params}, reduce_mean, {1, 2, 1, kAny}},
        {{"reduce_max", reduce_params}, reduce_max, {1, 2, 1, kAny}},
        {{"reduce_min", reduce_params}, reduce_min, {1, 2, 1, kAny}},
        {{"reduce_whole", reduce_params}, reduce_whole, {1, 2, 1, kAny}},
        {{"transpose", {required("dim0"), required("dim1")}}, transpose, {1, 1, 1, 1}},
        {{"permute", {with_default("dims", none)}}, permute, {1, 1, 1, 1}},
        {{"reshape", {with_default("size", none)}}, reshape, {1, 2, 1, 1}},
        {{"flatten", {with_default("start_dim", std::int64_t{0}), with_default("end_dim", std::int64_t{-1})}},
         flatten,
         {1, 1, 1, 1}},
        {{"unflatten", {required("dim"), required("sizes")}}, unflatten, {1, 1, 1, 1}},
        {{"unsqueeze", {required("dim")}}, unsqueeze, {1, 1, 1, 1}},
        {{"squeeze", {with_default("dim", none)}}, squeeze, {1, 1, 1, 1}},
        {{"slice",
          {dim0, with_default("start", none), with_default("end", none), with_default("step", std::int64_t{1})}},
         slice,
         {1, 1, 1, 1}},
        {{"narrow", {required("dim"), required("length")}}, narrow, {1, 1, 1, 1}},
        {{"select", {required("dim")}}, select, {1, 1, 1, 1}},
        {{"cat", {dim0}}, cat, {1, kAny, 1, 1}},
        {{"stack", {dim0}}, stack, {1, kAny, 1, 1}},
        {{"split", {required("split_size"), dim0}}, split, {1, 1, 1, kAny}},
        {{"split_sizes", {required("split_sizes"), dim0}}, split_sizes, {1, 1, 1, kAny}},
        {{"chunk", {required("chunks"), dim0}}, chunk, {1, 1, 1, kAny}},
        {{"unbind", {dim0}}, unbind, {1, 1, 1, kAny}},
        {{"index_select", {required("dim")}}, index_select, {2, 2, 1, 1}},
        {{"embedding", {}}, embedding, {2, 2, 1, 1}},
        {{"gather", {required("dim")}}, gather, {2, 2, 1, 1}},
        {{"scatter", {required("dim")}}, scatter, {2, 3, 1, 1}},
        {{"select_scatter", {required("dim")}}, select_scatter, {2, 2, 1, 1}},
        {{"index", {with_default("indices_present", none)}}, index, {1, kAny, 1, 1}},
        {{"index_put", {with_default("indices_present", none)}}, index_put, {2, kAny, 1, 1}},
        {{"conv", {with_default("groups", std::int64_t{1}), with_default("transposed", false)}}, conv, {2, 3, 1, 1}},
        {{"window", {required("rank")}}, window, {1, 1, 1, kAny}},
        {{"norm_last", {required("normalized_shape"), statistics}}, norm_last, {1, 3, 1, 3}},
        {{"batch_norm", {with_default("training", false)}}, batch_norm, {1, 5, 1, 3}},
        {{"group_norm", {}}, group_norm, {1, 3, 1, 3}},
        {{"attention", {with_default("enable_gqa", false), with_default("is_causal", false)}}, attention, {3, 4, 1, kAny}},
        {{"cross_entropy", {with_default("reduction", std::int64_t{1}), statistics}}, cross_entropy, {1, 3, 1, 1}},
        {{"loss", {with_default("reduction", std::int64_t{1})}}, loss, {1, 4, 1, 1}},
        {{"create", {with_default("size", none)}}, create, {0, kAny, 1, 1}},
        {{"arange", {required("end"), with_default("start", std::int64_t{0}), with_default("step", std::int64_t{1})}},
         arange,
         {0, 0, 1, 1}},
        {{"pad", {required("pad")}}, pad, {1, 1, 1, 1}},
        {{"repeat", {required("repeats")}}, repeat, {1, 1, 1, 1}},
        {{"repeat_interleave", {required("repeats"), with_default("dim", none)}}, repeat_interleave, {1, 2, 1, 1}},
        {{"matmul", {}}, matmul, {2, 2, 1, 1}},
        {{"einsum", {required("equation")}}, einsum, {1, kAny, 1, 1}},
    };
    return out;
  }();
  return defs;
}

const TemplateDef* find_definition(std::string_view name) {
  for (const auto& def : definitions()) {
    if (def.info.name == name) return &def;
  }
  return nullptr;
}

std::optional<AttrValue> Args::get(std::size_t p) const {
  if (p < call_.args.size()) {
    const auto& arg = call_.args[p];
    if (!arg.attr.empty()) {
      if (auto it = attrs_.find(arg.attr); it != attrs_.end()) return it->second;
    }
    if (arg.literal) return arg.literal;
  }
  return def_.info.params.at(p).default_value;
}

std::string Args::describe(std::size_t p) const {
  const auto& param = def_.info.params.at(p).name;
  if (p < call_.args.size() && !call_.args[p].attr.empty()) {
    return fmt::format("attribute '{}' ({} of {})", call_.args[p].attr, param, def_.info.name);
  }
  return fmt::format("parameter '{}' of {}", param, def_.info.name);
}

}  // namespace

bool template_has_lookup(std::string_view name) { return name == "embedding" || name == "index_select"; }

const std::vector<RuleTemplateInfo>& rule_templates() {
  static const std::vector<RuleTemplateInfo> infos = [] {
    std::vector<RuleTemplateInfo> out;
    for (const auto& def : definitions()) out.push_back(def.info);
    return out;
  }();
  return infos;
}

void check_template_call(const TemplateCall& call) {
  const auto* def = find_definition(call.name);
  if (!def) throw support::ValidationError(fmt::format("unknown rule template '{}'", call.name));
  const auto& params = def->info.params;
  if (call.args.size() > params.size()) {
    throw support::ValidationError(
        fmt::format("template {} takes {} argument(s), the rule gives {}", call.name, params.size(), call.args.size()));
  }
  for (std::size_t p = call.args.size(); p < params.size(); ++p) {
    if (!params[p].default_value) {
      throw support::ValidationError(
          fmt::format("template {} needs its parameter '{}' bound", call.name, params[p].name));
    }
  }
}

std::optional<DimRule> instantiate_template(const TemplateCall& call, const RuleOperands& operands) {
  const auto* def = find_definition(call.name);
  if (!def) throw support::ValidationError(fmt::format("unknown rule template '{}'", call.name));
  // Counts first, so no template indexes an operand the node does not have.
  const auto& arity = def->arity;
  auto outside = [](int n, int lo, int hi) { return n < lo || (hi != kAny && n > hi); };
  auto range = [](int lo, int hi) {
    if (hi == kAny) return fmt::format("at least {}", lo);
    return lo == hi ? fmt::format("{}", lo) : fmt::format("{} to {}", lo, hi);
  };
  const int inputs = static_cast<int>(operands.inputs.size());
  if (outside(inputs, arity.min_inputs, arity.max_inputs)) {
    throw support::ValidationError(fmt::format("template {} takes {} tensor input(s), the node has {}", call.name,
                                               range(arity.min_inputs, arity.max_inputs), inputs));
  }
  if (outside(operands.output_count, arity.min_outputs, arity.max_outputs)) {
    throw support::ValidationError(fmt::format("template {} gives {} output(s), the node has {}", call.name,
                                               range(arity.min_outputs, arity.max_outputs), operands.output_count));
  }
  const Args args(*def, call, *operands.attrs);
  return def->build(args, operands);
}

}  // namespace shardwise::ops
