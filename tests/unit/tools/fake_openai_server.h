// A scripted OpenAI-compatible server for the bench client tests: cpp-httplib on an ephemeral
// loopback port, answering /v1/models, and /v1/chat/completions + /v1/completions with
// whatever the test's handler decides (streamed SSE pieces with delays, or a JSON answer).
#pragma once
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::tools::testing {

// One piece of a streamed body: written after sleeping `delay_ms`.
struct Piece {
  int delay_ms = 0;
  std::string bytes;
};

// What the server does with one generation request.
struct Script {
  int status = 200;
  std::string json_body;          // non-streaming answer (or error body when status != 200)
  std::vector<Piece> stream;      // streamed answer (used when non-empty and status == 200)
  int delay_ms = 0;               // before answering a non-streaming request
};

class FakeOpenAiServer {
 public:
  using Handler = std::function<Script(const nlohmann::json& body)>;

  explicit FakeOpenAiServer(Handler handler) : handler_(std::move(handler)) {
    server_.new_task_queue = [] { return new httplib::ThreadPool(16); };
    server_.set_tcp_nodelay(true);
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})", "application/json");
    });
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mutex_);
      res.set_content(metrics_, "text/plain");
    });
    auto generate = [this](const httplib::Request& req, httplib::Response& res) {
      auto body = nlohmann::json::parse(req.body, nullptr, false);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        bodies_.push_back(body);
        paths_.push_back(req.path);
        auth_.push_back(req.get_header_value("Authorization"));
      }
      Script s = handler_(body);
      if (s.status != 200 || s.stream.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(s.delay_ms));
        res.status = s.status;
        res.set_content(s.json_body, "application/json");
        return;
      }
      auto pieces = std::make_shared<std::vector<Piece>>(std::move(s.stream));
      auto index = std::make_shared<size_t>(0);
      res.set_chunked_content_provider("text/event-stream", [pieces, index](size_t, httplib::DataSink& sink) {
        if (*index >= pieces->size()) {
          sink.done();
          return true;
        }
        const Piece& p = (*pieces)[(*index)++];
        std::this_thread::sleep_for(std::chrono::milliseconds(p.delay_ms));
        return sink.write(p.bytes.data(), p.bytes.size());
      });
    };
    server_.Post("/v1/chat/completions", generate);
    server_.Post("/v1/completions", generate);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeOpenAiServer() {
    server_.stop();
    thread_.join();
  }

  int port() const { return port_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void set_metrics(std::string text) {
    std::lock_guard<std::mutex> lock(mutex_);
    metrics_ = std::move(text);
  }
  std::vector<nlohmann::json> bodies() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return bodies_;
  }
  std::vector<std::string> paths() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return paths_;
  }
  std::vector<std::string> auth_headers() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return auth_;
  }

 private:
  Handler handler_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::vector<nlohmann::json> bodies_;
  std::vector<std::string> paths_, auth_;
  std::string metrics_;
};

// "data: <json>\n\n" for a chat chunk carrying `content`.
inline std::string chat_chunk(const std::string& content) {
  nlohmann::json j = {{"object", "chat.completion.chunk"},
                      {"choices", nlohmann::json::array({{{"index", 0}, {"delta", {{"content", content}}}}})}};
  return "data: " + j.dump() + "\n\n";
}
inline std::string usage_chunk(int prompt_tokens, int completion_tokens) {
  nlohmann::json j = {{"object", "chat.completion.chunk"},
                      {"choices", nlohmann::json::array()},
                      {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens}}}};
  return "data: " + j.dump() + "\n\n";
}
inline const char* done_event() { return "data: [DONE]\n\n"; }

}  // namespace moeserve::tools::testing
