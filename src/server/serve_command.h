// `moeserve serve MODEL_DIR`: the whole server process. The HTTP server listens first (so
// /health answers 503 while loading), then the tokenizer, chat template, model and engine
// load, then /health turns 200. SIGTERM/SIGINT: stop accepting, let running requests finish
// (up to --shutdown-timeout), drain the engine, exit 0; a second signal exits at once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moeserve::server {

// Flags mirror `vllm serve` where the same idea exists.
struct ServeOptions {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> served_model_names;  // default: model_dir as given
  int max_model_len = 0;                        // 0: the model's max_position_embeddings
  std::string reasoning_parser;
  std::string tool_call_parser;
  bool enable_auto_tool_choice = false;
  std::string chat_template;                    // file or inline template
  std::string default_chat_template_kwargs;     // JSON object
  std::string structured_outputs_config;        // JSON object (vLLM's keys)
  std::vector<std::string> api_keys;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  double gpu_memory_utilization = 0.9;          // CUDA devices (not used on the CPU)
  double cpu_kv_cache_space_gib = 4.0;          // KV blocks + GDN state slots on the CPU
  int num_kv_blocks_override = 0;               // with num_state_slots_override: exact pool sizes
  int num_state_slots_override = 0;
  int block_size = 16;                          // tokens per KV block
  std::string device = "auto";                 // cpu, cuda, or auto (cuda when a GPU is visible)
  std::string load_format = "auto";             // auto | safetensors | dummy (random weights, CUDA)
  std::string dummy_weights = "bf16";           // with dummy: bf16 | gptq-int4 | fp8-block | hybrid-int4-fp8
  bool int8_lm_head = false;                    // LM head quantised to INT8 row-wise at load
  std::string decode_kernels = "gemv";          // CUDA: gemv | tensor-cores | mixed (ModelLoadOptions)
  std::string expert_activations = "auto";      // CUDA: auto | f32 | int16 (ModelLoadOptions)
  std::string decode_attention = "auto";        // CUDA: auto | tensor-cores | cuda-cores (ModelLoadOptions)
  std::string sampling_device = "auto";         // auto (on the GPU when the model can) | host
  int threads = 0;                              // CPU threads for the model (0: all)
  int sampler_threads = 0;                      // host sampling threads (0: auto, sampler_threads_for)
  std::string tokenizer;                        // default: model_dir
  std::string generation_config = "auto";       // auto (MODEL_DIR's), vllm (none) or a directory
  size_t max_request_body_bytes = 32u << 20;
  int max_n = 16;
  int max_logprobs = 20;
  int max_waiting_requests = 0;                 // 0: unlimited
  std::optional<uint64_t> seed;
  int http_threads = 0;                         // 0: from max_num_seqs
  double shutdown_timeout_s = 30.0;
};

// Runs until a signal; returns the exit code. Throws moeserve::Error for bad flags or files.
int run_serve(const ServeOptions& options);

// --sampler-threads: `requested` when positive; else 1 on the CPU backend (its threads run
// the model) and half the host's cores, 1 to 8, with a GPU.
int sampler_threads_for(int requested, const std::string& device);

}  // namespace moeserve::server
