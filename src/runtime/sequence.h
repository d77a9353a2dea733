// One request inside the engine: its tokens, where its caches are, and its sampling state.
// Owned by the engine; the scheduler moves pointers between its queues.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/request_output.h"
#include "runtime/rng.h"
#include "runtime/sampling_params.h"
#include "runtime/token_history.h"

namespace moeserve::runtime {

enum class SeqStatus { Waiting, Running, Finished };

struct Sequence {
  uint64_t id = 0;                  // also the arrival order: ids grow with submission
  std::vector<int32_t> tokens;      // prompt + generated
  int num_prompt_tokens = 0;
  SamplingParams params;
  OutputCallback callback;
  Rng rng;
  TokenHistory history;
  std::unique_ptr<TokenConstraint> constraint;  // from params.constraint; null without one

  SeqStatus status = SeqStatus::Waiting;
  // Tokens whose K/V and GDN state are in the caches. A step computes a chunk starting here;
  // when the chunk reaches the end of `tokens`, the next token is sampled. Preemption resets
  // it to 0, so the sequence re-prefills prompt + generated tokens.
  int64_t num_computed = 0;
  std::vector<int32_t> block_table; // KV blocks covering [0, num_computed + scheduled chunk)
  int32_t state_slot = -1;          // held while Running

  bool admitted_once = false;
  bool first_output_sent = false;
  int num_preemptions = 0;
  // Filled while prefilling when params.prompt_logprobs >= 0; sent with the first output.
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;

  int num_generated() const { return int(tokens.size()) - num_prompt_tokens; }
  int64_t num_uncomputed() const { return int64_t(tokens.size()) - num_computed; }
  bool wants_prompt_logprobs() const { return params.prompt_logprobs >= 0 && !first_output_sent; }
};

}  // namespace moeserve::runtime
