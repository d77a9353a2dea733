#include "model/step_rows.h"

#include "backend/cpu/linear.h"
#include "backend/cpu/norms.h"

namespace moeserve::model {

void StepRows::add(int64_t n, int64_t start_pos, std::span<const int32_t> kv_blocks, int32_t state_slot) {
  seqs.push_back({rows, n, start_pos, kv_blocks, state_slot});
  for (int64_t t = 0; t < n; ++t) positions.push_back(start_pos + t);
  rows += n;
}

void embed_rows(ThreadPool& pool, const quant::QuantWeight& embed, std::span<const int32_t> tokens, float* out) {
  const int64_t H = embed.in_features;
  pool.parallel_for(int64_t(tokens.size()), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) embed.dequantize_rows(tokens[size_t(i)], tokens[size_t(i)] + 1, out + i * H);
  }, 16);
}

std::vector<int64_t> select_output_rows(const StepRows& rows, std::span<const uint8_t> all_logits,
                                        std::vector<int64_t>& first_row, std::vector<int64_t>& num_rows) {
  std::vector<int64_t> selected;
  first_row.clear();
  num_rows.clear();
  for (size_t i = 0; i < rows.seqs.size(); ++i) {
    const SeqRows& s = rows.seqs[i];
    first_row.push_back(int64_t(selected.size()));
    const int64_t begin = all_logits[i] ? s.first_row : s.first_row + s.num_tokens - 1;
    for (int64_t r = begin; r < s.first_row + s.num_tokens; ++r) selected.push_back(r);
    num_rows.push_back(int64_t(selected.size()) - first_row.back());
  }
  return selected;
}

void norm_and_project(ThreadPool& pool, const float* h, int64_t hidden, std::span<const int64_t> rows,
                      const std::vector<float>& norm_weight, float eps, const quant::QuantWeight& lm_head,
                      std::vector<float>& normed, std::vector<float>& logits) {
  const int64_t n = int64_t(rows.size());
  normed.resize(size_t(n * hidden));
  pool.parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      cpu::rms_norm_zero_centred(h + rows[size_t(i)] * hidden, normed.data() + i * hidden, hidden,
                                 norm_weight.data(), eps);
  }, 16);
  logits.resize(size_t(n * lm_head.out_features));
  cpu::linear(pool, normed.data(), n, lm_head, logits.data());
}

}  // namespace moeserve::model
