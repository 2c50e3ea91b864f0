// Plans that split the batch into micro-batches, checked against what the graph computes.
//
// A plan with micro-batches (pipeline stages, or gradient accumulation on one stage: global
// batch > micro_batch x data) runs the graph once per micro-batch. Where the graph couples the
// rows of its batch (analysis/batch_coupling.h: batch norm in training mode, a router's
// load-balancing loss, a loss over the micro-batch's own count), that is another computation
// than the batch's step, so such a plan is refused unless it says
// micro_batch_semantics = per_micro_batch (plan/plan.h). Plans without micro-batches pass;
// so does a graph whose batch the analysis cannot follow (captured at one row: the runtime
// asks again on its own capture).
//
// Worked example: a ResNet's graph (batch norm in training) and Plan{pipeline 2, global
// batch 8, micro-batch 2} -> ValidationError "plan: 4 micro-batches of 2 rows change what the
// model computes: aten::batch_norm in module 'embedder.normalization' (node ...) normalises
// over the batch dim ...; a plan of one micro-batch (micro_batch x data = 8) computes the
// batch's step, or micro_batch_semantics='per_micro_batch' accepts ...".
#pragma once

#include "analysis/batch_coupling.h"
#include "ir/graph.h"
#include "ops/op_table.h"
#include "plan/plan.h"

namespace shardwise::search {

// Throws support::ValidationError as above.
void check_micro_batches(const analysis::BatchCoupling& coupling, const plan::Plan& plan);
void check_micro_batches(const ops::OpTable& table, const ir::Graph& graph, const plan::Plan& plan);

}  // namespace shardwise::search
