// LruCache: hits refresh an entry, the least recently used one goes first, capacity 0 keeps none.
#include <gtest/gtest.h>

#include <string>

#include "core/lru_cache.h"

namespace moeserve {
namespace {

TEST(LruCache, KeepsTheMostRecentlyUsed) {
  LruCache<std::string, int> cache(2);
  cache.put("a", 1);
  cache.put("b", 2);
  EXPECT_EQ(cache.get("a"), 1);  // a is now the most recent
  cache.put("c", 3);             // evicts b
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.get("b"), std::nullopt);
  EXPECT_EQ(cache.get("a"), 1);
  EXPECT_EQ(cache.get("c"), 3);
  cache.put("a", 10);  // present: kept as it was
  EXPECT_EQ(cache.get("a"), 1);
  LruCache<int, int> none(0);
  none.put(1, 1);
  EXPECT_EQ(none.size(), 0u);
  EXPECT_EQ(none.get(1), std::nullopt);
}

}  // namespace
}  // namespace moeserve
