// JsonMatcher on the grammar of any JSON value, checked against nlohmann::json's parser (the
// reference) on hand-picked and on mutated texts.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "structured/json_grammar.h"
#include "structured/json_matcher.h"
#include "structured_test_util.h"

namespace moeserve::structured {
namespace {

using testing::accepts;
using testing::alive_after;

const std::vector<std::string> kValid = {
    "{}", "[]", "0", "-0", "12", "-3.25", "1e5", "1E+5", "2.5e-3", "true", "false", "null", "\"\"",
    "\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"", "\"\\u00e9\\uD83D\\ude00\"",
    "\"caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80\"",
    "{\"a\":1}", "{ \"a\" : [ 1 , 2 ] , \"b\" : { } }", "[1,[2,[3,[]]],{\"x\":null}]", "\n\t {\"k\":\"v\"}",
    "{\"\":\"\"}", "[\"\x7f\"]", "{\"a\":{\"b\":{\"c\":[true,false,null,-1.5E-10]}}}",
};
const std::vector<std::string> kInvalid = {
    "", "{", "}", "{,}", "[1,]", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "01", "-", "1.", ".5", "1e", "1e+",
    "+1", "tru", "nul", "True", "\"abc", "\"\x01\"", "\"\\q\"", "\"\\u12G4\"", "\"\xC0\x80\"", "\"\xC1\xBF\"",
    "\"\xE0\x80\x80\"", "\"\xED\xA0\x80\"", "\"\xF4\x90\x80\x80\"", "\"\xF5\x80\x80\x80\"", "\"\x80\"",
    "\"\xC3\"", "{\"a\":1}}", "[1 2]", "{} ", "{}\n", "[1]]", "{'a':1}", "[1,,2]", "{\"a\" 1}", "NaN",
    "Infinity", "-Infinity", "[-]", "[01]", "1 2", "\"\\uD83D\"", "\"\\uDE00\"", "\"\\uD83Dx\"",
    "\"\\uD83D\\u0041\"",
};

// nlohmann::json's verdict on the syntax: a number too large for a double is valid JSON
// (RFC 8259 leaves the range to implementations) but nlohmann reports it as out of range.
bool reference_accepts(const std::string& text) {
  try {
    const auto parsed = nlohmann::json::parse(text);
    (void)parsed;
    return true;
  } catch (const nlohmann::json::out_of_range&) {
    return true;
  } catch (const nlohmann::json::parse_error&) {
    return false;
  }
}

// The bytes of `text` with non-printable ones as \xNN, for failure messages.
std::string printable(const std::string& text) {
  std::string out;
  for (char c : text) {
    const auto b = uint8_t(c);
    if (b >= 0x20 && b < 0x7f) out += c;
    else out += fmt::format("\\x{:02X}", b);
  }
  return out;
}

TEST(JsonMatcher, AcceptsValidTextsAsNlohmannDoes) {
  const JsonGrammar g;  // root: any value
  for (const auto& text : kValid) {
    EXPECT_TRUE(reference_accepts(text)) << "reference rejects " << text;
    EXPECT_TRUE(accepts(g, text)) << text;
    // Every prefix is alive.
    for (size_t n = 0; n <= text.size(); ++n) EXPECT_TRUE(alive_after(g, text.substr(0, n))) << text << " at " << n;
  }
}

TEST(JsonMatcher, RejectsInvalidTexts) {
  const JsonGrammar g;
  for (const auto& text : kInvalid) EXPECT_FALSE(accepts(g, text)) << text;
  // Trailing whitespace is valid JSON but the grammar ends at the value (the model stops).
  EXPECT_TRUE(nlohmann::json::accept("{} "));
}

TEST(JsonMatcher, DeadStaysDead) {
  const JsonGrammar g;
  EXPECT_FALSE(alive_after(g, "{]"));
  EXPECT_FALSE(alive_after(g, "{]}"));
  EXPECT_FALSE(alive_after(g, "[1,]]"));
}

TEST(JsonMatcher, JsonObjectGrammarTakesOnlyObjects) {
  const JsonGrammar g = any_json_object();
  EXPECT_TRUE(accepts(g, "{}"));
  EXPECT_TRUE(accepts(g, "  {\"a\": [1, {\"b\": \"c\"}]}"));
  EXPECT_FALSE(accepts(g, "[]"));
  EXPECT_FALSE(accepts(g, "\"x\""));
  EXPECT_FALSE(accepts(g, "1"));
  EXPECT_FALSE(alive_after(g, "n"));
  EXPECT_FALSE(alive_after(g, "{\"a\":1}{"));
}

TEST(JsonMatcher, NumbersEndWithTheTextOrTheirContainer) {
  const JsonGrammar g;
  JsonMatcher m(g);
  MatchState s = m.start();
  ASSERT_TRUE(m.feed_all(s, "12"));
  EXPECT_TRUE(m.can_end(s));
  ASSERT_TRUE(m.feed_all(s, "."));
  EXPECT_FALSE(m.can_end(s));
  ASSERT_TRUE(m.feed_all(s, "5"));
  EXPECT_TRUE(m.can_end(s));
  MatchState inner = m.start();
  ASSERT_TRUE(m.feed_all(inner, "[12"));
  EXPECT_FALSE(m.can_end(inner));
}

TEST(JsonMatcher, WhitespaceGapsAreCapped) {
  const JsonGrammar g;
  const std::string ok(kMaxWhitespace, ' ');
  EXPECT_TRUE(accepts(g, "[" + ok + "1" + ok + "," + ok + "2" + ok + "]"));
  EXPECT_TRUE(accepts(g, ok + "{" + ok + "\"a\"" + ok + ":" + ok + "1" + ok + "}"));
  EXPECT_FALSE(alive_after(g, "[" + ok + " "));
  EXPECT_FALSE(alive_after(g, "{\"a\"" + ok + " "));
}

TEST(JsonMatcher, NoWhitespaceMeansCompactJson) {
  JsonGrammar g = any_json_object();
  g.max_whitespace = 0;
  EXPECT_TRUE(accepts(g, R"({"a":[1,2],"b":{"c":"x y"}})"));  // spaces inside strings are text
  EXPECT_FALSE(alive_after(g, " "));
  EXPECT_FALSE(alive_after(g, "{ "));
  EXPECT_FALSE(alive_after(g, R"({"a" )"));
  EXPECT_FALSE(alive_after(g, R"({"a": )"));
  EXPECT_FALSE(alive_after(g, R"({"a":[1, )"));
}

TEST(JsonMatcher, NestingIsCappedAtMaxNesting) {
  const JsonGrammar g;
  const std::string deep = std::string(kMaxNesting, '[') + std::string(kMaxNesting, ']');
  EXPECT_TRUE(accepts(g, deep));
  EXPECT_FALSE(alive_after(g, std::string(kMaxNesting + 1, '[')));
  // At the limit the innermost array still takes non-container values.
  EXPECT_TRUE(accepts(g, std::string(kMaxNesting, '[') + "1,\"x\"" + std::string(kMaxNesting, ']')));
  std::string objects;
  for (int i = 0; i < kMaxNesting; ++i) objects += "{\"a\":";
  EXPECT_TRUE(accepts(g, objects + "1" + std::string(kMaxNesting, '}')));
  EXPECT_FALSE(alive_after(g, objects + "{"));
}

TEST(JsonMatcher, EqualStatesHaveEqualKeys) {
  const JsonGrammar g;
  JsonMatcher m(g);
  MatchState a = m.start(), b = m.start();
  ASSERT_TRUE(m.feed_all(a, "{\"key\": \"some text"));
  ASSERT_TRUE(m.feed_all(b, "{\"key\": \"other"));
  EXPECT_EQ(a.key(), b.key());  // inside a plain string the characters read do not matter
  ASSERT_TRUE(m.feed_all(b, "\""));
  EXPECT_NE(a.key(), b.key());
}

TEST(JsonMatcher, LongArraysRepeatTheirState) {
  const JsonGrammar g;
  JsonMatcher m(g);
  MatchState a = m.start(), b = m.start();
  ASSERT_TRUE(m.feed_all(a, "[1,"));
  ASSERT_TRUE(m.feed_all(b, "[1,2,3,4,"));
  EXPECT_EQ(a.key(), b.key());  // no item limit: the count does not matter
}

// Mutations of valid texts (a byte inserted, deleted or replaced, from JSON's alphabet and
// beyond): the matcher takes a whole text exactly when nlohmann::json does, except texts the
// grammar deliberately refuses (trailing whitespace, long whitespace gaps, deep nesting).
TEST(JsonMatcher, AgreesWithNlohmannOnMutatedTexts) {
  const JsonGrammar g;
  std::mt19937 rng(1234);
  const std::string alphabet =
      "{}[]:,\"\\ \n\t0123456789-+.eEtrufalsn/bu\x01\x7f\xC3\xA9\xE6\x97\xF0\x9F\x98\x80\xED\xC0";
  int compared = 0, accepted = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string text = kValid[rng() % kValid.size()];
    const int edits = 1 + int(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = text.empty() ? 0 : rng() % (text.size() + 1);
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: text.insert(text.begin() + long(pos), c); break;
        case 1: if (pos < text.size()) text.erase(pos, 1); break;
        default: if (pos < text.size()) text[pos] = c; break;
      }
    }
    if (!text.empty() && std::string(" \n\t\r").find(text.back()) != std::string::npos) continue;
    const bool reference = reference_accepts(text);
    EXPECT_EQ(accepts(g, text), reference) << "text: " << printable(text);
    ++compared;
    accepted += reference;
  }
  EXPECT_GT(compared, 15000);
  EXPECT_GT(accepted, 1000);  // the mutations keep a fair share valid
}

// Texts drawn byte by byte from the matcher parse, and no state on the way is a dead end.
TEST(JsonMatcher, RandomTextsParseAndNeverDeadEnd) {
  std::mt19937 rng(7);
  for (const JsonGrammar& g : {JsonGrammar(), any_json_object()}) {
    for (int i = 0; i < 300; ++i) {
      std::string text;
      ASSERT_TRUE(testing::random_text(g, rng, 40, text)) << "dead end after: " << text;
      EXPECT_TRUE(reference_accepts(text)) << text;
    }
  }
}

}  // namespace
}  // namespace moeserve::structured
