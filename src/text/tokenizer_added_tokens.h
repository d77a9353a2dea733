// Added tokens ("added_tokens" of tokenizer.json): strings such as <|im_start|> or <think> that
// are cut out of the input before normalization and pre-tokenization and become one id each.
//
// Matching follows HF tokenizers' AddedVocabulary:
//   - Tokens with normalized=false are matched in the raw input; tokens with normalized=true
//     are matched afterwards, in the normalized text of the parts between the first matches,
//     against their own normalized content.
//   - Among the patterns the leftmost match wins, and among those starting there the longest
//     (Aho-Corasick "leftmost longest"); matches do not overlap.
//   - single_word: a match is dropped when a word character (Rust regex \w) touches it on the
//     left or on the right; the scan still resumes after it.
//   - lstrip / rstrip: the token also swallows the whitespace run (Unicode White_Space) on its
//     left / right, which then produces no ids.
//   - special: decode() with skip_special_tokens leaves the token out.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moeserve::text {

class Normalizer;

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// A part of the input: an added token (token_id >= 0) or text to tokenize (token_id == -1).
struct TextSegment {
  std::string_view text;
  int32_t token_id = -1;
};

// The patterns of one matching pass as a byte trie.
class AddedTokenMatcher {
 public:
  // Adds `pattern` (non-empty) standing for tokens[token_index].
  void add(std::string_view pattern, int32_t token_index);
  bool empty() const { return nodes_.size() <= 1; }

  // Splits `text` into segments, appended to `out` (empty text gives none).
  void split(std::string_view text, const std::vector<AddedToken>& tokens,
             std::vector<TextSegment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t token_index = -1;
  };
  struct Match {
    size_t start, end;
    int32_t token_index;
  };
  int32_t child(int32_t node, unsigned char byte) const;
  // The leftmost-longest match starting at or after `from`.
  std::optional<Match> find(std::string_view text, size_t from) const;

  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_byte_{};
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // `added_tokens` is tokenizer.json's "added_tokens" array (null: none). Normalized tokens
  // are matched by their content passed through `normalizer`.
  static AddedVocabulary from_json(const nlohmann::json& added_tokens,
                                   const Normalizer& normalizer, const std::string& where);

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* find(int32_t id) const;
  std::optional<int32_t> find(std::string_view content) const;

  // First pass: cut out the tokens with normalized=false from the raw input.
  void split_raw(std::string_view text, std::vector<TextSegment>& out) const {
    raw_.split(text, tokens_, out);
  }
  // Second pass: cut out the tokens with normalized=true from normalized text.
  void split_normalized(std::string_view text, std::vector<TextSegment>& out) const {
    normalized_.split(text, tokens_, out);
  }
  bool has_raw_patterns() const { return !raw_.empty(); }
  bool has_normalized_patterns() const { return !normalized_.empty(); }

 private:
  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, int32_t> by_content_;
  AddedTokenMatcher raw_;
  AddedTokenMatcher normalized_;
};

}  // namespace moeserve::text
