// Tool-call parsers on hand-written outputs: both formats, several calls, content around
// calls, malformed blocks (kept as content), unicode, the parser names, ids and the
// OpenAI delta shape. Every input is also checked split at every byte and in random chunks.
#include <algorithm>
#include <chrono>
#include <set>

#include <gtest/gtest.h>

#include "core/error.h"
#include "parser_test_util.h"
#include "text/tool_parser.h"

namespace moeserve::text {
namespace {

using testutil::Message;
using testutil::OutputSetup;
using Json = nlohmann::ordered_json;

const nlohmann::json& tools() {
  static const nlohmann::json t = nlohmann::json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {
        "code": {"type": "string"}, "timeout": {"type": "number"}, "env": {"type": "object"}}}}}
  ])");
  return t;
}

OutputSetup tool_only(const std::string& parser) { return {"none", parser, tools(), false}; }

// One-shot result, after checking that every chunking gives the same.
Message parse(const OutputSetup& s, std::string_view text) {
  testutil::expect_split_invariant(s, text);
  return testutil::one_shot(s, text);
}

ToolCall call(int n, std::string name, std::string arguments) {
  return {"call_" + std::to_string(n), std::move(name), std::move(arguments)};
}

// ---- hermes (Qwen3) ------------------------------------------------------------------

TEST(HermesToolParser, SingleCall) {
  const std::string text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
  for (const char* parser : {"hermes", "qwen3"}) {
    EXPECT_EQ(parse(tool_only(parser), text),
              (Message{"", "", {call(0, "get_weather", R"({"city":"Paris","days":2})")}}))
        << parser;
  }
}

TEST(HermesToolParser, ContentBeforeBetweenAndAfterCalls) {
  const std::string text =
      "I will check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\nDone.\n";
  EXPECT_EQ(parse(tool_only("hermes"), text),
            (Message{"",
                     "I will check both.\nDone.",
                     {call(0, "get_weather", R"({"city":"Rome"})"), call(1, "get_weather", R"({"city":"Oslo"})")}}));
}

TEST(HermesToolParser, ArgumentEdgeCases) {
  const OutputSetup s = tool_only("hermes");
  // Missing or null arguments: an empty object.
  EXPECT_EQ(parse(s, "<tool_call>{\"name\": \"get_weather\"}</tool_call>").tool_calls,
            (std::vector<ToolCall>{call(0, "get_weather", "{}")}));
  EXPECT_EQ(parse(s, "<tool_call>{\"name\": \"get_weather\", \"arguments\": null}</tool_call>").tool_calls,
            (std::vector<ToolCall>{call(0, "get_weather", "{}")}));
  // Arguments serialised once more as a string.
  EXPECT_EQ(parse(s, R"(<tool_call>{"name": "run", "arguments": "{\"code\": \"ls\"}"}</tool_call>)").tool_calls,
            (std::vector<ToolCall>{call(0, "run", R"({"code":"ls"})")}));
  // Tags and braces inside JSON strings do not end the block; unicode passes through.
  const std::string tricky =
      R"(<tool_call>{"name": "run", "arguments": {"code": "echo '</tool_call>' } { \" ]", "env": {"LANG": "日本語 🚀"}}}</tool_call>)";
  EXPECT_EQ(parse(s, tricky).tool_calls,
            (std::vector<ToolCall>{call(0, "run", R"({"code":"echo '</tool_call>' } { \" ]","env":{"LANG":"日本語 🚀"}})")}));
  // Unknown tools are kept (the client decides).
  EXPECT_EQ(parse(s, R"(<tool_call>{"name": "nope", "arguments": {"x": 1}}</tool_call>)").tool_calls,
            (std::vector<ToolCall>{call(0, "nope", R"({"x":1})")}));
}

TEST(HermesToolParser, MalformedBlocksAreContent) {
  const OutputSetup s = tool_only("hermes");
  const std::vector<std::string> malformed = {
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }}\n</tool_call>",  // bad JSON
      "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                                      // no name
      "<tool_call>\n{\"name\": \"\"}\n</tool_call>",                                         // empty name
      "<tool_call>\n{\"name\": 7}\n</tool_call>",                                            // name not a string
      "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",                    // arguments not an object
      "<tool_call>\n{\"name\": \"f\", \"arguments\": \"not json\"}\n</tool_call>",
      "<tool_call>\n[\"name\", \"f\"]\n</tool_call>",                                        // not an object
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n",                       // unclosed at the end
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa",              // cut mid-JSON
      "<tool_call>\n{\"name\": \"f\"} trailing</tool_call>",                                 // junk after the JSON
      "<tool_call>\nplain words</tool_call>",                                                // not JSON at all
      "<tool_call>",
      "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>",                      // XML: not hermes
  };
  for (const std::string& text : malformed) {
    EXPECT_EQ(parse(s, text), (Message{"", text, {}})) << text;
    // With text around it, everything is still content, byte for byte.
    const std::string wrapped = "Before. " + text + " After.";
    EXPECT_EQ(parse(s, wrapped), (Message{"", wrapped, {}})) << wrapped;
  }
}

TEST(HermesToolParser, GoodCallAfterAMalformedOne) {
  const std::string text =
      "<tool_call>\n{\"name\": oops}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Lima\"}}\n</tool_call>";
  EXPECT_EQ(parse(tool_only("hermes"), text),
            (Message{"", "<tool_call>\n{\"name\": oops}\n</tool_call>", {call(0, "get_weather", R"({"city":"Lima"})")}}));
  // An opening tag right after another: the first is text, the second a call.
  const std::string doubled = "<tool_call><tool_call>{\"name\": \"get_weather\"}</tool_call>";
  EXPECT_EQ(parse(tool_only("qwen3"), doubled), (Message{"", "<tool_call>", {call(0, "get_weather", "{}")}}));
}

// ---- qwen3_coder / Qwen3.5 XML ----------------------------------------------------------

TEST(Qwen3XmlToolParser, TypedArguments) {
  const std::string text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n5\n"
      "</parameter>\n<parameter=metric>\nFalse\n</parameter>\n</function>\n</tool_call>";
  for (const char* parser : {"qwen3_coder", "qwen3_xml", "qwen3"}) {
    EXPECT_EQ(parse(tool_only(parser), text),
              (Message{"", "", {call(0, "get_weather", R"({"city":"New York","days":5,"metric":false})")}}))
        << parser;
  }
}

TEST(Qwen3XmlToolParser, StringValuesAreVerbatimMinusOneNewlineEachSide) {
  const std::string code = "\n\ndef f(x):\n    return x  # </parameter> in a comment\n\n";
  const std::string text = "<tool_call>\n<function=run>\n<parameter=code>\n" + code +
                           "\n</parameter>\n<parameter=timeout>\n2.5\n</parameter>\n</function>\n</tool_call>";
  const Message m = parse(tool_only("qwen3_coder"), text);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  const Json args = Json::parse(m.tool_calls[0].arguments);
  EXPECT_EQ(args["code"], code);
  EXPECT_EQ(args["timeout"], 2.5);
  // No newline around the value: nothing stripped.
  const Message tight = parse(tool_only("qwen3_coder"),
                              "<tool_call><function=run><parameter=code>ls -la</parameter></function></tool_call>");
  ASSERT_EQ(tight.tool_calls.size(), 1u);
  EXPECT_EQ(tight.tool_calls[0].arguments, R"({"code":"ls -la"})");
}

TEST(Qwen3XmlToolParser, LiteralTagsInsideValues) {
  // "</parameter>" ends a value only before "<parameter=" or "</function>".
  const std::string value = "a </parameter> b\n</parameter>x\n<tool_call>\n</tool_call>\n</function> c";
  const std::string text = "<tool_call>\n<function=run>\n<parameter=code>\n" + value +
                           "\n</parameter>\n</function>\n</tool_call>";
  const Message m = parse(tool_only("qwen3"), text);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(Json::parse(m.tool_calls[0].arguments)["code"], value);
}

TEST(Qwen3XmlToolParser, UndeclaredToolsAndParametersStayStrings) {
  const std::string text =
      "<tool_call>\n<function=launch>\n<parameter=count>\n3\n</parameter>\n<parameter=flags>\n[1, 2]\n</parameter>\n"
      "</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
      "<parameter=wind>\n12\n</parameter>\n</function>\n</tool_call>";
  EXPECT_EQ(parse(tool_only("qwen3_coder"), text).tool_calls,
            (std::vector<ToolCall>{call(0, "launch", R"({"count":"3","flags":"[1, 2]"})"),
                                   call(1, "get_weather", R"({"city":"Oslo","wind":"12"})")}));
}

TEST(Qwen3XmlToolParser, SeveralFunctionsInOneBlockAndEmptyFunctions) {
  const std::string text =
      "<tool_call>\n<function=get_weather>\n</function>\n<function=run>\n<parameter=code>\npwd\n</parameter>\n"
      "</function>\n</tool_call>";
  EXPECT_EQ(parse(tool_only("qwen3_coder"), text).tool_calls,
            (std::vector<ToolCall>{call(0, "get_weather", "{}"), call(1, "run", R"({"code":"pwd"})")}));
}

TEST(Qwen3XmlToolParser, ContentAroundCalls) {
  const std::string text =
      "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nKyiv\n</parameter>\n</function>\n"
      "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nЛьвів\n</parameter>\n</function>\n"
      "</tool_call>\n\nBoth requested.";
  EXPECT_EQ(parse(tool_only("qwen3_coder"), text),
            (Message{"",
                     "Let me check.\n\nBoth requested.",
                     {call(0, "get_weather", R"({"city":"Kyiv"})"), call(1, "get_weather", R"({"city":"Львів"})")}}));
}

TEST(Qwen3XmlToolParser, MalformedBlocksAreContent) {
  const OutputSetup s = tool_only("qwen3_coder");
  const std::vector<std::string> malformed = {
      // missing </parameter>: the value never ends
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
      // unclosed at the end of the stream, at several depths
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
      "<tool_call>\n<function=get_wea",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n",
      // broken structure
      "<tool_call>\n<function=get weather>\n</function>\n</tool_call>",   // space in the name
      "<tool_call>\n<function={{ name }}>\n</function>\n</tool_call>",    // unrendered template
      "<tool_call>\n<function=>\n</function>\n</tool_call>",              // empty name
      "<tool_call>\n<function=f>\n<parameter=>\nx\n</parameter>\n</function>\n</tool_call>",
      "<tool_call>\n<function=f>\ntext\n</function>\n</tool_call>",       // text outside a parameter
      "<tool_call>\n<function=f>\n</function>\nextra\n</tool_call>",      // text after the function
      "<tool_call>\n<parameter=city>\nParis\n</parameter>\n</tool_call>", // no function
      "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>",           // hermes body: not XML
  };
  for (const std::string& text : malformed) {
    EXPECT_EQ(parse(s, text), (Message{"", text, {}})) << text;
    const std::string wrapped = "Before.\n" + text + "\nAfter.";
    EXPECT_EQ(parse(s, wrapped), (Message{"", wrapped, {}})) << wrapped;
  }
}

TEST(Qwen3XmlToolParser, GoodCallAfterAMalformedOne) {
  const std::string bad = "<tool_call>\n<function=bad name>\n</function>\n</tool_call>";
  const std::string good = "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  EXPECT_EQ(parse(tool_only("qwen3"), bad + "\n" + good), (Message{"", bad, {call(0, "get_weather", R"({"days":3})")}}));
  // A block opened inside a broken block is still found.
  const std::string nested = "<tool_call>\nnot a call <tool_call>\n<function=run>\n</function>\n</tool_call>";
  EXPECT_EQ(parse(tool_only("qwen3"), nested), (Message{"", "<tool_call>\nnot a call", {call(0, "run", "{}")}}));
}

// ---- shared behaviour -------------------------------------------------------------------

TEST(ToolParser, TransparentWithoutCalls) {
  // Outputs without a tool call come back unchanged, whitespace included.
  std::mt19937 rng(99);
  const std::vector<std::string> atoms = {"<",    ">",  "tool", "_call", "<tool_call", "</tool_call>", "call>",
                                          "\n",   " ",  "\t",   "text",  "{",          "}",            "é",
                                          "<to", "ol", "\"",   "<tool_cal"};
  for (const char* parser : {"hermes", "qwen3", "qwen3_coder"}) {
    for (int n = 0; n < 150; ++n) {
      std::string text;
      const int len = static_cast<int>(rng() % 10);
      for (int i = 0; i < len; ++i) text += atoms[rng() % atoms.size()];
      EXPECT_EQ(parse(tool_only(parser), text), (Message{"", text, {}})) << parser << " " << text;
    }
  }
  EXPECT_EQ(parse(tool_only("qwen3"), "  \n\n  "), (Message{"", "  \n\n  ", {}}));
  EXPECT_EQ(parse(tool_only("qwen3"), ""), (Message{}));
}

TEST(ToolParser, RandomMixturesAreSplitInvariant) {
  // Random sequences of good blocks, broken blocks and text through the auto parser.
  const std::vector<std::string> pieces = {
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}\n</tool_call>",
      "<tool_call>\n<function=run>\n<parameter=code>\nx </parameter> y\n</parameter>\n</function>\n</tool_call>",
      "<tool_call>\n<function=get_weather>\n<parameter=days>\nseven\n</parameter>\n</function>\n</tool_call>",
      "<tool_call>\n{\"name\": broken}\n</tool_call>",
      "<tool_call>\n<function=x y>",
      "<tool_call>",
      "</tool_call>",
      "\n",
      "\n\n",
      " words ",
      "ü🚀",
      "<tool_",
  };
  std::mt19937 rng(7);
  for (int n = 0; n < 120; ++n) {
    std::string text;
    const int len = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < len; ++i) text += pieces[rng() % pieces.size()];
    testutil::expect_split_invariant(tool_only("qwen3"), text, /*seeds=*/4);
    // Nothing is lost: every call comes back, the rest is content.
    const Message m = testutil::one_shot(tool_only("qwen3"), text);
    for (const ToolCall& c : m.tool_calls) EXPECT_TRUE(Json::accept(c.arguments)) << c.arguments;
  }
}

TEST(ToolParser, HoldsBackOnlyTagPrefixesAndWhitespace) {
  std::unique_ptr<ToolParser> p = ToolParser::create("qwen3", tools(), testutil::counting_ids());
  EXPECT_EQ(p->push("Hello").content, "Hello");
  EXPECT_EQ(p->push(" world <tool").content, " world");  // " <tool" could still open a block
  EXPECT_EQ(p->push("box> and").content, " <toolbox> and");
  EXPECT_EQ(p->push("\n\n").content, "");               // whitespace waits for what follows
  ToolParser::Delta d = p->push("<tool_call>\n{\"name\": \"run\"}\n</tool_call>");
  EXPECT_EQ(d.content, "");                              // the separator before a call is dropped
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(d.tool_calls[0], (ToolCallDelta{0, "call_0", "run", ""}));
  EXPECT_EQ(d.tool_calls[1], (ToolCallDelta{0, "", "", "{}"}));
  EXPECT_TRUE(p->finish().empty());
  EXPECT_EQ(p->result().content, "Hello world <toolbox> and");
}

// Work is linear in the output: a long argument value streamed a few bytes at a time
// (each push rescans nothing already scanned).
TEST(ToolParser, LongValuesStreamInLinearTime) {
  std::string value;
  for (int i = 0; value.size() < 400000; ++i) value += "line " + std::to_string(i) + " </parameter> text\n";
  const std::string xml = "<tool_call>\n<function=run>\n<parameter=code>\n" + value +
                          "\n</parameter>\n</function>\n</tool_call>";
  const std::string hermes = "<tool_call>\n{\"name\": \"run\", \"arguments\": {\"code\": " +
                             nlohmann::json(value).dump() + "}}\n</tool_call>";
  for (const std::string* text : {&xml, &hermes}) {
    std::unique_ptr<ToolParser> p = ToolParser::create("qwen3", tools(), testutil::counting_ids());
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t pos = 0; pos < text->size(); pos += 3) p->push(std::string_view(*text).substr(pos, 3));
    p->finish();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_EQ(p->result().tool_calls.size(), 1u);
    EXPECT_EQ(Json::parse(p->result().tool_calls[0].arguments)["code"], value);
    EXPECT_LT(seconds, 2.0) << "quadratic rescanning?";
  }
}

TEST(ToolParser, DeltaJsonShape) {
  EXPECT_EQ(ToolCallDelta({1, "call_x", "f", ""}).to_json(),
            nlohmann::json::parse(R"({"index": 1, "id": "call_x", "type": "function",
                                      "function": {"name": "f", "arguments": ""}})"));
  EXPECT_EQ(ToolCallDelta({1, "", "", "{\"a\":1}"}).to_json(),
            nlohmann::json::parse(R"({"index": 1, "function": {"arguments": "{\"a\":1}"}})"));
  EXPECT_EQ(ToolCall({"call_x", "f", "{}"}).to_json(),
            nlohmann::json::parse(R"({"id": "call_x", "type": "function", "function": {"name": "f", "arguments": "{}"}})"));
}

// "call_" followed by 24 characters from [A-Za-z0-9].
bool is_tool_call_id(const std::string& id) {
  if (id.size() != 29 || id.compare(0, 5, "call_") != 0) return false;
  return std::all_of(id.begin() + 5, id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  });
}

TEST(ToolParser, DefaultIdsAreRandomAlphanumerics) {
  EXPECT_FALSE(is_tool_call_id("call_abc"));
  EXPECT_FALSE(is_tool_call_id("call_abcdefghijklmnopqrstuvw-"));
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = make_tool_call_id();
    EXPECT_TRUE(is_tool_call_id(id)) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 1000u);
  const ToolParser::Result r =
      ToolParser::parse("hermes", nullptr, "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_TRUE(is_tool_call_id(r.tool_calls[0].id)) << r.tool_calls[0].id;
  EXPECT_NE(r.tool_calls[0].id, r.tool_calls[1].id);
}

TEST(ToolParser, NamesAndErrors) {
  for (const char* name : {"hermes", "qwen3", "qwen3_coder", "qwen3_xml"}) {
    EXPECT_NO_THROW(ToolParser::create(name, nullptr)) << name;
  }
  try {
    ToolParser::create("qwen35", nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'qwen35'"), std::string::npos) << what;
    for (const char* name : {"hermes", "qwen3", "qwen3_coder", "qwen3_xml"}) EXPECT_NE(what.find(name), std::string::npos);
  }
  EXPECT_THROW(ToolParser::create("hermes", nlohmann::json::parse(R"({"not": "an array"})")), Error);
  std::unique_ptr<ToolParser> p = ToolParser::create("hermes", nullptr);
  p->finish();
  EXPECT_THROW(p->push("late"), Error);
}

}  // namespace
}  // namespace moeserve::text
