// The streaming client against a scripted server: timings within tolerance of the scripted
// delays, usage parsing, request bodies, and every way a request can fail.
#include <gtest/gtest.h>

#include "core/error.h"
#include "fake_openai_server.h"
#include "tools/bench_client.h"
#include "tools/bench_load.h"

using namespace moeserve::tools;
using namespace moeserve::tools::testing;
using json = nlohmann::json;

namespace {

// Scheduling on a loaded 2-core CI machine delays events; they never arrive early.
constexpr double kEarly = 0.005, kLate = 0.060;

ClientOptions options_for(const FakeOpenAiServer& s) {
  ClientOptions o;
  o.base = parse_base_url(s.base_url());
  o.api_key = "secret";
  o.timeout_s = 10;
  return o;
}

SamplingSettings chat_settings() {
  SamplingSettings s;
  s.model = "fake-model";
  s.endpoint = ApiEndpoint::Chat;
  return s;
}

GenerationRequest prompt(const std::string& text, int64_t max_tokens = 8) {
  GenerationRequest r;
  r.prompt = text;
  r.max_tokens = max_tokens;
  r.planned_prompt_tokens = 3;
  return r;
}

// First output after 150 ms, then three more 80 ms apart; the usage chunk right after the
// last output; events deliberately split across writes.
Script timed_stream() {
  Script s;
  const std::string c0 = chat_chunk("Hel"), c1 = chat_chunk("lo"), c2 = chat_chunk(" wor"), c3 = chat_chunk("ld");
  s.stream = {
      {0, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"},  // role only: not output
      {150, c0.substr(0, 10)},
      {0, c0.substr(10)},
      {80, c1},
      {80, c2.substr(0, c2.size() - 1)},  // split between the two newlines
      {0, "\n"},
      {80, c3 + usage_chunk(7, 4)},
      {0, done_event()},
  };
  return s;
}

}  // namespace

TEST(BenchClient, ParsesBaseUrls) {
  auto b = parse_base_url("http://127.0.0.1:8000");
  EXPECT_EQ(b.scheme_host_port, "http://127.0.0.1:8000");
  EXPECT_EQ(b.path_prefix, "");
  b = parse_base_url("https://host.example/v1/");
  EXPECT_EQ(b.scheme_host_port, "https://host.example");
  EXPECT_EQ(b.path_prefix, "");
  b = parse_base_url("http://h:1/proxy/v1");
  EXPECT_EQ(b.path_prefix, "/proxy");
  EXPECT_THROW(parse_base_url("127.0.0.1:8000"), moeserve::Error);
  EXPECT_THROW(parse_base_url("ftp://h"), moeserve::Error);
  EXPECT_THROW(parse_base_url("http://"), moeserve::Error);
}

TEST(BenchClient, RequestBodies) {
  GenerationRequest r = prompt("hi", 5);
  SamplingSettings s = chat_settings();
  s.ignore_eos = true;
  s.extra_body = {{"top_k", 1}, {"temperature", 0.5}};
  json b = build_request_body(r, s, true);
  EXPECT_EQ(b["model"], "fake-model");
  EXPECT_EQ(b["messages"], json::parse(R"([{"role":"user","content":"hi"}])"));
  EXPECT_EQ(b["max_tokens"], 5);
  EXPECT_EQ(b["temperature"], 0.5);  // --extra-body wins
  EXPECT_EQ(b["ignore_eos"], true);
  EXPECT_EQ(b["stream"], true);
  EXPECT_EQ(b["stream_options"]["include_usage"], true);
  EXPECT_EQ(b["top_k"], 1);

  s = chat_settings();
  s.endpoint = ApiEndpoint::Completions;
  r.prompt_token_ids = {11, 12, 13};
  b = build_request_body(r, s, false);
  EXPECT_EQ(b["prompt"], json::parse("[11,12,13]"));
  EXPECT_FALSE(b.contains("stream"));
  EXPECT_FALSE(b.contains("messages"));
  EXPECT_FALSE(b.contains("ignore_eos"));
}

TEST(BenchClient, FirstModelId) {
  FakeOpenAiServer server([](const json&) { return Script{}; });
  BenchClient c(options_for(server));
  EXPECT_EQ(c.first_model_id(), "fake-model");
}

TEST(BenchClient, StreamTimingsMatchTheScript) {
  FakeOpenAiServer server([](const json&) { return timed_stream(); });
  BenchClient c(options_for(server));
  const auto start = std::chrono::steady_clock::now();
  RequestRecord r = c.stream_generation(prompt("hello"), chat_settings(), start);
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_EQ(r.http_status, 200);
  EXPECT_EQ(r.generated_text, "Hello world");
  EXPECT_EQ(r.output_chunks, 4);
  EXPECT_EQ(r.output_tokens, 4);
  EXPECT_EQ(r.prompt_tokens, 7);  // the server's count replaces the planned 3
  EXPECT_GE(r.start_time, 0.0);
  EXPECT_GT(r.ttft, 0.150 - kEarly);
  EXPECT_LT(r.ttft, 0.150 + kLate);
  ASSERT_EQ(r.itl.size(), 3u);
  for (double gap : r.itl) {
    EXPECT_GT(gap, 0.080 - kEarly);
    EXPECT_LT(gap, 0.080 + kLate);
  }
  // E2EL ends at the usage chunk, written together with the last output chunk: the
  // timeline adds up (delays accumulate on a loaded machine, so check the sum, not 390 ms).
  double sum_itl = 0;
  for (double gap : r.itl) sum_itl += gap;
  EXPECT_GE(r.latency, r.ttft + sum_itl - 1e-9);
  EXPECT_LT(r.latency, r.ttft + sum_itl + kLate);
  // TPOT is (E2EL - TTFT) / (completion_tokens - 1) exactly, here about the 80 ms cadence.
  auto m = compute_metrics({r}, 1.0, {99});
  EXPECT_NEAR(m.tpot.mean_ms, (r.latency - r.ttft) / 3 * 1000, 1e-9);
  EXPECT_NEAR(m.tpot.mean_ms, m.itl.mean_ms, kLate / 3 * 1000);
  EXPECT_GT(m.itl.mean_ms, 80.0 - kEarly * 1000);

  ASSERT_EQ(server.bodies().size(), 1u);
  EXPECT_EQ(server.bodies()[0]["stream"], true);
  EXPECT_EQ(server.paths()[0], "/v1/chat/completions");
  EXPECT_EQ(server.auth_headers()[0], "Bearer secret");
}

TEST(BenchClient, CompletionsStreamAndMissingUsage) {
  FakeOpenAiServer server([](const json&) {
    Script s;
    s.stream = {{0, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"},
                {20, "data: {\"choices\":[{\"text\":\"\"}]}\n\n"},  // empty text: not an output chunk
                {20, "data: {\"choices\":[{\"text\":\"b\"}]}\n\n"},
                {0, done_event()}};
    return s;
  });
  BenchClient c(options_for(server));
  SamplingSettings s = chat_settings();
  s.endpoint = ApiEndpoint::Completions;
  RequestRecord r = c.stream_generation(prompt("x"), s, std::chrono::steady_clock::now());
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_EQ(server.paths()[0], "/v1/completions");
  EXPECT_EQ(r.generated_text, "ab");
  EXPECT_EQ(r.output_chunks, 2);
  EXPECT_EQ(r.output_tokens, 0);
  EXPECT_EQ(effective_output_tokens(r), 2);
  EXPECT_EQ(r.prompt_tokens, 3);  // planned length: no usage came
  ASSERT_EQ(r.itl.size(), 1u);
  EXPECT_GT(r.itl[0], 0.040 - kEarly);
}

TEST(BenchClient, ReasoningAndToolCallDeltasAreOutput) {
  FakeOpenAiServer server([](const json&) {
    Script s;
    s.stream = {{0, "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"think\"}}]}\n\n"},
                {0, "data: {\"choices\":[{\"delta\":{\"reasoning\":\"more\"}}]}\n\n"},
                {0, "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}\n\n"},
                {0, "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"},
                {0, done_event()}};
    return s;
  });
  BenchClient c(options_for(server));
  RequestRecord r = c.stream_generation(prompt("x"), chat_settings(), std::chrono::steady_clock::now());
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_EQ(r.output_chunks, 3);
  EXPECT_EQ(r.generated_text, "thinkmore");
}

TEST(BenchClient, FailuresAreRecordedNotThrown) {
  FakeOpenAiServer server([](const json& body) {
    Script s;
    const std::string p = body["messages"][0]["content"];
    if (p == "http-error") {
      s.status = 400;
      s.json_body = R"({"error":{"message":"max_tokens is too large","type":"invalid_request_error"}})";
    } else if (p == "error-event") {
      s.stream = {{0, chat_chunk("a")}, {0, "data: {\"error\":{\"message\":\"engine died\"}}\n\n"}};
    } else if (p == "bad-json") {
      s.stream = {{0, "data: {not json\n\n"}};
    } else if (p == "no-output") {
      s.stream = {{0, usage_chunk(3, 0)}, {0, done_event()}};
    } else {
      s.stream = {{0, chat_chunk("fine")}, {0, done_event()}};
    }
    return s;
  });
  BenchClient c(options_for(server));
  auto run = [&](const std::string& p) {
    return c.stream_generation(prompt(p), chat_settings(), std::chrono::steady_clock::now());
  };
  RequestRecord r = run("http-error");
  EXPECT_FALSE(r.success);
  EXPECT_EQ(r.http_status, 400);
  EXPECT_EQ(r.error, "HTTP 400: max_tokens is too large");
  r = run("error-event");
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.error.find("engine died"), std::string::npos) << r.error;
  r = run("bad-json");
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.error.find("not a JSON object"), std::string::npos) << r.error;
  r = run("no-output");
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.error.find("no output"), std::string::npos) << r.error;
  r = run("ok");  // the connection is still usable
  EXPECT_TRUE(r.success) << r.error;
}

TEST(BenchClient, UnreachableServer) {
  int port = 0;
  {
    FakeOpenAiServer server([](const json&) { return Script{}; });
    port = server.port();
  }  // closed: nothing listens on `port` any more
  ClientOptions o;
  o.base = parse_base_url("http://127.0.0.1:" + std::to_string(port));
  o.timeout_s = 2;
  BenchClient c(o);
  RequestRecord r = c.stream_generation(prompt("x"), chat_settings(), std::chrono::steady_clock::now());
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.error.find("request failed: could not connect"), std::string::npos) << r.error;
  EXPECT_THROW(c.first_model_id(), moeserve::Error);
}

TEST(BenchLoad, CountsSuccessesAndFailuresAndRespectsConcurrency) {
  FakeOpenAiServer server([](const json& body) {
    Script s;
    const std::string p = body["messages"][0]["content"];
    if (p.rfind("fail", 0) == 0) {
      s.status = 503;
      s.json_body = R"({"error":{"message":"overloaded"}})";
      return s;
    }
    s.stream = {{100, chat_chunk("x")}, {0, chat_chunk("y") + usage_chunk(5, 2)}, {0, done_event()}};
    return s;
  });
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(prompt(i % 3 == 2 ? "fail" : "ok"));
  const std::vector<double> arrivals(reqs.size(), 0.0);
  auto run = run_load(options_for(server), chat_settings(), reqs, arrivals, 2, nullptr);
  const auto m = compute_metrics(run.records, run.duration_s, {99});
  EXPECT_EQ(m.completed, 4);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(run.records[2].error, "HTTP 503: overloaded");
  EXPECT_EQ(m.total_output, 8);
  EXPECT_EQ(m.total_input, 20);
  EXPECT_LE(m.max_concurrent_requests, 2);
  // 4 successful 100 ms requests, two at a time: at least 200 ms.
  EXPECT_GT(run.duration_s, 0.2 - kEarly);
  EXPECT_EQ(server.bodies().size(), 6u);
}

TEST(BenchLoad, RequestsWaitForTheirArrivalTime) {
  FakeOpenAiServer server([](const json&) {
    Script s;
    s.stream = {{0, chat_chunk("x")}, {0, done_event()}};
    return s;
  });
  std::vector<GenerationRequest> reqs(3, prompt("p"));
  const std::vector<double> arrivals = {0.0, 0.1, 0.25};
  auto run = run_load(options_for(server), chat_settings(), reqs, arrivals, 3, nullptr);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(run.records[i].success) << run.records[i].error;
    EXPECT_GE(run.records[i].start_time, arrivals[i]);
    EXPECT_LT(run.records[i].start_time, arrivals[i] + 0.1);  // sent when due, not later
  }
  EXPECT_GT(run.duration_s, 0.25);
}
