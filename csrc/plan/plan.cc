// The plan value: names, validation, JSON and hash. See plan.h.
#include "plan/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>
#include <utility>

#include "support/enum_names.h"
#include "support/error.h"
#include "support/fnv1a.h"
#include "support/json_text.h"

namespace shardwise::plan {
namespace {

using nlohmann::json;
using support::ParseError;
using support::ValidationError;

constexpr auto kSchedules = support::enum_names<Schedule>({
    {Schedule::GPipe, "gpipe"}, {Schedule::OneFOneB, "1f1b"}, {Schedule::Interleaved1F1B, "interleaved-1f1b"},
    {Schedule::KFKB, "kfkb"}, {Schedule::ZeroBubbleH1, "zb-h1"},
    {Schedule::ZeroBubbleV, "zb-v"}, {Schedule::DualPipeV, "dualpipe-v"},
});

// cost::Precision's names; "fp8" runs the linears in float8 and the rest in bf16 (analysis/fp8_linears.h).
constexpr std::array<std::string_view, 5> kPrecisions = {"f32", "tf32", "bf16", "f16", "fp8"};

// A sharding section's invariants: its mesh is {data, tensor} and every entry has one
// placement or strategy per axis. `where`: "plan.sharding" or "plan.stage_sharding".
void validate_sharding_section(const Sharding& s, int data, int tensor, std::string_view where) {
  if (s.mesh.size() != 2 || s.mesh[0] != data || s.mesh[1] != tensor)
    throw ValidationError(fmt::format("{}.mesh: [{}] must be [data {}, tensor {}]", where, fmt::join(s.mesh, ", "),
                                      data, tensor));
  if (s.axis_names.size() != s.mesh.size())
    throw ValidationError(
        fmt::format("{}.axis_names: {} names for {} axes", where, s.axis_names.size(), s.mesh.size()));
  for (const auto& [name, per_axis] : s.placements)
    if (per_axis.size() != s.mesh.size())
      throw ValidationError(fmt::format("{}.placements['{}']: {} entries for {} mesh axes", where, name,
                                        per_axis.size(), s.mesh.size()));
  for (const auto& [name, per_axis] : s.strategies)
    if (per_axis.size() != s.mesh.size())
      throw ValidationError(fmt::format("{}.strategies['{}']: {} entries for {} mesh axes", where, name,
                                        per_axis.size(), s.mesh.size()));
  for (const auto& [name, axes] : s.zero)
    for (int axis : axes)
      if (axis < 0 || axis >= static_cast<int>(s.mesh.size()))
        throw ValidationError(fmt::format("{}.zero['{}']: axis {} out of range", where, name, axis));
}

// The sharded plan's invariants (plan.h): the batch is one micro-batch over the mesh.
void validate_sharding(const Plan& plan) {
  if (plan.stage_sharding.has_value())
    throw ValidationError("plan: a sharding and a stage_sharding (a plan is sharded on one mesh, or pipelined)");
  if (plan.pipeline != 1)
    throw ValidationError(fmt::format("plan.sharding: pipeline degree {} with a sharding (only 1 so far)",
                                      plan.pipeline));
  if (plan.micro_batch != plan.global_batch)
    throw ValidationError(fmt::format("plan.sharding: micro_batch {} must equal global_batch {}", plan.micro_batch,
                                      plan.global_batch));
  validate_sharding_section(*plan.sharding, plan.data, plan.tensor, "plan.sharding");
}

// Context parallelism (plan.h's context): a stage's first axis splits either the rows or each
// row's sequence, so data 1 beside it; an SPMD plan, or stages on meshes of their own, say it
// by their meshes' data axis instead.
void validate_context(const Plan& plan) {
  if (plan.context == 1) return;
  if (plan.data != 1)
    throw ValidationError(fmt::format(
        "plan.context: {} with data {}: a stage's first mesh axis splits either the batch's rows or each row's "
        "sequence, not both (a third mesh axis is not run); use data 1 with context {}, or data {} alone",
        plan.context, plan.data, plan.context, plan.data * plan.context));
  if (plan.sharding.has_value())
    throw ValidationError(fmt::format("plan.context: {} with a sharding (an SPMD plan's data axis of {} ranks splits "
                                      "the sequence where it is wider than the batch: give data {} instead)",
                                      plan.context, plan.context, plan.context));
  if (!plan.stage_meshes.empty())
    throw ValidationError(fmt::format("plan.context: {} with stage_meshes (each stage's mesh gives its own ranks)",
                                      plan.context));
}

// Expert parallelism (plan.h's expert): over a stage's whole first mesh axis, the one the
// runtime splits the experts over; an SPMD plan, or stages on meshes of their own, say it by
// their layouts instead.
void validate_expert(const Plan& plan) {
  if (plan.expert > 1 && !plan.split_experts)
    throw ValidationError(fmt::format("plan.expert: {} with split_experts false: the experts are split over the data "
                                      "ranks or kept whole; use expert 1, or split_experts true",
                                      plan.expert));
  if (plan.expert == 1) return;
  if (plan.expert < 1 || plan.expert != plan.stage_data())
    throw ValidationError(fmt::format(
        "plan.expert: {} with data {} x context {}: the experts are split over a stage's whole first mesh axis "
        "(each rank its block, the axis' tokens gathered to them) or not at all; use expert {} or 1",
        plan.expert, plan.data, plan.context, plan.stage_data()));
  if (plan.sharding.has_value())
    throw ValidationError(fmt::format("plan.expert: {} with a sharding (an SPMD plan's layout says where the experts "
                                      "are split)",
                                      plan.expert));
  if (!plan.stage_meshes.empty())
    throw ValidationError(fmt::format("plan.expert: {} with stage_meshes (each stage's layout says it)", plan.expert));
  if (plan.zero_stage > 1)
    throw ValidationError(fmt::format("plan.expert: {} with zero_stage {}: the experts' split holds each rank's "
                                      "experts whole; use zero_stage 0 or 1",
                                      plan.expert, plan.zero_stage));
}

// Stages on sub-meshes of their own (plan.h's stage_meshes) and their layouts.
void validate_stage_meshes(const Plan& plan) {
  if (plan.stage_meshes.empty()) {
    if (!plan.stage_shardings.empty())
      throw ValidationError("plan.stage_shardings: given without stage_meshes (a plan of one sub-mesh shape "
                            "carries its layout as stage_sharding)");
    return;
  }
  if (static_cast<int>(plan.stage_meshes.size()) != plan.pipeline)
    throw ValidationError(fmt::format("plan.stage_meshes: {} meshes for pipeline {}", plan.stage_meshes.size(),
                                      plan.pipeline));
  if (plan.data != 1 || plan.tensor != 1)
    throw ValidationError(fmt::format("plan.stage_meshes: data {} and tensor {} must be 1 (each stage's sub-mesh "
                                      "gives its own)",
                                      plan.data, plan.tensor));
  if (!plan.stage_groups.empty())
    throw ValidationError("plan.stage_meshes: with stage_groups (stages of their own sizes take the ranks in "
                          "stage order)");
  if (plan.virtual_stages != 1)
    throw ValidationError(fmt::format("plan.stage_meshes: virtual_stages {} (one chunk per stage's sub-mesh)",
                                      plan.virtual_stages));
  if (plan.sharding.has_value() || plan.stage_sharding.has_value())
    throw ValidationError("plan.stage_meshes: with a sharding or stage_sharding (each stage's layout is in "
                          "stage_shardings)");
  std::int64_t world = 0;
  for (std::size_t s = 0; s < plan.stage_meshes.size(); ++s) {
    const std::vector<int>& mesh = plan.stage_meshes[s];
    if (mesh.size() != 2 || mesh[0] < 1 || mesh[1] < 1)
      throw ValidationError(fmt::format("plan.stage_meshes[{}]: [{}] is not [data >= 1, tensor >= 1]", s,
                                        fmt::join(mesh, ", ")));
    if (plan.micro_batch % mesh[0] != 0)
      throw ValidationError(fmt::format("plan.stage_meshes[{}]: data {} does not divide the micro-batch's {} rows", s,
                                        mesh[0], plan.micro_batch));
    world += std::int64_t{mesh[0]} * mesh[1];
    if (world > std::numeric_limits<int>::max())
      throw ValidationError(fmt::format("plan.stage_meshes: more than {} ranks", std::numeric_limits<int>::max()));
  }
  if (!plan.stage_shardings.empty()) {
    if (plan.stage_shardings.size() != plan.stage_meshes.size())
      throw ValidationError(fmt::format("plan.stage_shardings: {} layouts for {} stages", plan.stage_shardings.size(),
                                        plan.stage_meshes.size()));
    for (std::size_t s = 0; s < plan.stage_shardings.size(); ++s)
      validate_sharding_section(plan.stage_shardings[s], plan.stage_meshes[s][0], plan.stage_meshes[s][1],
                                fmt::format("plan.stage_shardings[{}]", s));
  }
}

template <typename T>
struct IsVector : std::false_type {};
template <typename U>
struct IsVector<std::vector<U>> : std::true_type {};
template <typename T>
struct IsStringMap : std::false_type {};
template <typename U>
struct IsStringMap<std::map<std::string, U>> : std::true_type {};

// Converts a JSON value to T, naming `path` on error. Integers are read here, not by
// nlohmann's get<int>: that static_casts a JSON double to int, so "data": 1e10 was
// undefined behaviour (UBSan: float-cast-overflow) and 2.5 silently became 2; int64 to
// int narrowing made 4294967297 a 1. An integral double in range still reads (2.0 is 2,
// as in cluster files).
template <typename T>
T read(const json& j, const std::string& path) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    static_assert(std::is_signed_v<T>);
    constexpr auto lo = std::numeric_limits<T>::min();
    constexpr auto hi = std::numeric_limits<T>::max();
    if (j.is_number_unsigned()) {
      const auto u = j.get<std::uint64_t>();
      if (std::in_range<T>(u)) return static_cast<T>(u);
    } else if (j.is_number_integer()) {
      const auto i = j.get<std::int64_t>();
      if (std::in_range<T>(i)) return static_cast<T>(i);
    } else if (j.is_number_float()) {
      // [lo, -lo) = [lo, hi + 1) holds exactly the integral doubles that fit T; lo is a
      // power of two, so exact as a double.
      const double d = j.get<double>();
      if (d == std::trunc(d) && d >= static_cast<double>(lo) && d < -static_cast<double>(lo))
        return static_cast<T>(d);
      if (d != std::trunc(d)) throw ParseError(fmt::format("plan.{}: expected an integer, got {}", path, j.dump()));
    } else {
      throw ParseError(fmt::format("plan.{}: wrong type (expected an integer, got {})", path, j.type_name()));
    }
    throw ParseError(fmt::format("plan.{}: integer {} is out of range [{}, {}]", path, j.dump(), lo, hi));
  } else if constexpr (IsVector<T>::value) {
    if (!j.is_array()) throw ParseError(fmt::format("plan.{}: wrong type (expected an array, got {})", path, j.type_name()));
    T out;
    for (std::size_t i = 0; i < j.size(); ++i)
      out.push_back(read<typename T::value_type>(j[i], fmt::format("{}[{}]", path, i)));
    return out;
  } else if constexpr (IsStringMap<T>::value) {
    if (!j.is_object()) throw ParseError(fmt::format("plan.{}: wrong type (expected an object, got {})", path, j.type_name()));
    T out;
    for (const auto& [key, value] : j.items())
      out.emplace(key, read<typename T::mapped_type>(value, fmt::format("{}['{}']", path, key)));
    return out;
  } else if constexpr (std::is_same_v<T, double>) {
    if (j.is_number()) return j.get<double>();
    // JSON has no inf: number() writes it as {"float": "inf"} (as ir/json.h does). A nan
    // is refused: no price is nan, and a plan holding one would not equal itself.
    if (j.is_object() && j.size() == 1 && j.contains("float") && j.at("float").is_string()) {
      const auto& text = j.at("float").get_ref<const std::string&>();
      if (text == "inf") return std::numeric_limits<double>::infinity();
      if (text == "-inf") return -std::numeric_limits<double>::infinity();
      if (text == "nan")
        throw ParseError(fmt::format("plan.{}: nan is not a figure a plan holds (a price that is nan is a "
                                     "defect of whatever wrote it)", path));
      throw ParseError(fmt::format("plan.{}: unknown special float \"{}\" (expected \"inf\" or \"-inf\")",
                                   path, text));
    }
    throw ParseError(fmt::format("plan.{}: wrong type (expected a number, got {})", path, j.type_name()));
  } else {
    try {
      return j.get<T>();
    } catch (const json::exception& e) {
      throw ParseError(fmt::format("plan.{}: wrong type ({})", path, e.what()));
    }
  }
}

// A double as JSON: a number, or {"float": "inf" | "-inf"} (JSON has none, and nlohmann
// would write null, which reads back as no number at all). A nan is written as
// {"float": "nan"} so that the defect shows in the text; the reader refuses it.
json number(double d) {
  if (std::isnan(d)) return json{{"float", "nan"}};
  if (std::isinf(d)) return json{{"float", d > 0 ? "inf" : "-inf"}};
  return d;
}

json numbers(const std::map<std::string, double>& values) {
  json out = json::object();
  for (const auto& [key, d] : values) out[key] = number(d);
  return out;
}

json numbers(const std::vector<double>& values) {
  json out = json::array();
  for (double d : values) out.push_back(number(d));
  return out;
}

// Reads a required field of the expected JSON type, naming its path on error.
template <typename T>
T field(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end()) throw ParseError(fmt::format("plan: missing field '{}'", key));
  return read<T>(*it, key);
}

}  // namespace

std::string_view schedule_name(Schedule schedule) { return kSchedules.name(schedule); }

bool splits_backward(Schedule schedule) {
  return schedule == Schedule::ZeroBubbleH1 || v_shaped(schedule);
}

bool v_shaped(Schedule schedule) { return schedule == Schedule::ZeroBubbleV || schedule == Schedule::DualPipeV; }

Schedule schedule_from_name(std::string_view name) {
  if (name == "interleaved") return Schedule::Interleaved1F1B;
  if (auto s = kSchedules.parse(name)) return *s;
  throw ValidationError(
      fmt::format("plan.schedule: unknown schedule '{}' (known: {})", name, kSchedules.known()));
}

std::vector<std::string_view> schedule_names() {
  std::vector<std::string_view> names;
  for (const auto& entry : kSchedules.entries()) names.push_back(entry.name);
  return names;
}

std::string_view recompute_name(Recompute recompute) {
  switch (recompute) {
    case Recompute::Full: return "full";
    case Recompute::Selective: return "selective";
    case Recompute::None: break;
  }
  return "none";
}

Recompute recompute_from_name(std::string_view name) {
  if (name == "full") return Recompute::Full;
  if (name == "selective") return Recompute::Selective;
  if (name == "none") return Recompute::None;
  throw ValidationError(fmt::format("plan.recompute: unknown value '{}' (known: none, full, selective)", name));
}

std::string_view micro_batch_semantics_name(MicroBatchSemantics semantics) {
  return semantics == MicroBatchSemantics::PerMicroBatch ? "per_micro_batch" : "exact";
}

MicroBatchSemantics micro_batch_semantics_from_name(std::string_view name) {
  if (name == "exact") return MicroBatchSemantics::Exact;
  if (name == "per_micro_batch") return MicroBatchSemantics::PerMicroBatch;
  throw ValidationError(
      fmt::format("plan.micro_batch_semantics: unknown value '{}' (known: exact, per_micro_batch)", name));
}

int Plan::world_size() const {
  if (stage_meshes.empty()) return data * context * tensor * pipeline;
  int world = 0;
  for (const std::vector<int>& mesh : stage_meshes) world += mesh.at(0) * mesh.at(1);
  return world;
}

std::vector<int> Plan::stage_mesh(int stage) const {
  if (stage_meshes.empty()) return {stage_data(), tensor};
  return stage_meshes.at(static_cast<std::size_t>(stage));
}

int Plan::stage_size(int stage) const {
  const std::vector<int> mesh = stage_mesh(stage);
  return mesh.at(0) * mesh.at(1);
}

int Plan::stage_first_rank(int stage) const {
  if (stage_meshes.empty()) return stage_group(stage) * stage_data() * tensor;
  int first = 0;
  for (int s = 0; s < stage; ++s) first += stage_size(s);
  return first;
}

std::vector<int> Plan::stage_ranks(int stage) const {
  std::vector<int> ranks(static_cast<std::size_t>(stage_size(stage)));
  for (std::size_t i = 0; i < ranks.size(); ++i) ranks[i] = stage_first_rank(stage) + static_cast<int>(i);
  return ranks;
}

int Plan::stage_of_rank(int rank) const {
  for (int s = 0; s < pipeline; ++s) {
    const int first = stage_first_rank(s);
    if (rank >= first && rank < first + stage_size(s)) return s;
  }
  throw ValidationError(fmt::format("plan: rank {} outside the plan's {} ranks", rank, world_size()));
}

std::int64_t Plan::num_micro_batches() const {
  if (sharding.has_value()) return micro_batch > 0 ? global_batch / micro_batch : 0;
  std::int64_t per_step = micro_batch * data;
  return per_step > 0 ? global_batch / per_step : 0;
}

const std::vector<std::string>& sharding_entry(const std::map<std::string, std::vector<std::string>>& map,
                                               const std::string& name, const char* what, std::size_t axes) {
  auto it = map.find(name);
  if (it == map.end())
    throw support::ValidationError(fmt::format("plan: no {} for '{}' (a plan made for another model?)", what, name));
  if (it->second.size() != axes)
    throw support::ValidationError(fmt::format("plan: the {} of '{}' has {} entries for a mesh of {} axes", what, name,
                                               it->second.size(), axes));
  return it->second;
}

void validate(const Plan& plan, std::optional<int> world_size) {
  if (plan.data < 1 || plan.tensor < 1 || plan.pipeline < 1 || plan.context < 1)
    throw ValidationError(fmt::format("plan: degrees must be >= 1 (data {}, tensor {}, pipeline {}, context {})",
                                      plan.data, plan.tensor, plan.pipeline, plan.context));
  validate_context(plan);
  validate_expert(plan);
  // world_size() is an int product: reject degrees it would overflow (data 65536 x
  // tensor 65536 was signed overflow, undefined behaviour, in validate(plan, world)).
  const std::int64_t world = std::int64_t{plan.data} * plan.tensor * plan.context;
  if (world > std::numeric_limits<int>::max() / plan.pipeline)
    throw ValidationError(fmt::format("plan: world size t {} x p {} x d {} exceeds {}", plan.tensor, plan.pipeline,
                                      plan.data, std::numeric_limits<int>::max()));
  validate_stage_meshes(plan);
  if (world_size.has_value() && plan.world_size() != *world_size) {
    if (!plan.stage_meshes.empty())
      throw ValidationError(fmt::format("plan: world size {} != the stage meshes' {} ranks", *world_size,
                                        plan.world_size()));
    throw ValidationError(fmt::format("plan: world size {} != t {} x p {} x d {}{} = {}", *world_size, plan.tensor,
                                      plan.pipeline, plan.data,
                                      plan.context > 1 ? fmt::format(" x c {}", plan.context) : std::string(),
                                      plan.world_size()));
  }
  if (plan.micro_batch < 1 || plan.global_batch < 1)
    throw ValidationError(fmt::format("plan: global_batch ({}) and micro_batch ({}) must be >= 1",
                                      plan.global_batch, plan.micro_batch));
  if (plan.sharding.has_value()) {
    validate_sharding(plan);
  } else {
    // micro_batch x data can overflow int64 in a hand-written plan (signed overflow was
    // undefined behaviour here): such a product is larger than any global_batch.
    std::int64_t per_step = 0;
    if (__builtin_mul_overflow(plan.micro_batch, std::int64_t{plan.data}, &per_step))
      throw ValidationError(fmt::format("plan: global_batch {} is not divisible by micro_batch {} x data {} (> 2^63)",
                                        plan.global_batch, plan.micro_batch, plan.data));
    if (plan.global_batch % per_step != 0)
      throw ValidationError(fmt::format("plan: global_batch {} is not divisible by micro_batch {} x data {} = {}",
                                        plan.global_batch, plan.micro_batch, plan.data, per_step));
    if (plan.stage_sharding.has_value())
      validate_sharding_section(*plan.stage_sharding, plan.stage_data(), plan.tensor, "plan.stage_sharding");
  }
  // A plan asking for rings whose layout runs none: the runtime reads the layout's.
  for (const auto& [layout, where] :
       {std::pair{&plan.sharding, "sharding"}, std::pair{&plan.stage_sharding, "stage_sharding"}})
    if (plan.collective_matmul && layout->has_value() && !(*layout)->collective_matmul)
      throw ValidationError(fmt::format("plan.collective_matmul: true, but plan.{}.collective_matmul is false (a "
                                        "layout searched without collective matmuls; complete the plan again)",
                                        where));
  auto hex16 = [](const std::string& text) {
    return text.size() == 16 && text.find_first_not_of("0123456789abcdef") == std::string::npos;
  };
  if (plan.programs.has_value())
    for (const auto& [key, text] : {std::pair{"plan", &plan.programs->plan}, std::pair{"hash", &plan.programs->hash}})
      if (!hex16(*text)) throw ValidationError(fmt::format("plan.programs.{}: '{}' is not 16 hex digits", key, *text));
  if (plan.virtual_stages < 1) throw ValidationError(fmt::format("plan.virtual_stages: {} < 1", plan.virtual_stages));
  if (v_shaped(plan.schedule) && plan.virtual_stages != 2)
    throw ValidationError(fmt::format("plan.virtual_stages: {} runs two chunks per rank (a V), not {}",
                                      schedule_name(plan.schedule), plan.virtual_stages));
  if (plan.virtual_stages > 1 && plan.schedule != Schedule::Interleaved1F1B && !v_shaped(plan.schedule))
    throw ValidationError(fmt::format("plan.virtual_stages: {} needs schedule interleaved-1f1b, not {}",
                                      plan.virtual_stages, schedule_name(plan.schedule)));
  if (std::int64_t per_step = 0; plan.schedule == Schedule::DualPipeV &&
                                 !__builtin_mul_overflow(plan.micro_batch, std::int64_t{plan.data}, &per_step) &&
                                 per_step > 0 && plan.global_batch / per_step < 2LL * plan.pipeline)
    throw ValidationError(fmt::format("plan.schedule: dualpipe-v needs at least one micro-batch per stage ({} "
                                      "stages on {} ranks), not {}",
                                      2 * plan.pipeline, plan.pipeline, plan.global_batch / per_step));
  if (plan.kfkb_k < 1) throw ValidationError(fmt::format("plan.kfkb_k: {} < 1", plan.kfkb_k));
  if (plan.kfkb_k > 1 && plan.schedule != Schedule::KFKB)
    throw ValidationError(
        fmt::format("plan.kfkb_k: {} needs schedule kfkb, not {}", plan.kfkb_k, schedule_name(plan.schedule)));
  if (splits_backward(plan.schedule) && plan.recompute != Recompute::None)
    throw ValidationError(std::string("plan.schedule: ") + std::string(schedule_name(plan.schedule)) +
                          " with recomputation; the runtime splits a stage's backward into B and "
                          "W only where no block is recomputed (use 1f1b or interleaved-1f1b with recompute)");
  if (plan.zero_stage < 0 || plan.zero_stage > 3)
    throw ValidationError(fmt::format("plan.zero_stage: {} is not in 0..3", plan.zero_stage));
  if (!plan.layers_per_stage.empty()) {
    std::size_t chunks = static_cast<std::size_t>(plan.pipeline) * static_cast<std::size_t>(plan.virtual_stages);
    if (plan.layers_per_stage.size() != chunks)
      throw ValidationError(fmt::format("plan.layers_per_stage: {} entries, expected pipeline {} x virtual_stages {} = {}",
                                        plan.layers_per_stage.size(), plan.pipeline, plan.virtual_stages, chunks));
    for (std::size_t i = 0; i < chunks; ++i)
      if (plan.layers_per_stage[i] < 0)
        throw ValidationError(fmt::format("plan.layers_per_stage[{}]: {} < 0", i, plan.layers_per_stage[i]));
  }
  if (!plan.stage_groups.empty()) {
    std::vector<int> sorted = plan.stage_groups;
    std::sort(sorted.begin(), sorted.end());
    bool permutation = static_cast<int>(sorted.size()) == plan.pipeline;
    for (int s = 0; permutation && s < plan.pipeline; ++s) permutation = sorted[static_cast<std::size_t>(s)] == s;
    if (!permutation)
      throw ValidationError(fmt::format("plan.stage_groups: [{}] is not an order of the {} stages' rank blocks 0..{}",
                                        fmt::join(plan.stage_groups, ", "), plan.pipeline, plan.pipeline - 1));
  }
  if (std::find(kPrecisions.begin(), kPrecisions.end(), plan.precision) == kPrecisions.end())
    throw ValidationError(
        fmt::format("plan.precision: unknown '{}' (known: f32, tf32, bf16, f16, fp8)", plan.precision));
  if (!plan.state_dtype.empty() && plan.state_dtype != "bf16" && plan.state_dtype != "f16" && plan.state_dtype != "f32")
    throw ValidationError(fmt::format("plan.state_dtype: unknown '{}' (known: bf16, f16, f32; empty: the precision's "
                                      "master weights)", plan.state_dtype));
}

namespace {

// One stage of `plan` as a plan of its own: a step of `rows` rows in one micro-batch on a
// data x tensor mesh, in the plan's recompute and run settings, laid out by `sharding`. The
// plan's own recompute decides the stage's (an edit of it reaches the run).
Plan one_stage_of(const Plan& plan, int data, int tensor, std::int64_t rows, const Sharding& sharding) {
  Plan stage;
  static_cast<RunSettings&>(stage) = plan;
  stage.data = data;
  stage.tensor = tensor;
  stage.global_batch = rows;
  stage.micro_batch = rows;
  stage.recompute = plan.recompute;
  stage.sharding = sharding;
  stage.sharding->recompute = plan.recompute;
  validate(stage);
  return stage;
}

}  // namespace

Plan stage_plan(const Plan& plan, int stage) {
  if (plan.stage_meshes.empty()) return stage_plan(plan);
  if (plan.stage_shardings.empty())
    throw ValidationError(fmt::format("plan: no stage_shardings for the stage meshes: a plan given by its meshes is "
                                      "completed first (shardwise.Plan.complete)"));
  const std::vector<int> mesh = plan.stage_mesh(stage);
  return one_stage_of(plan, mesh.at(0), mesh.at(1), plan.micro_batch,
                      plan.stage_shardings.at(static_cast<std::size_t>(stage)));
}

Plan stage_plan(const Plan& plan) {
  if (!plan.stage_meshes.empty())
    throw ValidationError("plan: stages on meshes of their own have one layout each (stage_plan(plan, stage))");
  if (!plan.stage_sharding.has_value())
    throw ValidationError(fmt::format("plan: no stage_sharding (pipeline {}, data {}, tensor {}): a plan given by its "
                                      "degrees is completed first (shardwise.Plan.complete)",
                                      plan.pipeline, plan.data, plan.tensor));
  return one_stage_of(plan, plan.stage_data(), plan.tensor, plan.micro_batch * plan.data, *plan.stage_sharding);
}

namespace {

json sharding_to_json(const Sharding& sharding) {
  json out{{"mesh", sharding.mesh},           {"axis_names", sharding.axis_names},
           {"level", sharding.level},         {"placements", sharding.placements},
           {"strategies", sharding.strategies}, {"zero", sharding.zero},
           {"leaves", sharding.leaves},
           {"inputs", sharding.inputs},       {"graph", sharding.graph}};
  // none / full as the booleans they always were (plans and their hashes read as before).
  if (sharding.recompute == Recompute::Selective)
    out["recompute"] = recompute_name(sharding.recompute);
  else
    out["recompute"] = sharding.recompute == Recompute::Full;
  // Written only when set: a plan without it reads, prints and hashes as before.
  if (sharding.collective_matmul) out["collective_matmul"] = true;
  if (!sharding.async_gradients) out["async_gradients"] = false;
  return out;
}

Sharding sharding_from_json(const json& in, std::string_view where = "plan.sharding") {
  if (!in.is_object()) throw ParseError(fmt::format("{}: expected an object", where));
  static const std::set<std::string> known = {"mesh",       "axis_names", "level",    "placements",
                                              "strategies", "zero",       "recompute",  "collective_matmul",
                                              "async_gradients", "leaves", "inputs", "graph"};
  for (const auto& [key, value] : in.items())
    if (!known.contains(key)) throw ParseError(fmt::format("{}.{}: unknown key", where, key));
  Sharding out;
  out.mesh = field<std::vector<int>>(in, "mesh");
  out.axis_names = field<std::vector<std::string>>(in, "axis_names");
  if (in.contains("level")) out.level = field<std::string>(in, "level");
  out.placements = field<std::map<std::string, std::vector<std::string>>>(in, "placements");
  if (in.contains("strategies"))
    out.strategies = field<std::map<std::string, std::vector<std::string>>>(in, "strategies");
  if (in.contains("zero")) out.zero = field<std::map<std::string, std::vector<int>>>(in, "zero");
  if (in.contains("recompute")) {
    const json& recompute = in.at("recompute");
    if (recompute.is_boolean())
      out.recompute = recompute.get<bool>() ? Recompute::Full : Recompute::None;
    else if (recompute.is_string())
      out.recompute = recompute_from_name(recompute.get<std::string>());
    else
      throw ParseError(fmt::format("{}.recompute: expected true, false or \"selective\"", where));
  }
  if (in.contains("collective_matmul")) out.collective_matmul = field<bool>(in, "collective_matmul");
  if (in.contains("async_gradients")) out.async_gradients = field<bool>(in, "async_gradients");
  if (in.contains("leaves")) out.leaves = field<std::vector<std::string>>(in, "leaves");
  if (in.contains("inputs")) out.inputs = field<std::vector<std::string>>(in, "inputs");
  if (in.contains("graph")) out.graph = field<std::string>(in, "graph");
  return out;
}

json collective_to_json(const CollectiveRecord& c) {
  return json{{"kind", c.kind},           {"value", c.value},         {"axis", c.axis},
              {"phase", c.phase},         {"bytes", number(c.bytes)}, {"count", number(c.count)},
              {"seconds", number(c.seconds)}};
}

CollectiveRecord collective_from_json(const json& in) {
  if (!in.is_object()) throw ParseError("plan.predicted.collectives: expected objects");
  CollectiveRecord c;
  c.kind = field<std::string>(in, "kind");
  c.value = field<std::string>(in, "value");
  c.axis = field<int>(in, "axis");
  c.phase = field<std::string>(in, "phase");
  c.bytes = field<double>(in, "bytes");
  c.count = field<double>(in, "count");
  c.seconds = field<double>(in, "seconds");
  return c;
}

json plan_degrees(const Plan& plan) {
  json out{{"format", "shardwise.plan"},
           {"version", 1},
           {"data", plan.data},
           {"tensor", plan.tensor},
           {"pipeline", plan.pipeline},
           {"global_batch", plan.global_batch},
           {"micro_batch", plan.micro_batch},
           {"schedule", schedule_name(plan.schedule)},
           {"virtual_stages", plan.virtual_stages},
           {"kfkb_k", plan.kfkb_k},
           {"recompute", recompute_name(plan.recompute)},
           {"zero_stage", plan.zero_stage},
           {"layers_per_stage", plan.layers_per_stage},
           {"precision", plan.precision}};
  if (!plan.state_dtype.empty()) out["state_dtype"] = plan.state_dtype;
  if (plan.context > 1) out["context"] = plan.context;
  if (plan.expert > 1) out["expert"] = plan.expert;
  if (!plan.stage_groups.empty()) out["stage_groups"] = plan.stage_groups;
  if (!plan.stage_meshes.empty()) out["stage_meshes"] = plan.stage_meshes;
  if (plan.micro_batch_semantics != MicroBatchSemantics::Exact)
    out["micro_batch_semantics"] = micro_batch_semantics_name(plan.micro_batch_semantics);
  if (!plan.fused_accumulation) out["fused_accumulation"] = false;
  if (!plan.split_experts) out["split_experts"] = false;
  if (plan.compile) out["compile"] = true;
  if (plan.collective_matmul) out["collective_matmul"] = true;
  return out;
}

json plan_decisions(const Plan& plan) {
  json out = plan_degrees(plan);
  if (plan.sharding.has_value()) out["sharding"] = sharding_to_json(*plan.sharding);
  if (plan.stage_sharding.has_value()) out["stage_sharding"] = sharding_to_json(*plan.stage_sharding);
  if (!plan.stage_shardings.empty()) {
    json list = json::array();
    for (const Sharding& s : plan.stage_shardings) list.push_back(sharding_to_json(s));
    out["stage_shardings"] = std::move(list);
  }
  return out;
}

}  // namespace

json sharding_section_to_json(const Sharding& sharding) { return sharding_to_json(sharding); }
Sharding sharding_section_from_json(const json& in) { return sharding_from_json(in); }

json plan_to_json(const Plan& plan) {
  json out = plan_decisions(plan);
  if (plan.programs.has_value()) out["programs"] = json{{"plan", plan.programs->plan}, {"hash", plan.programs->hash}};
  if (plan.predicted.has_value()) {
    const Predicted& p = *plan.predicted;
    out["predicted"] = json{{"step_time", number(p.step_time)},
                            {"tflops_per_device", number(p.tflops_per_device)},
                            {"memory_per_rank", number(p.memory_per_rank)},
                            {"breakdown", numbers(p.breakdown)},
                            {"memory_breakdown", numbers(p.memory_breakdown)}};
    if (!p.collectives.empty()) {
      json list = json::array();
      for (const auto& c : p.collectives) list.push_back(collective_to_json(c));
      out["predicted"]["collectives"] = std::move(list);
    }
    if (!p.ranks_per_node.empty()) out["predicted"]["ranks_per_node"] = p.ranks_per_node;
    if (p.megatron_tflops_per_device > 0)
      out["predicted"]["megatron_tflops_per_device"] = number(p.megatron_tflops_per_device);
    if (!p.stage_devices.empty()) out["predicted"]["stage_devices"] = p.stage_devices;
    if (!p.stage_times.empty()) out["predicted"]["stage_times"] = numbers(p.stage_times);
  }
  return out;
}

Plan plan_from_json(const json& in) {
  if (!in.is_object()) throw ParseError("plan: expected a JSON object");
  static const std::set<std::string> known = {"format",      "version",    "data",           "tensor",
                                              "pipeline",    "global_batch", "micro_batch",  "schedule",
                                              "virtual_stages", "kfkb_k",  "recompute",      "zero_stage",
                                              "layers_per_stage", "stage_groups", "stage_meshes", "stage_shardings", "context", "expert",
                                              "precision", "state_dtype", "micro_batch_semantics", "fused_accumulation", "split_experts", "compile", "collective_matmul", "sharding",
                                              "stage_sharding", "programs", "predicted"};
  for (const auto& [key, value] : in.items())
    if (!known.contains(key)) throw ParseError(fmt::format("plan.{}: unknown key", key));
  if (in.contains("format") && field<std::string>(in, "format") != "shardwise.plan")
    throw ParseError(fmt::format("plan.format: expected 'shardwise.plan', got '{}'", field<std::string>(in, "format")));
  if (in.contains("version") && field<int>(in, "version") != 1)
    throw ParseError(fmt::format("plan.version: unsupported version {}", field<int>(in, "version")));
  Plan plan;
  plan.data = field<int>(in, "data");
  plan.tensor = field<int>(in, "tensor");
  plan.pipeline = field<int>(in, "pipeline");
  plan.global_batch = field<std::int64_t>(in, "global_batch");
  plan.micro_batch = field<std::int64_t>(in, "micro_batch");
  plan.schedule = schedule_from_name(field<std::string>(in, "schedule"));
  if (in.contains("virtual_stages")) plan.virtual_stages = field<int>(in, "virtual_stages");
  if (in.contains("kfkb_k")) plan.kfkb_k = field<int>(in, "kfkb_k");
  if (in.contains("recompute")) plan.recompute = recompute_from_name(field<std::string>(in, "recompute"));
  if (in.contains("zero_stage")) plan.zero_stage = field<int>(in, "zero_stage");
  if (in.contains("layers_per_stage")) plan.layers_per_stage = field<std::vector<int>>(in, "layers_per_stage");
  if (in.contains("context")) plan.context = field<int>(in, "context");
  if (in.contains("expert")) plan.expert = field<int>(in, "expert");
  if (in.contains("stage_groups")) plan.stage_groups = field<std::vector<int>>(in, "stage_groups");
  if (in.contains("stage_meshes")) plan.stage_meshes = field<std::vector<std::vector<int>>>(in, "stage_meshes");
  if (in.contains("stage_shardings")) {
    const json& list = in.at("stage_shardings");
    if (!list.is_array()) throw ParseError("plan.stage_shardings: expected an array of shardings");
    for (std::size_t s = 0; s < list.size(); ++s)
      plan.stage_shardings.push_back(sharding_from_json(list[s], fmt::format("plan.stage_shardings[{}]", s)));
  }
  if (in.contains("precision")) plan.precision = field<std::string>(in, "precision");
  if (in.contains("state_dtype")) plan.state_dtype = field<std::string>(in, "state_dtype");
  if (in.contains("micro_batch_semantics"))
    plan.micro_batch_semantics = micro_batch_semantics_from_name(field<std::string>(in, "micro_batch_semantics"));
  if (in.contains("fused_accumulation")) plan.fused_accumulation = field<bool>(in, "fused_accumulation");
  if (in.contains("split_experts")) plan.split_experts = field<bool>(in, "split_experts");
  if (in.contains("compile")) plan.compile = field<bool>(in, "compile");
  if (in.contains("collective_matmul")) plan.collective_matmul = field<bool>(in, "collective_matmul");
  if (in.contains("sharding")) plan.sharding = sharding_from_json(in.at("sharding"));
  if (in.contains("stage_sharding")) plan.stage_sharding = sharding_from_json(in.at("stage_sharding"), "plan.stage_sharding");
  if (in.contains("programs")) {
    const json& p = in.at("programs");
    if (!p.is_object()) throw ParseError("plan.programs: expected an object {plan, hash}");
    for (const auto& [key, value] : p.items())
      if (key != "plan" && key != "hash") throw ParseError(fmt::format("plan.programs.{}: unknown key", key));
    plan.programs = ProgramsRecord{field<std::string>(p, "plan"), field<std::string>(p, "hash")};
  }
  if (in.contains("predicted")) {
    const json& p = in.at("predicted");
    if (!p.is_object()) throw ParseError("plan.predicted: expected an object");
    Predicted predicted;
    predicted.step_time = field<double>(p, "step_time");
    predicted.tflops_per_device = field<double>(p, "tflops_per_device");
    if (p.contains("megatron_tflops_per_device"))
      predicted.megatron_tflops_per_device = field<double>(p, "megatron_tflops_per_device");
    if (p.contains("stage_devices")) predicted.stage_devices = field<std::vector<std::string>>(p, "stage_devices");
    if (p.contains("stage_times")) predicted.stage_times = field<std::vector<double>>(p, "stage_times");
    predicted.memory_per_rank = field<double>(p, "memory_per_rank");
    if (p.contains("breakdown")) predicted.breakdown = field<std::map<std::string, double>>(p, "breakdown");
    if (p.contains("memory_breakdown"))
      predicted.memory_breakdown = field<std::map<std::string, double>>(p, "memory_breakdown");
    if (p.contains("collectives")) {
      if (!p.at("collectives").is_array()) throw ParseError("plan.predicted.collectives: expected an array");
      for (const auto& c : p.at("collectives")) predicted.collectives.push_back(collective_from_json(c));
    }
    if (p.contains("ranks_per_node")) {
      predicted.ranks_per_node = field<std::vector<int>>(p, "ranks_per_node");
      for (int n : predicted.ranks_per_node)
        if (n <= 0) throw ParseError(fmt::format("plan.predicted.ranks_per_node: {} ranks on a node", n));
    }
    plan.predicted = std::move(predicted);
  }
  validate(plan);  // the world size fits an int from here on
  if (plan.predicted && !plan.predicted->ranks_per_node.empty()) {
    std::int64_t sum = 0;
    for (int n : plan.predicted->ranks_per_node) sum += n;
    if (sum != plan.world_size())
      throw ParseError(fmt::format("plan.predicted.ranks_per_node: {} ranks in all, the plan's world is {}", sum,
                                   plan.world_size()));
  }
  return plan;
}

std::string plan_to_json_string(const Plan& plan, int indent) { return plan_to_json(plan).dump(indent); }

Plan plan_from_json_string(std::string_view text) {
  return plan_from_json(support::parse_json(text, "plan: malformed JSON"));
}

std::uint64_t plan_hash(const Plan& plan) {
  // nlohmann's object is a std::map: dump() writes keys sorted, so the text is canonical.
  return support::fnv1a64(plan_decisions(plan).dump());
}

std::string plan_hash_hex(const Plan& plan) { return fmt::format("{:016x}", plan_hash(plan)); }

}  // namespace shardwise::plan
