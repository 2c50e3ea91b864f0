#include "support/json_text.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "support/error.h"

namespace shardwise::support {
namespace {

TEST(JsonText, ParsesWellFormedText) {
  EXPECT_EQ(parse_json(R"({"a": [1, 2]})", "test"), nlohmann::json({{"a", {1, 2}}}));
}

TEST(JsonText, MalformedTextIsAParseErrorStartingWithTheContext) {
  try {
    parse_json("{", "plan: malformed JSON");
    FAIL() << "no error";
  } catch (const ParseError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("plan: malformed JSON: [json.exception.parse_error", 0), 0) << e.what();
  }
  // A number out of a double's range is nlohmann's out_of_range, not a parse_error.
  EXPECT_THROW(parse_json("1e400", "test"), ParseError);
}

TEST(JsonText, TextThatIsNotUtf8CannotBeWritten) {
  EXPECT_EQ(dump_json(nlohmann::json{{"a", 1}}, -1, "test"), R"({"a":1})");
  try {
    dump_json(nlohmann::json("\xff"), 2, "graph");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("cannot write the graph as JSON: ", 0), 0) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::support
