#include "backend/cpu/gated_delta_net.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/activations.h"
#include "backend/cpu/delta_rule.h"
#include "backend/cpu/norms.h"
#include "core/error.h"

namespace moeserve::cpu {

void causal_conv1d_silu(const float* u, int64_t num_tokens, int64_t channels, int64_t kernel,
                        const float* weight, float* conv_state, float* out, int64_t c0, int64_t c1) {
  const int64_t hist = kernel - 1;
  std::vector<float> window(static_cast<size_t>(kernel));
  for (int64_t c = c0; c < c1; ++c) {
    const float* w = weight + c * kernel;
    float* state = conv_state + c * hist;
    // window = [state (oldest first) | current input]; slides one token at a time.
    std::copy(state, state + hist, window.begin());
    for (int64_t t = 0; t < num_tokens; ++t) {
      window[size_t(hist)] = u[t * channels + c];
      float acc = 0.0f;
      for (int64_t j = 0; j < kernel; ++j) acc += w[j] * window[size_t(j)];
      out[t * channels + c] = silu(acc);
      std::copy(window.begin() + 1, window.end(), window.begin());
    }
    std::copy(window.begin(), window.begin() + hist, state);
  }
}

namespace {

// Per chunk scratch: conv output (normalised q/k in place) and the gates.
struct ChunkWork {
  std::vector<float> conv;  // [T][conv_dim]
  std::vector<float> g;     // [T][nv]
  std::vector<float> beta;  // [T][nv]
  std::vector<float> core;  // [T][nv·dv] delta-rule output before the gated norm
};

}  // namespace

void gated_delta_net(ThreadPool& pool, const GdnGeometry& geo, const GdnParams& params,
                     std::span<const GdnChunk> chunks, DeltaRuleMode mode) {
  MOESERVE_CHECK(geo.num_k_heads > 0 && geo.num_v_heads % geo.num_k_heads == 0,
                 "GDN: {} value heads are not a multiple of {} key heads", geo.num_v_heads, geo.num_k_heads);
  MOESERVE_CHECK(geo.conv_kernel >= 2, "GDN: conv kernel must be at least 2, got {}", geo.conv_kernel);
  const int64_t nk = geo.num_k_heads, nv = geo.num_v_heads, dk = geo.k_head_dim, dv = geo.v_head_dim;
  const int64_t conv_dim = geo.conv_dim(), key_dim = geo.key_dim(), value_dim = geo.value_dim();
  const int64_t heads_per_k = nv / nk;
  const size_t n = chunks.size();
  std::vector<ChunkWork> work(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t T = chunks[i].num_tokens;
    work[i].conv.resize(size_t(T * conv_dim));
    work[i].g.resize(size_t(T * nv));
    work[i].beta.resize(size_t(T * nv));
    work[i].core.resize(size_t(T * value_dim));
  }

  // 1. Conv + SiLU, threaded over (chunk, channel block).
  constexpr int64_t kChannelBlock = 256;
  const int64_t blocks_per_chunk = (conv_dim + kChannelBlock - 1) / kChannelBlock;
  pool.parallel_for(int64_t(n) * blocks_per_chunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const GdnChunk& c = chunks[size_t(i / blocks_per_chunk)];
      const int64_t c0 = (i % blocks_per_chunk) * kChannelBlock;
      causal_conv1d_silu(c.qkv, c.num_tokens, conv_dim, geo.conv_kernel, params.conv_weight, c.conv_state,
                         work[size_t(i / blocks_per_chunk)].conv.data(), c0, std::min(c0 + kChannelBlock, conv_dim));
    }
  });

  // 2. Per token: l2-normalise q (then scale by 1/sqrt(dk)) and k per key head; the gates.
  std::vector<int64_t> first_token(n + 1, 0);
  for (size_t i = 0; i < n; ++i) first_token[i + 1] = first_token[i] + chunks[i].num_tokens;
  const float q_scale = 1.0f / std::sqrt(float(dk));
  pool.parallel_for(first_token.back(), [&](int64_t r0, int64_t r1) {
    size_t ci = size_t(std::upper_bound(first_token.begin(), first_token.end(), r0) - first_token.begin()) - 1;
    for (int64_t r = r0; r < r1; ++r) {
      while (r >= first_token[ci + 1]) ++ci;
      const int64_t t = r - first_token[ci];
      float* row = work[ci].conv.data() + t * conv_dim;
      for (int64_t h = 0; h < nk; ++h) {
        float* q = row + h * dk;
        l2_normalize(q, dk, 1e-6f);
        for (int64_t d = 0; d < dk; ++d) q[d] *= q_scale;
        l2_normalize(row + key_dim + h * dk, dk, 1e-6f);
      }
      const GdnChunk& c = chunks[ci];
      for (int64_t j = 0; j < nv; ++j) {
        work[ci].beta[size_t(t * nv + j)] = sigmoid(c.b[t * nv + j]);
        work[ci].g[size_t(t * nv + j)] =
            -std::exp(params.a_log[j]) * softplus(c.a[t * nv + j] + params.dt_bias[j]);
      }
    }
  }, 4);

  // 3. The delta rule, threaded over (chunk, value head); then the gated norm of that head.
  pool.parallel_for(int64_t(n) * nv, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const size_t ci = size_t(i / nv);
      const int64_t j = i % nv, kh = j / heads_per_k;
      const GdnChunk& c = chunks[ci];
      ChunkWork& w = work[ci];
      DeltaRuleSequence seq;
      seq.num_tokens = c.num_tokens;
      seq.dk = dk;
      seq.dv = dv;
      seq.q = w.conv.data() + kh * dk;
      seq.k = w.conv.data() + key_dim + kh * dk;
      seq.ld_qk = conv_dim;
      seq.v = w.conv.data() + 2 * key_dim + j * dv;
      seq.ld_v = conv_dim;
      seq.g = w.g.data() + j;
      seq.beta = w.beta.data() + j;
      seq.ld_gate = nv;
      seq.out = w.core.data() + j * dv;
      seq.ld_out = value_dim;
      float* state = c.recurrent_state + j * dk * dv;
      const bool recurrent =
          mode == DeltaRuleMode::Recurrent || (mode == DeltaRuleMode::Auto && c.num_tokens == 1);
      if (recurrent)
        delta_rule_recurrent(seq, state);
      else
        delta_rule_chunked(seq, state);
      for (int64_t t = 0; t < c.num_tokens; ++t)
        rms_norm_gated(w.core.data() + t * value_dim + j * dv, c.z + t * value_dim + j * dv,
                       c.out + t * value_dim + j * dv, dv, params.norm_weight, params.norm_eps);
    }
  });
}

}  // namespace moeserve::cpu
