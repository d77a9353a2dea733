#include <gtest/gtest.h>

#include "server/stop_matcher.h"

using moeserve::server::StopStringMatcher;

namespace {
// Feeds pieces and returns everything released plus whether a stop fired.
std::pair<std::string, bool> run(StopStringMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) {
    auto r = m.feed(p);
    out += r.text;
    if (r.stopped) return {out, true};
  }
  out += m.flush();
  return {out, false};
}
}  // namespace

TEST(StopMatcher, PassesTextThroughWithoutStops) {
  StopStringMatcher m({});
  EXPECT_EQ(run(m, {"a", "b"}), std::make_pair(std::string("ab"), false));
}

TEST(StopMatcher, StopInsideOnePiece) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(run(m, {"hello END world"}), std::make_pair(std::string("hello "), true));
}

TEST(StopMatcher, StopAcrossPiecesIsHeldBackThenCut) {
  StopStringMatcher m({"\n\nUser:"});
  auto r1 = m.feed("answer\n");
  EXPECT_EQ(r1.text, "answer");  // "\n" may start the stop string
  auto r2 = m.feed("\nUs");
  EXPECT_EQ(r2.text, "");
  auto r3 = m.feed("er: hi");
  EXPECT_EQ(r3.text, "");
  ASSERT_TRUE(r3.stopped);
  EXPECT_EQ(*r3.stopped, "\n\nUser:");
  EXPECT_TRUE(m.feed("more").text.empty());
}

TEST(StopMatcher, FalseStartIsReleased) {
  StopStringMatcher m({"stop"});
  EXPECT_EQ(m.feed("st").text, "");
  EXPECT_EQ(m.feed("ar").text, "star");
  EXPECT_EQ(m.feed("s").text, "");
  EXPECT_EQ(m.flush(), "s");
}

TEST(StopMatcher, EarliestMatchWinsAndIncludeStop) {
  StopStringMatcher m({"cd", "bc"}, /*include_stop=*/true);
  auto r = m.feed("abcd");
  EXPECT_EQ(r.text, "abc");
  EXPECT_EQ(*r.stopped, "bc");
}

TEST(StopMatcher, MultibyteStop) {
  StopStringMatcher m({"。"});
  EXPECT_EQ(run(m, {"你好", "。再见"}), std::make_pair(std::string("你好"), true));
}
