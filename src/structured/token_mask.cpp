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
    : grammar_(std::move(grammar)), matcher_(grammar_), vocab_(std::move(vocab)), max_cached_(max_cached) {}

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
  std::string key = state.key();
  {
    std::lock_guard lock(mutex_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.position);
      return it->second.mask;
    }
  }
  auto mask = std::make_shared<const TokenMask>(compute(state));
  if (max_cached_ == 0) return mask;
  std::lock_guard lock(mutex_);
  if (cache_.count(key)) return mask;  // another thread computed it meanwhile
  while (cache_.size() >= max_cached_) {
    cache_.erase(lru_.back());
    lru_.pop_back();
  }
  lru_.push_front(key);
  cache_.emplace(std::move(key), Entry{mask, lru_.begin()});
  return mask;
}

size_t TokenMasker::cached() const {
  std::lock_guard lock(mutex_);
  return cache_.size();
}

}  // namespace moeserve::structured
