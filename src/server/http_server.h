// The HTTP layer over cpp-httplib 0.11.4 (Debian), with its traps handled
// (../shared/spec/deps.md): TCP_NODELAY on; a worker pool sized by the caller (each open
// SSE stream and each keep-alive connection holds a worker); the listen backlog raised from
// the library's hard-coded 5 after binding. Routes are exact paths: an unknown path is a
// 404 and a known path with another method a 405 (with Allow), both as OpenAI error JSON;
// errors the library raises itself (oversized body 413, malformed HTTP 400) get the same
// JSON body.
#pragma once
#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <httplib.h>

#include "server/api_error.h"

namespace moeserve::server {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (tests)
  int threads = 64;
  size_t max_request_body_bytes = 32u << 20;
  int listen_backlog = 4096;
  int keep_alive_timeout_s = 5;
  int read_timeout_s = 30;
  int write_timeout_s = 30;
};

class HttpServer {
 public:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  // Runs before the route's handler (after the path and method matched); returns false
  // after filling `res` to reject the request (authentication).
  using Guard = std::function<bool(const httplib::Request&, httplib::Response&)>;

  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();

  // Exact path; method "GET" (HEAD is answered too) or "POST". Handlers may throw ApiError
  // (sent as its JSON and status); other exceptions become a 500.
  void route(const std::string& method, const std::string& path, Handler handler);
  void set_guard(Guard guard) { guard_ = std::move(guard); }

  // Binds and listens; returns the port. Throws moeserve::Error if the address is taken.
  int bind();
  // Serves until stop(); in-flight requests finish before it returns.
  void serve();
  // Stops accepting connections; requests in flight finish (thread-safe, idempotent).
  void stop();
  int port() const { return port_; }

 private:
  httplib::Server::HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res);

  HttpServerOptions options_;
  httplib::Server server_;
  std::map<std::string, std::vector<std::string>> methods_by_path_;
  Guard guard_;
  std::atomic<int> listen_fd_{-1};
  std::atomic<bool> stop_requested_{false};
  int port_ = 0;
};

// Sends an error as OpenAI JSON.
void send_error(httplib::Response& res, const ApiError& error);
// Sends a JSON body.
void send_json(httplib::Response& res, const nlohmann::json& body, int status = 200);

}  // namespace moeserve::server
