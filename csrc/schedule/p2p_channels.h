// The channels a schedule's sends and receives travel on, and the proof that its lists run on
// a transport that matches sends to receives by order (NCCL) as well as by tag (Gloo).
//
// Why: NCCL ignores tags. On one communicator, the n-th send from rank a to rank b meets the
// n-th receive b posts from a, whatever each carries, so a receive posted out of the
// sender's order takes another message of the same shape (an activation for a gradient): a
// wrong number, silently. And NCCL runs a communicator's calls on one stream in issue order,
// a send unable to finish before its receive runs on the peer (rendezvous, for messages
// beyond NCCL's buffers), so two neighbours that each send before they receive wait on each
// other for ever.
//
// The channel of a call is (sender, receiver, activation or gradient): one communicator per
// direction of a link and per kind (runtime/stage_links.py makes them, two-rank groups, and
// posts every call with tag 0 on them, so Gloo matches by order too and the Gloo tests prove
// the order). Each weaker split fails a schedule we run (p2p_channels_test.cc):
//   - one channel per pair of ranks, both directions and kinds (c10d's default for unbatched
//     calls): 1F1B at p = 2 hangs in its steady state, rank 0 sending the activation of
//     micro-batch i + 1 while rank 1 sends the gradient of i, each receiving only after;
//   - one per pair and kind: ZB-V's and DualPipeV's V puts activations both ways on a link
//     (first chunk down, second chunk up), interleaved 1F1B's wrap from rank p - 1 to 0 too:
//     receives out of order, or a hang.
// check_ordered_transport runs the lists on a model of such a transport and throws
// support::ValidationError naming the rank and action at fault when
//   - on a channel, the sends in the sender's list order and the receives in the receiver's
//     list order differ at some position (a receive would get another message), or
//   - the model stops with calls left (a hang).
// The model (each rule what c10d's ProcessGroupNCCL does):
//   - a rank issues its list without blocking (NCCL's wait() orders streams, not the host);
//   - compute runs in list order on one stream; a compute starts once each receive it reads
//     has completed (the executor waits for it there);
//   - a channel's calls run in issue order on each of its two ranks; a call starts once the
//     call before it on its channel has completed and every compute issued before it has
//     (c10d makes the communication stream wait for the compute stream at issue);
//   - a send and the receive it meets complete together once both have started.
// A schedule that passes runs on Gloo too: its sends never wait on the host, so it has fewer
// ways to stop than this model.
#pragma once

#include <compare>
#include <functional>
#include <vector>

#include "schedule/action.h"

namespace shardwise::schedule {

struct P2PChannel {
  int sender = -1;
  int receiver = -1;
  bool gradient = false;  // the gradients going back, else the activations going forward

  friend auto operator<=>(const P2PChannel&, const P2PChannel&) = default;
};

// The channel of a send or receive of rank `rank`: (it, its peer, kind) or (its peer, it, kind).
P2PChannel p2p_channel(const Action& action, int rank);

// Which channel a rank's send or receive runs on; the send and the receive meant to meet must
// get the same one. The default is p2p_channel; tests pass coarser ones to show they fail.
using ChannelOf = std::function<P2PChannel(const Action& action, int rank)>;

// Throws support::ValidationError when `schedule` would receive out of its senders' order or
// hang on a transport that matches by order (see above), and validate()'s errors first.
void check_ordered_transport(const PipelineSchedule& schedule, const ChannelOf& channel_of = p2p_channel);

// Every channel `schedule`'s sends use, sorted, once check_ordered_transport passed.
std::vector<P2PChannel> p2p_channels(const PipelineSchedule& schedule);

}  // namespace shardwise::schedule
