#include "ir/attribute.h"

#include <fmt/format.h>

#include <cmath>
#include <type_traits>

namespace shardwise::ir {
namespace {

// Shortest round-trip form, with a '.0' added where fmt would print an integer,
// so the parser reads a double back as a double.
std::string double_str(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (std::isnan(v)) return "nan";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

// JSON-style quoting: the parser reads the same escapes back.
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default: out += c;
    }
  }
  return out + "\"";
}

}  // namespace

std::string attr_str(const AttrValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, NoneAttr>) {
          return "none";
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::int64_t>) {
          return fmt::format("{}", v);
        } else if constexpr (std::is_same_v<T, double>) {
          return double_str(v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          return quote(v);
        } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
          return fmt::format("[{}]", fmt::join(v, ","));
        } else {
          std::string out = "[";
          for (std::size_t i = 0; i < v.size(); ++i) {
            if (i) out += ',';
            out += double_str(v[i]);
          }
          return out + "]";
        }
      },
      value);
}

}  // namespace shardwise::ir
