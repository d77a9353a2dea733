// Runs one scheduled step on the model and turns its logits into per-sequence results:
// prompt logprobs for chunks that asked for every row, and the next token for chunks that
// reached the end of their sequence. Sequences are sampled in parallel (each with its own
// RNG, so the result does not depend on the thread count or the batch).
//
// When the model supports_device_sampling(), a chunk that samples and whose request needs
// no host-only processing (runtime::to_device_sample: no penalties, no logit_bias, no
// structured-output constraint, at most 20 logprobs, no prompt logprobs in this chunk) is
// sampled by the model itself: its uniform is drawn from the request's RNG before the
// forward, and only the token comes back.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/causal_lm.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"

namespace moeserve::runtime {

struct ChunkResult {
  std::optional<SampleResult> sample;  // when the chunk samples and nothing failed
  std::string error;                   // non-empty: this sequence failed (its other fields are unset)
};

class StepExecutor {
 public:
  // device_sampling false keeps every row on the host even when the model could sample it.
  StepExecutor(model::CausalLM& model, std::vector<int64_t> eos_token_ids, int sampler_threads,
               bool device_sampling = true);

  // Resets the new sequences' state slots and runs the forward. Throws when the model fails
  // or returns logits of the wrong shape; every sequence in the step is then suspect.
  void forward(const SchedulerOutput& plan);
  // Fills seq->prompt_logprobs and samples; one result per chunk, in plan order. A failure
  // confined to one sequence (e.g. all its tokens masked) is reported in its result.
  std::vector<ChunkResult> sample(const SchedulerOutput& plan);

  // Chunks of the last forward() that the model sampled on its device.
  int64_t last_device_sampled() const { return last_device_sampled_; }

 private:
  ChunkResult process_chunk(const ScheduledChunk& chunk, size_t index);
  SampleResult device_result(const ScheduledChunk& chunk, size_t index) const;

  model::CausalLM& model_;
  std::vector<int64_t> eos_token_ids_;
  std::unique_ptr<ThreadPool> pool_;  // null: sample on the calling thread
  bool device_sampling_;
  std::vector<model::SeqStep> batch_;
  std::vector<std::vector<int32_t>> masked_;  // per chunk: the tokens its device_sample masks
  int64_t last_device_sampled_ = 0;
  model::StepOutput logits_;
};

// Why a sequence ends after `token` was appended to it, or None. Sets *stop_token when the
// token itself stopped it.
FinishReason finish_reason_after(const Sequence& seq, int32_t token, const std::vector<int64_t>& eos_token_ids,
                                 int max_model_len, std::optional<int32_t>* stop_token);

}  // namespace moeserve::runtime
