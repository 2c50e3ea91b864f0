// Fuzzes the cluster reader (cost/cluster.h): any input ends in a Cluster or a
// support::ParseError / support::ValidationError. A Cluster it reads writes back to JSON
// that reads back to an equal Cluster, and answers rank and link queries and summary().
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cost/cluster.h"
#include "fuzz_check.h"
#include "support/error.h"

namespace cost = shardwise::cost;
namespace support = shardwise::support;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::optional<cost::Cluster> parsed;
  try {
    parsed.emplace(cost::cluster_from_json_string(text));
  } catch (const support::ParseError&) {
    return 0;
  } catch (const support::ValidationError&) {
    return 0;
  }
  using shardwise::fuzz::must;
  const cost::Cluster& c = *parsed;
  const std::string json = must("cluster_to_json_string", [&] { return cost::cluster_to_json_string(c); });
  const cost::Cluster back = must("cluster_from_json_string(cluster_to_json_string(c))",
                                  [&] { return cost::cluster_from_json_string(json); });
  FUZZ_CHECK(back == c, json);
  FUZZ_CHECK(cost::cluster_to_json_string(back) == json, json);
  (void)must("summary", [&] { return c.summary(); });
  // Queries over a few ranks (the tables are world-size vectors: bounded, not walked).
  const int world = c.world_size();
  FUZZ_CHECK(world >= 1, json);
  std::vector<int> all;
  for (int r = 0; r < std::min(world, 64); ++r) {
    all.push_back(r);
    (void)must("device_of / node_of / local_rank", [&] {
      return c.device_of(r).name.size() + static_cast<std::size_t>(c.node_of(r) + c.local_rank(r));
    });
  }
  const cost::GroupSpan span = must("span_of", [&] { return c.span_of(all); });
  (void)must("link_speed", [&] { return c.link_speed(span.level, all); });
  return 0;
}
