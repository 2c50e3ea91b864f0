// Golden tests: every tests/golden/*.ir file is one case.
//
// File format:
//   // RUN: pass1,pass2        (first line; the list may be empty: `// RUN:`)
//   // PLAN: {...}             (optional, any number of lines: a plan's sharding section as
//                              JSON, the lines joined, for the rank-graph pass)
//   // RANK: 3                 (optional: the rank the rank-graph pass rewrites for; 0)
//   // STAGE: 1 of 3           (optional: the stage the split-stages pass keeps, of how many)
//   <input graph, text IR>
//   // EXPECT:
//   <expected printed graph after the passes>
//
// Each case runs the pipeline shardwise-opt runs (with --verify-each) and compares
// the printed result exactly; it also checks that the input survives print -> parse ->
// print and a JSON round trip, and that the expected text is itself canonical.
//
// Also here: unit tests of the pass pipeline itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "ir/json.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "support/error.h"
#include "tools/pass_pipeline.h"

namespace shardwise::tools {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> golden_files() {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(SHARDWISE_GOLDEN_DIR, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ".ir") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim_right(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r' || s.back() == '\t')) s.pop_back();
  return s;
}

struct GoldenCase {
  std::vector<std::string> passes;
  std::string input;
  std::string expected;  // ends with exactly one '\n', like print_graph
  std::string plan;      // the `// PLAN:` lines joined
  int rank = 0;
  int stage = 0, stages = 1;
};

// Fails the test (and returns false) when the file does not follow the format.
bool split_golden(const std::string& text, GoldenCase& out) {
  std::istringstream lines(text);
  std::string line;
  std::getline(lines, line);
  const std::string run = "// RUN:";
  if (line.rfind(run, 0) != 0) {
    ADD_FAILURE() << "the first line must start with '// RUN:', found: " << line;
    return false;
  }
  out.passes = split_pass_list(line.substr(run.size()));
  bool in_expect = false;
  while (std::getline(lines, line)) {
    if (trim_right(line) == "// EXPECT:") {
      if (in_expect) {
        ADD_FAILURE() << "more than one '// EXPECT:' line";
        return false;
      }
      in_expect = true;
      continue;
    }
    if (!in_expect && line.rfind("// PLAN:", 0) == 0) out.plan += line.substr(8) + "\n";
    if (!in_expect && line.rfind("// RANK:", 0) == 0) out.rank = std::stoi(line.substr(8));
    if (!in_expect && line.rfind("// STAGE:", 0) == 0) {
      std::istringstream words(line.substr(9));
      std::string of;
      words >> out.stage >> of >> out.stages;
    }
    (in_expect ? out.expected : out.input) += line + "\n";
  }
  if (!in_expect) {
    ADD_FAILURE() << "no '// EXPECT:' line";
    return false;
  }
  out.expected = trim_right(out.expected) + "\n";
  return true;
}

class GoldenTest : public testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesExpectedOutput) {
  GoldenCase c;
  ASSERT_TRUE(split_golden(read_file(GetParam()), c)) << GetParam();

  std::string actual;
  try {
    PipelineOptions options;
    options.verify_each = true;
    options.rank = c.rank;
    options.stage = c.stage;
    options.stages = c.stages;
    if (!c.plan.empty()) options.sharding = plan::sharding_section_from_json(nlohmann::json::parse(c.plan));
    actual = run_pipeline(c.input, c.passes, options);
  } catch (const support::Error& e) {
    FAIL() << GetParam() << ": the pipeline failed: " << e.what();
  }
  EXPECT_EQ(actual, c.expected) << GetParam() << ": output differs from the EXPECT section";

  // The input text round-trips: print -> parse -> print is the identity, the graph
  // comes back equal, and JSON keeps everything.
  const ir::Graph g = ir::parse_graph(c.input);
  const std::string printed = ir::print_graph(g);
  const ir::Graph reparsed = ir::parse_graph(printed);
  EXPECT_EQ(ir::print_graph(reparsed), printed);
  EXPECT_EQ(reparsed, g);
  EXPECT_EQ(ir::graph_from_json(ir::graph_to_json(g)), g);
  EXPECT_EQ(ir::graph_from_json_string(ir::graph_to_json_string(g, 2)), g);

  // The EXPECT section is what the printer writes (so a test cannot pass on a
  // hand-formatted expectation that the tool would never print).
  EXPECT_EQ(ir::print_graph(ir::parse_graph(c.expected)), c.expected);
}

std::string case_name(const testing::TestParamInfo<std::string>& info) {
  std::string name = fs::path(info.param).stem().string();
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenTest, testing::ValuesIn(golden_files()), case_name);
// An empty directory is reported by GoldenDirectory.HasIrFiles below, with the path.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenTest);

TEST(GoldenDirectory, HasIrFiles) {
  EXPECT_FALSE(golden_files().empty()) << "no .ir files in " << SHARDWISE_GOLDEN_DIR
                                       << ": the golden tests would silently test nothing";
}

// ---- the pipeline itself --------------------------------------------------------

constexpr const char* kSmall = R"(graph(%x: f32[2]) {
  %dead: f32[2] = aten::neg(%x)
  %y: f32[2] = aten::relu(%x)
  return (%y)
})";

TEST(PassPipelineTest, ListsThePasses) {
  std::vector<std::string> names;
  for (const PassInfo& p : available_passes()) {
    names.push_back(p.name);
    EXPECT_FALSE(p.help.empty()) << p.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"verify", "dce", "check-shapes", "propagate-batch-dim", "json-roundtrip",
                                             "rank-graph", "async-gradient", "collective-matmul", "weight-gradient-split",
                                             "fused-accumulation",
                                             "split-stages"}));
}

TEST(PassPipelineTest, UnknownPassListsKnownOnes) {
  ir::Graph g = ir::parse_graph(kSmall);
  try {
    run_pass("cse", g);
    FAIL() << "no error";
  } catch (const support::Error& e) {
    EXPECT_STREQ(e.what(),
                 "unknown pass 'cse' (known passes: verify, dce, check-shapes, propagate-batch-dim, json-roundtrip, "
                 "rank-graph, async-gradient, collective-matmul, weight-gradient-split, fused-accumulation, "
                 "split-stages)");
  }
  // Names are checked before any pass runs: dce must not have run.
  EXPECT_THROW(run_passes(g, {"dce", "nope"}), support::Error);
  EXPECT_EQ(g.nodes().size(), 2u);
}

TEST(PassPipelineTest, RunsPassesInOrder) {
  EXPECT_EQ(run_pipeline(kSmall, {}, false), ir::print_graph(ir::parse_graph(kSmall)));
  EXPECT_EQ(run_pipeline(kSmall, {"dce", "json-roundtrip", "verify"}, true),
            "graph(%x: f32[2]) {\n  %y: f32[2] = aten::relu(%x)\n  return (%y)\n}\n");
  std::vector<std::string> seen;
  ir::Graph g = ir::parse_graph(kSmall);
  PipelineOptions options;
  options.after_each = [&](std::string_view pass, const ir::Graph& graph) {
    seen.push_back(std::string(pass) + ":" + std::to_string(graph.nodes().size()));
  };
  run_passes(g, {"verify", "dce", "verify"}, options);
  EXPECT_EQ(seen, (std::vector<std::string>{"verify:2", "dce:1", "verify:1"}));
}

TEST(PassPipelineTest, VerifyEachNamesWhereItFailed) {
  // Text can express a negative size, which the verifier rejects.
  const std::string bad = "graph(%x: f32[-1]) {\n  return (%x)\n}\n";
  EXPECT_NO_THROW(run_pipeline(bad, {}, false));
  try {
    run_pipeline(bad, {"dce"}, true);
    FAIL() << "no error";
  } catch (const support::ValidationError& e) {
    EXPECT_STREQ(e.what(), "verifying the input graph: value 0 %x: dimension 0 of f32[-1] is negative");
  }
  try {
    run_pipeline(bad, {"verify"}, false);
    FAIL() << "no error";
  } catch (const support::ValidationError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("pass 'verify': value 0 %x", 0), 0u) << e.what();
  }
  EXPECT_THROW(run_pipeline("graph(", {}, false), support::ParseError);
}

TEST(PassPipelineTest, SplitsPassLists) {
  EXPECT_EQ(split_pass_list(""), std::vector<std::string>{});
  EXPECT_EQ(split_pass_list(" "), std::vector<std::string>{});
  EXPECT_EQ(split_pass_list("dce"), std::vector<std::string>{"dce"});
  EXPECT_EQ(split_pass_list(" verify, dce ,,json-roundtrip,"),
            (std::vector<std::string>{"verify", "dce", "json-roundtrip"}));
}

}  // namespace
}  // namespace shardwise::tools
