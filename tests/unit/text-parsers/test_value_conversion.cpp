// Typing of XML-style argument values: Python literals (checked against Python's own
// ast.literal_eval through python_literal_cases.json), JSON-schema types, and the
// per-type conversion rules.
#include <fstream>

#include <gtest/gtest.h>

#include "core/error.h"
#include "text/tool_parser_python_literal.h"
#include "text/tool_parser_schema.h"

namespace moeserve::text {
namespace {

using Json = nlohmann::ordered_json;

Json load_json(const std::string& relative) {
  const std::string path = std::string(MOESERVE_SOURCE_DIR) + "/" + relative;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return Json::parse(in);
}

TEST(PythonLiteral, MatchesPythonAstLiteralEval) {
  const Json cases = load_json("tests/unit/text-parsers/python_literal_cases.json")["cases"];
  ASSERT_GT(cases.size(), 80u);
  for (const Json& c : cases) {
    const std::string input = c["input"];
    const std::optional<Json> got = parse_python_literal(input);
    if (c["json"].is_null()) {
      EXPECT_FALSE(got.has_value()) << "input " << testing::PrintToString(input) << " gave " << got->dump();
      continue;
    }
    const Json expected = Json::parse(c["json"].get<std::string>());
    ASSERT_TRUE(got.has_value()) << "input " << testing::PrintToString(input) << " expected " << expected.dump();
    EXPECT_EQ(*got, expected) << "input " << testing::PrintToString(input);
    EXPECT_EQ(got->dump(), expected.dump()) << "input " << testing::PrintToString(input);  // key order too
  }
}

// Where moeserve deliberately differs from ast.literal_eval.
TEST(PythonLiteral, DocumentedDifferences) {
  // JSON spellings are accepted as well (Python rejects them).
  EXPECT_EQ(parse_python_literal("{'a': true, 'b': null, 'c': false}"),
            Json::parse(R"({"a": true, "b": null, "c": false})"));
  // Integers wider than 64 bits become floats.
  const std::optional<Json> big = parse_python_literal("123456789012345678901234567890");
  ASSERT_TRUE(big.has_value());
  EXPECT_TRUE(big->is_number_float());
  EXPECT_DOUBLE_EQ(big->get<double>(), 1.2345678901234568e29);
  // \N{NAME} needs the Unicode name table: not a literal here.
  EXPECT_FALSE(parse_python_literal("'\\N{BULLET}'").has_value());
  // Nesting is capped at 64 levels (no stack exhaustion on hostile input).
  EXPECT_TRUE(parse_python_literal(std::string(60, '[') + std::string(60, ']')).has_value());
  EXPECT_FALSE(parse_python_literal(std::string(100000, '[') + std::string(100000, ']')).has_value());
  EXPECT_FALSE(parse_python_literal(std::string(100000, '(')).has_value());
  // Lone surrogates have no UTF-8 form.
  EXPECT_FALSE(parse_python_literal("'\\ud800'").has_value());
}

TEST(ToolSchemas, ParamTypeFromSchema) {
  auto type = [](const char* schema) { return param_type_from_schema(nlohmann::json::parse(schema)); };
  EXPECT_EQ(type(R"({"type": "integer"})").kind, ParamKind::kInteger);
  EXPECT_EQ(type(R"({"type": "int32"})").kind, ParamKind::kInteger);
  EXPECT_EQ(type(R"({"type": "number"})").kind, ParamKind::kNumber);
  EXPECT_EQ(type(R"({"type": "float"})").kind, ParamKind::kNumber);
  EXPECT_EQ(type(R"({"type": "boolean"})").kind, ParamKind::kBoolean);
  EXPECT_EQ(type(R"({"type": "object"})").kind, ParamKind::kContainer);
  EXPECT_EQ(type(R"({"type": "array"})").kind, ParamKind::kContainer);
  EXPECT_EQ(type(R"({"type": "dict[str, int]"})").kind, ParamKind::kContainer);
  EXPECT_EQ(type(R"({"type": "String"})").kind, ParamKind::kString);
  EXPECT_EQ(type(R"({"type": "tensor"})").kind, ParamKind::kOther);
  EXPECT_EQ(type(R"({"description": "no type"})").kind, ParamKind::kString);
  EXPECT_EQ(type(R"("not an object")").kind, ParamKind::kString);

  const ParamType list = type(R"({"type": ["null", "integer"]})");
  EXPECT_EQ(list.kind, ParamKind::kInteger);
  EXPECT_TRUE(list.nullable);
  const ParamType any = type(R"({"anyOf": [{"type": "string"}, {"type": "null"}]})");
  EXPECT_EQ(any.kind, ParamKind::kString);
  EXPECT_TRUE(any.nullable);
  const ParamType one = type(R"({"oneOf": [{"type": "number"}, {"type": "string"}]})");
  EXPECT_EQ(one.kind, ParamKind::kNumber);
  EXPECT_FALSE(one.nullable);
  EXPECT_EQ(type(R"({"type": "null"})").kind, ParamKind::kNull);
  EXPECT_EQ(type(R"({"enum": ["a", "b"]})").kind, ParamKind::kString);
  EXPECT_EQ(type(R"({"enum": [1, 2]})").kind, ParamKind::kOther);
  EXPECT_TRUE(type(R"({"enum": ["a", null]})").nullable);
}

Json convert(std::string_view text, const char* schema) {
  const ParamType t = param_type_from_schema(nlohmann::json::parse(schema));
  return convert_param_value(text, &t);
}

TEST(ConvertParamValue, ByDeclaredType) {
  // Undeclared: the text itself.
  EXPECT_EQ(convert_param_value("42", nullptr), Json("42"));
  // Strings stay verbatim, also when they look like something else.
  EXPECT_EQ(convert("12345", R"({"type": "string"})"), Json("12345"));
  EXPECT_EQ(convert("None", R"({"type": "string"})"), Json("None"));
  EXPECT_EQ(convert(" padded \n", R"({"type": "string"})"), Json(" padded \n"));
  // Nullable strings map null / None to null.
  EXPECT_EQ(convert("None", R"({"type": ["string", "null"]})"), Json(nullptr));
  EXPECT_EQ(convert("null", R"({"anyOf": [{"type": "string"}, {"type": "null"}]})"), Json(nullptr));
  // Integers: Python int() syntax.
  EXPECT_EQ(convert("42", R"({"type": "integer"})"), Json(42));
  EXPECT_EQ(convert(" -7 ", R"({"type": "integer"})"), Json(-7));
  EXPECT_EQ(convert("1_000", R"({"type": "integer"})"), Json(1000));
  EXPECT_EQ(convert("18446744073709551615", R"({"type": "integer"})"), Json(18446744073709551615ull));
  EXPECT_EQ(convert("3.0", R"({"type": "integer"})"), Json("3.0"));
  EXPECT_EQ(convert("twelve", R"({"type": "integer"})"), Json("twelve"));
  EXPECT_EQ(convert("None", R"({"type": "integer"})"), Json(nullptr));
  EXPECT_EQ(convert("99999999999999999999999", R"({"type": "integer"})"), Json("99999999999999999999999"));
  // Numbers: Python float(); integral values become integers.
  EXPECT_EQ(convert("0.75", R"({"type": "number"})"), Json(0.75));
  EXPECT_TRUE(convert("2.0", R"({"type": "number"})").is_number_integer());
  EXPECT_EQ(convert("2.0", R"({"type": "number"})"), Json(2));
  EXPECT_EQ(convert("1e3", R"({"type": "number"})"), Json(1000));
  EXPECT_EQ(convert("-1.5e-3", R"({"type": "number"})"), Json(-0.0015));
  EXPECT_EQ(convert("inf", R"({"type": "number"})"), Json("inf"));
  EXPECT_EQ(convert("nan", R"({"type": "number"})"), Json("nan"));
  EXPECT_EQ(convert("1e999", R"({"type": "number"})"), Json("1e999"));
  EXPECT_EQ(convert("1.2.3", R"({"type": "number"})"), Json("1.2.3"));
  // Booleans: true/false in any case; anything else stays text.
  EXPECT_EQ(convert("True", R"({"type": "boolean"})"), Json(true));
  EXPECT_EQ(convert("false", R"({"type": "boolean"})"), Json(false));
  EXPECT_EQ(convert("FALSE", R"({"type": "boolean"})"), Json(false));
  EXPECT_EQ(convert("yes", R"({"type": "boolean"})"), Json("yes"));
  // Containers: JSON, then a Python literal, then a JSON string holding a Python repr.
  EXPECT_EQ(convert(R"({"a": [1, 2], "b": null})", R"({"type": "object"})"), Json::parse(R"({"a": [1, 2], "b": null})"));
  EXPECT_EQ(convert("{'a': True, 'b': None, 'c': (1, 2)}", R"({"type": "object"})"),
            Json::parse(R"({"a": true, "b": null, "c": [1, 2]})"));
  EXPECT_EQ(convert(R"("{'k': 'v'}")", R"({"type": "object"})"), Json::parse(R"({"k": "v"})"));
  EXPECT_EQ(convert("[1, 'two', 3.5]", R"({"type": "array"})"), Json::parse(R"([1, "two", 3.5])"));
  EXPECT_EQ(convert("{a: 1}", R"({"type": "object"})"), Json("{a: 1}"));
  EXPECT_EQ(convert("None", R"({"type": "object"})"), Json(nullptr));
  // Key order of an object argument is kept.
  EXPECT_EQ(convert(R"({"z": 1, "a": 2})", R"({"type": "object"})").dump(), R"({"z":1,"a":2})");
  // Other type names: a Python literal, else the text.
  EXPECT_EQ(convert("[1, 2]", R"({"type": "tensor"})"), Json::parse("[1, 2]"));
  EXPECT_EQ(convert("hello", R"({"type": "tensor"})"), Json("hello"));
  EXPECT_EQ(convert("7", R"({"enum": [1, 7]})"), Json(7));
  EXPECT_EQ(convert("None", R"({"type": "null"})"), Json(nullptr));
}

TEST(ToolSchemas, FromToolsJson) {
  const ToolSchemas schemas = ToolSchemas::from_json(nlohmann::json::parse(R"([
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}}}},
    {"name": "bare", "parameters": {"properties": {"b": {"type": "boolean"}}}},
    {"type": "function", "function": {"name": "noparams"}}
  ])"));
  ASSERT_NE(schemas.find("f", "n"), nullptr);
  EXPECT_EQ(schemas.find("f", "n")->kind, ParamKind::kInteger);
  EXPECT_EQ(schemas.find("f", "s")->kind, ParamKind::kString);
  EXPECT_EQ(schemas.find("bare", "b")->kind, ParamKind::kBoolean);
  EXPECT_EQ(schemas.find("f", "missing"), nullptr);
  EXPECT_EQ(schemas.find("noparams", "x"), nullptr);
  EXPECT_EQ(schemas.find("unknown", "n"), nullptr);
  EXPECT_NO_THROW(ToolSchemas::from_json(nullptr));
  EXPECT_NO_THROW(ToolSchemas::from_json(nlohmann::json::array()));
}

TEST(ToolSchemas, MalformedToolsNameTheField) {
  auto message = [](const char* tools) {
    try {
      ToolSchemas::from_json(nlohmann::json::parse(tools));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(R"({"name": "f"})").find("tools: expected an array"), std::string::npos);
  EXPECT_NE(message(R"([42])").find("tools[0]"), std::string::npos);
  EXPECT_NE(message(R"([{"type": "function", "function": {"parameters": {}}}])").find("tools[0].function.name"),
            std::string::npos);
  EXPECT_NE(message(R"([{"function": {"name": "f"}}, {"function": {"name": "g", "parameters": []}}])")
                .find("tools[1].function.parameters"),
            std::string::npos);
  EXPECT_NE(message(R"([{"function": {"name": "f", "parameters": {"properties": 3}}}])")
                .find("tools[0].function.parameters.properties"),
            std::string::npos);
}

}  // namespace
}  // namespace moeserve::text
