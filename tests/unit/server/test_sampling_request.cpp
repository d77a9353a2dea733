#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/sampling_request.h"

using namespace moeserve::server;
using nlohmann::json;

namespace {
RequestLimits limits() {
  RequestLimits l;
  l.max_model_len = 100;
  l.max_n = 4;
  l.max_logprobs = 20;
  l.vocab_size = 1000;
  return l;
}

GenerationOptions parse(const std::string& body, Endpoint ep = Endpoint::Chat) {
  const json j = json::parse(body);
  return parse_generation_options(JsonFields(j), limits(), ep);
}

ApiError error_of(const std::string& body, Endpoint ep = Endpoint::Chat) {
  try {
    parse(body, ep);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "");
}
}  // namespace

TEST(SamplingRequest, MapsFieldsOntoSamplingParams) {
  auto o = parse(R"({"temperature":0.5,"top_p":0.9,"top_k":20,"min_p":0.05,"presence_penalty":1.5,
    "frequency_penalty":-0.5,"repetition_penalty":1.1,"seed":7,"logit_bias":{"42":-100,"7":3.5},
    "max_completion_tokens":9,"max_tokens":99,"stop":"x","stop_token_ids":[5],"ignore_eos":true,
    "n":2,"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":3})");
  const auto& sp = o.sampling;
  EXPECT_DOUBLE_EQ(sp.temperature, 0.5);
  EXPECT_DOUBLE_EQ(sp.top_p, 0.9);
  EXPECT_EQ(sp.top_k, 20);
  EXPECT_DOUBLE_EQ(sp.min_p, 0.05);
  EXPECT_DOUBLE_EQ(sp.presence_penalty, 1.5);
  EXPECT_DOUBLE_EQ(sp.frequency_penalty, -0.5);
  EXPECT_DOUBLE_EQ(sp.repetition_penalty, 1.1);
  EXPECT_EQ(sp.seed, 7u);
  EXPECT_EQ(sp.logit_bias.at(42), -100.0f);
  EXPECT_EQ(sp.logit_bias.at(7), 3.5f);
  EXPECT_EQ(o.max_tokens, 9);  // max_completion_tokens wins
  EXPECT_EQ(o.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(sp.stop_token_ids, std::vector<int32_t>{5});
  EXPECT_TRUE(sp.ignore_eos);
  EXPECT_EQ(o.n, 2);
  EXPECT_TRUE(o.stream);
  EXPECT_TRUE(o.include_usage);
  EXPECT_EQ(sp.logprobs, 3);
}

TEST(SamplingRequest, CompletionsLogprobsAndEcho) {
  auto o = parse(R"({"logprobs":2,"echo":true,"prompt_logprobs":1})", Endpoint::Completions);
  EXPECT_EQ(o.sampling.logprobs, 2);
  EXPECT_EQ(o.sampling.prompt_logprobs, 1);
  EXPECT_TRUE(o.echo);
}

TEST(SamplingRequest, RejectsInvalidValues) {
  EXPECT_EQ(error_of(R"({"temperature":-1})").param(), "temperature");
  EXPECT_EQ(error_of(R"({"top_p":0})").param(), "top_p");
  EXPECT_EQ(error_of(R"({"top_p":1.5})").param(), "top_p");
  EXPECT_EQ(error_of(R"({"top_k":-2})").param(), "top_k");
  EXPECT_EQ(error_of(R"({"min_p":2})").param(), "min_p");
  EXPECT_EQ(error_of(R"({"presence_penalty":3})").param(), "presence_penalty");
  EXPECT_EQ(error_of(R"({"repetition_penalty":0})").param(), "repetition_penalty");
  EXPECT_EQ(error_of(R"({"max_tokens":0})").param(), "max_tokens");
  EXPECT_EQ(error_of(R"({"n":5})").param(), "n");
  EXPECT_EQ(error_of(R"({"n":0})").param(), "n");
  EXPECT_EQ(error_of(R"({"logit_bias":{"abc":1}})").param(), "logit_bias");
  EXPECT_EQ(error_of(R"({"logit_bias":{"1000":1}})").param(), "logit_bias");
  EXPECT_EQ(error_of(R"({"logit_bias":{"1":101}})").param(), "logit_bias");
  EXPECT_EQ(error_of(R"({"top_logprobs":2})").param(), "top_logprobs");
  EXPECT_EQ(error_of(R"({"logprobs":true,"top_logprobs":21})").param(), "top_logprobs");
  EXPECT_EQ(error_of(R"({"stream_options":{"include_usage":true}})").param(), "stream_options");
  EXPECT_EQ(error_of(R"({"stop_token_ids":[1000]})").param(), "stop_token_ids");
  EXPECT_EQ(error_of(R"({"response_format":{"type":"xml"}})").param(), "response_format.type");
  EXPECT_EQ(error_of(R"({"response_format":{}})").param(), "response_format.type");
  EXPECT_EQ(error_of(R"({"response_format":{"type":"json_schema"}})").param(), "response_format.json_schema");
  EXPECT_EQ(error_of(R"({"response_format":{"type":"json_schema","json_schema":{"name":"x"}}})").param(),
            "response_format.json_schema.schema");
  EXPECT_EQ(error_of(R"({"response_format":{"type":"json_schema","json_schema":{"schema":[1]}}})").param(),
            "response_format.json_schema.schema");
  EXPECT_EQ(error_of(R"({"response_format":{"type":"json_schema","json_schema":{"name":3,"schema":{}}}})").param(),
            "response_format.json_schema.name");
  EXPECT_EQ(error_of(R"({"structured_outputs":{"regex":5}})").param(), "structured_outputs.regex");
  EXPECT_EQ(error_of(R"({"structured_outputs":{"grammar":"root ::= x"}})").param(), "structured_outputs.grammar");
  EXPECT_EQ(error_of(R"({"structured_outputs":{"choice":[]}})").param(), "structured_outputs.choice");
  EXPECT_EQ(error_of(R"({"structured_outputs":{"choice":["a",""]}})").param(), "structured_outputs.choice");
  EXPECT_EQ(error_of(R"({"structured_outputs":{"json":"{not json"}})").param(), "structured_outputs.json");
  EXPECT_EQ(error_of(R"({"structured_outputs":{"json":{},"choice":["a"]}})").param(), "structured_outputs");
  EXPECT_EQ(error_of(R"({"response_format":{"type":"json_object"},"structured_outputs":{"json_object":true}})").param(),
            "structured_outputs");
  EXPECT_EQ(error_of(R"({"suffix":"x"})", Endpoint::Completions).param(), "suffix");
  EXPECT_EQ(error_of(R"({"best_of":3})", Endpoint::Completions).param(), "best_of");
}

TEST(SamplingRequest, StructuredOutputForms) {
  EXPECT_EQ(parse("{}").response_format.type, ResponseFormat::Type::Text);
  EXPECT_EQ(parse(R"({"response_format":{"type":"text"}})").response_format.type, ResponseFormat::Type::Text);
  EXPECT_EQ(parse(R"({"response_format":{"type":"json_object"}})").response_format.type, ResponseFormat::Type::JsonObject);
  const auto openai = parse(R"({"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"integer"}}}})");
  EXPECT_EQ(openai.response_format.type, ResponseFormat::Type::JsonSchema);
  EXPECT_EQ(openai.response_format.schema, nlohmann::ordered_json::parse(R"({"type":"integer"})"));
  EXPECT_EQ(openai.response_format.schema_param, "response_format.json_schema.schema");
  const auto vllm = parse(R"({"structured_outputs":{"json":"{\"type\":\"string\"}"}})", Endpoint::Completions);
  EXPECT_EQ(vllm.response_format.type, ResponseFormat::Type::JsonSchema);
  EXPECT_EQ(vllm.response_format.schema, nlohmann::ordered_json::parse(R"({"type":"string"})"));
  EXPECT_EQ(vllm.response_format.schema_param, "structured_outputs.json");
  EXPECT_EQ(parse(R"({"structured_outputs":{"json_object":true}})").response_format.type, ResponseFormat::Type::JsonObject);
  const auto regex = parse(R"({"structured_outputs":{"regex":"(yes|no)!"}})");
  EXPECT_EQ(regex.response_format.type, ResponseFormat::Type::Regex);
  EXPECT_EQ(regex.response_format.regex, "(yes|no)!");
  const auto choice = parse(R"({"structured_outputs":{"choice":["yes","no"]}})");
  EXPECT_EQ(choice.response_format.type, ResponseFormat::Type::Choice);
  EXPECT_EQ(choice.response_format.choices, (std::vector<std::string>{"yes", "no"}));
  // The schema again, in the body's key order.
  const std::string body = R"({"structured_outputs":{"json":{"properties":{"z":{},"a":{}}}}})";
  EXPECT_EQ(schema_in_request_order(body, parse(body).response_format).dump(), R"({"properties":{"z":{},"a":{}}})");
}

TEST(SamplingRequest, MaxTokensAgainstTheContext) {
  auto chat = parse("{}");
  finalize_max_tokens(chat, 30, limits(), Endpoint::Chat);
  EXPECT_EQ(chat.sampling.max_tokens, 70);  // the rest of the context
  auto comp = parse("{}", Endpoint::Completions);
  finalize_max_tokens(comp, 30, limits(), Endpoint::Completions);
  EXPECT_EQ(comp.sampling.max_tokens, 16);
  auto comp_tight = parse("{}", Endpoint::Completions);
  finalize_max_tokens(comp_tight, 95, limits(), Endpoint::Completions);
  EXPECT_EQ(comp_tight.sampling.max_tokens, 5);

  auto too_many = parse(R"({"max_tokens":71})");
  try {
    finalize_max_tokens(too_many, 30, limits(), Endpoint::Chat);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("maximum context length is 100 tokens"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("you requested 101 tokens (30 in the messages, 71 in the completion)"),
              std::string::npos);
  }
  auto long_prompt = parse("{}");
  EXPECT_THROW(finalize_max_tokens(long_prompt, 100, limits(), Endpoint::Chat), ApiError);
}

TEST(SamplingRequest, ModelNames) {
  const std::vector<std::string> names = {"qwen", "alias"};
  EXPECT_EQ(resolve_model(JsonFields(json::object()), names), "qwen");
  EXPECT_EQ(resolve_model(JsonFields(json{{"model", "alias"}}), names), "alias");
  try {
    resolve_model(JsonFields(json{{"model", "gpt-4"}}), names);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 404);
    EXPECT_EQ(std::string(e.what()), "The model `gpt-4` does not exist.");
  }
}
