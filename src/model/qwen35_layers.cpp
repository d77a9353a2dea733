#include "model/qwen35_layers.h"

#include <cmath>
#include <vector>

#include "backend/cpu/activations.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/gated_delta_net.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/norms.h"
#include "core/error.h"

namespace moeserve::model {

void full_attention_block(const StepContext& ctx, const AttentionWeights& w, cpu::PagedKvCache& kv,
                          const float* x, float* out) {
  const auto& cfg = ctx.config;
  const int64_t R = ctx.rows, nq = cfg.num_attention_heads, nkv = cfg.num_key_value_heads, hd = cfg.head_dim;
  const float eps = float(cfg.rms_norm_eps);
  std::vector<float> qg(size_t(R * nq * 2 * hd)), k(size_t(R * nkv * hd)), v(size_t(R * nkv * hd));
  {
    const cpu::LinearProblem p[] = {
        {x, R, &w.q_proj, qg.data()}, {x, R, &w.k_proj, k.data()}, {x, R, &w.v_proj, v.data()}};
    cpu::linear_grouped(ctx.pool, p);
  }
  // Split each head's [query | gate] (step 1), q_norm/k_norm (step 3), partial RoPE (step 4).
  std::vector<float> q(size_t(R * nq * hd)), gate(size_t(R * nq * hd));
  ctx.pool.parallel_for(R, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t pos = ctx.positions[size_t(r)];
      for (int64_t h = 0; h < nq; ++h) {
        const float* src = qg.data() + (r * nq + h) * 2 * hd;
        float* qh = q.data() + (r * nq + h) * hd;
        std::copy(src + hd, src + 2 * hd, gate.data() + (r * nq + h) * hd);
        cpu::rms_norm_zero_centred(src, qh, hd, w.q_norm.data(), eps);
        ctx.rope.apply(qh, pos);
      }
      for (int64_t h = 0; h < nkv; ++h) {
        float* kh = k.data() + (r * nkv + h) * hd;
        cpu::rms_norm_zero_centred(kh, kh, hd, w.k_norm.data(), eps);
        ctx.rope.apply(kh, pos);
      }
    }
  }, 4);
  // Cache the new K/V, then attend (step 5) over each sequence's whole prefix.
  std::vector<cpu::AttentionChunk> chunks;
  std::vector<float> o(size_t(R * nq * hd));
  for (const SeqRows& s : ctx.seqs) {
    kv.write(s.kv_blocks, s.start_pos, s.num_tokens, k.data() + s.first_row * nkv * hd,
             v.data() + s.first_row * nkv * hd);
    chunks.push_back({q.data() + s.first_row * nq * hd, o.data() + s.first_row * nq * hd, s.num_tokens,
                      s.start_pos, s.kv_blocks});
  }
  cpu::paged_attention(ctx.pool, kv, nq, 1.0f / std::sqrt(float(hd)), chunks);
  // Output gate and o_proj (step 6).
  for (size_t i = 0; i < o.size(); ++i) o[i] *= cpu::sigmoid(gate[i]);
  cpu::linear(ctx.pool, o.data(), R, w.o_proj, out);
}

void gated_delta_net_block(const StepContext& ctx, const GdnWeights& w, GdnLayerStates& states, const float* x,
                           float* out) {
  const auto& cfg = ctx.config;
  const cpu::GdnGeometry geo{cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                             cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim};
  const int64_t R = ctx.rows, nv = geo.num_v_heads;
  std::vector<float> qkv(size_t(R * geo.conv_dim())), z(size_t(R * geo.value_dim())), b(size_t(R * nv)),
      a(size_t(R * nv));
  {
    const cpu::LinearProblem p[] = {{x, R, &w.in_proj_qkv, qkv.data()},
                                    {x, R, &w.in_proj_z, z.data()},
                                    {x, R, &w.in_proj_b, b.data()},
                                    {x, R, &w.in_proj_a, a.data()}};
    cpu::linear_grouped(ctx.pool, p);
  }
  std::vector<float> core(size_t(R * geo.value_dim()));
  std::vector<cpu::GdnChunk> chunks;
  for (const SeqRows& s : ctx.seqs) {
    const int64_t r = s.first_row;
    chunks.push_back({s.num_tokens, qkv.data() + r * geo.conv_dim(), z.data() + r * geo.value_dim(),
                      b.data() + r * nv, a.data() + r * nv, states.conv(s.state_slot),
                      states.recurrent(s.state_slot), core.data() + r * geo.value_dim()});
  }
  const cpu::GdnParams params{w.conv1d.data(), w.dt_bias.data(), w.a_log.data(), w.norm.data(),
                              float(cfg.rms_norm_eps)};
  cpu::gated_delta_net(ctx.pool, geo, params, chunks);
  cpu::linear(ctx.pool, core.data(), R, w.out_proj, out);
}

void moe_block(const StepContext& ctx, const MoeWeights& w, const float* x, float* out) {
  std::vector<cpu::ExpertWeights> experts;
  experts.reserve(w.experts.size());
  for (const auto& e : w.experts) experts.push_back({&e.gate, &e.up, &e.down});
  const cpu::MoeParams params{&w.router, experts, {&w.shared.gate, &w.shared.up, &w.shared.down}, &w.shared_gate,
                              ctx.config.num_experts_per_tok};
  cpu::moe_forward(ctx.pool, params, x, ctx.rows, out);
}

void decoder_layer(const StepContext& ctx, const DecoderLayerWeights& w, LayerCaches caches, float* h) {
  const int64_t R = ctx.rows, H = ctx.config.hidden_size;
  const float eps = float(ctx.config.rms_norm_eps);
  std::vector<float> normed(size_t(R * H)), delta(size_t(R * H));
  cpu::rms_norm_zero_centred_rows(ctx.pool, h, normed.data(), R, H, w.input_norm.data(), eps);
  if (w.type == io::LayerType::FullAttention) {
    MOESERVE_CHECK(w.attention && caches.kv, "full-attention layer without weights or KV cache");
    full_attention_block(ctx, *w.attention, *caches.kv, normed.data(), delta.data());
  } else {
    MOESERVE_CHECK(w.gdn && caches.gdn, "linear-attention layer without weights or state slots");
    gated_delta_net_block(ctx, *w.gdn, *caches.gdn, normed.data(), delta.data());
  }
  for (int64_t i = 0; i < R * H; ++i) h[i] += delta[size_t(i)];
  cpu::rms_norm_zero_centred_rows(ctx.pool, h, normed.data(), R, H, w.post_attention_norm.data(), eps);
  moe_block(ctx, w.moe, normed.data(), delta.data());
  for (int64_t i = 0; i < R * H; ++i) h[i] += delta[size_t(i)];
}

}  // namespace moeserve::model
