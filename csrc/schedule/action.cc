#include "schedule/action.h"

#include <fmt/format.h>

namespace shardwise::schedule {

std::string to_string(const Action& a) {
  switch (a.kind) {
    case ActionKind::Forward: return fmt::format("F{}@s{}", a.micro_batch, a.stage);
    case ActionKind::Backward: return fmt::format("B{}@s{}", a.micro_batch, a.stage);
    case ActionKind::WeightGradient: return fmt::format("W{}@s{}", a.micro_batch, a.stage);
    case ActionKind::SendActivation: return fmt::format("SA{}@s{}->r{}", a.micro_batch, a.stage, a.peer);
    case ActionKind::SendGradient: return fmt::format("SG{}@s{}->r{}", a.micro_batch, a.stage, a.peer);
    case ActionKind::RecvActivation: return fmt::format("RA{}@s{}<-r{}", a.micro_batch, a.stage, a.peer);
    case ActionKind::RecvGradient: return fmt::format("RG{}@s{}<-r{}", a.micro_batch, a.stage, a.peer);
    case ActionKind::OptimizerStep: return "OPT";
    case ActionKind::GradSync: return "SYNC";
  }
  return "?";
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
