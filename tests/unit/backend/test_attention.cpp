// Paged causal attention against a dense double-precision reference with GQA.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "backend/cpu/attention.h"
#include "test_util.h"

namespace moeserve::cpu {
namespace {
using testing::random_vector;
using testing::rel_diff;

// o[t][h] = softmax_p≤t(q[t][h]·k[p][h/g] · scale) v[p][h/g], all positions 0..T-1.
std::vector<double> dense_reference(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, int64_t T, int64_t nq, int64_t nkv,
                                    int64_t hd, double scale) {
  std::vector<double> out(size_t(T * nq * hd), 0.0);
  const int64_t g = nq / nkv;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nq; ++h) {
      std::vector<double> s(size_t(t + 1));
      for (int64_t p = 0; p <= t; ++p) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i)
          d += double(q[size_t((t * nq + h) * hd + i)]) * k[size_t((p * nkv + h / g) * hd + i)];
        s[size_t(p)] = d * scale;
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double den = 0;
      for (auto& x : s) den += x = std::exp(x - mx);
      for (int64_t p = 0; p <= t; ++p)
        for (int64_t i = 0; i < hd; ++i)
          out[size_t((t * nq + h) * hd + i)] += s[size_t(p)] / den * v[size_t((p * nkv + h / g) * hd + i)];
    }
  return out;
}

TEST(CpuAttention, PagedChunksMatchDenseCausalAttentionWithGqa) {
  const int64_t T = 45, nq = 6, nkv = 2, hd = 12, bs = 4;
  const int64_t blocks_needed = (T + bs - 1) / bs;
  auto q = random_vector(size_t(T * nq * hd), 1), k = random_vector(size_t(T * nkv * hd), 2),
       v = random_vector(size_t(T * nkv * hd), 3);
  const double scale = 1.0 / std::sqrt(double(hd));
  const auto ref = dense_reference(q, k, v, T, nq, nkv, hd, scale);

  // A shuffled block table inside a larger pool.
  std::vector<int32_t> table(20);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  table.resize(size_t(blocks_needed));
  ThreadPool pool(3);
  PagedKvCache cache({nkv, hd, bs}, 20);
  std::vector<float> out(size_t(T * nq * hd));
  // Fill in uneven chunks (a prefill chunk, decode steps, another chunk).
  for (auto [s0, s1] : {std::pair<int64_t, int64_t>{0, 17}, {17, 18}, {18, 19}, {19, 45}}) {
    cache.write(table, s0, s1 - s0, k.data() + s0 * nkv * hd, v.data() + s0 * nkv * hd);
    const AttentionChunk c{q.data() + s0 * nq * hd, out.data() + s0 * nq * hd, s1 - s0, s0, table};
    paged_attention(pool, cache, nq, float(scale), std::span(&c, 1));
  }
  EXPECT_LT(rel_diff(out, ref), 1e-5);
}

TEST(CpuPagedKvCache, StartsZeroedAndStoresWritesInTheirBlocks) {
  const int64_t nkv = 2, hd = 8, bs = 4, blocks = 300;
  PagedKvCache cache({nkv, hd, bs}, blocks);
  for (int32_t b = 0; b < blocks; ++b)
    for (int64_t h = 0; h < nkv; ++h)
      for (int64_t s = 0; s < bs; ++s)
        for (int64_t i = 0; i < hd; ++i) {
          ASSERT_EQ(cache.key(b, h, s)[i], 0.0f) << b << " " << h << " " << s << " " << i;
          ASSERT_EQ(cache.value(b, h, s)[i], 0.0f) << b << " " << h << " " << s << " " << i;
        }
  // Six positions over blocks 7 and 299 (the last one).
  const int64_t T = 6;
  std::vector<float> k(size_t(T * nkv * hd)), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) k[i] = float(i) + 1.0f, v[i] = -float(i) - 1.0f;
  const std::vector<int32_t> table = {7, 299};
  cache.write(table, 0, T, k.data(), v.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nkv; ++h)
      for (int64_t i = 0; i < hd; ++i) {
        const int32_t b = table[size_t(t / bs)];
        EXPECT_EQ(cache.key(b, h, t % bs)[i], k[size_t((t * nkv + h) * hd + i)]);
        EXPECT_EQ(cache.value(b, h, t % bs)[i], v[size_t((t * nkv + h) * hd + i)]);
      }
  EXPECT_EQ(cache.key(8, 0, 0)[0], 0.0f);
  EXPECT_EQ(cache.value(299, nkv - 1, bs - 1)[hd - 1], 0.0f);  // slot 3 of block 299 is unwritten
}

TEST(CpuAttention, RejectsShortOrOutOfRangeBlockTables) {
  PagedKvCache cache({1, 4, 4}, 3);
  std::vector<float> kv(4 * 5);
  const std::vector<int32_t> short_table = {0};
  EXPECT_THROW(cache.write(short_table, 0, 5, kv.data(), kv.data()), Error);
  const std::vector<int32_t> bad_table = {0, 3};
  EXPECT_THROW(cache.write(bad_table, 0, 5, kv.data(), kv.data()), Error);
}

}  // namespace
}  // namespace moeserve::cpu
