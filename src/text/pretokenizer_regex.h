// A compiled PCRE2 pattern for the tokenizer's split rules (pre-tokenizer Split, ByteLevel's
// GPT-2 pattern, the Replace normalizer).
//
// Hugging Face tokenizers compiles these patterns with Oniguruma. PCRE2 10.42 with
// PCRE2_UTF|PCRE2_UCP agrees with it on the patterns tokenizers use (\p{L}, \p{N}, \p{M}, \s,
// (?i:...), the lookahead (?!\S)); see /work/shared/spec/deps.md. The JIT is used when
// available. Subjects must be valid UTF-8, checked once by the caller: every match is run with
// PCRE2_NO_UTF_CHECK, otherwise PCRE2 re-validates the whole subject on every call and
// splitting becomes quadratic.
//
// A Regex is immutable after construction and safe to use from many threads at once.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moeserve::text {

struct MatchSpan {
  uint32_t start;
  uint32_t end;
};

class Regex {
 public:
  enum class Syntax { Pattern, Literal };

  // Compiles `pattern`; a syntax error throws moeserve::Error naming `where` (for example the
  // tokenizer.json field the pattern came from) and the offset of the error in the pattern.
  Regex(std::string_view pattern, Syntax syntax, std::string_view where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the non-overlapping matches in `subject` (valid UTF-8), left to right, with
  // Oniguruma's iteration rule for empty matches: an empty match right where the previous
  // match ended is skipped and the search moves on by one character.
  void find_all(std::string_view subject, std::vector<MatchSpan>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::string where_;
  void* code_ = nullptr;           // pcre2_code_8*
  void* match_context_ = nullptr;  // pcre2_match_context_8*
};

}  // namespace moeserve::text
