#include <gtest/gtest.h>

#include <stdexcept>

#include "runtime/block_manager.h"
#include "runtime/state_slots.h"

namespace moeserve::runtime {
namespace {

TEST(BlockManager, AllocatesEveryBlockOnceThenRefuses) {
  BlockManager blocks(5);
  EXPECT_EQ(blocks.num_total(), 5);
  EXPECT_EQ(blocks.num_free(), 5);
  std::vector<int32_t> table;
  blocks.allocate(3, table);
  EXPECT_EQ(table, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(blocks.num_free(), 2);
  EXPECT_EQ(blocks.num_used(), 3);
  EXPECT_FALSE(blocks.can_allocate(3));
  EXPECT_THROW(blocks.allocate(3, table), std::logic_error);
  EXPECT_EQ(table.size(), 3u) << "a refused allocation must not change the table";
  blocks.allocate(2, table);
  EXPECT_EQ(blocks.num_free(), 0);
  EXPECT_THROW(blocks.allocate(), std::logic_error);
  blocks.check_consistency();
}

TEST(BlockManager, FreeReturnsBlocksAndReusesTheLastFreedFirst) {
  BlockManager blocks(4);
  std::vector<int32_t> a, b;
  blocks.allocate(2, a);
  blocks.allocate(2, b);
  blocks.free_all(a);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(blocks.num_free(), 2);
  // free_all releases last first, so the table's first block is reused first.
  EXPECT_EQ(blocks.allocate(), 0);
  EXPECT_EQ(blocks.allocate(), 1);
  blocks.check_consistency();
}

TEST(BlockManager, ForkedBlocksStayAllocatedUntilTheLastHolderFrees) {
  BlockManager blocks(3);
  const int32_t shared = blocks.allocate();
  blocks.fork(shared);
  blocks.fork(shared);
  EXPECT_EQ(blocks.ref_count(shared), 3);
  blocks.free(shared);
  blocks.free(shared);
  EXPECT_EQ(blocks.ref_count(shared), 1);
  EXPECT_EQ(blocks.num_free(), 2);
  blocks.free(shared);
  EXPECT_EQ(blocks.ref_count(shared), 0);
  EXPECT_EQ(blocks.num_free(), 3);
  blocks.check_consistency();
}

TEST(BlockManager, MisuseIsCaught) {
  BlockManager blocks(2);
  const int32_t b = blocks.allocate();
  blocks.free(b);
  EXPECT_THROW(blocks.free(b), std::logic_error);      // double free
  EXPECT_THROW(blocks.fork(b), std::logic_error);      // fork of a free block
  EXPECT_THROW(blocks.free(7), std::logic_error);      // out of range
  EXPECT_THROW(blocks.ref_count(-1), std::logic_error);
  blocks.check_consistency();
}

TEST(BlockManager, BlocksForTokens) {
  EXPECT_EQ(BlockManager::blocks_for_tokens(0, 16), 0);
  EXPECT_EQ(BlockManager::blocks_for_tokens(1, 16), 1);
  EXPECT_EQ(BlockManager::blocks_for_tokens(16, 16), 1);
  EXPECT_EQ(BlockManager::blocks_for_tokens(17, 16), 2);
  EXPECT_EQ(BlockManager::blocks_for_tokens(262144, 16), 16384);
}

TEST(StateSlotPool, AcquireReleaseAndMisuse) {
  StateSlotPool slots(2);
  EXPECT_EQ(slots.num_free(), 2);
  const int32_t a = slots.acquire();
  const int32_t b = slots.acquire();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_TRUE(slots.in_use(a));
  EXPECT_THROW(slots.acquire(), std::logic_error);
  slots.release(a);
  EXPECT_FALSE(slots.in_use(a));
  EXPECT_THROW(slots.release(a), std::logic_error);
  EXPECT_THROW(slots.release(5), std::logic_error);
  EXPECT_EQ(slots.num_free(), 1);
  EXPECT_EQ(slots.acquire(), a);
}

}  // namespace
}  // namespace moeserve::runtime
