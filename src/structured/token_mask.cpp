#include "structured/token_mask.h"

namespace moeserve::structured {

namespace {

// Sets the bit of every token in `trie` whose bytes `matcher` takes after `start`.
void walk(const JsonMatcher& matcher, const MatchState& start, const TokenTrie& trie, TokenMask& mask) {
  thread_local std::vector<MatchState> states;  // states[d]: after the first d bytes
  if (states.size() < size_t(trie.max_depth) + 1) states.resize(size_t(trie.max_depth) + 1);
  states[0] = start;
  size_t i = 0;
  while (i < trie.nodes.size()) {
    const TrieNode& node = trie.nodes[i];
    MatchState& here = states[node.depth];
    matcher.feed(states[node.depth - 1], node.byte, here);
    if (here.dead()) {
      i = node.skip;
      continue;
    }
    for (uint32_t k = node.tokens_begin; k < node.tokens_end; ++k) {
      const int32_t t = trie.token_ids[k];
      mask[size_t(t / 64)] |= uint64_t(1) << (t % 64);
    }
    ++i;
  }
}

}  // namespace

TokenMasker::TokenMasker(JsonGrammar grammar, std::shared_ptr<const TokenVocabulary> vocab, size_t max_cached)
    : grammar_(std::move(grammar)), matcher_(grammar_), vocab_(std::move(vocab)), cache_(max_cached) {}

TokenMask TokenMasker::compute(const MatchState& state) const {
  TokenMask mask(vocab_->mask_words(), 0);
  if (state.dead()) return mask;
  uint32_t room = 0;
  if (matcher_.in_plain_string(state, &room)) {
    // Plain tokens keep every stack inside its string: all of them fit, or those short enough.
    if (room == kUnbounded) {
      mask = vocab_->plain_mask();
    } else {
      for (const auto& [token, chars] : vocab_->plain_chars())
        if (chars <= room) mask[size_t(token / 64)] |= uint64_t(1) << (token % 64);
    }
    walk(matcher_, state, vocab_->not_plain(), mask);
  } else {
    walk(matcher_, state, vocab_->all(), mask);
  }
  return mask;
}

std::shared_ptr<const TokenMask> TokenMasker::allowed(const MatchState& state) const {
  const std::string key = state.key();
  {
    std::lock_guard lock(mutex_);
    if (auto hit = cache_.get(key)) return *hit;
  }
  auto mask = std::make_shared<const TokenMask>(compute(state));  // outside the lock
  std::lock_guard lock(mutex_);
  cache_.put(key, mask);  // kept the first if another thread computed it meanwhile
  return mask;
}

size_t TokenMasker::cached() const {
  std::lock_guard lock(mutex_);
  return cache_.size();
}

}  // namespace moeserve::structured
