// Which tokens may come next in a JSON grammar: a bitset over the vocabulary, from the trie
// walk of token_vocabulary.h, cached by matcher state.
//
// Cost: a walk visits only trie nodes whose bytes the grammar takes, so between JSON tokens
// it touches a few thousand nodes of a 150K-token vocabulary. Inside a string nearly every
// token fits; there the plain tokens (token_vocabulary.h) are taken as a whole, from a
// precomputed bitset, and only the other tokens are walked. Long strings and repeated
// structures revisit the same states, which the cache (per grammar, shared by the requests
// that use it) answers without a walk.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/lru_cache.h"
#include "structured/json_grammar.h"
#include "structured/json_matcher.h"
#include "structured/token_vocabulary.h"

namespace moeserve::structured {

using TokenMask = std::vector<uint64_t>;  // bit t: token t may come next

inline bool mask_allows(const TokenMask& mask, int64_t token) {
  return token >= 0 && size_t(token / 64) < mask.size() && ((mask[size_t(token / 64)] >> (token % 64)) & 1);
}

class TokenMasker {
 public:
  // Keeps at most `max_cached` masks (least recently used go first).
  // A mask is vocab.mask_words() * 8 bytes (31 KB for Qwen3.5's 248,320 ids).
  TokenMasker(JsonGrammar grammar, std::shared_ptr<const TokenVocabulary> vocab, size_t max_cached = 256);
  TokenMasker(const TokenMasker&) = delete;
  TokenMasker& operator=(const TokenMasker&) = delete;

  const JsonMatcher& matcher() const { return matcher_; }
  const TokenVocabulary& vocab() const { return *vocab_; }

  // The tokens (never the end of sequence) that may come after `state`. Thread-safe.
  std::shared_ptr<const TokenMask> allowed(const MatchState& state) const;
  // The same without the cache (for tests and benchmarks).
  TokenMask compute(const MatchState& state) const;

  size_t cached() const;

 private:
  const JsonGrammar grammar_;
  const JsonMatcher matcher_;
  const std::shared_ptr<const TokenVocabulary> vocab_;

  mutable std::mutex mutex_;
  mutable LruCache<std::string, std::shared_ptr<const TokenMask>> cache_;  // by MatchState::key()
};

}  // namespace moeserve::structured
