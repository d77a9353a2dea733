// Bad input gets an OpenAI-style error with the right status, never a crash.
#include "server_fixture.h"

using namespace moeserve::server;
using namespace moeserve::server::testing;
using nlohmann::json;

namespace {
void expect_error(int status, const json& body, int want_status, const std::string& want_type,
                  const json& want_param = nullptr) {
  EXPECT_EQ(status, want_status) << body.dump();
  ASSERT_TRUE(body.is_object() && body.contains("error")) << body.dump();
  const json& e = body["error"];
  EXPECT_EQ(e["type"], want_type) << body.dump();
  EXPECT_EQ(e["code"], want_status);
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty());
  if (!want_param.is_null()) EXPECT_EQ(e["param"], want_param) << body.dump();
}
}  // namespace

TEST_F(ServerTest, HealthIs503WhileLoadingThen200) {
  start(default_config(), /*ready=*/false);
  auto c = client();
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], 503);
  auto [status, body] = post("/v1/chat/completions", {{"messages", user("say:hi")}});
  expect_error(status, body, 503, "ServiceUnavailableError");
  make_ready();
  r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(ServerTest, ModelsListsServedNames) {
  start();
  auto r = client().Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][0]["id"], "test-model");
  EXPECT_EQ(j["data"][1]["id"], "alias");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["root"], "/models/test");
  EXPECT_EQ(j["data"][0]["max_model_len"], 4096);
}

TEST_F(ServerTest, RoutingErrors) {
  start();
  auto c = client();
  auto r = c.Get("/v1/nothing");
  ASSERT_TRUE(r);
  expect_error(r->status, json::parse(r->body), 404, "NotFoundError");
  r = c.Get("/v1/chat/completions");
  ASSERT_TRUE(r);
  expect_error(r->status, json::parse(r->body), 405, "MethodNotAllowedError");
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  r = c.Post("/v1/models", "{}", "application/json");
  ASSERT_TRUE(r);
  expect_error(r->status, json::parse(r->body), 405, "MethodNotAllowedError");
  r = c.Delete("/v1/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
}

TEST_F(ServerTest, MalformedBodies) {
  start();
  auto c = client();
  auto r = c.Post("/v1/chat/completions", "{\"messages\": [", "application/json");
  ASSERT_TRUE(r);
  expect_error(r->status, json::parse(r->body), 400, "BadRequestError");
  EXPECT_NE(r->body.find("not valid JSON"), std::string::npos);
  r = c.Post("/v1/chat/completions", "[1,2]", "application/json");
  ASSERT_TRUE(r);
  expect_error(r->status, json::parse(r->body), 400, "BadRequestError");
  r = c.Post("/v1/completions", "{\"prompt\": \"caf\xC3\x28\"}", "application/json");
  ASSERT_TRUE(r);
  expect_error(r->status, json::parse(r->body), 400, "BadRequestError");
  EXPECT_NE(r->body.find("not valid UTF-8 (byte 15)"), std::string::npos);
  r = c.Post("/v1/completions", "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  r = c.Post("/v1/completions", std::string(200, '[') + std::string(200, ']'), "application/json");
  ASSERT_TRUE(r);
  expect_error(r->status, json::parse(r->body), 400, "BadRequestError");
}

TEST_F(ServerTest, OversizedBodyIs413) {
  start();
  const std::string big = "{\"prompt\": \"" + std::string(2 << 20, 'a') + "\"}";
  auto r = client().Post("/v1/completions", big, "application/json");
  ASSERT_TRUE(r);
  expect_error(r->status, json::parse(r->body), 413, "RequestEntityTooLargeError");
}

TEST_F(ServerTest, FieldValidation) {
  start();
  const json msgs = user("say:hi");
  struct Case {
    json body;
    int status;
    std::string param;
  };
  const std::vector<Case> chat_cases = {
      {{{"messages", msgs}, {"model", "gpt-4"}}, 404, "model"},
      {{{"messages", msgs}, {"temperature", -0.1}}, 400, "temperature"},
      {{{"messages", msgs}, {"temperature", "hot"}}, 400, "temperature"},
      {{{"messages", msgs}, {"top_p", 0}}, 400, "top_p"},
      {{{"messages", msgs}, {"top_p", 1.01}}, 400, "top_p"},
      {{{"messages", msgs}, {"top_k", -5}}, 400, "top_k"},
      {{{"messages", msgs}, {"min_p", -1}}, 400, "min_p"},
      {{{"messages", msgs}, {"frequency_penalty", 9}}, 400, "frequency_penalty"},
      {{{"messages", msgs}, {"repetition_penalty", 0}}, 400, "repetition_penalty"},
      {{{"messages", msgs}, {"max_tokens", 0}}, 400, "max_tokens"},
      {{{"messages", msgs}, {"max_completion_tokens", -3}}, 400, "max_completion_tokens"},
      {{{"messages", msgs}, {"max_tokens", 5000}}, 400, "max_tokens"},
      {{{"messages", msgs}, {"n", 5}}, 400, "n"},
      {{{"messages", msgs}, {"n", "two"}}, 400, "n"},
      {{{"messages", msgs}, {"stop", 7}}, 400, "stop"},
      {{{"messages", msgs}, {"logit_bias", {{"999999", 5}}}}, 400, "logit_bias"},
      {{{"messages", msgs}, {"stream", "yes"}}, 400, "stream"},
      {{{"messages", msgs}, {"seed", 1.5}}, 400, "seed"},
      {{{"messages", "hello"}}, 400, "messages"},
      {{{"messages", json::array()}}, 400, "messages"},
      {json::object(), 400, "messages"},
      {{{"messages", json::array({{{"role", "wizard"}, {"content", "x"}}})}}, 400, "messages[0].role"},
      {{{"messages", json::array({{{"role", "user"}, {"content", 5}}})}}, 400, "messages[0].content"},
      {{{"messages", json::array({{{"role", "user"},
                                   {"content", json::array({{{"type", "image_url"}, {"image_url", "x"}}})}}})}},
       400, "messages[0].content[0].type"},
      {{{"messages", user("RAISE")}}, 400, "messages"},
      {{{"messages", msgs}, {"tool_choice", "auto"}}, 400, "tool_choice"},
      {{{"messages", msgs}, {"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})},
        {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}},
       400, "tool_choice"},
      {{{"messages", msgs}, {"response_format", {{"type", "json_schema"}}}}, 400, "response_format.json_schema"},
      {{{"messages", msgs}, {"response_format", {{"type", "yaml"}}}}, 400, "response_format.type"},
      {{{"messages", msgs},
        {"response_format",
         {{"type", "json_schema"}, {"json_schema", {{"name", "n"}, {"schema", {{"type", "string"}, {"pattern", "(?!a)b"}}}}}}}},
       400, "response_format.json_schema.schema"},
      {{{"messages", msgs}, {"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})},
        {"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}},
       400, "response_format"},
  };
  for (const auto& c : chat_cases) {
    auto [status, body] = post("/v1/chat/completions", c.body);
    SCOPED_TRACE(c.body.dump());
    expect_error(status, body, c.status, c.status == 404 ? "NotFoundError" : "BadRequestError", c.param);
  }
  const std::vector<Case> completion_cases = {
      {json::object(), 400, "prompt"},
      {{{"prompt", 5}}, 400, "prompt"},
      {{{"prompt", json::array({1, -2})}}, 400, "prompt"},
      {{{"prompt", json::array({1, 999999})}}, 400, "prompt"},
      {{{"prompt", ""}}, 400, "prompt"},
      {{{"prompt", "x"}, {"logprobs", 21}}, 400, "logprobs"},
      {{{"prompt", "x"}, {"max_tokens", 0}}, 400, "max_tokens"},
      {{{"prompt", "x"}, {"suffix", "y"}}, 400, "suffix"},
      {{{"prompt", [] { std::string s; for (int i = 0; i < 4200; ++i) s += " hello"; return s; }()}}, 400, "prompt"},
  };
  for (const auto& c : completion_cases) {
    auto [status, body] = post("/v1/completions", c.body);
    SCOPED_TRACE(c.body.dump());
    expect_error(status, body, c.status, "BadRequestError", c.param);
  }
  EXPECT_EQ(engine_->submitted(), 0u);  // nothing invalid reached the engine
}

TEST_F(ServerTest, ContextLengthMessageMatchesVllm) {
  auto config = default_config();
  config.limits.max_model_len = 64;
  start(config);
  auto [status, body] = post("/v1/chat/completions", {{"messages", user("say:hi")}, {"max_tokens", 60}});
  EXPECT_EQ(status, 400);
  const std::string msg = body["error"]["message"];
  const int prompt = token_count(rendered(user("say:hi")));
  EXPECT_NE(msg.find("This model's maximum context length is 64 tokens. However, you requested " +
                     std::to_string(prompt + 60) + " tokens (" + std::to_string(prompt) +
                     " in the messages, 60 in the completion)"),
            std::string::npos)
      << msg;
}

TEST_F(ServerTest, ApiKey) {
  auto config = default_config();
  config.api_keys = {"sk-test"};
  start(config);
  auto [status, body] = post("/v1/completions", {{"prompt", "say:x"}, {"max_tokens", 2}});
  expect_error(status, body, 401, "AuthenticationError");
  std::tie(status, body) = post("/v1/completions", {{"prompt", "say:x"}, {"max_tokens", 2}},
                                {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(status, 401);
  std::tie(status, body) = post("/v1/completions", {{"prompt", "say:x"}, {"max_tokens", 2}},
                                {{"Authorization", "Bearer sk-test"}});
  EXPECT_EQ(status, 200) << body.dump();
  auto c = client();
  EXPECT_EQ(c.Get("/health")->status, 200);   // probes need no key
  EXPECT_EQ(c.Get("/metrics")->status, 200);
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
}

TEST_F(ServerTest, OverloadedEngineIs503) {
  start();
  engine_->set_overloaded(true);
  auto [status, body] = post("/v1/completions", {{"prompt", "say:x"}});
  expect_error(status, body, 503, "ServiceUnavailableError");
}
