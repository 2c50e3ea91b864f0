// Receives posted one computation early: each Recv of a rank's list moved before the compute
// action that precedes it, so the transfer it waits for runs beside that computation instead
// of after it.
//
// Why: the generators (schedules.h) put a Recv right before the compute that reads it. The
// executor posts a receive where its list has it (runtime/pipeline_engine.py: irecv at RA /
// RG) and both transports pair a send with its receive before moving the bytes (simulator.h),
// so a transfer whose send was issued during the receiver's previous computation started only
// when that computation ended: every hop of the step's critical path waited a whole transfer
// (0.40 s of the 70B calibration row's 11.3 s step, benchmarks/published.py). Megatron-LM
// posts the next micro-batch's receive together with the current send before it computes
// (`overlap_p2p_comm`); this is the same, one computation ahead.
//
// The lists' order on every channel is kept (a rank's receives keep their relative order, and
// sends stay where they were), so the lists still pair sends with receives by order
// (p2p_channels.h); a received value is waited for only where it is read, as before, and
// validate() checks the lists with receives as posted, not blocking. The cost model, the
// simulator and the executor take the lists from one dispatch (cost::pipeline_schedule), which
// applies this pass to every schedule: what is priced is what runs.
//
// Example: one_f_one_b(2, 3), rank 1:
//   RA0 F0 B0 SG0 RA1 F1 B1 SG1 RA2 F2 B2 SG2 OPT   (generated)
//   RA0 F0 RA1 B0 SG0 F1 RA2 B1 SG1 F2 B2 SG2 OPT   (receives posted early)
#pragma once

#include "schedule/action.h"

namespace shardwise::schedule {

// `schedule` with each rank's receives moved before the compute action that precedes them
// (a receive with no compute before it stays). The same actions, each rank's count unchanged.
PipelineSchedule post_receives_early(PipelineSchedule schedule);

}  // namespace shardwise::schedule
