// NVFP4: hand-packed bytes (low nibble = even k, the sign bit, every E2M1 magnitude) with both
// flavours' scale rules, a randomised round trip against the tests' packer, and the
// validation errors.
#include <functional>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "quant/nvfp4.h"
#include "quant_test_util.h"
#include "test_packing.h"

namespace moeserve::quant {
namespace {
using ::testing::AllOf;
using ::testing::HasSubstr;

using testing::error_of;

TEST(Nvfp4, E2M1CodesAndNibbleOrder) {
  const std::vector<float> magnitudes = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 16; ++c) {
    const float expected = c < 8 ? magnitudes[size_t(c)] : -magnitudes[size_t(c - 8)];
    EXPECT_EQ(e2m1_to_f32(uint8_t(c)), expected) << c;
    EXPECT_EQ(std::signbit(e2m1_to_f32(uint8_t(c))), c >= 8) << c;
  }
  // One row, K = 32: bytes 0..7 hold codes (2i, 2i+1) for i = 0..7 in group 0; group 1 is 0xF8.
  std::vector<uint8_t> packed(16);
  for (int i = 0; i < 8; ++i) packed[size_t(i)] = uint8_t((2 * i) | ((2 * i + 1) << 4));
  for (int i = 8; i < 16; ++i) packed[size_t(i)] = 0xF8;  // k even: code 8 (-0), k odd: code 15 (-6)
  const Tensor p = testing::u8_tensor(DType::U8, {1, 16}, packed);
  const Tensor scales = testing::u8_tensor(DType::F8_E4M3, {1, 2}, {0x38, 0x40});  // 1.0, 2.0
  const QuantWeight ct = nvfp4_weight("m", 1, 32, Nvfp4Flavour::CompressedTensors, p, scales,
                                      testing::f32_tensor({1}, {4.0f}), PartLabels::in_memory("m"));
  const QuantWeight mo = nvfp4_weight("m", 1, 32, Nvfp4Flavour::ModelOpt, p, scales,
                                      testing::f32_tensor({}, {0.25f}), PartLabels::in_memory("m"));
  for (const QuantWeight* w : {&ct, &mo}) {
    const std::vector<float> row = testing::dequantize_all(*w);
    for (int k = 0; k < 16; ++k) EXPECT_EQ(row[size_t(k)], e2m1_to_f32(uint8_t(k)) * 0.25f) << k;
    for (int k = 16; k < 32; k += 2) {
      EXPECT_TRUE(row[size_t(k)] == 0.0f && std::signbit(row[size_t(k)])) << k;
      EXPECT_EQ(row[size_t(k + 1)], -3.0f) << k;
    }
    EXPECT_EQ(w->stored_bytes(), size_t(16 + 2 + 4));
    EXPECT_EQ(w->group_size, 16);
  }
  EXPECT_TRUE(ct.has_part("global_scale"));
  EXPECT_TRUE(mo.has_part("weight_scale_2"));
}

TEST(Nvfp4, CompressedTensorsDividesByTheGlobalScale) {
  // scale 0x3A = 1.25, global 3: factor = 1.25f / 3.0f, not 1.25f * (1 / 3.0f) (they differ in fp32).
  volatile float g = 3.0f, s = 1.25f;
  const float divided = s / g, via_reciprocal = s * (1.0f / g);
  ASSERT_NE(divided, via_reciprocal);
  const Tensor p = testing::u8_tensor(DType::U8, {1, 8}, std::vector<uint8_t>(8, 0x22));  // code 2: 1.0
  const QuantWeight w = nvfp4_weight("m", 1, 16, Nvfp4Flavour::CompressedTensors, p,
                                     testing::u8_tensor(DType::F8_E4M3, {1, 1}, {0x3A}),
                                     testing::f32_tensor({1}, {3.0f}), PartLabels::in_memory("m"));
  EXPECT_EQ(testing::dequantize_all(w)[0], divided);
}

TEST(Nvfp4, MatchesTheReferencePackerBitForBit) {
  std::mt19937 rng(5);
  const int64_t N = 40, K = 96;
  const std::vector<float> W = testing::random_weight(N, K, rng);
  for (bool modelopt : {false, true}) {
    const testing::Packed p = testing::pack_nvfp4(W, N, K, modelopt);
    const QuantWeight w =
        modelopt ? nvfp4_weight("m", N, K, Nvfp4Flavour::ModelOpt, p.tensors.at("weight"), p.tensors.at("weight_scale"),
                                p.tensors.at("weight_scale_2"), PartLabels::in_memory("m"))
                 : nvfp4_weight("m", N, K, Nvfp4Flavour::CompressedTensors, p.tensors.at("weight_packed"),
                                p.tensors.at("weight_scale"), p.tensors.at("weight_global_scale"),
                                PartLabels::in_memory("m"));
    EXPECT_EQ(testing::dequantize_all(w), p.dequantized) << (modelopt ? "modelopt" : "compressed-tensors");
  }
}

TEST(Nvfp4Errors, EachInconsistencyIsNamed) {
  const auto labels = PartLabels::in_memory("m");
  const Tensor p = Tensor::empty(DType::U8, {4, 16}), s = Tensor::empty(DType::F8_E4M3, {4, 2});
  const Tensor g = testing::f32_tensor({1}, {1.0f});
  auto make = [&](int64_t K, Tensor a, Tensor b, Tensor c, Nvfp4Flavour f = Nvfp4Flavour::CompressedTensors) {
    return [=] { nvfp4_weight("m", 4, K, f, a, b, c, labels); };
  };
  EXPECT_THAT(error_of(make(24, p, s, g)), HasSubstr("in_features 24 is not a multiple of 16"));
  EXPECT_THAT(error_of(make(32, p, Tensor(), g)), HasSubstr("without weight_scale"));
  EXPECT_THAT(error_of(make(32, p, s, Tensor())), HasSubstr("without weight_global_scale"));
  EXPECT_THAT(error_of(make(32, p, s, Tensor(), Nvfp4Flavour::ModelOpt)), HasSubstr("without weight_scale_2"));
  EXPECT_THAT(error_of(make(32, p, Tensor::empty(DType::F8_E4M3, {4, 4}), g)),
              AllOf(HasSubstr("part 'weight_scale'"), HasSubstr("expected [4, 2]")));
  EXPECT_THAT(error_of(make(32, p, Tensor::empty(DType::BF16, {4, 2}), g)),
              AllOf(HasSubstr("part 'weight_scale'"), HasSubstr("dtype BF16, expected F8_E4M3")));
  EXPECT_THAT(error_of(make(32, Tensor::empty(DType::I8, {4, 16}), s, g)),
              AllOf(HasSubstr("part 'weight_packed'"), HasSubstr("dtype I8, expected U8")));
  EXPECT_THAT(error_of(make(32, Tensor::empty(DType::U8, {4, 32}), s, g)),
              AllOf(HasSubstr("part 'weight_packed'"), HasSubstr("expected [4, 16]")));
  EXPECT_THAT(error_of(make(32, p, s, testing::f32_tensor({2}, {1, 1}))),
              AllOf(HasSubstr("part 'global_scale'"), HasSubstr("single value")));
  EXPECT_THAT(error_of(make(32, p, s, testing::f32_tensor({1}, {0.0f}))), HasSubstr("not positive"));
  EXPECT_THAT(error_of(make(32, p, s, testing::f32_tensor({}, {NAN}), Nvfp4Flavour::ModelOpt)),
              HasSubstr("not finite"));
}

}  // namespace
}  // namespace moeserve::quant
