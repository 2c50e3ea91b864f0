// Writes the seed corpora of the fuzz targets from the core's own writers, so every seed
// is a valid input of the current format. The seeds are checked in
// (tests/fuzz/corpus/<target>/); run this after a format change:
//   build/fuzz/fuzz_make_seeds tests/golden tests/fuzz/corpus
// ir_text and graph_json seeds come from the golden IR inputs (the text before
// "// EXPECT:"), the others from presets and small hand-made values.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>

#include "cost/cluster.h"
#include "cost/cluster_presets.h"
#include "cost/profiled_cost.h"
#include "ir/json.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "models/gpt.h"
#include "plan/plan.h"

namespace fs = std::filesystem;
using namespace shardwise;

namespace {

void write(const fs::path& dir, const std::string& name, const std::string& text) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << text;
  std::cout << (dir / name).string() << ": " << text.size() << " bytes\n";
}

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: fuzz_make_seeds GOLDEN_DIR CORPUS_DIR\n";
    return 2;
  }
  const fs::path golden = argv[1];
  const fs::path out = argv[2];

  // ir_text, graph_json: the golden inputs, and a one-layer GPT (the capture's shape).
  for (const auto& entry : fs::directory_iterator(golden)) {
    if (entry.path().extension() != ".ir") continue;
    std::string text = read(entry.path());
    text = text.substr(0, text.find("// EXPECT:"));
    const std::string stem = entry.path().stem().string();
    write(out / "ir_text", stem + ".ir", text);
    write(out / "graph_json", stem + ".json", ir::graph_to_json_string(ir::parse_graph(text)));
  }
  // A mask filled with -inf and a list with nan and inf in it (DeepSeek-V3's masked_fill).
  write(out / "graph_json", "non_finite.json",
        R"({"format": "shardwise.graph", "version": 1,
 "values": [{"name": "scores", "dtype": "f32", "shape": [2, 4], "batch_dim": 0, "role": "input"},
            {"name": "mask", "dtype": "bool", "shape": [2, 4], "batch_dim": 0, "role": "input"}],
 "nodes": [{"op": "aten::masked_fill.Scalar", "inputs": ["scores", "mask"],
            "outputs": [{"name": "masked", "dtype": "f32", "shape": [2, 4], "batch_dim": 0}],
            "attrs": {"value": {"float": "-inf"}, "bounds": [{"float": "nan"}, 1.5, {"float": "inf"}]}}],
 "outputs": ["masked"]}
)");
  models::GptConfig gpt{.layers = 1, .hidden = 8, .heads = 2, .seq = 4, .vocab = 16, .with_loss = false};
  write(out / "ir_text", "gpt_1layer.ir", ir::print_graph(models::build_gpt(gpt)));
  // The importer's hand-written form: no "id", optional fields left out.
  write(out / "graph_json", "no_ids.json",
        R"({"format": "shardwise.graph", "version": 1,
 "values": [{"name": "x", "dtype": "f32", "shape": [2, 16], "batch_dim": 0, "role": "input"},
            {"name": "fc.weight", "dtype": "f32", "shape": [4, 16], "role": "parameter"}],
 "nodes": [{"op": "aten::linear", "inputs": ["x", "fc.weight"],
            "outputs": [{"name": "linear", "dtype": "f32", "shape": [2, 4], "batch_dim": 0}],
            "attrs": {"scale": {"float": "-inf"}, "size": [2, 8.5], "flag": true, "dtype": null}, "module": "fc"}],
 "outputs": ["linear"]}
)");

  // plan_json.
  plan::Plan degrees{.data = 2, .tensor = 2, .pipeline = 2, .global_batch = 16, .micro_batch = 2};
  write(out / "plan_json", "degrees.json", plan::plan_to_json_string(degrees));
  plan::Plan interleaved{.data = 1, .tensor = 2, .pipeline = 2, .global_batch = 8, .micro_batch = 1,
                         .schedule = plan::Schedule::Interleaved1F1B, .virtual_stages = 2,
                         .recompute = plan::Recompute::Full, .zero_stage = 1,
                         .layers_per_stage = {3, 3, 3, 3}};
  interleaved.precision = "f16";  // a run setting (plan::RunSettings, Plan's base): not designated
  interleaved.predicted = plan::Predicted{.step_time = 12.3, .tflops_per_device = 141.0, .memory_per_rank = 6.1e10,
                                          .breakdown = {{"compute", 10.0}, {"bubble", 2.3}},
                                          .memory_breakdown = {{"parameters", 1e9}}};
  write(out / "plan_json", "interleaved.json", plan::plan_to_json_string(interleaved, 2));
  plan::Plan kfkb{.pipeline = 4, .global_batch = 32, .micro_batch = 4, .schedule = plan::Schedule::KFKB, .kfkb_k = 2};
  write(out / "plan_json", "kfkb.json", plan::plan_to_json_string(kfkb));
  plan::Plan sharded{.data = 2, .tensor = 2, .global_batch = 8, .micro_batch = 8};
  sharded.precision = "f32";
  sharded.sharding = plan::Sharding{
      .mesh = {2, 2},
      .axis_names = {"data", "tensor"},
      .level = "fast",
      .placements = {{"x", {"S(0)[0.6,0.4]", "R"}}, {"fc.weight", {"R", "S(1,g3)"}}, {"linear", {"S(0)", "P(sum)"}}},
      .strategies = {{"linear", {"replicate", "split n g3"}}},
      .zero = {{"fc.weight", {0}}},
      .recompute = plan::Recompute::Full,
      .leaves = {"x", "fc.weight"}};
  sharded.predicted = plan::Predicted{
      .step_time = 0.5,
      .collectives = {{.kind = "all_reduce", .value = "fc.weight", .axis = 0, .phase = "step", .bytes = 256,
                       .count = 1, .seconds = 1e-5}}};
  write(out / "plan_json", "sharded.json", plan::plan_to_json_string(sharded));
  plan::Plan meshes{.pipeline = 2, .global_batch = 8, .micro_batch = 4, .recompute = plan::Recompute::None,
                    .layers_per_stage = {3, 1}, .stage_meshes = {{1, 1}, {2, 1}}};
  meshes.precision = "f32";
  for (const std::vector<int>& mesh : meshes.stage_meshes)
    meshes.stage_shardings.push_back(plan::Sharding{.mesh = mesh,
                                                    .axis_names = {"data", "tensor"},
                                                    .level = "fast",
                                                    .placements = {{"x", {mesh[0] > 1 ? "S(0)" : "R", "R"}}}});
  write(out / "plan_json", "stage_meshes.json", plan::plan_to_json_string(meshes));
  // A complete pipelined plan: its stages' layout, its programs' hash, both TFLOP/s figures.
  plan::Plan complete{.data = 2, .tensor = 1, .pipeline = 2, .global_batch = 8, .micro_batch = 2};
  complete.stage_sharding = plan::Sharding{.mesh = {2, 1},
                                           .axis_names = {"data", "tensor"},
                                           .level = "fast",
                                           .placements = {{"x", {"S(0)", "R"}}, {"fc.weight", {"R", "R"}}},
                                           .strategies = {{"linear", {"split _0", "replicate"}}},
                                           .leaves = {"x", "fc.weight"},
                                           .inputs = {"x"},
                                           .graph = "28b60d000f51f969"};
  complete.programs = plan::ProgramsRecord{plan::plan_hash_hex(complete), "0123456789abcdef"};
  complete.predicted = plan::Predicted{.step_time = 0.5, .tflops_per_device = 90.0, .memory_per_rank = 1e9,
                                       .megatron_tflops_per_device = 120.0};
  write(out / "plan_json", "complete.json", plan::plan_to_json_string(complete));
  // Non-finite figures ({"float": "inf"}: JSON has none) and the micro-batch opt-in.
  plan::Plan non_finite{.pipeline = 2, .global_batch = 8, .micro_batch = 2};
  non_finite.micro_batch_semantics = plan::MicroBatchSemantics::PerMicroBatch;
  non_finite.predicted = plan::Predicted{.step_time = std::numeric_limits<double>::infinity(),
                                         .tflops_per_device = 0.0,
                                         .memory_per_rank = 1e9,
                                         .breakdown = {{"compute", 1.5},
                                                       {"bubble", -std::numeric_limits<double>::infinity()}}};
  write(out / "plan_json", "non_finite.json", plan::plan_to_json_string(non_finite));

  // cluster_json: the presets (one node; two for the mixed one: two node kinds).
  for (const std::string& name : cost::preset_names()) {
    const int nodes = name == "mixed-a100-v100" ? 2 : 1;
    write(out / "cluster_json", name + ".json", cost::cluster_to_json_string(cost::preset(name, nodes), 1));
  }
  write(out / "cluster_json", "mixed-pcie.json",
        cost::cluster_to_json_string(cost::preset("mixed-a100-v100", 1)));

  // profile_json.
  cost::Profile profile;
  profile.device = "cpu";
  profile.ops["aten::gelu(f32[2,32,256])->(f32[2,32,256]){approximate=\"none\"}"] = {2.0e-5, 5.0e-5};
  profile.ops["aten::linear(f32[2,32,64],f32[192,64],f32[192])->(f32[2,32,192]){}"] = {1.0e-4, 2.0e-4};
  profile.skipped["aten::embedding(i64[2,32],f32[16,64])->(f32[2,32,64]){}"] = "no sample input";
  profile.skipped["collective:all_to_all"] = "not supported by gloo";
  profile.collectives[cost::CollectiveKind::AllReduce][2] = {1.0e-4, 2.0e-9};
  profile.collectives[cost::CollectiveKind::AllGather][4] = {2.0e-4, 3.0e-9};
  write(out / "profile_json", "cpu.json", cost::profile_to_json_string(profile, 1));
  cost::Profile empty;
  empty.device = "NVIDIA H100 80GB HBM3";
  write(out / "profile_json", "empty.json", cost::profile_to_json_string(empty));
  return 0;
}
