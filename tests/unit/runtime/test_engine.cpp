#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "core/error.h"
#include "engine_test_util.h"
#include "runtime/block_manager.h"

namespace moeserve::runtime {
namespace {

using testing::HashModel;
using testing::Recorder;
using testing::Reference;
using testing::reference_run;

constexpr int64_t kVocab = 64;

struct EngineFixture {
  explicit EngineFixture(EngineConfig config = small_config(), HashModel::Options options = {}) {
    options.vocab = kVocab;
    eos = options.eos;
    auto m = std::make_unique<HashModel>(options);
    model = m.get();
    engine = std::make_unique<Engine>(std::move(m), config);
  }
  static EngineConfig small_config() {
    EngineConfig c;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 32;
    c.max_model_len = 128;
    c.num_kv_blocks_override = 256;
    c.num_state_slots_override = 8;
    c.seed = 1;
    return c;
  }
  Reference reference(const std::vector<int32_t>& prompt, const SamplingParams& p) const {
    return reference_run(prompt, p, kVocab, eos, engine->config().max_model_len);
  }
  std::shared_ptr<Recorder> submit(const std::vector<int32_t>& prompt, const SamplingParams& p, uint64_t* id = nullptr) {
    auto rec = Recorder::create();
    const uint64_t rid = engine->submit(prompt, p, rec->callback());
    if (id) *id = rid;
    return rec;
  }
  // Waits until the engine holds nothing: every block and slot back.
  void expect_all_returned() {
    Engine::Stats s;
    for (int i = 0; i < 2000; ++i) {
      s = engine->stats();
      if (s.running == 0 && s.waiting == 0 && s.free_kv_blocks == s.total_kv_blocks) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(s.running, 0);
    EXPECT_EQ(s.waiting, 0);
    EXPECT_EQ(s.free_kv_blocks, s.total_kv_blocks);
    EXPECT_EQ(s.free_state_slots, s.total_state_slots);
    EXPECT_EQ(s.kv_usage, 0.0);
  }

  std::vector<int64_t> eos;
  HashModel* model = nullptr;
  std::unique_ptr<Engine> engine;
};

std::vector<int32_t> make_prompt(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(int32_t(1 + (i * 7 + salt * 13) % (kVocab - 1)));
  return p;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

TEST(Engine, OneGreedyRequestMatchesTheReference) {
  EngineFixture f;
  const auto prompt = make_prompt(10, 1);
  auto rec = f.submit(prompt, greedy(20));
  ASSERT_TRUE(rec->wait());
  EXPECT_EQ(rec->tokens(), f.reference(prompt, greedy(20)).tokens);
  const RequestOutput last = rec->last();
  EXPECT_EQ(last.finish, FinishReason::Length);
  EXPECT_EQ(last.num_prompt_tokens, 10);
  EXPECT_EQ(last.num_generated_tokens, 20);
  EXPECT_EQ(rec->outputs().size(), 20u) << "one output per decode step";
  EXPECT_EQ(rec->outputs_after_final(), 0);
  f.expect_all_returned();
  const Engine::Stats s = f.engine->stats();
  EXPECT_EQ(s.prompt_tokens_total, 10);
  EXPECT_EQ(s.generation_tokens_total, 20);
  EXPECT_EQ(s.requests_finished_total, 1);
  EXPECT_EQ(f.model->num_resets(), 1) << "reset_state once when the sequence starts";
}

TEST(Engine, ABatchOfNGivesEachTheTokensOfNRunsAlone) {
  const int n = 16;
  std::vector<std::vector<int32_t>> alone(n);
  {
    EngineFixture f;
    for (int i = 0; i < n; ++i) {
      auto rec = f.submit(make_prompt(3 + i * 5, i), greedy(12 + i));
      ASSERT_TRUE(rec->wait());
      alone[size_t(i)] = rec->tokens();
    }
  }
  EngineFixture f;
  std::vector<std::shared_ptr<Recorder>> recs;
  f.model->hold();  // all of them queued before the engine gets going
  for (int i = 0; i < n; ++i) recs.push_back(f.submit(make_prompt(3 + i * 5, i), greedy(12 + i)));
  f.model->release();
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(recs[size_t(i)]->wait());
    EXPECT_EQ(recs[size_t(i)]->tokens(), alone[size_t(i)]) << "request " << i;
    EXPECT_EQ(recs[size_t(i)]->tokens(), f.reference(make_prompt(3 + i * 5, i), greedy(12 + i)).tokens);
  }
  // They really were batched: some step held several sequences and mixed prefill with decode.
  int max_seqs = 0;
  for (const auto& s : f.model->steps()) max_seqs = std::max(max_seqs, s.seqs);
  EXPECT_EQ(max_seqs, 8);
  for (const auto& s : f.model->steps()) EXPECT_LE(s.tokens, 32);
  f.expect_all_returned();
}

TEST(Engine, SeededSamplingDoesNotDependOnTheBatch) {
  auto params = [](int i) {
    SamplingParams p;
    p.temperature = 0.8;
    p.top_p = 0.9;
    p.top_k = 20;
    p.seed = 1000 + uint64_t(i);
    p.max_tokens = 15;
    p.ignore_eos = true;
    p.presence_penalty = 0.5;
    return p;
  };
  EngineFixture f;
  std::vector<std::shared_ptr<Recorder>> recs;
  for (int i = 0; i < 10; ++i) recs.push_back(f.submit(make_prompt(4 + i, i), params(i)));
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(recs[size_t(i)]->wait());
    EXPECT_EQ(recs[size_t(i)]->tokens(), f.reference(make_prompt(4 + i, i), params(i)).tokens) << i;
  }
  // Alone, with other traffic of a different shape around it: the same.
  auto other = f.submit(make_prompt(30, 99), greedy(40));
  auto again = f.submit(make_prompt(4 + 3, 3), params(3));
  ASSERT_TRUE(again->wait());
  EXPECT_EQ(again->tokens(), recs[3]->tokens());
  ASSERT_TRUE(other->wait());
}

TEST(Engine, ChunkedPrefillGivesTheSameTokens) {
  EngineConfig c = EngineFixture::small_config();
  c.max_num_batched_tokens = 8;  // 60-token prompts in 8-token chunks
  EngineFixture f(c);
  std::vector<std::shared_ptr<Recorder>> recs;
  for (int i = 0; i < 4; ++i) recs.push_back(f.submit(make_prompt(60, i), greedy(10)));
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(recs[size_t(i)]->wait());
    EXPECT_EQ(recs[size_t(i)]->tokens(), f.reference(make_prompt(60, i), greedy(10)).tokens);
  }
  for (const auto& s : f.model->steps()) {
    EXPECT_LE(s.tokens, 8);
    // The model learns which positions are prompt tokens (its kernels may differ by kind).
    for (int64_t p : s.prompt_len) EXPECT_EQ(p, 60);
  }
}

TEST(Engine, EosStopTokensAndMinTokens) {
  EngineFixture f;
  // Find a prompt whose greedy continuation meets eos (token 0) within 40 tokens.
  SamplingParams p = greedy(40);
  p.ignore_eos = false;
  std::vector<int32_t> prompt;
  Reference ref;
  for (int salt = 0; salt < 500; ++salt) {
    prompt = make_prompt(5, salt);
    ref = f.reference(prompt, p);
    if (ref.finish == FinishReason::Stop && ref.tokens.size() >= 3) break;
  }
  ASSERT_EQ(ref.finish, FinishReason::Stop) << "no prompt reaches eos; change the search";
  auto rec = f.submit(prompt, p);
  ASSERT_TRUE(rec->wait());
  EXPECT_EQ(rec->tokens(), ref.tokens);
  EXPECT_EQ(rec->tokens().back(), 0) << "the stop token is part of the output";
  EXPECT_EQ(rec->last().finish, FinishReason::Stop);
  EXPECT_EQ(rec->last().stop_token, std::optional<int32_t>(0));

  // min_tokens past the eos: generation goes on, and matches the reference with masking.
  SamplingParams longer = p;
  longer.min_tokens = int(ref.tokens.size()) + 2;
  const Reference ref_min = f.reference(prompt, longer);
  auto rec_min = f.submit(prompt, longer);
  ASSERT_TRUE(rec_min->wait());
  EXPECT_EQ(rec_min->tokens(), ref_min.tokens);
  const std::vector<int32_t> got_min = rec_min->tokens();
  ASSERT_GE(got_min.size(), size_t(longer.min_tokens));
  EXPECT_EQ(std::find(got_min.begin(), got_min.begin() + longer.min_tokens, 0), got_min.begin() + longer.min_tokens)
      << "no eos before min_tokens";

  // A stop token id: the greedy run stops at the first occurrence of its third token.
  const std::vector<int32_t> base = f.reference(make_prompt(7, 3), greedy(30)).tokens;
  SamplingParams s = greedy(30);
  s.stop_token_ids = {base[2]};
  auto rec_stop = f.submit(make_prompt(7, 3), s);
  ASSERT_TRUE(rec_stop->wait());
  const auto first = std::find(base.begin(), base.end(), base[2]);
  EXPECT_EQ(rec_stop->tokens(), std::vector<int32_t>(base.begin(), first + 1));
  EXPECT_EQ(rec_stop->last().finish, FinishReason::Stop);
  EXPECT_EQ(rec_stop->last().stop_token, std::optional<int32_t>(base[2]));
  f.expect_all_returned();
}

TEST(Engine, LogprobsAndPromptLogprobsMatchTheModelsDistribution) {
  EngineConfig c = EngineFixture::small_config();
  c.max_num_batched_tokens = 8;  // prompt logprobs across several chunks
  EngineFixture f(c);
  const auto prompt = make_prompt(21, 5);
  SamplingParams p = greedy(6);
  p.logprobs = 3;
  p.prompt_logprobs = 2;
  auto rec = f.submit(prompt, p);
  ASSERT_TRUE(rec->wait());
  const auto outputs = rec->outputs();
  ASSERT_EQ(outputs.size(), 6u);
  // Prompt logprobs: once, with the first output; entry i from the logits after prompt[0, i).
  ASSERT_EQ(outputs[0].prompt_logprobs.size(), prompt.size());
  EXPECT_FALSE(outputs[0].prompt_logprobs[0].has_value());
  for (size_t i = 1; i < prompt.size(); ++i) {
    ASSERT_TRUE(outputs[0].prompt_logprobs[i].has_value()) << i;
    const auto logits = testing::reference_logits(std::span(prompt).first(i), kVocab);
    const TokenLogprob want = compute_logprobs(logits, prompt[i], 2);
    const TokenLogprob& got = *outputs[0].prompt_logprobs[i];
    EXPECT_EQ(got.token, prompt[i]);
    EXPECT_FLOAT_EQ(got.logprob, want.logprob) << i;
    EXPECT_EQ(got.top, want.top) << i;
  }
  for (size_t k = 1; k < outputs.size(); ++k) EXPECT_TRUE(outputs[k].prompt_logprobs.empty());
  // Sampled-token logprobs, each with 3 alternatives; greedy picks the top one.
  const Reference ref = f.reference(prompt, p);
  for (size_t k = 0; k < outputs.size(); ++k) {
    ASSERT_EQ(outputs[k].logprobs.size(), 1u);
    EXPECT_EQ(outputs[k].logprobs[0].token, ref.tokens[k]);
    EXPECT_FLOAT_EQ(outputs[k].logprobs[0].logprob, ref.logprobs[k].logprob);
    ASSERT_EQ(outputs[k].logprobs[0].top.size(), 3u);
    EXPECT_EQ(outputs[k].logprobs[0].top[0].first, ref.tokens[k]);
  }
}

TEST(Engine, CancelFreesBlocksAndSlotBeforeTheNextForward) {
  HashModel::Options o;
  o.forward_delay = std::chrono::microseconds(500);
  EngineFixture f(EngineFixture::small_config(), o);
  const auto pa = make_prompt(9, 1), pb = make_prompt(13, 2);
  // A's callback notes, at its final output (on the engine thread), the forwards run so far
  // and the engine's block and slot counts.
  auto a = Recorder::create();
  auto a_cb = a->callback();
  std::atomic<int64_t> forwards_at_final{-1};
  Engine::Stats at_final;
  std::vector<int32_t> b_tokens_at_final;
  auto b = Recorder::create();
  const uint64_t id_a = f.engine->submit(pa, greedy(100), [&, a_cb](const RequestOutput& out) {
    if (out.finish != FinishReason::None) {
      at_final = f.engine->stats();
      b_tokens_at_final = b->tokens();
      forwards_at_final = f.model->num_forwards();
    }
    a_cb(out);
  });
  f.engine->submit(pb, greedy(100), b->callback());
  ASSERT_TRUE(a->wait_tokens(3));
  ASSERT_TRUE(b->wait_tokens(3));
  f.engine->cancel(id_a, FinishReason::Stop);
  ASSERT_TRUE(a->wait());
  EXPECT_EQ(a->last().finish, FinishReason::Stop);
  EXPECT_TRUE(a->last().new_tokens.empty());
  EXPECT_LT(a->tokens().size(), 100u);
  EXPECT_EQ(a->last().num_generated_tokens, int(a->tokens().size()));
  // Freed already: only B's slot and B's blocks are in use.
  EXPECT_EQ(at_final.free_state_slots, at_final.total_state_slots - 1);
  EXPECT_EQ(at_final.running, 1);

  f.engine->cancel(id_a);    // again: ignored
  f.engine->cancel(987654);  // unknown: ignored
  ASSERT_TRUE(b->wait());
  EXPECT_EQ(b->tokens(), f.reference(pb, greedy(100)).tokens);
  // No forward after A's final output touched A's slot (the slot of its 9-token prefill).
  const auto steps = f.model->steps();
  int32_t slot_a = -1, slot_b = -1;
  for (const auto& st : steps)
    for (size_t i = 0; i < st.slots.size(); ++i) {
      if (st.start_pos[i] == 0 && st.prompt_len[i] == int64_t(pa.size())) slot_a = st.slots[i];
      if (st.start_pos[i] == 0 && st.prompt_len[i] == int64_t(pb.size())) slot_b = st.slots[i];
    }
  ASSERT_GE(slot_a, 0);
  ASSERT_GE(slot_b, 0);
  ASSERT_GT(forwards_at_final.load(), 0);
  // B's blocks at A's final output hold exactly the tokens B's forwards so far computed (all but its
  // latest sampled one). Counted from the forwards, not from B's outputs: a cancel that arrives during
  // a forward is delivered before that forward's tokens (engine.cpp, step), so B's recorder may not
  // have the token whose KV that forward wrote yet.
  int64_t b_kv_tokens = 0;
  for (size_t k = 0; k < size_t(forwards_at_final.load()); ++k)
    for (size_t i = 0; i < steps[k].slots.size(); ++i)
      if (steps[k].slots[i] == slot_b)
        b_kv_tokens = std::max(b_kv_tokens, steps[k].start_pos[i] + steps[k].num_tokens[i]);
  EXPECT_GE(b_kv_tokens, int64_t(pb.size() + b_tokens_at_final.size()) - 1);
  EXPECT_LE(b_kv_tokens, int64_t(pb.size() + b_tokens_at_final.size()));
  EXPECT_EQ(at_final.total_kv_blocks - at_final.free_kv_blocks, BlockManager::blocks_for_tokens(b_kv_tokens, 4));
  for (size_t k = size_t(forwards_at_final.load()); k < steps.size(); ++k) {
    EXPECT_EQ(std::count(steps[k].slots.begin(), steps[k].slots.end(), slot_a), 0) << "forward " << k;
  }
  f.expect_all_returned();
}

TEST(Engine, CancelledWaitingRequestsNeverRun) {
  EngineConfig c = EngineFixture::small_config();
  c.max_num_seqs = 1;
  c.num_state_slots_override = 1;
  EngineFixture f(c);
  // Forwards wait until the cancel is in: otherwise, on a slow machine, the first request can finish
  // its 60 tokens and the queued one start before cancel() is called.
  f.model->hold();
  auto first = f.submit(make_prompt(5, 1), greedy(60));
  uint64_t id = 0;
  auto queued = f.submit(make_prompt(5, 2), greedy(10), &id);
  f.engine->cancel(id);
  f.model->release();
  ASSERT_TRUE(queued->wait());
  EXPECT_EQ(queued->last().finish, FinishReason::Abort);
  EXPECT_TRUE(queued->tokens().empty());
  EXPECT_EQ(queued->last().num_generated_tokens, 0);
  ASSERT_TRUE(first->wait());
  EXPECT_EQ(f.model->num_resets(), 1);
  f.expect_all_returned();
}

TEST(Engine, PreemptionByRecomputeKeepsTheTokensExact) {
  EngineConfig c = EngineFixture::small_config();
  c.max_model_len = 64;
  c.num_kv_blocks_override = 20;  // 80 tokens for 8 sequences that want up to 60 each
  c.kv_admission_watermark = 0.0;
  EngineFixture f(c);
  std::vector<std::shared_ptr<Recorder>> recs;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 8; ++i) {
    SamplingParams p = greedy(40);
    if (i % 2) {
      p.temperature = 1.0;
      p.seed = uint64_t(i);
      p.frequency_penalty = 0.3;
    }
    params.push_back(p);
    recs.push_back(f.submit(make_prompt(10 + i, i), p));
  }
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(recs[size_t(i)]->wait());
    EXPECT_EQ(recs[size_t(i)]->tokens(), f.reference(make_prompt(10 + i, i), params[size_t(i)]).tokens) << i;
    EXPECT_EQ(recs[size_t(i)]->last().finish, FinishReason::Length);
  }
  EXPECT_GT(f.engine->stats().num_preemptions, 0);
  EXPECT_GT(f.model->num_resets(), 8) << "preempted sequences restart from a reset slot";
  f.expect_all_returned();
}

TEST(Engine, AdmissionIsFifoSoFirstTokensComeInArrivalOrder) {
  EngineConfig c = EngineFixture::small_config();
  c.max_model_len = 64;
  c.num_kv_blocks_override = 24;
  c.max_num_batched_tokens = 16;
  EngineFixture f(c);
  std::mutex m;
  std::vector<uint64_t> first_token_order;
  std::vector<std::shared_ptr<Recorder>> recs;
  for (int i = 0; i < 30; ++i) {
    auto rec = Recorder::create();
    auto cb = rec->callback();
    const int len = 2 + (i * 11) % 30;
    const uint64_t order = uint64_t(i);
    auto seen_first = std::make_shared<bool>(false);
    f.engine->submit(make_prompt(len, i), greedy(8 + i % 5), [&, cb, order, seen_first](const RequestOutput& out) {
      if (!*seen_first && !out.new_tokens.empty()) {
        *seen_first = true;
        std::lock_guard lock(m);
        first_token_order.push_back(order);
      }
      cb(out);
    });
    recs.push_back(rec);
  }
  for (auto& r : recs) ASSERT_TRUE(r->wait());
  std::vector<uint64_t> sorted = first_token_order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(first_token_order, sorted);
  EXPECT_EQ(first_token_order.size(), 30u);
}

TEST(Engine, ABigRequestIsNotStarvedByAStreamOfSmallOnes) {
  EngineConfig c = EngineFixture::small_config();
  c.max_model_len = 96;
  c.num_kv_blocks_override = 26;  // the big request needs 23 of them, small ones 2-3
  c.kv_admission_watermark = 0.0;
  HashModel::Options o;
  o.forward_delay = std::chrono::microseconds(100);
  EngineFixture f(c, o);
  // Numbers the first token of each request as it arrives.
  std::atomic<int> first_token_counter{0};
  auto numbered = [&](std::shared_ptr<Recorder> rec, std::shared_ptr<std::atomic<int>> rank) {
    auto cb = rec->callback();
    return [&first_token_counter, cb, rank](const RequestOutput& out) {
      if (!out.new_tokens.empty() && rank->load() < 0) rank->store(first_token_counter++);
      cb(out);
    };
  };
  struct Small {
    std::shared_ptr<Recorder> rec;
    std::shared_ptr<std::atomic<int>> rank;
    bool after_big;
  };
  std::vector<Small> small;
  std::atomic<bool> stop{false}, big_submitted{false};
  std::thread stream([&] {
    for (int i = 0; !stop; ++i) {
      Small s{Recorder::create(), std::make_shared<std::atomic<int>>(-1), big_submitted.load()};
      f.engine->submit(make_prompt(4 + i % 6, i), greedy(6), numbered(s.rec, s.rank));
      small.push_back(s);
      std::this_thread::sleep_for(std::chrono::microseconds(150));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto big = Recorder::create();
  auto big_rank = std::make_shared<std::atomic<int>>(-1);
  f.engine->submit(make_prompt(40, 77), greedy(50), numbered(big, big_rank));
  big_submitted = true;
  const bool finished = big->wait(std::chrono::seconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  stop = true;
  stream.join();
  ASSERT_TRUE(finished) << "the big request starved";
  EXPECT_EQ(big->tokens(), f.reference(make_prompt(40, 77), greedy(50)).tokens);
  int after = 0;
  for (const Small& s : small) {
    ASSERT_TRUE(s.rec->wait());
    EXPECT_EQ(s.rec->tokens().size(), 6u);
    if (s.after_big) {
      ++after;
      EXPECT_GT(s.rank->load(), big_rank->load()) << "a later request overtook the big one";
    }
  }
  EXPECT_GE(after, 3) << "the stream kept coming while the big request ran";
  f.expect_all_returned();
}

TEST(Engine, AModelFailureAbortsItsStepAndTheEngineGoesOn) {
  HashModel::Options o;
  o.poison_token = 63;
  EngineFixture f(EngineFixture::small_config(), o);
  auto bad = f.submit({63, 5, 7}, greedy(5));
  ASSERT_TRUE(bad->wait());
  EXPECT_EQ(bad->last().finish, FinishReason::Abort);
  EXPECT_NE(bad->last().error.find("poison"), std::string::npos) << bad->last().error;
  f.expect_all_returned();
  auto good = f.submit(make_prompt(6, 1), greedy(5));
  ASSERT_TRUE(good->wait());
  EXPECT_EQ(good->tokens(), f.reference(make_prompt(6, 1), greedy(5)).tokens);
}

TEST(Engine, ASamplingFailureAbortsOnlyThatSequence) {
  HashModel::Options o;
  o.nan_token = 62;  // a sequence starting with 62 gets all-NaN logits
  EngineFixture f(EngineFixture::small_config(), o);
  std::vector<std::shared_ptr<Recorder>> good;
  for (int i = 0; i < 3; ++i) good.push_back(f.submit(make_prompt(6, i), greedy(20)));
  auto bad = f.submit({62, 1, 2}, greedy(5));
  ASSERT_TRUE(bad->wait());
  EXPECT_EQ(bad->last().finish, FinishReason::Abort);
  EXPECT_NE(bad->last().error.find("sampling failed"), std::string::npos) << bad->last().error;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(good[size_t(i)]->wait());
    EXPECT_EQ(good[size_t(i)]->last().finish, FinishReason::Length);
    EXPECT_EQ(good[size_t(i)]->tokens(), f.reference(make_prompt(6, i), greedy(20)).tokens);
  }
  f.expect_all_returned();
}

TEST(Engine, AThrowingCallbackAbortsItsRequestOnly) {
  EngineFixture f;
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto final_reason = std::make_shared<std::atomic<int>>(-1);
  f.engine->submit(make_prompt(4, 1), greedy(50), [calls, final_reason](const RequestOutput& out) {
    if (out.finish != FinishReason::None) {
      final_reason->store(int(out.finish));
      return;
    }
    if (++*calls == 2) throw std::runtime_error("client went away");
  });
  auto other = f.submit(make_prompt(4, 2), greedy(30));
  ASSERT_TRUE(other->wait());
  EXPECT_EQ(other->tokens().size(), 30u);
  f.expect_all_returned();
  EXPECT_EQ(final_reason->load(), int(FinishReason::Abort));
  EXPECT_LE(calls->load(), 3);
}

TEST(Engine, SubmitValidatesAndTheEngineKeepsServing) {
  EngineFixture f;
  EXPECT_THROW(f.engine->submit({}, greedy(4), nullptr), Error);
  EXPECT_THROW(f.engine->submit({1, 64}, greedy(4), nullptr), Error);
  EXPECT_THROW(f.engine->submit(make_prompt(100, 1), greedy(29), nullptr), Error);  // 129 > 128
  SamplingParams bad = greedy(4);
  bad.top_p = 0.0;
  EXPECT_THROW(f.engine->submit({1}, bad, nullptr), Error);
  auto ok = f.submit(make_prompt(100, 1), greedy(28));
  ASSERT_TRUE(ok->wait());
  EXPECT_EQ(ok->last().finish, FinishReason::Length);
  EXPECT_EQ(ok->tokens().size(), 28u);
}

TEST(Engine, RefusesToStartWhenOneFullSequenceDoesNotFit) {
  EngineConfig c;
  c.max_model_len = 4096;
  c.kv_cache_bytes = 1024 * 1000;  // 1024 blocks of 4 tokens hold 4096 tokens, but no slot
  HashModel::Options o;
  o.vocab = kVocab;
  try {
    Engine engine(std::make_unique<HashModel>(o), c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_model_len=4096"), std::string::npos) << e.what();
  }
  c.kv_cache_bytes = 1024 * 1000 + 3 * 5000;
  o.max_position_embeddings = 2048;
  try {
    Engine engine(std::make_unique<HashModel>(o), c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_position_embeddings 2048"), std::string::npos) << e.what();
  }
  o.max_position_embeddings = 4096;
  auto m = std::make_unique<HashModel>(o);
  HashModel* model = m.get();
  Engine engine(std::move(m), c);
  EXPECT_EQ(model->num_kv_blocks(), 1024);
  EXPECT_EQ(model->num_state_slots(), 3);
  EXPECT_EQ(engine.stats().total_state_slots, 3);
  EXPECT_EQ(engine.stats().kv_block_size, 4);
}

TEST(Engine, DrainFinishesEverythingAndRefusesNewWork) {
  EngineFixture f;
  std::vector<std::shared_ptr<Recorder>> recs;
  for (int i = 0; i < 12; ++i) recs.push_back(f.submit(make_prompt(5 + i, i), greedy(25)));
  f.engine->drain();
  for (auto& r : recs) {
    EXPECT_TRUE(r->done());
    EXPECT_EQ(r->last().finish, FinishReason::Length);
    EXPECT_EQ(r->tokens().size(), 25u);
  }
  EXPECT_THROW(f.engine->submit({1}, greedy(2), nullptr), EngineOverloaded);
  f.expect_all_returned();
}

TEST(Engine, DestructionAbortsWhatIsLeft) {
  std::vector<std::shared_ptr<Recorder>> recs;
  {
    HashModel::Options o;
    o.forward_delay = std::chrono::milliseconds(1);
    EngineFixture f(EngineFixture::small_config(), o);
    for (int i = 0; i < 12; ++i) recs.push_back(f.submit(make_prompt(5, i), greedy(100)));
    ASSERT_TRUE(recs[0]->wait_tokens(2));
  }
  int aborted = 0;
  for (auto& r : recs) {
    ASSERT_TRUE(r->done());
    EXPECT_EQ(r->outputs_after_final(), 0);
    if (r->last().finish == FinishReason::Abort) {
      ++aborted;
      EXPECT_LT(r->tokens().size(), 100u);
      EXPECT_EQ(r->last().error, "the engine was stopped");
    } else {
      EXPECT_EQ(r->tokens().size(), 100u);  // finished before the destructor ran
    }
  }
  EXPECT_GE(aborted, 4) << "12 requests of 100 steps at 1 ms a step, 8 at a time";
}

TEST(Engine, AFullWaitingQueueRefusesWithOverloaded) {
  EngineConfig c = EngineFixture::small_config();
  c.max_waiting_requests = 3;
  EngineFixture f(c);
  int refused = 0;
  std::vector<std::shared_ptr<Recorder>> recs;
  f.model->hold();
  for (int i = 0; i < 40; ++i) {
    try {
      recs.push_back(f.submit(make_prompt(3, i), greedy(60)));
    } catch (const EngineOverloaded& e) {
      EXPECT_NE(std::string(e.what()).find("too many requests"), std::string::npos);
      ++refused;
    }
  }
  f.model->release();
  // At most the 3 allowed to wait plus what the engine had taken in before its first forward.
  EXPECT_GE(refused, 40 - 3 - 8);
  for (auto& r : recs) ASSERT_TRUE(r->wait());
}

}  // namespace
}  // namespace moeserve::runtime
