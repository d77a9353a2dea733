// The model's tokens as bytes, arranged for building token masks (token_mask.h).
//
// Structured output uses every token of the tokenizer's BPE vocabulary below the model's
// vocabulary size, except the added tokens (special or not: <|im_end|>, <think>,
// <tool_call>, ...): inside JSON their text is produced from ordinary tokens, and a stray
// <tool_call> in the content would confuse the output parsers. End-of-sequence tokens are
// handled by the constraint, not here. A byte-level BPE vocabulary (Qwen's) has a token for
// every single byte, so whatever continuation the grammar allows can be spelled: a mask is
// never empty where the matcher is alive.
//
// Tries, in preorder: node i is byte `byte` at depth `depth` (1 = a token's first byte); the
// nodes of its subtree are i+1 .. skip-1; the tokens whose bytes end at it are
// token_ids[tokens_begin, tokens_end). A walk that keeps one matcher state per depth visits
// each node once and skips the subtree of a byte the grammar refuses.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moeserve::text {
class Tokenizer;
}

namespace moeserve::structured {

struct TrieNode {
  uint8_t byte = 0;
  uint16_t depth = 0;
  uint32_t skip = 0;
  uint32_t tokens_begin = 0, tokens_end = 0;
};

struct TokenTrie {
  std::vector<TrieNode> nodes;
  std::vector<int32_t> token_ids;
  int max_depth = 0;
};

class TokenVocabulary {
 public:
  // `tokens[i]` is the bytes of token i, or nullopt for one structured output never uses.
  // `vocab_size` is the model's (the length of a logits row and of a mask).
  TokenVocabulary(const std::vector<std::optional<std::string>>& tokens, int64_t vocab_size);
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const text::Tokenizer& tokenizer, int64_t vocab_size);

  int64_t size() const { return vocab_size_; }
  size_t mask_words() const { return size_t((vocab_size_ + 63) / 64); }
  // The bytes of `id`, or nullptr when structured output does not use it.
  const std::string* bytes(int32_t id) const;

  // Every usable token.
  const TokenTrie& all() const { return all_; }
  // The usable tokens that are not plain (below).
  const TokenTrie& not_plain() const { return not_plain_; }
  // Plain tokens: only characters that stand for themselves inside a JSON string (no '"',
  // '\\', control byte, or partial UTF-8 sequence). As a bitset, and with their character
  // counts for strings with a length limit.
  const std::vector<uint64_t>& plain_mask() const { return plain_mask_; }
  const std::vector<std::pair<int32_t, uint32_t>>& plain_chars() const { return plain_chars_; }

 private:
  int64_t vocab_size_;
  std::vector<std::optional<std::string>> bytes_;
  TokenTrie all_, not_plain_;
  std::vector<uint64_t> plain_mask_;
  std::vector<std::pair<int32_t, uint32_t>> plain_chars_;  // (token, characters)
};

// Number of UTF-8 characters of `bytes` when it is plain string content (above), else -1.
int64_t plain_string_chars(const std::string& bytes);

}  // namespace moeserve::structured
