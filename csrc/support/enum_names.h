// Names of an enum's values in one constexpr table that both directions read: naming a
// value, parsing a name back, and listing the known names for an error message. It stands
// in for a switch returning string literals beside a loop that parses them, which had to be
// kept in step by hand.
//
//   enum class Color { Red, Green };
//   constexpr auto kColorNames = support::enum_names<Color>({{Color::Red, "red"}, {Color::Green, "green"}});
//   kColorNames.name(Color::Green);     // "green";  find(Color::Green): the same, as an optional
//   kColorNames.parse("red");           // Color::Red;  parse("blue"): std::nullopt
//   kColorNames.known();                // "red, green"
//
// The table is searched linearly: these enums have a handful of values.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace shardwise::support {

template <typename E>
struct EnumName {
  E value;
  std::string_view name;
};

template <typename E, std::size_t N>
class EnumNames {
 public:
  constexpr explicit EnumNames(const std::array<EnumName<E>, N>& entries) : entries_(entries) {}

  // `value`'s name, or nullopt for a value the table lacks (an out-of-range cast).
  constexpr std::optional<std::string_view> find(E value) const {
    for (const EnumName<E>& entry : entries_)
      if (entry.value == value) return entry.name;
    return std::nullopt;
  }

  // `value`'s name; `missing` for a value the table lacks.
  constexpr std::string_view name(E value, std::string_view missing = "?") const {
    return find(value).value_or(missing);
  }

  // The value named exactly `text` (case-sensitive), or nullopt.
  constexpr std::optional<E> parse(std::string_view text) const {
    for (const EnumName<E>& entry : entries_)
      if (entry.name == text) return entry.value;
    return std::nullopt;
  }

  // The names in table order, joined by `separator`: "a, b, c".
  std::string known(std::string_view separator = ", ") const {
    std::string out;
    for (std::size_t i = 0; i < N; ++i) {
      if (i > 0) out += separator;
      out += entries_[i].name;
    }
    return out;
  }

  constexpr const std::array<EnumName<E>, N>& entries() const { return entries_; }

 private:
  std::array<EnumName<E>, N> entries_;
};

// Builds the table from a braced list, deducing its size: enum_names<E>({{E::A, "a"}, ...}).
template <typename E, std::size_t N>
constexpr EnumNames<E, N> enum_names(const EnumName<E> (&entries)[N]) {
  return EnumNames<E, N>(std::to_array(entries));
}

}  // namespace shardwise::support
