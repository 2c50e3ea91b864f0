#include "search/placement.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/error.h"

namespace shardwise::search {
namespace {

Placement uneven(int dim, std::vector<double> ratios, std::int64_t groups = 1) {
  Placement p = Placement::shard(dim, groups);
  p.ratios = std::move(ratios);
  return p;
}

TEST(PlacementTest, Factories) {
  EXPECT_TRUE(Placement::replicate().is_replicate());
  const auto s = Placement::shard(1, 3);
  EXPECT_TRUE(s.is_shard());
  EXPECT_EQ(s.dim, 1);
  EXPECT_EQ(s.groups, 3);
  EXPECT_TRUE(s.ratios.empty());
  const auto p = Placement::partial(ops::Reduction::Mean);
  EXPECT_TRUE(p.is_partial());
  EXPECT_EQ(p.reduction, ops::Reduction::Mean);
  EXPECT_EQ(Placement::partial().reduction, ops::Reduction::Sum);
}

TEST(PlacementTest, StrForms) {
  EXPECT_EQ(Placement::replicate().str(), "R");
  EXPECT_EQ(Placement::shard(1).str(), "S(1)");
  EXPECT_EQ(Placement::shard(2, 3).str(), "S(2,g3)");
  EXPECT_EQ(uneven(0, {0.6, 0.4}).str(), "S(0)[0.6,0.4]");
  EXPECT_EQ(uneven(2, {0.5, 0.5}, 3).str(), "S(2,g3)[0.5,0.5]");
  EXPECT_EQ(Placement::partial().str(), "P(sum)");
  EXPECT_EQ(Placement::partial(ops::Reduction::Mean).str(), "P(mean)");
  EXPECT_EQ(Placement::partial(ops::Reduction::Max).str(), "P(max)");
  EXPECT_EQ(Placement::partial(ops::Reduction::Min).str(), "P(min)");
}

TEST(PlacementTest, WorkedExample) {
  Placement p = Placement::shard(1, 3);
  EXPECT_EQ(p.str(), "S(1,g3)");
  EXPECT_EQ(parse_placement("S(1,g3)"), p);
  EXPECT_EQ(spec_str({Placement::shard(0), Placement::replicate()}), "[S(0), R]");
}

TEST(PlacementTest, RoundTripsExactly) {
  // Ratios that {:g} would round: 0.1 + 0.2 is 0.30000000000000004.
  const double third = 1.0 / 3.0;
  const std::vector<Placement> all = {
      Placement::replicate(),
      Placement::shard(0),
      Placement::shard(7),
      Placement::shard(2, 3),
      Placement::shard(1, 1024),
      uneven(0, {0.6, 0.4}),
      uneven(0, {third, third, 1.0 - 2 * third}),
      uneven(1, {0.1 + 0.2, 1.0 - (0.1 + 0.2)}),
      uneven(0, {1e-5, 1.0 - 1e-5}),
      uneven(3, {0.25, 0.25, 0.25, 0.25}, 6),
      uneven(0, {1.0}),
      Placement::partial(ops::Reduction::Sum),
      Placement::partial(ops::Reduction::Mean),
      Placement::partial(ops::Reduction::Max),
      Placement::partial(ops::Reduction::Min),
  };
  for (const auto& p : all) {
    const auto text = p.str();
    EXPECT_EQ(parse_placement(text), p) << text;
    EXPECT_EQ(parse_placement(text).str(), text);
  }
  EXPECT_EQ(uneven(1, {0.1 + 0.2, 1.0 - (0.1 + 0.2)}).str(), "S(1)[0.30000000000000004,0.7]");
}

TEST(PlacementTest, ParseToleratesSurroundingWhitespace) {
  EXPECT_EQ(parse_placement("  S(0) "), Placement::shard(0));
  EXPECT_EQ(parse_placement("R\n"), Placement::replicate());
}

TEST(PlacementTest, ParseErrorsQuoteTheText) {
  for (std::string bad : {
           "",                // empty
           "X",               // unknown letter
           "r",               // lowercase
           "RR",              // trailing junk
           "S",               // no parenthesis
           "S(",              // unclosed
           "S(1",             // unclosed
           "S()",             // no dim
           "S(a)",            // not an integer
           "S(-1)",           // negative dim
           "S(1,3)",          // groups without g
           "S(1,g)",          // groups missing
           "S(1,g0)",         // groups < 1
           "S(1,g-2)",        // groups < 1
           "S(1,gx)",         // groups not an integer
           "S(1)x",           // junk after the shard
           "S(1)[",           // unclosed ratios
           "S(1)[]",          // empty ratios
           "S(0)[0.6,0.5]",   // sum 1.1
           "S(0)[0.5]",       // sum 0.5
           "S(0)[1.5,-0.5]",  // negative ratio
           "S(0)[0,1]",       // zero ratio
           "S(0)[0.5,,0.5]",  // empty ratio
           "S(0)[0.5,abc]",   // not a number
           "S(0)[nan,1]",     // not positive
           "P",               // no parenthesis
           "P(",              // unclosed
           "P(sum",           // unclosed
           "P()",             // no reduction
           "P(avg)",          // unknown reduction
           "P(Sum)",          // names are lowercase
       }) {
    try {
      parse_placement(bad);
      ADD_FAILURE() << "expected a ParseError for '" << bad << "'";
    } catch (const support::ParseError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(PlacementTest, ParseAcceptsRatiosWithinTolerance) {
  EXPECT_NO_THROW(parse_placement("S(0)[0.5,0.5000000000001]"));
  EXPECT_THROW(parse_placement("S(0)[0.5,0.50001]"), support::ParseError);
}

TEST(PlacementTest, SpecStr) {
  EXPECT_EQ(spec_str({}), "[]");
  EXPECT_EQ(spec_str({Placement::partial()}), "[P(sum)]");
  EXPECT_EQ(spec_str({Placement::shard(0), Placement::shard(2, 3), Placement::partial(ops::Reduction::Mean)}),
            "[S(0), S(2,g3), P(mean)]");
}

TEST(PlacementTest, GradientPlacement) {
  EXPECT_EQ(gradient_placement(Placement::partial()), Placement::replicate());
  EXPECT_EQ(gradient_placement(Placement::partial(ops::Reduction::Mean)), Placement::replicate());
  EXPECT_EQ(gradient_placement(Placement::replicate()), Placement::replicate());
  EXPECT_EQ(gradient_placement(Placement::shard(1, 3)), Placement::shard(1, 3));
  EXPECT_EQ(gradient_placement(uneven(0, {0.6, 0.4})), uneven(0, {0.6, 0.4}));
}

TEST(PlacementTest, HeldFraction) {
  EXPECT_DOUBLE_EQ(held_fraction(Placement::replicate(), 8), 1.0);
  EXPECT_DOUBLE_EQ(held_fraction(Placement::partial(), 8), 1.0);
  EXPECT_DOUBLE_EQ(held_fraction(Placement::shard(0), 8), 0.125);
  EXPECT_DOUBLE_EQ(held_fraction(Placement::shard(1, 3), 4), 0.25);
  EXPECT_DOUBLE_EQ(held_fraction(Placement::shard(0), 1), 1.0);
  EXPECT_DOUBLE_EQ(held_fraction(uneven(0, {0.4, 0.6}), 2), 0.6);
  EXPECT_DOUBLE_EQ(held_fraction(uneven(0, {0.5, 0.2, 0.3}), 3), 0.5);
  EXPECT_THROW(held_fraction(Placement::shard(0), 0), support::ValidationError);
}

}  // namespace
}  // namespace shardwise::search
