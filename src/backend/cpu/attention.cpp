#include "backend/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/linear.h"
#include "core/error.h"

namespace moeserve::cpu {

namespace {

void attend_one(const PagedKvCache& cache, const AttentionChunk& c, int64_t t, int64_t head, int64_t kv_head,
                int64_t num_q_heads, float scale, std::vector<float>& scores) {
  const auto& g = cache.geometry();
  const int64_t hd = g.head_dim, bs = g.block_size;
  const int64_t len = c.start_pos + t + 1;  // causal: positions [0, len)
  const float* q = c.q + (t * num_q_heads + head) * hd;
  float* out = c.out + (t * num_q_heads + head) * hd;

  scores.resize(size_t(len));
  float max_score = -INFINITY;
  for (int64_t p = 0; p < len; ++p) {
    const float s = dot(q, cache.key(c.block_table[size_t(p / bs)], kv_head, p % bs), hd) * scale;
    scores[size_t(p)] = s;
    max_score = std::max(max_score, s);
  }
  float denom = 0.0f;
  for (int64_t p = 0; p < len; ++p) {
    scores[size_t(p)] = std::exp(scores[size_t(p)] - max_score);
    denom += scores[size_t(p)];
  }
  std::fill(out, out + hd, 0.0f);
  for (int64_t p = 0; p < len; ++p) {
    const float w = scores[size_t(p)] / denom;
    const float* v = cache.value(c.block_table[size_t(p / bs)], kv_head, p % bs);
    for (int64_t d = 0; d < hd; ++d) out[d] += w * v[d];
  }
}

}  // namespace

void paged_attention(ThreadPool& pool, const PagedKvCache& cache, int64_t num_q_heads, float scale,
                     std::span<const AttentionChunk> chunks) {
  const int64_t nkv = cache.geometry().num_kv_heads;
  MOESERVE_CHECK(num_q_heads > 0 && num_q_heads % nkv == 0,
                 "attention: {} query heads are not a multiple of {} KV heads", num_q_heads, nkv);
  const int64_t group = num_q_heads / nkv;
  // Work items (chunk, token, head), flattened in that order.
  std::vector<int64_t> first_item(chunks.size() + 1, 0);
  for (size_t i = 0; i < chunks.size(); ++i) {
    cache.check_block_table(chunks[i].block_table, chunks[i].start_pos + chunks[i].num_tokens);
    first_item[i + 1] = first_item[i] + chunks[i].num_tokens * num_q_heads;
  }
  pool.parallel_for(first_item.back(), [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> scores;
    size_t c = size_t(std::upper_bound(first_item.begin(), first_item.end(), i0) - first_item.begin()) - 1;
    for (int64_t i = i0; i < i1; ++i) {
      while (i >= first_item[c + 1]) ++c;
      const int64_t local = i - first_item[c];
      const int64_t t = local / num_q_heads, head = local % num_q_heads;
      attend_one(cache, chunks[c], t, head, head / group, num_q_heads, scale, scores);
    }
  });
}

}  // namespace moeserve::cpu
