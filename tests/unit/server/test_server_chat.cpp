// Chat completions through the real HTTP stack with scripted model outputs: content,
// reasoning, tool calls, stop strings, n, logprobs, streaming == non-streaming.
#include "server_fixture.h"

using namespace moeserve::server;
using namespace moeserve::server::testing;
using nlohmann::json;

namespace {
// Joins the streamed deltas of choice `index`.
struct Streamed {
  std::string content, reasoning;
  std::vector<json> tool_calls;
  json finish_reason, stop_reason;
  int role_chunks = 0;
};
Streamed join_chat_stream(const SseEvents& ev, int index = 0) {
  Streamed s;
  for (const auto& c : ev.chunks) {
    if (c["choices"].empty() || c["choices"][0]["index"] != index) continue;
    const json& choice = c["choices"][0];
    const json& d = choice["delta"];
    if (d.contains("role")) ++s.role_chunks;
    if (d.contains("content") && d["content"].is_string()) s.content += d["content"].get<std::string>();
    if (d.contains("reasoning_content")) s.reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("tool_calls"))
      for (const auto& t : d["tool_calls"]) s.tool_calls.push_back(t);
    if (!choice["finish_reason"].is_null()) {
      s.finish_reason = choice["finish_reason"];
      s.stop_reason = choice["stop_reason"];
    }
  }
  return s;
}
}  // namespace

TEST_F(ServerTest, ChatReturnsTheScriptedAnswerWithUsage) {
  auto config = default_config();
  config.reasoning_parser = "";
  start(config);
  const json messages = user("say:Hello there, friend!");
  auto [status, body] = post("/v1/chat/completions",
                             {{"model", "alias"}, {"messages", messages},
                              {"chat_template_kwargs", {{"enable_thinking", false}}}});
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["model"], "alias");
  EXPECT_TRUE(body["id"].get<std::string>().starts_with("chatcmpl-"));
  ASSERT_EQ(body["choices"].size(), 1u);
  const json& choice = body["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], "Hello there, friend!");
  EXPECT_TRUE(choice["message"]["reasoning_content"].is_null());
  EXPECT_EQ(choice["message"]["tool_calls"], json::array());
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_TRUE(choice["stop_reason"].is_null());  // eos
  EXPECT_TRUE(choice["logprobs"].is_null());
  // The prompt is the rendered chat; the completion counts the answer and its <|im_end|>.
  EXPECT_EQ(body["usage"]["prompt_tokens"], token_count(rendered(messages, false)));
  EXPECT_EQ(body["usage"]["completion_tokens"], token_count("Hello there, friend!") + 1);
  EXPECT_EQ(body["usage"]["total_tokens"],
            body["usage"]["prompt_tokens"].get<int>() + body["usage"]["completion_tokens"].get<int>());
}

TEST_F(ServerTest, ReasoningIsSplitFromContent) {
  start();
  const json req = {{"messages", user("say:The capital is Paris.</think>\n\nParis.")}};
  auto [status, body] = post("/v1/chat/completions", req);
  ASSERT_EQ(status, 200) << body.dump();
  const json& m = body["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "The capital is Paris.");
  EXPECT_EQ(m["content"], "\n\nParis.");

  json sreq = req;
  sreq["stream"] = true;
  auto [sstatus, ev] = post_stream("/v1/chat/completions", sreq);
  ASSERT_EQ(sstatus, 200);
  const Streamed s = join_chat_stream(ev);
  EXPECT_EQ(s.reasoning, "The capital is Paris.");
  EXPECT_EQ(s.content, "\n\nParis.");
  EXPECT_EQ(s.finish_reason, "stop");
  EXPECT_TRUE(ev.done);
}

TEST_F(ServerTest, CutByMaxTokensWhileThinking) {
  start();
  auto [status, body] = post("/v1/chat/completions",
                             {{"messages", user("say:one two three four five six")}, {"max_tokens", 3}});
  ASSERT_EQ(status, 200);
  const json& c = body["choices"][0];
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(c["message"]["reasoning_content"], "one two three");
  EXPECT_TRUE(c["message"]["content"].is_null());
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);
}

TEST_F(ServerTest, AutoToolCall) {
  start();
  const json tools = json::array({{{"type", "function"},
                                   {"function", {{"name", "get_weather"},
                                                 {"parameters", {{"type", "object"},
                                                                 {"properties", {{"city", {{"type", "string"}}},
                                                                                 {"days", {{"type", "integer"}}}}}}}}}}});
  const std::string call =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
      "</parameter>\n</function>\n</tool_call>";
  const json req = {{"messages", user("say:</think>\n\n" + call)},
                    {"tools", tools}};
  auto [status, body] = post("/v1/chat/completions", req);
  ASSERT_EQ(status, 200) << body.dump();
  const json& c = body["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  const json& tc = c["message"]["tool_calls"][0];
  EXPECT_EQ(tc["type"], "function");
  EXPECT_TRUE(tc["id"].get<std::string>().starts_with("call_"));
  EXPECT_EQ(tc["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(tc["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}, {"days", 3}}));
  EXPECT_TRUE(c["message"]["content"].is_null());

  json sreq = req;
  sreq["stream"] = true;
  auto [sstatus, ev] = post_stream("/v1/chat/completions", sreq);
  ASSERT_EQ(sstatus, 200);
  const Streamed s = join_chat_stream(ev);
  EXPECT_EQ(s.finish_reason, "tool_calls");
  ASSERT_FALSE(s.tool_calls.empty());
  EXPECT_EQ(s.tool_calls[0]["function"]["name"], "get_weather");
  std::string args;
  for (const auto& t : s.tool_calls) args += t["function"].value("arguments", "");
  EXPECT_EQ(json::parse(args), json({{"city", "Paris"}, {"days", 3}}));

  // tool_choice none: the same text stays content.
  json none = req;
  none["tool_choice"] = "none";
  std::tie(status, body) = post("/v1/chat/completions", none);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "\n\n" + call);
}

TEST_F(ServerTest, NamedToolChoiceForcesTheCall) {
  start();
  const json tools = json::array({{{"type", "function"},
                                   {"function", {{"name", "get_weather"},
                                                 {"parameters", {{"type", "object"},
                                                                 {"properties", {{"city", {{"type", "string"}}}}}}}}}}});
  auto [status, body] = post("/v1/chat/completions",
                             {{"messages", user("What is the weather in Rome?")},
                              {"tools", tools},
                              {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  ASSERT_EQ(status, 200) << body.dump();
  const json& c = body["choices"][0];
  EXPECT_EQ(c["finish_reason"], "stop");  // vLLM: a named choice finishes with "stop"
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Rome"}}));
  EXPECT_TRUE(c["message"]["reasoning_content"].is_null());
}

TEST_F(ServerTest, StopStringCutsTheTextAndCancelsTheEngine) {
  start();
  // FOREVER: the script never emits eos, so only the stop string can end it early.
  auto [status, body] = post("/v1/chat/completions",
                             {{"messages", user("say:one two STOP three FOREVER")},
                              {"chat_template_kwargs", {{"enable_thinking", false}}},
                              {"stop", json::array({"nothing", "STOP"})},
                              {"max_tokens", 2000}});
  ASSERT_EQ(status, 200) << body.dump();
  const json& c = body["choices"][0];
  EXPECT_EQ(c["message"]["content"], "one two ");
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(c["stop_reason"], "STOP");
  EXPECT_EQ(body["usage"]["completion_tokens"], token_count("one two STOP"));
  EXPECT_TRUE(engine_drains());
  bool cancelled_with_stop = false;
  for (auto& [id, why] : engine_->cancels()) cancelled_with_stop |= why == moeserve::runtime::FinishReason::Stop;
  EXPECT_TRUE(cancelled_with_stop);
}

TEST_F(ServerTest, StreamingEqualsNonStreaming) {
  start();
  const json req = {{"messages", user("say:Streaming works, character by character: émoji 🎉 ok.")},
                    {"chat_template_kwargs", {{"enable_thinking", false}}}};
  auto [status, body] = post("/v1/chat/completions", req);
  ASSERT_EQ(status, 200);
  json sreq = req;
  sreq["stream"] = true;
  sreq["stream_options"] = {{"include_usage", true}};
  auto [sstatus, ev] = post_stream("/v1/chat/completions", sreq);
  ASSERT_EQ(sstatus, 200);
  ASSERT_TRUE(ev.done);
  const Streamed s = join_chat_stream(ev);
  EXPECT_EQ(s.role_chunks, 1);
  EXPECT_EQ(s.content, body["choices"][0]["message"]["content"]);
  EXPECT_EQ(s.finish_reason, "stop");
  // Last event: usage with no choices, equal to the non-streaming usage.
  const json& last = ev.chunks.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"], body["usage"]);
  for (size_t i = 0; i + 1 < ev.chunks.size(); ++i) {
    EXPECT_EQ(ev.chunks[i]["object"], "chat.completion.chunk");
    EXPECT_EQ(ev.chunks[i]["id"], ev.chunks.back()["id"]);
  }
}

TEST_F(ServerTest, ParallelChoicesGetConsecutiveSeeds) {
  start();
  auto [status, body] = post("/v1/chat/completions",
                             {{"messages", user("say:same")}, {"n", 3}, {"seed", 7}, {"temperature", 0.8}});
  ASSERT_EQ(status, 200) << body.dump();
  ASSERT_EQ(body["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(body["choices"][i]["index"], i);
  const auto params = engine_->submitted_params();
  ASSERT_EQ(params.size(), 3u);
  std::set<uint64_t> seeds;
  for (const auto& p : params) {
    seeds.insert(*p.seed);
    EXPECT_DOUBLE_EQ(p.temperature, 0.8);
  }
  EXPECT_EQ(seeds, (std::set<uint64_t>{7, 8, 9}));
  // One prompt, counted once; three completions.
  EXPECT_EQ(body["usage"]["prompt_tokens"], token_count(rendered(user("say:same"))));
  EXPECT_EQ(body["usage"]["completion_tokens"], 3 * (token_count("same") + 1));
}

TEST_F(ServerTest, SamplingFieldsReachTheEngine) {
  start();
  auto [status, body] = post("/v1/chat/completions",
                             {{"messages", user("say:x")}, {"temperature", 0}, {"top_p", 0.5}, {"top_k", 3},
                              {"min_p", 0.1}, {"presence_penalty", 0.5}, {"frequency_penalty", 0.25},
                              {"repetition_penalty", 1.2}, {"logit_bias", {{"100", -50}}},
                              {"ignore_eos", false}, {"max_tokens", 7}, {"stop_token_ids", {11}}});
  ASSERT_EQ(status, 200) << body.dump();
  const auto p = engine_->submitted_params().at(0);
  EXPECT_EQ(p.temperature, 0.0);
  EXPECT_EQ(p.top_p, 0.5);
  EXPECT_EQ(p.top_k, 3);
  EXPECT_DOUBLE_EQ(p.min_p, 0.1);
  EXPECT_EQ(p.presence_penalty, 0.5);
  EXPECT_EQ(p.frequency_penalty, 0.25);
  EXPECT_DOUBLE_EQ(p.repetition_penalty, 1.2);
  EXPECT_EQ(p.logit_bias.at(100), -50.0f);
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_EQ(p.stop_token_ids, std::vector<int32_t>{11});
}

TEST_F(ServerTest, ChatLogprobs) {
  start();
  auto [status, body] = post("/v1/chat/completions",
                             {{"messages", user("say:Hi you")}, {"logprobs", true}, {"top_logprobs", 2},
                              {"chat_template_kwargs", {{"enable_thinking", false}}}});
  ASSERT_EQ(status, 200) << body.dump();
  const json& content = body["choices"][0]["logprobs"]["content"];
  const auto ids = tokenizer_->encode("Hi you");
  ASSERT_EQ(content.size(), ids.size() + 1);  // + <|im_end|>
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t one[1] = {ids[i]};
    EXPECT_EQ(content[i]["token"], tokenizer_->decode(one));
    EXPECT_FLOAT_EQ(content[i]["logprob"].get<float>(), FakeEngine::logprob_of(int(i)));
    ASSERT_EQ(content[i]["top_logprobs"].size(), 2u);
    EXPECT_FLOAT_EQ(content[i]["top_logprobs"][1]["logprob"].get<float>(), FakeEngine::logprob_of(int(i)) - 1.0f);
    std::string bytes;
    for (int b : content[i]["bytes"]) bytes += char(b);
    EXPECT_EQ(bytes, tokenizer_->decode(one));
  }
  EXPECT_EQ(content[ids.size()]["token"], "<|im_end|>");
}

TEST_F(Qwen3ServerTest, TokenizeAndDetokenize) {
  start();
  auto [status, body] = post("/tokenize", {{"prompt", "Hello world"}, {"return_token_strs", true}});
  ASSERT_EQ(status, 200) << body.dump();
  // Ids from Hugging Face tokenizers for Qwen3 (../shared/spec/deps.md).
  EXPECT_EQ(body["tokens"], json({9707, 1879}));
  EXPECT_EQ(body["count"], 2);
  EXPECT_EQ(body["max_model_len"], 4096);
  EXPECT_EQ(body["token_strs"], json({"Hello", "Ġworld"}));
  std::tie(status, body) = post("/detokenize", {{"tokens", {9707, 1879}}});
  ASSERT_EQ(status, 200);
  EXPECT_EQ(body["prompt"], "Hello world");
  std::tie(status, body) = post("/tokenize", {{"messages", user("hi")}});
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(body["count"], token_count(rendered(user("hi"))));
  std::tie(status, body) = post("/detokenize", {{"tokens", {9707, 99999999}}});
  EXPECT_EQ(status, 400);
}
