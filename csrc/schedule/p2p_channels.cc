#include "schedule/p2p_channels.h"

#include <fmt/format.h>

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "schedule/schedules.h"
#include "support/error.h"

namespace shardwise::schedule {

namespace {

// The receive a send meets: SA of stage g is RA of stage g + 1, SG of stage g is RG of g - 1.
Action expected_receive(const Action& send, int sender) {
  if (send.kind == ActionKind::SendActivation)
    return {ActionKind::RecvActivation, send.stage + 1, send.micro_batch, sender};
  return {ActionKind::RecvGradient, send.stage - 1, send.micro_batch, sender};
}

bool carries_gradient(const Action& a) {
  return a.kind == ActionKind::SendGradient || a.kind == ActionKind::RecvGradient;
}

}  // namespace

P2PChannel p2p_channel(const Action& action, int rank) {
  return action.is_send() ? P2PChannel{rank, action.peer, carries_gradient(action)}
                          : P2PChannel{action.peer, rank, carries_gradient(action)};
}

namespace {

// One channel's calls on one rank, in issue order, complete up to `done`.
struct Stream {
  std::vector<int> calls;  // action indices
  std::size_t done = 0;
};

// One rank's list as the model runs it: every send and receive one call on its stream.
struct RankState {
  const std::vector<Action>* list = nullptr;
  std::vector<int> receive_read;         // action index -> the receive a compute reads, -1
  std::map<P2PChannel, Stream> streams;  // per channel
  std::size_t next_action = 0;           // compute done up to here (calls passed over)
  std::vector<char> started, met;        // per action
};

}  // namespace

void check_ordered_transport(const PipelineSchedule& s, const ChannelOf& channel_of) {
  validate(s);  // every send has its receive and the lists are well-formed: the model relies on it
  const auto ranks = static_cast<std::size_t>(s.ranks);
  std::vector<RankState> state(ranks);
  auto key_of = [&](const Action& a, std::size_t r) { return channel_of(a, static_cast<int>(r)); };
  // Each way's calls on each channel, (sender, receiver, channel) -> indices in list order: a
  // coarse channel_of (tests) may put both ways on one channel, whose order holds per way.
  using Way = std::tuple<std::size_t, std::size_t, P2PChannel>;
  std::map<Way, std::vector<int>> sends, receives;
  for (std::size_t r = 0; r < ranks; ++r) {
    RankState& st = state[r];
    st.list = &s.per_rank[r];
    const auto n = st.list->size();
    st.receive_read.assign(n, -1);
    st.started.assign(n, 0);
    st.met.assign(n, 0);
    std::map<std::pair<int, int>, int> activation_in, gradient_in;  // (stage, micro-batch) -> index
    for (std::size_t j = 0; j < n; ++j) {
      const Action& a = (*st.list)[j];
      if (a.is_send() || a.is_recv()) {
        const P2PChannel channel = key_of(a, r);
        st.streams[channel].calls.push_back(static_cast<int>(j));
        const auto peer = static_cast<std::size_t>(a.peer);
        (a.is_send() ? sends[{r, peer, channel}] : receives[{peer, r, channel}]).push_back(static_cast<int>(j));
      }
      const std::pair key{a.stage, a.micro_batch};
      if (a.kind == ActionKind::RecvActivation) activation_in[key] = static_cast<int>(j);
      if (a.kind == ActionKind::RecvGradient) gradient_in[key] = static_cast<int>(j);
      const auto& in = a.kind == ActionKind::Forward ? activation_in : gradient_in;
      if (a.kind == ActionKind::Forward || a.kind == ActionKind::Backward) {
        if (auto it = in.find(key); it != in.end()) st.receive_read[j] = it->second;
      }
    }
  }

  // Order: on each channel, the n-th send a -> b meets the n-th receive b posts from a.
  std::map<std::pair<std::size_t, int>, std::pair<std::size_t, int>> partner;
  for (const auto& [way, on_b] : receives) sends[way];  // a way with receives only
  for (const auto& [way, on_a] : sends) {
    const auto& [a, b, channel] = way;
    const auto& on_b = receives[way];
    for (std::size_t n = 0; n < on_a.size() || n < on_b.size(); ++n) {
      if (n >= on_a.size() || n >= on_b.size()) {
        const bool no_send = n >= on_a.size();
        const std::size_t r = no_send ? b : a;
        const Action& x = s.per_rank[r][static_cast<std::size_t>(no_send ? on_b[n] : on_a[n])];
        throw support::ValidationError(fmt::format("rank {}: {}: nothing on rank {} meets it", r, to_string(x),
                                                   no_send ? a : b));
      }
      const Action& send = s.per_rank[a][static_cast<std::size_t>(on_a[n])];
      const Action& receive = s.per_rank[b][static_cast<std::size_t>(on_b[n])];
      if (!(receive == expected_receive(send, static_cast<int>(a)))) {
        throw support::ValidationError(fmt::format(
            "rank {}: {}: receive {} from rank {} meets that rank's send {}, {}, on a transport that matches "
            "by order (NCCL): a receive out of its sender's order",
            b, to_string(receive), n, a, n, to_string(send)));
      }
      partner[{a, on_a[n]}] = {b, on_b[n]};
      partner[{b, on_b[n]}] = {a, on_a[n]};
    }
  }

  auto complete = [&](std::size_t r, int j) { return j < 0 || state[r].met[static_cast<std::size_t>(j)]; };
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t r = 0; r < ranks; ++r) {
      RankState& st = state[r];
      // Compute in order, up to the first one whose receive is incomplete; the calls passed
      // over are issued (they may start once the call before them on their stream is done).
      for (; st.next_action < st.list->size(); ++st.next_action) {
        const std::size_t j = st.next_action;
        if (!complete(r, st.receive_read[j])) break;
        progress = true;
      }
      for (auto& [channel, stream] : st.streams) {
        auto& [calls, done] = stream;
        while (done < calls.size()) {
          const auto j = static_cast<std::size_t>(calls[done]);
          if (j >= st.next_action) break;  // not issued yet
          if (!st.started[j]) {
            st.started[j] = 1;
            progress = true;
          }
          const auto [q, i] = partner.at({r, calls[done]});
          if (!state[q].started[static_cast<std::size_t>(i)]) break;
          st.met[j] = state[q].met[static_cast<std::size_t>(i)] = 1;
          ++done;
          progress = true;
        }
      }
    }
  }

  for (std::size_t r = 0; r < ranks; ++r) {
    const RankState& st = state[r];
    for (const auto& [channel, stream] : st.streams) {
      const auto& [calls, done] = stream;
      if (done >= calls.size()) continue;
      const int j = calls[done];
      const auto [q, i] = partner.at({r, j});
      throw support::ValidationError(fmt::format(
          "rank {}: {}: hangs on a transport that matches by order and waits for each receive (NCCL): it waits "
          "for rank {}'s {}, issued after calls that cannot finish",
          r, to_string(s.per_rank[r][static_cast<std::size_t>(j)]), q,
          to_string(s.per_rank[q][static_cast<std::size_t>(i)])));
    }
  }
}

std::vector<P2PChannel> p2p_channels(const PipelineSchedule& schedule) {
  check_ordered_transport(schedule);
  std::set<P2PChannel> out;
  for (std::size_t r = 0; r < schedule.per_rank.size(); ++r)
    for (const Action& a : schedule.per_rank[r])
      if (a.is_send()) out.insert(p2p_channel(a, static_cast<int>(r)));
  return {out.begin(), out.end()};
}

}  // namespace shardwise::schedule
