#include "analysis/compiled_fusion.h"

#include <gtest/gtest.h>

namespace shardwise::analysis {
namespace {

ir::TensorType f32(std::vector<std::int64_t> shape) { return ir::TensorType{ir::DType::F32, std::move(shape), {}}; }

// The header's worked example: x -> mm -> y; gelu(y) -> g; mul(g, s) -> m; mm(m, w2) -> z;
// add(m, z) -> out. Levels: mm 0, gelu and mul 1, the second mm 1, add 2.
struct Chain {
  ir::Graph g;
  ir::ValueId x, w1, w2, s, y, g_out, m, z, out;
  ir::NodeId mm1, gelu, mul, mm2, add;
  Chain() {
    x = g.add_value("x", f32({16, 32}), ir::ValueRole::Input);
    w1 = g.add_value("w1", f32({32, 32}), ir::ValueRole::Parameter);
    w2 = g.add_value("w2", f32({32, 32}), ir::ValueRole::Parameter);
    s = g.add_value("s", f32({16, 32}), ir::ValueRole::Input);
    auto add_node = [&](const char* op, std::vector<ir::ValueId> in, const char* name) {
      const ir::NodeId id = g.add_node(op, std::move(in), {{name, f32({16, 32})}});
      return std::pair{id, g.node(id).outputs[0]};
    };
    std::tie(mm1, y) = add_node("aten::mm", {x, w1}, "y");
    std::tie(gelu, g_out) = add_node("aten::gelu", {y}, "g");
    std::tie(mul, m) = add_node("aten::mul.Tensor", {g_out, s}, "m");
    std::tie(mm2, z) = add_node("aten::mm", {m, w2}, "z");
    std::tie(add, out) = add_node("aten::add.Tensor", {m, z}, "out");
    g.set_outputs({out});
  }
};

TEST(CompiledFusion, APointwiseChainBetweenProductsKeepsItsMiddleInRegisters) {
  Chain c;
  const FusedValues fused = compiled_fusion(c.g);
  EXPECT_FALSE(fused.in_registers(c.y));      // a product wrote it
  EXPECT_TRUE(fused.in_registers(c.g_out));   // gelu and mul share a kernel
  EXPECT_FALSE(fused.in_registers(c.m));      // the second product reads it
  EXPECT_FALSE(fused.in_registers(c.z));
  EXPECT_FALSE(fused.in_registers(c.out));    // a graph output
  EXPECT_EQ(fused.count(), 1u);
  EXPECT_TRUE(fused.read_from_memory(c.y, c.gelu));       // the product's output
  EXPECT_FALSE(fused.read_from_memory(c.g_out, c.mul));   // inside the kernel
  EXPECT_TRUE(fused.read_from_memory(c.s, c.mul));        // a leaf
  // The add runs after the second product: m is read again, from memory (a residual).
  EXPECT_TRUE(fused.read_from_memory(c.m, c.add));
  EXPECT_TRUE(fused.read_from_memory(c.m, c.mm2));        // a product reads from memory
}

// What eager keeps of a value in registers is not kept compiled: the values its kernel read
// from memory are, once; a value kept that crosses memory stays kept.
TEST(CompiledFusion, AKeptValueInRegistersIsRecomputedFromItsKernelsInputs) {
  Chain c;
  const FusedValues fused = compiled_fusion(c.g);
  const std::int64_t bytes = 16 * 32 * 4;
  std::vector<std::int64_t> eager(c.g.values().size(), 0);
  eager[static_cast<std::size_t>(c.g_out)] = bytes;  // gelu's output, which mul's backward reads
  eager[static_cast<std::size_t>(c.m)] = bytes;      // the second product's input
  const std::vector<std::int64_t> kept = compiled_saved_bytes(c.g, eager, fused);
  EXPECT_EQ(kept[static_cast<std::size_t>(c.g_out)], 0);      // in registers: recomputed
  EXPECT_EQ(kept[static_cast<std::size_t>(c.y)], bytes);      // ...from the product's output
  EXPECT_EQ(kept[static_cast<std::size_t>(c.m)], bytes);      // written anyway: kept
  EXPECT_EQ(kept[static_cast<std::size_t>(c.s)], 0);          // not read by gelu's kernel part
  EXPECT_EQ(kept[static_cast<std::size_t>(c.w1)], 0);         // model state is never an activation
  std::int64_t total = 0;
  for (std::int64_t b : kept) total += b;
  EXPECT_EQ(total, 2 * bytes);
}

TEST(CompiledFusion, AViewHasItsInputsPlace) {
  ir::Graph g;
  const auto x = g.add_value("x", f32({16, 32}), ir::ValueRole::Input);
  const auto w = g.add_value("w", f32({32, 32}), ir::ValueRole::Parameter);
  const ir::NodeId mm = g.add_node("aten::mm", {x, w}, {{"y", f32({16, 32})}});
  const auto y = g.node(mm).outputs[0];
  const ir::NodeId view = g.add_node("aten::view", {y}, {{"v", f32({512})}}, {{"size", std::vector<std::int64_t>{512}}});
  const auto v = g.node(view).outputs[0];
  const ir::NodeId relu = g.add_node("aten::relu", {v}, {{"r", f32({512})}});
  const auto r = g.node(relu).outputs[0];
  const ir::NodeId view2 = g.add_node("aten::view", {r}, {{"r2", f32({16, 32})}}, {{"size", std::vector<std::int64_t>{16, 32}}});
  const auto r2 = g.node(view2).outputs[0];
  const ir::NodeId neg = g.add_node("aten::neg", {r2}, {{"n", f32({16, 32})}});
  const auto n = g.node(neg).outputs[0];
  const ir::NodeId view3 = g.add_node("aten::view", {n}, {{"n2", f32({16, 32})}}, {{"size", std::vector<std::int64_t>{16, 32}}});
  const ir::NodeId mm2 = g.add_node("aten::mm", {g.node(view3).outputs[0], w}, {{"z", f32({16, 32})}});
  g.set_outputs({g.node(mm2).outputs[0]});
  const FusedValues fused = compiled_fusion(g);
  EXPECT_FALSE(fused.in_registers(v));           // a view of a product's output is memory
  EXPECT_TRUE(fused.read_from_memory(v, relu));  // ...which relu reads
  EXPECT_TRUE(fused.in_registers(r));            // relu -> view -> neg: one kernel
  EXPECT_TRUE(fused.in_registers(r2));
  EXPECT_FALSE(fused.read_from_memory(r2, neg));
  // neg's output reaches a product through a view: written.
  EXPECT_FALSE(fused.in_registers(n));
  EXPECT_FALSE(fused.in_registers(g.node(view3).outputs[0]));
}

TEST(CompiledFusion, ProductsAndUnknownOpsAreNotFused) {
  EXPECT_FALSE(fusible_under_compile(ir::Node{0, "aten::mm", {}, {}, {}, ""}));
  EXPECT_FALSE(fusible_under_compile(ir::Node{0, "aten::scaled_dot_product_attention", {}, {}, {}, ""}));
  EXPECT_FALSE(fusible_under_compile(ir::Node{0, "mylib::custom_kernel", {}, {}, {}, ""}));
  EXPECT_TRUE(fusible_under_compile(ir::Node{0, "aten::gelu", {}, {}, {}, ""}));
  EXPECT_TRUE(fusible_under_compile(ir::Node{0, "aten::mean.dim", {}, {}, {}, ""}));
  EXPECT_TRUE(fusible_under_compile(ir::Node{0, "aten::view", {}, {}, {}, ""}));
}

}  // namespace
}  // namespace shardwise::analysis
