#include "quant/quantize_fp8_block.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace moeserve::quant {

uint8_t round_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a >= kFp8E4M3Max) return sign | 0x7e;  // the largest finite value
  if (a < 0.015625f) {
    // Below 2^-6 the codes are the subnormals m · 2^-9 (m = 0..7), and 8 · 2^-9 is code 0x08,
    // the smallest normal: round a · 2^9 (exact in fp32) to the nearest integer, ties to even.
    return sign | uint8_t(std::nearbyint(a * 512.0f));
  }
  // Normal: keep 3 of fp32's 23 mantissa bits, rounding the 20 dropped bits to nearest even (a
  // carry into the exponent is the correct next binade). a < 448 never rounds past 448 = 0x7e.
  uint32_t u;
  std::memcpy(&u, &a, 4);
  u += 0x7ffffu + ((u >> 20) & 1u);
  const uint32_t exponent = (u >> 23) - 127 + 7, mantissa = (u >> 20) & 7u;
  return sign | uint8_t((exponent << 3) | mantissa);
}

void quantize_fp8_block_rows(const float* w, int64_t rows, int64_t K, uint8_t* codes, float* scales,
                             const std::string& module, int64_t r0, ThreadPool* pool) {
  MOESERVE_CHECK(rows > 0 && rows <= kFp8BlockEdge && K > 0,
                 "module '{}': an FP8 block row must have 1 to {} rows and K > 0 (got {} x {})", module,
                 kFp8BlockEdge, rows, K);
  const int64_t col_blocks = fp8_block_count(K);
  // One column block per task: its amax, then its codes (outputs depend on the block only).
  auto blocks = [&](int64_t b_begin, int64_t b_end) {
    for (int64_t b = b_begin; b < b_end; ++b) {
      const int64_t k_begin = b * kFp8BlockEdge, k_end = std::min(K, k_begin + kFp8BlockEdge);
      float amax = 0.0f;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = k_begin; k < k_end; ++k) {
          const float v = w[r * K + k];
          if (!std::isfinite(v))
            fail("module '{}': weight [{}, {}] is {}; cannot quantise a non-finite value", module, r0 + r, k, v);
          amax = std::max(amax, std::fabs(v));
        }
      const float s = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
      scales[b] = s;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = k_begin; k < k_end; ++k) codes[r * K + k] = round_to_fp8_e4m3(w[r * K + k] / s);
    }
  };
  if (pool)
    pool->parallel_for(col_blocks, blocks);
  else
    blocks(0, col_blocks);
}

Fp8BlockTensors quantize_fp8_block(const float* W, int64_t N, int64_t K, const std::string& module,
                                   ThreadPool* pool) {
  MOESERVE_CHECK(N > 0 && K > 0, "module '{}': cannot quantise an empty [{}, {}] weight", module, N, K);
  Fp8BlockTensors t;
  t.out_features = N;
  t.in_features = K;
  t.weight.resize(size_t(N * K));
  const int64_t col_blocks = fp8_block_count(K);
  t.weight_scale_inv.resize(size_t(fp8_block_count(N) * col_blocks));
  for (int64_t r0 = 0, i = 0; r0 < N; r0 += kFp8BlockEdge, ++i) {
    const int64_t rows = std::min(kFp8BlockEdge, N - r0);
    quantize_fp8_block_rows(W + r0 * K, rows, K, t.weight.data() + r0 * K, t.weight_scale_inv.data() + i * col_blocks,
                            module, r0, pool);
  }
  return t;
}

}  // namespace moeserve::quant
