#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/cache_plan.h"

namespace moeserve::runtime {
namespace {

model::CacheGeometry geometry(int block_size, size_t block_bytes, size_t slot_bytes) {
  model::CacheGeometry g;
  g.kv_block_size = block_size;
  g.bytes_per_kv_block = block_bytes;
  g.bytes_per_state_slot = slot_bytes;
  return g;
}

TEST(CachePlan, SlotsForMaxNumSeqsAndBlocksGetTheRest) {
  EngineConfig c;
  c.max_num_seqs = 8;
  c.max_model_len = 64;  // 4 blocks of 16
  c.kv_cache_bytes = 1'000'000;
  const CachePlan plan = plan_cache(geometry(16, 1000, 10'000), c);
  EXPECT_EQ(plan.kv_block_size, 16);
  EXPECT_EQ(plan.num_state_slots, 8);
  EXPECT_EQ(plan.num_kv_blocks, (1'000'000 - 8 * 10'000) / 1000);  // 920
  EXPECT_EQ(plan.bytes, size_t(920 * 1000 + 8 * 10'000));
}

TEST(CachePlan, FewerSlotsWhenMemoryIsShort) {
  EngineConfig c;
  c.max_num_seqs = 256;
  c.max_model_len = 160;  // 10 blocks of 16
  c.kv_cache_bytes = 10 * 1000 + 3 * 10'000 + 500;
  const CachePlan plan = plan_cache(geometry(16, 1000, 10'000), c);
  EXPECT_EQ(plan.num_state_slots, 3);
  EXPECT_EQ(plan.num_kv_blocks, 10);
  EXPECT_LE(plan.bytes, c.kv_cache_bytes);
}

TEST(CachePlan, RefusesABudgetThatCannotHoldOneFullSequence) {
  EngineConfig c;
  c.max_model_len = 4096;  // 256 blocks
  c.kv_cache_bytes = 256 * 1000 + 9'999;
  try {
    plan_cache(geometry(16, 1000, 10'000), c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("max_model_len=4096"), std::string::npos) << msg;
    EXPECT_NE(msg.find("266000"), std::string::npos) << msg;  // what one sequence needs
  }
  c.kv_cache_bytes = 256 * 1000 + 10'000;
  const CachePlan plan = plan_cache(geometry(16, 1000, 10'000), c);
  EXPECT_EQ(plan.num_state_slots, 1);
  EXPECT_EQ(plan.num_kv_blocks, 256);
}

TEST(CachePlan, OverridesReplaceTheSplit) {
  EngineConfig c;
  c.max_num_seqs = 4;
  c.max_model_len = 32;
  c.num_kv_blocks_override = 9;
  c.num_state_slots_override = 6;
  const CachePlan plan = plan_cache(geometry(4, 100, 1000), c);
  EXPECT_EQ(plan.num_kv_blocks, 9);
  EXPECT_EQ(plan.num_state_slots, 4);  // never more than max_num_seqs
  c.num_kv_blocks_override = 7;        // 32 tokens need 8 blocks of 4
  EXPECT_THROW(plan_cache(geometry(4, 100, 1000), c), Error);
  c.num_kv_blocks_override = 9;
  c.num_state_slots_override = 0;
  EXPECT_THROW(plan_cache(geometry(4, 100, 1000), c), Error);
}

TEST(CachePlan, RejectsBadSettings) {
  EngineConfig c;
  c.kv_cache_bytes = 1 << 30;
  EXPECT_EQ(c.kv_block_size, 0) << "the default takes the model's block size";
  c.kv_block_size = 32;
  EXPECT_THROW(plan_cache(geometry(16, 1000, 1000), c), Error);  // block size mismatch
  c.kv_block_size = 16;
  EXPECT_EQ(plan_cache(geometry(16, 1000, 1000), c).kv_block_size, 16);
  c.kv_cache_bytes = 0;
  EXPECT_THROW(plan_cache(geometry(16, 1000, 1000), c), Error);
}

}  // namespace
}  // namespace moeserve::runtime
