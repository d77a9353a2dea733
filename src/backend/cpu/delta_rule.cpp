#include "backend/cpu/delta_rule.h"

#include <cmath>
#include <vector>

#include "backend/cpu/linear.h"

namespace moeserve::cpu {

void delta_rule_recurrent(const DeltaRuleSequence& s, float* state) {
  const int64_t dk = s.dk, dv = s.dv;
  std::vector<float> kv(static_cast<size_t>(dv));
  for (int64_t t = 0; t < s.num_tokens; ++t) {
    const float* q = s.q + t * s.ld_qk;
    const float* k = s.k + t * s.ld_qk;
    const float* v = s.v + t * s.ld_v;
    const float decay = std::exp(s.g[t * s.ld_gate]);
    const float beta = s.beta[t * s.ld_gate];
    float* out = s.out + t * s.ld_out;

    for (int64_t i = 0; i < dk * dv; ++i) state[i] *= decay;
    std::fill(kv.begin(), kv.end(), 0.0f);
    for (int64_t d = 0; d < dk; ++d)
      for (int64_t j = 0; j < dv; ++j) kv[size_t(j)] += state[d * dv + j] * k[d];
    for (int64_t j = 0; j < dv; ++j) kv[size_t(j)] = (v[j] - kv[size_t(j)]) * beta;  // Δ
    for (int64_t d = 0; d < dk; ++d)
      for (int64_t j = 0; j < dv; ++j) state[d * dv + j] += k[d] * kv[size_t(j)];
    std::fill(out, out + dv, 0.0f);
    for (int64_t d = 0; d < dk; ++d)
      for (int64_t j = 0; j < dv; ++j) out[j] += state[d * dv + j] * q[d];
  }
}

namespace {

// Scratch for one chunk of L ≤ C tokens.
struct ChunkScratch {
  std::vector<float> gamma;    // [L] cumulative g within the chunk
  std::vector<float> k_beta;   // [L][dk] β_i k_i
  std::vector<float> t_mat;    // [L][L] (I + A)^{-1}, unit lower triangular
  std::vector<float> u;        // [L][dv] T·diag(β)·V, then V' = U − W S
  std::vector<float> w;        // [L][dk] T·diag(β e^γ)·K
  std::vector<float> qk;       // [L][L] (q_i·k_j) e^{γ_i−γ_j}, j ≤ i
  std::vector<float> tmp;      // [max(dk, dv)]
};

// Processes tokens [t0, t0 + L) of the sequence, carrying `state`.
void process_chunk(const DeltaRuleSequence& s, int64_t t0, int64_t L, float* state, ChunkScratch& c) {
  const int64_t dk = s.dk, dv = s.dv;
  auto q = [&](int64_t i) { return s.q + (t0 + i) * s.ld_qk; };
  auto k = [&](int64_t i) { return s.k + (t0 + i) * s.ld_qk; };
  auto v = [&](int64_t i) { return s.v + (t0 + i) * s.ld_v; };
  auto beta = [&](int64_t i) { return s.beta[(t0 + i) * s.ld_gate]; };

  c.gamma.resize(size_t(L));
  float acc = 0.0f;
  for (int64_t i = 0; i < L; ++i) c.gamma[size_t(i)] = acc += s.g[(t0 + i) * s.ld_gate];
  auto gamma = [&](int64_t i) { return c.gamma[size_t(i)]; };

  c.k_beta.resize(size_t(L * dk));
  for (int64_t i = 0; i < L; ++i)
    for (int64_t d = 0; d < dk; ++d) c.k_beta[size_t(i * dk + d)] = k(i)[d] * beta(i);

  // Strictly lower part of −A: −β_i (k_i·k_j) e^{γ_i−γ_j}, j < i.
  c.t_mat.assign(size_t(L * L), 0.0f);
  auto T = [&](int64_t i, int64_t j) -> float& { return c.t_mat[size_t(i * L + j)]; };
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < i; ++j)
      T(i, j) = -(dot(c.k_beta.data() + i * dk, k(j), dk) * std::exp(gamma(i) - gamma(j)));
  // Forward substitution, row by row: row_i ← row_i + Σ_m row_i[m] · row_m (rows m < i are
  // final). This turns −A into (I + A)^{-1} − I.
  std::vector<float>& row = c.tmp;
  for (int64_t i = 1; i < L; ++i) {
    row.assign(c.t_mat.begin() + i * L, c.t_mat.begin() + i * L + i);
    for (int64_t j = 0; j < i; ++j) {
      float sum = 0.0f;
      for (int64_t m = j + 1; m < i; ++m) sum += row[size_t(m)] * T(m, j);
      T(i, j) = row[size_t(j)] + sum;
    }
  }
  for (int64_t i = 0; i < L; ++i) T(i, i) = 1.0f;

  // U = T · diag(β) · V  and  W = T · diag(β e^γ) · K (rows j ≤ i of T are nonzero).
  c.u.assign(size_t(L * dv), 0.0f);
  c.w.assign(size_t(L * dk), 0.0f);
  for (int64_t j = 0; j < L; ++j) {  // scale k_beta rows to β_j e^{γ_j} k_j in place
    const float e = std::exp(gamma(j));
    for (int64_t d = 0; d < dk; ++d) c.k_beta[size_t(j * dk + d)] *= e;
  }
  for (int64_t i = 0; i < L; ++i) {
    float* ui = c.u.data() + i * dv;
    float* wi = c.w.data() + i * dk;
    for (int64_t j = 0; j <= i; ++j) {
      const float tij = T(i, j);
      const float bj = beta(j);
      const float* vj = v(j);
      const float* kj = c.k_beta.data() + j * dk;
      for (int64_t e = 0; e < dv; ++e) ui[e] += tij * (vj[e] * bj);
      for (int64_t d = 0; d < dk; ++d) wi[d] += tij * kj[d];
    }
  }

  // V' = U − W S.
  for (int64_t i = 0; i < L; ++i) {
    const float* wi = c.w.data() + i * dk;
    float* ui = c.u.data() + i * dv;
    for (int64_t d = 0; d < dk; ++d)
      for (int64_t e = 0; e < dv; ++e) ui[e] -= wi[d] * state[d * dv + e];
  }

  // O_i = e^{γ_i} q_i S + Σ_{j≤i} (q_i·k_j) e^{γ_i−γ_j} V'_j.
  for (int64_t i = 0; i < L; ++i) {
    float* out = s.out + (t0 + i) * s.ld_out;
    std::fill(out, out + dv, 0.0f);
    const float eg = std::exp(gamma(i));
    for (int64_t d = 0; d < dk; ++d) {
      const float qd = q(i)[d] * eg;
      for (int64_t e = 0; e < dv; ++e) out[e] += qd * state[d * dv + e];
    }
    for (int64_t j = 0; j <= i; ++j) {
      const float a = dot(q(i), k(j), dk) * std::exp(gamma(i) - gamma(j));
      const float* vj = c.u.data() + j * dv;
      for (int64_t e = 0; e < dv; ++e) out[e] += a * vj[e];
    }
  }

  // S ← e^{γ_last} S + Σ_i (e^{γ_last−γ_i} k_i) ⊗ V'_i.
  const float g_last = gamma(L - 1);
  const float decay = std::exp(g_last);
  for (int64_t i = 0; i < dk * dv; ++i) state[i] *= decay;
  for (int64_t i = 0; i < L; ++i) {
    const float f = std::exp(g_last - gamma(i));
    const float* vi = c.u.data() + i * dv;
    for (int64_t d = 0; d < dk; ++d) {
      const float kd = k(i)[d] * f;
      for (int64_t e = 0; e < dv; ++e) state[d * dv + e] += kd * vi[e];
    }
  }
}

}  // namespace

void delta_rule_chunked(const DeltaRuleSequence& s, float* state, int64_t chunk_size) {
  ChunkScratch scratch;
  for (int64_t t0 = 0; t0 < s.num_tokens; t0 += chunk_size)
    process_chunk(s, t0, std::min(chunk_size, s.num_tokens - t0), state, scratch);
}

}  // namespace moeserve::cpu
