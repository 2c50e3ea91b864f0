// A graph's identity as a plan sees it: every leaf by name and role, every node by its op,
// its inputs' names and its outputs' names, in graph order (16 hex digits, FNV-1a 64).
// Shapes and dtypes are left out on purpose: a plan searched on a wide copy of a model on the
// meta device, or at another batch, applies to the narrow one on CPU, and such a plan names
// the same nodes doing the same things. What the fingerprint catches is a plan applied to a
// graph whose nodes carry the same names but are other nodes (a capture that numbered its
// nodes otherwise): the runtime refuses it instead of placing the wrong node. A reader of a
// cast (aten::to.*) counts as a reader of what was cast: torch returns a cast to the dtype a
// tensor already has as the tensor itself, so which of the two names a capture records depends
// on the model's dtype, and a model's float32 and float64 captures share one fingerprint.
//
//   graph_fingerprint(g) == graph_fingerprint(g with every shape doubled)
//   graph_fingerprint(g) != graph_fingerprint(g with one node's op changed)
#pragma once

#include <string>

#include "ir/graph.h"

namespace shardwise::ir {

std::string graph_fingerprint(const Graph& graph);

}  // namespace shardwise::ir
