// Small helpers shared by the streaming output parsers (reasoning_parser, tool_parser*):
// tag matching against a buffer that may end in the middle of a tag.
#pragma once
#include <algorithm>
#include <cstddef>
#include <string_view>

namespace moeserve::text {

// Length of the longest suffix of `text` that is a proper prefix of `tag`: the bytes a
// streaming parser must hold back because the next push may complete them into `tag`.
// Everything before them can be emitted now.
inline std::size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  const std::size_t longest = std::min(text.size(), tag.empty() ? 0 : tag.size() - 1);
  for (std::size_t k = longest; k > 0; --k) {
    if (text.substr(text.size() - k) == tag.substr(0, k)) return k;
  }
  return 0;
}

// How `text` (the not yet consumed input) relates to `tag` at its start.
enum class TagMatch {
  kFull,     // text starts with tag
  kPartial,  // text is a proper prefix of tag: more input decides
  kNone,     // text cannot start with tag
};

inline TagMatch match_tag_at_start(std::string_view text, std::string_view tag) {
  if (text.size() >= tag.size()) return text.substr(0, tag.size()) == tag ? TagMatch::kFull : TagMatch::kNone;
  return tag.substr(0, text.size()) == text ? TagMatch::kPartial : TagMatch::kNone;
}

// The whitespace the Qwen chat templates put between structural tags.
inline bool is_template_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Index of the first non-whitespace byte of `text` at or after `from` (text.size() if none).
inline std::size_t skip_template_space(std::string_view text, std::size_t from) {
  while (from < text.size() && is_template_space(text[from])) ++from;
  return from;
}

}  // namespace moeserve::text
