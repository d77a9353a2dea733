// Runs a single sequence through a CausalLM: chunked prefill, then token-by-token decode.
// For tools and tests (`moeserve score`, `moeserve generate`); the server batches many
// sequences through the runtime's engine instead.
#pragma once
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "model/causal_lm.h"

namespace moeserve::model {

class SequenceRunner {
 public:
  // (Re)allocates the model's caches for one sequence of up to max_tokens tokens.
  SequenceRunner(CausalLM& model, int64_t max_tokens);

  // Appends tokens in chunks of at most chunk_size. Returns the logits of every appended
  // token ([n, vocab]) when all_logits, else of the last one ([vocab]). When hidden is not
  // null it receives the post-final-norm hidden of every appended token ([n, hidden_size]).
  std::vector<float> append(std::span<const int32_t> tokens, int64_t chunk_size, bool all_logits,
                            std::vector<float>* hidden = nullptr);

  // Positions below n are prompt tokens, the rest generated ones (SeqStep::prompt_len); until
  // called, every token counts as a prompt token.
  void set_prompt_length(int64_t n) { prompt_len_ = n; }

  int64_t length() const { return length_; }
  int64_t max_tokens() const { return max_tokens_; }
  std::span<const int32_t> block_table() const { return blocks_; }

 private:
  CausalLM& model_;
  int64_t max_tokens_;
  int64_t length_ = 0;
  int64_t prompt_len_ = std::numeric_limits<int64_t>::max();
  std::vector<int32_t> blocks_;
  StepOutput out_;
};

}  // namespace moeserve::model
