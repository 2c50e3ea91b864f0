#include "search/placement.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <system_error>

#include "support/error.h"

namespace shardwise::search {
namespace {

// Ratios may drift by rounding when a search rebalances them; a looser check would accept
// shares that leave part of the tensor unowned.
constexpr double kRatioSumTolerance = 1e-9;

constexpr std::array<ops::Reduction, 4> kReductions = {ops::Reduction::Sum, ops::Reduction::Mean, ops::Reduction::Max,
                                                       ops::Reduction::Min};

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

// Reads a placement's text; every failure names the whole text so a plan file's bad entry is
// easy to find.
class PlacementReader {
 public:
  explicit PlacementReader(std::string_view text) : text_(text) {}

  Placement read() {
    const std::string_view t = trim(text_);
    if (t == "R") return Placement::replicate();
    if (t.starts_with("P(")) return read_partial(t);
    if (t.starts_with("S(")) return read_shard(t);
    fail("expected R, S(dim[,g<groups>])[ratios] or P(reduction)");
  }

 private:
  [[noreturn]] void fail(std::string_view why) const {
    throw support::ParseError(fmt::format("cannot parse placement '{}': {}", text_, why));
  }

  Placement read_partial(std::string_view t) const {
    if (!t.ends_with(")")) fail("missing ')'");
    const std::string_view name = t.substr(2, t.size() - 3);
    for (auto reduction : kReductions) {
      if (ops::reduction_name(reduction) == name) return Placement::partial(reduction);
    }
    fail(fmt::format("unknown reduction '{}' (expected sum, mean, max or min)", name));
  }

  Placement read_shard(std::string_view t) const {
    const auto close = t.find(')');
    if (close == std::string_view::npos) fail("missing ')'");
    const std::string_view inside = t.substr(2, close - 2);
    std::string_view dim_text = inside;
    std::int64_t groups = 1;
    if (const auto comma = inside.find(','); comma != std::string_view::npos) {
      dim_text = inside.substr(0, comma);
      const std::string_view groups_text = inside.substr(comma + 1);
      if (!groups_text.starts_with("g")) fail("strided groups must be written g<groups>");
      groups = integer(groups_text.substr(1), "groups");
      if (groups < 1) fail(fmt::format("groups {} must be at least 1", groups));
    }
    const std::int64_t dim = integer(dim_text, "dim");
    if (dim < 0) fail(fmt::format("dim {} is negative", dim));
    if (dim > std::numeric_limits<int>::max()) fail(fmt::format("dim {} is too large", dim));
    Placement p = Placement::shard(static_cast<int>(dim), groups);
    const std::string_view rest = t.substr(close + 1);
    if (!rest.empty()) p.ratios = ratios(rest);
    return p;
  }

  std::int64_t integer(std::string_view text, std::string_view what) const {
    std::int64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
      fail(fmt::format("{} '{}' is not an integer", what, text));
    }
    return value;
  }

  std::vector<double> ratios(std::string_view text) const {
    if (!text.starts_with("[") || !text.ends_with("]")) fail("ratios must be a bracketed list after the shard");
    std::string_view list = text.substr(1, text.size() - 2);
    if (list.empty()) fail("the ratio list is empty");
    std::vector<double> out;
    double sum = 0;
    while (true) {
      const auto comma = list.find(',');
      const std::string_view item = list.substr(0, comma);
      double value = 0;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
      if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
        fail(fmt::format("ratio '{}' is not a number", item));
      }
      if (!(value > 0) || !std::isfinite(value)) fail(fmt::format("ratio {} is not positive", item));
      out.push_back(value);
      sum += value;
      if (comma == std::string_view::npos) break;
      list = list.substr(comma + 1);
    }
    if (std::abs(sum - 1.0) > kRatioSumTolerance) fail(fmt::format("ratios sum to {}, not 1", sum));
    return out;
  }

  std::string_view text_;
};

}  // namespace

std::string Placement::str() const {
  switch (kind) {
    case PlacementKind::Replicate:
      return "R";
    case PlacementKind::Partial:
      return fmt::format("P({})", ops::reduction_name(reduction));
    case PlacementKind::Shard:
      break;
  }
  std::string out = groups == 1 ? fmt::format("S({})", dim) : fmt::format("S({},g{})", dim, groups);
  // "{}" is fmt's shortest round-trip form: {:g} would lose digits parse_placement needs.
  if (!ratios.empty()) out += fmt::format("[{}]", fmt::join(ratios, ","));
  return out;
}

Placement parse_placement(std::string_view text) { return PlacementReader(text).read(); }

std::string spec_str(const ShardingSpec& spec) {
  std::vector<std::string> parts;
  parts.reserve(spec.size());
  for (const auto& p : spec) parts.push_back(p.str());
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

Placement gradient_placement(const Placement& forward) {
  // The backward of the all-reduce that resolves a Partial is the identity on a replicated
  // gradient, so the gradient arrives replicated.
  if (forward.is_partial()) return Placement::replicate();
  return forward;
}

double held_fraction(const Placement& placement, int axis_size) {
  if (axis_size < 1) throw support::ValidationError(fmt::format("axis size {} must be at least 1", axis_size));
  if (!placement.is_shard()) return 1.0;
  if (placement.ratios.empty()) return 1.0 / axis_size;
  // The most loaded rank bounds memory and time.
  return *std::max_element(placement.ratios.begin(), placement.ratios.end());
}

}  // namespace shardwise::search
