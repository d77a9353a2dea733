// FP8 (E4M3) block quantisation into the layout of Qwen's official FP8 releases
// (../shared/spec/qwen35_arch.md 4.2; the layout is the one quant/fp8_block.h reads), with
// W [N, K] cut into 128 x 128 blocks (edge blocks partial):
//
//   s[i, j]  = amax(|W| over block (i, j)) / 448          (F32 `weight_scale_inv`; 1 for an
//                                                         all-zero block)
//   q[n, k]  = e4m3(W[n, k] / s[n/128, k/128])             round to nearest even, saturating at
//                                                         ±448 (as core's f32_to_fp8_e4m3)
//   dequantised: W'[n, k] = float(q[n, k]) · s[n/128, k/128]
//
// 448 is the largest finite E4M3FN value, so each block's largest magnitude lands on the top
// of the FP8 range. The scale is stored in F32, exactly the value the quantiser divided by, so
// dequantisation gives back precisely what was intended (Qwen's releases store BF16; readers
// accept both).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"

namespace moeserve::quant {

inline constexpr int64_t kFp8BlockEdge = 128;
inline constexpr float kFp8E4M3Max = 448.0f;

// float -> E4M3FN code, round to nearest even, saturating at ±448 (NaN -> 0x7f): the same
// result as core's f32_to_fp8_e4m3 (the definition, which searches all codes), computed from
// the float's bits so that quantising a 100 GB checkpoint takes minutes, not days.
uint8_t round_to_fp8_e4m3(float f);

// Scale grid rows/cols of an [N, K] weight: ceil(N/128), ceil(K/128).
inline int64_t fp8_block_count(int64_t features) { return (features + kFp8BlockEdge - 1) / kFp8BlockEdge; }

// Quantises one row of blocks. `w` holds W[r0 : r0 + rows, :] as `rows` rows of K floats
// (rows <= 128; only the last block row of a weight may be shorter). Writes the E4M3 codes
// ([rows][K], row-major) and the block row's ceil(K/128) scales. `module` and `r0` only name the
// place of a non-finite value in the error. Independent of `pool`.
void quantize_fp8_block_rows(const float* w, int64_t rows, int64_t K, uint8_t* codes, float* scales,
                             const std::string& module, int64_t r0, ThreadPool* pool = nullptr);

// A whole module quantised at once (tests and small weights; convert streams block rows).
struct Fp8BlockTensors {
  int64_t out_features = 0, in_features = 0;
  std::vector<uint8_t> weight;         // [N, K] E4M3 codes
  std::vector<float> weight_scale_inv; // [ceil(N/128), ceil(K/128)]
};
Fp8BlockTensors quantize_fp8_block(const float* W, int64_t N, int64_t K, const std::string& module,
                                   ThreadPool* pool = nullptr);

}  // namespace moeserve::quant
