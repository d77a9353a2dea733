// Row bookkeeping shared by the main model and the MTP block: which rows of a step belong
// to which sequence, the position of every row, the token-embedding lookup, and the final
// norm + lm_head over the rows that need logits.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "model/qwen35_layers.h"
#include "quant/quant_weight.h"

namespace moeserve::model {

struct StepRows {
  std::vector<SeqRows> seqs;
  std::vector<int64_t> positions;  // per row
  int64_t rows = 0;

  // Appends a sequence of n rows starting at position start_pos.
  void add(int64_t n, int64_t start_pos, std::span<const int32_t> kv_blocks, int32_t state_slot);
};

// out[i, :] = embed[tokens[i], :] (a plain lookup, no scaling; section 2.2).
void embed_rows(ThreadPool& pool, const quant::QuantWeight& embed, std::span<const int32_t> tokens, float* out);

// The rows whose logits a step returns: every row of a sequence with all_logits, else its
// last row. Fills first_row / num_rows per sequence and returns the selected row indices.
std::vector<int64_t> select_output_rows(const StepRows& rows, std::span<const uint8_t> all_logits,
                                        std::vector<int64_t>& first_row, std::vector<int64_t>& num_rows);

// normed[i] = RMSNorm(h[rows[i]]) with (1 + w); logits = lm_head · normed.
void norm_and_project(ThreadPool& pool, const float* h, int64_t hidden, std::span<const int64_t> rows,
                      const std::vector<float>& norm_weight, float eps, const quant::QuantWeight& lm_head,
                      std::vector<float>& normed, std::vector<float>& logits);

}  // namespace moeserve::model
