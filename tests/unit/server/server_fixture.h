// An in-process OpenAI server for tests: the real HTTP layer, request parsing, decoders and
// response builders, a small Qwen-layout tokenizer (synthetic_tokenizer.h; one test also uses
// the real Qwen3 tokenizer from third_party/tokenizers/qwen3), a small ChatML renderer, and a
// FakeEngine whose script answers "say:TEXT" in the prompt with the tokens of TEXT followed by
// <|im_end|>.
#pragma once
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "fake_engine.h"
#include "synthetic_tokenizer.h"
#include "server/openai_server.h"
#include "text/tokenizer.h"

namespace moeserve::server::testing {

inline const text::Tokenizer* test_tokenizer() {
  static const text::Tokenizer tokenizer = make_synthetic_tokenizer();
  return &tokenizer;
}

// The real Qwen3 tokenizer (slow to load: a few seconds), or null if it is not installed.
inline const text::Tokenizer* qwen3_tokenizer() {
  static std::unique_ptr<text::Tokenizer> tokenizer = [] {
    const std::filesystem::path dir = std::filesystem::path(MOESERVE_SOURCE_DIR) / "third_party/tokenizers/qwen3";
    if (!std::filesystem::exists(dir / "tokenizer.json")) return std::unique_ptr<text::Tokenizer>();
    return std::make_unique<text::Tokenizer>(text::Tokenizer::load(dir));
  }();
  return tokenizer.get();
}

// ChatML as the Qwen3.5 template writes it (spec qwen35_arch.md section 5), enough for the
// server's plumbing: turns, a tools system block that teaches the XML call syntax, and the
// thinking generation prompt. A user message "RAISE" makes it fail like raise_exception.
inline std::string render_chatml(const ChatPromptRequest& r) {
  std::string out;
  if (r.tools.is_array() && !r.tools.empty())
    out += "<|im_start|>system\n# Tools\n" + r.tools.dump() +
           "\nCall tools as <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call><|im_end|>\n";
  for (const auto& m : r.messages) {
    const std::string content = m["content"].is_string() ? m["content"].get<std::string>() : "";
    if (content == "RAISE") fail("Unexpected message role.");
    out += "<|im_start|>" + m["role"].get<std::string>() + "\n" + content;
    if (!r.continue_final_message || &m != &r.messages.back()) out += "<|im_end|>\n";
  }
  if (r.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    const bool thinking = !(r.kwargs.contains("enable_thinking") && r.kwargs["enable_thinking"] == false);
    out += thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
  }
  return out;
}

// The script: the text after the last "say:" in the prompt, up to the end of that turn.
// A prompt that ends in a forced "<function=NAME>\n" continues with a city parameter.
inline FakeEngine::Script say_script(const text::Tokenizer& tok) {
  const int32_t im_end = *tok.token_to_id("<|im_end|>");
  return [&tok, im_end](const std::vector<int32_t>& prompt, const runtime::SamplingParams&) {
    const std::string text = tok.decode(prompt);
    std::string answer;
    if (text.size() > 8 && text.ends_with(">\n") && text.rfind("<function=") != std::string::npos &&
        text.rfind("<function=") > text.rfind("<|im_start|>")) {
      answer = "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>";
    } else {
      const size_t at = text.rfind("say:");
      if (at != std::string::npos) {
        answer = text.substr(at + 4);
        const size_t end = answer.find("<|im_end|>");
        if (end != std::string::npos) answer.resize(end);
      } else {
        answer = "I have nothing to say.";
      }
    }
    std::vector<int32_t> ids = tok.encode(answer);
    if (answer.find("FOREVER") == std::string::npos) ids.push_back(im_end);
    return ids;
  };
}

struct SseEvents {
  std::vector<nlohmann::json> chunks;
  bool done = false;  // saw data: [DONE]
};

// Splits an SSE body into its JSON events.
inline SseEvents parse_sse(const std::string& body) {
  SseEvents ev;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string event = body.substr(pos, end - pos);
    pos = end + 2;
    if (event.rfind("data: ", 0) != 0) continue;
    event = event.substr(6);
    if (event == "[DONE]") ev.done = true;
    else ev.chunks.push_back(nlohmann::json::parse(event));
  }
  return ev;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override { tokenizer_ = test_tokenizer(); }
  void TearDown() override { stop(); }

  static ServerConfig default_config() {
    ServerConfig c;
    c.served_model_names = {"test-model", "alias"};
    c.model_root = "/models/test";
    c.reasoning_parser = "qwen3";
    c.tool_call_parser = "qwen3_coder";
    c.enable_auto_tool_choice = true;
    c.limits.max_model_len = 4096;
    c.limits.max_n = 4;
    c.limits.max_choices = 16;
    c.disconnect_poll = std::chrono::milliseconds(20);
    c.shutdown_timeout = std::chrono::seconds(5);
    return c;
  }

  // Starts the server (and the fake engine) on a free port.
  void start(ServerConfig config = default_config(), bool ready = true, HttpServerOptions http = {}) {
    http.host = "127.0.0.1";
    http.port = 0;
    http.threads = 32;
    if (http.max_request_body_bytes == (32u << 20)) http.max_request_body_bytes = 1 << 20;
    engine_ = std::make_unique<FakeEngine>(say_script(*tokenizer_), std::set<int32_t>{im_end(), end_of_text()});
    server_ = std::make_unique<OpenAiServer>(std::move(config), http);
    port_ = server_->bind();
    if (ready) make_ready();
    thread_ = std::thread([this] { server_->serve(); });
  }

  void make_ready() {
    ModelServices s;
    s.tokenizer = tokenizer_;
    s.render_chat = render_chatml;
    s.engine = engine_.get();
    s.eos_token_ids = {im_end(), end_of_text()};
    server_->set_ready(std::move(s));
  }

  void stop() {
    if (server_) server_->begin_shutdown();
    if (thread_.joinable()) thread_.join();
    server_.reset();
    engine_.reset();
  }

  httplib::Client client(int timeout_s = 10) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(timeout_s, 0);
    c.set_connection_timeout(2, 0);
    return c;
  }

  // POSTs JSON; returns status and parsed body (null when the body is not JSON).
  std::pair<int, nlohmann::json> post(const std::string& path, const nlohmann::json& body,
                                      const httplib::Headers& headers = {}) const {
    auto c = client();
    auto r = c.Post(path.c_str(), headers, body.dump(), "application/json");
    if (!r) return {-1, nullptr};
    return {r->status, nlohmann::json::parse(r->body, nullptr, false)};
  }

  // POSTs with stream: true and returns the SSE events.
  std::pair<int, SseEvents> post_stream(const std::string& path, const nlohmann::json& body) const {
    auto c = client();
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {-1, {}};
    return {r->status, parse_sse(r->body)};
  }

  int32_t im_end() const { return *tokenizer_->token_to_id("<|im_end|>"); }
  int32_t end_of_text() const { return *tokenizer_->token_to_id("<|endoftext|>"); }
  int token_count(const std::string& text) const { return int(tokenizer_->encode(text).size()); }
  std::string rendered(const nlohmann::json& messages, bool thinking = true) const {
    nlohmann::json tools, kwargs = nlohmann::json::object();
    if (!thinking) kwargs["enable_thinking"] = false;
    return render_chatml(ChatPromptRequest{messages, tools, true, false, kwargs});
  }

  // Waits until the fake engine holds no request (every cancel or finish processed).
  bool engine_drains(std::chrono::milliseconds within = std::chrono::milliseconds(3000)) const {
    const auto deadline = std::chrono::steady_clock::now() + within;
    while (std::chrono::steady_clock::now() < deadline) {
      if (engine_->live_requests() == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  const text::Tokenizer* tokenizer_ = nullptr;
  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<OpenAiServer> server_;
  std::thread thread_;
  int port_ = 0;
};

// The same server with the real Qwen3 tokenizer, for checks against Hugging Face's ids.
class Qwen3ServerTest : public ServerTest {
 protected:
  void SetUp() override {
    tokenizer_ = qwen3_tokenizer();
    if (!tokenizer_) GTEST_SKIP() << "third_party/tokenizers/qwen3 missing: run scripts/install-deps.sh";
  }
};

inline nlohmann::json user(const std::string& content) {
  return nlohmann::json::array({{{"role", "user"}, {"content", content}}});
}

}  // namespace moeserve::server::testing
