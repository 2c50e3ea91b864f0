#include "support/log.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace shardwise::support {
namespace {

// Restores "no sink" after each test: the sink is process-wide.
class LogTest : public ::testing::Test {
 protected:
  void TearDown() override { set_log_sink({}); }
};

TEST_F(LogTest, WithoutASinkNothingIsEnabledAndLinesAreDropped) {
  set_log_sink({});
  EXPECT_FALSE(log_enabled(LogLevel::Warning));
  log(LogLevel::Warning, "dropped");  // no crash, nowhere to go
}

TEST_F(LogTest, TheSinkGetsLinesAtOrAboveItsLevelWithTheirLevels) {
  std::vector<std::pair<LogLevel, std::string>> lines;
  set_log_sink([&](LogLevel level, const std::string& line) { lines.emplace_back(level, line); }, LogLevel::Info);
  EXPECT_FALSE(log_enabled(LogLevel::Debug));
  EXPECT_TRUE(log_enabled(LogLevel::Info));
  log(LogLevel::Debug, "too fine");
  log(LogLevel::Info, "chose mesh [2, 4]");
  log(LogLevel::Warning, "fits under none");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], std::make_pair(LogLevel::Info, std::string("chose mesh [2, 4]")));
  EXPECT_EQ(lines[1].first, LogLevel::Warning);
  EXPECT_EQ(static_cast<int>(LogLevel::Info), 20);  // Python logging's INFO, passed through as is
}

TEST_F(LogTest, ASinkThatThrowsChangesNothing) {
  set_log_sink([](LogLevel, const std::string&) { throw std::runtime_error("broken sink"); });
  EXPECT_NO_THROW(log(LogLevel::Info, "still fine"));
}

}  // namespace
}  // namespace shardwise::support
