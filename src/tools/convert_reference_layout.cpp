// The tensor list of an official BF16 release, from its config alone (no data): what
// `moeserve inspect --config-only` plans conversions over. ../shared/spec/qwen35_arch.md 3.1
// (main model, fused experts, A_log and linear_attn.norm in F32) and 3.3 (MTP block, fused
// experts as in the BF16 releases).
#include <fmt/format.h>

#include "tools/convert_source.h"

namespace moeserve::tools {

namespace {

void add(std::vector<SourceTensor>& out, const std::string& canonical, DType dtype, Shape shape) {
  SourceTensor t;
  t.canonical = canonical;
  t.name = canonical.rfind("mtp.", 0) == 0 || canonical.rfind("lm_head.", 0) == 0 ? canonical : "model." + canonical;
  t.view = Tensor(dtype, std::move(shape), nullptr, nullptr);
  t.origin = "config.json (planned BF16 layout)";
  out.push_back(std::move(t));
}

// One decoder layer's tensors under prefix p ("layers.3." or "mtp.layers.0.").
void add_layer(std::vector<SourceTensor>& out, const io::Qwen35Config& c, const std::string& p, io::LayerType type) {
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size,
                Is = c.shared_expert_intermediate_size;
  const DType bf16 = DType::BF16;
  add(out, p + "input_layernorm.weight", bf16, {H});
  add(out, p + "post_attention_layernorm.weight", bf16, {H});
  if (type == io::LayerType::FullAttention) {
    const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
    add(out, p + "self_attn.q_proj.weight", bf16, {nq * hd * 2, H});
    add(out, p + "self_attn.k_proj.weight", bf16, {nkv * hd, H});
    add(out, p + "self_attn.v_proj.weight", bf16, {nkv * hd, H});
    add(out, p + "self_attn.o_proj.weight", bf16, {H, nq * hd});
    add(out, p + "self_attn.q_norm.weight", bf16, {hd});
    add(out, p + "self_attn.k_norm.weight", bf16, {hd});
  } else {
    const int64_t nv = c.linear_num_value_heads, dv = c.linear_value_head_dim, conv = c.linear_conv_dim();
    add(out, p + "linear_attn.in_proj_qkv.weight", bf16, {conv, H});
    add(out, p + "linear_attn.in_proj_z.weight", bf16, {nv * dv, H});
    add(out, p + "linear_attn.in_proj_b.weight", bf16, {nv, H});
    add(out, p + "linear_attn.in_proj_a.weight", bf16, {nv, H});
    add(out, p + "linear_attn.conv1d.weight", bf16, {conv, 1, c.linear_conv_kernel_dim});
    add(out, p + "linear_attn.dt_bias", bf16, {nv});
    add(out, p + "linear_attn.A_log", DType::F32, {nv});
    add(out, p + "linear_attn.norm.weight", DType::F32, {dv});
    add(out, p + "linear_attn.out_proj.weight", bf16, {H, nv * dv});
  }
  add(out, p + "mlp.gate.weight", bf16, {E, H});
  add(out, p + "mlp.experts.gate_up_proj", bf16, {E, 2 * I, H});
  add(out, p + "mlp.experts.down_proj", bf16, {E, H, I});
  add(out, p + "mlp.shared_expert.gate_proj.weight", bf16, {Is, H});
  add(out, p + "mlp.shared_expert.up_proj.weight", bf16, {Is, H});
  add(out, p + "mlp.shared_expert.down_proj.weight", bf16, {H, Is});
  add(out, p + "mlp.shared_expert_gate.weight", bf16, {1, H});
}

}  // namespace

std::vector<SourceTensor> reference_bf16_tensors(const io::Qwen35Config& c) {
  std::vector<SourceTensor> out;
  const int64_t H = c.hidden_size;
  add(out, "embed_tokens.weight", DType::BF16, {c.vocab_size, H});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    add_layer(out, c, fmt::format("layers.{}.", l), c.layer_types.at(size_t(l)));
  add(out, "norm.weight", DType::BF16, {H});
  if (!c.tie_word_embeddings) add(out, "lm_head.weight", DType::BF16, {c.vocab_size, H});
  for (int64_t m = 0; m < c.mtp_num_hidden_layers; ++m) {
    if (m == 0) {
      add(out, "mtp.fc.weight", DType::BF16, {H, 2 * H});
      add(out, "mtp.pre_fc_norm_embedding.weight", DType::BF16, {H});
      add(out, "mtp.pre_fc_norm_hidden.weight", DType::BF16, {H});
      add(out, "mtp.norm.weight", DType::BF16, {H});
    }
    add_layer(out, c, fmt::format("mtp.layers.{}.", m), io::LayerType::FullAttention);
  }
  return out;
}

}  // namespace moeserve::tools
