#pragma once
// Constants of the cost model that more than one reader needs: the evaluator
// (cost/plan_cost), the sharding search (search/), and the Python runtime (through
// shardwise._C, csrc/python/bind_cost.cc). Each is defined here once; the option structs
// default to these, so a caller can still price another value.

#include <cstdint>

namespace shardwise::cost {

// Communication overlapped with compute is not free: NCCL kernels take SMs and HBM
// bandwidth from the GEMMs they run beside. Each second of overlap adds this fraction of a
// second to the step. One constant for every overlapped collective (data-parallel gradient
// sync beside the backward, ZeRO-3 gathers beside the forward and backward).
inline constexpr double kOverlapInterference = 0.18;

// Fraction of HBM bandwidth the optimizer step reaches (it reads and writes every byte of
// the rank's share of the parameter states).
inline constexpr double kOptimizerMemoryEfficiency = 0.75;

// Gradients are reduced in buckets of this many bytes (DDP's default bucket_cap_mb = 25):
// the runtime fills them (python/shardwise/runtime/buckets.py reads it as
// shardwise._C.GRADIENT_BUCKET_BYTES), and the search prices a parameter smaller than a
// bucket at its share of one collective's latency, not a whole one.
inline constexpr std::int64_t kGradientBucketBytes = std::int64_t{25} << 20;

// Of each device's memory, what a searched plan may use (the rest: the allocator's cache,
// workspaces). The searches' default, and parallelize's (shardwise._C.MEMORY_FRACTION).
inline constexpr double kMemoryFraction = 0.9;

}  // namespace shardwise::cost
