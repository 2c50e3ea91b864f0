#include "schedule/action.h"

#include <fmt/format.h>

namespace shardwise::schedule {

std::string_view action_kind_code(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward: return "F";
    case ActionKind::Backward: return "B";
    case ActionKind::WeightGradient: return "W";
    case ActionKind::SendActivation: return "SA";
    case ActionKind::SendGradient: return "SG";
    case ActionKind::RecvActivation: return "RA";
    case ActionKind::RecvGradient: return "RG";
    case ActionKind::OptimizerStep: return "OPT";
    case ActionKind::GradSync: return "SYNC";
  }
  return "?";
}

std::string to_string(const Action& a) {
  const std::string_view code = action_kind_code(a.kind);
  if (a.is_send()) return fmt::format("{}{}@s{}->r{}", code, a.micro_batch, a.stage, a.peer);
  if (a.is_recv()) return fmt::format("{}{}@s{}<-r{}", code, a.micro_batch, a.stage, a.peer);
  if (a.is_compute()) return fmt::format("{}{}@s{}", code, a.micro_batch, a.stage);
  return std::string(code);
}

bool PipelineSchedule::splits_backward() const {
  for (const auto& list : per_rank)
    for (const Action& a : list)
      if (a.kind == ActionKind::WeightGradient) return true;
  return false;
}

std::string to_string(const std::vector<Action>& actions) {
  std::string out;
  for (const auto& a : actions) {
    if (!out.empty()) out += ' ';
    out += to_string(a);
  }
  return out;
}

}  // namespace shardwise::schedule
