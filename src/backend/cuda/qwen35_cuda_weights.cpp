#include "backend/cuda/qwen35_cuda_weights.h"

#include <cmath>

#include "backend/cuda/dummy_fill.h"
#include "core/error.h"

namespace moeserve::cuda {

using quant::WeightFormat;

size_t CudaWeights::bytes() const {
  size_t b = embed_tokens.bytes() + final_norm.bytes() + lm_head.bytes();
  for (const auto& l : layers) {
    b += l.input_norm.bytes() + l.post_attention_norm.bytes();
    if (l.attention)
      b += l.attention->q_proj.bytes() + l.attention->k_proj.bytes() + l.attention->v_proj.bytes() +
           l.attention->o_proj.bytes() + l.attention->q_norm.bytes() + l.attention->k_norm.bytes();
    if (l.gdn)
      b += l.gdn->in_proj_qkv.bytes() + l.gdn->in_proj_z.bytes() + l.gdn->in_proj_b.bytes() +
           l.gdn->in_proj_a.bytes() + l.gdn->out_proj.bytes() + l.gdn->conv1d.bytes() + l.gdn->dt_bias.bytes() +
           l.gdn->a_log.bytes() + l.gdn->norm.bytes();
    const auto& m = l.moe;
    b += m.router.bytes() + m.experts.gate.bytes() + m.experts.up.bytes() + m.experts.down.bytes() +
         m.shared_gate.bytes() + m.shared_up.bytes() + m.shared_down.bytes() + m.shared_expert_gate.bytes();
  }
  return b;
}

size_t CudaWeights::max_quantized_linear_elems() const {
  size_t best = 0;
  auto see = [&](const DeviceLinear& w) {
    if (w.format != WeightFormat::Dense && w.format != WeightFormat::Nvfp4)
      best = std::max(best, size_t(w.N) * size_t(w.K));
  };
  see(lm_head);
  for (const auto& l : layers) {
    if (l.attention) {
      see(l.attention->q_proj);
      see(l.attention->k_proj);
      see(l.attention->v_proj);
      see(l.attention->o_proj);
    }
    if (l.gdn) {
      see(l.gdn->in_proj_qkv);
      see(l.gdn->in_proj_z);
      see(l.gdn->in_proj_b);
      see(l.gdn->in_proj_a);
      see(l.gdn->out_proj);
    }
    see(l.moe.router);
    see(l.moe.shared_gate);
    see(l.moe.shared_up);
    see(l.moe.shared_down);
    see(l.moe.shared_expert_gate);
  }
  return best;
}

// ---- upload of a loaded checkpoint -------------------------------------------------------
namespace {

DeviceBuffer<float> upload_f32(const std::vector<float>& v, cudaStream_t stream) {
  DeviceBuffer<float> d(v.size());
  d.upload(v.data(), v.size(), stream);
  MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d;
}

size_t host_bytes(const model::Qwen35Weights& h) {
  size_t b = h.embed_tokens.stored_bytes() + h.lm_head.stored_bytes();
  for (const auto& l : h.layers) {
    if (l.attention)
      b += l.attention->q_proj.stored_bytes() + l.attention->k_proj.stored_bytes() +
           l.attention->v_proj.stored_bytes() + l.attention->o_proj.stored_bytes();
    if (l.gdn)
      b += l.gdn->in_proj_qkv.stored_bytes() + l.gdn->in_proj_z.stored_bytes() + l.gdn->in_proj_b.stored_bytes() +
           l.gdn->in_proj_a.stored_bytes() + l.gdn->out_proj.stored_bytes();
    b += l.moe.router.stored_bytes() + l.moe.shared_gate.stored_bytes() + l.moe.shared.gate.stored_bytes() +
         l.moe.shared.up.stored_bytes() + l.moe.shared.down.stored_bytes();
    for (const auto& e : l.moe.experts) b += e.gate.stored_bytes() + e.up.stored_bytes() + e.down.stored_bytes();
  }
  return b;
}

}  // namespace

CudaWeights upload_weights(const model::Qwen35Weights& host, bool int8_lm_head, cudaStream_t stream,
                           const UploadProgress& progress) {
  const size_t total = host_bytes(host);
  size_t done = 0;
  auto tick = [&](size_t b) {
    done += b;
    if (progress) progress(done, total);
  };
  CudaWeights w;
  {
    DeviceLinear e = upload_linear(host.embed_tokens, stream);
    w.embed_tokens = std::move(e.dense);
    tick(host.embed_tokens.stored_bytes());
  }
  w.final_norm = upload_f32(host.final_norm, stream);
  w.lm_head = int8_lm_head ? upload_linear_int8_rowwise(host.lm_head, stream) : upload_linear(host.lm_head, stream);
  tick(host.lm_head.stored_bytes());
  for (const auto& hl : host.layers) {
    CudaLayerWeights l;
    l.type = hl.type;
    l.input_norm = upload_f32(hl.input_norm, stream);
    l.post_attention_norm = upload_f32(hl.post_attention_norm, stream);
    if (hl.attention) {
      const auto& a = *hl.attention;
      CudaAttentionWeights d;
      d.q_proj = upload_linear(a.q_proj, stream);
      d.k_proj = upload_linear(a.k_proj, stream);
      d.v_proj = upload_linear(a.v_proj, stream);
      d.o_proj = upload_linear(a.o_proj, stream);
      d.q_norm = upload_f32(a.q_norm, stream);
      d.k_norm = upload_f32(a.k_norm, stream);
      tick(a.q_proj.stored_bytes() + a.k_proj.stored_bytes() + a.v_proj.stored_bytes() + a.o_proj.stored_bytes());
      l.attention = std::move(d);
    }
    if (hl.gdn) {
      const auto& g = *hl.gdn;
      CudaGdnWeights d;
      d.in_proj_qkv = upload_linear(g.in_proj_qkv, stream);
      d.in_proj_z = upload_linear(g.in_proj_z, stream);
      d.in_proj_b = upload_linear(g.in_proj_b, stream);
      d.in_proj_a = upload_linear(g.in_proj_a, stream);
      d.out_proj = upload_linear(g.out_proj, stream);
      d.conv1d = upload_f32(g.conv1d, stream);
      d.dt_bias = upload_f32(g.dt_bias, stream);
      d.a_log = upload_f32(g.a_log, stream);
      d.norm = upload_f32(g.norm, stream);
      tick(g.in_proj_qkv.stored_bytes() + g.in_proj_z.stored_bytes() + g.in_proj_b.stored_bytes() +
           g.in_proj_a.stored_bytes() + g.out_proj.stored_bytes());
      l.gdn = std::move(d);
    }
    const auto& m = hl.moe;
    l.moe.router = upload_linear(m.router, stream);
    std::vector<const quant::QuantWeight*> gate, up, down;
    size_t expert_bytes = 0;
    for (const auto& e : m.experts) {
      gate.push_back(&e.gate);
      up.push_back(&e.up);
      down.push_back(&e.down);
      expert_bytes += e.gate.stored_bytes() + e.up.stored_bytes() + e.down.stored_bytes();
    }
    l.moe.experts = upload_experts(gate, up, down, stream);
    l.moe.shared_gate = upload_linear(m.shared.gate, stream);
    l.moe.shared_up = upload_linear(m.shared.up, stream);
    l.moe.shared_down = upload_linear(m.shared.down, stream);
    l.moe.shared_expert_gate = upload_linear(m.shared_gate, stream);
    tick(expert_bytes + m.router.stored_bytes() + m.shared.gate.stored_bytes() + m.shared.up.stored_bytes() +
         m.shared.down.stored_bytes() + m.shared_gate.stored_bytes());
    w.layers.push_back(std::move(l));
  }
  return w;
}

// ---- random weights on the GPU ------------------------------------------------------------
namespace {

struct DummyMaker {
  cudaStream_t stream;
  uint64_t seed;
  uint64_t counter = 0;
  uint64_t next() { return seed * 1000003ull + ++counter; }

  DeviceBuffer<float> f32(size_t n, float lo, float hi) {
    DeviceBuffer<float> d(n);
    fill_uniform_f32(d.data(), n, next(), lo, hi, stream);
    return d;
  }

  // copies > 1 stacks that many independent [N, K] weights (routed experts).
  DeviceLinear linear(int64_t N, int64_t K, WeightFormat fmt, int64_t copies = 1) {
    DeviceLinear d;
    d.format = fmt;
    d.N = N;
    d.K = K;
    const size_t nk = size_t(N) * size_t(K) * size_t(copies);
    const float target_std = 1.0f / std::sqrt(float(K));
    switch (fmt) {
      case WeightFormat::Dense:
        d.dense.resize(nk);
        fill_uniform_bf16(d.dense.data(), nk, next(), target_std * std::sqrt(3.0f), stream);
        break;
      case WeightFormat::GptqInt4: {
        MOESERVE_CHECK_CUDA_SHAPE(K % 32 == 0 && N % 8 == 0, "dummy GPTQ weight needs K % 32 == 0 and N % 8 == 0");
        d.group_size = (K % 128 == 0) ? 128 : 32;
        d.sym = true;
        const size_t groups = size_t(K / d.group_size) * size_t(copies);
        d.qweight.resize(size_t(K / 8) * size_t(N) * size_t(copies));
        fill_random_words(d.qweight.data(), d.qweight.size(), next(), stream);
        d.scales.resize(groups * size_t(N));
        // (q - 8) is uniform over [-8, 7]: std ~4.6, so scale ~ target / 4.6.
        fill_uniform_f16(d.scales.data(), d.scales.size(), next(), 0.5f * target_std / 4.6f,
                         1.5f * target_std / 4.6f, stream);
        d.qzeros.resize(groups * size_t(N / 8));
        fill_constant_words(d.qzeros.data(), d.qzeros.size(), 0x77777777, stream);  // zero 8 (stored 7)
        break;
      }
      case WeightFormat::Fp8Block: {
        d.fp8.resize(nk);
        fill_uniform_fp8(d.fp8.data(), nk, next(), 2.0f, stream);  // std ~1.15
        const size_t blocks = size_t((N + 127) / 128) * size_t((K + 127) / 128) * size_t(copies);
        d.scale = f32(blocks, 0.5f * target_std / 1.15f, 1.5f * target_std / 1.15f);
        break;
      }
      default:
        throw Error("dummy weights: unsupported format");
    }
    return d;
  }

  static void MOESERVE_CHECK_CUDA_SHAPE(bool ok, const char* what) {
    if (!ok) throw Error(what);
  }
};

struct DummyFormats {
  WeightFormat experts = WeightFormat::Dense;
  WeightFormat dense_proj = WeightFormat::Dense;  // attention, DeltaNet qkv/z/out, shared expert
};

DummyFormats parse_dummy_format(const std::string& format) {
  if (format == "bf16") return {WeightFormat::Dense, WeightFormat::Dense};
  if (format == "gptq-int4") return {WeightFormat::GptqInt4, WeightFormat::GptqInt4};
  if (format == "fp8-block") return {WeightFormat::Fp8Block, WeightFormat::Fp8Block};
  if (format == "hybrid-int4-fp8") return {WeightFormat::GptqInt4, WeightFormat::Fp8Block};
  throw Error("unknown dummy weight format '" + format +
              "' (expected bf16, gptq-int4, fp8-block or hybrid-int4-fp8)");
}

}  // namespace

CudaWeights dummy_weights(const io::Qwen35Config& c, const std::string& format, bool int8_lm_head, uint64_t seed,
                          cudaStream_t stream) {
  const DummyFormats f = parse_dummy_format(format);
  DummyMaker mk{stream, seed};
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t Is = c.shared_expert_intermediate_size;
  CudaWeights w;
  w.embed_tokens.resize(size_t(c.vocab_size) * size_t(H));
  fill_uniform_bf16(w.embed_tokens.data(), w.embed_tokens.size(), mk.next(), 1.7f, stream);
  w.final_norm = mk.f32(size_t(H), -0.1f, 0.1f);
  if (int8_lm_head) {
    w.lm_head.format = WeightFormat::Int8Rowwise;
    w.lm_head.N = c.vocab_size;
    w.lm_head.K = H;
    w.lm_head.int8.resize(size_t(c.vocab_size) * size_t(H));
    fill_uniform_int8(w.lm_head.int8.data(), w.lm_head.int8.size(), mk.next(), stream);
    w.lm_head.scale = mk.f32(size_t(c.vocab_size), 0.01f, 0.02f);
  } else {
    w.lm_head = mk.linear(c.vocab_size, H, WeightFormat::Dense);
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    CudaLayerWeights l;
    l.type = c.layer_types[size_t(i)];
    l.input_norm = mk.f32(size_t(H), -0.1f, 0.1f);
    l.post_attention_norm = mk.f32(size_t(H), -0.1f, 0.1f);
    if (l.type == io::LayerType::FullAttention) {
      const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
      CudaAttentionWeights a;
      a.q_proj = mk.linear(nq * hd * 2, H, f.dense_proj);
      a.k_proj = mk.linear(nkv * hd, H, f.dense_proj);
      a.v_proj = mk.linear(nkv * hd, H, f.dense_proj);
      a.o_proj = mk.linear(H, nq * hd, f.dense_proj);
      a.q_norm = mk.f32(size_t(hd), -0.1f, 0.1f);
      a.k_norm = mk.f32(size_t(hd), -0.1f, 0.1f);
      l.attention = std::move(a);
    } else {
      const int64_t nv = c.linear_num_value_heads;
      CudaGdnWeights g;
      g.in_proj_qkv = mk.linear(c.linear_conv_dim(), H, f.dense_proj);
      g.in_proj_z = mk.linear(c.linear_value_dim(), H, f.dense_proj);
      g.in_proj_b = mk.linear(nv, H, WeightFormat::Dense);
      g.in_proj_a = mk.linear(nv, H, WeightFormat::Dense);
      g.out_proj = mk.linear(H, c.linear_value_dim(), f.dense_proj);
      g.conv1d = mk.f32(size_t(c.linear_conv_dim() * c.linear_conv_kernel_dim), -0.5f, 0.5f);
      g.dt_bias = mk.f32(size_t(nv), -0.5f, 0.5f);
      g.a_log = mk.f32(size_t(nv), -1.0f, 1.0f);
      g.norm = mk.f32(size_t(c.linear_value_head_dim), 0.8f, 1.2f);
      l.gdn = std::move(g);
    }
    auto& m = l.moe;
    m.router = mk.linear(E, H, WeightFormat::Dense);
    m.experts.format = f.experts;
    m.experts.num_experts = int(E);
    m.experts.hidden = int(H);
    m.experts.intermediate = int(I);
    m.experts.gate = mk.linear(I, H, f.experts, E);
    m.experts.up = mk.linear(I, H, f.experts, E);
    m.experts.down = mk.linear(H, I, f.experts, E);
    m.experts.group_size = int(m.experts.gate.group_size);
    m.experts.sym = true;
    m.shared_gate = mk.linear(Is, H, f.dense_proj);
    m.shared_up = mk.linear(Is, H, f.dense_proj);
    m.shared_down = mk.linear(H, Is, f.dense_proj);
    m.shared_expert_gate = mk.linear(1, H, WeightFormat::Dense);
    w.layers.push_back(std::move(l));
  }
  MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return w;
}

}  // namespace moeserve::cuda
