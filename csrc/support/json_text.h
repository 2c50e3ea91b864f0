// JSON text in and out with the core's errors: nlohmann's exceptions never leave the core.
// Reading: not only parse_error, a number too large for a double ("1e400") is an
// out_of_range (406), which once escaped as a nlohmann exception (found by fuzzing), so every
// json::exception becomes a ParseError. Writing: dump() throws on a string that is not UTF-8.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "support/error.h"

namespace shardwise::support {

// read(), with a json::exception it throws turned into a ParseError "<context>: <message>":
// the readers of JSON documents check types before they read, so this is their safety net.
template <typename Read>
auto with_json_parse_errors(std::string_view context, Read&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const nlohmann::json::exception& e) {
    throw ParseError(std::string(context) + ": " + e.what());
  }
}

// `text` parsed; malformed JSON is a ParseError "<context>: <nlohmann's message>", as
// parse_json(text, "plan: malformed JSON").
nlohmann::json parse_json(std::string_view text, std::string_view context);

// json.dump(indent); a value it cannot write is an Error "cannot write the <what> as JSON: ...".
std::string dump_json(const nlohmann::json& json, int indent, std::string_view what);

}  // namespace shardwise::support
