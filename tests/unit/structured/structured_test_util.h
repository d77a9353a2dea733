// Helpers of the structured-output tests.
#pragma once
#include <algorithm>
#include <cctype>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "structured/json_matcher.h"

namespace moeserve::structured::testing {

// Whether `text` is a whole text of the grammar.
inline bool accepts(const JsonGrammar& g, std::string_view text) {
  JsonMatcher m(g);
  MatchState state = m.start();
  return m.feed_all(state, text) && m.can_end(state);
}

// Whether `text` is a prefix of some text of the grammar (the matcher is still alive).
inline bool alive_after(const JsonGrammar& g, std::string_view text) {
  JsonMatcher m(g);
  MatchState state = m.start();
  return m.feed_all(state, text);
}

// A text of the grammar, drawn byte by byte: at each step a random byte among those the
// matcher takes (favouring the end once `soft_length` bytes are out; numbers kept short). Checks as it goes that
// no state is a dead end: each one takes some byte or may end. Returns false on a dead end.
inline bool random_text(const JsonGrammar& g, std::mt19937& rng, size_t soft_length, std::string& text) {
  JsonMatcher m(g);
  MatchState state = m.start(), next;
  text.clear();
  for (size_t step = 0; step < 20 * soft_length + 2000; ++step) {
    std::vector<uint8_t> bytes;
    for (int b = 0; b < 256; ++b) {
      m.feed(state, uint8_t(b), next);
      if (!next.dead()) bytes.push_back(uint8_t(b));
    }
    const bool may_end = m.can_end(state);
    if (bytes.empty()) return may_end;
    if (may_end && (text.size() >= soft_length || rng() % 8 == 0)) return true;
    // Past the soft length, prefer bytes that close things: '}', ']', '"', digits.
    // Keep numbers short (parsers refuse doubles that overflow): after two digits in a row,
    // another digit only when nothing else fits.
    const size_t n = text.size();
    if (n >= 2 && std::isdigit(uint8_t(text[n - 1])) && std::isdigit(uint8_t(text[n - 2]))) {
      std::vector<uint8_t> others;
      for (uint8_t c : bytes)
        if (!std::isdigit(c)) others.push_back(c);
      if (!others.empty()) bytes.swap(others);
    }
    uint8_t b = bytes[rng() % bytes.size()];
    if (text.size() >= soft_length) {
      for (uint8_t c : {uint8_t('}'), uint8_t(']'), uint8_t('"'), uint8_t('0'), uint8_t('e'), uint8_t('l')})
        if (std::find(bytes.begin(), bytes.end(), c) != bytes.end() && rng() % 2 == 0) {
          b = c;
          break;
        }
    }
    m.feed(state, b, next);
    std::swap(state, next);
    text.push_back(char(b));
  }
  return false;  // did not end: treat as a failure of the test's own loop
}

}  // namespace moeserve::structured::testing
