// INT8 row-wise: scale = max|w| / 127 per row, rounding half away from zero, all-zero rows,
// quantising from a quantised weight, stored_bytes and errors.
#include <cmath>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "quant/gptq_int4.h"
#include "quant/int8_rowwise.h"
#include "quant_test_util.h"
#include "test_packing.h"

namespace moeserve::quant {
namespace {
using ::testing::HasSubstr;

TEST(Int8Rowwise, ScaleIsRowMaxOver127AndHalvesRoundAwayFromZero) {
  // Row 0: amax 127 -> scale 1, so the codes are the values rounded (2.5 -> 3, -2.5 -> -3,
  // -0.5 -> -1; round-half-even would give 2, -2, 0). Row 1: all zeros. Row 2: amax 2.54.
  const std::vector<float> w = {127.0f, 2.5f, -2.5f, 3.5f, -0.5f, 0.4f,  //
                                0.0f,   0.0f, 0.0f,  0.0f, 0.0f,  0.0f,  //
                                -2.54f, 1.27f, 0.0f, 0.01f, 2.54f, -0.02f};
  const QuantWeight q = quantize_int8_rowwise(dense_weight(testing::f32_tensor({3, 6}, w), "lm_head"));
  EXPECT_EQ(q.format, WeightFormat::Int8Rowwise);
  EXPECT_EQ(q.name, "lm_head");
  const int8_t* codes = q.part("weight").data<int8_t>();
  const float* scales = q.part("row_scales").data<float>();
  EXPECT_EQ(std::vector<int8_t>(codes, codes + 6), (std::vector<int8_t>{127, 3, -3, 4, -1, 0}));
  EXPECT_EQ(scales[0], 1.0f);
  EXPECT_EQ(std::vector<int8_t>(codes + 6, codes + 12), std::vector<int8_t>(6, 0));
  EXPECT_EQ(scales[1], 1.0f);
  EXPECT_EQ(scales[2], 2.54f / 127.0f);
  EXPECT_EQ(codes[12], -127);
  EXPECT_EQ(codes[16], 127);
  EXPECT_EQ(codes[13], int8_t(std::round(1.27f / (2.54f / 127.0f))));
  // Dequantisation: code * scale.
  const std::vector<float> back = testing::dequantize_all(q);
  for (int i = 0; i < 18; ++i) EXPECT_EQ(back[size_t(i)], float(codes[i]) * scales[i / 6]) << i;
  EXPECT_EQ(q.stored_bytes(), size_t(3 * 6 + 3 * 4));
}

TEST(Int8Rowwise, QuantisesAnyFormatThroughItsDequantisationWithinHalfAStep) {
  std::mt19937 rng(9);
  const int64_t N = 16, K = 64;
  const std::vector<float> W = testing::random_weight(N, K, rng);
  const testing::Packed p = testing::pack_gptq_int4(W, N, K, 32, true, false, rng);
  const QuantWeight int4 = gptq_int4_weight("m", N, K, {32, true}, p.tensors.at("qweight"), p.tensors.at("qzeros"),
                                            p.tensors.at("scales"), Tensor(), PartLabels::in_memory("m"));
  const QuantWeight q = quantize_int8_rowwise(int4);
  const std::vector<float> back = testing::dequantize_all(q);
  for (int64_t n = 0; n < N; ++n) {
    const float s = q.part("row_scales").data<float>()[n];
    float amax = 0;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(p.dequantized[size_t(n * K + k)]));
    EXPECT_EQ(s, amax / 127.0f);
    for (int64_t k = 0; k < K; ++k)
      EXPECT_LE(std::fabs(back[size_t(n * K + k)] - p.dequantized[size_t(n * K + k)]), 0.5001f * s) << n << "," << k;
  }
}

TEST(Int8RowwiseErrors, NonFiniteRowsAndBadParts) {
  EXPECT_THAT(
      [] {
        try {
          quantize_int8_rowwise(dense_weight(testing::f32_tensor({2, 2}, {1, 2, INFINITY, 0}), "lm_head"));
        } catch (const Error& e) {
          return std::string(e.what());
        }
        return std::string();
      }(),
      HasSubstr("row 1 holds a non-finite value"));
  EXPECT_THROW(int8_rowwise_weight("m", Tensor::empty(DType::I8, {2, 3}), Tensor::empty(DType::F32, {3}),
                                   PartLabels::in_memory("m")),
               Error);
  EXPECT_THROW(int8_rowwise_weight("m", Tensor::empty(DType::U8, {2, 3}), Tensor::empty(DType::F32, {2}),
                                   PartLabels::in_memory("m")),
               Error);
}

}  // namespace
}  // namespace moeserve::quant
