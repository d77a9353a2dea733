// compile_json_schema: what each supported keyword lets through, what is refused (with the
// keyword's JSON pointer in the message), and random texts of each grammar checked by hand.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "structured/json_schema_compiler.h"
#include "structured_test_util.h"

namespace moeserve::structured {
namespace {

using nlohmann::ordered_json;
using testing::accepts;
using testing::alive_after;

JsonGrammar compile(const char* schema) { return compile_json_schema(ordered_json::parse(schema)); }

struct Case {
  const char* schema;
  std::vector<std::string> accepted;
  std::vector<std::string> rejected;
};

// Each schema's grammar takes its accepted texts whole and refuses its rejected ones.
void check_cases(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    SCOPED_TRACE(c.schema);
    const JsonGrammar g = compile(c.schema);
    for (const auto& text : c.accepted) EXPECT_TRUE(accepts(g, text)) << text;
    for (const auto& text : c.rejected) EXPECT_FALSE(accepts(g, text)) << text;
  }
}

TEST(JsonSchemaCompiler, KeywordsAcceptAndRejectWhatTheySay) {
  const std::vector<Case> cases = {
      {R"({"type": "string"})", {R"("")", R"("abc")", R"( "x")"}, {"1", "null", R"(["a"])"}},
      {R"({"type": "integer"})", {"0", "-12", "7"}, {"1.5", "1e3", "\"1\"", "01"}},
      {R"({"type": "number"})", {"0", "-1.5e-3", "12"}, {"\"1\"", "true"}},
      {R"({"type": "boolean"})", {"true", "false"}, {"null", "1", "\"true\""}},
      {R"({"type": "null"})", {"null"}, {"false", "{}"}},
      {R"({"type": ["string", "null"]})", {"null", R"("a")"}, {"1"}},
      {R"({"enum": ["red", "green", 3, null]})",
       {R"("red")", R"("green")", "3", "null"},
       {R"("blue")", R"("re")", "4"}},
      {R"({"const": {"a": [1, "x"]}})", {R"({"a":[1,"x"]})"}, {R"({"a": [1, "x"]})", R"({"a":[1]})"}},
      {R"({"type": "string", "enum": ["a", 1, "b"]})", {R"("a")", R"("b")"}, {"1"}},
      {R"({"type": "string", "minLength": 2, "maxLength": 3})",
       {R"("ab")", R"("abc")", "\"\xC3\xA9\xE6\x97\xA5\"", R"("\n\u00e9")"},
       {R"("a")", R"("abcd")", "\"\xC3\xA9\""}},
      {R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2})",
       {"[1]", "[1,2]", "[ 1 , 2 ]"},
       {"[]", "[1,2,3]", R"(["a"])"}},
      {R"({"type": "array", "items": false})", {"[]"}, {"[1]"}},
      {R"({"type": "array"})", {"[]", R"([1,"a",{"b":null}])"}, {"{}"}},
      {R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
           "required": ["name"]})",
       {R"({"name":"x"})", R"({"name": "x", "age": 3})"},
       {"{}", R"({"age":3})", R"({"age":3,"name":"x"})", R"({"name":"x","other":1})", R"({"name":"x",})"}},
      {R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}})",
       {"{}", R"({"a":1})", R"({"b":2})", R"({"a":1,"b":2})"},
       {R"({"b":2,"a":1})", R"({"a":1,"a":2})", R"({"c":1})"}},
      {R"({"type": "object", "additionalProperties": {"type": "integer"}})",
       {"{}", R"({"x":1,"y":2})"},
       {R"({"x":"1"})"}},
      {R"({"type": "object", "additionalProperties": false})", {"{}"}, {R"({"x":1})"}},
      {R"({"type": "object"})", {"{}", R"({"x":[1,{"y":null}]})"}, {"[]"}},
      {R"({"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]}]})",
       {"5", R"({"k":1})"},
       {R"({"k":2})", "\"5\""}},
      {R"({"oneOf": [{"type": "string"}, {"type": "null"}]})", {"null", R"("s")"}, {"0"}},
      {R"({"allOf": [{"type": "integer"}]})", {"1"}, {"\"a\""}},
      {R"({"$defs": {"Node": {"type": "object", "properties": {"v": {"type": "integer"},
           "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}}, "required": ["v", "next"]}},
          "$ref": "#/$defs/Node"})",
       {R"({"v":1,"next":null})", R"({"v":1,"next":{"v":2,"next":{"v":3,"next":null}}})"},
       {R"({"v":1})", R"({"v":1,"next":{"v":2}})"}},
      {R"({"definitions": {"s": {"type": "string"}}, "type": "object",
           "properties": {"a": {"$ref": "#/definitions/s"}}, "required": ["a"]})",
       {R"({"a":"x"})"},
       {R"({"a":1})"}},
      {R"({"type": "object", "properties": {"k~/\"": {"type": "integer"}}, "required": ["k~/\""]})",
       {R"({"k~/\"":1})"},
       {R"({"k":1})"}},
      {R"({"title": "t", "description": "d", "format": "date-time", "type": "string"})", {R"("x")"}, {"1"}},
      {R"(true)", {"1", "{}", "null"}, {}},
      {R"({})", {"1", "{}", "null"}, {}},
  };
  check_cases(cases);
}

TEST(JsonGrammar, LiteralChoiceIsExactlyOneOfTheTexts) {
  const JsonGrammar g = literal_choice({"yes", "no", " maybe", "yes!"});
  EXPECT_TRUE(accepts(g, "yes"));
  EXPECT_TRUE(accepts(g, "yes!"));
  EXPECT_TRUE(accepts(g, "no"));
  EXPECT_TRUE(accepts(g, " maybe"));
  EXPECT_FALSE(accepts(g, " yes"));   // no whitespace is added before a choice
  EXPECT_FALSE(accepts(g, "\"yes\""));
  EXPECT_FALSE(accepts(g, "ye"));
  EXPECT_FALSE(accepts(g, "no "));
  EXPECT_FALSE(alive_after(g, "n!"));
}

TEST(JsonSchemaCompiler, IntegerBounds) {
  const std::vector<Case> cases = {
      {R"({"type": "integer", "minimum": 0, "maximum": 100})", {"0", "7", "42", "100"}, {"-1", "101", "1000", "-0", "007"}},
      {R"({"type": "integer", "minimum": 18})", {"18", "19", "2147483647"}, {"17", "1", "0", "-5", "2147483648"}},
      {R"({"type": "integer", "minimum": -5, "maximum": -3})", {"-5", "-4", "-3"}, {"-2", "-6", "-50", "3", "0"}},
      {R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10})", {"1", "9"}, {"0", "10"}},
      {R"({"type": "integer", "minimum": -1.5, "maximum": 2.5})", {"-1", "0", "2"}, {"-2", "3"}},
      {R"({"type": "integer", "minimum": 10, "maximum": 12})", {"10", "11", "12"}, {"1", "13", "9"}},
      {R"({"enum": [1, 5, 9], "minimum": 3})", {"5", "9"}, {"1"}},
  };
  check_cases(cases);
  // Digits that cannot lead into the range are refused as they come.
  const JsonGrammar g = compile(R"({"type": "integer", "minimum": 10, "maximum": 12})");
  EXPECT_TRUE(alive_after(g, "1"));
  EXPECT_FALSE(alive_after(g, "2"));
  EXPECT_FALSE(alive_after(g, "13"));
  EXPECT_FALSE(alive_after(g, "-"));
  // In a container the value must be in range before the next byte.
  const JsonGrammar arr = compile(R"({"type": "array", "items": {"type": "integer", "minimum": 10, "maximum": 12}})");
  EXPECT_FALSE(alive_after(arr, "[1,"));
  EXPECT_TRUE(accepts(arr, "[10, 12,11]"));
  // Random texts stay in range and never dead-end.
  std::mt19937 rng(5);
  const JsonGrammar obj = compile(R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": -40,
      "maximum": 25}, "b": {"type": "integer", "exclusiveMinimum": 99}}, "required": ["a", "b"]})");
  for (int i = 0; i < 300; ++i) {
    std::string text;
    ASSERT_TRUE(testing::random_text(obj, rng, 20, text)) << "dead end after: " << text;
    const auto v = nlohmann::json::parse(text);
    EXPECT_GE(v["a"].get<int64_t>(), -40) << text;
    EXPECT_LE(v["a"].get<int64_t>(), 25) << text;
    EXPECT_GE(v["b"].get<int64_t>(), 100) << text;
  }
}

TEST(JsonSchemaCompiler, StringPatterns) {
  const std::vector<Case> cases = {
      // Searched, as JSON Schema says: unanchored patterns may match anywhere.
      {R"({"type": "string", "pattern": "ab"})", {R"("ab")", R"("xaby")", R"("ab\n")"}, {R"("a")", R"("ba")"}},
      {R"({"type": "string", "pattern": "^\\d{3}-\\d{4}$"})", {R"("555-1234")"}, {R"("555-12345")", R"("55-1234")"}},
      // The pattern reads decoded characters: escapes count as what they stand for.
      {R"({"type": "string", "pattern": "^a\"b\\\\c\nd$"})", {R"("a\"b\\c\nd")"}, {R"("a\"b\\cnd")"}},
      {R"({"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"})", {R"("me@x.com")"}, {R"("me@x.org")", R"("@x.com")"}},
      {R"({"type": "string", "pattern": "^caf\u00e9$"})", {"\"caf\xC3\xA9\""}, {R"("cafe")"}},
      {R"({"enum": ["a1", "b2", "cc"], "pattern": "\\d"})", {R"("a1")", R"("b2")"}, {R"("cc")"}},
  };
  check_cases(cases);
  // \uXXXX is not offered inside a patterned string; the closing quote waits for a match.
  const JsonGrammar g = compile(R"({"type": "string", "pattern": "^x+$"})");
  EXPECT_FALSE(alive_after(g, R"("\u0078)"));
  EXPECT_FALSE(alive_after(g, R"("")"));
  EXPECT_FALSE(alive_after(g, R"("y)"));
  // Random texts match and never dead-end.
  std::mt19937 rng(8);
  const JsonGrammar obj = compile(R"({"type": "object", "properties": {"id": {"type": "string",
      "pattern": "^[A-Z]{2}-\\d{2,3}$"}, "tag": {"type": "string", "pattern": "^(red|blue)!?$"}},
      "required": ["id", "tag"]})");
  for (int i = 0; i < 200; ++i) {
    std::string text;
    ASSERT_TRUE(testing::random_text(obj, rng, 20, text)) << "dead end after: " << text;
    const auto v = nlohmann::json::parse(text);
    EXPECT_TRUE(std::regex_match(v["id"].get<std::string>(), std::regex("[A-Z]{2}-[0-9]{2,3}"))) << text;
    EXPECT_TRUE(std::regex_match(v["tag"].get<std::string>(), std::regex("(red|blue)!?"))) << text;
  }
}

TEST(JsonGrammar, RegexTextIsMatchedWhole) {
  const JsonGrammar g = regex_text("(yes|no)( because .{1,5})?");
  EXPECT_TRUE(accepts(g, "yes"));
  EXPECT_TRUE(accepts(g, "no because abc"));
  EXPECT_FALSE(accepts(g, " yes"));
  EXPECT_FALSE(accepts(g, "yes because"));
  EXPECT_FALSE(accepts(g, "maybe"));
  EXPECT_TRUE(alive_after(g, "no bec"));
}

TEST(JsonSchemaCompiler, NumberBounds) {
  const std::vector<Case> cases = {
      {R"({"type": "number", "minimum": 0, "maximum": 1})",
       {"0", "1", "0.5", "0.123456", "1.0", "1.000000", "0.0"},
       {"-0.1", "1.000001", "2", "1e-1", "0.1234567", "-1", "01"}},
      {R"({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1})", {"0.000001", "0.999999", "0.5"}, {"0", "1", "0.0"}},
      {R"({"type": "number", "minimum": 0.1, "maximum": 0.3})", {"0.1", "0.2", "0.3", "0.25"}, {"0.09", "0.31", "0.3000001"}},
      {R"({"type": "number", "minimum": -2.5, "maximum": -1.25})", {"-2.5", "-1.25", "-2", "-1.3"}, {"-1.2", "-2.6", "2", "-3"}},
      {R"({"type": "number", "minimum": 1000})", {"1000", "123456.5", "999999999"}, {"999.9", "1000000000", "-1000"}},
  };
  check_cases(cases);
  const JsonGrammar g = compile(R"({"type": "number", "minimum": 0.1, "maximum": 0.3})");
  EXPECT_FALSE(alive_after(g, "1"));     // 1.x is above 0.3
  EXPECT_FALSE(alive_after(g, "0.4"));
  EXPECT_TRUE(alive_after(g, "0.2"));
  EXPECT_FALSE(alive_after(g, "0,"));
  std::mt19937 rng(21);
  const JsonGrammar obj = compile(R"({"type": "object", "properties": {"p": {"type": "number", "minimum": 0,
      "maximum": 1}, "t": {"type": "number", "exclusiveMinimum": -40.5, "maximum": 60}}, "required": ["p", "t"]})");
  for (int i = 0; i < 300; ++i) {
    std::string text;
    ASSERT_TRUE(testing::random_text(obj, rng, 20, text)) << "dead end after: " << text;
    const auto v = nlohmann::json::parse(text);
    EXPECT_GE(v["p"].get<double>(), 0.0) << text;
    EXPECT_LE(v["p"].get<double>(), 1.0) << text;
    EXPECT_GT(v["t"].get<double>(), -40.5) << text;
    EXPECT_LE(v["t"].get<double>(), 60.0) << text;
  }
}

TEST(JsonSchemaCompiler, LargeEnumsKeepEveryValue) {
  // 300 values: more ways to read a first byte than the matcher keeps stacks for, so they
  // become one automaton; every value stays reachable.
  nlohmann::ordered_json values = nlohmann::ordered_json::array();
  for (int i = 0; i < 300; ++i) values.push_back("v" + std::to_string(i));
  for (int i : {1, 12, 123}) values.push_back(i);
  const JsonGrammar g = compile_json_schema(nlohmann::ordered_json{
      {"type", "object"}, {"properties", {{"e", {{"enum", values}}}, {"n", {{"type", "integer"}}}}},
      {"required", {"e", "n"}}});
  for (int i = 0; i < 300; ++i)
    EXPECT_TRUE(accepts(g, "{\"e\":\"v" + std::to_string(i) + "\",\"n\":0}")) << i;
  for (const char* n : {"1", "12", "123"}) EXPECT_TRUE(accepts(g, std::string("{\"e\": ") + n + " ,\"n\":0}")) << n;
  EXPECT_FALSE(accepts(g, R"({"e":"v300","n":0})"));
  EXPECT_FALSE(accepts(g, R"({"e":"v","n":0})"));
  EXPECT_FALSE(accepts(g, R"({"e":1234,"n":0})"));
  EXPECT_FALSE(accepts(g, R"({"e":"v1" ,"n":0)"));
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    std::string text;
    ASSERT_TRUE(testing::random_text(g, rng, 12, text)) << "dead end after: " << text;
    const auto v = nlohmann::ordered_json::parse(text);
    EXPECT_NE(std::find(values.begin(), values.end(), v["e"]), values.end()) << text;
  }
}

TEST(JsonSchemaCompiler, PropertiesComeInTheSchemasOrder) {
  // ordered_json keeps "z" before "a": the grammar asks for them in that order.
  const JsonGrammar g = compile(R"({"type": "object", "properties": {"z": {"type": "integer"},
      "a": {"type": "integer"}}, "required": ["z", "a"]})");
  EXPECT_TRUE(accepts(g, R"({"z":1,"a":2})"));
  EXPECT_FALSE(accepts(g, R"({"a":2,"z":1})"));
}

TEST(JsonSchemaCompiler, RequiredPropertyCannotBeSkippedAndClosingWaitsForIt) {
  const JsonGrammar g = compile(R"({"type": "object", "properties": {"a": {"type": "integer"},
      "b": {"type": "integer"}, "c": {"type": "integer"}}, "required": ["b"]})");
  EXPECT_FALSE(alive_after(g, "{}"));
  EXPECT_FALSE(alive_after(g, R"({"c")"));  // c cannot come before the required b
  EXPECT_TRUE(alive_after(g, R"({"a":1,)"));
  EXPECT_FALSE(alive_after(g, R"({"a":1})"));
  EXPECT_TRUE(accepts(g, R"({"b":1,"c":2})"));
  EXPECT_FALSE(alive_after(g, R"({"b":1,"c":2,)"));  // nothing is left after c
}

TEST(JsonSchemaCompiler, RefusesWhatItCannotEnforceNamingTheKeywordAndPlace) {
  const std::vector<std::pair<const char*, const char*>> refused = {
      {R"({"type": "string", "pattern": "(a)\\1"})", "/pattern: pattern `(a)\\1`: backreferences are not supported"},
      {R"({"type": "string", "pattern": "^a", "maxLength": 3})", "`pattern` together with minLength / maxLength"},
      {R"({"pattern": "^a"})", "`pattern` is supported for \"type\": \"string\" only"},
      {R"({"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.5}}})",
       "/properties/n: the keyword `multipleOf` is not supported"},
      {R"({"maximum": 3})", "`maximum` needs \"type\": \"integer\" or \"number\""},
      {R"({"type": "number", "minimum": 0.0000001, "maximum": 0.0000009})", "no number with at most 6 fraction digits"},
      {R"({"type": "integer", "minimum": 5, "exclusiveMaximum": 5})", "no integer in [5, 4]"},
      {R"({"type": "integer", "minimum": 3000000000})", "no integer in"},
      {R"({"type": "integer", "exclusiveMinimum": true, "minimum": 1})", "the draft-04 boolean form"},
      {R"({"type": "integer", "multipleOf": 2})", "the keyword `multipleOf` is not supported"},
      {R"({"type": "array", "uniqueItems": true})", "the keyword `uniqueItems`"},
      {R"({"not": {"type": "string"}})", "the keyword `not`"},
      {R"({"type": "object", "required": ["x"]})", "required property `x` is not in `properties`"},
      {R"({"type": "string", "minLength": 3, "maxLength": 2})", "minLength is larger than maxLength"},
      {R"({"type": "array", "minItems": -1})", "/minItems: must be a non-negative integer"},
      {R"({"type": "color"})", "/type: unknown type `color`"},
      {R"({"$ref": "#/$defs/missing"})", "does not name a schema"},
      {R"({"$ref": "http://example.com/s.json"})", "only references inside the schema"},
      {R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})", "refers to itself"},
      {R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"})",
       "refers to itself"},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})", "only an allOf of exactly one schema"},
      {R"({"type": "integer", "anyOf": [{"const": 1}]})", "together with"},
      {R"({"enum": []})", "/enum: must be a non-empty array"},
      {R"({"type": "string", "enum": [1, 2]})", "no value of `enum`/`const` matches"},
      {R"(false)", "the schema `false` accepts no value"},
      {R"(3)", "a schema must be an object or a boolean"},
  };
  for (const auto& [schema, message] : refused) {
    try {
      compile(schema);
      ADD_FAILURE() << "accepted " << schema;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << schema << " -> " << e.what();
    }
  }
}

// Random texts of a realistic schema: valid JSON, with the shape the schema asks for, and no
// dead end on the way.
TEST(JsonSchemaCompiler, RandomTextsHaveTheSchemasShape) {
  const char* schema = R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 8},
      "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
      "score": {"type": "number"},
      "nested": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"ok": {"type": "boolean"}},
                 "required": ["ok"]}]}
    },
    "required": ["name", "tags", "nested"]
  })";
  const JsonGrammar g = compile(schema);
  std::mt19937 rng(99);
  for (int i = 0; i < 300; ++i) {
    std::string text;
    ASSERT_TRUE(testing::random_text(g, rng, 30, text)) << "dead end after: " << text;
    const auto v = nlohmann::json::parse(text);
    ASSERT_TRUE(v.is_object()) << text;
    ASSERT_TRUE(v.contains("name") && v["name"].is_string()) << text;
    EXPECT_LE(v["name"].get<std::string>().size(), 8u * 4) << text;
    ASSERT_TRUE(v.contains("tags") && v["tags"].is_array()) << text;
    EXPECT_GE(v["tags"].size(), 1u);
    EXPECT_LE(v["tags"].size(), 3u);
    for (const auto& t : v["tags"]) EXPECT_TRUE(t == "a" || t == "b" || t == "c") << text;
    if (v.contains("score")) EXPECT_TRUE(v["score"].is_number()) << text;
    ASSERT_TRUE(v.contains("nested")) << text;
    EXPECT_TRUE(v["nested"].is_null() || (v["nested"].is_object() && v["nested"]["ok"].is_boolean())) << text;
    for (const auto& [key, value] : v.items())
      EXPECT_TRUE(key == "name" || key == "tags" || key == "score" || key == "nested") << text;
  }
}

}  // namespace
}  // namespace moeserve::structured
