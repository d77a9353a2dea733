#include <gtest/gtest.h>

#include <memory>
#include <numeric>

#include "runtime/scheduler.h"

namespace moeserve::runtime {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  void init(int num_blocks, int num_slots, int max_num_seqs, int max_batched, double watermark = 0.0,
            int prefill_alignment = 1) {
    blocks = std::make_unique<BlockManager>(num_blocks);
    slots = std::make_unique<StateSlotPool>(num_slots);
    SchedulerConfig c;
    c.max_num_seqs = max_num_seqs;
    c.max_num_batched_tokens = max_batched;
    c.kv_block_size = 4;
    c.kv_admission_watermark = watermark;
    c.prefill_alignment = prefill_alignment;
    scheduler = std::make_unique<Scheduler>(c, *blocks, *slots);
  }

  Sequence* add(int prompt_len, int prompt_logprobs = -1) {
    auto seq = std::make_unique<Sequence>();
    seq->id = seqs.size() + 1;
    seq->tokens.resize(size_t(prompt_len));
    std::iota(seq->tokens.begin(), seq->tokens.end(), 1);
    seq->num_prompt_tokens = prompt_len;
    seq->params.prompt_logprobs = prompt_logprobs;
    seqs.push_back(std::move(seq));
    scheduler->add(seqs.back().get());
    return seqs.back().get();
  }

  // Runs the plan as the engine would: tokens computed, a token appended where sampled.
  SchedulerOutput step() {
    SchedulerOutput out = scheduler->schedule();
    scheduler->complete(out);
    for (const ScheduledChunk& c : out.chunks) {
      EXPECT_GE(int64_t(c.seq->block_table.size()) * 4, c.start_pos + c.num_tokens) << "blocks cover the chunk";
      if (c.samples) {
        c.seq->tokens.push_back(7);
        c.seq->first_output_sent = true;
      }
    }
    blocks->check_consistency();
    return out;
  }

  static std::vector<std::pair<uint64_t, int>> shape(const SchedulerOutput& out) {
    std::vector<std::pair<uint64_t, int>> s;
    for (const ScheduledChunk& c : out.chunks) s.emplace_back(c.seq->id, c.num_tokens);
    return s;
  }
  using Shape = std::vector<std::pair<uint64_t, int>>;

  std::unique_ptr<BlockManager> blocks;
  std::unique_ptr<StateSlotPool> slots;
  std::unique_ptr<Scheduler> scheduler;
  std::vector<std::unique_ptr<Sequence>> seqs;
};

TEST_F(SchedulerTest, ChunkedPrefillUnderTheTokenBudgetWithDecodesFirst) {
  init(100, 4, 4, 8);
  Sequence* a = add(10);
  Sequence* b = add(10);
  SchedulerOutput s1 = step();
  EXPECT_EQ(shape(s1), (Shape{{1, 8}}));  // A's first chunk takes the whole budget
  EXPECT_FALSE(s1.chunks[0].samples);
  EXPECT_EQ(s1.slots_to_reset, (std::vector<int32_t>{a->state_slot}));
  EXPECT_EQ(a->block_table.size(), 2u);

  SchedulerOutput s2 = step();
  EXPECT_EQ(shape(s2), (Shape{{1, 2}, {2, 6}}));  // A finishes its prompt, B is admitted
  EXPECT_TRUE(s2.chunks[0].samples);
  EXPECT_FALSE(s2.chunks[1].samples);
  EXPECT_EQ(s2.slots_to_reset, (std::vector<int32_t>{b->state_slot}));

  SchedulerOutput s3 = step();
  EXPECT_EQ(shape(s3), (Shape{{1, 1}, {2, 4}}));  // A decodes, B's last chunk
  EXPECT_TRUE(s3.chunks[1].samples);
  EXPECT_EQ(s3.num_tokens, 5);
  EXPECT_EQ(shape(step()), (Shape{{1, 1}, {2, 1}}));
}

TEST_F(SchedulerTest, RunningDecodesShareTheBudgetWithPrefillChunks) {
  init(100, 4, 4, 4);
  Sequence* a = add(12);
  step();  // A: 4 of 12
  a->tokens.resize(12);
  Sequence* b = add(2);
  (void)b;
  // A takes 4 more (budget 4); B cannot be admitted.
  EXPECT_EQ(shape(step()), (Shape{{1, 4}}));
  // A's last 4 tokens; still no room for B.
  EXPECT_EQ(shape(step()), (Shape{{1, 4}}));
  // A decodes (1), B admitted with its 2-token prompt.
  EXPECT_EQ(shape(step()), (Shape{{1, 1}, {2, 2}}));
  // Add C with a long prompt: admitted with the remaining budget; next step B and A decode
  // first and C gets what is left.
  add(9);
  EXPECT_EQ(shape(step()), (Shape{{1, 1}, {2, 1}, {3, 2}}));
  EXPECT_EQ(shape(step()), (Shape{{1, 1}, {2, 1}, {3, 2}}));
}

TEST_F(SchedulerTest, MaxNumSeqsAndStateSlotsCapTheRunningSet) {
  init(100, 2, 3, 64);
  add(3);
  add(3);
  add(3);
  SchedulerOutput s1 = step();
  EXPECT_EQ(shape(s1), (Shape{{1, 3}, {2, 3}}));  // only two slots
  EXPECT_EQ(scheduler->waiting().size(), 1u);
  scheduler->remove(seqs[0].get());
  EXPECT_EQ(slots->num_free(), 1);
  EXPECT_EQ(shape(step()), (Shape{{2, 1}, {3, 3}}));
}

TEST_F(SchedulerTest, PreemptsTheNewestWhenBlocksRunOutAndRequeuesItFirst) {
  // 6 blocks of 4 tokens. A and B each take 3 blocks for a 12-token prompt.
  init(6, 4, 4, 64);
  Sequence* a = add(12);
  Sequence* b = add(12);
  Sequence* c = add(2);
  EXPECT_EQ(shape(step()), (Shape{{1, 12}, {2, 12}}));  // C does not fit
  EXPECT_EQ(blocks->num_free(), 0);
  // Both need a 4th block for their decode: B (newest) is preempted for A.
  SchedulerOutput s2 = step();
  EXPECT_EQ(shape(s2), (Shape{{1, 1}}));
  EXPECT_EQ(s2.preempted, (std::vector<Sequence*>{b}));
  EXPECT_EQ(b->num_computed, 0);
  EXPECT_TRUE(b->block_table.empty());
  EXPECT_EQ(b->state_slot, -1);
  EXPECT_EQ(b->status, SeqStatus::Waiting);
  EXPECT_EQ(scheduler->waiting().front(), b);
  EXPECT_EQ(scheduler->waiting().back(), c);
  EXPECT_EQ(scheduler->num_preemptions(), 1);
  EXPECT_EQ(a->block_table.size(), 4u);
  // B needs 4 blocks for its 13 tokens (prompt + 1 generated); only 2 are free, and FIFO
  // keeps C (which would fit) behind it.
  EXPECT_EQ(shape(step()), (Shape{{1, 1}}));
  scheduler->remove(a);
  EXPECT_EQ(blocks->num_free(), 6);
  SchedulerOutput s4 = step();
  EXPECT_EQ(shape(s4), (Shape{{2, 13}, {3, 2}}));  // B recomputes prompt + its generated token
  EXPECT_TRUE(s4.chunks[0].samples);
}

TEST_F(SchedulerTest, TheOnlyRunningSequenceIsNeverStarvedOfBlocks) {
  init(4, 2, 2, 64);  // 16 tokens in all
  Sequence* a = add(15);
  step();
  EXPECT_EQ(a->block_table.size(), 4u);
  EXPECT_EQ(shape(step()), (Shape{{1, 1}}));  // token 16 still fits
  EXPECT_EQ(a->num_computed, 16);
}

TEST_F(SchedulerTest, WatermarkHoldsBackAdmissionButNotTheFirstRequest) {
  init(10, 4, 4, 64, 0.3);  // keep 3 blocks free
  add(28);  // 7 blocks: admitted although only 3 stay free (nothing else runs)
  add(4);   // 1 block would leave 2 free < 3
  EXPECT_EQ(shape(step()), (Shape{{1, 28}}));
  EXPECT_EQ(shape(step()), (Shape{{1, 1}}));  // A's decode takes an 8th block; B still waits
  EXPECT_EQ(scheduler->waiting().size(), 1u);
}

TEST_F(SchedulerTest, PromptLogprobChunksAskForAllLogits) {
  init(100, 4, 4, 6);
  Sequence* a = add(10, 2);
  SchedulerOutput s1 = step();
  EXPECT_TRUE(s1.chunks[0].all_logits);
  SchedulerOutput s2 = step();
  EXPECT_TRUE(s2.chunks[0].all_logits);
  EXPECT_TRUE(s2.chunks[0].samples);
  EXPECT_TRUE(a->first_output_sent);
  EXPECT_FALSE(step().chunks[0].all_logits);  // decoding
}

TEST_F(SchedulerTest, PrefillChunksAreCutAtAlignedPositions) {
  init(100, 4, 4, 10, 0.0, /*prefill_alignment=*/4);
  add(22);
  EXPECT_EQ(shape(step()), (Shape{{1, 8}}));  // the budget of 10 is cut at position 8
  EXPECT_EQ(shape(step()), (Shape{{1, 8}}));  // 16
  EXPECT_EQ(shape(step()), (Shape{{1, 6}}));  // the prompt's end needs no alignment
  EXPECT_EQ(shape(step()), (Shape{{1, 1}}));
}

TEST_F(SchedulerTest, APrefillWaitsWhenNoAlignedCutFitsTheBudgetLeft) {
  init(100, 4, 4, 10, 0.0, /*prefill_alignment=*/4);
  add(22);
  add(22);
  EXPECT_EQ(shape(step()), (Shape{{1, 8}}));          // 2 left: B's first boundary is 4 away
  EXPECT_EQ(shape(step()), (Shape{{1, 8}}));
  EXPECT_EQ(shape(step()), (Shape{{1, 6}, {2, 4}}));  // A ends; B gets the 4 left
  EXPECT_EQ(shape(step()), (Shape{{1, 1}, {2, 8}}));  // 9 left -> cut at 12
  EXPECT_EQ(shape(step()), (Shape{{1, 1}, {2, 8}}));  // 20
  EXPECT_EQ(shape(step()), (Shape{{1, 1}, {2, 2}}));  // B's prompt ends at 22
}

TEST_F(SchedulerTest, AlignmentOutOfReachOfTheBudgetCutsWhereTheBudgetEnds) {
  init(100, 4, 1, 3, 0.0, /*prefill_alignment=*/4);  // 3 - 1 < 4: no step could reach a boundary
  add(10);
  EXPECT_EQ(shape(step()), (Shape{{1, 3}}));  // no boundary in reach: cut at 3
  EXPECT_EQ(shape(step()), (Shape{{1, 1}}));  // back on a boundary (4) as soon as one is in reach
  EXPECT_EQ(shape(step()), (Shape{{1, 3}}));  // 7
  EXPECT_EQ(shape(step()), (Shape{{1, 3}}));  // the prompt's end (10)
  EXPECT_EQ(shape(step()), (Shape{{1, 1}}));
}

TEST_F(SchedulerTest, RemoveFreesRunningAndWaitingSequences) {
  init(10, 1, 1, 64);
  Sequence* a = add(8);
  Sequence* b = add(8);
  step();
  EXPECT_EQ(blocks->num_free(), 8);
  EXPECT_EQ(slots->num_free(), 0);
  scheduler->remove(b);  // waiting
  EXPECT_TRUE(scheduler->waiting().empty());
  scheduler->remove(a);  // running
  EXPECT_TRUE(scheduler->running().empty());
  EXPECT_EQ(blocks->num_free(), 10);
  EXPECT_EQ(slots->num_free(), 1);
  EXPECT_EQ(a->status, SeqStatus::Finished);
  EXPECT_TRUE(step().empty());
}

}  // namespace
}  // namespace moeserve::runtime
