// Fuzzes the profile reader (cost/profiled_cost.h): any input ends in a Profile or a
// support::ParseError / support::ValidationError. A Profile it reads is valid, writes
// back to JSON that reads back to an equal Profile, and builds a ProfiledCostModel.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cost/profiled_cost.h"
#include "fuzz_check.h"
#include "support/error.h"

namespace cost = shardwise::cost;
namespace support = shardwise::support;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  cost::Profile p;
  try {
    p = cost::profile_from_json_string(text);
  } catch (const support::ParseError&) {
    return 0;
  } catch (const support::ValidationError&) {
    return 0;
  }
  using shardwise::fuzz::must;
  const std::string json = must("profile_to_json_string", [&] { return cost::profile_to_json_string(p); });
  const cost::Profile back = must("profile_from_json_string(profile_to_json_string(p))",
                                  [&] { return cost::profile_from_json_string(json); });
  FUZZ_CHECK(back == p, json);
  FUZZ_CHECK(cost::profile_to_json_string(back) == json, json);
  must("ProfiledCostModel(profile)", [&] { cost::ProfiledCostModel model(p); });
  return 0;
}
