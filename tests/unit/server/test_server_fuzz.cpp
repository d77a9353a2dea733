// Nothing a client sends crashes the server: random bytes on the socket, and valid requests
// with random fields replaced by random JSON values. Every response must be a well-formed
// success or an OpenAI error, and afterwards the server is healthy with no request leaked.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>

#include "server_fixture.h"

using namespace moeserve::server;
using namespace moeserve::server::testing;
using nlohmann::json;

namespace {

// Sends raw bytes on a fresh connection, reads until the server closes or 200 ms pass.
std::string raw_exchange(int port, const std::string& bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    ::shutdown(fd, SHUT_WR);
    timeval tv{0, 200 * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) reply.append(buf, size_t(n));
  }
  ::close(fd);
  return reply;
}

json random_value(std::mt19937& rng, int depth = 0) {
  switch (rng() % (depth > 2 ? 7 : 9)) {
    case 0: return nullptr;
    case 1: return bool(rng() % 2);
    case 2: return int64_t(rng() % 3 == 0 ? -int64_t(rng() % 1000) : int64_t(rng() % 100000));
    case 3: return std::uniform_real_distribution<double>(-1e6, 1e6)(rng);
    case 4: return std::vector<std::string>{"", "x", "stop", "\xF0\x9F\x98\x80", "say:hi", "auto", "none",
                                            "required", "user", "function"}[rng() % 10];
    case 5: return (rng() % 2) ? 1e300 : -1e300;
    case 6: return uint64_t(18446744073709551615ull);
    case 7: {
      json a = json::array();
      for (int i = int(rng() % 4); i > 0; --i) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      for (int i = int(rng() % 4); i > 0; --i)
        o[std::vector<std::string>{"role", "content", "type", "name", "function", "text"}[rng() % 6]] =
            random_value(rng, depth + 1);
      return o;
    }
  }
}

// Replaces or deletes a random field at a random depth.
void mutate(json& j, std::mt19937& rng) {
  json* node = &j;
  for (int depth = 0; depth < 4; ++depth) {
    if (node->is_object() && !node->empty() && rng() % 2) {
      auto it = node->begin();
      std::advance(it, rng() % node->size());
      node = &it.value();
    } else if (node->is_array() && !node->empty() && rng() % 2) {
      node = &(*node)[rng() % node->size()];
    } else {
      break;
    }
  }
  if (node->is_object() && !node->empty() && rng() % 3 == 0) {
    auto it = node->begin();
    std::advance(it, rng() % node->size());
    node->erase(it);
  } else {
    *node = random_value(rng);
  }
}

void check_response(int status, const std::string& body, bool stream) {
  ASSERT_TRUE(status == 200 || status == 400 || status == 404 || status == 413) << status << " " << body;
  if (status != 200) {
    const json j = json::parse(body);
    EXPECT_EQ(j["error"]["code"], status);
    EXPECT_TRUE(j["error"]["message"].is_string());
  } else if (stream && body.rfind("data: ", 0) == 0) {
    const SseEvents ev = parse_sse(body);
    EXPECT_TRUE(ev.done) << body;
  } else {
    EXPECT_FALSE(json::parse(body, nullptr, /*allow_exceptions=*/false).is_discarded()) << body;
  }
}

}  // namespace

TEST_F(ServerTest, FuzzRawBytes) {
  start();
  std::mt19937 rng(1234);
  const std::vector<std::string> heads = {
      "", "POST /v1/chat/completions HTTP/1.1\r\n", "GET /health HTTP/1.1\r\nHost: x\r\n",
      "POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
      "GET /" + std::string(10000, 'a') + " HTTP/1.1\r\n\r\n", "\r\n\r\n", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"};
  for (int i = 0; i < 120; ++i) {
    std::string bytes = heads[rng() % heads.size()];
    const size_t n = rng() % 600;
    for (size_t k = 0; k < n; ++k) bytes += char(rng() % 256);
    const std::string reply = raw_exchange(port_, bytes);
    if (!reply.empty()) EXPECT_EQ(reply.rfind("HTTP/1.1 ", 0), 0u) << reply.substr(0, 100);
  }
  auto r = client().Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(ServerTest, FuzzMutatedRequests) {
  start();
  const json tools = json::array({{{"type", "function"},
                                   {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}}});
  const std::vector<std::pair<std::string, json>> seeds = {
      {"/v1/chat/completions", {{"messages", user("say:hello")}, {"max_tokens", 5}, {"temperature", 0.5},
                                {"stop", {"x"}}, {"logprobs", true}, {"top_logprobs", 1}, {"n", 2}}},
      {"/v1/chat/completions", {{"messages", user("say:hi")}, {"tools", tools}, {"stream", true},
                                {"stream_options", {{"include_usage", true}}}, {"max_tokens", 4}}},
      {"/v1/completions", {{"prompt", "say: yes"}, {"max_tokens", 3}, {"echo", true}, {"logprobs", 2},
                           {"logit_bias", {{"11", 1}}}}},
      {"/v1/completions", {{"prompt", {{1, 2, 3}, {4, 5}}}, {"max_tokens", 2}, {"stream", true}, {"seed", 3}}},
      {"/tokenize", {{"prompt", "hello"}, {"return_token_strs", true}}},
      {"/detokenize", {{"tokens", {1, 2, 3}}}},
  };
  std::mt19937 rng(99);
  for (int i = 0; i < 400; ++i) {
    const auto& [path, seed] = seeds[size_t(i) % seeds.size()];
    json body = seed;
    for (int m = int(rng() % 3) + 1; m > 0; --m) mutate(body, rng);
    // Keep outputs short whatever the mutation did to max_tokens.
    if (body.is_object() && path.find("completions") != std::string::npos) body["max_tokens"] = 4;
    auto c = client();
    auto r = c.Post(path.c_str(), body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    ASSERT_TRUE(r) << path << " " << body.dump();
    SCOPED_TRACE(path + " " + body.dump());
    const bool stream = body.is_object() && body.contains("stream") && body["stream"] == true;
    check_response(r->status, r->body, stream);
  }
  EXPECT_TRUE(engine_drains());
  auto r = client().Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}
