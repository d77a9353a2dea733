// Engine settings (the server maps its vLLM-style flags onto these).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>

namespace moeserve::runtime {

struct EngineConfig {
  int max_num_seqs = 256;             // sequences running at once (each holds a GDN state slot)
  int max_num_batched_tokens = 2048;  // tokens per step: decodes + prefill chunks
  int max_model_len = 4096;           // prompt + generated tokens of one sequence
  // Memory for the KV blocks and the GDN state slots. Slots are sized for max_num_seqs (fewer
  // when memory is short, never fewer than 1) and blocks get the rest; at least one
  // max_model_len sequence must fit.
  size_t kv_cache_bytes = 0;
  // Tokens per KV block: 0 takes the model's CacheGeometry::kv_block_size (16 for the CPU and
  // CUDA models); any other value must equal it (the KV layout is the model's).
  int kv_block_size = 0;
  // When > 0, used instead of the kv_cache_bytes split (vLLM's --num-gpu-blocks-override).
  int num_kv_blocks_override = 0;
  int num_state_slots_override = 0;
  // Requests admitted to a step only while this fraction of blocks stays free after the
  // admission, so that running sequences can grow without preempting at once.
  double kv_admission_watermark = 0.01;
  // Requests allowed to wait for admission; 0 is unlimited. Beyond it submit() throws
  // EngineOverloaded (the server answers 503).
  int max_waiting_requests = 0;
  // Most top-k alternatives a request may ask for (logprobs, prompt_logprobs).
  int max_logprobs = 20;
  // Seeds the seeds of requests that bring none; unset: a random device.
  std::optional<uint64_t> seed;
  // Threads that sample the sequences of one step in parallel (1: the engine thread only).
  int sampler_threads = 1;
  // Let a model that can (the CUDA model) pick sampled tokens on the device for requests
  // with no host-only processing; false copies every sampled row's logits to the host.
  bool device_sampling = true;
};

}  // namespace moeserve::runtime
