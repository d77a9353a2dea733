// A thread-safe cache from a pre-token piece to its BPE token ids. Natural text repeats words
// constantly, so most pieces skip the merge loop. The table is split into shards, each behind
// its own mutex, so concurrent encoders (the server tokenizes from many threads) rarely wait on
// one another. A shard that reaches its capacity is emptied and refilled, which bounds memory
// and lets the cache follow a changing vocabulary of inputs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace moeserve::text {

class BpeWordCache {
 public:
  // Pieces longer than this are not cached: they rarely repeat and would crowd out words.
  static constexpr size_t kMaxWordBytes = 256;

  // `capacity` is the total number of words held; 0 disables the cache.
  explicit BpeWordCache(size_t capacity);

  bool enabled() const { return per_shard_capacity_ > 0; }

  // On a hit appends the cached ids to `out` and returns true.
  bool lookup(std::string_view word, std::vector<int32_t>& out) const;

  void insert(std::string_view word, std::span<const int32_t> ids);

 private:
  struct TransparentHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    mutable std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, TransparentHash, std::equal_to<>> map;
  };
  static constexpr size_t kShards = 64;

  Shard& shard_for(std::string_view word) const;

  std::unique_ptr<Shard[]> shards_;
  size_t per_shard_capacity_ = 0;
};

}  // namespace moeserve::text
