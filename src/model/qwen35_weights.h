// Every tensor of a Qwen3.5 MoE text model (and its optional MTP block), loaded from a
// checkpoint and validated against the config (../shared/spec/qwen35_arch.md section 3).
//
// Linear weights are QuantWeights (views into the mapped checkpoint, any stored format); the
// small 1-D parameters (norms, GDN gates, conv taps) are converted to fp32 once.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/qwen35_config.h"
#include "quant/quant_weight.h"

namespace moeserve::model {

struct AttentionWeights {
  quant::QuantWeight q_proj;  // [nq·2hd, H], per head [query(hd) | gate(hd)]
  quant::QuantWeight k_proj;  // [nkv·hd, H]
  quant::QuantWeight v_proj;  // [nkv·hd, H]
  quant::QuantWeight o_proj;  // [H, nq·hd]
  std::vector<float> q_norm;  // [hd], (1 + w)
  std::vector<float> k_norm;  // [hd], (1 + w)
};

struct GdnWeights {
  quant::QuantWeight in_proj_qkv;  // [conv_dim, H]
  quant::QuantWeight in_proj_z;    // [nv·dv, H]
  quant::QuantWeight in_proj_b;    // [nv, H]
  quant::QuantWeight in_proj_a;    // [nv, H]
  quant::QuantWeight out_proj;     // [H, nv·dv]
  std::vector<float> conv1d;       // [conv_dim][K] (stored [conv_dim, 1, K])
  std::vector<float> dt_bias;      // [nv]
  std::vector<float> a_log;        // [nv]
  std::vector<float> norm;         // [dv], plain w
};

struct ExpertMlpWeights {
  quant::QuantWeight gate;  // [I, H]
  quant::QuantWeight up;    // [I, H]
  quant::QuantWeight down;  // [H, I]
};

struct MoeWeights {
  quant::QuantWeight router;               // mlp.gate [E, H]
  std::vector<ExpertMlpWeights> experts;   // E
  ExpertMlpWeights shared;                 // [Is, H], [Is, H], [H, Is]
  quant::QuantWeight shared_gate;          // [1, H]
};

struct DecoderLayerWeights {
  io::LayerType type = io::LayerType::LinearAttention;
  std::vector<float> input_norm;           // [H], (1 + w)
  std::vector<float> post_attention_norm;  // [H], (1 + w)
  std::optional<AttentionWeights> attention;  // full-attention layers
  std::optional<GdnWeights> gdn;              // linear-attention layers
  MoeWeights moe;
};

// Section 3.3: fc · [RMSNorm_e(embed(t)) ; RMSNorm_h(h)], one full-attention MoE layer, norm.
struct MtpWeights {
  quant::QuantWeight fc;                   // [H, 2H]
  std::vector<float> pre_fc_norm_embedding;// [H]
  std::vector<float> pre_fc_norm_hidden;   // [H]
  std::vector<float> norm;                 // [H]
  DecoderLayerWeights layer;               // full attention
};

struct Qwen35Weights {
  quant::QuantWeight embed_tokens;  // [V, H], read one row per token
  std::vector<float> final_norm;    // [H]
  quant::QuantWeight lm_head;       // [V, H], untied
  std::vector<DecoderLayerWeights> layers;
  std::optional<MtpWeights> mtp;
};

struct WeightLoadOptions {
  bool load_mtp = true;  // load mtp.* when the config and the checkpoint have it
  bool int8_lm_head = false;  // quantise the LM head to INT8 row-wise (quant/int8_rowwise.h)
};

// Loads and checks every tensor; a missing or mis-shaped tensor throws one moeserve::Error
// naming the file and the tensor.
Qwen35Weights load_qwen35_weights(const io::Checkpoint& ckpt, const io::Qwen35Config& config,
                                  const WeightLoadOptions& options = {});

}  // namespace moeserve::model
