#include "server/serve_command.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "model/model_loader.h"
#include "runtime/engine.h"
#include "server/generation_config.h"
#include "server/openai_server.h"
#include "server/runtime_engine_client.h"
#include "text/chat_template.h"
#include "text/reasoning_parser.h"
#include "text/tokenizer.h"
#include "text/tool_parser.h"

namespace moeserve::server {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void check_parser_name(const std::string& flag, const std::string& name,
                       std::span<const std::string_view> names) {
  if (name.empty()) return;
  if (std::find(names.begin(), names.end(), name) != names.end()) return;
  std::string valid;
  for (auto n : names) valid += (valid.empty() ? "" : ", ") + std::string(n);
  fail("{} {}: unknown parser (available: {})", flag, name, valid);
}

json parse_kwargs_flag(const std::string& text) {
  if (text.empty()) return json::object();
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    fail("--default-chat-template-kwargs must be a JSON object, got: {}", text);
  return j;
}

// vLLM's --structured-outputs-config: a JSON object. `backend` names vLLM's engines; moeserve
// has one, so any name is accepted. Keys this server cannot honour are refused.
ServerConfig::StructuredOutputsConfig parse_structured_outputs_flag(const std::string& text) {
  ServerConfig::StructuredOutputsConfig config;
  if (text.empty()) return config;
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) fail("--structured-outputs-config must be a JSON object, got: {}", text);
  for (const auto& [key, value] : j.items()) {
    if (key == "backend") {
      MOESERVE_CHECK(value.is_string(), "--structured-outputs-config: `backend` must be a string");
    } else if (key == "disable_any_whitespace" || key == "enable_in_reasoning") {
      MOESERVE_CHECK(value.is_boolean(), "--structured-outputs-config: `{}` must be true or false", key);
      (key == "disable_any_whitespace" ? config.disable_any_whitespace : config.enable_in_reasoning) =
          value.get<bool>();
    } else {
      fail("--structured-outputs-config: unknown key `{}` (supported: backend, disable_any_whitespace, "
           "enable_in_reasoning)",
           key);
    }
  }
  return config;
}

void validate(const ServeOptions& o) {
  MOESERVE_CHECK(o.sampler_threads >= 0 && o.sampler_threads <= 256, "--sampler-threads must be in [0, 256], got {}",
                 o.sampler_threads);
  (void)parse_structured_outputs_flag(o.structured_outputs_config);
  MOESERVE_CHECK(o.port >= 0 && o.port <= 65535, "--port must be in [0, 65535], got {}", o.port);
  MOESERVE_CHECK(o.max_model_len >= 0, "--max-model-len must be positive, got {}", o.max_model_len);
  MOESERVE_CHECK(o.max_num_seqs >= 1, "--max-num-seqs must be at least 1, got {}", o.max_num_seqs);
  MOESERVE_CHECK(o.max_num_batched_tokens >= 1, "--max-num-batched-tokens must be at least 1, got {}",
                 o.max_num_batched_tokens);
  MOESERVE_CHECK(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1,
                 "--gpu-memory-utilization must be in (0, 1], got {}", o.gpu_memory_utilization);
  MOESERVE_CHECK(o.cpu_kv_cache_space_gib > 0, "--cpu-kv-cache-space must be positive (GiB), got {}",
                 o.cpu_kv_cache_space_gib);
  MOESERVE_CHECK(o.max_n >= 1, "--max-n must be at least 1, got {}", o.max_n);
  MOESERVE_CHECK(o.max_logprobs >= 0, "--max-logprobs must not be negative, got {}", o.max_logprobs);
  MOESERVE_CHECK(o.sampling_device == "auto" || o.sampling_device == "host",
                 "--sampling-device must be auto or host, got '{}'", o.sampling_device);
  MOESERVE_CHECK(o.max_request_body_bytes >= 1024, "--max-request-body-bytes must be at least 1024, got {}",
                 o.max_request_body_bytes);
  MOESERVE_CHECK(o.shutdown_timeout_s >= 0, "--shutdown-timeout must not be negative, got {}",
                 o.shutdown_timeout_s);
  MOESERVE_CHECK(o.generation_config == "auto" || o.generation_config == "vllm" ||
                     std::filesystem::is_directory(o.generation_config),
                 "--generation-config must be auto, vllm or a directory, got {}", o.generation_config);
  MOESERVE_CHECK(!o.enable_auto_tool_choice || !o.tool_call_parser.empty(),
                 "--enable-auto-tool-choice needs --tool-call-parser");
  check_parser_name("--reasoning-parser", o.reasoning_parser, text::ReasoningParser::names());
  check_parser_name("--tool-call-parser", o.tool_call_parser, text::ToolParser::names());
  for (const auto& key : o.api_keys) MOESERVE_CHECK(!key.empty(), "--api-key must not be empty");
}

// Signals are handled on one thread (sigwait); every other thread has them blocked.
class SignalWatcher {
 public:
  SignalWatcher() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    thread_ = std::thread([this] { run(); });
    thread_.detach();  // it only ever leaves the process by exiting it
  }
  // While a server is attached the first signal starts its graceful shutdown; without
  // one (still loading) the process exits at once. A second signal always exits.
  void attach(OpenAiServer* server) {
    std::lock_guard lock(mutex_);
    server_ = server;
  }

 private:
  void run() {
    int received = 0;
    while (true) {
      int sig = 0;
      if (sigwait(&set_, &sig) != 0) continue;
      std::lock_guard lock(mutex_);
      if (++received > 1 || !server_) {
        log::warn("{}: exiting now", sig == SIGINT ? "SIGINT" : "SIGTERM");
        std::_Exit(received > 1 ? 1 : 0);
      }
      log::info("{}: graceful shutdown (send it again to exit at once)", sig == SIGINT ? "SIGINT" : "SIGTERM");
      server_->begin_shutdown();
    }
  }

  sigset_t set_;
  std::mutex mutex_;
  OpenAiServer* server_ = nullptr;
  std::thread thread_;
};

}  // namespace

int sampler_threads_for(int requested, const std::string& device) {
  if (requested > 0) return requested;
  // With a GPU the host's cores are idle during a step; on the CPU backend they run the model.
  if (device != "cuda") return 1;
  return std::clamp(int(std::thread::hardware_concurrency()) / 2, 1, 8);
}

int run_serve(const ServeOptions& o) {
  validate(o);
  static SignalWatcher signals;  // before any other thread exists

  const fs::path model_dir = o.model_dir;
  const fs::path tokenizer_dir = o.tokenizer.empty() ? model_dir : fs::path(o.tokenizer);
  const io::Qwen35Config model_config = io::load_qwen35_config(model_dir);
  const int max_model_len =
      o.max_model_len > 0 ? o.max_model_len
                          : int(std::min<int64_t>(model_config.max_position_embeddings > 0
                                                      ? model_config.max_position_embeddings
                                                      : 4096,
                                                  INT32_MAX));

  // vLLM's --generation-config: "auto" reads MODEL_DIR, "vllm" ignores the model's, a
  // directory is read instead.
  const GenerationConfig generation_config =
      o.generation_config == "vllm" ? GenerationConfig{}
      : load_generation_config(o.generation_config == "auto" ? model_dir : fs::path(o.generation_config));
  if (!generation_config.defaults.empty())
    log::info("default sampling parameters come from the model's generation_config.json "
              "(--generation-config vllm to ignore them)");

  ServerConfig config;
  config.served_model_names = o.served_model_names.empty() ? std::vector<std::string>{o.model_dir}
                                                           : o.served_model_names;
  config.model_root = o.model_dir;
  config.reasoning_parser = o.reasoning_parser;
  config.tool_call_parser = o.tool_call_parser;
  config.enable_auto_tool_choice = o.enable_auto_tool_choice;
  config.default_chat_template_kwargs = parse_kwargs_flag(o.default_chat_template_kwargs);
  config.structured_outputs = parse_structured_outputs_flag(o.structured_outputs_config);
  config.api_keys = o.api_keys;
  config.sampling_defaults = generation_config.defaults;
  config.limits.max_model_len = max_model_len;
  config.limits.max_n = o.max_n;
  config.limits.max_logprobs = o.max_logprobs;
  config.limits.max_choices = std::max(o.max_n, o.max_num_seqs);
  config.limits.vocab_size = model_config.vocab_size;
  config.shutdown_timeout = std::chrono::seconds(int64_t(o.shutdown_timeout_s));

  HttpServerOptions http;
  http.host = o.host;
  http.port = o.port;
  // Every open stream, every request waiting for its answer and every idle keep-alive
  // connection holds a worker: room for all running and as many again waiting.
  http.threads = o.http_threads > 0 ? o.http_threads : std::clamp(2 * o.max_num_seqs + 16, 64, 1024);
  http.max_request_body_bytes = o.max_request_body_bytes;

  OpenAiServer server(config, http);
  const int port = server.bind();
  log::info("listening on http://{}:{} (loading {})", o.host, port, o.model_dir);
  std::thread http_thread([&] { server.serve(); });
  struct JoinOnExit {
    OpenAiServer& server;
    std::thread& thread;
    ~JoinOnExit() {
      server.begin_shutdown();
      if (thread.joinable()) thread.join();
    }
  } join_on_exit{server, http_thread};

  // Tokenizer, chat template, model, engine.
  const text::Tokenizer tokenizer = text::Tokenizer::load(tokenizer_dir);
  MOESERVE_CHECK(tokenizer.vocab_size() <= model_config.vocab_size,
                 "the tokenizer ({} ids) does not fit the model's vocabulary ({})", tokenizer.vocab_size(),
                 model_config.vocab_size);
  std::optional<text::ChatTemplate> chat_template;
  try {
    chat_template = o.chat_template.empty() ? text::ChatTemplate::load(tokenizer_dir)
                                            : text::ChatTemplate::load(tokenizer_dir, o.chat_template);
  } catch (const Error& e) {
    if (!o.chat_template.empty()) throw;
    log::warn("no chat template ({}); /v1/chat/completions will answer 400", e.what());
  }

  model::ModelLoadOptions load;
  load.device = model::resolve_device(o.device);
  load.threads = o.threads;
  load.kv_block_size = o.block_size;
  load.load_format = o.load_format;
  load.dummy_weights = o.dummy_weights;
  load.int8_lm_head = o.int8_lm_head;
  load.decode_kernels = o.decode_kernels;
  load.expert_activations = o.expert_activations;
  load.decode_attention = o.decode_attention;
  // The GPU model sizes its step workspaces and block tables from these once, at load.
  load.max_num_batched_tokens = o.max_num_batched_tokens;
  load.max_num_seqs = o.max_num_seqs;
  load.max_model_len = int(max_model_len);
  auto model = model::load_causal_lm(model_dir, load);

  runtime::EngineConfig engine_config;
  engine_config.max_num_seqs = o.max_num_seqs;
  engine_config.max_num_batched_tokens = o.max_num_batched_tokens;
  engine_config.max_model_len = max_model_len;
  // The cache budget: --gpu-memory-utilization of the GPU on CUDA (what the loaded model
  // leaves), --cpu-kv-cache-space on the CPU.
  engine_config.kv_cache_bytes = load.device == "cuda"
                                     ? model::gpu_cache_budget_bytes(o.gpu_memory_utilization)
                                     : size_t(o.cpu_kv_cache_space_gib * double(1ull << 30));
  if (load.device != "cuda" && o.num_kv_blocks_override == 0 && o.num_state_slots_override == 0) {
    // The pools are populated before the server is ready (ZeroedHostBuffer); refuse a budget the
    // host cannot give now rather than meet the out-of-memory killer while populating it.
    if (const auto avail = available_host_memory(); avail && engine_config.kv_cache_bytes > *avail)
      fail("--cpu-kv-cache-space {} GiB is more than the {:.2f} GiB of host memory available now (MemAvailable, "
           "cgroup memory.max) with the model loaded; lower --cpu-kv-cache-space",
           o.cpu_kv_cache_space_gib, double(*avail) / double(1ull << 30));
  }
  engine_config.kv_block_size = o.block_size;
  engine_config.num_kv_blocks_override = o.num_kv_blocks_override;
  engine_config.num_state_slots_override = o.num_state_slots_override;
  engine_config.max_waiting_requests = o.max_waiting_requests;
  engine_config.max_logprobs = o.max_logprobs;
  engine_config.seed = o.seed;
  engine_config.device_sampling = o.sampling_device == "auto";
  engine_config.sampler_threads = sampler_threads_for(o.sampler_threads, load.device);
  runtime::Engine engine(std::move(model), engine_config);
  RuntimeEngineClient engine_client(engine);

  // Generation stops at the model config's eos (the engine's), and at the ids of
  // generation_config.json and the tokenizer's eos token (as vLLM adds them).
  ModelServices services;
  services.tokenizer = &tokenizer;
  services.engine = &engine_client;
  for (int64_t id : model_config.eos_token_ids) services.eos_token_ids.insert(int32_t(id));
  std::vector<int32_t> extra = generation_config.eos_token_ids;
  if (auto eos = tokenizer.eos_token_id()) extra.push_back(*eos);
  for (int32_t id : extra)
    if (services.eos_token_ids.insert(id).second) services.extra_stop_token_ids.push_back(id);
  if (chat_template) {
    services.render_chat = [&chat_template](const ChatPromptRequest& r) {
      std::string prompt = chat_template->render(r.messages, r.tools, r.add_generation_prompt, r.kwargs);
      if (r.continue_final_message) {
        // transformers' continue_final_message: cut the rendered prompt right after the final
        // message's (stripped) content, so that generation continues it.
        const json& last = r.messages.back();
        std::string content = last["content"].is_string() ? last["content"].get<std::string>() : "";
        const auto not_space = [](unsigned char c) { return !std::isspace(c); };
        content.erase(content.begin(), std::find_if(content.begin(), content.end(), not_space));
        content.erase(std::find_if(content.rbegin(), content.rend(), not_space).base(), content.end());
        const size_t at = prompt.rfind(content);
        MOESERVE_CHECK(!content.empty() && at != std::string::npos,
                       "continue_final_message: the final message does not appear in the rendered chat");
        prompt.resize(at + content.size());
      }
      return prompt;
    };
  }
  server.set_ready(std::move(services));
  signals.attach(&server);
  const auto stats = engine.stats();
  log::info("ready: {} as {}; max_model_len {}, {} KV blocks of {} tokens, {} state slots", o.model_dir,
            config.served_model_names.front(), max_model_len, stats.total_kv_blocks, stats.kv_block_size,
            stats.total_state_slots);

  http_thread.join();  // returns after a signal, once running requests are done
  signals.attach(nullptr);
  engine.drain();
  log::info("shut down cleanly");
  return 0;
}

}  // namespace moeserve::server
