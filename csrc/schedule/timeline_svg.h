// The timeline of a simulated pipeline step as an SVG picture: one row per rank,
// time running left to right -- the picture known from the GPipe and 1F1B papers.
//
// Drawing (all classes are stable, tests and CSS may rely on them):
//   - <svg> root, one <g class="rank" data-rank="r"> per rank with a "rank r" label;
//   - inside a row, one <rect class="interval KIND"> per simulated interval, KIND being
//     interval_kind_name() (forward, backward, recv_wait, update, idle) -- these tile
//     the row; Send intervals (asynchronous, they overlap compute) are drawn as a thin
//     strip <rect class="interval send"> along the bottom of the row;
//   - forward / backward boxes carry the micro-batch number as text when wide enough
//     (with virtual stages > 1 also the chunk: "3.1" = micro-batch 3, chunk 1);
//   - a time axis with ticks under the rows, and a legend of the colours.
// Zero-length intervals are not drawn, except Forward / Backward (always one rect per
// compute action, so the rect count equals the action count).
//
// Example: timeline_svg(simulate(one_f_one_b(4, 8), costs), one_f_one_b(4, 8)) gives
// docs/images/1f1b-p4-m8.svg.
#pragma once

#include <string>
#include <vector>

#include "schedule/action.h"
#include "schedule/simulator.h"

namespace shardwise::schedule {

struct TimelineSvgOptions {
  double width = 1000.0;      // pixels of the time area (labels come on top)
  double row_height = 28.0;   // pixels per rank row
  std::string title;          // optional heading; XML-escaped
  // Per rank, shown after "rank r" (a heterogeneous pipeline's device type); empty: none.
  std::vector<std::string> rank_labels;
};

std::string timeline_svg(const SimulationResult& result, const PipelineSchedule& schedule,
                         const TimelineSvgOptions& options = {});

// Escapes & < > " ' for XML text and attribute values.
std::string xml_escape(const std::string& text);

}  // namespace shardwise::schedule
