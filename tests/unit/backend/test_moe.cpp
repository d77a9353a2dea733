// MoE routing and the expert block against a per-token double-precision reference.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <gtest/gtest.h>

#include "backend/cpu/moe.h"
#include "test_util.h"

namespace moeserve::cpu {
namespace {
using testing::random_vector;
using testing::random_weight;
using testing::rel_diff;

TEST(CpuMoe, RouteTopKRenormalisesSoftmaxProbabilities) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  int32_t ids[3];
  float w[3];
  route_top_k(logits.data(), 5, 3, ids, w);
  EXPECT_EQ(ids[0], 1);  // tie with expert 3: lower id first
  EXPECT_EQ(ids[1], 3);
  EXPECT_EQ(ids[2], 4);
  const double e2 = std::exp(2.0), e1 = std::exp(1.0), s = 2 * e2 + e1;
  EXPECT_NEAR(w[0], e2 / s, 1e-6);
  EXPECT_NEAR(w[1], e2 / s, 1e-6);
  EXPECT_NEAR(w[2], e1 / s, 1e-6);
}

struct TinyMoe {
  int64_t H = 20, I = 12, Is = 9, E = 7, k = 3;
  quant::QuantWeight router, shared_gate;
  std::vector<quant::QuantWeight> gates, ups, downs;
  quant::QuantWeight sg, su, sd;
  std::vector<ExpertWeights> experts;

  TinyMoe() {
    router = random_weight(E, H, 1, "router");
    shared_gate = random_weight(1, H, 2, "shared_expert_gate");
    for (int64_t e = 0; e < E; ++e) {
      gates.push_back(random_weight(I, H, uint32_t(10 + e)));
      ups.push_back(random_weight(I, H, uint32_t(20 + e)));
      downs.push_back(random_weight(H, I, uint32_t(30 + e)));
    }
    sg = random_weight(Is, H, 3);
    su = random_weight(Is, H, 4);
    sd = random_weight(H, Is, 5);
    for (int64_t e = 0; e < E; ++e) experts.push_back({&gates[size_t(e)], &ups[size_t(e)], &downs[size_t(e)]});
  }
  MoeParams params() const { return MoeParams{&router, experts, {&sg, &su, &sd}, &shared_gate, k}; }
};

std::vector<double> matvec(const quant::QuantWeight& w, const std::vector<double>& x) {
  const auto wf = w.part("weight").to_f32();
  std::vector<double> y(size_t(w.out_features), 0.0);
  for (int64_t n = 0; n < w.out_features; ++n)
    for (int64_t i = 0; i < w.in_features; ++i) y[size_t(n)] += wf[size_t(n * w.in_features + i)] * x[size_t(i)];
  return y;
}

std::vector<double> swiglu_mlp(const quant::QuantWeight& g, const quant::QuantWeight& u, const quant::QuantWeight& d,
                               const std::vector<double>& x) {
  auto a = matvec(g, x), b = matvec(u, x);
  for (size_t i = 0; i < a.size(); ++i) a[i] = a[i] / (1 + std::exp(-a[i])) * b[i];
  return matvec(d, a);
}

TEST(CpuMoe, MatchesPerTokenReferenceAndIsThreadCountInvariant) {
  TinyMoe moe;
  const int64_t M = 13;
  auto x = random_vector(size_t(M * moe.H), 50);
  std::vector<float> out1(size_t(M * moe.H)), out3(size_t(M * moe.H));
  ThreadPool one(1), three(3);
  moe_forward(one, moe.params(), x.data(), M, out1.data());
  moe_forward(three, moe.params(), x.data(), M, out3.data());
  EXPECT_EQ(out1, out3);

  std::vector<double> ref;
  for (int64_t t = 0; t < M; ++t) {
    std::vector<double> xt(x.begin() + t * moe.H, x.begin() + (t + 1) * moe.H);
    auto logits = matvec(moe.router, xt);
    std::vector<double> p(logits.size());
    double mx = *std::max_element(logits.begin(), logits.end()), den = 0;
    for (size_t e = 0; e < p.size(); ++e) den += p[e] = std::exp(logits[e] - mx);
    std::vector<int> order(p.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
    double top_sum = 0;
    for (int r = 0; r < moe.k; ++r) top_sum += p[size_t(order[size_t(r)])];
    std::vector<double> y(size_t(moe.H), 0.0);
    for (int r = 0; r < moe.k; ++r) {
      const int e = order[size_t(r)];
      auto ye = swiglu_mlp(moe.gates[size_t(e)], moe.ups[size_t(e)], moe.downs[size_t(e)], xt);
      for (int64_t h = 0; h < moe.H; ++h) y[size_t(h)] += p[size_t(e)] / top_sum * ye[size_t(h)];
    }
    auto sh = swiglu_mlp(moe.sg, moe.su, moe.sd, xt);
    const double gate = 1 / (1 + std::exp(-matvec(moe.shared_gate, xt)[0]));
    for (int64_t h = 0; h < moe.H; ++h) ref.push_back(y[size_t(h)] + gate * sh[size_t(h)]);
  }
  EXPECT_LT(rel_diff(out1, ref), 1e-5);
}

TEST(CpuMoe, RejectsRouterExpertCountMismatch) {
  TinyMoe moe;
  auto p = moe.params();
  p.experts = std::span<const ExpertWeights>(moe.experts.data(), 5);
  std::vector<float> x(size_t(moe.H)), out(size_t(moe.H));
  ThreadPool pool(1);
  EXPECT_THROW(moe_forward(pool, p, x.data(), 1, out.data()), Error);
}

}  // namespace
}  // namespace moeserve::cpu
