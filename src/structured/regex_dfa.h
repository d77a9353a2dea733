// Regular expressions as byte-level DFAs, for JSON Schema `pattern` (inside a JSON string)
// and vLLM's structured_outputs.regex (the whole answer).
//
// Syntax (the ECMAScript subset JSON Schema patterns use): literals, `.`, classes `[a-z]`,
// `[^...]`, escapes `\d \D \w \W \s \S \t \n \r \f \v \0 \xHH \uHHHH` and escaped
// metacharacters, groups `(...)`, `(?:...)`, `(?<name>...)`, alternation `|`, quantifiers
// `* + ? {n} {n,} {n,m}` (lazy forms match the same texts), `^` at the very start and `$` at
// the very end. Backreferences, lookaround, word boundaries and flags are refused.
// Semantics: `.` is any character but \n, \r, U+2028, U+2029; \d \w are ASCII; \s is
// ECMAScript's white space and line terminators. A pattern is searched (JSON Schema: it may
// match anywhere unless anchored); a full-match regex must match the whole text.
//
// Characters are Unicode scalar values, matched as their UTF-8 bytes: the automaton runs on
// bytes, and only valid UTF-8 gets through it. States from which no accepted text can be
// reached, using only the bytes the caller can produce, are dropped, so a live state always
// has a way to finish.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::structured {

class RegexDfa {
 public:
  static constexpr uint32_t kDead = 0xffffffffu;
  static constexpr size_t kMaxStates = 4096;

  enum class Match { Search, Full };
  // Throws moeserve::Error naming what in `pattern` is not supported (or too large: more than
  // kMaxStates states). `producible[b]`: whether byte b can be written where the text goes
  // (inside a JSON string, not every control byte can).
  static RegexDfa compile(std::string_view pattern, Match match, const std::array<bool, 256>& producible);
  static std::array<bool, 256> all_bytes();
  // Exactly the byte strings `texts` (a trie; every state can finish).
  static RegexDfa from_literals(const std::vector<std::string>& texts);

  uint32_t start() const { return 0; }
  uint32_t next(uint32_t state, uint8_t byte) const { return table_[size_t(state) * 256 + byte]; }
  bool accepting(uint32_t state) const { return accepting_[state]; }
  size_t num_states() const { return accepting_.size(); }
  // Whether `text` is accepted as a whole.
  bool matches(std::string_view text) const;

 private:
  std::vector<uint32_t> table_;  // [state][byte] -> state or kDead
  std::vector<bool> accepting_;
};

}  // namespace moeserve::structured
