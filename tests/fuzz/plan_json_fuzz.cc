// Fuzzes the plan reader (plan/plan.h): any input ends in a Plan or a
// support::ParseError / support::ValidationError. A Plan it reads is valid, writes back
// to JSON that reads back to an equal Plan with the same hash, and answers what its
// users ask of it (num_micro_batches, validate against a world size) without UB.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "plan/plan.h"
#include "support/error.h"

namespace plan = shardwise::plan;
namespace support = shardwise::support;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  plan::Plan p;
  try {
    p = plan::plan_from_json_string(text);
  } catch (const support::ParseError&) {
    return 0;
  } catch (const support::ValidationError&) {
    return 0;
  }
  using shardwise::fuzz::must;
  must("validate(plan)", [&] { plan::validate(p); });
  const std::string json = must("plan_to_json_string", [&] { return plan::plan_to_json_string(p); });
  const plan::Plan back = must("plan_from_json_string(plan_to_json_string(p))",
                               [&] { return plan::plan_from_json_string(json); });
  FUZZ_CHECK(back == p, json);
  FUZZ_CHECK(plan::plan_hash(back) == plan::plan_hash(p), json);
  FUZZ_CHECK(plan::plan_to_json_string(back) == json, json);
  (void)p.num_micro_batches();
  for (int world : {1, 8, 1 << 20}) {
    try {
      plan::validate(p, world);
    } catch (const support::ValidationError&) {
    }
  }
  return 0;
}
