#include "structured/token_vocabulary.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "text/tokenizer.h"
#include "text/tokenizer_added_tokens.h"

namespace moeserve::structured {

namespace {

// Builds the preorder trie of `ids` (sorted by their bytes).
TokenTrie build_trie(const std::vector<std::optional<std::string>>& bytes, std::vector<int32_t> ids) {
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return *bytes[size_t(a)] < *bytes[size_t(b)]; });
  TokenTrie trie;
  std::vector<uint32_t> path;  // node index at each depth - 1, along the previous token
  const std::string* previous = nullptr;
  for (int32_t id : ids) {
    const std::string& s = *bytes[size_t(id)];
    size_t common = 0;
    if (previous) {
      const size_t limit = std::min({previous->size(), s.size(), path.size()});
      while (common < limit && (*previous)[common] == s[common]) ++common;
    }
    // Close the subtrees that this token leaves.
    while (path.size() > common) {
      trie.nodes[path.back()].skip = uint32_t(trie.nodes.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      TrieNode node;
      node.byte = uint8_t(s[d]);
      node.depth = uint16_t(d + 1);
      path.push_back(uint32_t(trie.nodes.size()));
      trie.nodes.push_back(node);
    }
    TrieNode& end = trie.nodes[path.back()];
    if (end.tokens_end == end.tokens_begin) end.tokens_begin = end.tokens_end = uint32_t(trie.token_ids.size());
    trie.token_ids.push_back(id);
    ++end.tokens_end;
    trie.max_depth = std::max(trie.max_depth, int(s.size()));
    previous = &s;
  }
  while (!path.empty()) {
    trie.nodes[path.back()].skip = uint32_t(trie.nodes.size());
    path.pop_back();
  }
  return trie;
}

}  // namespace

int64_t plain_string_chars(const std::string& bytes) {
  int64_t chars = 0;
  for (size_t i = 0; i < bytes.size();) {
    const auto b = uint8_t(bytes[i]);
    size_t len = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // range of the second byte (RFC 3629)
    if (b < 0x20 || b == '"' || b == '\\') return -1;
    if (b < 0x80) len = 1;
    else if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return -1;
    }
    if (i + len > bytes.size()) return -1;  // a partial sequence
    for (size_t k = 1; k < len; ++k) {
      const auto c = uint8_t(bytes[i + k]);
      if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return -1;
    }
    i += len;
    ++chars;
  }
  return chars;
}

TokenVocabulary::TokenVocabulary(const std::vector<std::optional<std::string>>& tokens, int64_t vocab_size)
    : vocab_size_(vocab_size), bytes_(size_t(vocab_size)) {
  MOESERVE_CHECK(vocab_size > 0, "structured output: vocabulary size {}", vocab_size);
  plain_mask_.assign(mask_words(), 0);
  std::vector<int32_t> all, not_plain;
  const auto n = std::min<int64_t>(vocab_size, int64_t(tokens.size()));
  for (int64_t id = 0; id < n; ++id) {
    const auto& t = tokens[size_t(id)];
    if (!t || t->empty()) continue;
    bytes_[size_t(id)] = t;
    all.push_back(int32_t(id));
    const int64_t chars = plain_string_chars(*t);
    if (chars < 0) {
      not_plain.push_back(int32_t(id));
    } else {
      plain_mask_[size_t(id / 64)] |= uint64_t(1) << (id % 64);
      plain_chars_.emplace_back(int32_t(id), uint32_t(chars));
    }
  }
  all_ = build_trie(bytes_, std::move(all));
  not_plain_ = build_trie(bytes_, std::move(not_plain));
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const text::Tokenizer& tokenizer,
                                                                       int64_t vocab_size) {
  std::vector<std::optional<std::string>> tokens(size_t(std::max<int64_t>(vocab_size, 0)));
  std::vector<bool> added(tokens.size(), false);
  for (const auto& a : tokenizer.added_tokens())
    if (a.id >= 0 && size_t(a.id) < added.size()) added[size_t(a.id)] = true;
  const auto n = std::min<int64_t>(vocab_size, tokenizer.vocab_size());
  std::string buffer;
  for (int64_t id = 0; id < n; ++id) {
    if (added[size_t(id)]) continue;
    buffer.clear();
    if (tokenizer.append_token_bytes(int32_t(id), /*skip_special_tokens=*/false, /*first=*/true, buffer))
      tokens[size_t(id)] = buffer;
  }
  return std::make_shared<const TokenVocabulary>(tokens, vocab_size);
}

const std::string* TokenVocabulary::bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size_) return nullptr;
  const auto& b = bytes_[size_t(id)];
  return b ? &*b : nullptr;
}

}  // namespace moeserve::structured
