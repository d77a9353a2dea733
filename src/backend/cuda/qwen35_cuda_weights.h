// Every weight of a Qwen3.5 MoE text model on the GPU (layouts: docs/CUDA_BACKEND.md), made
// either by uploading a loaded checkpoint tensor by tensor (streamed from the mmap: host
// memory stays bounded whatever the model size) or as random weights of a config in a chosen
// format directly on the GPU (--load-format dummy).
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/device_linear.h"
#include "backend/cuda/ops_moe.h"
#include "io/qwen35_config.h"
#include "model/qwen35_weights.h"

namespace moeserve::cuda {

struct CudaAttentionWeights {
  DeviceLinear q_proj, k_proj, v_proj, o_proj;
  DeviceBuffer<float> q_norm, k_norm;  // [hd], (1 + w)
};

struct CudaGdnWeights {
  DeviceLinear in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj;
  DeviceBuffer<float> conv1d;   // [conv_dim][K]
  DeviceBuffer<float> dt_bias;  // [nv]
  DeviceBuffer<float> a_log;    // [nv]
  DeviceBuffer<float> norm;     // [dv], plain w
};

struct CudaMoeWeights {
  DeviceLinear router;                        // [E, H]
  DeviceExperts experts;                      // E routed experts, stacked
  DeviceLinear shared_gate, shared_up, shared_down;
  DeviceLinear shared_expert_gate;            // [1, H]
};

struct CudaLayerWeights {
  io::LayerType type = io::LayerType::LinearAttention;
  DeviceBuffer<float> input_norm, post_attention_norm;  // [H], (1 + w)
  std::optional<CudaAttentionWeights> attention;
  std::optional<CudaGdnWeights> gdn;
  CudaMoeWeights moe;
};

struct CudaWeights {
  DeviceBuffer<__nv_bfloat16> embed_tokens;  // [V, H]
  DeviceBuffer<float> final_norm;            // [H]
  DeviceLinear lm_head;                      // [V, H], BF16 or INT8 row-wise
  std::vector<CudaLayerWeights> layers;
  size_t bytes() const;
  // The largest N·K among non-dense, non-expert Linear weights (sizes the prefill scratch).
  size_t max_quantized_linear_elems() const;
};

// Called after each uploaded tensor group with (bytes so far, total bytes).
using UploadProgress = std::function<void(size_t, size_t)>;

CudaWeights upload_weights(const model::Qwen35Weights& host, bool int8_lm_head, cudaStream_t stream,
                           const UploadProgress& progress = {});

// Random weights for `config` in `format`: "bf16", "gptq-int4", "fp8-block" or
// "hybrid-int4-fp8" (INT4 routed experts; FP8 attention, DeltaNet in_proj_qkv/in_proj_z/out_proj
// and shared expert; BF16 router, in_proj_a/b, shared_expert_gate, embeddings, LM head).
CudaWeights dummy_weights(const io::Qwen35Config& config, const std::string& format, bool int8_lm_head,
                          uint64_t seed, cudaStream_t stream);

}  // namespace moeserve::cuda
