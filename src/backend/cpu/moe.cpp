#include "backend/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/activations.h"
#include "backend/cpu/linear.h"
#include "core/error.h"

namespace moeserve::cpu {

void route_top_k(const float* logits, int64_t num_experts, int64_t top_k, int32_t* ids, float* weights) {
  thread_local std::vector<float> probs;
  thread_local std::vector<int32_t> order;
  probs.resize(size_t(num_experts));
  const float max_logit = *std::max_element(logits, logits + num_experts);
  float denom = 0.0f;
  for (int64_t e = 0; e < num_experts; ++e) denom += probs[size_t(e)] = std::exp(logits[e] - max_logit);
  for (auto& p : probs) p /= denom;

  order.resize(size_t(num_experts));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
    return probs[size_t(a)] != probs[size_t(b)] ? probs[size_t(a)] > probs[size_t(b)] : a < b;
  });
  float sum = 0.0f;
  for (int64_t r = 0; r < top_k; ++r) sum += probs[size_t(order[size_t(r)])];
  for (int64_t r = 0; r < top_k; ++r) {
    ids[r] = order[size_t(r)];
    weights[r] = probs[size_t(order[size_t(r)])] / sum;
  }
}

namespace {

void check_params(const MoeParams& p) {
  MOESERVE_CHECK(p.router && p.shared_gate && p.shared.gate && p.shared.up && p.shared.down,
                 "MoE: router, shared expert and shared expert gate are required");
  MOESERVE_CHECK(p.router->out_features == int64_t(p.experts.size()),
                 "MoE: router '{}' has {} outputs for {} experts", p.router->name, p.router->out_features,
                 p.experts.size());
  MOESERVE_CHECK(p.top_k > 0 && p.top_k <= int64_t(p.experts.size()), "MoE: top_k {} is not in [1, {}]",
                 p.top_k, p.experts.size());
}

// h = silu(g) ⊙ u over n values, written into g.
void swiglu_in_place(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = silu(g[i]) * u[i];
}

}  // namespace

void moe_forward(ThreadPool& pool, const MoeParams& p, const float* x, int64_t m, float* out) {
  check_params(p);
  const int64_t hidden = p.router->in_features;
  const int64_t num_experts = int64_t(p.experts.size());
  const int64_t k = p.top_k;
  const int64_t shared_inter = p.shared.gate->out_features;

  // Router, shared-expert gate scalar, and the shared expert's gate/up projections.
  std::vector<float> logits(size_t(m * num_experts)), shared_scalar(static_cast<size_t>(m));
  std::vector<float> shared_g(size_t(m * shared_inter)), shared_u(size_t(m * shared_inter));
  {
    const LinearProblem first[] = {{x, m, p.router, logits.data()},
                                   {x, m, p.shared_gate, shared_scalar.data()},
                                   {x, m, p.shared.gate, shared_g.data()},
                                   {x, m, p.shared.up, shared_u.data()}};
    linear_grouped(pool, first);
  }

  // Routing, then the tokens of each expert in increasing token order.
  std::vector<int32_t> ids(size_t(m * k));
  std::vector<float> weights(size_t(m * k));
  for (int64_t t = 0; t < m; ++t)
    route_top_k(logits.data() + t * num_experts, num_experts, k, ids.data() + t * k, weights.data() + t * k);
  std::vector<std::vector<int64_t>> tokens_of(static_cast<size_t>(num_experts));  // entries t·k + r
  for (int64_t i = 0; i < m * k; ++i) tokens_of[size_t(ids[size_t(i)])].push_back(i);

  struct Active {
    int64_t expert;
    std::vector<float> x, g, u, y;  // gathered inputs [n, H], [n, I] x2, outputs [n, H]
  };
  std::vector<Active> active;
  for (int64_t e = 0; e < num_experts; ++e) {
    const auto& list = tokens_of[size_t(e)];
    if (list.empty()) continue;
    const ExpertWeights& w = p.experts[size_t(e)];
    const int64_t n = int64_t(list.size()), inter = w.gate->out_features;
    Active a{e, std::vector<float>(size_t(n * hidden)), std::vector<float>(size_t(n * inter)),
             std::vector<float>(size_t(n * inter)), std::vector<float>(size_t(n * hidden))};
    for (int64_t i = 0; i < n; ++i) {
      const float* src = x + (list[size_t(i)] / k) * hidden;
      std::copy(src, src + hidden, a.x.data() + i * hidden);
    }
    active.push_back(std::move(a));
  }

  // Gate and up projections of every active expert in one launch; then the down projections
  // together with the shared expert's down projection.
  std::vector<LinearProblem> problems;
  for (auto& a : active) {
    const int64_t n = int64_t(tokens_of[size_t(a.expert)].size());
    problems.push_back({a.x.data(), n, p.experts[size_t(a.expert)].gate, a.g.data()});
    problems.push_back({a.x.data(), n, p.experts[size_t(a.expert)].up, a.u.data()});
  }
  linear_grouped(pool, problems);
  problems.clear();
  for (auto& a : active) swiglu_in_place(a.g.data(), a.u.data(), int64_t(a.g.size()));
  swiglu_in_place(shared_g.data(), shared_u.data(), int64_t(shared_g.size()));
  std::vector<float> shared_y(size_t(m * hidden));
  for (auto& a : active) {
    const int64_t n = int64_t(tokens_of[size_t(a.expert)].size());
    problems.push_back({a.g.data(), n, p.experts[size_t(a.expert)].down, a.y.data()});
  }
  problems.push_back({shared_g.data(), m, p.shared.down, shared_y.data()});
  linear_grouped(pool, problems);

  // Combine: routed sum in increasing expert order, then the gated shared expert.
  std::fill(out, out + m * hidden, 0.0f);
  for (auto& a : active) {
    const auto& list = tokens_of[size_t(a.expert)];
    for (size_t i = 0; i < list.size(); ++i) {
      const float w = weights[size_t(list[i])];
      float* dst = out + (list[i] / k) * hidden;
      const float* y = a.y.data() + int64_t(i) * hidden;
      for (int64_t h = 0; h < hidden; ++h) dst[h] += y[h] * w;
    }
  }
  for (int64_t t = 0; t < m; ++t) {
    const float s = sigmoid(shared_scalar[size_t(t)]);
    for (int64_t h = 0; h < hidden; ++h) out[t * hidden + h] += s * shared_y[size_t(t * hidden + h)];
  }
}

}  // namespace moeserve::cpu
