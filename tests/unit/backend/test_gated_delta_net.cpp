// Gated DeltaNet: the delta rule (recurrent vs chunked vs a double-precision reference),
// the causal conv with carried state, and the whole mixer under different chunkings.
#include <cmath>

#include <gtest/gtest.h>

#include "backend/cpu/activations.h"
#include "backend/cpu/delta_rule.h"
#include "backend/cpu/gated_delta_net.h"
#include "backend/cpu/norms.h"
#include "test_util.h"

namespace moeserve::cpu {
namespace {
using testing::random_vector;
using testing::rel_diff;

struct DeltaInputs {
  int64_t T, dk, dv;
  std::vector<float> q, k, v, g, beta;
};

DeltaInputs make_inputs(int64_t T, int64_t dk, int64_t dv, uint32_t seed) {
  DeltaInputs in{T, dk, dv, random_vector(size_t(T * dk), seed), random_vector(size_t(T * dk), seed + 1),
                 random_vector(size_t(T * dv), seed + 2), random_vector(size_t(T), seed + 3),
                 random_vector(size_t(T), seed + 4)};
  for (int64_t t = 0; t < T; ++t) {
    l2_normalize(in.q.data() + t * dk, dk, 1e-6f);
    for (int64_t d = 0; d < dk; ++d) in.q[size_t(t * dk + d)] /= std::sqrt(float(dk));
    l2_normalize(in.k.data() + t * dk, dk, 1e-6f);
    in.g[size_t(t)] = -std::exp(0.3f) * softplus(in.g[size_t(t)]);  // decays in (0, 1)
    in.beta[size_t(t)] = sigmoid(in.beta[size_t(t)]);
  }
  return in;
}

DeltaRuleSequence view(DeltaInputs& in, std::vector<float>& out, int64_t t0, int64_t n) {
  DeltaRuleSequence s;
  s.num_tokens = n;
  s.dk = in.dk;
  s.dv = in.dv;
  s.q = in.q.data() + t0 * in.dk;
  s.k = in.k.data() + t0 * in.dk;
  s.ld_qk = in.dk;
  s.v = in.v.data() + t0 * in.dv;
  s.ld_v = in.dv;
  s.g = in.g.data() + t0;
  s.beta = in.beta.data() + t0;
  s.ld_gate = 1;
  s.out = out.data() + t0 * in.dv;
  s.ld_out = in.dv;
  return s;
}

// The recurrence of spec 2.5 step 7 in double precision.
std::vector<double> reference_delta_rule(const DeltaInputs& in, std::vector<double> state) {
  const int64_t dk = in.dk, dv = in.dv;
  std::vector<double> out(size_t(in.T * dv));
  for (int64_t t = 0; t < in.T; ++t) {
    for (auto& s : state) s *= std::exp(double(in.g[size_t(t)]));
    std::vector<double> delta(static_cast<size_t>(dv));
    for (int64_t j = 0; j < dv; ++j) {
      double kv = 0;
      for (int64_t d = 0; d < dk; ++d) kv += state[size_t(d * dv + j)] * in.k[size_t(t * dk + d)];
      delta[size_t(j)] = in.beta[size_t(t)] * (in.v[size_t(t * dv + j)] - kv);
    }
    for (int64_t d = 0; d < dk; ++d)
      for (int64_t j = 0; j < dv; ++j) state[size_t(d * dv + j)] += in.k[size_t(t * dk + d)] * delta[size_t(j)];
    for (int64_t j = 0; j < dv; ++j) {
      double o = 0;
      for (int64_t d = 0; d < dk; ++d) o += state[size_t(d * dv + j)] * in.q[size_t(t * dk + d)];
      out[size_t(t * dv + j)] = o;
    }
  }
  return out;
}

TEST(CpuDeltaRule, RecurrentAndChunkedMatchDoubleReferenceOnLongInput) {
  const int64_t T = 150, dk = 20, dv = 12;
  auto in = make_inputs(T, dk, dv, 100);
  const auto init = random_vector(size_t(dk * dv), 200, 0.5f);
  const auto ref = reference_delta_rule(in, std::vector<double>(init.begin(), init.end()));

  std::vector<float> out_r(size_t(T * dv)), out_c(size_t(T * dv));
  auto state_r = init, state_c = init;
  delta_rule_recurrent(view(in, out_r, 0, T), state_r.data());
  delta_rule_chunked(view(in, out_c, 0, T), state_c.data());
  EXPECT_LT(rel_diff(out_r, ref), 1e-5);
  EXPECT_LT(rel_diff(out_c, ref), 1e-5);
  EXPECT_LT(rel_diff(state_c, state_r), 1e-5);
}

TEST(CpuDeltaRule, ChunkedSplitsAnywhereGiveTheSameResult) {
  const int64_t T = 150, dk = 16, dv = 24;
  auto in = make_inputs(T, dk, dv, 300);
  std::vector<float> whole(size_t(T * dv));
  std::vector<float> state_whole(size_t(dk * dv), 0.0f);
  delta_rule_chunked(view(in, whole, 0, T), state_whole.data());
  for (int64_t split : {1, 37, 63, 64, 65, 100, 149}) {
    std::vector<float> parts(size_t(T * dv));
    std::vector<float> state(size_t(dk * dv), 0.0f);
    delta_rule_chunked(view(in, parts, 0, split), state.data());
    delta_rule_chunked(view(in, parts, split, T - split), state.data());
    EXPECT_LT(rel_diff(parts, whole), 1e-5) << "split at " << split;
    EXPECT_LT(rel_diff(state, state_whole), 1e-5) << "split at " << split;
  }
  for (int64_t chunk : {1, 7, 16}) {
    std::vector<float> out(size_t(T * dv));
    std::vector<float> state(size_t(dk * dv), 0.0f);
    delta_rule_chunked(view(in, out, 0, T), state.data(), chunk);
    EXPECT_LT(rel_diff(out, whole), 1e-5) << "chunk " << chunk;
  }
}

TEST(CpuConv, CausalConvWithCarriedStateMatchesDirectFormula) {
  const int64_t T = 11, C = 5, K = 4;
  auto u = random_vector(size_t(T * C), 1), w = random_vector(size_t(C * K), 2);
  std::vector<float> out_whole(size_t(T * C)), out_split(size_t(T * C));
  std::vector<float> state(size_t(C * (K - 1)), 0.0f);
  causal_conv1d_silu(u.data(), T, C, K, w.data(), state.data(), out_whole.data(), 0, C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t tau = t - (K - 1) + j;
        if (tau >= 0) acc += double(w[size_t(c * K + j)]) * u[size_t(tau * C + c)];
      }
      EXPECT_NEAR(out_whole[size_t(t * C + c)], acc / (1 + std::exp(-acc)), 1e-5);
    }
  // The state after all tokens holds the last K-1 inputs, oldest first.
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < K - 1; ++j) EXPECT_EQ(state[size_t(c * (K - 1) + j)], u[size_t((T - 3 + j) * C + c)]);
  // Token by token from a zero state gives the same outputs.
  std::vector<float> st(size_t(C * (K - 1)), 0.0f);
  for (int64_t t = 0; t < T; ++t)
    causal_conv1d_silu(u.data() + t * C, 1, C, K, w.data(), st.data(), out_split.data() + t * C, 0, C);
  EXPECT_EQ(out_split, out_whole);
}

// The whole mixer: one chunk of 150 tokens == several chunks + single tokens (the delta
// rule switches between chunked and recurrent forms), and threads 1 vs 3 are identical.
struct MixerFixture {
  GdnGeometry geo{2, 6, 20, 12, 4};
  std::vector<float> conv_w, dt_bias, a_log, norm_w;
  GdnParams params() const {
    return GdnParams{conv_w.data(), dt_bias.data(), a_log.data(), norm_w.data(), 1e-6f};
  }
  MixerFixture() {
    conv_w = random_vector(size_t(geo.conv_dim() * geo.conv_kernel), 1, 0.5f);
    dt_bias = random_vector(size_t(geo.num_v_heads), 2, 0.5f);
    a_log = random_vector(size_t(geo.num_v_heads), 3, 0.5f);
    norm_w = random_vector(size_t(geo.v_head_dim), 4);
  }
};

std::vector<float> run_mixer(const MixerFixture& f, int threads, const std::vector<int64_t>& pieces,
                             const std::vector<float>& qkv, const std::vector<float>& z,
                             const std::vector<float>& b, const std::vector<float>& a) {
  ThreadPool pool(threads);
  const auto& g = f.geo;
  int64_t T = 0;
  for (auto p : pieces) T += p;
  std::vector<float> conv_state(size_t(g.conv_state_size()), 0.0f), rec(size_t(g.recurrent_state_size()), 0.0f);
  std::vector<float> out(size_t(T * g.value_dim()));
  int64_t t0 = 0;
  for (auto n : pieces) {
    GdnChunk c{n,
               qkv.data() + t0 * g.conv_dim(),
               z.data() + t0 * g.value_dim(),
               b.data() + t0 * g.num_v_heads,
               a.data() + t0 * g.num_v_heads,
               conv_state.data(),
               rec.data(),
               out.data() + t0 * g.value_dim()};
    gated_delta_net(pool, g, f.params(), std::span(&c, 1));
    t0 += n;
  }
  return out;
}

TEST(CpuGatedDeltaNet, ChunkingAndThreadsDoNotChangeTheOutput) {
  MixerFixture f;
  const int64_t T = 150;
  const auto& g = f.geo;
  auto qkv = random_vector(size_t(T * g.conv_dim()), 10), z = random_vector(size_t(T * g.value_dim()), 11),
       b = random_vector(size_t(T * g.num_v_heads), 12), a = random_vector(size_t(T * g.num_v_heads), 13);
  const auto whole = run_mixer(f, 1, {T}, qkv, z, b, a);
  EXPECT_EQ(run_mixer(f, 3, {T}, qkv, z, b, a), whole);
  const auto pieces = run_mixer(f, 2, {63, 1, 1, 20, 64, 1}, qkv, z, b, a);
  EXPECT_LT(rel_diff(pieces, whole), 1e-5);
}

TEST(CpuGatedDeltaNet, ValueHeadsShareKeyHeadsByRepeatInterleave) {
  // nv/nk = 3: value heads 0,1,2 read key head 0; heads 3,4,5 read key head 1. Make key head
  // 1's q/k inputs zero: then heads 3..5 see q = k = 0, so their delta-rule outputs are 0 and
  // the gated norm turns them into 0 as well, while heads 0..2 are not.
  MixerFixture f;
  const auto& g = f.geo;
  const int64_t T = 5;
  auto qkv = random_vector(size_t(T * g.conv_dim()), 20), z = random_vector(size_t(T * g.value_dim()), 21),
       b = random_vector(size_t(T * g.num_v_heads), 22), a = random_vector(size_t(T * g.num_v_heads), 23);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < g.k_head_dim; ++d) {
      qkv[size_t(t * g.conv_dim() + g.k_head_dim + d)] = 0.0f;                // q of key head 1
      qkv[size_t(t * g.conv_dim() + g.key_dim() + g.k_head_dim + d)] = 0.0f;  // k of key head 1
    }
  const auto out = run_mixer(f, 2, {T}, qkv, z, b, a);
  for (int64_t j = 0; j < g.num_v_heads; ++j) {
    double mag = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < g.v_head_dim; ++e) mag += std::abs(out[size_t(t * g.value_dim() + j * g.v_head_dim + e)]);
    if (j < 3)
      EXPECT_GT(mag, 1e-3) << "head " << j;
    else
      EXPECT_EQ(mag, 0.0) << "head " << j;
  }
}

}  // namespace
}  // namespace moeserve::cpu
