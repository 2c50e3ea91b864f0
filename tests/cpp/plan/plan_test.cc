#include "plan/plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "support/error.h"

namespace shardwise::plan {
namespace {

Plan example() {
  Plan p;
  p.data = 2;
  p.tensor = 2;
  p.pipeline = 2;
  p.global_batch = 16;
  p.micro_batch = 2;
  p.schedule = Schedule::Interleaved1F1B;
  p.virtual_stages = 2;
  p.recompute = Recompute::Full;
  p.zero_stage = 1;
  return p;
}

TEST(Plan, JsonRoundTripAndHash) {
  Plan p = example();
  EXPECT_EQ(p.world_size(), 8);
  EXPECT_EQ(p.num_micro_batches(), 4);
  Plan back = plan_from_json_string(plan_to_json_string(p));
  EXPECT_EQ(back, p);
  EXPECT_EQ(plan_hash(back), plan_hash(p));
  EXPECT_EQ(plan_hash_hex(p).size(), 16u);

  // Predictions round-trip too but do not change the hash.
  Plan costed = p;
  costed.predicted = Predicted{1.5, 140.0, 6e10, {{"compute", 1.0}}, {{"weights", 1e9}}};
  EXPECT_EQ(plan_from_json_string(plan_to_json_string(costed)), costed);
  EXPECT_EQ(plan_hash(costed), plan_hash(p));
  // The nodes it was priced on (the launch line's --nnodes / --nproc-per-node).
  costed.predicted->ranks_per_node = {4, 4};
  EXPECT_EQ(plan_from_json_string(plan_to_json_string(costed)), costed);
  EXPECT_EQ(plan_hash(costed), plan_hash(p));
  // Megatron-LM's accounting beside the model FLOPs (the evaluator's plans); 0 is not written.
  EXPECT_EQ(plan_to_json(costed)["predicted"].count("megatron_tflops_per_device"), 0u);
  costed.predicted->megatron_tflops_per_device = 186.0;
  EXPECT_EQ(plan_from_json_string(plan_to_json_string(costed)), costed);
  EXPECT_EQ(plan_hash(costed), plan_hash(p));

  Plan other = p;
  other.micro_batch = 1;
  EXPECT_NE(plan_hash(other), plan_hash(p));

  // The dtype a run steps its parameters in: written only when set (older plans keep their
  // hash), read back, and checked.
  EXPECT_EQ(plan_to_json(p).count("state_dtype"), 0u);
  Plan own = p;
  own.state_dtype = "bf16";
  EXPECT_EQ(plan_from_json_string(plan_to_json_string(own)), own);
  EXPECT_NE(plan_hash(own), plan_hash(p));
  own.state_dtype = "fp8";
  EXPECT_THROW(validate(own), support::ValidationError);
}

// JSON has no inf or nan: predicted figures that are not finite (a plan that fits nowhere
// priced at an infinite step) are written as {"float": "inf"} and read back exactly; nlohmann
// alone would write null, which no reader takes as a number.
TEST(Plan, NonFiniteFiguresRoundTrip) {
  Plan p = example();
  p.predicted = Predicted{std::numeric_limits<double>::infinity(), 0.0, 1e9,
                          {{"compute", -std::numeric_limits<double>::infinity()}, {"bubble", 1.0}}, {}};
  p.predicted->stage_times = {1.0, std::numeric_limits<double>::infinity()};
  p.predicted->collectives = {{"all_reduce", "w", 0, "step", std::numeric_limits<double>::infinity(), 1, 1e-3}};
  const std::string text = plan_to_json_string(p);
  EXPECT_NE(text.find(R"({"float":"inf"})"), std::string::npos) << text;
  EXPECT_EQ(text.find("null"), std::string::npos) << text;
  EXPECT_EQ(plan_from_json_string(text), p);
  nlohmann::json doc = plan_to_json(p);
  // A nan is refused: a plan holding one would not equal itself after a round trip.
  doc["predicted"]["step_time"] = {{"float", "nan"}};
  EXPECT_THROW(plan_from_json(doc), support::ParseError);
  doc["predicted"]["step_time"] = {{"float", "infinity"}};
  EXPECT_THROW(plan_from_json(doc), support::ParseError);
  doc["predicted"]["step_time"] = nullptr;
  EXPECT_THROW(plan_from_json(doc), support::ParseError);
}

// A boolean field on by default: not written (a plan without it keeps its hash); off, it
// round-trips, is part of the hash (the stages run other programs), and must be a boolean.
void expect_written_only_when_off(bool Plan::*field, const std::string& key) {
  const Plan p = example();
  EXPECT_TRUE(p.*field);
  EXPECT_EQ(plan_to_json(p).count(key), 0u);
  Plan off = p;
  off.*field = false;
  EXPECT_EQ(plan_to_json(off)[key], false);
  EXPECT_EQ(plan_from_json_string(plan_to_json_string(off)), off);
  EXPECT_NE(plan_hash(off), plan_hash(p));
  nlohmann::json doc = plan_to_json(p);
  doc[key] = true;
  EXPECT_EQ(plan_from_json(doc), p);
  doc[key] = "no";
  EXPECT_THROW(plan_from_json(doc), support::ParseError) << key;
}

TEST(Plan, FusedAccumulationIsWrittenOnlyWhenOff) {
  expect_written_only_when_off(&Plan::fused_accumulation, "fused_accumulation");
}

// split_experts: the stages' layout keeps every expert on every rank; refused beside an expert
// degree.
TEST(Plan, SplitExpertsIsWrittenOnlyWhenOffAndRefusedBesideAnExpertDegree) {
  expect_written_only_when_off(&Plan::split_experts, "split_experts");
  Plan both;
  both.data = 4;
  both.pipeline = 2;
  both.global_batch = 8;
  both.expert = 4;
  EXPECT_NO_THROW(validate(both, 8));
  both.split_experts = false;
  try {
    validate(both, 8);
    FAIL() << "expert 4 with split_experts false";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("plan.expert: 4 with split_experts false"), std::string::npos) << e.what();
  }
}

// Context parallelism (plan.context) is written only when > 1, so plans without it keep their
// text and hash; a stage's mesh is {data x context, tensor}; data beside it is refused.
TEST(Plan, ExpertIsWrittenOnlyWhenItSplitsTheExpertsOverAStagesWholeDataAxis) {
  Plan p;
  p.data = 4;
  p.pipeline = 2;
  p.global_batch = 8;
  EXPECT_EQ(plan_to_json(p).count("expert"), 0u);
  Plan split = p;
  split.expert = 4;
  EXPECT_EQ(plan_to_json(split)["expert"], 4);
  EXPECT_EQ(plan_from_json_string(plan_to_json_string(split)), split);
  EXPECT_NE(plan_hash(split), plan_hash(p));
  validate(split, 8);
  Plan part = split;
  part.expert = 2;  // half the data axis: a third mesh axis the runtime does not run
  try {
    validate(part);
    ADD_FAILURE() << "expert 2 of data 4 was accepted";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("plan.expert: 2 with data 4 x context 1"), std::string::npos) << e.what();
  }
  Plan zero3 = split;
  zero3.zero_stage = 3;
  EXPECT_THROW(validate(zero3), support::ValidationError);
  Plan ring = p;  // over data x context: the context ranks' tokens are gathered too
  ring.data = 1, ring.context = 4, ring.expert = 4, ring.global_batch = 2;
  validate(ring, 8);
}

TEST(Plan, ContextIsWrittenOnlyWhenItSplitsTheSequence) {
  Plan p;
  p.tensor = 2;
  p.pipeline = 2;
  p.global_batch = 4;
  EXPECT_EQ(plan_to_json(p).count("context"), 0u);
  Plan ring = p;
  ring.context = 4;
  EXPECT_EQ(plan_to_json(ring)["context"], 4);
  EXPECT_EQ(plan_from_json_string(plan_to_json_string(ring)), ring);
  EXPECT_NE(plan_hash(ring), plan_hash(p));
  EXPECT_EQ(ring.world_size(), 16);
  EXPECT_EQ(ring.stage_mesh(1), (std::vector<int>{4, 2}));
  EXPECT_EQ(ring.stage_first_rank(1), 8);
  EXPECT_EQ(ring.num_micro_batches(), 4);  // a micro-batch is one row over the 4 context ranks
  validate(ring, 16);
  EXPECT_THROW(validate(ring, 8), support::ValidationError);
  Plan both = ring;
  both.data = 2;
  both.global_batch = 8;
  try {
    validate(both);
    ADD_FAILURE() << "data 2 beside context 4 was accepted";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("plan.context: 4 with data 2"), std::string::npos) << e.what();
  }
  Plan none = ring;
  none.context = 0;
  EXPECT_THROW(validate(none), support::ValidationError);
}

// A sharding's async_gradients (the async-gradient pass, on by default) is written only when
// off, so a sharding without it keeps its text and hash.
TEST(Plan, AsyncGradientsAreWrittenOnlyWhenOff) {
  Plan p = example();
  Sharding s;
  s.mesh = {p.data, p.tensor};
  s.axis_names = {"data", "tensor"};
  s.placements = {{"x", {"R", "R"}}};
  p.stage_sharding = s;
  EXPECT_TRUE(p.stage_sharding->async_gradients);
  const std::string on = plan_to_json_string(p);
  EXPECT_EQ(on.find("async_gradients"), std::string::npos) << on;
  Plan off = p;
  off.stage_sharding->async_gradients = false;
  const std::string text = plan_to_json_string(off);
  EXPECT_NE(text.find(R"("async_gradients":false)"), std::string::npos) << text;
  EXPECT_EQ(plan_from_json_string(text), off);
  EXPECT_NE(plan_hash(off), plan_hash(p));
  nlohmann::json doc = nlohmann::json::parse(text);
  doc["stage_sharding"]["async_gradients"] = "no";
  EXPECT_THROW(plan_from_json_string(doc.dump()), support::ParseError);
}

// The micro-batch semantics: "exact" is the default and not written (a plan without it keeps
// its hash); "per_micro_batch" round-trips, is part of the hash, and a misspelling names both.
TEST(Plan, MicroBatchSemanticsIsWrittenOnlyWhenChosen) {
  Plan p = example();
  EXPECT_EQ(plan_to_json(p).count("micro_batch_semantics"), 0u);
  Plan chosen = p;
  chosen.micro_batch_semantics = MicroBatchSemantics::PerMicroBatch;
  EXPECT_EQ(plan_to_json(chosen)["micro_batch_semantics"], "per_micro_batch");
  EXPECT_EQ(plan_from_json_string(plan_to_json_string(chosen)), chosen);
  EXPECT_NE(plan_hash(chosen), plan_hash(p));
  nlohmann::json doc = plan_to_json(p);
  doc["micro_batch_semantics"] = "exact";
  EXPECT_EQ(plan_from_json(doc), p);
  doc["micro_batch_semantics"] = "per-micro-batch";
  try {
    plan_from_json(doc);
    FAIL() << "accepted 'per-micro-batch'";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("known: exact, per_micro_batch"), std::string::npos) << e.what();
  }
}

// A heterogeneous pipeline's stages on the rank blocks that suit them: a permutation, in the
// hash when set, not written when empty (so a plan without it keeps its hash); the devices
// and times per stage round-trip with the prediction.
TEST(Plan, StageGroupsAreAnOrderOfTheRankBlocks) {
  Plan p = example();
  EXPECT_EQ(plan_to_json(p).count("stage_groups"), 0u);
  const std::uint64_t in_order = plan_hash(p);
  p.stage_groups = {1, 0};
  EXPECT_EQ(p.stage_group(0), 1);
  EXPECT_EQ(plan_from_json_string(plan_to_json_string(p)), p);
  EXPECT_NE(plan_hash(p), in_order);
  p.predicted = Predicted{1.5, 140.0, 6e10, {{"compute", 1.0}}, {{"weights", 1e9}}};
  p.predicted->stage_devices = {"a100-half", "a100-sxm4-80gb"};
  p.predicted->stage_times = {0.094, 0.093};
  EXPECT_EQ(plan_from_json_string(plan_to_json_string(p)), p);
  for (const std::vector<int>& bad : {std::vector<int>{0, 0}, std::vector<int>{0}, std::vector<int>{1, 2}}) {
    p.stage_groups = bad;
    try {
      validate(p);
      FAIL() << "stage_groups accepted";
    } catch (const support::ValidationError& e) {
      EXPECT_NE(std::string(e.what()).find("plan.stage_groups"), std::string::npos) << e.what();
    }
  }
}

TEST(Plan, StageMeshesGiveEachStageASubMeshOfItsOwnSize) {
  Plan p;
  p.pipeline = 2;
  p.global_batch = 16;
  p.micro_batch = 4;  // a whole micro-batch's rows: 4 micro-batches
  p.recompute = Recompute::None;
  const std::uint64_t plain = plan_hash(p);
  EXPECT_EQ(plan_to_json(p).count("stage_meshes"), 0u);
  p.stage_meshes = {{1, 1}, {2, 1}};
  validate(p, 3);
  EXPECT_EQ(p.world_size(), 3);
  EXPECT_EQ(p.num_micro_batches(), 4);
  EXPECT_EQ(p.stage_first_rank(0), 0);
  EXPECT_EQ(p.stage_first_rank(1), 1);
  EXPECT_EQ(p.stage_size(1), 2);
  EXPECT_EQ(p.stage_of_rank(2), 1);
  EXPECT_EQ(p.stage_mesh(1), (std::vector<int>{2, 1}));
  EXPECT_THROW(p.stage_of_rank(3), support::ValidationError);
  EXPECT_NE(plan_hash(p), plain);
  EXPECT_EQ(plan_from_json_string(plan_to_json_string(p)), p);

  // Each stage's layout on its own mesh; stage_plan(plan, s) is that stage's SPMD plan.
  Sharding one, two;
  one.mesh = {1, 1};
  two.mesh = {2, 1};
  for (Sharding* s : {&one, &two}) s->axis_names = {"data", "tensor"}, s->level = "fast";
  two.placements = {{"x", {"S(0)", "R"}}};
  p.stage_shardings = {one, two};
  EXPECT_EQ(plan_from_json_string(plan_to_json_string(p)), p);
  const Plan second = stage_plan(p, 1);
  EXPECT_EQ(second.data, 2);
  EXPECT_EQ(second.global_batch, 4);
  EXPECT_EQ(second.sharding->placements, two.placements);
  EXPECT_THROW(stage_plan(p), support::ValidationError);  // one layout per stage, not one for all

  auto refused = [](Plan bad, const std::string& says) {
    try {
      validate(bad);
      ADD_FAILURE() << "accepted: " << says;
    } catch (const support::ValidationError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  Plan bad = p;
  bad.stage_shardings[1].mesh = {1, 2};
  refused(bad, "plan.stage_shardings[1].mesh: [1, 2] must be [data 2, tensor 1]");
  bad = p, bad.stage_meshes = {{1, 1}, {3, 1}};
  bad.stage_shardings.clear();
  refused(bad, "plan.stage_meshes[1]: data 3 does not divide the micro-batch's 4 rows");
  bad = p, bad.data = 2;
  refused(bad, "data 2 and tensor 1 must be 1");
  bad = p, bad.stage_meshes = {{1, 1}};
  refused(bad, "plan.stage_meshes: 1 meshes for pipeline 2");
  bad = p, bad.stage_meshes = {{1, 1}, {0, 2}};
  refused(bad, "plan.stage_meshes[1]: [0, 2] is not [data >= 1, tensor >= 1]");
  bad = p, bad.stage_groups = {1, 0};
  refused(bad, "with stage_groups");
  Plan without = example();
  without.stage_shardings = {one};
  refused(without, "plan.stage_shardings: given without stage_meshes");
  try {
    validate(p, 4);
    FAIL() << "3 ranks of stage meshes validated for a world of 4";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("world size 4 != the stage meshes' 3 ranks"), std::string::npos) << e.what();
  }
}

TEST(Plan, RanksPerNodeMustSumToTheWorld) {
  Plan p = example();
  p.predicted = Predicted{1.5, 140.0, 6e10, {}, {}};
  p.predicted->ranks_per_node = {4, 2};  // 6 ranks for a world of 8
  try {
    plan_from_json_string(plan_to_json_string(p));
    FAIL() << "a plan whose nodes hold 6 of its 8 ranks parsed";
  } catch (const support::ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("6 ranks in all, the plan's world is 8"), std::string::npos) << e.what();
  }
  p.predicted->ranks_per_node = {8, 0};
  EXPECT_THROW(plan_from_json_string(plan_to_json_string(p)), support::ParseError);
}

TEST(Plan, ValidationNamesTheNumbers) {
  Plan p = example();
  p.global_batch = 10;
  try {
    validate(p);
    FAIL();
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("global_batch 10 is not divisible by micro_batch 2 x data 2 = 4"),
              std::string::npos)
        << e.what();
  }
  p = example();
  try {
    validate(p, 16);
    FAIL();
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("world size 16 != t 2 x p 2 x d 2 = 8"), std::string::npos) << e.what();
  }
  p = example();
  p.schedule = Schedule::OneFOneB;
  EXPECT_THROW(validate(p), support::ValidationError);  // virtual stages need interleaving
  p = example();
  p.zero_stage = 4;
  EXPECT_THROW(validate(p), support::ValidationError);
  EXPECT_THROW(plan_from_json_string(R"({"data": 1})"), support::ParseError);
  EXPECT_THROW(plan_from_json_string("{nope"), support::ParseError);
}

// A plan with the given JSON text in place of "data" (and the other fields valid).
std::string with_data(const std::string& data) {
  return R"({"data": )" + data +
         R"(, "tensor": 1, "pipeline": 1, "global_batch": 8, "micro_batch": 1, "schedule": "1f1b"})";
}

template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Plan, NumberTooLargeForADoubleIsAParseError) {
  // Found by fuzzing (tests/fuzz/plan_json_fuzz.cc): json::parse throws out_of_range (406),
  // not parse_error, for "1e400"; it escaped plan_from_json_string as a nlohmann exception.
  EXPECT_NE(error_of<support::ParseError>([] { plan_from_json_string(with_data("1e400")); })
                .find("plan: malformed JSON: [json.exception.out_of_range.406] number overflow parsing '1e400'"),
            std::string::npos);
  EXPECT_THROW(plan_from_json_string("-2e308"), support::ParseError);
}

TEST(Plan, IntegerFieldsMustBeIntegersInRange) {
  // nlohmann's get<int> static_casts: a double out of int's range was undefined behaviour
  // (UBSan float-cast-overflow, reproduced through tests/fuzz/plan_json_fuzz.cc), 2.5 became
  // 2 and 4294967297 became 1.
  EXPECT_EQ(error_of<support::ParseError>([] { plan_from_json_string(with_data("1e10")); }),
            "plan.data: integer 10000000000.0 is out of range [-2147483648, 2147483647]");
  EXPECT_EQ(error_of<support::ParseError>([] { plan_from_json_string(with_data("4294967297")); }),
            "plan.data: integer 4294967297 is out of range [-2147483648, 2147483647]");
  EXPECT_EQ(error_of<support::ParseError>([] { plan_from_json_string(with_data("2.5")); }),
            "plan.data: expected an integer, got 2.5");
  EXPECT_NE(error_of<support::ParseError>([] { plan_from_json_string(with_data("\"2\"")); }).find("plan.data: wrong type"),
            std::string::npos);
  EXPECT_EQ(plan_from_json_string(with_data("2.0")).data, 2);  // an integral double still reads
  EXPECT_EQ(error_of<support::ParseError>([] {
              plan_from_json_string(R"({"data": 1, "tensor": 1, "pipeline": 1, "global_batch": 1e19,
                                        "micro_batch": 1, "schedule": "1f1b"})");
            }),
            "plan.global_batch: integer 1e+19 is out of range [-9223372036854775808, 9223372036854775807]");
  // Inside arrays and maps too, with the element's path.
  EXPECT_EQ(error_of<support::ParseError>([] {
              plan_from_json_string(R"({"data": 1, "tensor": 1, "pipeline": 2, "global_batch": 8, "micro_batch": 1,
                                        "schedule": "1f1b", "layers_per_stage": [3, 1e300]})");
            }),
            "plan.layers_per_stage[1]: integer 1e+300 is out of range [-2147483648, 2147483647]");
  EXPECT_EQ(error_of<support::ParseError>([] {
              plan_from_json_string(R"({"data": 1, "tensor": 1, "pipeline": 1, "global_batch": 8, "micro_batch": 8,
                                        "schedule": "1f1b", "sharding": {"mesh": [1, 1], "axis_names": ["data", "tensor"],
                                        "placements": {}, "zero": {"w": [0.5]}}})");
            }),
            "plan.zero['w'][0]: expected an integer, got 0.5");
}

TEST(Plan, HugeDegreesAreValidationErrorsNotOverflow) {
  // Signed overflow (undefined behaviour, reported by UBSan through the fuzz target):
  // micro_batch x data in validate(), data x tensor x pipeline in world_size().
  Plan p;
  p.data = 3;
  p.micro_batch = std::int64_t{1} << 62;
  p.global_batch = 1;
  EXPECT_EQ(error_of<support::ValidationError>([&] { validate(p); }),
            "plan: global_batch 1 is not divisible by micro_batch 4611686018427387904 x data 3 (> 2^63)");
  Plan q;
  q.data = 65536;
  q.tensor = 65536;
  q.global_batch = 65536;
  const std::string expected = "plan: world size t 65536 x p 1 x d 65536 exceeds 2147483647";
  EXPECT_EQ(error_of<support::ValidationError>([&] { validate(q); }), expected);
  EXPECT_EQ(error_of<support::ValidationError>([&] { validate(q, 8); }), expected);
  EXPECT_EQ(error_of<support::ValidationError>([] {
              plan_from_json_string(R"({"data": 65536, "tensor": 65536, "pipeline": 1, "global_batch": 65536,
                                        "micro_batch": 1, "schedule": "1f1b"})");
            }),
            expected);
  q.tensor = 32768;  // 2^31 - 1 is the largest world size; 2^31 is not
  EXPECT_THROW(validate(q), support::ValidationError);
  q.tensor = 16384;
  EXPECT_NO_THROW(validate(q));
}

// A complete pipelined plan carries its stages' layout (part of the hash) and may record its
// rank programs' hash (derived: not part of it); stage_plan is what every stage runs.
// Selective recomputation reads and writes as "selective" in both places; the sharding's none
// and full stay the booleans they were, so earlier plans read, and hash, as before.
TEST(Plan, SelectiveRecomputationRoundTripsAndOlderShardingsReadAsBefore) {
  Plan p = example();
  p.recompute = Recompute::Selective;
  Sharding s;
  s.mesh = {p.data, p.tensor};
  s.axis_names = {"data", "tensor"};
  s.placements = {{"x", {"R", "R"}}};
  s.recompute = Recompute::Selective;
  p.stage_sharding = s;
  const std::string text = plan_to_json_string(p);
  EXPECT_NE(text.find(R"("recompute":"selective")"), std::string::npos) << text;
  EXPECT_EQ(plan_from_json_string(text), p);

  for (const auto& [written, read] : {std::pair{std::string("true"), Recompute::Full},
                                      std::pair{std::string("false"), Recompute::None},
                                      std::pair{std::string(R"("full")"), Recompute::Full}}) {
    nlohmann::json doc = nlohmann::json::parse(text);
    doc["stage_sharding"]["recompute"] = nlohmann::json::parse(written);
    EXPECT_EQ(plan_from_json_string(doc.dump()).stage_sharding->recompute, read) << written;
  }
  Plan full = p;
  full.stage_sharding->recompute = Recompute::Full;
  EXPECT_NE(plan_to_json_string(full).find(R"("recompute":true)"), std::string::npos);

  nlohmann::json bad = nlohmann::json::parse(text);
  bad["stage_sharding"]["recompute"] = 2;
  EXPECT_THROW(plan_from_json_string(bad.dump()), support::ParseError);
  bad["stage_sharding"]["recompute"] = "some";
  EXPECT_THROW(plan_from_json_string(bad.dump()), support::ValidationError);
  EXPECT_EQ(recompute_from_name("selective"), Recompute::Selective);
  EXPECT_EQ(recompute_name(Recompute::Selective), "selective");
}

TEST(Plan, StageShardingAndProgramsRoundTrip) {
  Plan p = example();
  p.virtual_stages = 1;
  p.schedule = Schedule::OneFOneB;
  Sharding s;
  s.mesh = {2, 2};
  s.axis_names = {"data", "tensor"};
  s.level = "fast";
  s.placements = {{"x", {"S(0)", "R"}}, {"w", {"R", "S(1)"}}};
  s.strategies = {{"y", {"split m", "split n"}}};
  s.graph = "0123456789abcdef";
  Plan complete = p;
  complete.stage_sharding = s;
  EXPECT_EQ(plan_from_json_string(plan_to_json_string(complete)), complete);
  EXPECT_NE(plan_hash(complete), plan_hash(p));
  Plan recorded = complete;
  recorded.programs = ProgramsRecord{plan_hash_hex(complete), "fedcba9876543210"};
  EXPECT_EQ(plan_from_json_string(plan_to_json_string(recorded)), recorded);
  EXPECT_EQ(plan_hash(recorded), plan_hash(complete));

  const Plan stage = stage_plan(complete);
  EXPECT_EQ(stage.pipeline, 1);
  EXPECT_EQ(stage.global_batch, p.micro_batch * p.data);
  EXPECT_EQ(stage.micro_batch, stage.global_batch);
  // The plan's own recompute decides its stages' (an edit of it reaches the run).
  Sharding recomputed = s;
  recomputed.recompute = complete.recompute;
  EXPECT_EQ(stage.sharding, recomputed);
  complete.recompute = complete.recompute == Recompute::Full ? Recompute::None : Recompute::Full;
  EXPECT_EQ(stage_plan(complete).sharding->recompute, complete.recompute);
  complete.recompute = Recompute::Selective;
  EXPECT_EQ(stage_plan(complete).sharding->recompute, Recompute::Selective);
  EXPECT_THROW(stage_plan(p), support::ValidationError);

  Plan wrong_mesh = complete;
  wrong_mesh.stage_sharding->mesh = {4, 1};
  try {
    validate(wrong_mesh);
    FAIL() << "a stage sharding on another mesh validated";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("plan.stage_sharding.mesh: [4, 1] must be [data 2, tensor 2]"),
              std::string::npos)
        << e.what();
  }
  Plan bad_hash = complete;
  bad_hash.programs = ProgramsRecord{plan_hash_hex(complete), "xyz"};
  EXPECT_THROW(validate(bad_hash), support::ValidationError);
  nlohmann::json doc = plan_to_json(complete);
  doc["stage_sharding"]["extra"] = 1;
  try {
    plan_from_json(doc);
    FAIL() << "an unknown key in stage_sharding parsed";
  } catch (const support::ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("plan.stage_sharding.extra: unknown key"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::plan
