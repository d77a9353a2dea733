#include "tools/bench_client.h"

#include <httplib.h>

#include "core/error.h"
#include "tools/bench_sse.h"

namespace moeserve::tools {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kMaxErrorBodyBytes = 2000;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

httplib::Headers make_headers(const ClientOptions& o, bool stream) {
  httplib::Headers h{{"Accept", stream ? "text/event-stream" : "application/json"}};
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  return h;
}

// What went wrong below HTTP, in words.
std::string describe_transport_error(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "could not connect (is the server running?)";
    case httplib::Error::ConnectionTimeout: return "connection timed out";
    case httplib::Error::Read: return "read failed or timed out (see --timeout)";
    case httplib::Error::Write: return "write failed";
    case httplib::Error::SSLConnection: return "TLS connection failed";
    case httplib::Error::SSLServerVerification: return "TLS server verification failed";
    default: return httplib::to_string(e) + " error";
  }
}

// A short description of an error body: the OpenAI {"error": {"message": ...}} when present.
std::string describe_error_body(const std::string& body) {
  auto j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error")) {
    const auto& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string())
      return e["message"].get<std::string>();
    if (e.is_string()) return e.get<std::string>();
  }
  return body.size() > kMaxErrorBodyBytes ? body.substr(0, kMaxErrorBodyBytes) + "..." : body;
}

// Text a streamed chunk carries, for chat ("delta") or completions ("text").
// `has_output` is true when it carries any generated output, including tool-call deltas.
std::string chunk_text(const json& choice, ApiEndpoint endpoint, bool& has_output) {
  std::string text;
  has_output = false;
  auto take = [&](const json& obj, const char* key) {
    auto it = obj.find(key);
    if (it != obj.end() && it->is_string() && !it->get_ref<const std::string&>().empty()) {
      text += it->get_ref<const std::string&>();
      has_output = true;
    }
  };
  if (endpoint == ApiEndpoint::Completions) {
    take(choice, "text");
    return text;
  }
  auto delta = choice.find("delta");
  if (delta == choice.end() || !delta->is_object()) return text;
  // vLLM's reasoning parser used "reasoning_content", newer versions "reasoning".
  take(*delta, "reasoning_content");
  take(*delta, "reasoning");
  take(*delta, "content");
  auto tools = delta->find("tool_calls");
  if (tools != delta->end() && tools->is_array() && !tools->empty()) has_output = true;
  return text;
}

}  // namespace

BaseUrl parse_base_url(const std::string& url) {
  const auto scheme_end = url.find("://");
  MOESERVE_CHECK(scheme_end != std::string::npos, "--base-url '{}' must start with http:// or https://", url);
  const std::string scheme = url.substr(0, scheme_end);
  MOESERVE_CHECK(scheme == "http" || scheme == "https", "--base-url '{}': unsupported scheme '{}'", url, scheme);
  const auto path_start = url.find('/', scheme_end + 3);
  BaseUrl b;
  b.scheme_host_port = url.substr(0, path_start);
  MOESERVE_CHECK(b.scheme_host_port.size() > scheme_end + 3, "--base-url '{}' has no host", url);
  std::string path = path_start == std::string::npos ? "" : url.substr(path_start);
  while (!path.empty() && path.back() == '/') path.pop_back();
  if (path.size() >= 3 && path.compare(path.size() - 3, 3, "/v1") == 0) path.resize(path.size() - 3);
  while (!path.empty() && path.back() == '/') path.pop_back();
  b.path_prefix = path;
  return b;
}

ApiEndpoint parse_api_endpoint(const std::string& name) {
  if (name == "chat") return ApiEndpoint::Chat;
  if (name == "completions") return ApiEndpoint::Completions;
  fail("--endpoint must be 'chat' or 'completions', not '{}'", name);
}

const char* api_path(ApiEndpoint e) {
  return e == ApiEndpoint::Chat ? "/v1/chat/completions" : "/v1/completions";
}

json build_request_body(const GenerationRequest& req, const SamplingSettings& s, bool stream) {
  json body = json::object();
  body["model"] = s.model;
  if (s.endpoint == ApiEndpoint::Chat) {
    body["messages"] = req.messages.is_null()
                           ? json::array({{{"role", "user"}, {"content", req.prompt}}})
                           : req.messages;
  } else if (!req.prompt_token_ids.empty()) {
    body["prompt"] = req.prompt_token_ids;
  } else {
    body["prompt"] = req.prompt;
  }
  body["max_tokens"] = req.max_tokens;
  body["temperature"] = s.temperature;
  if (s.ignore_eos) body["ignore_eos"] = true;
  if (stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  if (s.extra_body.is_object()) body.update(s.extra_body);
  return body;
}

BenchClient::BenchClient(ClientOptions options)
    : options_(std::move(options)), http_(std::make_unique<httplib::Client>(options_.base.scheme_host_port)) {
  MOESERVE_CHECK(http_->is_valid(), "cannot create an HTTP client for '{}'", options_.base.scheme_host_port);
  const auto sec = time_t(options_.timeout_s);
  const auto usec = time_t((options_.timeout_s - double(sec)) * 1e6);
  http_->set_connection_timeout(sec, usec);
  http_->set_read_timeout(sec, usec);
  http_->set_write_timeout(sec, usec);
  http_->set_keep_alive(true);
  http_->set_tcp_nodelay(true);
}

BenchClient::~BenchClient() = default;

std::string BenchClient::first_model_id() {
  const std::string url = options_.base.scheme_host_port + options_.base.path_prefix + "/v1/models";
  auto res = http_->Get(options_.base.path_prefix + "/v1/models", make_headers(options_, false));
  if (!res) fail("GET {} failed: {}", url, describe_transport_error(res.error()));
  if (res->status != 200) fail("GET {} returned HTTP {}: {}", url, res->status, describe_error_body(res->body));
  auto j = json::parse(res->body, nullptr, false);
  MOESERVE_CHECK(!j.is_discarded(), "GET {}: the answer is not JSON", url);
  MOESERVE_CHECK(j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
                     j["data"][0].is_object() && j["data"][0].contains("id") && j["data"][0]["id"].is_string(),
                 "GET {}: no model listed (expected data[0].id)", url);
  return j["data"][0]["id"].get<std::string>();
}

std::optional<std::string> BenchClient::get_text(const std::string& path) {
  auto res = http_->Get(options_.base.path_prefix + path, make_headers(options_, false));
  if (!res || res->status != 200) return std::nullopt;
  return res->body;
}

PlainResponse BenchClient::post_json(const std::string& path, const json& body) {
  PlainResponse out;
  const auto t0 = Clock::now();
  auto res = http_->Post(options_.base.path_prefix + path, make_headers(options_, false), body.dump(),
                         "application/json");
  out.elapsed_s = seconds_between(t0, Clock::now());
  if (!res) {
    out.error = describe_transport_error(res.error());
    return out;
  }
  out.http_status = res->status;
  if (res->status != 200) {
    out.error = fmt::format("HTTP {}: {}", res->status, describe_error_body(res->body));
    return out;
  }
  out.body = json::parse(res->body, nullptr, false);
  if (out.body.is_discarded()) {
    out.error = "the answer is not JSON";
    return out;
  }
  out.ok = true;
  return out;
}

void consume_stream_event(const std::string& data, double now_s, ApiEndpoint endpoint, StreamState& state,
                          RequestRecord& record) {
  if (data == "[DONE]") {
    state.done = true;
    return;
  }
  auto j = json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    record.error = "a streamed event is not a JSON object: " + data.substr(0, 200);
    state.done = true;
    return;
  }
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    record.error = "the server reported an error mid-stream: " + describe_error_body(data);
    state.done = true;
    return;
  }
  state.last_event_s = now_s;
  if (auto choices = j.find("choices"); choices != j.end() && choices->is_array() && !choices->empty() &&
                                        (*choices)[0].is_object()) {
    bool has_output = false;
    record.generated_text += chunk_text((*choices)[0], endpoint, has_output);
    if (has_output) {
      if (!state.first_output_seen) {
        state.first_output_seen = true;
        record.ttft = now_s;
      } else {
        record.itl.push_back(now_s - state.last_output_s);
      }
      state.last_output_s = now_s;
      ++record.output_chunks;
    }
  }
  if (auto usage = j.find("usage"); usage != j.end() && usage->is_object()) {
    if (auto c = usage->find("completion_tokens"); c != usage->end() && c->is_number_integer())
      record.output_tokens = c->get<int64_t>();
    if (auto p = usage->find("prompt_tokens"); p != usage->end() && p->is_number_integer())
      record.prompt_tokens = p->get<int64_t>();
  }
}

RequestRecord BenchClient::stream_generation(const GenerationRequest& req, const SamplingSettings& s,
                                             Clock::time_point bench_start) {
  RequestRecord record;
  record.prompt_tokens = req.planned_prompt_tokens;

  httplib::Request hreq;
  hreq.method = "POST";
  hreq.path = options_.base.path_prefix + api_path(s.endpoint);
  hreq.headers = make_headers(options_, true);
  hreq.body = build_request_body(req, s, true).dump();
  hreq.set_header("Content-Type", "application/json");

  SseParser parser;
  StreamState state;
  std::vector<SseEvent> events;
  std::string error_body;
  int status = 0;
  hreq.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  const auto sent = Clock::now();
  hreq.content_receiver = [&](const char* bytes, size_t n, uint64_t, uint64_t) {
    const double now = seconds_between(sent, Clock::now());
    if (status != 200) {
      if (error_body.size() < kMaxErrorBodyBytes) error_body.append(bytes, n);
      return true;
    }
    events.clear();
    parser.feed(std::string_view(bytes, n), events);
    for (const auto& ev : events) {
      if (state.done) break;
      consume_stream_event(ev.data, now, s.endpoint, state, record);
    }
    return true;  // read to the end so the connection can be reused
  };
  record.start_time = seconds_between(bench_start, sent);
  auto res = http_->send(hreq);
  const double end = seconds_between(sent, Clock::now());
  record.http_status = status;
  if (!res) {
    record.error = fmt::format("request failed: {}", describe_transport_error(res.error()));
    return record;
  }
  if (status != 200) {
    record.error = fmt::format("HTTP {}: {}", status, describe_error_body(error_body));
    return record;
  }
  if (!state.done) {
    events.clear();
    parser.finish(events);
    for (const auto& ev : events)
      if (!state.done) consume_stream_event(ev.data, end, s.endpoint, state, record);
  }
  if (!record.error.empty()) return record;
  if (!state.first_output_seen) {
    record.error = "the stream carried no output (no chunk with generated text)";
    return record;
  }
  record.latency = state.last_event_s;
  record.success = true;
  return record;
}

}  // namespace moeserve::tools
