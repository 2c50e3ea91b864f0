#include "schedule/schedules.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "support/error.h"

namespace shardwise::schedule {
namespace {

void check_shape(const char* name, int ranks, int micro_batches) {
  if (ranks < 1) throw support::ValidationError(fmt::format("{}: ranks must be >= 1, got {}", name, ranks));
  if (micro_batches < 1) {
    throw support::ValidationError(fmt::format("{}: micro_batches must be >= 1, got {}", name, micro_batches));
  }
}

// Turns per-rank compute orders into full action lists: a Recv right before each
// compute whose input comes from another rank, a Send right after each compute whose
// output goes to another rank, and an OptimizerStep at the end. `group` > 1 (kFkB):
// the receives of a group (its k forwards, or its k backwards: micro-batches i with the same
// i / k, consecutive in the list) are all posted before the group's first action, so that
// transfers of the group's later micro-batches run beside its first computations. The
// runtime posts a receive where its action stands and the transports start a transfer only
// once it is posted (simulator.h), so this is where kFkB's grouping hides its sends.
PipelineSchedule with_communication(int ranks, int micro_batches, int virtual_stages,
                                    const std::vector<std::vector<Action>>& compute, bool v_shape = false,
                                    int group = 1) {
  PipelineSchedule s{ranks, micro_batches, virtual_stages, {}, v_shape};
  const int last = s.total_stages() - 1;
  s.per_rank.resize(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    auto& out = s.per_rank[static_cast<std::size_t>(r)];
    auto receive = [&](const Action& a) -> std::optional<Action> {
      const int g = a.stage;
      if (a.kind == ActionKind::Forward && g > 0 && s.rank_of_stage(g - 1) != r)
        return Action{ActionKind::RecvActivation, g, a.micro_batch, s.rank_of_stage(g - 1)};
      if (a.kind == ActionKind::Backward && g < last && s.rank_of_stage(g + 1) != r)
        return Action{ActionKind::RecvGradient, g, a.micro_batch, s.rank_of_stage(g + 1)};
      return std::nullopt;
    };
    const auto& list = compute[static_cast<std::size_t>(r)];
    for (std::size_t at = 0; at < list.size();) {
      // The run of actions of one group: the same kind and stage, micro-batches i / group alike.
      std::size_t end = at + 1;
      while (group > 1 && end < list.size() && list[end].kind == list[at].kind && list[end].stage == list[at].stage &&
             list[end].micro_batch / group == list[at].micro_batch / group)
        ++end;
      for (std::size_t j = at; j < end; ++j)
        if (auto recv = receive(list[j])) out.push_back(*recv);
      for (std::size_t j = at; j < end; ++j) {
        const Action& a = list[j];
        const int g = a.stage;
        const int i = a.micro_batch;
        out.push_back(a);
        if (a.kind == ActionKind::Forward && g < last && s.rank_of_stage(g + 1) != r)
          out.push_back({ActionKind::SendActivation, g, i, s.rank_of_stage(g + 1)});
        if (a.kind == ActionKind::Backward && g > 0 && s.rank_of_stage(g - 1) != r)
          out.push_back({ActionKind::SendGradient, g, i, s.rank_of_stage(g - 1)});
      }
      at = end;
    }
    out.push_back(Action::optimizer_step());
  }
  return s;
}

// 1F1B over groups of k micro-batches; k = 1 is plain 1F1B.
std::vector<Action> grouped_1f1b_order(int ranks, int micro_batches, int rank, int k) {
  const int groups = (micro_batches + k - 1) / k;
  auto group = [&](int gi, ActionKind kind, std::vector<Action>& out) {
    for (int i = gi * k; i < std::min(micro_batches, (gi + 1) * k); ++i) out.push_back({kind, rank, i, -1});
  };
  std::vector<Action> out;
  const int warmup = std::min(ranks - 1 - rank, groups);
  for (int gi = 0; gi < warmup; ++gi) group(gi, ActionKind::Forward, out);
  for (int gi = 0; gi < groups - warmup; ++gi) {
    group(warmup + gi, ActionKind::Forward, out);
    group(gi, ActionKind::Backward, out);
  }
  for (int gi = groups - warmup; gi < groups; ++gi) group(gi, ActionKind::Backward, out);
  return out;
}

}  // namespace

PipelineSchedule gpipe(int ranks, int micro_batches) {
  check_shape("gpipe", ranks, micro_batches);
  std::vector<std::vector<Action>> compute(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    for (int i = 0; i < micro_batches; ++i) compute[static_cast<std::size_t>(r)].push_back(Action::forward(r, i));
    for (int i = 0; i < micro_batches; ++i) compute[static_cast<std::size_t>(r)].push_back(Action::backward(r, i));
  }
  return with_communication(ranks, micro_batches, 1, compute);
}

PipelineSchedule kfkb(int ranks, int micro_batches, int k) {
  check_shape("kfkb", ranks, micro_batches);
  if (k < 1) throw support::ValidationError(fmt::format("kfkb: k must be >= 1, got {}", k));
  std::vector<std::vector<Action>> compute;
  for (int r = 0; r < ranks; ++r) compute.push_back(grouped_1f1b_order(ranks, micro_batches, r, k));
  return with_communication(ranks, micro_batches, 1, compute, false, k);
}

PipelineSchedule one_f_one_b(int ranks, int micro_batches) {
  check_shape("one_f_one_b", ranks, micro_batches);
  return kfkb(ranks, micro_batches, 1);
}

PipelineSchedule interleaved_1f1b(int ranks, int micro_batches, int virtual_stages) {
  check_shape("interleaved_1f1b", ranks, micro_batches);
  if (virtual_stages < 1) {
    throw support::ValidationError(fmt::format("interleaved_1f1b: virtual_stages must be >= 1, got {}", virtual_stages));
  }
  if (micro_batches % ranks != 0) {
    throw support::ValidationError(fmt::format(
        "interleaved_1f1b: micro_batches ({}) must be a multiple of ranks ({})", micro_batches, ranks));
  }
  const int p = ranks;
  const int v = virtual_stages;
  const int steps = micro_batches * v;  // forward (and backward) micro-steps per rank
  std::vector<std::vector<Action>> compute(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    // Megatron's mapping of micro-step k to (chunk, micro-batch): rounds of p
    // micro-batches walk through the chunks, forward ascending, backward descending.
    auto mb = [&](int k) { return (k / (p * v)) * p + k % p; };
    auto fwd = [&](int k) { return Action::forward(((k / p) % v) * p + r, mb(k)); };
    auto bwd = [&](int k) { return Action::backward((v - 1 - (k / p) % v) * p + r, mb(k)); };
    const int warmup = v == 1 ? std::min(p - r - 1, steps) : std::min((p - r - 1) * 2 + (v - 1) * p, steps);
    auto& out = compute[static_cast<std::size_t>(r)];
    for (int k = 0; k < warmup; ++k) out.push_back(fwd(k));
    for (int k = 0; k < steps - warmup; ++k) {
      out.push_back(fwd(warmup + k));
      out.push_back(bwd(k));
    }
    for (int k = steps - warmup; k < steps; ++k) out.push_back(bwd(k));
  }
  return with_communication(p, micro_batches, v, compute);
}

PipelineSchedule zero_bubble_h1(int ranks, int micro_batches) {
  check_shape("zero_bubble_h1", ranks, micro_batches);
  const int p = ranks, m = micro_batches;
  // One action per tick on every rank, in micro-batch order per kind; an action's result is
  // visible from the next tick. Each tick a rank runs, of what is ready: the oldest input
  // gradient (B: the critical path runs through it), else the next forward while fewer than
  // p micro-batches hold activations on it (one is held from its F to its W: 1F1B's peak,
  // its first rank's), else the oldest weight gradient (W: nothing waits for it, so it fills
  // the bubbles).
  std::vector<std::vector<int>> f_done(static_cast<std::size_t>(p), std::vector<int>(static_cast<std::size_t>(m), -1));
  std::vector<std::vector<int>> b_done = f_done;
  std::vector<int> next_f(static_cast<std::size_t>(p), 0), next_b = next_f, next_w = next_f, held = next_f;
  std::vector<std::vector<Action>> compute(static_cast<std::size_t>(p));
  auto at = [](std::vector<std::vector<int>>& done, int r, int i) -> int& {
    return done[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
  };
  for (int t = 0, left = 3 * p * m; left > 0; ++t) {
    std::vector<ActionKind> chosen(static_cast<std::size_t>(p), ActionKind::OptimizerStep);  // none
    for (int r = 0; r < p; ++r) {
      const auto u = static_cast<std::size_t>(r);
      const int b = next_b[u], f = next_f[u];
      if (b < f && at(f_done, r, b) <= t && (r == p - 1 || (at(b_done, r + 1, b) >= 0 && at(b_done, r + 1, b) <= t)))
        chosen[u] = ActionKind::Backward;
      else if (f < m && held[u] < p && (r == 0 || (at(f_done, r - 1, f) >= 0 && at(f_done, r - 1, f) <= t)))
        chosen[u] = ActionKind::Forward;
      else if (next_w[u] < b)
        chosen[u] = ActionKind::WeightGradient;
    }
    for (int r = 0; r < p; ++r) {
      const auto u = static_cast<std::size_t>(r);
      switch (chosen[u]) {
        case ActionKind::Forward:
          compute[u].push_back(Action::forward(r, next_f[u]));
          at(f_done, r, next_f[u]++) = t + 1;
          ++held[u];
          break;
        case ActionKind::Backward:
          compute[u].push_back(Action::backward(r, next_b[u]));
          at(b_done, r, next_b[u]++) = t + 1;
          break;
        case ActionKind::WeightGradient:
          compute[u].push_back(Action::weight_gradient(r, next_w[u]++));
          --held[u];
          break;
        default: continue;
      }
      --left;
    }
  }
  return with_communication(ranks, micro_batches, 1, compute);
}

namespace {

// The unit-time list schedule (schedules.h): fewer micro-batches than 2p, where torch's order
// pads to 2p - 1 and idles.
PipelineSchedule zero_bubble_v_list(int ranks, int micro_batches) {
  const int p = ranks, m = micro_batches, stages = 2 * p;
  // Per stage: the tick each micro-batch's F and B finished (-1: not yet), and the next
  // micro-batch of each kind (micro-batch order within a stage and kind).
  std::vector<std::vector<int>> f_done(static_cast<std::size_t>(stages), std::vector<int>(static_cast<std::size_t>(m), -1));
  std::vector<std::vector<int>> b_done = f_done;
  std::vector<int> next_f(static_cast<std::size_t>(stages), 0), next_b = next_f, next_w = next_f;
  std::vector<int> held(static_cast<std::size_t>(p), 0);  // chunk activations held, F to W
  const int limit = 2 * p;  // 1F1B's first rank: p micro-batches of a whole stage, two chunks each
  auto done_by = [](const std::vector<std::vector<int>>& done, int g, int i, int t) {
    const int at = done[static_cast<std::size_t>(g)][static_cast<std::size_t>(i)];
    return at >= 0 && at <= t;
  };
  std::vector<std::vector<Action>> compute(static_cast<std::size_t>(p));
  for (int t = 0, left = 3 * stages * m; left > 0; ++t) {
    if (t > 100 * stages * m)
      throw support::ValidationError(fmt::format("zero_bubble_v({}, {}): no progress (internal)", p, m));
    std::vector<Action> chosen(static_cast<std::size_t>(p), Action::optimizer_step());  // none
    for (int r = 0; r < p; ++r) {
      // The rank's chunks: the first on the way down (stage r), the second on the way back
      // (stage 2p - 1 - r, whose forward leads to the loss on rank 0).
      const int first = r, second = stages - 1 - r;
      auto b_ready = [&](int g) {
        const int i = next_b[static_cast<std::size_t>(g)];
        return i < next_f[static_cast<std::size_t>(g)] && done_by(f_done, g, i, t) &&
               (g == stages - 1 || done_by(b_done, g + 1, i, t));
      };
      auto f_ready = [&](int g) {
        const int i = next_f[static_cast<std::size_t>(g)];
        return i < m && (g == 0 || done_by(f_done, g - 1, i, t));
      };
      auto oldest = [&](const std::vector<int>& next, int a, int b) {  // the older micro-batch, the later stage on a tie
        return next[static_cast<std::size_t>(b)] <= next[static_cast<std::size_t>(a)] ? b : a;
      };
      const bool b1 = b_ready(first), b2 = b_ready(second);
      const auto u = static_cast<std::size_t>(r);
      // B first (the critical path runs through it), then F (the second chunk first, and a
      // first-chunk F only while a slot stays free for a second-chunk one, so the oldest
      // micro-batch can always go on), then W (nothing waits for it: it fills the bubbles).
      if (b1 || b2) {
        const int g = b1 && b2 ? oldest(next_b, first, second) : b1 ? first : second;
        chosen[u] = Action::backward(g, next_b[static_cast<std::size_t>(g)]);
      } else if (f_ready(second) && held[u] < limit) {
        chosen[u] = Action::forward(second, next_f[static_cast<std::size_t>(second)]);
      } else if (f_ready(first) && held[u] + 2 <= limit) {
        chosen[u] = Action::forward(first, next_f[static_cast<std::size_t>(first)]);
      } else {
        const bool w1 = next_w[static_cast<std::size_t>(first)] < next_b[static_cast<std::size_t>(first)];
        const bool w2 = next_w[static_cast<std::size_t>(second)] < next_b[static_cast<std::size_t>(second)];
        if (w1 || w2) {
          const int g = w1 && w2 ? oldest(next_w, first, second) : w1 ? first : second;
          chosen[u] = Action::weight_gradient(g, next_w[static_cast<std::size_t>(g)]);
        }
      }
    }
    for (int r = 0; r < p; ++r) {
      const Action& a = chosen[static_cast<std::size_t>(r)];
      const auto g = static_cast<std::size_t>(a.stage);
      switch (a.kind) {
        case ActionKind::Forward:
          f_done[g][static_cast<std::size_t>(next_f[g]++)] = t + 1;
          ++held[static_cast<std::size_t>(r)];
          break;
        case ActionKind::Backward:
          b_done[g][static_cast<std::size_t>(next_b[g]++)] = t + 1;
          break;
        case ActionKind::WeightGradient:
          ++next_w[g];
          --held[static_cast<std::size_t>(r)];
          break;
        default: continue;
      }
      compute[static_cast<std::size_t>(r)].push_back(a);
      --left;
    }
  }
  return with_communication(ranks, micro_batches, 2, compute, true);
}

}  // namespace

PipelineSchedule zero_bubble_v(int ranks, int micro_batches) {
  check_shape("zero_bubble_v", ranks, micro_batches);
  const int p = ranks, m = micro_batches, stages = 2 * p;
  if (m < stages) return zero_bubble_v_list(ranks, micro_batches);
  // torch's ScheduleZBVZeroBubble order, phase by phase (schedules.h). (torch runs
  // max(2p - 1, m) micro-batches and leaves out those past m; here m >= 2p.)
  const int n = m;
  std::vector<std::vector<Action>> compute(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& out = compute[static_cast<std::size_t>(r)];
    const int first = r, second = stages - 1 - r;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    auto push = [&](Action a) {
      if (a.micro_batch < m) out.push_back(a);
    };
    for (int k = 0; k < 2 * (p - r) - 1; ++k) push(Action::forward(first, f0++));             // warm-up
    for (int k = 0; k < r; ++k) push(Action::forward(second, f1++)), push(Action::forward(first, f0++));
    for (int k = 0; k < p - r; ++k) {
      push(Action::forward(second, f1++));
      push(Action::backward(second, b1)), push(Action::weight_gradient(second, b1++));
    }
    while (f1 < f0 || f0 < n) {                                                              // steady
      if (f0 < n) push(Action::forward(first, f0++));
      push(Action::backward(first, b0)), push(Action::weight_gradient(first, b0++));
      push(Action::forward(second, f1++));
      push(Action::backward(second, b1)), push(Action::weight_gradient(second, b1++));
    }
    int w0 = b0, w1 = b1;                                                                    // cool-down
    for (int k = 0; k < r; ++k) push(Action::backward(first, b0++)), push(Action::backward(second, b1++));
    for (int k = 0; k < p - r; ++k) push(Action::backward(first, b0++)), push(Action::weight_gradient(first, w0++));
    while (w1 < b1) push(Action::weight_gradient(second, w1++));
    while (w0 < b0) push(Action::weight_gradient(first, w0++));
  }
  return with_communication(ranks, micro_batches, 2, compute, true);
}

PipelineSchedule dual_pipe_v(int ranks, int micro_batches) {
  check_shape("dual_pipe_v", ranks, micro_batches);
  const int p = ranks, m = micro_batches, stages = 2 * p;
  if (m < stages)
    throw support::ValidationError(fmt::format(
        "dual_pipe_v({}, {}): needs at least as many micro-batches as stages ({}): its steady phase pairs a "
        "forward of one chunk with a backward of the other",
        p, m, stages));
  std::vector<std::vector<Action>> compute(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& out = compute[static_cast<std::size_t>(r)];
    const int first = r, second = stages - 1 - r;
    // The next micro-batch of each kind per stage, and the B whose W is still to run.
    std::vector<int> next_f(static_cast<std::size_t>(stages), 0), next_b = next_f;
    std::deque<std::pair<int, int>> pending;  // (stage, micro-batch), oldest first
    auto forward = [&](int g) { out.push_back(Action::forward(g, next_f[static_cast<std::size_t>(g)]++)); };
    auto input_only = [&](int g) {  // B, its W left for later
      const int i = next_b[static_cast<std::size_t>(g)]++;
      out.push_back(Action::backward(g, i));
      pending.emplace_back(g, i);
    };
    auto full = [&](int g) {  // B and W together
      const int i = next_b[static_cast<std::size_t>(g)]++;
      out.push_back(Action::backward(g, i));
      out.push_back(Action::weight_gradient(g, i));
    };
    auto weight = [&] {
      if (pending.empty()) return;
      out.push_back(Action::weight_gradient(pending.front().first, pending.front().second));
      pending.pop_front();
    };
    for (int k = 0; k < 2 * (p - 1 - r); ++k) forward(first);          // 1
    for (int k = 0; k < r + 1; ++k) forward(first), forward(second);   // 2
    for (int k = 0; k < p - 1 - r; ++k) input_only(second), weight(), forward(second);  // 3
    for (int k = 0; k < m - stages + r + 1; ++k) {                      // 4
      forward(first), full(second);
      forward(second), full(first);
    }
    for (int k = 0; k < p - 1 - r; ++k) full(second), forward(second), full(first);  // 5
    bool split = false;                                                 // 6
    for (int k = 0; k < r + 1; ++k) {
      if (k == (r + 1) / 2 && r % 2 == 1) split = true;
      split ? input_only(second) : full(second);
      if (k == (r + 1) / 2 && r % 2 == 0) split = true;
      split ? input_only(first) : full(first);
    }
    for (int k = 0; k < p - 1 - r; ++k) weight(), split ? input_only(first) : full(first);  // 7
    while (!pending.empty()) weight();                                  // 8
  }
  return with_communication(ranks, micro_batches, 2, compute, true);
}

int peak_in_flight(const std::vector<Action>& rank_actions) {
  // Activations are held from a forward to the last part of its backward: the weight
  // gradient where the schedule splits them.
  const bool split = std::any_of(rank_actions.begin(), rank_actions.end(),
                                 [](const Action& a) { return a.kind == ActionKind::WeightGradient; });
  const ActionKind release = split ? ActionKind::WeightGradient : ActionKind::Backward;
  int now = 0;
  int peak = 0;
  for (const Action& a : rank_actions) {
    if (a.kind == ActionKind::Forward) peak = std::max(peak, ++now);
    if (a.kind == release) --now;
  }
  return peak;
}

LivenessMoments liveness_moments(const std::vector<Action>& rank_actions) {
  const bool split = std::any_of(rank_actions.begin(), rank_actions.end(),
                                 [](const Action& a) { return a.kind == ActionKind::WeightGradient; });
  LivenessMoments out;
  std::map<int, std::size_t> slot;  // stage -> its index in out.stages
  for (const Action& a : rank_actions)
    if (a.is_compute() && a.stage >= 0 && slot.emplace(a.stage, slot.size()).second) out.stages.push_back(a.stage);
  const std::size_t n = out.stages.size();
  // A B whose W is the next compute: one full backward (no held gradients; frees at once).
  std::vector<bool> fused(rank_actions.size(), false);
  for (std::size_t i = 0; split && i < rank_actions.size(); ++i) {
    if (rank_actions[i].kind != ActionKind::Backward) continue;
    auto next = std::find_if(rank_actions.begin() + static_cast<std::ptrdiff_t>(i) + 1, rank_actions.end(),
                             [](const Action& a) { return a.is_compute(); });
    fused[i] = next != rank_actions.end() && next->kind == ActionKind::WeightGradient &&
               next->stage == rank_actions[i].stage && next->micro_batch == rank_actions[i].micro_batch;
  }
  std::set<std::pair<int, int>> apart;  // (stage, micro-batch) past a split B, before its W
  std::vector<int> now(2 * n, 0);
  std::set<std::vector<int>> seen;
  for (std::size_t i = 0; i < rank_actions.size(); ++i) {
    const Action& a = rank_actions[i];
    if (!a.is_compute() || a.stage < 0) continue;
    const std::size_t g = slot.at(a.stage);
    bool grew = false;
    if (a.kind == ActionKind::Forward) {
      ++now[g], grew = true;
    } else if (a.kind == ActionKind::Backward && (!split || fused[i])) {
      --now[g];
    } else if (a.kind == ActionKind::Backward) {
      ++now[n + g], grew = true;
      apart.insert({a.stage, a.micro_batch});
    } else if (a.kind == ActionKind::WeightGradient && apart.erase({a.stage, a.micro_batch}) > 0) {
      --now[g], --now[n + g];
    }
    if (grew) seen.insert(now);
  }
  // Keep the moments no other covers in every count.
  const std::vector<std::vector<int>> all(seen.begin(), seen.end());
  auto covers = [](const std::vector<int>& x, const std::vector<int>& y) {
    return x != y && std::equal(x.begin(), x.end(), y.begin(), [](int a, int b) { return a >= b; });
  };
  for (const auto& m : all)
    if (std::none_of(all.begin(), all.end(), [&](const std::vector<int>& other) { return covers(other, m); }))
      out.moments.push_back(m);
  return out;
}

double peak_bytes_held(const LivenessMoments& moments, const std::vector<double>& saved,
                       const std::vector<double>& held) {
  auto at = [](const std::vector<double>& bytes, int stage) {
    const double b = stage >= 0 && static_cast<std::size_t>(stage) < bytes.size() ? bytes[static_cast<std::size_t>(stage)]
                                                                                  : 0.0;
    if (b < 0) throw support::ValidationError(fmt::format("peak_bytes_held: stage {} holds {} bytes", stage, b));
    return b;
  };
  const std::size_t n = moments.stages.size();
  double peak = 0;
  for (const auto& m : moments.moments) {
    double bytes = 0;
    for (std::size_t g = 0; g < n; ++g)
      bytes += m[g] * at(saved, moments.stages[g]) + m[n + g] * at(held, moments.stages[g]);
    peak = std::max(peak, bytes);
  }
  return peak;
}

double peak_bytes_held(const std::vector<Action>& rank_actions, const std::vector<double>& saved,
                       const std::vector<double>& held) {
  return peak_bytes_held(liveness_moments(rank_actions), saved, held);
}

namespace {

[[noreturn]] void fail(int r, const Action& a, const std::string& why) {
  throw support::ValidationError(fmt::format("rank {}: {}: {}", r, to_string(a), why));
}

// (stage, micro-batch) -> a slot of a flat table, in that key's order (a search validates every
// list it simulates: a map per message cost a tenth of a plan).
struct Cells {
  int micro_batches;
  std::size_t count;
  std::size_t operator()(int g, int i) const {
    return static_cast<std::size_t>(g) * static_cast<std::size_t>(micro_batches) + static_cast<std::size_t>(i);
  }
};

// Pass 1: every action is well-formed and owned by its rank.
void check_actions_are_owned(const PipelineSchedule& s) {
  const int stages = s.total_stages();
  const int m = s.micro_batches;
  for (int r = 0; r < s.ranks; ++r) {
    for (const Action& a : s.per_rank[static_cast<std::size_t>(r)]) {
      if (a.kind == ActionKind::OptimizerStep || a.kind == ActionKind::GradSync) continue;
      if (a.stage < 0 || a.stage >= stages) fail(r, a, fmt::format("stage out of range [0, {})", stages));
      if (a.micro_batch < 0 || a.micro_batch >= m) fail(r, a, fmt::format("micro-batch out of range [0, {})", m));
      if (s.rank_of_stage(a.stage) != r) fail(r, a, fmt::format("stage {} lives on rank {}", a.stage, s.rank_of_stage(a.stage)));
      if (a.is_compute()) continue;
      const bool toward_next = a.kind == ActionKind::SendActivation || a.kind == ActionKind::RecvGradient;
      const int neighbour = toward_next ? a.stage + 1 : a.stage - 1;
      if (neighbour < 0 || neighbour >= stages) fail(r, a, "no neighbouring stage on that side");
      if (a.peer != s.rank_of_stage(neighbour) || a.peer == r) {
        fail(r, a, fmt::format("peer must be rank {} (owner of stage {}) and not this rank", s.rank_of_stage(neighbour), neighbour));
      }
    }
  }
}

// Pass 2: sends and receives pair up one to one. A message is keyed by (is-gradient, producing
// stage, micro-batch).
void check_messages_pair(const PipelineSchedule& s, const Cells& cell) {
  struct Posted {
    int rank = -1;
    Action action;
  };
  std::vector<Posted> sends(2 * cell.count), recvs(2 * cell.count);
  auto slot = [&](bool grad, int g, int i) { return (grad ? cell.count : 0) + cell(g, i); };
  for (int r = 0; r < s.ranks; ++r) {
    for (const Action& a : s.per_rank[static_cast<std::size_t>(r)]) {
      if (a.is_send()) {
        Posted& at = sends[slot(a.kind == ActionKind::SendGradient, a.stage, a.micro_batch)];
        if (at.rank >= 0) fail(r, a, "sent twice");
        at = {r, a};
      } else if (a.is_recv()) {
        const bool grad = a.kind == ActionKind::RecvGradient;
        Posted& at = recvs[slot(grad, grad ? a.stage + 1 : a.stage - 1, a.micro_batch)];
        if (at.rank >= 0) fail(r, a, "received twice");
        at = {r, a};
      }
    }
  }
  for (std::size_t k = 0; k < sends.size(); ++k) {
    if (sends[k].rank >= 0 && recvs[k].rank < 0)
      fail(sends[k].rank, sends[k].action, fmt::format("no matching receive on rank {}", sends[k].action.peer));
  }
  for (std::size_t k = 0; k < recvs.size(); ++k) {
    if (recvs[k].rank >= 0 && sends[k].rank < 0)
      fail(recvs[k].rank, recvs[k].action, fmt::format("no matching send on rank {}", recvs[k].action.peer));
  }
}

// Pass 3: each forward and backward exactly once (and each weight gradient, in a zero-bubble
// schedule: every backward in two parts).
void check_each_computes_once(const PipelineSchedule& s, const Cells& cell) {
  std::vector<int> fwd_count(cell.count, 0), bwd_count(cell.count, 0), weight_count(cell.count, 0);
  bool split = false;
  for (const auto& list : s.per_rank) {
    for (const Action& a : list) {
      if (a.kind == ActionKind::Forward) ++fwd_count[cell(a.stage, a.micro_batch)];
      if (a.kind == ActionKind::Backward) ++bwd_count[cell(a.stage, a.micro_batch)];
      if (a.kind == ActionKind::WeightGradient) ++weight_count[cell(a.stage, a.micro_batch)];
      split = split || a.kind == ActionKind::WeightGradient;
    }
  }
  for (int g = 0; g < s.total_stages(); ++g) {
    for (int i = 0; i < s.micro_batches; ++i) {
      for (const auto& [counts, what] : {std::pair{&fwd_count, "forward"}, std::pair{&bwd_count, "backward"},
                                         std::pair{&weight_count, "weight gradient"}}) {
        const int n = (*counts)[cell(g, i)];
        if (counts == &weight_count && !split) continue;
        if (n != 1) {
          throw support::ValidationError(fmt::format("rank {}: {} of micro-batch {} at stage {} runs {} times (expected once)",
                                                     s.rank_of_stage(g), what, i, g, n));
        }
      }
    }
  }
}

// Pass 4: abstract execution. Only receives block; every other unmet dependency is an ordering
// error within one rank's list.
void check_runs_to_the_end(const PipelineSchedule& s, const Cells& cell) {
  const int stages = s.total_stages();
  std::vector<char> fwd_done(cell.count, 0), bwd_done(cell.count, 0), act_sent(cell.count, 0), grad_sent(cell.count, 0),
      act_in(cell.count, 0), grad_in(cell.count, 0), weight_done(cell.count, 0);
  std::vector<std::size_t> pc(static_cast<std::size_t>(s.ranks), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.ranks; ++r) {
      const auto& list = s.per_rank[static_cast<std::size_t>(r)];
      auto& at = pc[static_cast<std::size_t>(r)];
      for (; at < list.size(); ++at) {
        const Action& a = list[at];
        const int g = a.stage;
        const int i = a.micro_batch;
        bool blocked = false;
        // An action that needs `needed` done in its own cell (else the ordering error `why`), and marks `done` there.
        auto after = [&](const std::vector<char>& needed, const std::string& why, std::vector<char>& done) {
          if (!needed[cell(g, i)]) fail(r, a, why);
          done[cell(g, i)] = 1;
        };
        // A received input: posted by an earlier Recv on this rank (else an ordering error),
        // waited for here until its sender has issued the Send (the executor waits at the
        // compute that reads it, not at the Recv).
        auto waits_for = [&](const std::vector<char>& posted, const std::vector<char>& sent, std::size_t from,
                             const std::string& why) {
          if (!posted[cell(g, i)]) fail(r, a, why);
          return !sent[from];
        };
        switch (a.kind) {
          case ActionKind::Forward:
            if (g > 0 && s.rank_of_stage(g - 1) == r) {
              if (!fwd_done[cell(g - 1, i)]) fail(r, a, fmt::format("runs before the forward of stage {}", g - 1));
            } else if (g > 0) {
              blocked = waits_for(act_in, act_sent, cell(g - 1, i),
                                  fmt::format("runs before its input (the receive from stage {}) is posted", g - 1));
            }
            if (!blocked) fwd_done[cell(g, i)] = 1;
            break;
          case ActionKind::Backward:
            if (!fwd_done[cell(g, i)]) fail(r, a, "runs before its forward");
            if (g + 1 < stages && s.rank_of_stage(g + 1) == r) {
              if (!bwd_done[cell(g + 1, i)]) fail(r, a, fmt::format("runs before the backward of stage {}", g + 1));
            } else if (g + 1 < stages) {
              blocked = waits_for(grad_in, grad_sent, cell(g + 1, i),
                                  fmt::format("runs before its output gradient (the receive from stage {}) is posted",
                                              g + 1));
            }
            if (!blocked) bwd_done[cell(g, i)] = 1;
            break;
          case ActionKind::WeightGradient:
            after(bwd_done, "runs before the backward of its input gradient", weight_done);
            break;
          case ActionKind::SendActivation:
            after(fwd_done, "sends an activation before its forward ran", act_sent);
            break;
          case ActionKind::SendGradient:
            after(bwd_done, "sends a gradient before its backward ran", grad_sent);
            break;
          case ActionKind::RecvActivation:
            act_in[cell(g, i)] = 1;
            break;
          case ActionKind::RecvGradient:
            grad_in[cell(g, i)] = 1;
            break;
          case ActionKind::OptimizerStep:
          case ActionKind::GradSync: break;
        }
        if (blocked) break;
        progress = true;
      }
    }
  }
  for (int r = 0; r < s.ranks; ++r) {
    const auto& list = s.per_rank[static_cast<std::size_t>(r)];
    const auto at = pc[static_cast<std::size_t>(r)];
    if (at < list.size()) fail(r, list[at], "deadlock: waits for a received value whose send can never be issued");
  }
}

}  // namespace

void validate(const PipelineSchedule& s) {
  if (s.ranks < 1 || s.micro_batches < 1 || s.virtual_stages < 1) {
    throw support::ValidationError(fmt::format("schedule: ranks ({}), micro_batches ({}) and virtual_stages ({}) must be >= 1",
                                               s.ranks, s.micro_batches, s.virtual_stages));
  }
  if (static_cast<int>(s.per_rank.size()) != s.ranks) {
    throw support::ValidationError(
        fmt::format("schedule: {} action lists for {} ranks", s.per_rank.size(), s.ranks));
  }
  const Cells cells{s.micro_batches, static_cast<std::size_t>(s.total_stages()) * static_cast<std::size_t>(s.micro_batches)};
  check_actions_are_owned(s);
  check_messages_pair(s, cells);
  check_each_computes_once(s, cells);
  check_runs_to_the_end(s, cells);
}

}  // namespace shardwise::schedule
