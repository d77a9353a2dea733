#include "runtime/step_executor.h"

#include <algorithm>
#include <exception>

#include "core/error.h"

namespace moeserve::runtime {

StepExecutor::StepExecutor(model::CausalLM& model, std::vector<int64_t> eos_token_ids, int sampler_threads,
                           bool device_sampling)
    : model_(model), eos_token_ids_(std::move(eos_token_ids)), device_sampling_(device_sampling) {
  if (sampler_threads > 1) pool_ = std::make_unique<ThreadPool>(sampler_threads);
}

void StepExecutor::forward(const SchedulerOutput& plan) {
  for (int32_t slot : plan.slots_to_reset) model_.reset_state(slot);
  batch_.clear();
  batch_.reserve(plan.chunks.size());
  if (masked_.size() < plan.chunks.size()) masked_.resize(plan.chunks.size());
  const bool on_device = device_sampling_ && model_.supports_device_sampling();
  const int64_t vocab = model_.config().vocab_size;
  int64_t expected_rows = 0;
  last_device_sampled_ = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& chunk = plan.chunks[i];
    Sequence& seq = *chunk.seq;
    model::SeqStep step;
    step.tokens = std::span<const int32_t>(seq.tokens).subspan(size_t(chunk.start_pos), size_t(chunk.num_tokens));
    step.start_pos = chunk.start_pos;
    step.kv_blocks = seq.block_table;
    step.state_slot = seq.state_slot;
    step.all_logits = chunk.all_logits;
    step.prompt_len = seq.num_prompt_tokens;
    if (on_device && chunk.samples && !chunk.all_logits) {
      SampleInput in;
      in.params = &seq.params;
      in.history = &seq.history;
      in.num_generated = seq.num_generated();
      in.eos_token_ids = eos_token_ids_;
      in.rng = &seq.rng;
      step.device_sample = to_device_sample(in, vocab, masked_[i]);
      if (step.device_sample) ++last_device_sampled_;
    }
    batch_.push_back(step);
    expected_rows += step.device_sample ? 0 : chunk.all_logits ? chunk.num_tokens : 1;
  }
  logits_.logits.clear();
  logits_.first_row.clear();
  logits_.num_rows.clear();
  logits_.samples.clear();
  model_.forward(batch_, logits_);

  // The model is trusted with the math, not with the shape: check before reading.
  const size_t n = plan.chunks.size();
  MOESERVE_CHECK(logits_.vocab > 0, "model step returned vocab {}", logits_.vocab);
  MOESERVE_CHECK(logits_.first_row.size() == n && logits_.num_rows.size() == n,
                 "model step returned rows for {} sequences, {} were sent", logits_.first_row.size(), n);
  const auto total_rows = int64_t(logits_.logits.size()) / logits_.vocab;
  MOESERVE_CHECK(int64_t(logits_.logits.size()) == total_rows * logits_.vocab && total_rows >= expected_rows,
                 "model step returned {} logits for {} rows of {}", logits_.logits.size(), expected_rows,
                 logits_.vocab);
  for (size_t i = 0; i < n; ++i) {
    const int64_t want = batch_[i].device_sample ? 0 : plan.chunks[i].all_logits ? plan.chunks[i].num_tokens : 1;
    MOESERVE_CHECK(logits_.num_rows[i] == want && logits_.first_row[i] >= 0 &&
                       logits_.first_row[i] + want <= total_rows,
                   "model step returned rows [{}, +{}) for sequence {}, expected {} rows within {}",
                   logits_.first_row[i], logits_.num_rows[i], i, want, total_rows);
  }
  MOESERVE_CHECK(last_device_sampled_ == 0 || logits_.samples.size() == n,
                 "model step returned {} device samples for {} sequences", logits_.samples.size(), n);
}

SampleResult StepExecutor::device_result(const ScheduledChunk& chunk, size_t index) const {
  const model::DeviceSampleResult& d = logits_.samples[index];
  if (d.token < 0) fail("sampling: every token is masked");
  MOESERVE_CHECK(d.token < logits_.vocab, "model sampled token {} outside the vocabulary of {}", d.token,
                 logits_.vocab);
  SampleResult result;
  result.token = d.token;
  const int want = chunk.seq->params.logprobs;
  if (want >= 0) {
    MOESERVE_CHECK(int64_t(d.top.size()) == std::min<int64_t>(want, logits_.vocab),
                   "model returned {} top logprobs, {} were asked", d.top.size(), want);
    TokenLogprob lp;
    lp.token = d.token;
    lp.logprob = d.logprob;
    lp.top = d.top;
    result.logprob = std::move(lp);
  }
  return result;
}

ChunkResult StepExecutor::process_chunk(const ScheduledChunk& chunk, size_t index) {
  thread_local Sampler sampler;
  ChunkResult result;
  Sequence& seq = *chunk.seq;
  const int64_t vocab = logits_.vocab;
  auto row = [&](int64_t r) {
    return std::span<const float>(logits_.logits).subspan(size_t((logits_.first_row[index] + r) * vocab), size_t(vocab));
  };
  try {
    if (chunk.all_logits) {
      // Row r (position start + r) predicts the token at start + r + 1; the first prompt
      // token has no prediction.
      if (seq.prompt_logprobs.empty()) seq.prompt_logprobs.resize(size_t(seq.num_prompt_tokens));
      for (int r = 0; r < chunk.num_tokens; ++r) {
        const int64_t next = chunk.start_pos + r + 1;
        if (next >= seq.num_prompt_tokens) break;
        seq.prompt_logprobs[size_t(next)] = compute_logprobs(row(r), seq.tokens[size_t(next)], seq.params.prompt_logprobs);
      }
    }
    if (chunk.samples && batch_[index].device_sample) {
      result.sample = device_result(chunk, index);
    } else if (chunk.samples) {
      SampleInput in;
      in.logits = row(logits_.num_rows[index] - 1);
      in.params = &seq.params;
      in.history = &seq.history;
      in.num_generated = seq.num_generated();
      in.eos_token_ids = eos_token_ids_;
      in.rng = &seq.rng;
      in.constraint = seq.constraint.get();
      result.sample = sampler.sample(in);
      if (seq.constraint) seq.constraint->accept(result.sample->token, end_tokens(in));
    }
  } catch (const std::exception& e) {
    result.sample.reset();
    result.error = e.what();
  }
  return result;
}

std::vector<ChunkResult> StepExecutor::sample(const SchedulerOutput& plan) {
  std::vector<ChunkResult> results(plan.chunks.size());
  auto run_range = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) results[size_t(i)] = process_chunk(plan.chunks[size_t(i)], size_t(i));
  };
  if (pool_ && plan.chunks.size() > 1) {
    pool_->parallel_for(int64_t(plan.chunks.size()), run_range);
  } else {
    run_range(0, int64_t(plan.chunks.size()));
  }
  return results;
}

FinishReason finish_reason_after(const Sequence& seq, int32_t token, const std::vector<int64_t>& eos_token_ids,
                                 int max_model_len, std::optional<int32_t>* stop_token) {
  const SamplingParams& p = seq.params;
  // num_generated() already counts `token`; stopping is allowed once min_tokens came before it.
  const bool may_stop = seq.num_generated() - 1 >= p.min_tokens;
  const bool is_eos = !p.ignore_eos && std::find(eos_token_ids.begin(), eos_token_ids.end(), int64_t(token)) !=
                                           eos_token_ids.end();
  const bool is_stop = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
  if (may_stop && (is_eos || is_stop)) {
    if (stop_token) *stop_token = token;
    return FinishReason::Stop;
  }
  if (seq.num_generated() >= p.max_tokens || int64_t(seq.tokens.size()) >= max_model_len) return FinishReason::Length;
  return FinishReason::None;
}

}  // namespace moeserve::runtime
