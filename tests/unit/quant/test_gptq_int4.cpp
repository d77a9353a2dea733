// GPTQ / AutoRound INT4: hand-packed words with known values (nibble order along K in
// qweight and along N in qzeros, the v1 zero offset, g_idx), a randomised round trip
// against the tests' own packer, stored_bytes, and every validation error.
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "quant/gptq_int4.h"
#include "quant_test_util.h"
#include "test_packing.h"

namespace moeserve::quant {
namespace {
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::f16_tensor;
using testing::i32_tensor;

PartLabels labels() { return PartLabels::in_memory("m"); }

using testing::error_of;

// K = 16, N = 8, group 8: two groups along K, one qzeros word per group.
struct Small {
  std::vector<int32_t> qweight = std::vector<int32_t>(2 * 8, 0);
  std::vector<int32_t> qzeros = {0x77777777, 0x77777777};
  std::vector<float> scales = std::vector<float>(2 * 8, 1.0f);
};

TEST(GptqInt4, LowNibbleIsTheFirstRowOfK) {
  Small s;
  s.qweight[0 * 8 + 0] = int32_t(0x76543210u);  // column n = 0, k = 0..7: codes 0..7
  s.qweight[1 * 8 + 0] = int32_t(0xFEDCBA98u);  // column n = 0, k = 8..15: codes 8..15
  for (int n = 0; n < 8; ++n) s.scales[size_t(n)] = 0.5f, s.scales[size_t(8 + n)] = 0.25f;
  const QuantWeight w = gptq_int4_weight("m", 8, 16, {8, true}, i32_tensor({2, 8}, s.qweight),
                                         i32_tensor({2, 1}, s.qzeros), f16_tensor({2, 8}, s.scales), Tensor(), labels());
  std::vector<float> row(16);
  w.dequantize_rows(0, 1, row.data());
  // W[0, k] = (k - 8) * 0.5 for the first group, (k - 8) * 0.25 for the second.
  const std::vector<float> expected = {-4.0f, -3.5f, -3.0f, -2.5f, -2.0f, -1.5f, -1.0f, -0.5f,
                                       0.0f,  0.25f, 0.5f,  0.75f, 1.0f,  1.25f, 1.5f,  1.75f};
  EXPECT_EQ(row, expected);
  // Other columns hold code 0: W = (0 - 8) * scale.
  w.dequantize_rows(5, 6, row.data());
  EXPECT_EQ(row[0], -4.0f);
  EXPECT_EQ(row[15], -2.0f);
}

TEST(GptqInt4, AsymmetricZerosAreStoredMinusOneWithLowNibbleFirstAlongN) {
  Small s;
  s.qzeros = {0x00000021, int32_t(0xE0000000u)};  // group 0: zero(n0) = 2, zero(n1) = 3, others 1
                                                  // group 1: zero(n7) = 15, others 1
  for (auto& q : s.qweight) q = int32_t(0x55555555u);  // every code 5
  const QuantWeight w = gptq_int4_weight("m", 8, 16, {8, false}, i32_tensor({2, 8}, s.qweight),
                                         i32_tensor({2, 1}, s.qzeros), f16_tensor({2, 8}, s.scales), Tensor(), labels());
  const std::vector<float> all = testing::dequantize_all(w);
  EXPECT_EQ(all[0 * 16 + 0], 3.0f);   // n 0, group 0: 5 - 2
  EXPECT_EQ(all[1 * 16 + 7], 2.0f);   // n 1, group 0: 5 - 3
  EXPECT_EQ(all[2 * 16 + 3], 4.0f);   // n 2, group 0: 5 - 1
  EXPECT_EQ(all[7 * 16 + 8], -10.0f); // n 7, group 1: 5 - 15
  EXPECT_EQ(all[0 * 16 + 8], 4.0f);   // n 0, group 1: 5 - 1
}

TEST(GptqInt4, GIdxChoosesTheGroupOfEachInputRow) {
  Small s;
  for (auto& q : s.qweight) q = int32_t(0x99999999u);  // code 9: W = scale
  for (int n = 0; n < 8; ++n) s.scales[size_t(n)] = 1.0f, s.scales[size_t(8 + n)] = 3.0f;
  std::vector<int32_t> g_idx(16, 0);
  g_idx[1] = g_idx[4] = g_idx[15] = 1;
  const QuantWeight w = gptq_int4_weight("m", 8, 16, {8, true}, i32_tensor({2, 8}, s.qweight),
                                         i32_tensor({2, 1}, s.qzeros), f16_tensor({2, 8}, s.scales),
                                         i32_tensor({16}, g_idx), labels());
  std::vector<float> row(16);
  w.dequantize_rows(3, 4, row.data());
  for (int k = 0; k < 16; ++k) EXPECT_EQ(row[size_t(k)], g_idx[size_t(k)] == 1 ? 3.0f : 1.0f) << k;
}

TEST(GptqInt4, PerChannelGroupAndMissingQzerosWhenSymmetric) {
  Small s;
  for (auto& q : s.qweight) q = int32_t(0xAAAAAAAAu);  // code 10: W = 2 * scale
  const QuantWeight w = gptq_int4_weight("m", 8, 16, {-1, true}, i32_tensor({2, 8}, s.qweight), Tensor(),
                                         f16_tensor({1, 8}, std::vector<float>(8, 1.5f)), Tensor(), labels());
  EXPECT_EQ(w.group_size, 16);
  EXPECT_FALSE(w.has_part("qzeros"));
  for (float v : testing::dequantize_all(w)) EXPECT_EQ(v, 3.0f);
  EXPECT_EQ(w.stored_bytes(), size_t(2 * 8 * 4 + 8 * 2));
}

class GptqRoundTrip : public ::testing::TestWithParam<std::tuple<bool, bool, int>> {};

TEST_P(GptqRoundTrip, MatchesTheReferencePackerBitForBit) {
  const auto [sym, act_order, group] = GetParam();
  std::mt19937 rng(1234 + group);
  const int64_t N = 24, K = 96;
  const std::vector<float> W = testing::random_weight(N, K, rng);
  const testing::Packed p = testing::pack_gptq_int4(W, N, K, group, sym, act_order, rng);
  const QuantWeight w = gptq_int4_weight("m", N, K, {group, sym}, p.tensors.at("qweight"), p.tensors.at("qzeros"),
                                         p.tensors.at("scales"), act_order ? p.tensors.at("g_idx") : Tensor(), labels());
  EXPECT_EQ(testing::dequantize_all(w), p.dequantized);
  EXPECT_EQ(w.stored_bytes(), size_t(K / 8 * N * 4 + K / group * N / 8 * 4 + K / group * N * 2 + (act_order ? K * 4 : 0)));
}

INSTANTIATE_TEST_SUITE_P(Packings, GptqRoundTrip,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Values(32, 96)));

TEST(GptqInt4Errors, EachInconsistencyIsNamed) {
  Small s;
  const Tensor qw = i32_tensor({2, 8}, s.qweight), qz = i32_tensor({2, 1}, s.qzeros);
  const Tensor sc = f16_tensor({2, 8}, s.scales);
  auto make = [&](int64_t N, int64_t K, GptqInt4Params p, Tensor a, Tensor b, Tensor c, Tensor d) {
    return [=] { gptq_int4_weight("m", N, K, p, a, b, c, d, labels()); };
  };
  EXPECT_THAT(error_of(make(8, 24, {8, true}, qw, qz, sc, {})),
              AllOf(HasSubstr("part 'qweight'"), HasSubstr("[2, 8]"), HasSubstr("expected [3, 8]")));
  EXPECT_THAT(error_of(make(8, 16, {8, true}, qw, qz, {}, {})), HasSubstr("no scales"));
  EXPECT_THAT(error_of(make(8, 16, {8, false}, qw, {}, sc, {})), HasSubstr("needs qzeros"));
  EXPECT_THAT(error_of(make(8, 16, {6, true}, qw, qz, sc, {})), HasSubstr("group size 6 does not divide in_features 16"));
  EXPECT_THAT(error_of(make(8, 16, {16, true}, qw, qz, sc, {})),
              AllOf(HasSubstr("part 'scales'"), HasSubstr("expected [1, 8]")));
  EXPECT_THAT(error_of(make(8, 16, {8, true}, qw, qz, testing::f32_tensor({2, 8}, s.scales), {})),
              AllOf(HasSubstr("part 'scales'"), HasSubstr("dtype F32, expected F16")));
  EXPECT_THAT(error_of(make(8, 16, {8, true}, f16_tensor({2, 8}, s.scales), qz, sc, {})),
              AllOf(HasSubstr("part 'qweight'"), HasSubstr("expected I32")));
  EXPECT_THAT(error_of(make(8, 16, {8, false}, qw, i32_tensor({1, 1}, {0}), sc, {})),
              AllOf(HasSubstr("part 'qzeros'"), HasSubstr("[1, 1]"), HasSubstr("expected [2, 1]")));
  std::vector<int32_t> g_idx(16, 0);
  g_idx[7] = 2;
  EXPECT_THAT(error_of(make(8, 16, {8, true}, qw, qz, sc, i32_tensor({16}, g_idx))),
              AllOf(HasSubstr("g_idx[7] = 2"), HasSubstr("outside [0, 2)")));
  g_idx[7] = -1;
  EXPECT_THAT(error_of(make(8, 16, {8, true}, qw, qz, sc, i32_tensor({16}, g_idx))), HasSubstr("g_idx[7] = -1"));
  EXPECT_THAT(error_of(make(8, 16, {8, true}, qw, qz, sc, i32_tensor({8}, std::vector<int32_t>(8, 0)))),
              AllOf(HasSubstr("part 'g_idx'"), HasSubstr("expected [16]")));
  EXPECT_THAT(error_of(make(8, 16, {8, true}, qw, i32_tensor({2, 1}, {0x77777777, 0x77777767}), sc, {})),
              HasSubstr("sym = true"));
  // K must pack 8 codes per word.
  EXPECT_THAT(error_of(make(8, 12, {4, true}, qw, qz, sc, {})), HasSubstr("not a multiple of 8"));
}

TEST(GptqInt4Errors, HandBuiltWeightWithInconsistentPartsThrowsInsteadOfReadingOutOfBounds) {
  Small s;
  QuantWeight w = gptq_int4_weight("m", 8, 16, {8, true}, i32_tensor({2, 8}, s.qweight), Tensor(),
                                   f16_tensor({2, 8}, s.scales), Tensor(), labels());
  w.in_features = 32;  // no longer matches the parts
  std::vector<float> out(32);
  EXPECT_THROW(w.dequantize_rows(0, 1, out.data()), Error);
  w.in_features = 16;
  w.parts["g_idx"] = i32_tensor({16}, std::vector<int32_t>(16, 5));
  EXPECT_THROW(w.dequantize_rows(0, 1, out.data()), Error);
  EXPECT_THROW(w.dequantize_rows(0, 9, out.data()), Error);
}

}  // namespace
}  // namespace moeserve::quant
