// FP8 block: known E4M3 codes times the scale of their block (partial edge blocks, BF16 and
// F32 scales, non-square blocks), a randomised round trip against the tests' packer, and the
// validation errors.
#include <functional>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "quant/fp8_block.h"
#include "quant_test_util.h"
#include "test_packing.h"

namespace moeserve::quant {
namespace {
using ::testing::AllOf;
using ::testing::HasSubstr;

using testing::error_of;

TEST(Fp8Block, KnownCodesTimesTheScaleOfTheirBlockIncludingPartialEdgeBlocks) {
  const int64_t N = 130, K = 200;  // scale grid [2, 2]; the second block row has 2 rows, column 72
  Tensor q = Tensor::empty(DType::F8_E4M3, {N, K});
  uint8_t* c = q.data<uint8_t>();
  c[0 * K + 0] = 0x38;      // 1.0, block (0, 0)
  c[0 * K + 199] = 0x40;    // 2.0, block (0, 1)
  c[129 * K + 5] = 0xC0;    // -2.0, block (1, 0)
  c[128 * K + 128] = 0x7E;  // 448, block (1, 1)
  c[127 * K + 127] = 0x3C;  // 1.5, block (0, 0), its last element
  c[1 * K + 1] = 0x01;      // 2^-9, the smallest subnormal
  c[2 * K + 2] = 0x80;      // -0
  for (DType scale_dtype : {DType::BF16, DType::F32}) {
    const std::vector<float> s = {0.5f, 0.25f, 4.0f, -1.0f};  // powers of two: exact in BF16
    const Tensor scale = scale_dtype == DType::F32 ? testing::f32_tensor({2, 2}, s) : testing::bf16_tensor({2, 2}, s);
    const QuantWeight w = fp8_block_weight("m", N, K, {}, q, scale, PartLabels::in_memory("m"));
    EXPECT_EQ(w.group_size, 128);
    EXPECT_EQ(w.block_rows, 128);
    const std::vector<float> all = testing::dequantize_all(w);
    EXPECT_EQ(all[0 * K + 0], 0.5f);
    EXPECT_EQ(all[0 * K + 199], 0.5f);
    EXPECT_EQ(all[129 * K + 5], -8.0f);
    EXPECT_EQ(all[128 * K + 128], -448.0f);
    EXPECT_EQ(all[127 * K + 127], 0.75f);
    EXPECT_EQ(all[1 * K + 1], 0.5f / 512.0f);
    EXPECT_TRUE(std::signbit(all[2 * K + 2]) && all[2 * K + 2] == 0.0f);
    EXPECT_EQ(all[5 * K + 5], 0.0f);
    EXPECT_EQ(w.stored_bytes(), size_t(N * K + 4 * dtype_size(scale_dtype)));
  }
}

TEST(Fp8Block, NonSquareBlocks) {
  // bn = 2 rows, bk = 4 columns over W [3, 6]: scale grid [2, 2].
  Tensor q = Tensor::empty(DType::F8_E4M3, {3, 6});
  for (int i = 0; i < 18; ++i) q.data<uint8_t>()[i] = 0x38;  // 1.0 everywhere
  const QuantWeight w = fp8_block_weight("m", 3, 6, {2, 4}, q, testing::f32_tensor({2, 2}, {1, 2, 3, 4}),
                                         PartLabels::in_memory("m"));
  const std::vector<float> expected = {1, 1, 1, 1, 2, 2,  //
                                       1, 1, 1, 1, 2, 2,  //
                                       3, 3, 3, 3, 4, 4};
  EXPECT_EQ(testing::dequantize_all(w), expected);
}

TEST(Fp8Block, MatchesTheReferencePackerBitForBit) {
  std::mt19937 rng(77);
  for (auto [N, K] : {std::pair<int64_t, int64_t>{200, 136}, {64, 384}}) {
    const std::vector<float> W = testing::random_weight(N, K, rng);
    for (DType sd : {DType::F32, DType::BF16}) {
      const testing::Packed p = testing::pack_fp8_block(W, N, K, 128, 128, sd);
      const QuantWeight w = fp8_block_weight("m", N, K, {}, p.tensors.at("weight"), p.tensors.at("weight_scale_inv"),
                                             PartLabels::in_memory("m"));
      EXPECT_EQ(testing::dequantize_all(w), p.dequantized) << N << "x" << K;
    }
  }
}

TEST(Fp8BlockErrors, EachInconsistencyIsNamed) {
  const Tensor q = Tensor::empty(DType::F8_E4M3, {130, 200});
  const auto labels = PartLabels::in_memory("m");
  auto make = [&](Tensor weight, Tensor scale, Fp8BlockShape block = {}) {
    return [=] { fp8_block_weight("m", 130, 200, block, weight, scale, labels); };
  };
  EXPECT_THAT(error_of(make(q, Tensor())), HasSubstr("without weight_scale_inv"));
  EXPECT_THAT(error_of(make(q, testing::f32_tensor({1, 1}, {1}))),
              AllOf(HasSubstr("part 'weight_scale_inv'"), HasSubstr("[1, 1]"), HasSubstr("expected [2, 2]")));
  EXPECT_THAT(error_of(make(q, testing::f32_tensor({2, 2}, {1, 1, 1, 1}), {64, 128})),
              AllOf(HasSubstr("expected [3, 2]"), HasSubstr("ceil(N/64)")));
  EXPECT_THAT(error_of(make(q, testing::i32_tensor({2, 2}, {1, 1, 1, 1}))),
              AllOf(HasSubstr("part 'weight_scale_inv'"), HasSubstr("dtype I32")));
  EXPECT_THAT(error_of(make(Tensor::empty(DType::BF16, {130, 200}), testing::f32_tensor({2, 2}, {1, 1, 1, 1}))),
              AllOf(HasSubstr("part 'weight'"), HasSubstr("dtype BF16, expected F8_E4M3")));
  EXPECT_THAT(error_of(make(Tensor::empty(DType::F8_E4M3, {200, 130}), testing::f32_tensor({2, 2}, {1, 1, 1, 1}))),
              AllOf(HasSubstr("part 'weight'"), HasSubstr("[200, 130]"), HasSubstr("expected [130, 200]")));
}

}  // namespace
}  // namespace moeserve::quant
