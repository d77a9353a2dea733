#include "text/bpe_word_cache.h"

namespace moeserve::text {

BpeWordCache::BpeWordCache(size_t capacity)
    : shards_(new Shard[kShards]), per_shard_capacity_((capacity + kShards - 1) / kShards) {}

BpeWordCache::Shard& BpeWordCache::shard_for(std::string_view word) const {
  // High bits pick the shard; the map inside uses the full hash (a different mix of it).
  const size_t h = TransparentHash{}(word);
  return shards_[(h >> 40) % kShards];
}

bool BpeWordCache::lookup(std::string_view word, std::vector<int32_t>& out) const {
  if (!enabled() || word.size() > kMaxWordBytes) return false;
  Shard& shard = shard_for(word);
  std::lock_guard lock(shard.mutex);
  auto it = shard.map.find(word);
  if (it == shard.map.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void BpeWordCache::insert(std::string_view word, std::span<const int32_t> ids) {
  if (!enabled() || word.size() > kMaxWordBytes) return;
  Shard& shard = shard_for(word);
  std::lock_guard lock(shard.mutex);
  if (shard.map.size() >= per_shard_capacity_) shard.map.clear();
  shard.map.try_emplace(std::string(word), ids.begin(), ids.end());
}

}  // namespace moeserve::text
