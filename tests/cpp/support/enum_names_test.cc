#include "support/enum_names.h"

#include <gtest/gtest.h>

#include <optional>
#include <string_view>

namespace shardwise::support {
namespace {

enum class Fruit { Apple, Pear, Plum };

constexpr auto kFruitNames = enum_names<Fruit>({{Fruit::Apple, "apple"}, {Fruit::Pear, "pear"}, {Fruit::Plum, "plum"}});

// The table is usable at compile time, as the callers' constexpr tables need.
static_assert(kFruitNames.name(Fruit::Pear) == "pear");
static_assert(kFruitNames.parse("plum") == Fruit::Plum);
static_assert(kFruitNames.entries().size() == 3);

TEST(EnumNames, NamesAndParsesEachValueBack) {
  for (const auto& entry : kFruitNames.entries()) {
    EXPECT_EQ(kFruitNames.name(entry.value), entry.name);
    EXPECT_EQ(kFruitNames.parse(entry.name), entry.value);
  }
}

TEST(EnumNames, AnUnknownNameParsesToNothing) {
  EXPECT_EQ(kFruitNames.parse("Apple"), std::nullopt);  // case-sensitive
  EXPECT_EQ(kFruitNames.parse(""), std::nullopt);
}

TEST(EnumNames, AValueOutsideTheTableGetsTheMissingName) {
  const auto stray = static_cast<Fruit>(7);
  EXPECT_EQ(kFruitNames.name(stray), "?");
  EXPECT_EQ(kFruitNames.name(stray, ""), "");
  EXPECT_EQ(kFruitNames.find(stray), std::nullopt);
  EXPECT_EQ(kFruitNames.find(Fruit::Apple), "apple");
}

TEST(EnumNames, KnownListsTheNamesInTableOrder) {
  EXPECT_EQ(kFruitNames.known(), "apple, pear, plum");
  EXPECT_EQ(kFruitNames.known("|"), "apple|pear|plum");
}

}  // namespace
}  // namespace shardwise::support
