#include "cost/memory_cost.h"

#include <gtest/gtest.h>

#include "support/error.h"

namespace shardwise::cost {
namespace {

TEST(MemoryCost, GPT3ModelStatesSpreadOverTensorAndPipelineRanks) {
  // 175B parameters x 16 bytes over t = 8, p = 12 (96 model-parallel ranks).
  double params = 175e9;
  ModelStateBytes s = model_state_bytes(params / 96, 8, 0);
  EXPECT_EQ(MemoryConstants{}.bytes_per_parameter(), 16.0);
  EXPECT_NEAR(s.total(), 175e9 * 16 / 96, 1.0);  // 29.17 GB: data parallelism alone does not shard
  EXPECT_NEAR(s.weights, 175e9 * 2 / 96, 1.0);
  // ZeRO-1 shards the 12 optimizer bytes over d = 8; ZeRO-3 all 16.
  EXPECT_NEAR(model_state_bytes(params / 96, 8, 1).total(), 175e9 / 96 * (2 + 2 + 12.0 / 8), 1.0);
  EXPECT_NEAR(model_state_bytes(params / 96, 8, 3).total(), 175e9 / 96 * 16 / 8, 1.0);
  // Configurable bytes per parameter: fp32 training with Adam = 4 + 4 + 8.
  MemoryConstants fp32{4, 4, 8};
  EXPECT_NEAR(model_state_bytes(params, 1, 0, fp32).total(), 175e9 * 16, 1.0);
  EXPECT_THROW(model_state_bytes(params, 0, 0), support::ValidationError);
  EXPECT_THROW(model_state_bytes(params, 1, 4), support::ValidationError);
}

TEST(MemoryCost, AFloat32PlanHoldsNoMasterCopySoZeroDividesEightBytes) {
  EXPECT_EQ(memory_constants(Precision::BF16), MemoryConstants{});
  EXPECT_EQ(memory_constants(Precision::F16), MemoryConstants{});
  const MemoryConstants f32 = memory_constants(Precision::F32);
  EXPECT_EQ(f32, (MemoryConstants{4, 4, 8}));
  EXPECT_EQ(memory_constants(Precision::TF32), f32);
  EXPECT_EQ(f32.bytes_per_parameter(), MemoryConstants{}.bytes_per_parameter());
  // ZeRO-1 over 4 ranks: 4 + 4 + 8 / 4 in float32, 2 + 2 + 12 / 4 in bf16.
  EXPECT_DOUBLE_EQ(model_state_bytes(1e6, 4, 1, f32).total(), 1e6 * 10);
  EXPECT_DOUBLE_EQ(model_state_bytes(1e6, 4, 1).total(), 1e6 * 7);
}

// A run that steps the model's own parameters (torch.optim on a bf16 model, parallelize's
// plans): no master copy, Adam's moments in the parameters' dtype. An H200 measured GPT-2
// 124M's bf16 AdamW moments at 474.7 MiB: 124.4e6 x 4 bytes.
TEST(MemoryCost, AModelsOwnStateDtypeHoldsNoMasterCopy) {
  EXPECT_EQ(state_dtype_memory("bf16"), (MemoryConstants{2, 2, 4}));
  EXPECT_EQ(state_dtype_memory("f16"), (MemoryConstants{2, 2, 4}));
  EXPECT_EQ(state_dtype_memory("f32"), (MemoryConstants{4, 4, 8}));
  EXPECT_FALSE(state_dtype_memory("").has_value());
  EXPECT_THROW(state_dtype_memory("fp8"), support::ValidationError);
  EXPECT_NEAR(model_state_bytes(124.4e6, 1, 0, *state_dtype_memory("bf16")).optimizer / 1048576.0, 474.6, 0.1);
}

TEST(MemoryCost, MicroBatchesInFlight) {
  EXPECT_EQ(stage_micro_batches_in_flight(plan::Schedule::GPipe, 4, 1, 1, 16), 16);
  EXPECT_EQ(stage_micro_batches_in_flight(plan::Schedule::OneFOneB, 4, 1, 1, 16), 4);
  EXPECT_EQ(stage_micro_batches_in_flight(plan::Schedule::OneFOneB, 4, 1, 1, 2), 2);
  EXPECT_EQ(stage_micro_batches_in_flight(plan::Schedule::KFKB, 4, 1, 2, 16), 8);
  EXPECT_DOUBLE_EQ(stage_micro_batches_in_flight(plan::Schedule::Interleaved1F1B, 12, 2, 1, 24), 35.0 / 2);
}

TEST(MemoryCost, RecomputationKeepsOnlyLayerInputs) {
  EXPECT_EQ(stage_activation_bytes(100, 10, 4, 3, false), 1200);
  EXPECT_EQ(stage_activation_bytes(100, 10, 4, 3, true), 3 * 4 * 10 + 100);
}

}  // namespace
}  // namespace shardwise::cost
