#include "ops/distributed_kernels.h"

#include <gtest/gtest.h>

namespace shardwise::ops {
namespace {

TEST(DistributedKernels, TheTableNamesTheRuntimesKernels) {
  EXPECT_EQ(lookup_kernel_ops(), (std::set<std::string>{"aten::embedding"}));
  EXPECT_EQ(statistics_kernel_ops(),
            (std::set<std::string>{"aten::_log_softmax", "aten::_softmax", "aten::batch_norm",
                                   "aten::cross_entropy_loss", "aten::layer_norm", "aten::log_softmax.int",
                                   "aten::nll_loss", "aten::nll_loss2d", "aten::nll_loss_nd", "aten::rms_norm",
                                   "aten::softmax.int"}));
  const ir::Node softmax{0, "aten::softmax.int", {0}, {1}, {}, ""};
  const ir::Node layer_norm{0, "aten::layer_norm", {0, 1, 2}, {3}, {}, ""};
  const ir::Node batch_norm{0, "aten::batch_norm", {0, 1, 2, 3, 4}, {5}, {}, ""};
  const ir::Node cross_entropy{0, "aten::cross_entropy_loss", {0, 1}, {2}, {}, ""};
  const ir::Node weighted{0, "aten::cross_entropy_loss", {0, 1, 2}, {3}, {}, ""};
  const ir::Node weighted_nll{0, "aten::nll_loss_nd", {0, 1, 2}, {3}, {}, ""};
  const ir::Node group_norm{0, "aten::group_norm", {0, 1, 2}, {3}, {}, ""};
  EXPECT_EQ(statistics_kernel(softmax), "shardwise::split_softmax");
  EXPECT_EQ(statistics_kernel(layer_norm), "shardwise::split_layer_norm");
  EXPECT_EQ(statistics_kernel(batch_norm), "shardwise::sync_batch_norm");
  EXPECT_TRUE(has_statistics_kernel(cross_entropy));
  EXPECT_FALSE(has_statistics_kernel(weighted));      // class weights: no kernel
  EXPECT_FALSE(has_statistics_kernel(weighted_nll));
  EXPECT_FALSE(has_statistics_kernel(group_norm));    // not in the table
  EXPECT_FALSE(has_statistics_kernel(cross_entropy, {}));  // a runtime with none
  EXPECT_TRUE(is_statistics_kernel("shardwise::split_rms_norm"));
  EXPECT_FALSE(is_statistics_kernel("shardwise::all_reduce"));
}

}  // namespace
}  // namespace shardwise::ops
