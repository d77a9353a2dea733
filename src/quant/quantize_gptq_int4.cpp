#include "quant/quantize_gptq_int4.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"

namespace moeserve::quant {

void check_gptq_int4_shape(const std::string& module, int64_t N, int64_t K, int64_t group_size) {
  MOESERVE_CHECK(group_size > 0, "module '{}': INT4 group size must be positive, got {}", module, group_size);
  MOESERVE_CHECK(K % group_size == 0,
                 "module '{}': in_features K = {} is not divisible by the group size {} (choose a group size "
                 "that divides every quantised module's K, or leave this module out)",
                 module, K, group_size);
  MOESERVE_CHECK(K % 8 == 0, "module '{}': in_features K = {} is not a multiple of 8 (qweight packs 8 codes along K)",
                 module, K);
  MOESERVE_CHECK(N % 8 == 0,
                 "module '{}': out_features N = {} is not a multiple of 8 (qzeros packs 8 zero points along N)",
                 module, N);
}

void quantize_gptq_int4_group(const float* w, int64_t N, int64_t g, int32_t* qweight_rows, uint16_t* scales,
                              const std::string& module, int64_t k0, ThreadPool* pool) {
  MOESERVE_CHECK(g > 0 && g % 8 == 0, "module '{}': INT4 group of {} columns is not a positive multiple of 8",
                 module, g);
  auto rows = [&](int64_t n_begin, int64_t n_end) {
    for (int64_t n = n_begin; n < n_end; ++n) {
      const float* row = w + n * g;
      float amax = 0.0f;
      for (int64_t i = 0; i < g; ++i) {
        if (!std::isfinite(row[i]))
          fail("module '{}': weight [{}, {}] is {}; cannot quantise a non-finite value", module, n, k0 + i, row[i]);
        amax = std::max(amax, std::fabs(row[i]));
      }
      const uint16_t s16 = f32_to_f16(std::max(amax / kGptqSymRange, kGptqMinScale));
      const float s = f16_to_f32(s16);
      scales[n] = s16;
      // Eight consecutive k share one word of qweight row (k - k0) / 8, low nibble first.
      for (int64_t word = 0; word < g / 8; ++word) {
        uint32_t packed = 0;
        for (int j = 0; j < 8; ++j) {
          const float r = std::nearbyint(row[word * 8 + j] / s);  // ties to even (default rounding mode)
          const int q = int(std::clamp(r + 8.0f, 0.0f, 15.0f));
          packed |= uint32_t(q) << (4 * j);
        }
        qweight_rows[word * N + n] = int32_t(packed);
      }
    }
  };
  if (pool)
    pool->parallel_for(N, rows, 64);
  else
    rows(0, N);
}

GptqInt4Tensors quantize_gptq_int4(const float* W, int64_t N, int64_t K, int64_t group_size,
                                   const std::string& module, ThreadPool* pool) {
  check_gptq_int4_shape(module, N, K, group_size);
  const int64_t groups = K / group_size;
  GptqInt4Tensors t;
  t.out_features = N;
  t.in_features = K;
  t.group_size = group_size;
  t.qweight.resize(size_t(K / 8 * N));
  t.qzeros.assign(size_t(groups * N / 8), kGptqSymZerosWord);
  t.scales.resize(size_t(groups * N));
  std::vector<float> slab(size_t(N * group_size));
  for (int64_t j = 0; j < groups; ++j) {
    for (int64_t n = 0; n < N; ++n)
      std::copy_n(W + n * K + j * group_size, group_size, slab.data() + n * group_size);
    quantize_gptq_int4_group(slab.data(), N, group_size, t.qweight.data() + j * (group_size / 8) * N,
                             t.scales.data() + j * N, module, j * group_size, pool);
  }
  return t;
}

}  // namespace moeserve::quant
