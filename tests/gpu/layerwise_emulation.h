// The Qwen3.5 forward pass re-written on the CPU with the CPU ops (src/backend/cpu), fp32,
// rounding to bf16 exactly where the CUDA model stores an intermediate in bf16
// (src/backend/cuda/qwen35_cuda.cpp, enqueue_layers). With no rounding it is the CPU model's
// math (test_layerwise checks that); with the CUDA model's rounding points it predicts what
// bf16 storage alone does to the result, so that the GPU can be compared against it: close
// to the emulation means the GPU error is rounding, far means a kernel computes something
// else. It records the residual stream after every sub-block (mixer, MoE) of every layer.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/paged_kv_cache.h"
#include "backend/cpu/rope.h"
#include "core/thread_pool.h"
#include "io/qwen35_config.h"
#include "model/qwen35_weights.h"

namespace moeserve::gputest {

// Where the CUDA model keeps a value in bf16. Update cuda_model() when the model's storage
// changes (each field names the buffer of qwen35_cuda.h it stands for).
struct Bf16Points {
  bool weights = false;          // dense F32/F16 and NVFP4 weights are rounded to bf16 at upload
  bool norm_out = false;         // x_: input of q/k/v, in_proj_qkv/z, the experts, shared gate/up
  bool side_inputs = false;      // router, in_proj_b/a, shared_expert_gate read bf16 x_ (false: f32 x32_)
  bool attn_projections = false; // qg_, k_, v_ (q_proj / k_proj / v_proj outputs)
  bool attn_q_and_cache = false; // q_ after norm + RoPE; the K/V cache
  bool attn_out = false;         // attn_out_ (gated attention output, o_proj input)
  bool gdn_qkv_z = false;        // qkv_, z_
  bool gdn_gates = false;        // b_, a_
  bool gdn_out = false;          // gdn_out_ (gated-norm output, out_proj input)
  bool expert_act = false;       // the routed experts' SiLU(gate)·up
  bool shared_expert = false;    // shared_g_, shared_u_, shared_act_
  bool final_norm_out = false;   // x_ after the final norm (LM head input, StepOutput::hidden)
  // Not bf16 points: prompt / generated tokens' routed GPTQ experts in the integer form (moe_int_arith.h,
  // both under the default --expert-activations auto): x and SiLU(gate)·up quantised to 16-bit integers
  // per 128-k block before the expert matmuls, where the form covers the experts.
  bool expert_int16_prompt = false;
  bool expert_int16_generated = false;

  static Bf16Points none() { return {}; }
  // The CUDA model now: activations in f32 between ops; bf16 remains in the weights (dense
  // F32/F16 and NVFP4 are rounded at upload) and in the K/V cache. The emulation cannot round
  // the cache without the query, so it rounds both (q is f32 on the GPU): a slight
  // over-estimate of the GPU's rounding.
  static Bf16Points cuda_model() {
    Bf16Points p;
    p.weights = p.attn_q_and_cache = p.expert_int16_prompt = p.expert_int16_generated = true;
    return p;
  }
};

// A copy of `w` holding what the GPU multiplies by: dense F32/F16 weights rounded to bf16
// (as F32 tensors), NVFP4 dequantised and rounded; BF16, GPTQ and FP8 weights unchanged.
model::Qwen35Weights weights_as_uploaded(const model::Qwen35Weights& w);

// One sequence fed step by step (positions 0, 1, ... in order), in state slot / KV blocks of
// its own.
class EmulatedForward {
 public:
  EmulatedForward(const io::Qwen35Config& config, const model::Qwen35Weights& weights, Bf16Points points,
                  ThreadPool& pool, int max_tokens);

  // Feeds the next tokens: prompt tokens (a prefill chunk) or generated ones (one decode token).
  void step(std::span<const int32_t> tokens, bool prompt);

  // residual(c): the residual stream [T, H] of every token fed so far after sub-block c
  // (c = 2·layer after the mixer, 2·layer + 1 after the MoE).
  const std::vector<float>& residual(int c) const { return residuals_[size_t(c)]; }
  int num_cuts() const { return int(residuals_.size()); }
  // Final RMSNorm (with the model's rounding of its output) of a residual [T, H].
  std::vector<float> final_normed(const std::vector<float>& residual) const;
  // Logits [T, V] of every token fed so far.
  const std::vector<float>& logits() const { return logits_; }
  // Routed expert ids [T, k] chosen at each layer.
  const std::vector<int32_t>& routing(int layer) const { return routing_[size_t(layer)]; }

 private:
  void attention(size_t layer, const std::vector<float>& xn, const std::vector<float>& xb, int64_t rows,
                 int64_t start, float* h);
  void gdn(size_t layer, const std::vector<float>& xn, const std::vector<float>& xb, int64_t rows, float* h);
  void moe(size_t layer, const std::vector<float>& xn, const std::vector<float>& xb, int64_t rows, bool prompt,
           float* h);
  void round(std::vector<float>& v, bool at) const;

  const io::Qwen35Config& config_;
  model::Qwen35Weights weights_;
  Bf16Points points_;
  ThreadPool& pool_;
  cpu::RotaryEmbedding rope_;
  int64_t fed_ = 0;
  std::vector<int32_t> blocks_;
  std::vector<cpu::PagedKvCache> kv_;                 // per full-attention layer
  std::vector<std::vector<float>> conv_, recurrent_;  // per linear-attention layer
  std::vector<int> cache_index_;
  std::vector<std::vector<float>> residuals_;
  std::vector<std::vector<int32_t>> routing_;
  std::vector<float> logits_;
};

}  // namespace moeserve::gputest
