// The BF16 -> INT4 / FP8 quantisers (src/quant/quantize_*.h): their output unpacked with the
// published formulas (convert_test_util.h), their error bounds, and bit-exact agreement with
// the tensors tests/fixtures/make_qwen35_fixtures.py packed with torch (same RTN recipe).
#include <gtest/gtest.h>

#include <random>

#include "convert_test_util.h"
#include "core/error.h"
#include "quant/quantize_fp8_block.h"
#include "quant/quantize_gptq_int4.h"

namespace moeserve::tools {
namespace {

using testing::StoredTensor;

std::vector<float> random_matrix(int64_t N, int64_t K, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> w(size_t(N * K));
  for (float& v : w) v = bf16_to_f32(f32_to_bf16(dist(rng)));  // BF16 values, as checkpoints hold
  return w;
}

template <typename T>
StoredTensor stored(DType dtype, Shape shape, const std::vector<T>& values) {
  StoredTensor t{dtype, std::move(shape), {}};
  t.bytes.resize(values.size() * sizeof(T));
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

StoredTensor stored_gptq(const quant::GptqInt4Tensors& q, const char* role) {
  const int64_t N = q.out_features, K = q.in_features, G = K / q.group_size;
  if (std::string(role) == "qweight") return stored(DType::I32, {K / 8, N}, q.qweight);
  if (std::string(role) == "qzeros") return stored(DType::I32, {G, N / 8}, q.qzeros);
  return stored(DType::F16, {G, N}, q.scales);
}

TEST(QuantizeGptqInt4, UnpacksWithinHalfAStepOfTheWeights) {
  const int64_t N = 24, K = 96, g = 32;
  std::vector<float> W = random_matrix(N, K, 7);
  W[5 * K + 40] = 0.0f;                        // zeros stay zero
  for (int64_t k = 64; k < 96; ++k) W[3 * K + k] = 0.0f;  // an all-zero group
  const quant::GptqInt4Tensors q = quant::quantize_gptq_int4(W.data(), N, K, g, "m");
  ASSERT_EQ(q.qweight.size(), size_t(K / 8 * N));
  ASSERT_EQ(q.scales.size(), size_t(K / g * N));
  for (int32_t z : q.qzeros) EXPECT_EQ(uint32_t(z), 0x77777777u);  // symmetric: zero 8, stored as 7

  const std::vector<float> D =
      testing::gptq_dequantize(stored_gptq(q, "qweight"), stored_gptq(q, "qzeros"), stored_gptq(q, "scales"));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K / g; ++j) {
      float amax = 0;
      for (int64_t k = j * g; k < (j + 1) * g; ++k) amax = std::max(amax, std::fabs(W[size_t(n * K + k)]));
      const float s = f16_to_f32(q.scales[size_t(j * N + n)]);
      // The scale is amax / 7.5 in fp16 (floored at 1e-6 for the all-zero group).
      EXPECT_EQ(q.scales[size_t(j * N + n)], f32_to_f16(std::max(amax / 7.5f, 1e-6f))) << n << "," << j;
      for (int64_t k = j * g; k < (j + 1) * g; ++k) {
        const float w = W[size_t(n * K + k)], d = D[size_t(n * K + k)];
        // Half a step, plus at the clipped top end (7.5 rounds to 8, clamped to 7) what the
        // fp16 rounding of the scale moved 7.5 steps away from amax.
        EXPECT_LE(std::fabs(w - d), 0.5f * s + std::fabs(amax - 7.5f * s) + 1e-6f) << "n " << n << " k " << k;
        EXPECT_EQ(std::fmod(d / s, 1.0f), 0.0f);  // an integer number of steps
        EXPECT_GE(d / s, -8.0f);
        EXPECT_LE(d / s, 7.0f);
      }
    }
  EXPECT_EQ(D[size_t(5 * K + 40)], 0.0f);
  for (int64_t k = 64; k < 96; ++k) EXPECT_EQ(D[size_t(3 * K + k)], 0.0f);
}

TEST(QuantizeGptqInt4, PacksLowNibbleFirstAndRoundsTiesToEven) {
  // One row (N = 8 rows, all alike), one group of 8: amax 7.5 gives scale exactly 1.
  const int64_t N = 8, K = 8;
  const std::vector<float> row = {-7.5f, -0.5f, 0.5f, 1.5f, 2.5f, 7.5f, 3.0f, -2.0f};
  std::vector<float> W;
  for (int n = 0; n < N; ++n) W.insert(W.end(), row.begin(), row.end());
  const quant::GptqInt4Tensors q = quant::quantize_gptq_int4(W.data(), N, K, 8, "m");
  EXPECT_EQ(f16_to_f32(q.scales[0]), 1.0f);
  // round-half-even: -7.5 -> -8, -0.5 -> 0, 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 7.5 -> 8 (clamped to 7).
  const int codes[8] = {0, 8, 8, 10, 10, 15, 11, 6};
  uint32_t expected = 0;
  for (int k = 0; k < 8; ++k) expected |= uint32_t(codes[k]) << (4 * k);
  for (int n = 0; n < N; ++n) EXPECT_EQ(uint32_t(q.qweight[size_t(n)]), expected) << n;
}

TEST(QuantizeGptqInt4, ShapeErrorsNameTheModule) {
  std::vector<float> W(16 * 96, 0.5f);
  try {
    quant::quantize_gptq_int4(W.data(), 16, 96, 64, "layers.0.mlp.experts.3.down_proj");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.mlp.experts.3.down_proj"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("K = 96 is not divisible by the group size 64"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quant::check_gptq_int4_shape("m", 12, 64, 32), Error);  // N % 8
  EXPECT_THROW(quant::check_gptq_int4_shape("m", 16, 36, 36), Error);  // K % 8
  EXPECT_THROW(quant::check_gptq_int4_shape("m", 16, 64, 0), Error);
  EXPECT_NO_THROW(quant::check_gptq_int4_shape("m", 16, 64, 32));
}

TEST(QuantizeGptqInt4, RefusesNonFiniteWeights) {
  std::vector<float> W = random_matrix(8, 64, 3);
  W[size_t(5 * 64 + 37)] = std::numeric_limits<float>::infinity();
  try {
    quant::quantize_gptq_int4(W.data(), 8, 64, 32, "layers.2.self_attn.o_proj");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'layers.2.self_attn.o_proj': weight [5, 37] is inf"), std::string::npos)
        << e.what();
  }
}

TEST(QuantizeFp8Block, UnpacksWithinE4M3PrecisionWithPartialBlocks) {
  const int64_t N = 200, K = 300;  // 2 x 3 blocks, the last ones partial
  std::vector<float> W = random_matrix(N, K, 11, 0.05f);
  for (int64_t n = 128; n < 200; ++n)
    for (int64_t k = 256; k < 300; ++k) W[size_t(n * K + k)] = 0.0f;  // an all-zero (partial) block
  const quant::Fp8BlockTensors q = quant::quantize_fp8_block(W.data(), N, K, "m");
  ASSERT_EQ(q.weight_scale_inv.size(), 6u);
  EXPECT_EQ(q.weight_scale_inv[5], 1.0f);
  const std::vector<float> D =
      testing::fp8_dequantize(stored(DType::F8_E4M3, {N, K}, q.weight), stored(DType::F32, {2, 3}, q.weight_scale_inv));
  for (int64_t bi = 0; bi < 2; ++bi)
    for (int64_t bj = 0; bj < 3; ++bj) {
      float amax = 0;
      for (int64_t n = bi * 128; n < std::min(N, bi * 128 + 128); ++n)
        for (int64_t k = bj * 128; k < std::min(K, bj * 128 + 128); ++k)
          amax = std::max(amax, std::fabs(W[size_t(n * K + k)]));
      const float s = q.weight_scale_inv[size_t(bi * 3 + bj)];
      if (amax > 0) EXPECT_EQ(s, amax / 448.0f);
      for (int64_t n = bi * 128; n < std::min(N, bi * 128 + 128); ++n)
        for (int64_t k = bj * 128; k < std::min(K, bj * 128 + 128); ++k) {
          const float w = W[size_t(n * K + k)], d = D[size_t(n * K + k)];
          // E4M3 has 3 mantissa bits: relative error <= 2^-4 for normals; the absolute floor
          // covers subnormals (spacing 2^-9 in units of the scale).
          EXPECT_LE(std::fabs(w - d), std::max(std::fabs(w) * 0.0625f, s * 0.001f)) << n << "," << k;
          if (std::fabs(w) == amax && amax > 0) {  // the block's largest value lands on ±448
            EXPECT_EQ(q.weight[size_t(n * K + k)] & 0x7f, 0x7e);
            EXPECT_NEAR(std::fabs(d), amax, amax * 1e-6f);
          }
        }
    }
}

// The fast rounding equals core's definition (a search over all codes) on every float whose
// low 14 bits are zero, both signs, and at and around every midpoint between two codes.
TEST(QuantizeFp8Block, FastRoundingEqualsCoresDefinition) {
  int checked = 0;
  auto check = [&](float f) {
    ASSERT_EQ(quant::round_to_fp8_e4m3(f), f32_to_fp8_e4m3(f)) << f;
    ++checked;
  };
  for (uint32_t i = 0; i < (1u << 18); ++i) {
    float f;
    const uint32_t bits = i << 14;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) continue;
    check(f);
    check(-f);
  }
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = fp8_e4m3_to_f32(uint8_t(c)), hi = fp8_e4m3_to_f32(uint8_t(c + 1));
    const float mid = (lo + hi) / 2;  // exact: both have few significant bits
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f), lo, hi}) {
      check(f);
      check(-f);
    }
  }
  for (float f : {448.0f, 463.9f, 464.0f, 1e30f, std::numeric_limits<float>::infinity()}) check(f), check(-f);
  EXPECT_EQ(quant::round_to_fp8_e4m3(std::nanf("")), 0x7f);
  EXPECT_GT(checked, 500000);
}

TEST(QuantizeFp8Block, RefusesNonFiniteWeights) {
  std::vector<float> W = random_matrix(130, 64, 5);
  W[size_t(129 * 64 + 3)] = std::nanf("");
  try {
    quant::quantize_fp8_block(W.data(), 130, 64, "layers.1.mlp.shared_expert.up_proj");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'layers.1.mlp.shared_expert.up_proj': weight [129, 3] is nan"),
              std::string::npos)
        << e.what();
  }
}

TEST(QuantizeThreads, ResultsDoNotDependOnTheThreadCount) {
  const std::vector<float> W = random_matrix(256, 384, 21);
  ThreadPool one(1), four(4);
  const auto a = quant::quantize_gptq_int4(W.data(), 256, 384, 128, "m", &one);
  const auto b = quant::quantize_gptq_int4(W.data(), 256, 384, 128, "m", &four);
  EXPECT_EQ(a.qweight, b.qweight);
  EXPECT_EQ(a.scales, b.scales);
  const auto c = quant::quantize_fp8_block(W.data(), 256, 384, "m", &one);
  const auto d = quant::quantize_fp8_block(W.data(), 256, 384, "m", &four);
  EXPECT_EQ(c.weight, d.weight);
  EXPECT_EQ(c.weight_scale_inv, d.weight_scale_inv);
}

// The fixture script packed int4_autoround_sym with plain RTN (sym: scale amax / 7.5 in fp16,
// round half to even, zero 8; group 32) from the BF16 weights of quant_base_bf16, so quantising
// those weights here must give its tensors bit for bit.
TEST(QuantizeAgainstFixtures, Int4MatchesTheFixturePackingBitForBit) {
  const auto base = testing::read_all_tensors(testing::fixture("quant_base_bf16"));
  const auto int4 = testing::read_all_tensors(testing::fixture("int4_autoround_sym"));
  const int64_t g = testing::read_json(testing::fixture("int4_autoround_sym") / "config.json")["quantization_config"]
                        ["group_size"];
  int modules = 0;
  for (const auto& [name, t] : int4) {
    if (name.size() < 8 || name.compare(name.size() - 8, 8, ".qweight") != 0) continue;
    const std::string module = name.substr(0, name.size() - 8);
    const StoredTensor& w = base.at(module + ".weight");
    const std::vector<float> W = testing::to_floats(w);
    const auto q = quant::quantize_gptq_int4(W.data(), w.shape[0], w.shape[1], g, module);
    EXPECT_EQ(stored_gptq(q, "qweight"), t) << module;
    EXPECT_EQ(stored_gptq(q, "qzeros"), int4.at(module + ".qzeros")) << module;
    EXPECT_EQ(stored_gptq(q, "scales"), int4.at(module + ".scales")) << module;
    ++modules;
  }
  EXPECT_EQ(modules, 8 * 3 * 5 + 4 * 3 + 1 * 4 + 5 * 3);  // experts, GDN qkv/z/out, attention q/k/v/o, shared
}

// fp8_block stores F32 scales for the routed experts (BF16 for the dense modules, which this
// quantiser does not do): the experts must match bit for bit.
TEST(QuantizeAgainstFixtures, Fp8ExpertsMatchTheFixturePackingBitForBit) {
  const auto base = testing::read_all_tensors(testing::fixture("quant_base_bf16"));
  const auto fp8 = testing::read_all_tensors(testing::fixture("fp8_block"));
  int modules = 0;
  for (const auto& [name, t] : fp8) {
    if (name.find(".weight_scale_inv") == std::string::npos || t.dtype != DType::F32) continue;
    const std::string module = name.substr(0, name.size() - 17);
    const StoredTensor& w = base.at(module + ".weight");
    const std::vector<float> W = testing::to_floats(w);
    const auto q = quant::quantize_fp8_block(W.data(), w.shape[0], w.shape[1], module);
    EXPECT_EQ(stored(DType::F8_E4M3, w.shape, q.weight), fp8.at(module + ".weight")) << module;
    EXPECT_EQ(stored(DType::F32, t.shape, q.weight_scale_inv), t) << module;
    ++modules;
  }
  EXPECT_EQ(modules, 8 * 3 * 5);
}

}  // namespace
}  // namespace moeserve::tools
