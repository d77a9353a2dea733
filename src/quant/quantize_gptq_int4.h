// Round-to-nearest (RTN) symmetric INT4 quantisation into the GPTQ / AutoRound packing that
// published INT4 checkpoints use (../shared/spec/qwen35_arch.md 4.1; the tensor layout is the
// one quant/gptq_int4.h reads), with K = in_features, N = out_features, g = group size:
//
//   per group j (input features k in [j·g, (j+1)·g)) and output feature n:
//     amax     = max |W[n, k]| over the group
//     s[j, n]  = fp16(max(amax / 7.5, 1e-6))                       (stored in `scales`)
//     q[k, n]  = clamp(round_half_even(W[n, k] / float(s)) + 8, 0, 15)
//   dequantised: W'[n, k] = (q[k, n] − 8) · float(s[j, n])
//
// Dividing amax by 7.5 maps [−amax, amax] onto [−7.5, 7.5], so the 16 codes −8..7 are used
// symmetrically: both ends of the range round to the nearest code with at most half a step of
// error, like every value inside. The 1e-6 floor only matters for all-zero groups. This is the
// recipe of tests/fixtures/make_qwen35_fixtures.py (gptq_quantize with sym=True), so converting
// its quant_base_bf16 model reproduces its int4_autoround_sym tensors bit for bit.
//
// Symmetric weights have zero point 8 everywhere, stored as zero − 1 = 7 in every nibble of
// `qzeros` (GPTQ "v1"): every qzeros word is 0x77777777.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"

namespace moeserve::quant {

inline constexpr int32_t kGptqSymZerosWord = 0x77777777;
inline constexpr float kGptqSymRange = 7.5f;
inline constexpr float kGptqMinScale = 1e-6f;

// Throws a moeserve::Error naming `module` unless an [N, K] weight can be packed with group
// size g: g > 0, K % g == 0 (whole groups), K % 8 == 0 (qweight packs 8 codes along K) and
// N % 8 == 0 (qzeros packs 8 zero points along N).
void check_gptq_int4_shape(const std::string& module, int64_t N, int64_t K, int64_t group_size);

// Quantises one group. `w` holds W[:, k0 : k0 + g] as N rows of g floats (row n contiguous).
// Writes the group's g/8 rows of qweight ([g/8][N] int32, row-major) and its N fp16 scales
// (bit patterns). `module` and `k0` only name the place of a non-finite value in the error.
// Each output depends on its own row n only, so the result does not depend on `pool`.
void quantize_gptq_int4_group(const float* w, int64_t N, int64_t g, int32_t* qweight_rows, uint16_t* scales,
                              const std::string& module, int64_t k0, ThreadPool* pool = nullptr);

// A whole module quantised at once (tests and small weights; convert streams group by group).
struct GptqInt4Tensors {
  int64_t out_features = 0, in_features = 0, group_size = 0;
  std::vector<int32_t> qweight;  // [K/8, N]
  std::vector<int32_t> qzeros;   // [K/g, N/8], all kGptqSymZerosWord
  std::vector<uint16_t> scales;  // [K/g, N] fp16 bit patterns
};
GptqInt4Tensors quantize_gptq_int4(const float* W, int64_t N, int64_t K, int64_t group_size,
                                   const std::string& module, ThreadPool* pool = nullptr);

}  // namespace moeserve::quant
