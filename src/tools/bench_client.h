// A minimal OpenAI-compatible HTTP client for the benchmark: works against any server that
// speaks /v1/models, /v1/chat/completions and /v1/completions (moeserve, vLLM, SGLang,
// llama-server). One BenchClient per thread: it owns one cpp-httplib connection.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench_stats.h"

namespace httplib {
class Client;
}

namespace moeserve::tools {

// "http://host:port[/prefix]" split for httplib. A trailing "/" or "/v1" is dropped, so both
// "http://h:8000" and "http://h:8000/v1" (what OpenAI SDKs call the base URL) work.
struct BaseUrl {
  std::string scheme_host_port;  // "http://127.0.0.1:8000"
  std::string path_prefix;       // "" or "/proxy"
};
BaseUrl parse_base_url(const std::string& url);

enum class ApiEndpoint { Chat, Completions };
ApiEndpoint parse_api_endpoint(const std::string& name);  // "chat" | "completions"
const char* api_path(ApiEndpoint e);                      // "/v1/chat/completions", ...

struct ClientOptions {
  BaseUrl base;
  std::string api_key;          // sent as "Authorization: Bearer KEY" when not empty
  double timeout_s = 600;       // connect and per-read timeout
};

// One generation request as the benchmark sends it.
struct GenerationRequest {
  std::string prompt;                    // the user message (chat) or the prompt (completions)
  std::vector<int32_t> prompt_token_ids; // completions only: sent instead of `prompt` when set
  nlohmann::json messages;               // chat only: sent instead of `prompt` when not null
  int64_t max_tokens = 16;
  int64_t planned_prompt_tokens = 0;     // used when the server reports no usage
};

// Request-body settings shared by every request of a run.
struct SamplingSettings {
  std::string model;
  ApiEndpoint endpoint = ApiEndpoint::Chat;
  double temperature = 0.0;
  bool ignore_eos = false;          // vLLM/moeserve extension: generate exactly max_tokens
  nlohmann::json extra_body;        // merged into every body (object or null)
};

// Builds the JSON body of a request. `stream` adds "stream": true and
// "stream_options": {"include_usage": true}.
nlohmann::json build_request_body(const GenerationRequest& req, const SamplingSettings& s, bool stream);

// Result of a non-streaming call.
struct PlainResponse {
  bool ok = false;           // transport fine and HTTP 200 and a JSON body
  int http_status = 0;
  std::string error;         // set when !ok
  nlohmann::json body;
  double elapsed_s = 0;      // wall time around the whole exchange
};

class BenchClient {
 public:
  explicit BenchClient(ClientOptions options);
  ~BenchClient();
  BenchClient(const BenchClient&) = delete;
  BenchClient& operator=(const BenchClient&) = delete;

  // GET /v1/models and returns data[0].id. Throws moeserve::Error naming the URL on failure.
  std::string first_model_id();

  // GET path; nullopt unless HTTP 200 (used for the optional /metrics scrape).
  std::optional<std::string> get_text(const std::string& path);

  // POSTs `body` to `path` and waits for the whole JSON answer.
  PlainResponse post_json(const std::string& path, const nlohmann::json& body);

  // Sends one streaming request and times it (see bench_stats.h for the definitions).
  // `bench_start` is the benchmark's time origin for RequestRecord::start_time. Never throws
  // for server or network errors: they make a failed record.
  RequestRecord stream_generation(const GenerationRequest& req, const SamplingSettings& s,
                                  std::chrono::steady_clock::time_point bench_start);

 private:
  ClientOptions options_;
  std::unique_ptr<httplib::Client> http_;
};

// Parses one SSE "data" payload of a streamed completion into `record`, with `now_s` the
// time (seconds since the request was sent) at which its bytes arrived. Returns false once
// the stream is over ("[DONE]"). Malformed JSON or an {"error": ...} event marks the record
// failed. Exposed for tests.
struct StreamState {
  bool first_output_seen = false;
  double last_output_s = 0;   // time of the previous output chunk
  double last_event_s = 0;    // time of the last data event (E2EL)
  bool done = false;
};
void consume_stream_event(const std::string& data, double now_s, ApiEndpoint endpoint,
                          StreamState& state, RequestRecord& record);

}  // namespace moeserve::tools
