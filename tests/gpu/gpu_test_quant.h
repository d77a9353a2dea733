// Synthetic Linear weights in every stored format for the GPU op tests, packed here from
// the published layouts (spec /work/shared/spec/qwen35_arch.md section 4, docs/CUDA_BACKEND.md)
// together with their exact fp32 dequantisation computed by the published formula. The CPU
// reference multiplies by that dequantised matrix (a Dense F32 QuantWeight), so the tests
// do not depend on which formats src/quant can dequantise yet.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "quant/quant_weight.h"

namespace moeserve::gputest {

struct TestWeight {
  quant::QuantWeight weight;   // as a checkpoint stores it
  std::vector<float> dequant;  // W [N, K] in fp32, exactly
  std::string label;           // format and parameters, for messages
};

// Dense BF16 [N, K] with values ~ N(0, scale²).
TestWeight make_dense_bf16(Rng& rng, int64_t N, int64_t K, float scale);

// GPTQ/AutoRound INT4: qweight [K/8, N] i32 (nibble j of word (kp, n) = q[8kp + j][n], low
// nibble first), scales f16 [K/g, N], qzeros [K/g, N/8] i32 holding zero − 1 (GPTQ v1;
// symmetric: zero 8, stored 7), optional g_idx [K] (act-order: a random permutation of the
// group assignment, every group keeps g rows). W[n, k] = (q − zero) · scale, in fp32.
// Needs K % 8 == 0, K % group == 0, N % 8 == 0.
TestWeight make_gptq(Rng& rng, int64_t N, int64_t K, int64_t group, bool sym, bool act_order, float scale);

// FP8 block-128: e4m3 weight [N, K] quantised per 128×128 block from N(0, scale²) values,
// weight_scale_inv [ceil(N/128), ceil(K/128)] (F32, or BF16 when bf16_scales) = amax / 448;
// W = fp8 · s. Partial edge blocks when N or K is not a multiple of 128.
TestWeight make_fp8_block(Rng& rng, int64_t N, int64_t K, float scale, bool bf16_scales);

// INT8 row-wise: weight I8 [N, K], row_scales F32 [N]; W = q · s[n].
TestWeight make_int8_rowwise(Rng& rng, int64_t N, int64_t K, float scale);

// A Dense F32 QuantWeight over a copy of w [N, K] (the CPU reference's weight).
quant::QuantWeight dense_f32(const std::vector<float>& w, int64_t N, int64_t K, const std::string& name);

// Elementwise |v| (for the absolute-term sums that bound reduction errors).
std::vector<float> abs_values(const std::vector<float>& v);

}  // namespace moeserve::gputest
