// shardwise-opt: reads a graph (text IR, or JSON), runs passes, prints the result.
//
//   shardwise-opt [--passes=a,b] [--verify-each] [--emit=text|json] [--print-after-each]
//                 [--plan=PLAN.json] [--rank=N] [--stage=K/N] FILE|-
//
// --plan reads a plan file (docs/plan-format.md) whose `sharding` section the rank-graph
// pass rewrites for, on rank --rank (default 0):
//   shardwise-opt --passes=rank-graph --plan=plan.json --rank=3 model.ir
// --stage=K/N keeps stage K of N for the split-stages pass:
//   shardwise-opt --passes=split-stages --stage=1/3 model.ir
//
// FILE is JSON when its name ends in .json; `-` reads stdin, as JSON when its first
// non-blank character is '{' (text IR starts with `graph` or a comment). The result
// goes to stdout; --print-after-each writes the graph after every pass to stderr (so
// stdout stays one graph). Errors: a message on stderr, exit code 1.
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "ir/json.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "plan/plan.h"
#include "support/error.h"
#include "tools/pass_pipeline.h"

namespace {

using shardwise::support::Error;

struct Options {
  std::vector<std::string> passes;
  bool verify_each = false;
  bool print_after_each = false;
  bool emit_json = false;
  std::string file;
  std::string plan;
  int rank = 0;
  int stage = 0;
  int stages = 1;
};

std::string usage() {
  std::string out =
      "usage: shardwise-opt [--passes=a,b] [--verify-each] [--emit=text|json] [--print-after-each]\n"
      "                     [--plan=PLAN.json] [--rank=N] [--stage=K/N] FILE|-\n"
      "passes:\n";
  for (const auto& p : shardwise::tools::available_passes()) out += fmt::format("  {:16} {}\n", p.name, p.help);
  return out;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// Returns false when --help was asked for (usage already printed).
bool parse_args(int argc, char** argv, Options& opts) {
  bool have_file = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << usage();
      return false;
    } else if (starts_with(arg, "--passes=")) {
      opts.passes = shardwise::tools::split_pass_list(arg.substr(9));
    } else if (arg == "--verify-each") {
      opts.verify_each = true;
    } else if (arg == "--print-after-each") {
      opts.print_after_each = true;
    } else if (starts_with(arg, "--emit=")) {
      const std::string_view emit = arg.substr(7);
      if (emit != "text" && emit != "json") throw Error(fmt::format("--emit must be text or json, not '{}'", emit));
      opts.emit_json = emit == "json";
    } else if (starts_with(arg, "--plan=")) {
      opts.plan = std::string(arg.substr(7));
    } else if (starts_with(arg, "--rank=")) {
      try {
        opts.rank = std::stoi(std::string(arg.substr(7)));
      } catch (const std::exception&) {
        throw Error(fmt::format("--rank must be an integer, not '{}'", arg.substr(7)));
      }
    } else if (starts_with(arg, "--stage=")) {
      const std::string text(arg.substr(8));
      const auto slash = text.find('/');
      try {
        if (slash == std::string::npos) throw std::invalid_argument(text);
        opts.stage = std::stoi(text.substr(0, slash));
        opts.stages = std::stoi(text.substr(slash + 1));
      } catch (const std::exception&) {
        throw Error(fmt::format("--stage must be K/N (stage K of N), not '{}'", text));
      }
    } else if (arg != "-" && starts_with(arg, "-")) {
      throw Error(fmt::format("unknown option '{}' (see --help)", arg));
    } else {
      if (have_file) throw Error(fmt::format("more than one input file ('{}' and '{}')", opts.file, arg));
      opts.file = std::string(arg);
      have_file = true;
    }
  }
  if (!have_file) throw Error("no input file (give FILE, or - for stdin; see --help)");
  return true;
}

std::string read_input(const std::string& file) {
  if (file == "-") return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot open '{}'", file));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool is_json_input(const std::string& file, const std::string& text) {
  if (file != "-") return file.size() >= 5 && file.compare(file.size() - 5, 5, ".json") == 0;
  const auto first = text.find_first_not_of(" \t\r\n");
  return first != std::string::npos && text[first] == '{';
}

std::string emit(const shardwise::ir::Graph& graph, bool json) {
  return json ? shardwise::ir::graph_to_json_string(graph, 2) + "\n" : shardwise::ir::print_graph(graph);
}

int run(int argc, char** argv) {
  Options opts;
  if (!parse_args(argc, argv, opts)) return 0;
  const std::string text = read_input(opts.file);
  const std::string source = opts.file == "-" ? std::string("<stdin>") : opts.file;
  shardwise::ir::Graph graph;
  try {
    graph = is_json_input(opts.file, text) ? shardwise::ir::graph_from_json_string(text)
                                           : shardwise::ir::parse_graph(text);
  } catch (const shardwise::support::ParseError& e) {
    throw shardwise::support::ParseError(fmt::format("{}: {}", source, e.what()));
  }
  shardwise::tools::PipelineOptions options;
  options.verify_each = opts.verify_each;
  options.rank = opts.rank;
  options.stage = opts.stage;
  options.stages = opts.stages;
  if (!opts.plan.empty()) {
    const shardwise::plan::Plan plan = shardwise::plan::plan_from_json_string(read_input(opts.plan));
    if (!plan.sharding) throw Error(fmt::format("{}: the plan has no sharding section", opts.plan));
    options.sharding = plan.sharding;
  }
  if (opts.print_after_each) {
    options.after_each = [&](std::string_view pass, const shardwise::ir::Graph& g) {
      std::cerr << fmt::format("// after pass '{}':\n", pass) << emit(g, opts.emit_json);
    };
  }
  shardwise::tools::run_passes(graph, opts.passes, options);
  std::cout << emit(graph, opts.emit_json);
  std::cout.flush();
  if (!std::cout) throw Error("cannot write the output");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "shardwise-opt: error: " << e.what() << "\n";
    return 1;
  }
}
