// The BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE", ...}).
//
// A piece from the pre-tokenizer is split into initial symbols (with byte-level BPE: one symbol
// per byte, the vocabulary entry of the byte's alphabet character; otherwise one per
// character), and then the adjacent pair with the lowest merge rank is merged, leftmost first,
// until no listed pair remains. The result equals HF tokenizers' Word::merge_all.
//
// Supported fields: vocab, merges ("a b" strings or ["a", "b"] pairs), unk_token, fuse_unk,
// byte_fallback, continuing_subword_prefix, end_of_word_suffix, ignore_merges. dropout must be
// null (sampling merges has no place in serving).
//
// Thread-safe: encode() may run on many threads at once (the word cache is synchronized).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/bpe_merge_table.h"
#include "text/bpe_word_cache.h"

namespace moeserve::text {

// Token ids must be below this (2^24). Tables are indexed by id, so a corrupt file with a huge
// id is rejected instead of allocating gigabytes; real vocabularies stay below 2^20.
inline constexpr int64_t kMaxTokenId = int64_t{1} << 24;

class BpeModel {
 public:
  // `config` is tokenizer.json's "model"; `where` names it in errors. `byte_level`: pieces are
  // raw bytes to map through the byte-level alphabet (the pre-tokenizer has a ByteLevel step).
  // `cache_capacity`: words held by the cache (0 disables it).
  BpeModel(const nlohmann::json& config, const std::string& where, bool byte_level,
           size_t cache_capacity);

  // Appends the ids of `piece` (valid UTF-8; empty gives nothing).
  void encode(std::string_view piece, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The vocabulary string of `id`, or nullptr when the vocabulary has no such id.
  const std::string* id_to_token(int32_t id) const;
  // One past the largest id in the vocabulary.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }
  size_t vocab_entries() const { return vocab_.size(); }
  size_t merge_count() const { return merges_.size(); }

 private:
  struct TransparentHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Vocab = std::unordered_map<std::string, int32_t, TransparentHash, std::equal_to<>>;

  void load_vocab(const nlohmann::json& vocab, const std::string& where);
  void load_merges(const nlohmann::json& merges, const std::string& where);
  // Appends the initial symbols of `piece` to `symbols` (HF BPE::merge_word before merging).
  void initial_symbols(std::string_view piece, std::vector<int32_t>& symbols) const;
  // Merges `symbols` in place.
  void merge(std::vector<int32_t>& symbols) const;
  void merge_small(std::vector<int32_t>& symbols) const;
  void merge_large(std::vector<int32_t>& symbols) const;

  Vocab vocab_;
  std::vector<const std::string*> id_to_token_;  // points at vocab_ keys (stable in a node map)
  BpeMergeTable merges_;
  bool byte_level_ = false;
  // With byte-level BPE and no prefix/suffix: the vocabulary id of each byte's alphabet
  // character, or -1 when the vocabulary lacks it.
  int32_t byte_symbol_[256];
  bool byte_symbol_fast_path_ = false;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  mutable BpeWordCache cache_;
};

}  // namespace moeserve::text
