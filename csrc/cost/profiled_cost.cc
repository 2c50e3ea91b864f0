#include "cost/profiled_cost.h"

#include <fmt/format.h>

#include <cmath>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <utility>

#include "analysis/fp8_linears.h"
#include "ir/attribute.h"
#include "ir/dtype.h"
#include "support/error.h"
#include "support/json_text.h"

namespace shardwise::cost {
namespace {

using nlohmann::json;

constexpr std::string_view kFormat = "shardwise.profile";
constexpr int kVersion = 1;

// ---- signature -------------------------------------------------------------------

void append_type(std::string& out, ir::DType dtype, std::span<const std::int64_t> shape) {
  out += ir::dtype_name(dtype);
  out += '[';
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) out += ',';
    out += std::to_string(shape[i]);
  }
  out += ']';
}

// `shapes` (when not empty: one per value) replaces each value's shape.
void append_types(std::string& out, const ir::Graph& graph, const std::vector<ir::ValueId>& ids,
                  std::span<const std::vector<std::int64_t>> shapes = {}) {
  out += '(';
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i != 0) out += ',';
    const ir::TensorType& type = graph.value(ids[i]).type;
    append_type(out, type.dtype, shapes.empty() ? type.shape : shapes[i]);
  }
  out += ')';
}

void append_attrs(std::string& out, const ir::Node& node) {
  out += '{';
  bool first = true;
  for (const auto& [key, value] : node.attrs) {  // an ordered map: deterministic text
    if (!first) out += ',';
    first = false;
    out += key;
    out += '=';
    out += ir::attr_str(value);
  }
  out += '}';
}

// ---- validation ------------------------------------------------------------------

[[noreturn]] void invalid(std::string_view path, std::string_view what) {
  throw support::ValidationError(fmt::format("profile {}: {}", path, what));
}

void check_seconds(const std::string& path, double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) {
    invalid(path, fmt::format("must be finite seconds >= 0, got {}", seconds));
  }
}

// ---- JSON reading ----------------------------------------------------------------

[[noreturn]] void fail(std::string_view path, std::string_view what) {
  throw support::ParseError(fmt::format("profile {}: {}", path, what));
}

const json& object_at(const json& j, std::string_view path) {
  if (!j.is_object()) fail(path, fmt::format("expected an object, found {}", j.type_name()));
  return j;
}

void check_keys(const json& obj, std::string_view path, std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : obj.items()) {
    bool known = false;
    for (auto a : allowed) known = known || key == a;
    if (known) continue;
    std::string expected;
    for (auto a : allowed) expected += fmt::format("{}\"{}\"", expected.empty() ? "" : ", ", a);
    fail(path, fmt::format("unknown key \"{}\" (expected {})", key, expected));
  }
}

double number_at(const json& obj, std::string_view key, const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(path, fmt::format("missing \"{}\"", key));
  if (!it->is_number()) fail(path + "." + std::string(key), fmt::format("expected a number, found {}", it->type_name()));
  return it->get<double>();
}

std::string string_value(const json& j, const std::string& path) {
  if (!j.is_string()) fail(path, fmt::format("expected a string, found {}", j.type_name()));
  return j.get<std::string>();
}

int group_size_from_key(const std::string& key, const std::string& path) {
  std::size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(key, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != key.size() || key.empty()) fail(path, fmt::format("group size key \"{}\" is not an integer", key));
  if (n < 1 || n > (1LL << 24)) invalid(path, fmt::format("group size must be in [1, 2^24], got {}", n));
  return static_cast<int>(n);
}

}  // namespace

std::string_view provenance_name(Provenance provenance) {
  return provenance == Provenance::Measured ? "measured" : "analytic";
}

std::string node_signature(const ir::Graph& graph, const ir::Node& node) {
  std::string out = node.op;
  append_types(out, graph, node.inputs);
  out += "->";
  append_types(out, graph, node.outputs);
  append_attrs(out, node);
  return out;
}

std::string local_signature(const ir::Graph& graph, const ir::Node& node,
                            std::span<const std::vector<std::int64_t>> shapes) {
  if (shapes.size() != node.inputs.size() + node.outputs.size())
    throw support::ValidationError(fmt::format("local_signature: {} has {} operands, {} shapes given", node.op,
                                               node.inputs.size() + node.outputs.size(), shapes.size()));
  std::string out = node.op;
  append_types(out, graph, node.inputs, shapes.first(node.inputs.size()));
  out += "->";
  append_types(out, graph, node.outputs, shapes.subspan(node.inputs.size()));
  append_attrs(out, node);
  return out;
}

std::string fp8_signature(const ir::Graph& graph, const ir::Node& node,
                          std::span<const std::vector<std::int64_t>> shapes) {
  return std::string(kFp8SignaturePrefix) + local_signature(graph, node, shapes);
}

bool runs_fp8(const ir::Graph& graph, const ir::Node& node, Precision precision) {
  return precision == Precision::FP8 && analysis::fp8_linear(graph, node).has_value();
}

std::string rank_signature(const ir::Graph& graph, const ir::Node& node, Precision precision,
                           std::span<const std::vector<std::int64_t>> shapes) {
  return runs_fp8(graph, node, precision) ? fp8_signature(graph, node, shapes) : local_signature(graph, node, shapes);
}

void validate_profile(const Profile& profile) {
  if (profile.optimizer) {
    const double s = profile.optimizer->seconds_per_element;
    if (!std::isfinite(s) || s <= 0)
      invalid("optimizer.seconds_per_element", fmt::format("must be finite seconds > 0, got {}", s));
  }
  check_seconds("sync_wait", profile.sync_wait);
  if (!(profile.time_slicing >= 1.0 && profile.time_slicing <= 2.0))
    invalid("time_slicing", fmt::format("must be a factor in [1, 2], got {}", profile.time_slicing));
  for (const auto& [signature, op] : profile.ops) {
    check_seconds(fmt::format("ops[\"{}\"].forward", signature), op.forward);
    check_seconds(fmt::format("ops[\"{}\"].backward", signature), op.backward);
    if (op.selective >= 0 || !std::isfinite(op.selective))
      check_seconds(fmt::format("ops[\"{}\"].selective", signature), op.selective);
  }
  for (const auto& [kind, fits] : profile.collectives) {
    for (const auto& [n, fit] : fits) {
      const std::string path = fmt::format("collectives.{}.{}", collective_kind_name(kind), n);
      if (n < 1) invalid(path, fmt::format("group size must be >= 1, got {}", n));
      check_seconds(path + ".alpha", fit.alpha);
      if (!std::isfinite(fit.beta) || fit.beta < 0) {
        invalid(path + ".beta", fmt::format("must be finite seconds per byte >= 0, got {}", fit.beta));
      }
    }
  }
}

json profile_to_json(const Profile& profile) {
  json ops = json::object();
  for (const auto& [signature, op] : profile.ops) {
    ops[signature] = {{"forward", op.forward}, {"backward", op.backward}};
    if (op.selective >= 0) ops[signature]["selective"] = op.selective;
  }
  json skipped = json::object();
  for (const auto& [signature, why] : profile.skipped) skipped[signature] = why;
  json collectives = json::object();
  for (const auto& [kind, fits] : profile.collectives) {
    json per_size = json::object();
    for (const auto& [n, fit] : fits) per_size[std::to_string(n)] = {{"alpha", fit.alpha}, {"beta", fit.beta}};
    collectives[std::string(collective_kind_name(kind))] = std::move(per_size);
  }
  json out = {{"format", kFormat},  {"version", kVersion},  {"device", profile.device},
              {"ops", std::move(ops)}, {"skipped", std::move(skipped)}, {"collectives", std::move(collectives)}};
  if (profile.optimizer)
    out["optimizer"] = {{"name", profile.optimizer->name},
                        {"seconds_per_element", profile.optimizer->seconds_per_element}};
  if (profile.sync_wait > 0) out["sync_wait"] = profile.sync_wait;
  if (profile.time_slicing > 1.0) out["time_slicing"] = profile.time_slicing;
  return out;
}

Profile profile_from_json(const json& j) {
  object_at(j, "(top level)");
  check_keys(j, "(top level)",
             {"format", "version", "device", "ops", "skipped", "collectives", "optimizer", "sync_wait",
               "time_slicing"});
  if (auto it = j.find("format"); it != j.end() && string_value(*it, "format") != kFormat) {
    fail("format", fmt::format("expected \"{}\", found \"{}\"", kFormat, it->get<std::string>()));
  }
  // Compared as int64: get<int>() narrowed 4294967297 to 1, which then passed as version 1.
  if (auto it = j.find("version"); it != j.end() && (!it->is_number_integer() || it->get<std::int64_t>() != kVersion)) {
    fail("version", fmt::format("expected {}, found {}", kVersion, it->dump()));
  }
  Profile p;
  auto device = j.find("device");
  if (device == j.end()) fail("(top level)", "missing \"device\"");
  p.device = string_value(*device, "device");
  auto ops = j.find("ops");
  if (ops == j.end()) fail("(top level)", "missing \"ops\"");
  for (const auto& [signature, entry] : object_at(*ops, "ops").items()) {
    const std::string path = fmt::format("ops[\"{}\"]", signature);
    object_at(entry, path);
    check_keys(entry, path, {"forward", "backward", "selective"});
    double selective = -1.0;  // not measured
    if (entry.contains("selective")) {
      selective = number_at(entry, "selective", path);
      check_seconds(path + ".selective", selective);  // present: measured seconds, never the sentinel
    }
    p.ops[signature] = {number_at(entry, "forward", path), number_at(entry, "backward", path), selective};
  }
  if (auto it = j.find("skipped"); it != j.end()) {
    for (const auto& [signature, why] : object_at(*it, "skipped").items()) {
      p.skipped[signature] = string_value(why, fmt::format("skipped[\"{}\"]", signature));
    }
  }
  if (auto it = j.find("collectives"); it != j.end()) {
    for (const auto& [name, per_size] : object_at(*it, "collectives").items()) {
      const CollectiveKind kind = collective_kind_from_name(name);  // ValidationError lists the known ones
      for (const auto& [key, entry] : object_at(per_size, "collectives." + name).items()) {
        const std::string path = fmt::format("collectives.{}.{}", name, key);
        object_at(entry, path);
        check_keys(entry, path, {"alpha", "beta"});
        p.collectives[kind][group_size_from_key(key, path)] = {number_at(entry, "alpha", path),
                                                               number_at(entry, "beta", path)};
      }
    }
  }
  if (auto it = j.find("optimizer"); it != j.end()) {
    object_at(*it, "optimizer");
    check_keys(*it, "optimizer", {"name", "seconds_per_element"});
    auto name = it->find("name");
    if (name == it->end()) fail("optimizer", "missing \"name\"");
    p.optimizer = MeasuredOptimizer{string_value(*name, "optimizer.name"),
                                    number_at(*it, "seconds_per_element", "optimizer")};
  }
  if (j.contains("sync_wait")) p.sync_wait = number_at(j, "sync_wait", "(top level)");
  if (j.contains("time_slicing")) p.time_slicing = number_at(j, "time_slicing", "(top level)");
  validate_profile(p);
  return p;
}

std::string profile_to_json_string(const Profile& profile, int indent) { return profile_to_json(profile).dump(indent); }

Profile profile_from_json_string(std::string_view text) {
  return profile_from_json(support::parse_json(text, "profile: malformed JSON"));
}

// ---- the model ---------------------------------------------------------------------

ProfiledCostModel::ProfiledCostModel(Profile profile, AnalyticCostModel fallback)
    : profile_(std::move(profile)), fallback_(fallback) {
  validate_profile(profile_);
}

OpTime ProfiledCostModel::node_time(const ir::Graph& graph, const ir::Node& node, const DeviceType& device,
                                    Precision precision, const NodeContext& context) const {
  if (context.compiled != nullptr) {
    // A compiled program's node: the eager measurement, scaled by what the fused kernels save
    // under the analytic model (products and attention keep their measured time).
    NodeContext eager = context;
    eager.compiled = nullptr;
    OpTime out = node_time(graph, node, device, precision, eager);
    const OpTime fused = fallback_.node_time(graph, node, device, precision, context);
    const OpTime unfused = fallback_.node_time(graph, node, device, precision, eager);
    if (unfused.forward > 0) out.forward *= fused.forward / unfused.forward;
    if (unfused.backward > 0) out.backward *= fused.backward / unfused.backward;
    out.selective_extra = -1;  // AOTAutograd partitions the policy's saves: no dispatch mode runs
    return out;
  }
  OpTime analytic = fallback_.node_time(graph, node, device, precision, context);
  // The profile timed the node in the model's dtype; an FP8 linear runs other kernels.
  const bool fp8 = runs_fp8(graph, node, precision);
  if (!context.local_shapes.empty()) {  // measured at the shapes this rank runs: as is
    auto local = profile_.ops.find(rank_signature(graph, node, precision, context.local_shapes));
    if (local != profile_.ops.end()) {
      node_measured_.fetch_add(1, std::memory_order_relaxed);
      OpTime out = analytic;
      out.forward = local->second.forward;
      out.backward = local->second.backward;
      out.selective_extra = local->second.selective_extra();
      return out;
    }
  }
  auto it = profile_.ops.find(node_signature(graph, node));
  if (it == profile_.ops.end() || fp8) {
    node_analytic_.fetch_add(1, std::memory_order_relaxed);
    return analytic;
  }
  node_measured_.fetch_add(1, std::memory_order_relaxed);
  // Scale the measurement to the plan's context by the analytic model's own ratio (see the
  // header): the profile fixes the level, the analytic model how it moves with batch and
  // shards. A default context skips the second evaluation and returns the measurement.
  const bool unscaled = context.batch_scale == 1.0 && context.operand_shards.empty() &&
                        (context.shards == 1 || context.split == TensorSplit::None);
  OpTime out = analytic;
  out.forward = it->second.forward;
  out.backward = it->second.backward;
  out.selective_extra = it->second.selective_extra();
  if (unscaled) return out;
  const OpTime base = fallback_.node_time(graph, node, device, precision, NodeContext{});
  if (base.forward > 0 && out.selective_extra >= 0) out.selective_extra *= analytic.forward / base.forward;
  if (base.forward > 0) out.forward *= analytic.forward / base.forward;
  if (base.backward > 0) out.backward *= analytic.backward / base.backward;
  return out;
}

const AlphaBetaFit* ProfiledCostModel::find_fit(CollectiveKind kind, int group_size) const {
  auto by_kind = profile_.collectives.find(kind);
  if (by_kind == profile_.collectives.end()) return nullptr;
  auto fit = by_kind->second.find(group_size);
  return fit == by_kind->second.end() ? nullptr : &fit->second;
}

double ProfiledCostModel::collective_time(const Cluster& cluster, CollectiveKind kind, std::span<const int> ranks,
                                          std::int64_t bytes, Algorithm algorithm) const {
  const AlphaBetaFit* fit = find_fit(kind, static_cast<int>(ranks.size()));
  if (fit == nullptr) {
    collective_analytic_.fetch_add(1, std::memory_order_relaxed);
    const double alone = fallback_.collective_time(cluster, kind, ranks, bytes, algorithm);
    return alone > 0 ? alone + profile_.sync_wait : alone;
  }
  collective_measured_.fetch_add(1, std::memory_order_relaxed);
  if (bytes < 0) throw support::ValidationError(fmt::format("{}: bytes must be >= 0, got {}", collective_kind_name(kind), bytes));
  // As the analytic model: one rank or nothing to move costs nothing (the library returns).
  if (ranks.size() <= 1 || bytes == 0) return 0;
  return fit->time(bytes) + profile_.sync_wait;
}

Provenance ProfiledCostModel::provenance(const ir::Graph& graph, const ir::Node& node) const {
  return profile_.ops.contains(node_signature(graph, node)) ? Provenance::Measured : Provenance::Analytic;
}

Provenance ProfiledCostModel::collective_provenance(CollectiveKind kind, int group_size) const {
  return find_fit(kind, group_size) != nullptr ? Provenance::Measured : Provenance::Analytic;
}

ProfileCoverage ProfiledCostModel::coverage(const ir::Graph& graph) const {
  ProfileCoverage c;
  for (const auto& node : graph.nodes()) {
    (provenance(graph, node) == Provenance::Measured ? c.nodes_measured : c.nodes_analytic) += 1;
  }
  return c;
}

ProfileCoverage ProfiledCostModel::calls() const {
  ProfileCoverage c;
  c.node_calls_measured = node_measured_.load(std::memory_order_relaxed);
  c.node_calls_analytic = node_analytic_.load(std::memory_order_relaxed);
  c.collective_calls_measured = collective_measured_.load(std::memory_order_relaxed);
  c.collective_calls_analytic = collective_analytic_.load(std::memory_order_relaxed);
  return c;
}

void ProfiledCostModel::reset_calls() const {
  node_measured_.store(0, std::memory_order_relaxed);
  node_analytic_.store(0, std::memory_order_relaxed);
  collective_measured_.store(0, std::memory_order_relaxed);
  collective_analytic_.store(0, std::memory_order_relaxed);
}

}  // namespace shardwise::cost
