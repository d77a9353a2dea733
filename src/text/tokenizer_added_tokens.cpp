#include "text/tokenizer_added_tokens.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/bpe.h"
#include "text/tokenizer_normalizer.h"
#include "text/unicode.h"

namespace moeserve::text {
namespace {

using nlohmann::json;

bool flag(const json& entry, const char* key, bool fallback, const std::string& where) {
  auto it = entry.find(key);
  if (it == entry.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail("{}.{} must be true or false", where, key);
  return it->get<bool>();
}

}  // namespace

int32_t AddedTokenMatcher::child(int32_t node, unsigned char byte) const {
  const auto& children = nodes_[static_cast<size_t>(node)].children;
  auto it = std::lower_bound(children.begin(), children.end(), byte,
                             [](const auto& entry, unsigned char b) { return entry.first < b; });
  if (it == children.end() || it->first != byte) return -1;
  return it->second;
}

void AddedTokenMatcher::add(std::string_view pattern, int32_t token_index) {
  int32_t node = 0;
  for (unsigned char byte : pattern) {
    int32_t next = child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      auto& children = nodes_[static_cast<size_t>(node)].children;
      auto it = std::lower_bound(children.begin(), children.end(), byte,
                                 [](const auto& entry, unsigned char b) { return entry.first < b; });
      children.insert(it, {byte, next});
    }
    node = next;
  }
  // Two tokens with the same pattern: the first one listed keeps it.
  if (nodes_[static_cast<size_t>(node)].token_index < 0)
    nodes_[static_cast<size_t>(node)].token_index = token_index;
  first_byte_[static_cast<unsigned char>(pattern.front())] = true;
}

std::optional<AddedTokenMatcher::Match> AddedTokenMatcher::find(std::string_view text,
                                                                size_t from) const {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t start = from; start < text.size(); ++start) {
    if (!first_byte_[bytes[start]]) continue;
    int32_t node = 0;
    std::optional<Match> longest;
    for (size_t i = start; i < text.size(); ++i) {
      node = child(node, bytes[i]);
      if (node < 0) break;
      const int32_t token = nodes_[static_cast<size_t>(node)].token_index;
      if (token >= 0) longest = Match{start, i + 1, token};
    }
    if (longest) return longest;
  }
  return std::nullopt;
}

void AddedTokenMatcher::split(std::string_view text, const std::vector<AddedToken>& tokens,
                              std::vector<TextSegment>& out) const {
  if (text.empty()) return;
  if (empty()) {
    out.push_back({text, -1});
    return;
  }
  size_t segment_start = 0;  // end of the last token taken
  size_t search_from = 0;
  while (auto match = find(text, search_from)) {
    search_from = match->end;
    const AddedToken& token = tokens[static_cast<size_t>(match->token_index)];
    size_t start = match->start;
    size_t stop = match->end;
    if (token.single_word) {
      const bool word_before = start > 0 && is_unicode_word_char(last_code_point(text, start));
      size_t after = stop;
      const bool word_after =
          stop < text.size() && is_unicode_word_char(next_code_point(text, after));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      // Swallow the whitespace before the token, but not what an earlier token already took.
      size_t new_start = start;
      while (new_start > segment_start) {
        size_t char_start = new_start - 1;
        while (char_start > 0 && (static_cast<unsigned char>(text[char_start]) & 0xC0) == 0x80)
          --char_start;
        size_t probe = char_start;
        if (!is_unicode_whitespace(next_code_point(text, probe))) break;
        new_start = char_start;
      }
      start = new_start;
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!is_unicode_whitespace(next_code_point(text, next))) break;
        stop = next;
      }
      search_from = stop;
    }
    if (segment_start < start) out.push_back({text.substr(segment_start, start - segment_start), -1});
    out.push_back({text.substr(start, stop - start), token.id});
    segment_start = stop;
  }
  if (segment_start < text.size()) out.push_back({text.substr(segment_start), -1});
}

AddedVocabulary AddedVocabulary::from_json(const json& added_tokens, const Normalizer& normalizer,
                                           const std::string& where) {
  AddedVocabulary vocab;
  if (added_tokens.is_null()) return vocab;
  if (!added_tokens.is_array()) fail("{} must be an array", where);
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const json& entry = added_tokens[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    if (!entry.is_object()) fail("{} must be an object", at);
    auto id = entry.find("id");
    auto content = entry.find("content");
    if (id == entry.end() || !id->is_number_integer()) fail("{}.id must be an integer", at);
    if (content == entry.end() || !content->is_string()) fail("{}.content must be a string", at);
    AddedToken token;
    const int64_t raw_id = id->get<int64_t>();
    if (raw_id < 0 || raw_id >= kMaxTokenId)
      fail("{}.id {} is outside 0..{}", at, raw_id, kMaxTokenId - 1);
    token.id = static_cast<int32_t>(raw_id);
    token.content = content->get<std::string>();
    check_utf8(token.content, at + ".content");
    token.special = flag(entry, "special", false, at);
    token.single_word = flag(entry, "single_word", false, at);
    token.lstrip = flag(entry, "lstrip", false, at);
    token.rstrip = flag(entry, "rstrip", false, at);
    // HF's AddedToken::from(content, special) default: special tokens are not normalized.
    token.normalized = flag(entry, "normalized", !token.special, at);
    // HF ignores empty added tokens; a repeated content keeps its first id.
    if (token.content.empty() || vocab.by_content_.count(token.content)) continue;
    if (vocab.by_id_.count(token.id))
      fail("{}: id {} is used by two added tokens", at, token.id);
    vocab.by_content_.emplace(token.content, token.id);
    vocab.by_id_.emplace(token.id, vocab.tokens_.size());
    vocab.tokens_.push_back(std::move(token));
  }
  for (size_t i = 0; i < vocab.tokens_.size(); ++i) {
    const AddedToken& token = vocab.tokens_[i];
    if (!token.normalized) {
      vocab.raw_.add(token.content, static_cast<int32_t>(i));
    } else {
      const std::string pattern = normalizer.apply(token.content);
      if (!pattern.empty()) vocab.normalized_.add(pattern, static_cast<int32_t>(i));
    }
  }
  return vocab;
}

const AddedToken* AddedVocabulary::find(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::find(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

}  // namespace moeserve::text
