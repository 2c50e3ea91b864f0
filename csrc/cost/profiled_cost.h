// Profiled mode: a CostModel that answers with times measured on a real device and a real
// process group where it has them, and with the analytic model (op_cost.h,
// collective_cost.h) everywhere else — and says which is which.
//
// Profile (plain data; JSON in and out) holds what python/shardwise/profile.py measured:
//  - ops: per node signature (node_signature below), the forward and backward seconds of
//    one call at the graph's recorded shapes and dtypes. The signature leaves out value
//    names and module paths, so the same op at the same shapes in 96 repeated layers is
//    one entry, measured once.
//  - skipped: signatures the profiler could not rebuild or time, with the reason (kept so a
//    report can say *why* a node stayed analytic); "collective:<kind>" for a collective the
//    backend could not run. Informational only: the model never reads it.
//  - collectives: per CollectiveKind and group size, an alpha-beta fit
//    time = alpha + beta x bytes, least squares over measured sizes of the live process
//    group. `bytes` follows collective_cost.h (always the whole buffer: the all-gather
//    output, the reduce-scatter input, ...), so fitted and analytic numbers are comparable.
//
// ProfiledCostModel:
//  - node_time, per-rank shapes first: when the planner gives the context's local shapes
//    (NodeContext::local_shapes; it does, since this model wants_local_shapes) and the
//    profile holds the node measured at exactly those shapes (local_signature), that
//    measurement, unscaled: what one rank runs, timed as it runs (issue 46, item 7; a GEMM's
//    rate on a CPU or GPU moves with its shape far more than the analytic curve says).
//    shardwise.profile(graph, plans=...) measures the shapes a plan asks for
//    (RecordingCostModel, recording_cost.h, says which). An FP8 linear of an fp8 plan is
//    found only under fp8_signature (measured through runtime/fp8.py), never under its
//    model-dtype keys.
//  - node_time otherwise: for a node whose signature is in the profile, the measured time, scaled to
//    the plan's NodeContext by the analytic model's own ratio:
//        measured x analytic(context) / analytic(no context)
//    (a graph measured at batch 2 costed at micro-batch 8 on 4 tensor-parallel shards scales
//    like the analytic model says, while its absolute level is the device's real one). With
//    the default context (what the profile measured) it is exactly the measured value. When
//    the analytic time of the unscaled node is 0 (aliases: view, transpose) the measured
//    time is used unscaled (a launch overhead does not grow with the tensor). Other nodes:
//    the fallback AnalyticCostModel.
//    The measured numbers describe the profile's device at the graph's dtypes; the plan's
//    Precision and the cluster's DeviceType change only the analytic fallback. Costing a
//    profile measured on one device against a cluster of another is the caller's choice.
//  - node_time of a compiled plan's node (NodeContext::compiled): the eager answer above,
//    scaled by the analytic model's compiled / eager ratio (a fused kernel's saved bytes; a
//    product's time unchanged). The profile measures eager kernels only.
//  - collective_time: alpha + beta x bytes when (kind, ranks.size()) was fitted, else the
//    fallback's alpha-beta model on the cluster, plus the profile's sync_wait either way. The
//    algorithm argument is ignored for a measured fit: the live library picked its own. One
//    rank or zero bytes cost 0.
//  - sync_wait: what a blocking collective costs in a program beyond its fit, which is timed
//    back to back with its ranks started together: after each rank has computed, it waits
//    for the last of them to arrive and for the library's threads to wake (profile.py,
//    measure_sync_wait: 10 ms of compute on every rank, then a small all-reduce, against the
//    two apart). On this 2-core CPU 0 to 2.3 ms a call at 2 processes, 0 to 4.3 at 4
//    (2026-12-06, each benchmarks/fidelity.py plan's own); every collective and every
//    pipeline send a program waits on pays it once.
//  - time_slicing: the ops' times already include it (node_time reads them as they are); a
//    record of the factor, not a term.
//  - provenance / coverage: which numbers are measured. provenance(graph, node) and
//    collective_provenance(kind, n) answer statically; coverage(graph) counts the graph's
//    nodes; calls() counts what node_time / collective_time actually answered since
//    construction (or reset_calls()), so a report can say "92% of the costed node times and
//    0 of 14 collective estimates were measured". The counters are atomics: they never
//    change a result, and a const model may be shared by threads.
//
// Errors: a negative or non-finite time, alpha < 0, beta < 0, group size < 1, an unknown
// collective name -> support::ValidationError (naming the entry); malformed JSON, a wrong
// type or an unknown key -> support::ParseError.
//
// Worked example:
//   Profile p;  p.device = "cpu";
//   p.ops["aten::gelu(f32[2,32,256])->(f32[2,32,256]){approximate=\"none\"}"] = {2.0e-5, 5.0e-5};
//   p.collectives[CollectiveKind::AllReduce][2] = {1.0e-4, 2.0e-9};   // 100 us + 2 ns/byte
//   ProfiledCostModel m(p);
//   m.node_time(g, gelu_node, cpu, Precision::F32, {});   // {2.0e-5, 5.0e-5}: measured
//   m.node_time(g, gelu_node, cpu, Precision::F32, {.batch_scale = 2});   // ~{4e-5, 1e-4}
//   std::vector<int> r = {0, 1};
//   m.collective_time(c, CollectiveKind::AllReduce, r, 1 << 20, Algorithm::Auto);
//     // 1e-4 + 2e-9 x 1048576 = 2.197 ms, measured
//   m.provenance(g, gelu_node);   // Provenance::Measured
//   m.coverage(g);                // {nodes_measured 1, nodes_analytic (the rest), ...}
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <vector>
#include <string>
#include <string_view>

#include "cost/cluster.h"
#include "cost/collective_cost.h"
#include "cost/op_cost.h"
#include "ir/graph.h"

namespace shardwise::cost {

enum class Provenance : std::uint8_t { Measured, Analytic };
std::string_view provenance_name(Provenance provenance);  // "measured", "analytic"

// The key of a node's measurement: op, input and output types (dtype and shape, without
// the batch marker: a measurement is of concrete shapes) and attributes, e.g.
//   aten::linear(f32[2,32,64],f32[192,64],f32[192])->(f32[2,32,192]){}
// Value names and module paths are left out on purpose (repeated blocks share one key).
std::string node_signature(const ir::Graph& graph, const ir::Node& node);
// The same key with each operand's shape replaced by `shapes` (inputs then outputs, as
// NodeContext::local_shapes): the node as one rank runs it. Throws ValidationError when
// `shapes` does not have one entry per operand.
std::string local_signature(const ir::Graph& graph, const ir::Node& node,
                            std::span<const std::vector<std::int64_t>> shapes);
// The key of an FP8 linear (analysis::fp8_linear) of an fp8 plan measured as it runs there
// (runtime/fp8.py: casts, torch._scaled_mm, dW in high precision): "fp8:" + local_signature.
// A measurement of the node in the model's dtype never prices its FP8 run.
inline constexpr std::string_view kFp8SignaturePrefix = "fp8:";
std::string fp8_signature(const ir::Graph& graph, const ir::Node& node,
                          std::span<const std::vector<std::int64_t>> shapes);
// Whether `node` runs as an FP8 linear in a plan of `precision` (analysis::fp8_linear, fp8 plans).
bool runs_fp8(const ir::Graph& graph, const ir::Node& node, Precision precision);
// The key `node` at one rank's `shapes` is measured under and looked up by, in a plan of
// `precision`: fp8_signature where it runs_fp8, local_signature otherwise. The recorder
// (recording_cost.h) and ProfiledCostModel both key by it, so what one records the other finds.
std::string rank_signature(const ir::Graph& graph, const ir::Node& node, Precision precision,
                           std::span<const std::vector<std::int64_t>> shapes);

struct MeasuredOp {
  double forward = 0;   // seconds, one call
  double backward = 0;  // seconds, one call (0: no differentiable input)
  // Seconds of one call under selective recomputation's policy, forward and replay together
  // (profile.py runs it in the runtime's own checkpoint contexts); < 0: not measured. On this
  // CPU the policy's dispatch mode costs 20 to 180 us an op beyond the op (2026-12-06), more
  // than the cheap ops it recomputes: OpTime::selective_extra = selective - forward.
  double selective = -1;

  // OpTime::selective_extra of this measurement: selective - forward (>= 0), or -1 unmeasured.
  double selective_extra() const { return selective >= 0 ? std::max(0.0, selective - forward) : -1.0; }

  friend bool operator==(const MeasuredOp&, const MeasuredOp&) = default;
};

struct AlphaBetaFit {
  double alpha = 0;  // seconds per call
  double beta = 0;   // seconds per byte

  double time(std::int64_t bytes) const { return alpha + beta * static_cast<double>(bytes); }
  friend bool operator==(const AlphaBetaFit&, const AlphaBetaFit&) = default;
};

// The optimizer's step as measured: seconds per parameter element a rank holds the state of
// (shardwise.profile.measure_optimizer: torch.optim's AdamW, its default implementation, in the parameters'
// dtype, with every rank of the node stepping at once as a step's ranks do).
struct MeasuredOptimizer {
  std::string name;  // e.g. "AdamW"
  double seconds_per_element = 0;

  friend bool operator==(const MeasuredOptimizer&, const MeasuredOptimizer&) = default;
};

struct Profile {
  std::string device;                                          // e.g. "cpu", "NVIDIA H100 80GB HBM3"
  std::map<std::string, MeasuredOp, std::less<>> ops;          // node signature -> times
  std::map<std::string, std::string, std::less<>> skipped;     // node signature -> why not measured
  std::map<CollectiveKind, std::map<int, AlphaBetaFit>> collectives;  // kind -> group size -> fit
  std::optional<MeasuredOptimizer> optimizer;                  // none: the analytic bandwidth rule
  double sync_wait = 0;  // seconds a blocking collective waits beyond its fit (header comment); 0: not measured
  // What the op times were multiplied by for the CPU a rank loses to the scheduler slicing its
  // core between more ranks than cores (profile.py, measure_time_slicing): folded into `ops`
  // already, kept so a profile says what it holds. 1: none (a GPU, or a core a rank).
  double time_slicing = 1.0;

  friend bool operator==(const Profile&, const Profile&) = default;
};

// Throws ValidationError naming the entry (see the header comment).
void validate_profile(const Profile& profile);

// JSON (version 1):
//   {"format": "shardwise.profile", "version": 1, "device": "cpu",
//    "ops": {"<signature>": {"forward": 2.0e-5, "backward": 5.0e-5}, ...},  ("selective": s, optional)
//    "skipped": {"<signature>": "reason", ...},
//    "collectives": {"all_reduce": {"2": {"alpha": 1.0e-4, "beta": 2.0e-9}}, ...},
//    "optimizer": {"name": "AdamW", "seconds_per_element": 3.0e-9},
//    "sync_wait": 1.0e-3, "time_slicing": 1.06}
// "format", "version", "skipped", "collectives", "optimizer", "sync_wait" and "time_slicing"
// are optional on input; "sync_wait" is written only when above 0, "time_slicing" (in [1, 2])
// only when above 1.
nlohmann::json profile_to_json(const Profile& profile);
Profile profile_from_json(const nlohmann::json& json);
std::string profile_to_json_string(const Profile& profile, int indent = -1);
Profile profile_from_json_string(std::string_view text);

struct ProfileCoverage {
  // Static, over a graph (coverage(graph)).
  int nodes_measured = 0;
  int nodes_analytic = 0;
  // Dynamic, over calls answered (calls()).
  std::int64_t node_calls_measured = 0;
  std::int64_t node_calls_analytic = 0;
  std::int64_t collective_calls_measured = 0;
  std::int64_t collective_calls_analytic = 0;

  friend bool operator==(const ProfileCoverage&, const ProfileCoverage&) = default;
};

class ProfiledCostModel final : public CostModel {
 public:
  // Validates the profile (ValidationError).
  explicit ProfiledCostModel(Profile profile, AnalyticCostModel fallback = AnalyticCostModel{});
  // The counters are atomics; a model is built once and passed by reference.
  ProfiledCostModel(const ProfiledCostModel&) = delete;
  ProfiledCostModel& operator=(const ProfiledCostModel&) = delete;

  const Profile& profile() const { return profile_; }
  const AnalyticCostModel& fallback() const { return fallback_; }

  OpTime node_time(const ir::Graph& graph, const ir::Node& node, const DeviceType& device, Precision precision,
                   const NodeContext& context) const override;
  double collective_time(const Cluster& cluster, CollectiveKind kind, std::span<const int> ranks,
                         std::int64_t bytes, Algorithm algorithm) const override;

  // True when the profile holds any op: the planner then says the shapes each rank runs.
  bool wants_local_shapes() const override { return !profile_.ops.empty(); }
  std::optional<double> optimizer_seconds_per_element() const override {
    return profile_.optimizer ? std::optional<double>(profile_.optimizer->seconds_per_element) : std::nullopt;
  }

  Provenance provenance(const ir::Graph& graph, const ir::Node& node) const;
  Provenance collective_provenance(CollectiveKind kind, int group_size) const;

  // Node counts of `graph` (the call counters are left 0).
  ProfileCoverage coverage(const ir::Graph& graph) const;
  // Call counters since construction or reset_calls() (the node counts are left 0).
  ProfileCoverage calls() const;
  void reset_calls() const;

 private:
  const AlphaBetaFit* find_fit(CollectiveKind kind, int group_size) const;

  Profile profile_;
  AnalyticCostModel fallback_;
  mutable std::atomic<std::int64_t> node_measured_{0};
  mutable std::atomic<std::int64_t> node_analytic_{0};
  mutable std::atomic<std::int64_t> collective_measured_{0};
  mutable std::atomic<std::int64_t> collective_analytic_{0};
};

}  // namespace shardwise::cost
