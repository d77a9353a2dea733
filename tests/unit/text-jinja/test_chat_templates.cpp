// The real chat templates (Qwen3 from its tokenizer_config.json, Qwen3.5's
// chat_template.jinja) rendered by ChatTemplate: against Python Jinja2 on seeded random
// conversations generated at test time, against committed expected renders, and against
// the format the Qwen3.5 spec documents (docs: /work/shared/spec/qwen35_arch.md §5).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "reference_oracle.h"
#include "text/chat_template.h"
#include "text/jinja/error.h"

namespace moeserve::text {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// Renders every generated case with `tmpl` and compares with Python's result.
void expect_random_cases_match(const ChatTemplate& tmpl, const json& cases) {
  ASSERT_FALSE(cases.empty());
  size_t rendered = 0, failed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    SCOPED_TRACE("case " + std::to_string(i) + ": " + c["messages"].dump().substr(0, 2000));
    std::optional<std::string> ours;
    std::string our_error;
    try {
      ours = tmpl.render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(), c["kwargs"]);
    } catch (const jinja::TemplateError& e) {
      our_error = e.what();
    }
    if (c.contains("output")) {
      ++rendered;
      ASSERT_TRUE(ours.has_value()) << "Python rendered it, we failed: " << our_error;
      ASSERT_EQ(*ours, c["output"].get<std::string>());
    } else {
      ++failed;
      EXPECT_FALSE(ours.has_value()) << "Python failed (" << c["error"].get<std::string>() << "), we rendered "
                                     << json(*ours).dump();
    }
  }
  EXPECT_GT(rendered, cases.size() / 2);  // the generator must mostly produce valid chats
}

TEST(ChatTemplateQwen3, RandomConversationsMatchPython) {
  ChatTemplate tmpl = ChatTemplate::load(testing::qwen3_tokenizer_dir());
  for (int seed : {11, 12, 13}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    json cases = testing::run_reference(
        {"random", "--model-dir", testing::qwen3_tokenizer_dir(), "--seed", std::to_string(seed), "--count", "150"});
    expect_random_cases_match(tmpl, cases);
  }
}

TEST(ChatTemplateQwen35, RandomConversationsMatchPython) {
  ChatTemplate tmpl = ChatTemplate::from_file(testing::qwen35_template_path());
  for (int seed : {21, 22, 23}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    json cases = testing::run_reference({"random", "--template", testing::qwen35_template_path(), "--content-parts",
                                         "--seed", std::to_string(seed), "--count", "150"});
    expect_random_cases_match(tmpl, cases);
  }
}

// expected_renders.json was produced by `render_reference.py fixed` (Python Jinja2);
// this test needs no Python.
TEST(ChatTemplateFixed, MatchesCommittedRenders) {
  json cases = json::parse(testing::read_text_file(testing::fixtures_dir() + "/expected_renders.json"));
  ChatTemplate qwen3 = ChatTemplate::load(testing::qwen3_tokenizer_dir());
  ChatTemplate qwen35 = ChatTemplate::from_file(testing::qwen35_template_path());
  ASSERT_GE(cases.size(), 10u);
  for (const json& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>() + " / " + c["template"].get<std::string>());
    const ChatTemplate& tmpl = c["template"] == "qwen3" ? qwen3 : qwen35;
    EXPECT_EQ(tmpl.render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(), c["kwargs"]),
              c["expected"].get<std::string>());
  }
}

json user_only(const std::string& text) { return json::array({{{"role", "user"}, {"content", text}}}); }

TEST(ChatTemplateQwen35, GenerationPromptThinkingOnByDefault) {
  ChatTemplate tmpl = ChatTemplate::from_file(testing::qwen35_template_path());
  EXPECT_EQ(tmpl.render(user_only("Hi"), json(), true, json::object()),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(tmpl.render(user_only("Hi"), json(), true, json{{"enable_thinking", false}}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(tmpl.render(user_only("Hi"), json(), false, json::object()), "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplateQwen35, ToolCallsUseTheXmlFormat) {
  ChatTemplate tmpl = ChatTemplate::from_file(testing::qwen35_template_path());
  json messages = json::parse(R"([
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}]},
    {"role": "tool", "content": "sunny"}])");
  std::string prompt = tmpl.render(messages, json(), true, json::object());
  EXPECT_NE(prompt.find("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                        "<parameter=days>\n[1, 2]\n</parameter>\n</function>\n</tool_call><|im_end|>\n"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"), std::string::npos)
      << prompt;
}

TEST(ChatTemplateQwen35, ToolDefinitionsKeepTheClientKeyOrder) {
  ChatTemplate tmpl = ChatTemplate::from_file(testing::qwen35_template_path());
  json tools = json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}])");
  std::string prompt = tmpl.render(user_only("x"), tools, true, json::object());
  EXPECT_NE(prompt.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
                        "{\"type\": \"object\", \"properties\": {}}}}\n</tools>"),
            std::string::npos)
      << prompt;
}

TEST(ChatTemplateQwen35, RaisesTheTemplatesOwnErrors) {
  ChatTemplate tmpl = ChatTemplate::from_file(testing::qwen35_template_path());
  json only_system = json::parse(R"([{"role": "system", "content": "s"}])");
  try {
    tmpl.render(only_system, json(), true, json::object());
    FAIL() << "expected raise_exception";
  } catch (const jinja::TemplateError& e) {
    EXPECT_EQ(e.kind(), jinja::TemplateError::Kind::kRaised);
    EXPECT_EQ(e.detail(), "No user query found in messages.");
    EXPECT_GT(e.line(), 0);
  }
  EXPECT_THROW(tmpl.render(json::array(), json(), true, json::object()), jinja::TemplateError);
}

// ---- loading rules ---------------------------------------------------------------------------

class TempModelDir : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::make_temp_dir("model"); }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream out(fs::path(dir_) / name, std::ios::binary);
    out << text;
  }
  std::string dir_;
};

TEST_F(TempModelDir, ChatTemplateJinjaFileWinsOverTokenizerConfig) {
  write("tokenizer_config.json", R"({"chat_template": "config", "eos_token": "<eos>"})");
  write("chat_template.jinja", "file {{ eos_token }}\n");
  EXPECT_EQ(ChatTemplate::load(dir_).render(json::array(), json(), true, json::object()), "file <eos>");
}

TEST_F(TempModelDir, NamedTemplatesPickToolUseWhenToolsAreGiven) {
  write("tokenizer_config.json", R"({"chat_template": [{"name": "default", "template": "plain"},
                                                      {"name": "tool_use", "template": "tools={{ tools|length }}"}]})");
  ChatTemplate t = ChatTemplate::load(dir_);
  EXPECT_EQ(t.render(json::array(), json(), true, json::object()), "plain");
  EXPECT_EQ(t.render(json::array(), json::array({1, 2}), true, json::object()), "tools=2");
  EXPECT_EQ(t.render(json::array(), json::array(), true, json::object()), "tools=0");
}

TEST_F(TempModelDir, NamedTemplatesWithoutDefaultFailWithoutTools) {
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "rag", "template": "r"}]})");
  ChatTemplate t = ChatTemplate::load(dir_);
  EXPECT_EQ(t.render(json::array(), json::array(), true, json::object()), "t");
  EXPECT_THROW(t.render(json::array(), json(), true, json::object()), moeserve::Error);
}

TEST_F(TempModelDir, SpecialTokensAreVariables) {
  write("tokenizer_config.json", R"({"chat_template": "{{ bos_token }}|{{ eos_token }}|{{ pad_token is defined }}|{{ unk_token }}",
      "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false}, "eos_token": "</s>", "pad_token": null})");
  EXPECT_EQ(ChatTemplate::load(dir_).render(json::array(), json(), true, json::object()), "<s>|</s>|False|");
}

TEST_F(TempModelDir, KwargsAreVariablesAndOverrideSpecialTokens) {
  write("tokenizer_config.json", R"({"chat_template": "{{ eos_token }}{{ custom }}{{ documents }}{{ add_generation_prompt }}", "eos_token": "E"})");
  ChatTemplate t = ChatTemplate::load(dir_);
  EXPECT_EQ(t.render(json::array(), json(), false, json{{"custom", 7}}), "E7NoneFalse");
  EXPECT_EQ(t.render(json::array(), json(), true, json{{"eos_token", "X"}}), "XNoneTrue");
  EXPECT_THROW(t.render(json::array(), json(), true, json{{"messages", 1}}), moeserve::Error);
}

TEST_F(TempModelDir, MissingOrMalformedTemplatesAreClearErrors) {
  EXPECT_THROW(ChatTemplate::load(dir_ + "/does-not-exist"), moeserve::Error);
  try {
    ChatTemplate::load(dir_);
    FAIL();
  } catch (const moeserve::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no chat template"), std::string::npos) << e.what();
  }
  write("tokenizer_config.json", "{not json");
  EXPECT_THROW(ChatTemplate::load(dir_), moeserve::Error);
  write("tokenizer_config.json", R"({"chat_template": 5})");
  EXPECT_THROW(ChatTemplate::load(dir_), moeserve::Error);
  write("tokenizer_config.json", R"({"chat_template": "{% if %}"})");
  try {
    ChatTemplate::load(dir_);
    FAIL();
  } catch (const jinja::TemplateError& e) {
    EXPECT_EQ(e.kind(), jinja::TemplateError::Kind::kSyntax);
    EXPECT_EQ(e.line(), 1);
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json:chat_template"), std::string::npos) << e.what();
  }
}

TEST_F(TempModelDir, ChatTemplateFlagTakesAFileOrInlineText) {
  write("tokenizer_config.json", R"({"chat_template": "config", "eos_token": "E"})");
  write("override.jinja", "override {{ eos_token }}");
  EXPECT_EQ(ChatTemplate::load(dir_, dir_ + "/override.jinja").render(json::array(), json(), true, json::object()),
            "override E");
  EXPECT_EQ(ChatTemplate::load(dir_, "{{ messages|length }}\\n{{ eos_token }}")
                .render(json::array({1}), json(), true, json::object()),
            "1\nE");
  EXPECT_EQ(ChatTemplate::load("", "{{ 'no model dir' }}").render(json::array(), json(), true, json::object()),
            "no model dir");
  EXPECT_THROW(ChatTemplate::load(dir_, "missing-file.jinja"), moeserve::Error);
}

TEST(ChatTemplateInput, RejectsMalformedRequests) {
  ChatTemplate t = ChatTemplate::from_string("{{ messages }}");
  EXPECT_THROW(t.render(json::object(), json(), true, json::object()), moeserve::Error);
  EXPECT_THROW(t.render(json::array(), json::object(), true, json::object()), moeserve::Error);
  EXPECT_THROW(t.render(json::array(), json(), true, json::array()), moeserve::Error);
}

TEST(ChatTemplateInput, UnorderedJsonSortsKeysOrderedJsonKeepsThem) {
  ChatTemplate t = ChatTemplate::from_string("{{ messages[0]|tojson }}");
  nlohmann::json plain = nlohmann::json::parse(R"([{"role": "user", "content": "x"}])");
  EXPECT_EQ(t.render(plain, nlohmann::json(), true, nlohmann::json::object()), R"({"content": "x", "role": "user"})");
  json ordered = json::parse(R"([{"role": "user", "content": "x"}])");
  EXPECT_EQ(t.render(ordered, json(), true, json::object()), R"({"role": "user", "content": "x"})");
}

}  // namespace
}  // namespace moeserve::text
