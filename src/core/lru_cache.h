// A map that keeps its `capacity` most recently used entries. Not thread-safe: callers that
// share one hold their own lock.
#pragma once
#include <cstddef>
#include <list>
#include <optional>
#include <unordered_map>
#include <utility>

namespace moeserve {

template <typename Key, typename Value>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity) {}

  // The value of `key` (now the most recent), or nullopt.
  std::optional<Value> get(const Key& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    order_.splice(order_.begin(), order_, it->second.second);
    return it->second.first;
  }
  // Adds `key` unless present, dropping the least recently used entries beyond capacity.
  void put(const Key& key, Value value) {
    if (capacity_ == 0 || map_.count(key)) return;
    while (map_.size() >= capacity_) {
      map_.erase(order_.back());
      order_.pop_back();
    }
    order_.push_front(key);
    map_.emplace(key, std::make_pair(std::move(value), order_.begin()));
  }
  size_t size() const { return map_.size(); }

 private:
  size_t capacity_;
  std::list<Key> order_;  // most recent first
  std::unordered_map<Key, std::pair<Value, typename std::list<Key>::iterator>> map_;
};

}  // namespace moeserve
