#include "analysis/summary_table.h"

#include <gtest/gtest.h>

#include "gpt2_like_graph.h"

namespace shardwise::analysis {
namespace {

bool has(const std::string& text, std::string_view what) { return text.find(what) != std::string::npos; }

TEST(SummaryTableTest, Gpt2Summary) {
  testing::Gpt2Config config;
  config.layers = 12;
  const auto text = summary_table(ops::OpTable::builtin(), testing::gpt2_like_graph(config));
  // 12 x (12h^2 + 13h) + (1000 + 64) x 768 + 2 x 768 = 85,873,152
  EXPECT_TRUE(has(text, "parameters      85.87M  (327.58 MiB)")) << text;
  EXPECT_TRUE(has(text, "GFLOPs  (matmul")) << text;
  EXPECT_TRUE(has(text, "FLOPs   share")) << text;
  EXPECT_TRUE(has(text, "repeated blocks")) << text;
  EXPECT_TRUE(has(text, "transformer.h                     12          29  transformer.h.0 .. transformer.h.11"))
      << text;
  EXPECT_TRUE(has(text, "aten::addmm")) << text;
  EXPECT_TRUE(has(text, "unknown ops (no dimension rule: replicated)\n  (none)")) << text;
  EXPECT_TRUE(has(text, "lm_head")) << text;
  EXPECT_TRUE(has(text, "transformer ")) << text;
  // addmm is the top op by FLOPs.
  EXPECT_LT(text.find("aten::addmm"), text.find("aten::linear")) << text;
}

TEST(SummaryTableTest, HumanUnits) {
  EXPECT_EQ(human_count(824), "824");
  EXPECT_EQ(human_count(12'345), "12.3K");
  EXPECT_EQ(human_count(124'439'808), "124.44M");
  EXPECT_EQ(human_count(1'500'000'000), "1.50B");
  EXPECT_EQ(human_flops(999), "999 FLOPs");
  EXPECT_EQ(human_flops(961'366'418), "961.37 MFLOPs");
  EXPECT_EQ(human_flops(2'500'000'000'000), "2.50 TFLOPs");
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(3 * 1024 * 1024), "3.00 MiB");
  EXPECT_EQ(human_bytes(std::int64_t{5} << 30), "5.00 GiB");
}

TEST(SummaryTableTest, EmptyGraph) {
  const auto text = summary_table(ops::OpTable::builtin(), ir::Graph{});
  EXPECT_TRUE(has(text, "nodes           0")) << text;
  EXPECT_TRUE(has(text, "repeated blocks\n  (none)")) << text;
}

}  // namespace
}  // namespace shardwise::analysis
