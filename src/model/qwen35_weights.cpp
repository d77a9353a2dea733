#include "model/qwen35_weights.h"

#include <charconv>

#include "core/error.h"
#include "core/log.h"
#include "quant/int8_rowwise.h"
#include "quant/linear_loader.h"

namespace moeserve::model {

namespace {

class Loader {
 public:
  Loader(const io::Checkpoint& ckpt, const io::Qwen35Config& config)
      : ckpt_(ckpt), cfg_(config), linear_(ckpt, config) {}

  std::vector<float> vec(const std::string& name, int64_t n) const {
    return ckpt_.get_float(name, {n}).to_f32();
  }
  quant::QuantWeight linear(const std::string& module, int64_t out, int64_t in) const {
    return linear_.load(module, out, in);
  }

  AttentionWeights attention(const std::string& p) const {
    const int64_t H = cfg_.hidden_size, nq = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads,
                  hd = cfg_.head_dim;
    AttentionWeights w;
    w.q_proj = linear(p + "q_proj", nq * hd * 2, H);
    w.k_proj = linear(p + "k_proj", nkv * hd, H);
    w.v_proj = linear(p + "v_proj", nkv * hd, H);
    w.o_proj = linear(p + "o_proj", H, nq * hd);
    w.q_norm = vec(p + "q_norm.weight", hd);
    w.k_norm = vec(p + "k_norm.weight", hd);
    return w;
  }

  GdnWeights gdn(const std::string& p) const {
    const int64_t H = cfg_.hidden_size, nv = cfg_.linear_num_value_heads, dv = cfg_.linear_value_head_dim;
    const int64_t conv_dim = cfg_.linear_conv_dim(), K = cfg_.linear_conv_kernel_dim;
    GdnWeights w;
    w.in_proj_qkv = linear(p + "in_proj_qkv", conv_dim, H);
    w.in_proj_z = linear(p + "in_proj_z", nv * dv, H);
    w.in_proj_b = linear(p + "in_proj_b", nv, H);
    w.in_proj_a = linear(p + "in_proj_a", nv, H);
    w.out_proj = linear(p + "out_proj", H, nv * dv);
    w.conv1d = ckpt_.get_float(p + "conv1d.weight", {conv_dim, 1, K}).to_f32();
    w.dt_bias = vec(p + "dt_bias", nv);
    w.a_log = vec(p + "A_log", nv);
    w.norm = vec(p + "norm.weight", dv);
    return w;
  }

  // Routed experts in either layout (section 3.2): fused `experts.gate_up_proj [E, 2I, H]` +
  // `experts.down_proj [E, H, I]` (per-expert views, no copy), or per-expert Linears.
  std::vector<ExpertMlpWeights> experts(const std::string& p) const {
    const int64_t E = cfg_.num_experts, I = cfg_.moe_intermediate_size, H = cfg_.hidden_size;
    std::vector<ExpertMlpWeights> out(static_cast<size_t>(E));
    if (ckpt_.has(p + "gate_up_proj")) {
      const Tensor gate_up = ckpt_.get_float(p + "gate_up_proj", {E, 2 * I, H});
      const Tensor down = ckpt_.get_float(p + "down_proj", {E, H, I});
      for (int64_t e = 0; e < E; ++e) {
        const std::string name = p + std::to_string(e);
        const Tensor gu = gate_up.index0(e);
        out[size_t(e)].gate = quant::dense_weight(gu.slice0(0, I), name + ".gate_proj");
        out[size_t(e)].up = quant::dense_weight(gu.slice0(I, 2 * I), name + ".up_proj");
        out[size_t(e)].down = quant::dense_weight(down.index0(e), name + ".down_proj");
      }
      return out;
    }
    for (int64_t e = 0; e < E; ++e) {
      const std::string name = p + std::to_string(e);
      out[size_t(e)] = {linear(name + ".gate_proj", I, H), linear(name + ".up_proj", I, H),
                        linear(name + ".down_proj", H, I)};
    }
    return out;
  }

  MoeWeights moe(const std::string& p) const {
    const int64_t H = cfg_.hidden_size, Is = cfg_.shared_expert_intermediate_size;
    MoeWeights w;
    w.router = linear(p + "gate", cfg_.num_experts, H);
    w.experts = experts(p + "experts.");
    w.shared = {linear(p + "shared_expert.gate_proj", Is, H), linear(p + "shared_expert.up_proj", Is, H),
                linear(p + "shared_expert.down_proj", H, Is)};
    w.shared_gate = linear(p + "shared_expert_gate", 1, H);
    return w;
  }

  DecoderLayerWeights layer(const std::string& p, io::LayerType type) const {
    DecoderLayerWeights w;
    w.type = type;
    w.input_norm = vec(p + "input_layernorm.weight", cfg_.hidden_size);
    w.post_attention_norm = vec(p + "post_attention_layernorm.weight", cfg_.hidden_size);
    if (type == io::LayerType::FullAttention)
      w.attention = attention(p + "self_attn.");
    else
      w.gdn = gdn(p + "linear_attn.");
    w.moe = moe(p + "mlp.");
    return w;
  }

  MtpWeights mtp() const {
    const int64_t H = cfg_.hidden_size;
    MtpWeights w;
    w.fc = linear("mtp.fc", H, 2 * H);
    w.pre_fc_norm_embedding = vec("mtp.pre_fc_norm_embedding.weight", H);
    w.pre_fc_norm_hidden = vec("mtp.pre_fc_norm_hidden.weight", H);
    w.norm = vec("mtp.norm.weight", H);
    w.layer = layer("mtp.layers.0.", io::LayerType::FullAttention);
    return w;
  }

 private:
  const io::Checkpoint& ckpt_;
  const io::Qwen35Config& cfg_;
  quant::LinearLoader linear_;  // parses the quantization_config once
};

// A tensor of a layer the config does not have means the config and the weights disagree.
void check_no_extra_layers(const io::Checkpoint& ckpt, const io::Qwen35Config& cfg) {
  for (const std::string& name : ckpt.names_with_prefix("layers.")) {
    const char* first = name.data() + 7;
    int64_t index = -1;
    std::from_chars(first, name.data() + name.size(), index);
    MOESERVE_CHECK(index >= 0 && index < cfg.num_hidden_layers,
                   "{}: tensor of layer {} but config.json has num_hidden_layers = {}", ckpt.source_of(name),
                   index, cfg.num_hidden_layers);
  }
}

}  // namespace

Qwen35Weights load_qwen35_weights(const io::Checkpoint& ckpt, const io::Qwen35Config& cfg,
                                  const WeightLoadOptions& options) {
  MOESERVE_CHECK(int64_t(cfg.layer_types.size()) == cfg.num_hidden_layers,
                 "config has {} layer types for {} layers", cfg.layer_types.size(), cfg.num_hidden_layers);
  check_no_extra_layers(ckpt, cfg);
  const Loader load(ckpt, cfg);
  Qwen35Weights w;
  w.embed_tokens =
      quant::dense_weight(ckpt.get_float("embed_tokens.weight", {cfg.vocab_size, cfg.hidden_size}), "embed_tokens");
  w.final_norm = load.vec("norm.weight", cfg.hidden_size);
  // Qwen3.5 unties the head (section 1.1); a tied config without lm_head reuses the embedding.
  if (cfg.tie_word_embeddings && !ckpt.has("lm_head.weight") && ckpt.names_with_prefix("lm_head.").empty())
    w.lm_head = quant::dense_weight(w.embed_tokens.part("weight"), "lm_head (tied to embed_tokens)");
  else
    w.lm_head = load.linear("lm_head", cfg.vocab_size, cfg.hidden_size);
  if (options.int8_lm_head) w.lm_head = quant::quantize_int8_rowwise(w.lm_head);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    w.layers.push_back(load.layer("layers." + std::to_string(l) + ".", cfg.layer_types[size_t(l)]));
  if (options.load_mtp && cfg.mtp_num_hidden_layers > 0) {
    if (ckpt.has("mtp.fc.weight") || !ckpt.names_with_prefix("mtp.fc.").empty())
      w.mtp = load.mtp();
    else
      log::warn("config.json declares {} MTP layer(s) but {} has no mtp.* tensors; speculative decoding "
                "with MTP is unavailable",
                cfg.mtp_num_hidden_layers, ckpt.dir().string());
  }
  return w;
}

}  // namespace moeserve::model
