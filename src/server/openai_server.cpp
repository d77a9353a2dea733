#include "server/openai_server.h"

#include <fmt/format.h>

#include "core/log.h"
#include "server/sse.h"
#include "server/utf8.h"
#include "structured/json_grammar.h"

namespace moeserve::server {

using nlohmann::json;

namespace {
// Deeper JSON than this is refused: no OpenAI request needs it, and templates and dumps
// recurse over it.
constexpr int kMaxJsonDepth = 64;
}  // namespace

OpenAiServer::OpenAiServer(ServerConfig config, HttpServerOptions http)
    : config_(std::move(config)),
      http_(std::move(http)),
      auth_(config_.api_keys),
      metrics_(config_.served_model_names.empty() ? std::string("model")
                                                  : config_.served_model_names.front()) {
  MOESERVE_CHECK(!config_.served_model_names.empty(), "the server needs a served model name");
  http_.set_guard([this](const httplib::Request& req, httplib::Response& res) {
    if (!auth_.enabled() || !ApiKeyAuth::route_requires_key(req.path)) return true;
    if (auth_.accepts(req.get_header_value("Authorization"))) return true;
    res.set_header("WWW-Authenticate", "Bearer");
    send_error(res, ApiError(401, "Unauthorized: a valid API key is required "
                                  "(header `Authorization: Bearer <key>`)."));
    return false;
  });
  add_routes();
}

OpenAiServer::~OpenAiServer() {
  begin_shutdown();
  {
    // serve() may never have run.
    std::lock_guard lock(shutdown_mutex_);
    serve_returned_ = true;
  }
  shutdown_done_.notify_all();
  if (shutdown_watchdog_.joinable()) shutdown_watchdog_.join();
}

void OpenAiServer::add_routes() {
  auto bind = [this](auto method) {
    return [this, method](const httplib::Request& req, httplib::Response& res) { (this->*method)(req, res); };
  };
  http_.route("GET", "/health", bind(&OpenAiServer::handle_health));
  http_.route("GET", "/ping", bind(&OpenAiServer::handle_health));
  http_.route("GET", "/v1/models", bind(&OpenAiServer::handle_models));
  http_.route("GET", "/metrics", bind(&OpenAiServer::handle_metrics));
  http_.route("GET", "/debug/engine", bind(&OpenAiServer::handle_debug_engine));
  http_.route("GET", "/version", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, {{"version", "0.1.0"}});
  });
  http_.route("POST", "/v1/chat/completions", bind(&OpenAiServer::handle_chat));
  http_.route("POST", "/v1/completions", bind(&OpenAiServer::handle_completions));
  http_.route("POST", "/tokenize", bind(&OpenAiServer::handle_tokenize));
  http_.route("POST", "/detokenize", bind(&OpenAiServer::handle_detokenize));
}

void OpenAiServer::set_ready(ModelServices services) {
  MOESERVE_CHECK(services.tokenizer && services.engine, "set_ready needs a tokenizer and an engine");
  services_ = std::move(services);
  logprob_formatter_.emplace(*services_.tokenizer);
  if (config_.limits.vocab_size <= 0) config_.limits.vocab_size = services_.tokenizer->vocab_size();
  structured_ = std::make_unique<StructuredOutputs>(
      *services_.tokenizer, config_.limits.vocab_size,
      config_.structured_outputs.disable_any_whitespace ? uint8_t(0) : structured::kMaxWhitespace);
  ready_ = true;
  metrics_.set_ready(true);
}

const ModelServices& OpenAiServer::services() const {
  if (draining_) throw ApiError(503, "The server is shutting down.");
  if (!ready_) throw ApiError(503, "The model is still loading; retry when GET /health answers 200.");
  return services_;
}

void OpenAiServer::serve() {
  http_.serve();
  {
    std::lock_guard lock(shutdown_mutex_);
    serve_returned_ = true;
  }
  shutdown_done_.notify_all();
}

void OpenAiServer::begin_shutdown() {
  if (draining_.exchange(true)) return;
  log::info("shutting down: no new connections; {} request(s) still running", sessions_.size());
  http_.stop();
  // Running requests finish; whatever is left after the timeout is aborted (the streams
  // then end with finish_reason "abort").
  shutdown_watchdog_ = std::thread([this] {
    std::unique_lock lock(shutdown_mutex_);
    if (!shutdown_done_.wait_for(lock, config_.shutdown_timeout, [&] { return serve_returned_; })) {
      log::warn("shutdown timeout ({} s): aborting {} running request(s)",
                config_.shutdown_timeout.count(), sessions_.size());
      sessions_.cancel_all();
    }
  });
}

json OpenAiServer::parse_body(const httplib::Request& req) const {
  if (auto bad = find_invalid_utf8(req.body))
    throw ApiError(400, fmt::format("The request body is not valid UTF-8 (byte {}).", *bad));
  if (req.body.empty()) throw ApiError(400, "The request body is empty; expected a JSON object.");
  json body;
  try {
    body = json::parse(req.body, [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth)
        throw ApiError(400, fmt::format("The request body nests JSON deeper than {} levels.", kMaxJsonDepth));
      return true;
    });
  } catch (const json::parse_error& e) {
    throw ApiError(400, fmt::format("The request body is not valid JSON: {}", e.what()));
  }
  if (!body.is_object())
    throw ApiError(400, fmt::format("The request body must be a JSON object, got {}.", json_type_name(body)));
  return body;
}

void OpenAiServer::handle_health(const httplib::Request&, httplib::Response& res) const {
  if (draining_) {
    send_error(res, ApiError(503, "The server is shutting down."));
  } else if (!ready_) {
    send_error(res, ApiError(503, "The model is still loading."));
  } else {
    res.status = 200;
    res.set_content("", "text/plain");
  }
}

void OpenAiServer::handle_models(const httplib::Request&, httplib::Response& res) const {
  json data = json::array();
  const int64_t created = int64_t(std::time(nullptr));
  for (const auto& name : config_.served_model_names)
    data.push_back({{"id", name},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "moeserve"},
                    {"root", config_.model_root},
                    {"parent", nullptr},
                    {"max_model_len", config_.limits.max_model_len}});
  send_json(res, {{"object", "list"}, {"data", std::move(data)}});
}

void OpenAiServer::handle_metrics(const httplib::Request&, httplib::Response& res) const {
  EngineSnapshot snapshot;
  if (ready_) snapshot = services_.engine->snapshot();
  res.status = 200;
  res.set_content(metrics_.render(snapshot, int(sessions_.active())),
                  "text/plain; version=0.0.4; charset=utf-8");
}

void OpenAiServer::handle_debug_engine(const httplib::Request&, httplib::Response& res) const {
  if (!ready_) throw ApiError(503, "The model is still loading.");
  const auto s = services_.engine->snapshot().stats;
  send_json(res, {{"running", s.running},
                  {"waiting", s.waiting},
                  {"kv_usage", s.kv_usage},
                  {"free_kv_blocks", s.free_kv_blocks},
                  {"total_kv_blocks", s.total_kv_blocks},
                  {"free_state_slots", s.free_state_slots},
                  {"total_state_slots", s.total_state_slots},
                  {"kv_block_size", s.kv_block_size},
                  {"num_preemptions", s.num_preemptions},
                  {"num_steps", s.num_steps},
                  {"prompt_tokens_total", s.prompt_tokens_total},
                  {"generation_tokens_total", s.generation_tokens_total},
                  {"requests_finished_total", s.requests_finished_total},
                  {"http_requests_in_flight", sessions_.active()}});
}

std::shared_ptr<GenerationSession> OpenAiServer::new_session(GenerationSession::Clock::time_point arrival) {
  return std::make_shared<GenerationSession>(*services_.engine, *services_.tokenizer, metrics_,
                                             sessions_, arrival);
}

}  // namespace moeserve::server
