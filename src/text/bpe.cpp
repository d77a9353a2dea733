#include "text/bpe.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <queue>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/bpe_byte_level.h"
#include "text/unicode.h"

namespace moeserve::text {
namespace {

using nlohmann::json;

// Words with at most this many initial symbols use the quadratic scan, which needs no heap and
// no links; most words have fewer than 16.
constexpr size_t kScanMergeLimit = 48;

std::optional<std::string> optional_string(const json& config, const char* key,
                                           const std::string& where) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) fail("{}.{} must be a string or null", where, key);
  return it->get<std::string>();
}

bool optional_bool(const json& config, const char* key, const std::string& where) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return false;
  if (!it->is_boolean()) fail("{}.{} must be true or false", where, key);
  return it->get<bool>();
}

}  // namespace

BpeModel::BpeModel(const json& config, const std::string& where, bool byte_level,
                   size_t cache_capacity)
    : byte_level_(byte_level), cache_(cache_capacity) {
  if (!config.is_object()) fail("{} must be an object", where);
  if (auto it = config.find("dropout"); it != config.end() && !it->is_null()) {
    fail("{}.dropout is set ({}): BPE dropout is a training-time option and is not supported",
         where, it->dump());
  }
  auto vocab = config.find("vocab");
  if (vocab == config.end()) fail("{}.vocab is missing", where);
  load_vocab(*vocab, where + ".vocab");

  continuing_subword_prefix_ =
      optional_string(config, "continuing_subword_prefix", where).value_or("");
  end_of_word_suffix_ = optional_string(config, "end_of_word_suffix", where).value_or("");
  fuse_unk_ = optional_bool(config, "fuse_unk", where);
  byte_fallback_ = optional_bool(config, "byte_fallback", where);
  ignore_merges_ = optional_bool(config, "ignore_merges", where);
  if (auto unk = optional_string(config, "unk_token", where)) {
    auto id = token_to_id(*unk);
    if (!id) fail("{}.unk_token '{}' is not in the vocabulary", where, *unk);
    unk_id_ = *id;
  }

  auto merges = config.find("merges");
  if (merges == config.end()) fail("{}.merges is missing", where);
  load_merges(*merges, where + ".merges");

  std::fill(std::begin(byte_symbol_), std::end(byte_symbol_), -1);
  byte_symbol_fast_path_ =
      byte_level_ && continuing_subword_prefix_.empty() && end_of_word_suffix_.empty();
  if (byte_symbol_fast_path_) {
    for (int b = 0; b < 256; ++b) {
      if (auto id = token_to_id(byte_level_char_utf8(static_cast<uint8_t>(b))))
        byte_symbol_[b] = *id;
    }
  }
}

void BpeModel::load_vocab(const json& vocab, const std::string& where) {
  if (!vocab.is_object()) fail("{} must be an object mapping token to id", where);
  vocab_.reserve(vocab.size());
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer())
      fail("{}: the id of token '{}' is not an integer", where, it.key());
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= kMaxTokenId)
      fail("{}: token '{}' has id {}, outside 0..{}", where, it.key(), id, kMaxTokenId - 1);
    if (auto bad = find_invalid_utf8(it.key()))
      fail("{}: token string {} is not valid UTF-8 (byte offset {})", where,
           json(it.key()).dump(-1, ' ', true, json::error_handler_t::replace), *bad);
    vocab_.emplace(it.key(), static_cast<int32_t>(id));
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), nullptr);
  // Two strings with one id: keep the first in key order (HF keeps an arbitrary one).
  for (const auto& [token, id] : vocab_) {
    const std::string*& slot = id_to_token_[static_cast<size_t>(id)];
    if (!slot || token < *slot) slot = &token;
  }
}

void BpeModel::load_merges(const json& merges, const std::string& where) {
  if (!merges.is_array()) fail("{} must be an array", where);
  merges_.reserve(merges.size());
  const size_t prefix_len = continuing_subword_prefix_.size();
  std::string left, right, merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& entry = merges[rank];
    if (entry.is_string()) {
      // The legacy form "left right": exactly one space (byte-level tokens never contain one).
      const std::string& line = entry.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        fail("{}[{}] '{}' is not two tokens separated by one space", where, rank, line);
      left.assign(line, 0, space);
      right.assign(line, space + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
               entry[1].is_string()) {
      left = entry[0].get<std::string>();
      right = entry[1].get<std::string>();
    } else {
      fail("{}[{}] must be a string \"a b\" or a pair [\"a\", \"b\"], got {}", where, rank,
           entry.dump());
    }
    auto left_id = token_to_id(left);
    auto right_id = token_to_id(right);
    if (!left_id) fail("{}[{}]: token '{}' is not in the vocabulary", where, rank, left);
    if (!right_id) fail("{}[{}]: token '{}' is not in the vocabulary", where, rank, right);
    if (right.size() < prefix_len)
      fail("{}[{}]: token '{}' is shorter than the continuing-subword prefix", where, rank, right);
    merged.assign(left);
    merged.append(right, prefix_len);
    auto merged_id = token_to_id(merged);
    if (!merged_id)
      fail("{}[{}]: the merged token '{}' is not in the vocabulary", where, rank, merged);
    merges_.insert(*left_id, *right_id, {static_cast<int32_t>(rank), *merged_id});
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || id >= id_limit()) return nullptr;
  return id_to_token_[static_cast<size_t>(id)];
}

void BpeModel::initial_symbols(std::string_view piece, std::vector<int32_t>& symbols) const {
  if (byte_symbol_fast_path_) {
    bool complete = true;
    for (unsigned char b : piece) {
      const int32_t id = byte_symbol_[b];
      if (id < 0) {
        complete = false;
        break;
      }
      symbols.push_back(id);
    }
    if (complete) return;
    symbols.clear();  // a byte outside the vocabulary: take the general path below
  }

  // HF BPE::merge_word: one symbol per character (per byte with byte-level BPE); the
  // continuing-subword prefix marks every symbol but the first, the end-of-word suffix the last.
  // A character outside the vocabulary becomes its <0xXX> byte tokens (byte_fallback), else the
  // unknown token (consecutive ones fused into one with fuse_unk), else it is dropped.
  bool unk_pending = false;
  std::string symbol;
  char fallback_name[8];
  size_t pos = 0;
  while (pos < piece.size()) {
    const size_t start = pos;
    std::string_view character;
    if (byte_level_) {
      character = byte_level_char_utf8(static_cast<uint8_t>(piece[pos]));
      pos += 1;
    } else {
      pos += utf8_sequence_length(static_cast<unsigned char>(piece[pos]));
      character = piece.substr(start, pos - start);
    }
    symbol.clear();
    if (start > 0) symbol += continuing_subword_prefix_;
    symbol += character;
    if (pos >= piece.size()) symbol += end_of_word_suffix_;

    if (auto id = token_to_id(symbol)) {
      if (unk_pending) {
        symbols.push_back(*unk_id_);
        unk_pending = false;
      }
      symbols.push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      const size_t before = symbols.size();
      bool all_found = true;
      for (unsigned char b : symbol) {
        std::snprintf(fallback_name, sizeof(fallback_name), "<0x%02X>", b);
        auto id = token_to_id(fallback_name);
        if (!id) {
          all_found = false;
          break;
        }
        symbols.push_back(*id);
      }
      // Like HF, byte tokens go in without first emitting a pending unknown token.
      if (all_found) continue;
      symbols.resize(before);
    }
    if (unk_id_) {
      if (unk_pending && !fuse_unk_) symbols.push_back(*unk_id_);
      unk_pending = true;
    }
  }
  if (unk_pending) symbols.push_back(*unk_id_);
}

void BpeModel::merge_small(std::vector<int32_t>& symbols) const {
  // ranks[i] is the rank of the pair (symbols[i], symbols[i+1]), INT_MAX when not mergeable.
  thread_local std::vector<int32_t> ranks;
  thread_local std::vector<int32_t> merged_ids;
  const size_t n = symbols.size();
  ranks.resize(n);
  merged_ids.resize(n);
  auto update = [&](size_t i) {
    const BpeMergeTable::Merge* m = merges_.find(symbols[i], symbols[i + 1]);
    ranks[i] = m ? m->rank : INT_MAX;
    merged_ids[i] = m ? m->merged_id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) update(i);
  size_t size = n;
  while (size > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < size; ++i)
      if (ranks[i] < ranks[best]) best = i;  // strict: the leftmost of equal ranks wins
    if (ranks[best] == INT_MAX) break;
    symbols[best] = merged_ids[best];
    // Remove symbol best+1 and the pair that started at it.
    for (size_t i = best + 1; i + 1 < size; ++i) {
      symbols[i] = symbols[i + 1];
      ranks[i] = ranks[i + 1];
      merged_ids[i] = merged_ids[i + 1];
    }
    --size;
    if (best + 1 < size) update(best);
    else ranks[best] = INT_MAX;
    if (best > 0) update(best - 1);
  }
  symbols.resize(size);
}

void BpeModel::merge_large(std::vector<int32_t>& symbols) const {
  // Linked symbols and a min-heap of candidate merges ordered by (rank, position): the same
  // order as the scan, in O(n log n). Entries go stale when a neighbour merges; they are
  // recognised on pop because the pair at that position no longer has that rank.
  const int32_t n = static_cast<int32_t>(symbols.size());
  thread_local std::vector<int32_t> prev, next;
  prev.resize(n);
  next.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  using Candidate = std::pair<int32_t, int32_t>;  // (rank, position of the left symbol)
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  for (int32_t i = 0; i + 1 < n; ++i)
    if (auto m = merges_.find(symbols[i], symbols[i + 1])) heap.emplace(m->rank, i);
  constexpr int32_t kRemoved = -1;
  while (!heap.empty()) {
    const auto [rank, pos] = heap.top();
    heap.pop();
    if (symbols[pos] == kRemoved) continue;
    const int32_t right = next[pos];
    if (right < 0) continue;
    const BpeMergeTable::Merge* m = merges_.find(symbols[pos], symbols[right]);
    if (!m || m->rank != rank) continue;
    symbols[pos] = m->merged_id;
    symbols[right] = kRemoved;
    next[pos] = next[right];
    if (next[pos] >= 0) prev[next[pos]] = pos;
    if (prev[pos] >= 0)
      if (auto left = merges_.find(symbols[prev[pos]], symbols[pos]))
        heap.emplace(left->rank, prev[pos]);
    if (next[pos] >= 0)
      if (auto after = merges_.find(symbols[pos], symbols[next[pos]]))
        heap.emplace(after->rank, pos);
  }
  symbols.erase(std::remove(symbols.begin(), symbols.end(), kRemoved), symbols.end());
}

void BpeModel::merge(std::vector<int32_t>& symbols) const {
  if (symbols.size() < 2) return;
  if (symbols.size() <= kScanMergeLimit) merge_small(symbols);
  else merge_large(symbols);
}

void BpeModel::encode(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    // A piece that is itself a vocabulary entry is one token, whatever the merges say.
    std::optional<int32_t> id;
    if (byte_level_) id = token_to_id(bytes_to_byte_level(piece));
    else id = token_to_id(piece);
    if (id) {
      out.push_back(*id);
      return;
    }
  }
  if (cache_.lookup(piece, out)) return;
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  initial_symbols(piece, symbols);
  merge(symbols);
  cache_.insert(piece, symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

}  // namespace moeserve::text
