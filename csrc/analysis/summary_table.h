// A readable, fixed-width text summary of a graph: what a user sees first after capture.
//
// Sections: totals (nodes, parameters and buffers with K/M/B suffixes and bytes, forward
// FLOPs (auto-scaled units) with the matmul share, bytes of all activations), repeated
// block groups, the top ops by FLOPs, unknown ops (op, count, first module path), and one
// row per top-level module (parameters, FLOPs, nodes). Example (transformers' GPT-2 with
// 2 layers and a 1,000-token vocabulary, batch 2 x 16 tokens, from torch.export):
//
//   graph summary
//     nodes           137
//     parameters      15.76M  (60.13 MiB)
//     buffers         0  (0 B)
//     forward         961.37 MFLOPs  (matmul 958.27 MFLOPs, 99.7%)
//     activations     15.28 MiB  (all node outputs)
//
//   repeated blocks
//     parent                         count  nodes each  members
//     transformer.h                      2          37  transformer.h.0, transformer.h.1
//
//   top ops by FLOPs
//     op                                             nodes           FLOPs   share
//     aten::addmm                                        8   906.41 MFLOPs   94.3%
//   ...
#pragma once

#include <string>

#include "ir/graph.h"
#include "ops/op_table.h"

namespace shardwise::analysis {

std::string summary_table(const ops::OpTable& table, const ir::Graph& graph);

// "14.95M", "1.50B", "824": a count with a K/M/B suffix.
std::string human_count(std::int64_t n);
// "961.37 MFLOPs", "1.20 TFLOPs": a FLOP count in decimal units.
std::string human_flops(std::int64_t flops);
// "57.04 MiB", "512 B": a byte size in binary units.
std::string human_bytes(std::int64_t bytes);

}  // namespace shardwise::analysis
