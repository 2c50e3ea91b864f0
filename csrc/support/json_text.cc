#include "support/json_text.h"

#include <fmt/format.h>

namespace shardwise::support {

nlohmann::json parse_json(std::string_view text, std::string_view context) {
  return with_json_parse_errors(context, [&] { return nlohmann::json::parse(text.begin(), text.end()); });
}

std::string dump_json(const nlohmann::json& json, int indent, std::string_view what) {
  try {
    return json.dump(indent);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("cannot write the {} as JSON: {}", what, e.what()));
  }
}

}  // namespace shardwise::support
