#include "search/plan_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include <cctype>
#include <map>
#include <tuple>
#include <vector>

#include "search/placement.h"
#include "support/error.h"

namespace shardwise::search {

namespace {

// "transformer.h.11.attn.c_attn.weight" -> "transformer.h.*.attn.c_attn.weight": numbered
// siblings (the repeated blocks) collapse into one row. Names only, no model knowledge.
std::string block_pattern(const std::string& name) {
  std::string out;
  std::size_t i = 0;
  while (i < name.size()) {
    const bool at_start = i == 0 || name[i - 1] == '.';
    std::size_t j = i;
    while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
    if (at_start && j > i && (j == name.size() || name[j] == '.')) {
      out += '*';
      i = j;
    } else {
      out += name[i++];
    }
  }
  return out;
}

std::string bytes_text(double bytes) {
  if (bytes >= 1e9) return fmt::format("{:.2f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.1f} MB", bytes / 1e6);
  if (bytes >= 1e3) return fmt::format("{:.1f} kB", bytes / 1e3);
  return fmt::format("{:.0f} B", bytes);
}

std::string seconds_text(double s) {
  if (s >= 1) return fmt::format("{:.2f} s", s);
  if (s >= 1e-3) return fmt::format("{:.1f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

}  // namespace

std::string readable_placement(const std::string& text) {
  const auto open = text.find('[');
  if (open == std::string::npos) return text;
  Placement p;
  try {
    p = parse_placement(text);
  } catch (const support::Error&) {
    return text;
  }
  std::vector<std::string> runs;
  for (std::size_t r = 0; r < p.ratios.size();) {
    std::size_t end = r;
    while (end < p.ratios.size() && p.ratios[end] == p.ratios[r]) ++end;
    runs.push_back(fmt::format("{:.5f}{}", p.ratios[r], end - r > 1 ? fmt::format(" x{}", end - r) : ""));
    r = end;
  }
  return fmt::format("{}[{}]", text.substr(0, open), fmt::join(runs, ", "));
}

namespace {

// The experts ops (shardwise_moe::experts, whose outputs a capture names "experts", "experts_1",
// ...) a pipelined plan's stage layout splits by their experts on the tensor axis.
int experts_split_on_tensor_axis(const plan::Plan& plan) {
  if (!plan.stage_sharding || plan.tensor < 2) return 0;
  int layers = 0;
  for (const auto& [name, per_axis] : plan.stage_sharding->strategies) {
    const bool experts = name == "experts" || (name.starts_with("experts_") && name.size() > 8 &&
                                               std::all_of(name.begin() + 8, name.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }));
    if (experts && per_axis.size() == 2 && per_axis[1] == "split e") ++layers;
  }
  return layers;
}

}  // namespace

std::string plan_report(const plan::Plan& plan, double memory_capacity) {
  std::string out;
  if (plan.sharding) {
    const plan::Sharding& s = *plan.sharding;
    out += fmt::format("plan     mesh [{}] ({}), level {}, global batch {}, recompute {}\n", fmt::join(s.mesh, ", "),
                       fmt::join(s.axis_names, " x "), s.level.empty() ? "manual" : s.level, plan.global_batch,
                       plan::recompute_name(s.recompute));
  } else {
    out += fmt::format("plan     data {}{} x tensor {} x pipeline {}, global batch {}, micro-batch {}, schedule {}{}, "
                       "recompute {}, ZeRO {}\n",
                       plan.data,
                       plan.context > 1 ? fmt::format(" x context {} (each sequence split)", plan.context) : std::string(),
                       plan.tensor, plan.pipeline, plan.global_batch, plan.micro_batch,
                       plan::schedule_name(plan.schedule),
                       plan.virtual_stages > 1 ? fmt::format(" (v={})", plan.virtual_stages)
                       : plan.schedule == plan::Schedule::KFKB ? fmt::format(" (k={})", plan.kfkb_k)
                                                                : std::string(),
                       plan::recompute_name(plan.recompute), plan.zero_stage);
    if (plan.expert > 1)
      out += fmt::format("experts  each layer's experts split over the {} ranks of a stage's first axis (expert "
                         "parallelism): each holds and steps 1/{} of them, each rank's routed tokens sent to their "
                         "experts' ranks and back by all-to-all\n",
                         plan.expert, plan.expert);
    else if (const int layers = experts_split_on_tensor_axis(plan); layers > 0)
      out += fmt::format("experts  each of {} layers' experts split over the {} tensor ranks of its stage (expert "
                         "parallelism): each holds and steps 1/{} of them for every token, the sum all-reduced\n",
                         layers, plan.tensor, plan.tensor);
    if (!plan.layers_per_stage.empty())
      out += fmt::format("stages   layers per stage {}\n", fmt::join(plan.layers_per_stage, " / "));
    if (plan.micro_batch_semantics == plan::MicroBatchSemantics::PerMicroBatch && plan.num_micro_batches() > 1)
      out += "micro-batches per micro-batch: batch statistics are each micro-batch's and a loss that is not a sum "
             "over samples is the mean of the micro-batches' (not one device's step)\n";
  }
  if (plan.predicted) {
    const plan::Predicted& p = *plan.predicted;
    out += fmt::format("predicted step {}, {:.1f} TFLOP/s per device, memory {} per rank{}\n",
                       seconds_text(p.step_time), p.tflops_per_device, bytes_text(p.memory_per_rank),
                       memory_capacity > 0 ? fmt::format(" (of {})", bytes_text(memory_capacity)) : "");
    // Three entries are not amounts: whether the data-parallel sync overlaps the backward (a
    // flag among the seconds), one pipeline send's seconds (shown beside the sends waited
    // for) and which pipeline stage is the most loaded (among the bytes).
    std::vector<std::string> parts;
    bool overlapped = false;
    const auto transfer = p.breakdown.find("pipeline_transfer");
    for (const auto& [name, seconds] : p.breakdown) {
      if (name == "data_parallel_overlapped") {
        overlapped = seconds != 0;
        continue;
      }
      if (name == "pipeline_transfer") continue;
      std::string part = fmt::format("{} {}", name, seconds_text(seconds));
      if (name == "context_parallel") part += " (the sequence split's sends waited for, within compute)";
      if (name == "expert_parallel") part += " (the experts' token gathers and reduce-scatters, within compute)";
      if (name == "pipeline_p2p" && transfer != p.breakdown.end() && transfer->second > 0)
        part += fmt::format(" ({} a send)", seconds_text(transfer->second));
      parts.push_back(part);
    }
    out += fmt::format("time     {}{}\n", fmt::join(parts, " | "),
                       overlapped ? " (data-parallel sync beside backward)" : "");
    parts.clear();
    std::string stage;
    for (const auto& [name, bytes] : p.memory_breakdown) {
      if (name == "stage") {
        stage = fmt::format(" (pipeline stage {})", static_cast<long long>(bytes));
        continue;
      }
      parts.push_back(fmt::format("{} {}", name, bytes_text(bytes)));
    }
    if (!parts.empty()) out += fmt::format("memory   {}{}\n", fmt::join(parts, " | "), stage);
  }
  if (!plan.sharding) return out;

  const plan::Sharding& s = *plan.sharding;
  // Parameters, buffers and inputs: the leaves, in graph order.
  std::map<std::string, std::pair<int, std::string>> rows;  // pattern + placement -> (count, placement text)
  std::vector<std::string> order;
  for (const std::string& name : s.leaves) {
    auto found = s.placements.find(name);
    if (found == s.placements.end()) continue;
    std::vector<std::string> shown;
    for (const std::string& placement : found->second) shown.push_back(readable_placement(placement));
    std::string text = fmt::format("[{}]", fmt::join(shown, ", "));
    if (auto z = s.zero.find(name); z != s.zero.end()) text += fmt::format(" zero on axis {}", fmt::join(z->second, ","));
    const std::string key = block_pattern(name) + "  " + text;
    auto [it, added] = rows.try_emplace(key, 0, text);
    it->second.first += 1;
    if (added) order.push_back(key);
  }
  out += "parameters and inputs (placement per mesh axis; names that differ only in a block number are one row)\n";
  for (const auto& key : order) {
    const auto& [count, text] = rows.at(key);
    const std::string pattern = key.substr(0, key.size() - text.size() - 2);
    out += fmt::format("  {:<48} {:>4}  {}\n", pattern, count > 1 ? fmt::format("x{}", count) : "", text);
  }
  if (plan.predicted && !plan.predicted->collectives.empty()) {
    // kind, axis, phase -> calls, bytes, seconds
    std::map<std::tuple<std::string, int, std::string>, std::tuple<double, double, double>> groups;
    for (const auto& c : plan.predicted->collectives) {
      auto& [calls, bytes, seconds] = groups[{c.kind, c.axis, c.phase}];
      calls += c.count;
      bytes += c.count * c.bytes;
      seconds += c.count * c.seconds;
    }
    out += "collectives per step (kind, mesh axis, phase: calls, bytes in all, seconds in all)\n";
    for (const auto& [key, totals] : groups) {
      const auto& [kind, axis, phase] = key;
      const auto& [calls, bytes, seconds] = totals;
      out += fmt::format("  {:<15} axis {}  {:<9} {:>6.0f} calls  {:>10}  {:>9}\n", kind, axis, phase, calls,
                         bytes_text(bytes), seconds_text(seconds));
    }
  }
  return out;
}

}  // namespace shardwise::search
