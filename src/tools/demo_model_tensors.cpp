// The demo checkpoint's tensor list, names and shapes as in ../shared/spec/qwen35_arch.md
// sections 3.1-3.3 (text-only prefix "model."), and how each tensor is initialised.
#include <cmath>

#include "core/error.h"
#include "tools/bench_rng.h"
#include "tools/demo_model.h"

namespace moeserve::tools {

namespace {

// transformers' initializer_range: every Linear and the embedding ~ N(0, 0.02).
constexpr double kInitStd = 0.02;
// Zero-centred (1 + w) RMSNorm weights are stored near 0; perturbed so that a loader which
// forgets the "+1" (or adds it twice) produces visibly different outputs.
constexpr double kNormPerturbation = 0.1;

TensorInit normal(double mean, double std) {
  TensorInit i;
  i.kind = TensorInit::Kind::Normal;
  i.mean = mean;
  i.std = std;
  return i;
}
TensorInit log_uniform(double low, double high) {
  TensorInit i;
  i.kind = TensorInit::Kind::LogUniform;
  i.low = low;
  i.high = high;
  return i;
}

class SpecList {
 public:
  void add(std::string name, Shape shape, TensorInit init, DType dtype = DType::BF16) {
    specs_.push_back({std::move(name), dtype, std::move(shape), init});
  }
  void linear(const std::string& name, int64_t out, int64_t in) { add(name + ".weight", {out, in}, normal(0, kInitStd)); }
  void zero_centred_norm(const std::string& name, int64_t n) {
    add(name + ".weight", {n}, normal(0, kNormPerturbation));
  }
  std::vector<DemoTensorSpec> take() { return std::move(specs_); }

 private:
  std::vector<DemoTensorSpec> specs_;
};

// Section 2.3: q_proj holds query and gate per head; q/k norms over head_dim.
void add_attention(SpecList& s, const std::string& p, const DemoModelSize& z) {
  s.linear(p + "q_proj", z.heads * z.head_dim * 2, z.hidden);
  s.linear(p + "k_proj", z.kv_heads * z.head_dim, z.hidden);
  s.linear(p + "v_proj", z.kv_heads * z.head_dim, z.hidden);
  s.linear(p + "o_proj", z.hidden, z.heads * z.head_dim);
  s.zero_centred_norm(p + "q_norm", z.head_dim);
  s.zero_centred_norm(p + "k_norm", z.head_dim);
}

// Section 2.5: four input projections, depthwise conv, gates, gated norm, output projection.
void add_gdn(SpecList& s, const std::string& p, const DemoModelSize& z) {
  const int64_t key_dim = z.linear_k_heads * z.linear_k_dim, value_dim = z.linear_v_heads * z.linear_v_dim;
  const int64_t conv_dim = 2 * key_dim + value_dim;
  s.linear(p + "in_proj_qkv", conv_dim, z.hidden);
  s.linear(p + "in_proj_z", value_dim, z.hidden);
  s.linear(p + "in_proj_b", z.linear_v_heads, z.hidden);
  s.linear(p + "in_proj_a", z.linear_v_heads, z.hidden);
  // Conv taps: fan-in 4, so taps of order 1/sqrt(4) keep the conv output at the input's scale.
  s.add(p + "conv1d.weight", {conv_dim, 1, 4}, normal(0, 0.25));
  // dt_bias initialises to ones and A = exp(A_log) to U(0, 16) in transformers; A_log and the
  // gated norm are F32 in the official Qwen3.5 release (section 2.9).
  s.add(p + "dt_bias", {z.linear_v_heads}, normal(1, kNormPerturbation));
  s.add(p + "A_log", {z.linear_v_heads}, log_uniform(1, 16), DType::F32);
  s.add(p + "norm.weight", {z.linear_v_dim}, normal(1, kNormPerturbation), DType::F32);  // plain w
  s.linear(p + "out_proj", z.hidden, value_dim);
}

// Section 2.7: router, routed experts (either layout, section 3.2), shared expert and its gate.
void add_moe(SpecList& s, const std::string& p, const DemoModelSize& z, ExpertLayout layout) {
  s.linear(p + "gate", z.experts, z.hidden);
  if (layout == ExpertLayout::Fused) {
    // Fused tensors carry no ".weight" suffix.
    s.add(p + "experts.gate_up_proj", {z.experts, 2 * z.moe_intermediate, z.hidden}, normal(0, kInitStd));
    s.add(p + "experts.down_proj", {z.experts, z.hidden, z.moe_intermediate}, normal(0, kInitStd));
  } else {
    for (int64_t e = 0; e < z.experts; ++e) {
      const std::string q = p + "experts." + std::to_string(e) + ".";
      s.linear(q + "gate_proj", z.moe_intermediate, z.hidden);
      s.linear(q + "up_proj", z.moe_intermediate, z.hidden);
      s.linear(q + "down_proj", z.hidden, z.moe_intermediate);
    }
  }
  s.linear(p + "shared_expert.gate_proj", z.shared_intermediate, z.hidden);
  s.linear(p + "shared_expert.up_proj", z.shared_intermediate, z.hidden);
  s.linear(p + "shared_expert.down_proj", z.hidden, z.shared_intermediate);
  s.linear(p + "shared_expert_gate", 1, z.hidden);
}

void add_decoder_layer(SpecList& s, const std::string& p, const DemoModelSize& z, bool full_attention,
                       ExpertLayout layout) {
  s.zero_centred_norm(p + "input_layernorm", z.hidden);
  if (full_attention) add_attention(s, p + "self_attn.", z);
  else add_gdn(s, p + "linear_attn.", z);
  s.zero_centred_norm(p + "post_attention_layernorm", z.hidden);
  add_moe(s, p + "mlp.", z, layout);
}

}  // namespace

const DemoModelSize& demo_model_size(const std::string& name) {
  // Both sizes keep the real model's ratios where they matter: 3 GDN layers per full-attention
  // layer, GQA 2 in attention, 2 value heads per key head in GDN, rotary dim = head_dim / 4.
  static const std::vector<DemoModelSize> sizes = {
      {"tiny", 64, 4, 4, 2, 32, 2, 4, 16, 16, 8, 2, 32, 32, 32768},
      {"small", 128, 8, 4, 2, 64, 2, 4, 32, 32, 16, 2, 64, 64, 32768},
  };
  for (const auto& s : sizes)
    if (s.name == name) return s;
  fail("unknown demo model size '{}' (available: tiny, small)", name);
}

std::vector<std::string> demo_model_size_names() { return {"tiny", "small"}; }

int64_t padded_vocab_size(int64_t tokenizer_size) {
  MOESERVE_CHECK(tokenizer_size > 0, "the tokenizer has no tokens");
  return (tokenizer_size + 127) / 128 * 128;
}

std::vector<DemoTensorSpec> demo_tensor_specs(const DemoModelSize& z, int64_t vocab_size, ExpertLayout layout) {
  SpecList s;
  s.add("model.embed_tokens.weight", {vocab_size, z.hidden}, normal(0, kInitStd));
  for (int64_t l = 0; l < z.layers; ++l)
    add_decoder_layer(s, "model.layers." + std::to_string(l) + ".", z, (l + 1) % 4 == 0, layout);
  s.zero_centred_norm("model.norm", z.hidden);
  s.linear("lm_head", vocab_size, z.hidden);
  // Section 3.3: one MTP layer (full attention + MoE), sharing embed_tokens and lm_head.
  s.linear("mtp.fc", z.hidden, 2 * z.hidden);
  s.zero_centred_norm("mtp.pre_fc_norm_embedding", z.hidden);
  s.zero_centred_norm("mtp.pre_fc_norm_hidden", z.hidden);
  add_decoder_layer(s, "mtp.layers.0.", z, true, layout);
  s.zero_centred_norm("mtp.norm", z.hidden);
  return s.take();
}

std::vector<float> demo_tensor_values(const DemoTensorSpec& spec, uint64_t seed) {
  Rng rng(seed ^ fnv1a64(spec.name.data(), spec.name.size()));
  std::vector<float> v(size_t(shape_numel(spec.shape)));
  for (auto& x : v) {
    if (spec.init.kind == TensorInit::Kind::Normal)
      x = float(spec.init.mean + spec.init.std * rng.normal());
    else
      x = float(std::log(spec.init.low + (spec.init.high - spec.init.low) * rng.uniform()));
  }
  return v;
}

}  // namespace moeserve::tools
