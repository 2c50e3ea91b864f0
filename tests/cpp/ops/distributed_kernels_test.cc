#include "ops/distributed_kernels.h"

#include <gtest/gtest.h>

namespace shardwise::ops {
namespace {

TEST(DistributedKernels, TheTableNamesTheRuntimesKernels) {
  EXPECT_EQ(lookup_kernel_ops(), (std::set<std::string>{"aten::embedding"}));
  EXPECT_EQ(statistics_kernel_ops(), (std::set<std::string>{"aten::cross_entropy_loss"}));
  const ir::Node softmax{0, "aten::softmax.int", {0}, {1}, {}, ""};
  const ir::Node cross_entropy{0, "aten::cross_entropy_loss", {0, 1}, {2}, {}, ""};
  const ir::Node weighted{0, "aten::cross_entropy_loss", {0, 1, 2}, {3}, {}, ""};
  EXPECT_FALSE(has_statistics_kernel(softmax));
  EXPECT_TRUE(has_statistics_kernel(cross_entropy));
  EXPECT_FALSE(has_statistics_kernel(weighted));                 // class weights: no kernel
  EXPECT_FALSE(has_statistics_kernel(cross_entropy, {}));        // a runtime with none
}

}  // namespace
}  // namespace shardwise::ops
