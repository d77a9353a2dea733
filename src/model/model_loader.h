// Opens a model directory on a device: the one entry point for commands that run a model
// (score, generate, serve, perplexity).
//
// Declared here so callers see only the model layer; DEFINED in src/loader/model_loader.cpp
// (library moeserve_loader), the one place that links every backend (CPU, and CUDA when the
// build has it). Link moeserve_loader (moeserve_all does) to call it.
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "model/causal_lm.h"

namespace moeserve::model {

struct ModelLoadOptions {
  std::string device = "cpu";  // "cpu", "cuda", or "auto" (cuda when a GPU is visible)
  int threads = 0;             // CPU threads; <= 0: all hardware threads
  int kv_block_size = 16;
  bool load_mtp = true;
  // "auto"/"safetensors": read the checkpoint; "dummy": random weights of config.json (CUDA).
  std::string load_format = "auto";
  // With load_format "dummy": "bf16", "gptq-int4", "fp8-block" or "hybrid-int4-fp8".
  std::string dummy_weights = "bf16";
  bool int8_lm_head = false;         // quantise the LM head to INT8 row-wise at load (CPU and CUDA)
  int max_num_batched_tokens = 2048; // CUDA: sizes the step workspaces
  int max_num_seqs = 256;            // CUDA: largest batch
  int max_model_len = 4096;          // CUDA: block-table width
  // CUDA: kernels of generated tokens: "gemv" (CUDA-core GEMVs, fastest at batch 1) or
  // "tensor-cores" (the prompt tokens' kernels). Prompt tokens always take the tensor cores.
  std::string decode_kernels = "gemv";
  // CUDA: GPTQ INT4 routed experts in the integer form (moe_routed_experts_int) for "auto" prompt
  // tokens, "int16" every token, "f32" none.
  std::string expert_activations = "auto";
  // CUDA: generated tokens' attention: "auto" (tensor cores with decode_kernels mixed / tensor-cores),
  // "tensor-cores" (head_dim 64 / 128 / 256) or "cuda-cores".
  std::string decode_attention = "auto";
};

// "cpu" or "cuda" for a requested device; throws for an unknown or unavailable one.
std::string resolve_device(const std::string& requested);

// Throws moeserve::Error for an unknown or unavailable device and for any bad file.
std::unique_ptr<CausalLM> load_causal_lm(const std::filesystem::path& model_dir, const ModelLoadOptions& options);

// Bytes of GPU memory left for the KV cache and the state slots once the model is loaded:
// utilization · total − (memory in use on the device now), as vLLM's --gpu-memory-utilization.
// Throws when nothing is left (naming what the weights and workspaces use) or without CUDA.
size_t gpu_cache_budget_bytes(double utilization);

}  // namespace moeserve::model
