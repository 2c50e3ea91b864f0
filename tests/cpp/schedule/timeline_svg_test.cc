#include "schedule/timeline_svg.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "schedule/schedules.h"
#include "schedule/simulator.h"

namespace shardwise::schedule {
namespace {

std::size_t count(const std::string& s, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t pos = s.find(needle); pos != std::string::npos; pos = s.find(needle, pos + needle.size())) ++n;
  return n;
}

// Tiny well-formedness check: tags balance (a stack of names), exactly one root,
// and the root is <svg>. No comments / CDATA / processing instructions are emitted.
void expect_well_formed_svg(const std::string& s) {
  std::vector<std::string> stack;
  int roots = 0;
  std::string root;
  std::size_t pos = 0;
  while ((pos = s.find('<', pos)) != std::string::npos) {
    const std::size_t close = s.find('>', pos);
    ASSERT_NE(close, std::string::npos);
    std::string tag = s.substr(pos + 1, close - pos - 1);
    ASSERT_FALSE(tag.empty());
    ASSERT_EQ(tag.find('<'), std::string::npos) << "unescaped < inside a tag";
    if (tag[0] == '/') {
      ASSERT_FALSE(stack.empty()) << "stray </" << tag;
      EXPECT_EQ(stack.back(), tag.substr(1));
      stack.pop_back();
    } else {
      const bool self_closing = tag.back() == '/';
      const std::string name = tag.substr(0, tag.find_first_of(" /\n"));
      if (stack.empty()) {
        ++roots;
        root = name;
      }
      if (!self_closing) stack.push_back(name);
    }
    pos = close + 1;
  }
  EXPECT_TRUE(stack.empty());
  EXPECT_EQ(roots, 1);
  EXPECT_EQ(root, "svg");
  // Text between tags has no raw '&' except entities.
  for (std::size_t a = s.find('&'); a != std::string::npos; a = s.find('&', a + 1)) {
    const std::string ent = s.substr(a, 6);
    EXPECT_TRUE(ent.rfind("&amp;", 0) == 0 || ent.rfind("&lt;", 0) == 0 || ent.rfind("&gt;", 0) == 0 ||
                ent.rfind("&quot;", 0) == 0 || ent.rfind("&apos;", 0) == 0);
  }
}

TEST(TimelineSvgTest, OneRowPerRankAndOneRectPerCompute) {
  for (int v : {1, 2}) {
    const int p = 4;
    const int m = 8;
    const auto s = v == 1 ? one_f_one_b(p, m) : interleaved_1f1b(p, m, v);
    SimulationCosts costs;
    costs.forward.assign(static_cast<std::size_t>(p * v), 1.0 / v);
    costs.backward.assign(static_cast<std::size_t>(p * v), 2.0 / v);
    costs.transfer = constant_transfer(0.1);
    costs.optimizer_step = 0.5;
    const auto r = simulate(s, costs);
    const std::string svg = timeline_svg(r, s, {.width = 800.0, .row_height = 24.0, .title = "1F1B <p=4> & m=8"});
    expect_well_formed_svg(svg);
    EXPECT_EQ(count(svg, "<g class=\"rank\""), static_cast<std::size_t>(p));
    for (int rank = 0; rank < p; ++rank) EXPECT_NE(svg.find("rank " + std::to_string(rank) + "<"), std::string::npos);
    std::size_t forwards = 0;
    std::size_t backwards = 0;
    for (const auto& actions : s.per_rank)
      for (const auto& a : actions) {
        forwards += a.kind == ActionKind::Forward;
        backwards += a.kind == ActionKind::Backward;
      }
    EXPECT_EQ(forwards, static_cast<std::size_t>(p * v * m));
    EXPECT_EQ(count(svg, "class=\"interval forward\""), forwards);
    EXPECT_EQ(count(svg, "class=\"interval backward\""), backwards);
    EXPECT_GT(count(svg, "class=\"interval send\""), 0u);
    EXPECT_GT(count(svg, "class=\"interval update\""), 0u);
    EXPECT_NE(svg.find("&lt;p=4&gt; &amp; m=8"), std::string::npos);
    EXPECT_NE(svg.find("class=\"legend\""), std::string::npos);
  }
}

TEST(TimelineSvgTest, XmlEscape) { EXPECT_EQ(xml_escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&apos;"); }

}  // namespace
}  // namespace shardwise::schedule
