// moeserve serve MODEL_DIR: the OpenAI-compatible server (src/server/serve_command.h).
// Flags mirror `vllm serve`.
#include <memory>

#include "cli/command.h"
#include "server/serve_command.h"

namespace {

moeserve::cli::Registrar reg{"serve", "Serve a model over an OpenAI-compatible HTTP API", [](CLI::App& app) {
  auto o = std::make_shared<moeserve::server::ServeOptions>();
  app.add_option("model_dir", o->model_dir, "Model directory (config.json, safetensors, tokenizer)")->required();
  app.add_option("--host", o->host, "Address to listen on")->capture_default_str();
  app.add_option("--port", o->port, "Port to listen on (0: any free port)")->capture_default_str();
  app.add_option("--served-model-name", o->served_model_names,
                 "Model name(s) clients use; the first is reported (default: MODEL_DIR as given)");
  app.add_option("--max-model-len", o->max_model_len,
                 "Most tokens (prompt + output) of one sequence (default: the model's max_position_embeddings)");
  app.add_option("--reasoning-parser", o->reasoning_parser, "Split <think> blocks into reasoning_content (qwen3)");
  app.add_option("--tool-call-parser", o->tool_call_parser, "Tool-call syntax: qwen3_coder, qwen3_xml, hermes, qwen3");
  app.add_flag("--enable-auto-tool-choice", o->enable_auto_tool_choice,
               "Let the model decide to call tools (tool_choice \"auto\")");
  app.add_option("--chat-template", o->chat_template, "Chat template: a Jinja file or the template itself");
  app.add_option("--default-chat-template-kwargs", o->default_chat_template_kwargs,
                 "JSON object of template variables for every request, e.g. '{\"enable_thinking\": false}'");
  app.add_option("--structured-outputs-config", o->structured_outputs_config,
                 "JSON object (vLLM's keys): disable_any_whitespace (compact JSON), enable_in_reasoning "
                 "(the grammar also while a model thinks), backend (accepted, one engine)");
  app.add_option("--api-key", o->api_keys, "Require `Authorization: Bearer KEY` on /v1 routes (repeatable)");
  app.add_option("--max-num-seqs", o->max_num_seqs, "Most sequences running at once")->capture_default_str();
  app.add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "Most tokens per engine step")
      ->capture_default_str();
  app.add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                 "Fraction of GPU memory to use (CUDA devices)")->capture_default_str();
  app.add_option("--cpu-kv-cache-space", o->cpu_kv_cache_space_gib,
                 "GiB for the KV cache and GDN state slots on the CPU")->capture_default_str();
  app.add_option("--num-kv-blocks-override", o->num_kv_blocks_override,
                 "Exact number of KV blocks (with --num-state-slots-override)");
  app.add_option("--num-state-slots-override", o->num_state_slots_override,
                 "Exact number of GDN state slots (with --num-kv-blocks-override)");
  app.add_option("--block-size", o->block_size, "Tokens per KV block")->capture_default_str();
  app.add_option("--device", o->device, "cpu, cuda, or auto (cuda when a GPU is visible)")->capture_default_str();
  app.add_option("--load-format", o->load_format, "auto | safetensors | dummy (random weights of config.json, CUDA)")
      ->capture_default_str();
  app.add_option("--dummy-weights", o->dummy_weights,
                 "with --load-format dummy: bf16 | gptq-int4 | fp8-block | hybrid-int4-fp8")
      ->capture_default_str();
  app.add_flag("--int8-lm-head", o->int8_lm_head, "Quantise the LM head to INT8 row-wise at load");
  app.add_option("--decode-kernels", o->decode_kernels,
                 "CUDA kernels for generated tokens: gemv (CUDA-core GEMVs and expert kernels), tensor-cores "
                 "(mma.sync: dense projections and the LM head through tc_gemv, routed experts through the "
                 "prompt-token expert kernels) or mixed (tc_gemv, CUDA-core experts). Either way a request's tokens "
                 "do not depend on its batch")
      ->check(CLI::IsMember({"gemv", "tensor-cores", "mixed"}))
      ->capture_default_str();
  app.add_option("--expert-activations", o->expert_activations,
                 "CUDA, GPTQ INT4 routed experts: int16 quantises their activations to 16-bit integers per 128-k "
                 "block and sums each weight group exactly (dp4a kernels up to 8 tokens, int8 tensor cores above), f32 "
                 "keeps f32 activations and exact f32 products; auto (the fastest mapping, now int16 for every "
                 "token) and int16: every token")
      ->check(CLI::IsMember({"auto", "f32", "int16"}))
      ->capture_default_str();
  app.add_option("--decode-attention", o->decode_attention,
                 "CUDA: generated tokens' attention on tensor-cores (the 16 query heads of a KV head as one MMA "
                 "tile; head_dim 64, 128 or 256, else CUDA cores) or cuda-cores; auto: tensor-cores with "
                 "--decode-kernels mixed or tensor-cores (many concurrent requests), cuda-cores with gemv (batch 1). "
                 "Either way a request's tokens do not depend on its batch")
      ->check(CLI::IsMember({"auto", "tensor-cores", "cuda-cores"}))
      ->capture_default_str();
  app.add_option("--sampling-device", o->sampling_device,
                 "auto: the GPU picks sampled tokens for requests that need no host-only processing; "
                 "host: every sampled row's logits are copied to the host and sampled there")
      ->check(CLI::IsMember({"auto", "host"}))
      ->capture_default_str();
  app.add_option("--threads", o->threads, "CPU threads for the model (0: all)")->capture_default_str();
  app.add_option("--sampler-threads", o->sampler_threads,
                 "Threads that sample rows on the host: penalties, logit_bias, structured output (0: auto, "
                 "up to 8 with a GPU, 1 on the CPU backend)")
      ->capture_default_str();
  app.add_option("--tokenizer", o->tokenizer, "Tokenizer directory (default: MODEL_DIR)");
  app.add_option("--generation-config", o->generation_config,
                 "Default sampling values and extra eos ids: auto (MODEL_DIR/generation_config.json), "
                 "vllm (none) or a directory")
      ->capture_default_str();
  app.add_option("--max-request-body-bytes", o->max_request_body_bytes, "Larger request bodies get 413")
      ->capture_default_str();
  app.add_option("--max-n", o->max_n, "Most choices (n) per request")->capture_default_str();
  app.add_option("--max-logprobs", o->max_logprobs, "Most top logprobs per token")->capture_default_str();
  app.add_option("--max-waiting-requests", o->max_waiting_requests,
                 "Requests allowed to queue before the server answers 503 (0: unlimited)")
      ->capture_default_str();
  app.add_option("--seed", o->seed, "Seed for requests that bring none (default: random)");
  app.add_option("--http-threads", o->http_threads,
                 "HTTP worker threads (0: 2 x max-num-seqs + 16, within [64, 1024])")->capture_default_str();
  app.add_option("--shutdown-timeout", o->shutdown_timeout_s,
                 "Seconds running requests get to finish after SIGTERM before they are aborted")
      ->capture_default_str();
  return [o] { return moeserve::server::run_serve(*o); };
}};

}  // namespace
