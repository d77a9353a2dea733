#include "server/http_server.h"

#include <sys/socket.h>

#include <algorithm>

#include <fmt/format.h>

#include "core/log.h"
#include "server/sse.h"

namespace moeserve::server {

void send_json(httplib::Response& res, const nlohmann::json& body, int status) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& error) {
  send_json(res, error.to_json(), error.status());
}

HttpServer::HttpServer(HttpServerOptions options) : options_(std::move(options)) {
  const int threads = std::max(options_.threads, 9);
  server_.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  server_.set_tcp_nodelay(true);
  server_.set_payload_max_length(options_.max_request_body_bytes);
  server_.set_keep_alive_timeout(options_.keep_alive_timeout_s);
  server_.set_read_timeout(options_.read_timeout_s, 0);
  server_.set_write_timeout(options_.write_timeout_s, 0);
  // Replaces the library's default socket options (SO_REUSEADDR), and remembers the
  // listening socket so that bind() can raise its backlog.
  server_.set_socket_options([this](socket_t fd) {
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = int(fd);
  });
  server_.set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) { return pre_route(req, res); });
  // Called for every response with status >= 400; fills in a body only where the library
  // produced the error itself (413 oversized body, 400 unparsable request, ...).
  server_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.content_length_ > 0 || res.is_chunked_content_provider_) return;
    std::string message;
    switch (res.status) {
      case 413: message = "Request body is too large (see --max-request-body-bytes)."; break;
      case 404: message = fmt::format("Route {} {} not found.", req.method, req.path); break;
      case 414: message = "Request URI is too long."; break;
      case 431: message = "Request headers are too large."; break;
      default: message = fmt::format("Malformed HTTP request (status {}).", res.status);
    }
    send_error(res, ApiError(res.status, message));
  });
  server_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    log::error("unhandled exception in an HTTP handler: {}", what);
    send_error(res, ApiError(500, "Internal server error: " + what));
  });
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::route(const std::string& method, const std::string& path, Handler handler) {
  methods_by_path_[path].push_back(method);
  auto wrapped = [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    try {
      handler(req, res);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      log::error("{} {} failed: {}", req.method, req.path, e.what());
      send_error(res, ApiError(500, std::string("Internal server error: ") + e.what()));
    }
  };
  // httplib matches patterns as regular expressions: escape the path.
  std::string pattern;
  for (char c : path) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) pattern += '\\';
    pattern += c;
  }
  if (method == "GET") server_.Get(pattern, wrapped);
  else if (method == "POST") server_.Post(pattern, wrapped);
  else fail("HttpServer::route: unsupported method {}", method);
}

httplib::Server::HandlerResponse HttpServer::pre_route(const httplib::Request& req,
                                                       httplib::Response& res) {
  using R = httplib::Server::HandlerResponse;
  auto it = methods_by_path_.find(req.path);
  if (it == methods_by_path_.end()) {
    send_error(res, ApiError(404, fmt::format("Route {} {} not found.", req.method, req.path)));
    return R::Handled;
  }
  const auto& methods = it->second;
  const std::string method = req.method == "HEAD" ? "GET" : req.method;
  if (std::find(methods.begin(), methods.end(), method) == methods.end()) {
    std::string allow;
    for (const auto& m : methods) allow += (allow.empty() ? "" : ", ") + m;
    res.set_header("Allow", allow);
    send_error(res, ApiError(405, fmt::format("Method {} is not allowed on {} (allowed: {}).",
                                              req.method, req.path, allow)));
    return R::Handled;
  }
  if (guard_ && !guard_(req, res)) return R::Handled;
  return R::Unhandled;
}

int HttpServer::bind() {
  port_ = options_.port == 0 ? server_.bind_to_any_port(options_.host)
                             : (server_.bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port_ < 0)
    fail("cannot listen on {}:{} (address in use, or not an address of this host)", options_.host,
         options_.port);
  // cpp-httplib listens with a backlog of 5: a burst of connections then loses SYNs and
  // waits for retransmits (about 1 s). Listening again on the bound socket raises it.
  if (listen_fd_ >= 0 && ::listen(listen_fd_, options_.listen_backlog) != 0)
    log::warn("could not raise the listen backlog to {}", options_.listen_backlog);
  return port_;
}

void HttpServer::serve() {
  if (!stop_requested_) server_.listen_after_bind();
}

void HttpServer::stop() {
  stop_requested_ = true;
  // Shutting the listening socket down ends cpp-httplib's accept loop (accept() fails), and
  // listen_after_bind() then waits for its workers. Server::stop() is not used: it also
  // marks the server as shutting down, which makes every content provider that has not
  // started yet give up, so a request whose handler already ran would lose its response.
  const int fd = listen_fd_.exchange(-1);
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

}  // namespace moeserve::server
