// Linear, norms and RoPE against straightforward double-precision loops.
#include <cmath>

#include <gtest/gtest.h>

#include "backend/cpu/linear.h"
#include "backend/cpu/norms.h"
#include "backend/cpu/rope.h"
#include "test_util.h"

namespace moeserve::cpu {
namespace {
using testing::random_vector;
using testing::random_weight;
using testing::rel_diff;

std::vector<double> naive_linear(const std::vector<float>& x, int64_t m, const std::vector<float>& w, int64_t n,
                                 int64_t k) {
  std::vector<double> y(size_t(m * n), 0.0);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c)
      for (int64_t i = 0; i < k; ++i) y[size_t(r * n + c)] += double(x[size_t(r * k + i)]) * w[size_t(c * k + i)];
  return y;
}

TEST(CpuLinear, MatchesNaiveProductForOddShapes) {
  ThreadPool pool(3);
  for (auto [m, n, k] : {std::tuple{1, 7, 5}, {5, 131, 77}, {33, 300, 1000}, {2, 3, 8193}}) {
    auto w = random_weight(n, k, 11);
    auto x = random_vector(size_t(m * k), 12);
    std::vector<float> y(size_t(m * n));
    linear(pool, x.data(), m, w, y.data());
    EXPECT_LT(rel_diff(y, naive_linear(x, m, w.part("weight").to_f32(), n, k)), 2e-6) << m << "x" << n << "x" << k;
  }
}

TEST(CpuLinear, ReadsBf16WeightsExactly) {
  ThreadPool pool(2);
  const int64_t n = 40, k = 24;
  std::vector<float> wf = random_vector(size_t(n * k), 3);
  Tensor wb = Tensor::empty(DType::BF16, {n, k});
  for (int64_t i = 0; i < n * k; ++i) wb.data<uint16_t>()[i] = f32_to_bf16(wf[size_t(i)]);
  std::vector<float> rounded = wb.to_f32();
  auto x = random_vector(size_t(3 * k), 4);
  std::vector<float> y(size_t(3 * n));
  linear(pool, x.data(), 3, quant::dense_weight(wb, "bf16"), y.data());
  EXPECT_LT(rel_diff(y, naive_linear(x, 3, rounded, n, k)), 2e-6);
}

TEST(CpuLinear, GroupedEqualsSeparateAndIsThreadCountInvariant) {
  auto w1 = random_weight(70, 33, 1), w2 = random_weight(5, 33, 2);
  auto x = random_vector(size_t(9 * 33), 5);
  std::vector<float> a1(9 * 70), a2(9 * 5), b1(9 * 70), b2(9 * 5);
  ThreadPool one(1), three(3);
  linear(one, x.data(), 9, w1, a1.data());
  linear(one, x.data(), 9, w2, a2.data());
  const LinearProblem probs[] = {{x.data(), 9, &w1, b1.data()}, {x.data(), 9, &w2, b2.data()}};
  linear_grouped(three, probs);
  EXPECT_EQ(a1, b1);
  EXPECT_EQ(a2, b2);
}

TEST(CpuLinear, EveryOutputIsBitwiseTheSharedDotProduct) {
  // Outputs are computed four at a time and one at a time (tile ends); both must sum exactly
  // like cpu::dot, so that no result depends on where it falls in a tile or a batch.
  ThreadPool pool(3);
  for (int64_t k : {5, 8, 77, 1000}) {
    const int64_t m = 3, n = 71;
    auto w = random_weight(n, k, uint32_t(k));
    auto x = random_vector(size_t(m * k), uint32_t(k + 1));
    std::vector<float> y(size_t(m * n));
    linear(pool, x.data(), m, w, y.data());
    const auto wf = w.part("weight").to_f32();
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c)
        ASSERT_EQ(y[size_t(r * n + c)], dot(x.data() + r * k, wf.data() + c * k, k)) << k << " " << r << " " << c;
  }
}

TEST(CpuLinear, StridedInputAndOutput) {
  ThreadPool pool(2);
  auto w = random_weight(6, 4, 9);
  auto x = random_vector(3 * 10, 10);  // rows of 10, the first 4 used
  std::vector<float> y(3 * 8, -1.0f);  // rows of 8, the first 6 written
  const LinearProblem p{x.data(), 3, &w, y.data(), 10, 8};
  linear_grouped(pool, std::span(&p, 1));
  auto wf = w.part("weight").to_f32();
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 6; ++c) {
      double ref = 0;
      for (int i = 0; i < 4; ++i) ref += double(x[size_t(r * 10 + i)]) * wf[size_t(c * 4 + i)];
      EXPECT_NEAR(y[size_t(r * 8 + c)], ref, 1e-5);
    }
    EXPECT_EQ(y[size_t(r * 8 + 6)], -1.0f);
  }
}

TEST(CpuNorms, ZeroCentredRmsNormUsesOnePlusW) {
  const int64_t n = 37;
  auto x = random_vector(n, 1), w = random_vector(n, 2, 0.3f);
  std::vector<float> y(n);
  rms_norm_zero_centred(x.data(), y.data(), n, w.data(), 1e-6f);
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double r = 1.0 / std::sqrt(ss / n + 1e-6);
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[size_t(i)] = x[size_t(i)] * r * (1.0 + w[size_t(i)]);
  EXPECT_LT(rel_diff(y, ref), 1e-6);
}

TEST(CpuNorms, GatedRmsNormUsesPlainWAndSiluGate) {
  const int64_t n = 24;
  auto x = random_vector(n, 3), z = random_vector(n, 4), w = random_vector(n, 5);
  std::vector<float> y(n);
  rms_norm_gated(x.data(), z.data(), y.data(), n, w.data(), 1e-6f);
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double r = 1.0 / std::sqrt(ss / n + 1e-6);
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) {
    const double zi = z[size_t(i)];
    ref[size_t(i)] = w[size_t(i)] * (x[size_t(i)] * r) * (zi / (1.0 + std::exp(-zi)));
  }
  EXPECT_LT(rel_diff(y, ref), 1e-6);
}

TEST(CpuNorms, L2NormalizeHasEpsInsideTheSqrt) {
  std::vector<float> x = {3e-4f, 4e-4f};  // Σx² = 2.5e-7, comparable to eps = 1e-6
  l2_normalize(x.data(), 2, 1e-6f);
  const double r = 1.0 / std::sqrt(2.5e-7 + 1e-6);
  EXPECT_NEAR(x[0], 3e-4 * r, 1e-7);
  EXPECT_NEAR(x[1], 4e-4 * r, 1e-7);
}

TEST(CpuRope, RotatesOnlyTheFirstRotaryDimsNeoxStyle) {
  const int64_t hd = 24, rot = 6;  // head_dim 24, partial factor 0.25 (a fixture's shape)
  RotaryEmbedding rope(rot, 1e7);
  ASSERT_EQ(rope.inv_freq().size(), 3u);
  EXPECT_FLOAT_EQ(rope.inv_freq()[0], 1.0f);
  EXPECT_NEAR(rope.inv_freq()[1], std::pow(1e7, -2.0 / 6), 1e-7);
  EXPECT_NEAR(rope.inv_freq()[2], std::pow(1e7, -4.0 / 6), 1e-9);
  auto x = random_vector(hd, 8);
  auto y = x;
  const int64_t pos = 1234;
  rope.apply(y.data(), pos);
  for (int64_t j = 0; j < 3; ++j) {
    const double f = double(pos) * rope.inv_freq()[size_t(j)];
    EXPECT_NEAR(y[size_t(j)], x[size_t(j)] * std::cos(f) - x[size_t(j + 3)] * std::sin(f), 2e-4);
    EXPECT_NEAR(y[size_t(j + 3)], x[size_t(j + 3)] * std::cos(f) + x[size_t(j)] * std::sin(f), 2e-4);
  }
  for (int64_t j = rot; j < hd; ++j) EXPECT_EQ(y[size_t(j)], x[size_t(j)]);
  auto z = x;
  rope.apply(z.data(), 0);
  EXPECT_EQ(z, x);
}

TEST(CpuRope, RejectsOddRotaryDim) { EXPECT_THROW(RotaryEmbedding(5, 1e7), Error); }

}  // namespace
}  // namespace moeserve::cpu
