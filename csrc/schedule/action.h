// One step of a pipeline schedule, as plain data, and a whole schedule as one list of
// such steps per rank. This is the single source of truth of the runtime rules: the
// executor runs these lists, the simulator (simulator.h) costs the very same lists.
//
// Contract:
//   - `stage` is a virtual stage index in [0, ranks * virtual_stages). Virtual stage g
//     lives on rank g % ranks (chunk g / ranks of that rank), or in a V (rank_of_stage
//     below), see schedules.h.
//   - Forward / Backward / WeightGradient: `stage`, `micro_batch` set, `peer` == -1. In a
//     schedule with WeightGradient actions (zero-bubble, Qi et al. 2024) Backward computes
//     the input's gradient only (B) and WeightGradient the weights' (W), which may run
//     later: every (stage, micro-batch) then has one of each, W after B on its rank.
//     Without them, Backward is the whole backward.
//   - SendActivation: the activation that `stage` produced for micro-batch `micro_batch`
//     goes to rank `peer` (which owns stage + 1). SendGradient: the input gradient that
//     backward of `stage` produced goes to rank `peer` (which owns stage - 1).
//   - RecvActivation / RecvGradient: `stage` is the *consuming* stage, `peer` the sender.
//     So RecvActivation{stage g} matches SendActivation{stage g - 1}, and RecvGradient
//     {stage g} matches SendGradient{stage g + 1}.
//   - OptimizerStep / GradSync: rank-wide, `stage` == `micro_batch` == `peer` == -1.
//
// Example: with 2 ranks, rank 0 of GPipe(2, 1) is
//   F0@s0  SA0@s0->r1  RG0@s0<-r1  B0@s0  OPT
// (forward, ship the activation, wait for the gradient, backward, update).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace shardwise::schedule {

enum class ActionKind {
  Forward,
  Backward,
  WeightGradient,
  SendActivation,
  SendGradient,
  RecvActivation,
  RecvGradient,
  OptimizerStep,
  GradSync,
};

struct Action {
  ActionKind kind = ActionKind::Forward;
  int stage = -1;
  int micro_batch = -1;
  int peer = -1;

  static Action forward(int stage, int micro_batch) { return {ActionKind::Forward, stage, micro_batch, -1}; }
  static Action backward(int stage, int micro_batch) { return {ActionKind::Backward, stage, micro_batch, -1}; }
  static Action weight_gradient(int stage, int micro_batch) {
    return {ActionKind::WeightGradient, stage, micro_batch, -1};
  }
  static Action optimizer_step() { return {ActionKind::OptimizerStep, -1, -1, -1}; }
  static Action grad_sync() { return {ActionKind::GradSync, -1, -1, -1}; }

  bool is_compute() const {
    return kind == ActionKind::Forward || kind == ActionKind::Backward || kind == ActionKind::WeightGradient;
  }
  bool is_send() const { return kind == ActionKind::SendActivation || kind == ActionKind::SendGradient; }
  bool is_recv() const { return kind == ActionKind::RecvActivation || kind == ActionKind::RecvGradient; }

  friend bool operator==(const Action&, const Action&) = default;
};

// The kind's code in the text form: "F", "B", "W", "SA", "SG", "RA", "RG", "OPT", "SYNC".
std::string_view action_kind_code(ActionKind kind);

// Short text form: "F3@s1", "B0@s0", "W0@s0", "SA2@s1->r1", "SG2@s1->r0", "RA2@s2<-r1",
// "RG2@s0<-r1", "OPT", "SYNC". Used in error messages and test failure output.
std::string to_string(const Action& action);

// A schedule: per_rank[r] is the ordered list of actions rank r runs in one step.
struct PipelineSchedule {
  int ranks = 0;
  int micro_batches = 0;
  int virtual_stages = 1;  // chunks per rank; total stages = ranks * virtual_stages
  std::vector<std::vector<Action>> per_rank;
  // The V placement (ZB-V, schedules.h): two chunks per rank, stage g on rank g for g < p and
  // on rank 2p - 1 - g after, so the last stage is on rank 0. Otherwise round-robin.
  bool v_shape = false;

  int total_stages() const { return ranks * virtual_stages; }
  int rank_of_stage(int stage) const {
    return v_shape ? (stage < ranks ? stage : 2 * ranks - 1 - stage) : stage % ranks;
  }
  // Whether any rank's list splits a stage's backward into B and W (has a WeightGradient).
  bool splits_backward() const;
};

// Space-separated text of one rank's actions, e.g. "F0@s0 F1@s0 B0@s0 ...".
std::string to_string(const std::vector<Action>& actions);

}  // namespace shardwise::schedule
