// RegexDfa against PCRE2 (the reference): full matches and searches of random texts agree,
// for patterns of every supported construct; unsupported ones are refused by name.
#include <gtest/gtest.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "structured/json_grammar.h"
#include "structured/regex_dfa.h"

namespace moeserve::structured {
namespace {

// PCRE2 without UCP has ASCII \d \w \s and `.` that stops only at \n; with DOLLAR_ENDONLY `$`
// matches only at the very end, and with ALT_BSUX \u and \x read as in ECMAScript. That is
// RegexDfa on texts without \r, \v, \f and non-ASCII white space, which the texts below avoid.
class Pcre2 {
 public:
  Pcre2(const std::string& pattern, bool full) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    uint32_t options = PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | PCRE2_ALT_BSUX | (full ? PCRE2_ANCHORED | PCRE2_ENDANCHORED : 0);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err, &offset, nullptr);
    EXPECT_NE(code_, nullptr) << "PCRE2 refused " << pattern;
    data_ = code_ ? pcre2_match_data_create_from_pattern(code_, nullptr) : nullptr;
  }
  ~Pcre2() {
    pcre2_match_data_free(data_);
    pcre2_code_free(code_);
  }
  bool matches(const std::string& text) const {
    return pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0, data_, nullptr) >= 0;
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* data_ = nullptr;
};

const std::vector<std::string> kPatterns = {
    "abc", "a|b|cd", "a*", "(ab)+c?", "a{2}", "a{1,3}b", "x{2,}", "[a-c]+", "[^a-c]{1,2}", "\\d+(\\.\\d{1,2})?",
    "^\\w+$", "^[A-Z][a-z]*( [A-Z][a-z]*)*$", "\\s*-\\s*", ".+", "^.{2,3}$", "(?:ab|ba)*", "(?<year>\\d{4})-\\d{2}",
    "[\\d_]+", "\\S\\S", "caf\xC3\xA9", "[\xC3\xA9\xE6\x97\xA5]+", "^[^\\n]*$", "\\x61\\u0062", "a.c", "[-a]+", "[a-]+",
    "\\.\\*\\+", "^(a|ab)(c|bcd)$", "(a*)*b", "\\W+",
};

TEST(RegexDfa, AgreesWithPcre2OnRandomTexts) {
  std::mt19937 rng(11);
  const std::vector<std::string> alphabet = {"a", "b", "c", "d", "x", "A", "Z", "0", "1", "9", "_", "-", ".", " ",
                                             "\n", "*", "+", "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x98\x80"};
  for (const auto& pattern : kPatterns) {
    SCOPED_TRACE(pattern);
    for (const auto match : {RegexDfa::Match::Full, RegexDfa::Match::Search}) {
      const bool full = match == RegexDfa::Match::Full;
      const RegexDfa dfa = RegexDfa::compile(pattern, match, RegexDfa::all_bytes());
      const Pcre2 reference(pattern, full);
      int agreed = 0, matched = 0;
      for (int i = 0; i < 3000; ++i) {
        std::string text;
        const int len = int(rng() % 7);
        for (int k = 0; k < len; ++k) text += alphabet[rng() % alphabet.size()];
        const bool expected = reference.matches(text);
        ASSERT_EQ(dfa.matches(text), expected) << (full ? "full" : "search") << " of \"" << text << "\"";
        ++agreed;
        matched += expected;
      }
      EXPECT_EQ(agreed, 3000);
    }
  }
}

TEST(RegexDfa, OnlyValidUtf8GetsThrough) {
  const RegexDfa any = RegexDfa::compile(".*", RegexDfa::Match::Full, RegexDfa::all_bytes());
  EXPECT_TRUE(any.matches("\xC3\xA9\xF0\x9F\x98\x80"));
  EXPECT_FALSE(any.matches("\xC3"));
  EXPECT_FALSE(any.matches("\xED\xA0\x80"));  // a surrogate
  EXPECT_FALSE(any.matches("\xC0\x80"));      // overlong
  EXPECT_FALSE(any.matches("\n"));
}

TEST(RegexDfa, DropsStatesThatCannotFinish) {
  // Inside a JSON string a raw \x01 cannot be written (there is no short escape for it).
  const RegexDfa dfa = RegexDfa::compile("a(\\x01|b)", RegexDfa::Match::Full, json_string_bytes());
  EXPECT_TRUE(dfa.matches("ab"));
  EXPECT_EQ(dfa.next(dfa.next(dfa.start(), 'a'), 0x01), RegexDfa::kDead);
  EXPECT_THROW(RegexDfa::compile("\\x01", RegexDfa::Match::Full, json_string_bytes()), Error);
}

TEST(RegexDfa, RefusesWhatItDoesNotSupport) {
  const std::vector<std::pair<const char*, const char*>> refused = {
      {"(a)\\1", "backreferences"}, {"a(?=b)", "lookahead"}, {"(?<!a)b", "lookahead and lookbehind"},
      {"\\bword", "word boundaries"}, {"a^b", "only at the very start"}, {"a$b", "only at the very start / end"},
      {"*a", "nothing to repeat"}, {"(ab", "an unclosed group"}, {"[ab", "an unterminated class"},
      {"\\p{L}", "Unicode property"}, {"a{3,1}", "m < n"}, {"[z-a]", "out of order"}, {"a)", "unexpected `)`"},
  };
  for (const auto& [pattern, message] : refused) {
    try {
      RegexDfa::compile(pattern, RegexDfa::Match::Full, RegexDfa::all_bytes());
      ADD_FAILURE() << "accepted " << pattern;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << pattern << " -> " << e.what();
    }
  }
  EXPECT_THROW(RegexDfa::compile("(a|b|c|d|e|f|g|h)*a.{20}", RegexDfa::Match::Full, RegexDfa::all_bytes()), Error);
}

}  // namespace
}  // namespace moeserve::structured
