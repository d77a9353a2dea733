// Completions through the real HTTP stack: prompts as text and token ids, echo, logprobs,
// max_tokens, streaming.
#include "server_fixture.h"

using namespace moeserve::server;
using namespace moeserve::server::testing;
using nlohmann::json;

TEST_F(ServerTest, CompletionTextPrompt) {
  start();
  auto [status, body] = post("/v1/completions", {{"prompt", "say: a quick test"}});
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_TRUE(body["id"].get<std::string>().starts_with("cmpl-"));
  EXPECT_EQ(body["model"], "test-model");
  const json& c = body["choices"][0];
  EXPECT_EQ(c["text"], " a quick test");
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["prompt_tokens"], token_count("say: a quick test"));
  EXPECT_EQ(body["usage"]["completion_tokens"], token_count(" a quick test") + 1);
  // OpenAI's default max_tokens for completions is 16.
  EXPECT_EQ(engine_->submitted_params().at(0).max_tokens, 16);
}

TEST_F(ServerTest, CompletionLengthAndStopToken) {
  start();
  auto [status, body] = post("/v1/completions", {{"prompt", "say: one two three four"}, {"max_tokens", 2}});
  ASSERT_EQ(status, 200);
  EXPECT_EQ(body["choices"][0]["text"], " one two");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["completion_tokens"], 2);
  // A stop token that is not eos is reported by id (vLLM's stop_reason).
  const int32_t three = tokenizer_->encode(" three").at(0);
  std::tie(status, body) = post("/v1/completions", {{"prompt", "say: one two three four"}, {"stop_token_ids", {three}}});
  ASSERT_EQ(status, 200);
  EXPECT_EQ(body["choices"][0]["text"], " one two three");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][0]["stop_reason"], three);
}

TEST_F(ServerTest, CompletionTokenPromptsAndN) {
  start();
  const auto a = tokenizer_->encode("say: alpha");
  const auto b = tokenizer_->encode("say: beta gamma");
  auto [status, body] = post("/v1/completions", {{"prompt", {a, b}}, {"n", 2}});
  ASSERT_EQ(status, 200) << body.dump();
  ASSERT_EQ(body["choices"].size(), 4u);
  // Choice index = prompt index * n + i.
  EXPECT_EQ(body["choices"][0]["text"], " alpha");
  EXPECT_EQ(body["choices"][1]["text"], " alpha");
  EXPECT_EQ(body["choices"][2]["text"], " beta gamma");
  EXPECT_EQ(body["choices"][3]["text"], " beta gamma");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(body["choices"][i]["index"], i);
  EXPECT_EQ(body["usage"]["prompt_tokens"], int(a.size() + b.size()));
  EXPECT_EQ(body["usage"]["completion_tokens"], 2 * (token_count(" alpha") + 1) + 2 * (token_count(" beta gamma") + 1));
}

TEST_F(ServerTest, CompletionEchoWithLogprobs) {
  start();
  const std::string prompt = "say: hi";
  auto [status, body] = post("/v1/completions", {{"prompt", prompt}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 1}});
  ASSERT_EQ(status, 200) << body.dump();
  const json& c = body["choices"][0];
  EXPECT_EQ(c["text"], prompt + " hi");
  const json& lp = c["logprobs"];
  const auto prompt_ids = tokenizer_->encode(prompt);
  ASSERT_EQ(lp["tokens"].size(), prompt_ids.size() + 1);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());  // nothing precedes the first prompt token
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(lp["token_logprobs"][1].get<float>(), -1.0f);  // FakeEngine's prompt logprob
  EXPECT_FLOAT_EQ(lp["token_logprobs"][prompt_ids.size()].get<float>(), FakeEngine::logprob_of(0));
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(lp["text_offset"][prompt_ids.size()], int(prompt.size()));  // ASCII: bytes == chars
  EXPECT_EQ(lp["tokens"][prompt_ids.size()], " hi");
  EXPECT_TRUE(engine_->submitted_params().at(0).prompt_logprobs >= 1);

  // max_tokens 0 with echo scores the prompt alone (lm-eval's loglikelihood requests).
  std::tie(status, body) = post("/v1/completions", {{"prompt", prompt}, {"echo", true}, {"logprobs", 0}, {"max_tokens", 0}});
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(body["choices"][0]["text"], prompt);
  EXPECT_EQ(body["choices"][0]["logprobs"]["tokens"].size(), prompt_ids.size());
  EXPECT_EQ(body["usage"]["completion_tokens"], 0);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
}

TEST_F(ServerTest, CompletionStreaming) {
  start();
  auto [status, ev] = post_stream("/v1/completions", {{"prompt", "say: streamed words here"}, {"stream", true},
                                                      {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(status, 200);
  ASSERT_TRUE(ev.done);
  std::string text;
  json finish;
  for (const auto& c : ev.chunks) {
    EXPECT_EQ(c["object"], "text_completion");
    if (c["choices"].empty()) continue;
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, " streamed words here");
  EXPECT_EQ(finish, "stop");
  EXPECT_EQ(ev.chunks.back()["usage"]["completion_tokens"], token_count(" streamed words here") + 1);
}

TEST_F(ServerTest, MetricsCountFinishedRequests) {
  start();
  for (int i = 0; i < 3; ++i) post("/v1/completions", {{"prompt", "say: a b"}});
  post("/v1/completions", {{"prompt", "say: a b c d"}, {"max_tokens", 1}});
  auto r = client().Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  const std::string& m = r->body;
  EXPECT_NE(m.find("vllm:request_success_total{model_name=\"test-model\",finished_reason=\"stop\"} 3.0"), std::string::npos) << m;
  EXPECT_NE(m.find("vllm:request_success_total{model_name=\"test-model\",finished_reason=\"length\"} 1.0"), std::string::npos);
  EXPECT_NE(m.find("vllm:e2e_request_latency_seconds_count{model_name=\"test-model\"} 4.0"), std::string::npos);
  EXPECT_NE(m.find("vllm:time_to_first_token_seconds_count{model_name=\"test-model\"} 4.0"), std::string::npos);
  EXPECT_NE(m.find("moeserve:http_requests_in_flight{model_name=\"test-model\"} 0.0"), std::string::npos);
  r = client().Get("/debug/engine");
  ASSERT_TRUE(r);
  const json d = json::parse(r->body);
  EXPECT_EQ(d["free_kv_blocks"], d["total_kv_blocks"]);
  EXPECT_EQ(d["free_state_slots"], d["total_state_slots"]);
}
