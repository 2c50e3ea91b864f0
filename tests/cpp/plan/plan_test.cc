#include "plan/plan.h"

#include <gtest/gtest.h>

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

  Plan other = p;
  other.micro_batch = 1;
  EXPECT_NE(plan_hash(other), plan_hash(p));
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

}  // namespace
}  // namespace shardwise::plan
