#include "transform/reshard_actions.h"

#include <fmt/format.h>

#include <set>

#include "support/error.h"

namespace shardwise::transform {
namespace {

using search::Placement;
using support::ValidationError;

std::set<int> shard_dims(const Placement& a, const Placement& b) {
  std::set<int> dims;
  if (a.is_shard()) dims.insert(a.dim);
  if (b.is_shard()) dims.insert(b.dim);
  return dims;
}

ReshardAction step(ReshardKind kind, int axis) {
  ReshardAction action;
  action.kind = kind;
  action.axis = axis;
  return action;
}

bool contiguous(const Placement& p) { return p.is_shard() && p.groups == 1 && p.ratios.empty(); }

}  // namespace

std::string_view reshard_kind_name(ReshardKind kind) {
  switch (kind) {
    case ReshardKind::AllGather: return "all_gather";
    case ReshardKind::ReduceScatter: return "reduce_scatter";
    case ReshardKind::AllReduce: return "all_reduce";
    case ReshardKind::AllToAll: return "all_to_all";
    case ReshardKind::Slice: return "slice";
    case ReshardKind::ZeroOthers: return "zero_others";
    case ReshardKind::Scale: return "scale";
  }
  return "?";
}

std::string ReshardAction::str() const {
  std::string out = fmt::format("{}(axis {}", reshard_kind_name(kind), axis);
  switch (kind) {
    case ReshardKind::AllToAll: out += fmt::format(", split {}, concat {}", dim, concat_dim); break;
    case ReshardKind::AllReduce: out += fmt::format(", {}", reduce); break;
    case ReshardKind::Scale: out += fmt::format(", n^{}", scale_power); break;
    case ReshardKind::ZeroOthers: break;
    default:
      out += fmt::format(", dim {}", dim);
      if (groups > 1) out += fmt::format(", g{}", groups);
      if (!ratios.empty()) out += fmt::format(", ratios {}", fmt::join(ratios, ","));
  }
  return out + ")";
}

std::vector<ReshardAction> reshard_actions(const search::ShardingSpec& from, const search::ShardingSpec& to) {
  if (from.size() != to.size())
    throw ValidationError(fmt::format("resharding {} -> {}: the specs have {} and {} axes", search::spec_str(from),
                                      search::spec_str(to), from.size(), to.size()));
  const int axes = static_cast<int>(from.size());
  auto at = [](const search::ShardingSpec& spec, int a) -> const Placement& { return spec[static_cast<std::size_t>(a)]; };
  std::vector<bool> changing(from.size());
  for (int a = 0; a < axes; ++a) changing[static_cast<std::size_t>(a)] = at(from, a) != at(to, a);
  // Does an axis outer to b change its shards of dim d (so b's blocks of d must be undone)?
  auto outer_changes = [&](int b, int d) {
    for (int a = 0; a < b; ++a)
      if (changing[static_cast<std::size_t>(a)] && shard_dims(at(from, a), at(to, a)).contains(d)) return true;
    return false;
  };
  auto unsupported = [&](const char* why) {
    return ValidationError(fmt::format("resharding {} -> {}: {} is not supported yet", search::spec_str(from),
                                       search::spec_str(to), why));
  };

  std::vector<ReshardAction> out;
  search::ShardingSpec cur = from;
  // Phase 1, innermost axis first: undo what must change.
  for (int b = axes - 1; b >= 0; --b) {
    const Placement p = at(cur, b);
    const Placement& q = at(to, b);
    const bool reset = changing[static_cast<std::size_t>(b)] || (p.is_shard() && outer_changes(b, p.dim));
    if (!reset) continue;
    auto inner_shards = [&](int d) {
      for (int c = b + 1; c < axes; ++c)
        if (at(cur, c).is_shard() && at(cur, c).dim == d) return true;
      return false;
    };
    if (p.is_shard()) {
      if (!p.ratios.empty() && p.groups > 1) throw unsupported("a strided uneven shard");
      if (contiguous(p) && contiguous(q) && q.dim != p.dim && !outer_changes(b, q.dim) && !inner_shards(p.dim) &&
          !inner_shards(q.dim)) {
        ReshardAction& s = out.emplace_back(step(ReshardKind::AllToAll, b));
        s.dim = q.dim;
        s.concat_dim = p.dim;
        cur[static_cast<std::size_t>(b)] = q;
        continue;
      }
      ReshardAction& s = out.emplace_back(step(ReshardKind::AllGather, b));
      s.dim = p.dim;
      s.groups = p.groups;
      s.ratios = p.ratios;  // uneven: the blocks differ in length
      cur[static_cast<std::size_t>(b)] = Placement::replicate();
    } else if (p.is_partial()) {
      const bool mean = p.reduction == ops::Reduction::Mean;
      if (p.reduction != ops::Reduction::Sum && !mean) throw unsupported("a max or min partial value");
      if (q.is_shard() && !mean && q.ratios.empty() && !outer_changes(b, q.dim) && !inner_shards(q.dim)) {
        ReshardAction& s = out.emplace_back(step(ReshardKind::ReduceScatter, b));
        s.dim = q.dim;
        s.groups = q.groups;
        cur[static_cast<std::size_t>(b)] = q;
      } else if (q.is_partial() && (q.reduction == ops::Reduction::Sum || q.reduction == ops::Reduction::Mean)) {
        // Only the reduction differs (equal ones are not `changing`): sum <-> mean rescales.
        out.emplace_back(step(ReshardKind::Scale, b)).scale_power = mean ? -1 : 1;
        cur[static_cast<std::size_t>(b)] = q;
      } else {
        out.emplace_back(step(ReshardKind::AllReduce, b)).reduce = mean ? "mean" : "sum";
        cur[static_cast<std::size_t>(b)] = Placement::replicate();
      }
    }
  }
  // Phase 2, outermost axis first: cut the new shards in DTensor's nesting order.
  for (int a = 0; a < axes; ++a) {
    const Placement& q = at(to, a);
    if (at(cur, a) == q) continue;
    if (q.is_shard()) {
      ReshardAction& s = out.emplace_back(step(ReshardKind::Slice, a));
      s.dim = q.dim;
      s.groups = q.groups;
      s.ratios = q.ratios;
    } else if (q.is_partial()) {
      if (q.reduction == ops::Reduction::Sum) out.push_back(step(ReshardKind::ZeroOthers, a));
      else if (q.reduction != ops::Reduction::Mean) throw unsupported("making a max or min partial value");
    }
    cur[static_cast<std::size_t>(a)] = q;
  }
  return out;
}

}  // namespace shardwise::transform
