// Invariants of the CPU model on the transformers fixtures: chunked prefill == token by token,
// a mixed batch == each sequence alone, thread count and expert layout change nothing, and
// GDN state slots copy and reset exactly.
#include <algorithm>
#include <numeric>

#include <gtest/gtest.h>

#include "checkpoint_rewrite.h"
#include "fixture_util.h"
#include "model/qwen35_cpu.h"
#include "model/sequence_runner.h"

namespace moeserve::model {
namespace {
using testing::Reference;
using testing::rel_diff;

std::unique_ptr<Qwen35CpuModel> load(const std::string& fixture, int threads = 2, int block_size = 16) {
  return Qwen35CpuModel::load(testing::fixture_dir(fixture), CpuModelOptions{threads, block_size, true});
}

// Logits of every token of `ids`, appended in pieces of the given sizes (cycled).
std::vector<float> logits_in_pieces(CausalLM& model, const std::vector<int32_t>& ids, std::vector<int64_t> pieces) {
  SequenceRunner runner(model, int64_t(ids.size()));
  std::vector<float> all;
  size_t at = 0;
  for (size_t i = 0; at < ids.size(); ++i) {
    const size_t n = std::min(ids.size() - at, size_t(pieces[i % pieces.size()]));
    const auto l = runner.append(std::span(ids.data() + at, n), int64_t(n), true);
    all.insert(all.end(), l.begin(), l.end());
    at += n;
  }
  return all;
}

class ChunkingTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ChunkingTest, ChunkedPrefillEqualsTokenByTokenDecode) {
  auto model = load(GetParam(), 2, 5);  // small blocks: many block boundaries
  const auto ids = Reference(GetParam()).ids("input_ids");
  const auto one_by_one = logits_in_pieces(*model, ids, {1});
  // Whole, the GDN chunk size and around it, odd sizes (boundaries inside GDN chunks), mixes.
  for (std::vector<int64_t> pieces : std::vector<std::vector<int64_t>>{
           {int64_t(ids.size())}, {64}, {63}, {65}, {7}, {37, 1, 1, 30}, {2, 61, 1}}) {
    const auto chunked = logits_in_pieces(*model, ids, pieces);
    EXPECT_LT(rel_diff(chunked, one_by_one), 1e-5) << "first piece " << pieces[0];
  }
}

INSTANTIATE_TEST_SUITE_P(Qwen35, ChunkingTest,
                         ::testing::Values("text_f32_perexpert", "composite_bf16_fused_sharded", "lmprefix_gqa4_bf16"));

TEST(ModelInvariants, MixedBatchEqualsEachSequenceAloneBitForBit) {
  auto model = load("composite_bf16_fused_sharded", 3, 4);
  const auto ids = Reference("composite_bf16_fused_sharded").ids("input_ids");
  // Three sequences: different prompts, lengths and chunk schedules.
  const std::vector<std::vector<int32_t>> seqs = {{ids.begin(), ids.begin() + 40},
                                                  {ids.begin() + 10, ids.begin() + 33},
                                                  {ids.rbegin(), ids.rbegin() + 50}};
  const std::vector<std::vector<int64_t>> schedule = {{17, 1, 1, 21}, {5, 18}, {1, 1, 48}};

  // Alone: one at a time, with the same chunks.
  std::vector<std::vector<float>> alone;
  for (size_t s = 0; s < seqs.size(); ++s) alone.push_back(logits_in_pieces(*model, seqs[s], schedule[s]));

  // Together: step i runs piece i of every sequence that has one, with interleaved blocks.
  model->allocate_caches(64, 5);
  const std::vector<int32_t> slots = {4, 0, 2};
  std::vector<std::vector<int32_t>> tables(3);
  for (int32_t b = 0; b < 60; ++b) tables[size_t(b % 3)].push_back(63 - b);
  for (int32_t slot : slots) model->reset_state(slot);
  std::vector<std::vector<float>> together(3);
  std::vector<int64_t> pos(3, 0);
  for (size_t step = 0; step < 4; ++step) {
    std::vector<SeqStep> batch;
    std::vector<size_t> who;
    for (size_t s = 0; s < 3; ++s) {
      if (step >= schedule[s].size()) continue;
      SeqStep st;
      st.tokens = std::span(seqs[s].data() + pos[s], size_t(schedule[s][step]));
      st.start_pos = pos[s];
      st.kv_blocks = tables[s];
      st.state_slot = slots[s];
      st.all_logits = true;
      batch.push_back(st);
      who.push_back(s);
      pos[s] += schedule[s][step];
    }
    StepOutput out;
    model->forward(batch, out);
    for (size_t i = 0; i < who.size(); ++i) {
      const auto first = out.logits.begin() + out.first_row[i] * out.vocab;
      together[who[i]].insert(together[who[i]].end(), first, first + out.num_rows[i] * out.vocab);
    }
  }
  for (size_t s = 0; s < 3; ++s) EXPECT_EQ(together[s], alone[s]) << "sequence " << s;
}

TEST(ModelInvariants, ThreadCountDoesNotChangeAnyBit) {
  const auto ids = Reference("text_f32_perexpert").ids("input_ids");
  auto one = load("text_f32_perexpert", 1), three = load("text_f32_perexpert", 3);
  EXPECT_EQ(logits_in_pieces(*one, ids, {37, 1, 50}), logits_in_pieces(*three, ids, {37, 1, 50}));
}

TEST(ModelInvariants, LastRowLogitsEqualTheAllRowsLogitsOfTheLastToken) {
  auto model = load("lmprefix_gqa4_bf16");
  const auto ids = Reference("lmprefix_gqa4_bf16").ids("input_ids");
  SequenceRunner a(*model, int64_t(ids.size()));
  const auto all = a.append(ids, 20, true);
  SequenceRunner b(*model, int64_t(ids.size()));
  const auto last = b.append(ids, 20, false);
  const int64_t V = model->config().vocab_size;
  EXPECT_EQ(last, std::vector<float>(all.end() - V, all.end()));
}

TEST(ModelInvariants, FusedAndPerExpertLayoutsGiveIdenticalLogits) {
  // The composite fixture stores fused experts; write the same weights per expert.
  const std::string fixture = "composite_bf16_fused_sharded";
  testing::TempDir dir("per_expert");
  auto fused_model = load(fixture);
  const int64_t I = fused_model->config().moe_intermediate_size;
  testing::rewrite_checkpoint(fixture, dir.path(), [&](const std::string& name, const Tensor& t,
                                                        testing::TensorList& out) {
    const auto cut = name.rfind("experts.");
    if (cut == std::string::npos || name.find("proj", cut) == std::string::npos || t.ndim() != 3)
      return testing::keep(name, t, out);
    const std::string base = name.substr(0, cut + 8);
    for (int64_t e = 0; e < t.dim(0); ++e) {
      const std::string p = base + std::to_string(e);
      if (name.ends_with("gate_up_proj")) {
        out.emplace_back(p + ".gate_proj.weight", t.index0(e).slice0(0, I));
        out.emplace_back(p + ".up_proj.weight", t.index0(e).slice0(I, 2 * I));
      } else {
        out.emplace_back(p + ".down_proj.weight", t.index0(e));
      }
    }
  });
  auto per_expert_model = Qwen35CpuModel::load(dir.path(), CpuModelOptions{2, 16, true});
  ASSERT_TRUE(per_expert_model->has_mtp());
  const auto ids = Reference(fixture).ids("input_ids");
  EXPECT_EQ(logits_in_pieces(*fused_model, ids, {30, 1, 39}), logits_in_pieces(*per_expert_model, ids, {30, 1, 39}));
}

TEST(ModelInvariants, CopiedStateContinuesLikeTheOriginal) {
  auto model = load("text_f32_perexpert", 2, 8);
  const auto ids = Reference("text_f32_perexpert").ids("input_ids");
  model->allocate_caches(40, 3);
  std::vector<int32_t> table_a(20), table_b(20);
  std::iota(table_a.begin(), table_a.end(), 0);
  std::iota(table_b.begin(), table_b.end(), 20);
  auto run = [&](std::span<const int32_t> tokens, int64_t start, std::span<const int32_t> table, int32_t slot) {
    SeqStep s{tokens, start, table, slot, true};
    StepOutput out;
    model->forward(std::span(&s, 1), out);
    return out.logits;
  };
  model->reset_state(0);
  run(std::span(ids.data(), 30), 0, table_a, 0);
  // Fork: slot 0 -> slot 2 (GDN state) and the K/V of the 30 tokens into table_b's blocks by
  // re-running them there; slot 1 is reset and replayed as the control.
  model->copy_state(0, 2);
  model->reset_state(1);
  run(std::span(ids.data(), 30), 0, table_b, 1);
  const auto cont_a = run(std::span(ids.data() + 30, 10), 30, table_a, 0);
  const auto cont_fork = run(std::span(ids.data() + 30, 10), 30, table_b, 2);
  EXPECT_EQ(cont_a, cont_fork);
  model->reset_state(2);
  const auto from_reset = run(std::span(ids.data(), 10), 0, table_b, 2);
  SequenceRunner fresh(*model, 10);
  EXPECT_EQ(from_reset, fresh.append(std::span(ids.data(), 10), 10, true));
}

TEST(ModelInvariants, MtpIncrementalStepsEqualOneCausalPass) {
  auto model = load("text_f32_perexpert", 2, 4);
  const auto ids = Reference("text_f32_perexpert").ids("input_ids");
  const int64_t T = int64_t(ids.size()), H = model->config().hidden_size;
  SequenceRunner runner(*model, T);
  std::vector<float> hidden;
  runner.append(ids, 32, false, &hidden);
  auto mtp = [&](int64_t p0, int64_t n, bool all) {
    MtpStep s{std::span(hidden.data() + p0 * H, size_t(n * H)), std::span(ids.data() + p0 + 1, size_t(n)), p0,
              runner.block_table(), all};
    MtpOutput out;
    model->mtp_forward(std::span(&s, 1), out);
    return out;
  };
  const MtpOutput whole = mtp(0, T - 1, true);
  std::vector<float> pieces;
  for (auto [p0, n] : {std::pair<int64_t, int64_t>{0, 40}, {40, 1}, {41, 1}, {42, T - 1 - 42}}) {
    const MtpOutput o = mtp(p0, n, true);
    pieces.insert(pieces.end(), o.logits.begin(), o.logits.end());
  }
  EXPECT_LT(rel_diff(pieces, whole.logits), 1e-5);
  const MtpOutput last = mtp(T - 2, 1, false);  // re-running a position overwrites its K/V
  EXPECT_EQ(last.num_rows[0], 1);
  EXPECT_EQ(last.hidden.size(), size_t(H));
}

}  // namespace
}  // namespace moeserve::model
