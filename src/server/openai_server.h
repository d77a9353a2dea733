// The OpenAI-compatible server: routes, readiness, graceful shutdown.
//
//   POST /v1/chat/completions, /v1/completions   generation (JSON or SSE)
//   GET  /v1/models                              the served model names
//   POST /tokenize, /detokenize                  vLLM's shapes
//   GET  /health                                 503 while loading, 200 once ready
//   GET  /metrics                                Prometheus text, vLLM's names
//   GET  /debug/engine                           engine stats as JSON (cache blocks, slots)
//   GET  /version
//
// Lifecycle: bind() listens at once, so that /health answers 503 while the model loads;
// set_ready() attaches the model and opens the generation endpoints; begin_shutdown()
// (SIGTERM/SIGINT) stops accepting connections and lets running requests finish; serve()
// returns when the last one has.
#pragma once
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "server/auth.h"
#include "server/http_server.h"
#include "server/generation_session.h"
#include "server/logprobs_json.h"
#include "server/response_json.h"
#include "server/server_config.h"
#include "server/server_metrics.h"
#include "server/structured_output.h"

namespace moeserve::server {

class OpenAiServer {
 public:
  OpenAiServer(ServerConfig config, HttpServerOptions http);
  ~OpenAiServer();

  int bind() { return http_.bind(); }
  void set_ready(ModelServices services);
  // Blocks until shutdown completes.
  void serve();
  // Thread-safe: stop accepting, let running requests finish (abort them after
  // config.shutdown_timeout).
  void begin_shutdown();
  bool ready() const { return ready_; }
  int port() const { return http_.port(); }
  const ServerConfig& config() const { return config_; }

 private:
  void add_routes();
  // Throws 503 while loading or shutting down.
  const ModelServices& services() const;
  nlohmann::json parse_body(const httplib::Request& req) const;

  void handle_health(const httplib::Request&, httplib::Response&) const;
  void handle_models(const httplib::Request&, httplib::Response&) const;
  void handle_metrics(const httplib::Request&, httplib::Response&) const;
  void handle_debug_engine(const httplib::Request&, httplib::Response&) const;
  void handle_chat(const httplib::Request&, httplib::Response&);
  void handle_completions(const httplib::Request&, httplib::Response&);
  void handle_tokenize(const httplib::Request&, httplib::Response&) const;
  void handle_detokenize(const httplib::Request&, httplib::Response&) const;

  std::shared_ptr<GenerationSession> new_session(GenerationSession::Clock::time_point arrival);
  // Chat and completions share this: JSON or SSE from a started session.
  void respond(httplib::Response& res, std::shared_ptr<GenerationSession> session,
               std::shared_ptr<ResponseBuilder> builder, const GenerationOptions& options);

  ServerConfig config_;
  HttpServer http_;
  ApiKeyAuth auth_;
  ServerMetrics metrics_;
  SessionRegistry sessions_;
  ModelServices services_;
  std::optional<LogprobFormatter> logprob_formatter_;
  std::unique_ptr<StructuredOutputs> structured_;  // response_format json_object / json_schema
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};

  std::mutex shutdown_mutex_;
  std::condition_variable shutdown_done_;
  bool serve_returned_ = false;
  std::thread shutdown_watchdog_;
};

}  // namespace moeserve::server
