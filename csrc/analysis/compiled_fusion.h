// Which values a compiled program keeps in registers, and which reads of a value cross memory:
// what torch.compile's inductor does to a rank program's memory-bound ops
// (parallelize(..., compile=True), runtime/compiled.py).
//
// Inductor fuses pointwise ops, reductions, normalisations, losses, views and copies into as
// few kernels as it can, and leaves products (mm, addmm, bmm, linear, convolution, attention,
// a mixture's experts) to their libraries; the runtime's collectives are graph breaks. Two
// fusible nodes can share a kernel only when no path between them runs through a kernel that
// is not fused (the product would have to run in the middle of the fused kernel). So each
// node has a level: the most unfused nodes on any path from the graph's inputs to it; a
// fusible node reads a value inside its kernel when the value was made by a fusible node (or
// is a view of such a value) at the reader's own level. A value
//
//   stays in registers (is never written) when it is an activation, made inside a kernel, has
//   at least one reader, every reader reads it inside the kernel (directly, or through views
//   read so), and it is not a graph output;
//   is read from memory by a reader otherwise (a product's output, a value from an earlier
//   level such as a residual read after the MLP, a leaf).
//
// The cost model (cost/op_cost.h) prices a compiled plan's memory-bound node by the bytes of
// its operands that cross memory only. Not modelled: inductor's own choice to split a kernel
// (a reduction whose consumer needs another loop order, two branches of one level it does
// not fuse horizontally), and AOTAutograd's choice of what to save for backward (the
// activation memory of a compiled plan is priced as eager's).
//
// Worked example: x -> mm -> y; y -> gelu -> g; (g, s) -> mul -> m; m -> mm -> z; (m, z) -> add.
// Levels: mm 0, gelu 1, mul 1, the second mm 1, add 2. y crosses memory (a product made it);
// g stays in registers (gelu and mul share level 1); m is written (an mm reads it) and read
// again from memory by add (level 2); the first fused kernel reads y and s and writes m.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"

namespace shardwise::analysis {

class FusedValues {
 public:
  FusedValues() = default;
  FusedValues(std::vector<bool> in_registers, std::vector<int> made_at, std::vector<int> node_level)
      : in_registers_(std::move(in_registers)), made_at_(std::move(made_at)), node_level_(std::move(node_level)) {}

  // Whether `value` is computed and consumed inside fused kernels only (never written).
  bool in_registers(ir::ValueId value) const { return at(in_registers_, value, false); }
  // Whether `reader` reads `value` from memory (not inside the kernel that made it).
  bool read_from_memory(ir::ValueId value, ir::NodeId reader) const {
    const int made = at(made_at_, value, -1);
    return made < 0 || made != at(node_level_, reader, -2);
  }
  std::size_t count() const;

 private:
  template <class T>
  static T at(const std::vector<T>& v, std::int64_t i, T otherwise) {
    return i >= 0 && static_cast<std::size_t>(i) < v.size() ? v[static_cast<std::size_t>(i)] : otherwise;
  }
  std::vector<bool> in_registers_;  // by value id
  std::vector<int> made_at_;        // by value id: the level of the fused kernel that made it; -1: none
  std::vector<int> node_level_;     // by node id: its level; -2 for a node that is not fused
};

// Whether `node` returns a view of its input (view, reshape, transpose, slice, a `to` that keeps
// the dtype, ...): no data moves. Under compile a view has its input's place: it stays in
// registers only where its input does (a view of a product's output is read from memory).
bool is_alias(const ir::Graph& graph, const ir::Node& node);

// Whether inductor fuses `node` with its neighbours (the rule above).
bool fusible_under_compile(const ir::Node& node);

// The graph's values that stay in registers under torch.compile (the rule above).
FusedValues compiled_fusion(const ir::Graph& graph);

// What a compiled program keeps for the backward, from what eager autograd keeps (`eager`:
// analysis::saved_for_backward, by value): AOTAutograd's partitioner recomputes in the
// backward what a fused kernel computed in registers rather than write it, so a value eager
// keeps that stays in registers is not kept; the values its kernel read from memory are kept
// in its place (each once, at its view's base; activations and inputs only, not model state).
// RMSNorm keeps its input where eager keeps float32 copies; SwiGLU its two products' outputs
// and the product the down projection reads, where eager keeps the SiLU's output as well.
// Not modelled: the partitioner's choice to keep a cheap value it could recompute, or an FP8
// linear's float8 copies (its own choice, per linear).
std::vector<std::int64_t> compiled_saved_bytes(const ir::Graph& graph, const std::vector<std::int64_t>& eager,
                                               const FusedValues& fused);

}  // namespace shardwise::analysis
