// Node attributes: the non-tensor arguments of an op, keyed by the argument's name
// in the op's schema (e.g. aten::softmax.int has {dim=-1}). Ordered map so printing
// and hashing are deterministic.
//
// Text form: {dim=-1, keepdim=true, approximate="tanh", size=[2,8,12,64], scale=0.125, dtype=none}
// A double always prints with a '.' or exponent so it parses back as a double.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace shardwise::ir {

struct NoneAttr {
  friend bool operator==(NoneAttr, NoneAttr) { return true; }
};

using AttrValue = std::variant<NoneAttr, bool, std::int64_t, double, std::string,
                               std::vector<std::int64_t>, std::vector<double>>;

using Attributes = std::map<std::string, AttrValue, std::less<>>;

std::string attr_str(const AttrValue& value);  // text form of one value

}  // namespace shardwise::ir
