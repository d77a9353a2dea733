#include "model/sequence_runner.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace moeserve::model {

SequenceRunner::SequenceRunner(CausalLM& model, int64_t max_tokens) : model_(model), max_tokens_(max_tokens) {
  MOESERVE_CHECK(max_tokens > 0, "a sequence needs room for at least one token, got {}", max_tokens);
  const int64_t block_size = model.cache_geometry().kv_block_size;
  const int64_t num_blocks = (max_tokens + block_size - 1) / block_size;
  MOESERVE_CHECK(num_blocks <= INT32_MAX, "{} tokens need too many KV blocks", max_tokens);
  model.allocate_caches(int(num_blocks), 1);
  model.reset_state(0);
  blocks_.resize(size_t(num_blocks));
  std::iota(blocks_.begin(), blocks_.end(), 0);
}

std::vector<float> SequenceRunner::append(std::span<const int32_t> tokens, int64_t chunk_size, bool all_logits,
                                          std::vector<float>* hidden) {
  MOESERVE_CHECK(chunk_size > 0, "chunk size must be positive, got {}", chunk_size);
  MOESERVE_CHECK(length_ + int64_t(tokens.size()) <= max_tokens_,
                 "sequence of {} tokens would exceed its room of {} tokens", length_ + int64_t(tokens.size()),
                 max_tokens_);
  std::vector<float> logits;
  if (hidden) hidden->clear();
  out_.want_hidden = hidden != nullptr;
  for (size_t begin = 0; begin < tokens.size(); begin += size_t(chunk_size)) {
    const size_t n = std::min(tokens.size() - begin, size_t(chunk_size));
    const bool last_chunk = begin + n == tokens.size();
    SeqStep step;
    step.tokens = tokens.subspan(begin, n);
    step.start_pos = length_;
    step.kv_blocks = blocks_;
    step.state_slot = 0;
    step.all_logits = all_logits;
    step.prompt_len = prompt_len_;
    model_.forward(std::span<const SeqStep>(&step, 1), out_);
    length_ += int64_t(n);
    if (all_logits || last_chunk) logits.insert(logits.end(), out_.logits.begin(), out_.logits.end());
    if (hidden) hidden->insert(hidden->end(), out_.hidden.begin(), out_.hidden.end());
  }
  return logits;
}

}  // namespace moeserve::model
