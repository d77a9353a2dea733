#include "layerwise_emulation.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/activations.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/gated_delta_net.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/norms.h"
#include "backend/cuda/moe_int_arith.h"
#include "core/error.h"
#include "gpu_test_util.h"

namespace moeserve::gputest {

namespace {

constexpr int64_t kBlock = 16;

// What upload_linear multiplies by (device_linear.cpp): BF16 as stored; F32/F16 and NVFP4
// dequantised and rounded to bf16; GPTQ, FP8 and INT8 dequantised exactly in registers.
quant::QuantWeight as_uploaded(const quant::QuantWeight& w) {
  const bool dense_bf16 = w.format == quant::WeightFormat::Dense && w.part("weight").dtype() == DType::BF16;
  const bool rounded = (w.format == quant::WeightFormat::Dense && !dense_bf16) || w.format == quant::WeightFormat::Nvfp4;
  if (!rounded) return w;
  std::vector<float> v(size_t(w.out_features * w.in_features));
  w.dequantize_rows(0, w.out_features, v.data());
  round_bf16_inplace(v);
  return quant::dense_weight(Tensor::from_f32(v, {w.out_features, w.in_features}), w.name);
}

void round_expert(model::ExpertMlpWeights& e) {
  e.gate = as_uploaded(e.gate);
  e.up = as_uploaded(e.up);
  e.down = as_uploaded(e.down);
}

std::vector<float> linear(ThreadPool& pool, const std::vector<float>& x, int64_t rows, const quant::QuantWeight& w) {
  std::vector<float> y(size_t(rows * w.out_features));
  cpu::linear(pool, x.data(), rows, w, y.data());
  return y;
}

// The activations a side projection (router, in_proj_b/a, shared_expert_gate) reads: the
// unrounded norm output when the CUDA model can take it (small_linear_supported: a dense
// weight with K % 8 == 0, NVFP4 being dense on the GPU), else the bf16 copy.
const std::vector<float>& side_input(const quant::QuantWeight& w, const Bf16Points& points,
                                     const std::vector<float>& xn, const std::vector<float>& xb) {
  const bool dense = w.format == quant::WeightFormat::Dense || w.format == quant::WeightFormat::Nvfp4;
  return (points.side_inputs || !dense || w.in_features % 8 != 0) ? xb : xn;
}

std::vector<float> rms_rows(ThreadPool& pool, const float* h, int64_t rows, int64_t H, const std::vector<float>& w,
                            float eps) {
  std::vector<float> out(size_t(rows * H));
  cpu::rms_norm_zero_centred_rows(pool, h, out.data(), rows, H, w.data(), eps);
  return out;
}

}  // namespace

model::Qwen35Weights weights_as_uploaded(const model::Qwen35Weights& w) {
  model::Qwen35Weights r = w;
  r.embed_tokens = as_uploaded(w.embed_tokens);
  r.lm_head = as_uploaded(w.lm_head);
  for (auto& l : r.layers) {
    if (l.attention) {
      auto& a = *l.attention;
      a.q_proj = as_uploaded(a.q_proj);
      a.k_proj = as_uploaded(a.k_proj);
      a.v_proj = as_uploaded(a.v_proj);
      a.o_proj = as_uploaded(a.o_proj);
    }
    if (l.gdn) {
      auto& g = *l.gdn;
      g.in_proj_qkv = as_uploaded(g.in_proj_qkv);
      g.in_proj_z = as_uploaded(g.in_proj_z);
      g.in_proj_b = as_uploaded(g.in_proj_b);
      g.in_proj_a = as_uploaded(g.in_proj_a);
      g.out_proj = as_uploaded(g.out_proj);
    }
    l.moe.router = as_uploaded(l.moe.router);
    l.moe.shared_gate = as_uploaded(l.moe.shared_gate);
    round_expert(l.moe.shared);
    for (auto& e : l.moe.experts) round_expert(e);
  }
  r.mtp.reset();
  return r;
}

EmulatedForward::EmulatedForward(const io::Qwen35Config& config, const model::Qwen35Weights& weights,
                                 Bf16Points points, ThreadPool& pool, int max_tokens)
    : config_(config),
      weights_(points.weights ? weights_as_uploaded(weights) : weights),
      points_(points),
      pool_(pool),
      rope_(config.rotary_dim(), config.rope_theta) {
  const int64_t nblocks = (max_tokens + kBlock - 1) / kBlock;
  blocks_.resize(size_t(nblocks));
  std::iota(blocks_.begin(), blocks_.end(), 0);
  const cpu::GdnGeometry geo{config.linear_num_key_heads, config.linear_num_value_heads, config.linear_key_head_dim,
                             config.linear_value_head_dim, config.linear_conv_kernel_dim};
  for (const auto& l : weights_.layers) {
    if (l.type == io::LayerType::FullAttention) {
      cache_index_.push_back(int(kv_.size()));
      kv_.emplace_back(cpu::KvGeometry{config.num_key_value_heads, config.head_dim, kBlock}, nblocks);
    } else {
      cache_index_.push_back(int(conv_.size()));
      conv_.emplace_back(size_t(geo.conv_state_size()), 0.0f);
      recurrent_.emplace_back(size_t(geo.recurrent_state_size()), 0.0f);
    }
  }
  residuals_.resize(2 * weights_.layers.size());
  routing_.resize(weights_.layers.size());
}

void EmulatedForward::round(std::vector<float>& v, bool at) const {
  if (at) round_bf16_inplace(v);
}

std::vector<float> EmulatedForward::final_normed(const std::vector<float>& residual) const {
  const int64_t H = config_.hidden_size;
  std::vector<float> out = rms_rows(pool_, residual.data(), int64_t(residual.size()) / H, H, weights_.final_norm,
                                    float(config_.rms_norm_eps));
  round(out, points_.final_norm_out);
  return out;
}

void EmulatedForward::step(std::span<const int32_t> tokens, bool prompt) {
  const int64_t R = int64_t(tokens.size()), H = config_.hidden_size;
  MOESERVE_CHECK(fed_ + R <= int64_t(blocks_.size()) * kBlock, "EmulatedForward: more tokens than max_tokens");
  const float eps = float(config_.rms_norm_eps);
  std::vector<float> h(size_t(R * H));
  for (int64_t i = 0; i < R; ++i)
    weights_.embed_tokens.dequantize_rows(tokens[size_t(i)], tokens[size_t(i)] + 1, h.data() + i * H);
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    const auto& L = weights_.layers[l];
    {
      std::vector<float> xn = rms_rows(pool_, h.data(), R, H, L.input_norm, eps), xb = xn;
      round(xb, points_.norm_out);
      if (L.type == io::LayerType::FullAttention)
        attention(l, xn, xb, R, fed_, h.data());
      else
        gdn(l, xn, xb, R, h.data());
    }
    residuals_[2 * l].insert(residuals_[2 * l].end(), h.begin(), h.end());
    {
      std::vector<float> xn = rms_rows(pool_, h.data(), R, H, L.post_attention_norm, eps), xb = xn;
      round(xb, points_.norm_out);
      moe(l, xn, xb, R, prompt, h.data());
    }
    residuals_[2 * l + 1].insert(residuals_[2 * l + 1].end(), h.begin(), h.end());
  }
  const std::vector<float> head_in = final_normed(h);
  const std::vector<float> lg = linear(pool_, head_in, R, weights_.lm_head);
  logits_.insert(logits_.end(), lg.begin(), lg.end());
  fed_ += R;
}

// Spec 2.3 with the CUDA model's storage: q_proj/k_proj/v_proj outputs, the normalised and
// rotated q and K, the cache, and the gated output each rounded where the GPU keeps bf16.
void EmulatedForward::attention(size_t layer, const std::vector<float>&, const std::vector<float>& xb, int64_t R,
                                int64_t start, float* h) {
  const auto& w = *weights_.layers[layer].attention;
  const int64_t nq = config_.num_attention_heads, nkv = config_.num_key_value_heads, hd = config_.head_dim;
  const float eps = float(config_.rms_norm_eps);
  std::vector<float> qg = linear(pool_, xb, R, w.q_proj), k = linear(pool_, xb, R, w.k_proj),
                     v = linear(pool_, xb, R, w.v_proj);
  round(qg, points_.attn_projections);
  round(k, points_.attn_projections);
  round(v, points_.attn_projections);
  std::vector<float> q(size_t(R * nq * hd)), gate(q.size());
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t hh = 0; hh < nq; ++hh) {
      const float* src = qg.data() + (r * nq + hh) * 2 * hd;
      std::copy(src + hd, src + 2 * hd, gate.begin() + (r * nq + hh) * hd);
      cpu::rms_norm_zero_centred(src, q.data() + (r * nq + hh) * hd, hd, w.q_norm.data(), eps);
      rope_.apply(q.data() + (r * nq + hh) * hd, start + r);
    }
    for (int64_t hh = 0; hh < nkv; ++hh) {
      float* kh = k.data() + (r * nkv + hh) * hd;
      cpu::rms_norm_zero_centred(kh, kh, hd, w.k_norm.data(), eps);
      rope_.apply(kh, start + r);
    }
  }
  round(q, points_.attn_q_and_cache);
  round(k, points_.attn_q_and_cache);
  round(v, points_.attn_q_and_cache);
  cpu::PagedKvCache& cache = kv_[size_t(cache_index_[layer])];
  cache.write(blocks_, start, R, k.data(), v.data());
  std::vector<float> o(q.size());
  const cpu::AttentionChunk chunk{q.data(), o.data(), R, start, blocks_};
  cpu::paged_attention(pool_, cache, nq, 1.0f / std::sqrt(float(hd)), std::span<const cpu::AttentionChunk>(&chunk, 1));
  for (size_t i = 0; i < o.size(); ++i) o[i] *= cpu::sigmoid(gate[i]);
  round(o, points_.attn_out);
  const std::vector<float> out = linear(pool_, o, R, w.o_proj);
  for (size_t i = 0; i < out.size(); ++i) h[i] += out[i];
}

// Spec 2.5: the projections (qkv, z rounded; b, a from the f32 or the bf16 norm output),
// the CPU DeltaNet op on them, the gated-norm output rounded before out_proj.
void EmulatedForward::gdn(size_t layer, const std::vector<float>& xn, const std::vector<float>& xb, int64_t R,
                          float* h) {
  const auto& w = *weights_.layers[layer].gdn;
  const auto& c = config_;
  const cpu::GdnGeometry geo{c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                             c.linear_value_head_dim, c.linear_conv_kernel_dim};
  std::vector<float> qkv = linear(pool_, xb, R, w.in_proj_qkv), z = linear(pool_, xb, R, w.in_proj_z),
                     b = linear(pool_, side_input(w.in_proj_b, points_, xn, xb), R, w.in_proj_b),
                     a = linear(pool_, side_input(w.in_proj_a, points_, xn, xb), R, w.in_proj_a);
  round(qkv, points_.gdn_qkv_z);
  round(z, points_.gdn_qkv_z);
  round(b, points_.gdn_gates);
  round(a, points_.gdn_gates);
  std::vector<float> core(size_t(R * geo.value_dim()));
  const int idx = cache_index_[layer];
  const cpu::GdnChunk chunk{R, qkv.data(), z.data(), b.data(), a.data(), conv_[size_t(idx)].data(),
                            recurrent_[size_t(idx)].data(), core.data()};
  const cpu::GdnParams params{w.conv1d.data(), w.dt_bias.data(), w.a_log.data(), w.norm.data(), float(c.rms_norm_eps)};
  cpu::gated_delta_net(pool_, geo, params, std::span<const cpu::GdnChunk>(&chunk, 1));
  round(core, points_.gdn_out);
  const std::vector<float> out = linear(pool_, core, R, w.out_proj);
  for (size_t i = 0; i < out.size(); ++i) h[i] += out[i];
}

// Whether the integer form covers an expert (moe_int_supported's conditions on one expert's weights).
bool int_form_covers(const model::ExpertMlpWeights& e) {
  for (const quant::QuantWeight* w : {&e.gate, &e.up, &e.down}) {
    const int U = cuda::moe_int::unit_length(int(w->group_size));
    if (w->format != quant::WeightFormat::GptqInt4 || w->has_part("g_idx") || U < 32 ||
        w->in_features % cuda::moe_int::kKStep != 0 || w->in_features % U != 0)
      return false;
  }
  return true;
}

// v[K] -> X·s_b per element (moe_int_arith.h step 1): what the integer form multiplies by.
void quantise_int16(std::vector<float>& v) {
  namespace mi = cuda::moe_int;
  const size_t K = v.size();
  for (size_t k0 = 0; k0 < K; k0 += mi::kXBlock) {
    const size_t k1 = std::min(K, k0 + mi::kXBlock);
    float amax = 0.0f;
    for (size_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(v[k]));
    const mi::XScale sc = mi::x_scale(amax);
    for (size_t k = k0; k < k1; ++k) v[k] = float(mi::quantize_x(v[k], sc.inv)) * sc.s;
  }
}

// Spec 2.7 in the CUDA model's order: routed experts summed in rank order into the residual,
// then the gated shared expert.
void EmulatedForward::moe(size_t layer, const std::vector<float>& xn, const std::vector<float>& xb, int64_t R,
                          bool prompt, float* h) {
  const auto& w = weights_.layers[layer].moe;
  const int64_t H = config_.hidden_size, E = config_.num_experts, k = config_.num_experts_per_tok;
  const std::vector<float> logits = linear(pool_, side_input(w.router, points_, xn, xb), R, w.router);
  std::vector<int32_t> ids(static_cast<size_t>(k));
  std::vector<float> weights(static_cast<size_t>(k));
  for (int64_t r = 0; r < R; ++r) {
    cpu::route_top_k(logits.data() + r * E, E, k, ids.data(), weights.data());
    routing_[layer].insert(routing_[layer].end(), ids.begin(), ids.end());
    std::vector<float> xr(xb.begin() + r * H, xb.begin() + (r + 1) * H);
    const bool int16 =
        (prompt ? points_.expert_int16_prompt : points_.expert_int16_generated) && int_form_covers(w.experts[0]);
    if (int16) quantise_int16(xr);
    std::vector<float> routed(size_t(H), 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const auto& e = w.experts[size_t(ids[size_t(j)])];
      std::vector<float> g = linear(pool_, xr, 1, e.gate);
      const std::vector<float> u = linear(pool_, xr, 1, e.up);
      for (size_t i = 0; i < g.size(); ++i) g[i] = cpu::silu(g[i]) * u[i];
      round(g, points_.expert_act);
      if (int16) quantise_int16(g);
      const std::vector<float> y = linear(pool_, g, 1, e.down);
      for (int64_t i = 0; i < H; ++i) routed[size_t(i)] += weights[size_t(j)] * y[size_t(i)];
    }
    for (int64_t i = 0; i < H; ++i) h[r * H + i] += routed[size_t(i)];
  }
  std::vector<float> sg = linear(pool_, xb, R, w.shared.gate), su = linear(pool_, xb, R, w.shared.up);
  round(sg, points_.shared_expert);
  round(su, points_.shared_expert);
  for (size_t i = 0; i < sg.size(); ++i) sg[i] = cpu::silu(sg[i]) * su[i];
  round(sg, points_.shared_expert);
  const std::vector<float> sd = linear(pool_, sg, R, w.shared.down);
  const std::vector<float> gl = linear(pool_, side_input(w.shared_gate, points_, xn, xb), R, w.shared_gate);
  for (int64_t r = 0; r < R; ++r) {
    const float s = cpu::sigmoid(gl[size_t(r)]);
    for (int64_t i = 0; i < H; ++i) h[r * H + i] += s * sd[size_t(r * H + i)];
  }
}

}  // namespace moeserve::gputest
