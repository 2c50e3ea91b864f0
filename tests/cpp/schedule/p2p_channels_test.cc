#include "schedule/p2p_channels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "schedule/schedules.h"
#include "support/error.h"
#include "validation_error.h"

namespace shardwise::schedule {
namespace {

using testing::validation_error_of;

// A rank's list from its text form ("F0@s0 SA0@s0->r1 RG0@s0<-r1 B0@s0 W0@s0"): the
// hand-written schedules below read as the lists they are.
std::vector<Action> parse(const std::string& text) {
  std::vector<Action> out;
  std::istringstream in(text);
  for (std::string word; in >> word;) {
    const auto at = word.find('@');
    const std::string code = word.substr(0, word.find_first_of("0123456789"));
    const int micro_batch = std::stoi(word.substr(code.size(), at - code.size()));
    const int stage = std::stoi(word.substr(at + 2));
    const auto arrow = word.find("->") != std::string::npos ? word.find("->") : word.find("<-");
    const int peer = arrow == std::string::npos ? -1 : std::stoi(word.substr(arrow + 3));
    const ActionKind kind = code == "F"    ? ActionKind::Forward
                            : code == "B"  ? ActionKind::Backward
                            : code == "W"  ? ActionKind::WeightGradient
                            : code == "SA" ? ActionKind::SendActivation
                            : code == "SG" ? ActionKind::SendGradient
                            : code == "RA" ? ActionKind::RecvActivation
                                           : ActionKind::RecvGradient;
    out.push_back({kind, stage, micro_batch, peer});
  }
  return out;
}

PipelineSchedule two_ranks(int micro_batches, const std::string& rank0, const std::string& rank1) {
  PipelineSchedule s;
  s.ranks = 2;
  s.micro_batches = micro_batches;
  s.per_rank = {parse(rank0), parse(rank1)};
  return s;
}

TEST(P2PChannels, EveryGeneratedScheduleRunsOnATransportThatMatchesByOrder) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 8, 16}) {
      const std::string at = "p " + std::to_string(p) + ", m " + std::to_string(m);
      EXPECT_NO_THROW(check_ordered_transport(gpipe(p, m))) << "gpipe " << at;
      EXPECT_NO_THROW(check_ordered_transport(one_f_one_b(p, m))) << "1f1b " << at;
      for (int k : {2, 3}) EXPECT_NO_THROW(check_ordered_transport(kfkb(p, m, k))) << "kfkb " << k << " " << at;
      if (m % p == 0) {
        for (int v : {2, 3}) {
          EXPECT_NO_THROW(check_ordered_transport(interleaved_1f1b(p, m, v))) << "interleaved " << v << " " << at;
        }
      }
      EXPECT_NO_THROW(check_ordered_transport(zero_bubble_h1(p, m))) << "zb-h1 " << at;
      EXPECT_NO_THROW(check_ordered_transport(zero_bubble_v(p, m))) << "zb-v " << at;
      if (m >= 2 * p) EXPECT_NO_THROW(check_ordered_transport(dual_pipe_v(p, m))) << "dualpipe-v " << at;
    }
  }
}

TEST(P2PChannels, RefusesAReceiveOutOfItsSendersOrder) {
  // GPipe at p = 2, m = 2 with rank 1 running its backwards in reverse: it sends G1 then G0
  // while rank 0 receives G0 then G1. Tags keep them apart on Gloo (validate() passes); on
  // NCCL rank 0's RG0 would take G1, of the same shape.
  const auto s = two_ranks(2, "F0@s0 SA0@s0->r1 F1@s0 SA1@s0->r1 RG0@s0<-r1 B0@s0 RG1@s0<-r1 B1@s0",
                           "RA0@s1<-r0 F0@s1 RA1@s1<-r0 F1@s1 B1@s1 SG1@s1->r0 B0@s1 SG0@s1->r0");
  EXPECT_NO_THROW(validate(s));
  EXPECT_EQ(validation_error_of([&] { check_ordered_transport(s); }),
            "rank 0: RG0@s0<-r1: receive 0 from rank 1 meets that rank's send 0, SG1@s1->r0, on a transport that "
            "matches by order (NCCL): a receive out of its sender's order");
}

TEST(P2PChannels, AreOnePerDirectionAndKind) {
  EXPECT_EQ(p2p_channels(one_f_one_b(2, 4)), (std::vector<P2PChannel>{{0, 1, false}, {1, 0, true}}));
  // ZB-V at p = 2: stages 0, 1, 2, 3 on ranks 0, 1, 1, 0, so each way carries both kinds.
  EXPECT_EQ(p2p_channels(zero_bubble_v(2, 4)),
            (std::vector<P2PChannel>{{0, 1, false}, {0, 1, true}, {1, 0, false}, {1, 0, true}}));
  EXPECT_EQ(p2p_channel(Action{ActionKind::RecvGradient, 0, 2, 1}, 0), (P2PChannel{1, 0, true}));
}

TEST(P2PChannels, OneChannelPerPairHangsOneFOneB) {
  // c10d's default for unbatched calls: one communicator per pair, both ways on its stream.
  // In 1F1B's steady state rank 0 sends A1 while rank 1 sends G0, each receiving after.
  const ChannelOf per_pair = [](const Action& a, int rank) {
    return P2PChannel{std::min(rank, a.peer), std::max(rank, a.peer), false};
  };
  EXPECT_EQ(validation_error_of([&] { check_ordered_transport(one_f_one_b(2, 4), per_pair); }),
            "rank 0: SA1@s0->r1: hangs on a transport that matches by order and waits for each receive (NCCL): it "
            "waits for rank 1's RA1@s1<-r0, issued after calls that cannot finish");
  EXPECT_NO_THROW(check_ordered_transport(one_f_one_b(2, 4)));
}

TEST(P2PChannels, OneChannelPerPairAndKindFailsTheV) {
  // Both ways on one channel: ZB-V's activations go down the V on its first chunk and up it
  // on its second; interleaved 1F1B's wrap from the last rank to the first does the same.
  const ChannelOf per_pair_and_kind = [](const Action& a, int rank) {
    return P2PChannel{std::min(rank, a.peer), std::max(rank, a.peer),
                      a.kind == ActionKind::SendGradient || a.kind == ActionKind::RecvGradient};
  };
  EXPECT_EQ(validation_error_of([&] { check_ordered_transport(zero_bubble_v(2, 8), per_pair_and_kind); }),
            "rank 0: SA1@s0->r1: hangs on a transport that matches by order and waits for each receive (NCCL): it "
            "waits for rank 1's RA1@s1<-r0, issued after calls that cannot finish");
  EXPECT_EQ(validation_error_of([&] { check_ordered_transport(interleaved_1f1b(2, 4, 2), per_pair_and_kind); }),
            "rank 0: SA1@s0->r1: hangs on a transport that matches by order and waits for each receive (NCCL): it "
            "waits for rank 1's RA1@s1<-r0, issued after calls that cannot finish");
  EXPECT_NO_THROW(check_ordered_transport(zero_bubble_v(2, 8)));
  EXPECT_NO_THROW(check_ordered_transport(interleaved_1f1b(2, 4, 2)));
}

}  // namespace
}  // namespace shardwise::schedule
