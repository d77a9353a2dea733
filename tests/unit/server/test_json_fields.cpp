#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/json_fields.h"

using namespace moeserve::server;
using nlohmann::json;

namespace {
// Runs fn and returns the ApiError it throws (fails the test when it throws nothing).
template <typename F>
ApiError error_of(F&& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError thrown";
  return ApiError(0, "");
}
}  // namespace

TEST(JsonFields, NullAndAbsentMeanNotGiven) {
  const json j = {{"a", nullptr}};
  JsonFields f(j);
  EXPECT_FALSE(f.has("a"));
  EXPECT_FALSE(f.has("b"));
  EXPECT_FALSE(f.number("a"));
  EXPECT_FALSE(f.string("b"));
}

TEST(JsonFields, TypeErrorsNameTheField) {
  const json j = {{"temperature", "hot"}, {"n", 1.5}, {"stream", 1}, {"stop", {"a", 3}}};
  JsonFields f(j);
  auto e = error_of([&] { f.number("temperature"); });
  EXPECT_EQ(e.status(), 400);
  EXPECT_EQ(e.param(), "temperature");
  EXPECT_EQ(std::string(e.what()), "`temperature` must be a number, got string");
  EXPECT_EQ(error_of([&] { f.integer("n"); }).param(), "n");
  EXPECT_EQ(std::string(error_of([&] { f.boolean("stream"); }).what()),
            "`stream` must be a boolean, got integer");
  EXPECT_EQ(std::string(error_of([&] { f.string_or_strings("stop"); }).what()),
            "`stop[1]` must be a string, got integer");
}

TEST(JsonFields, RangesAreChecked) {
  const json j = {{"top_p", 0.0}, {"t", -0.5}, {"k", 30}, {"ok", 2.0}};
  JsonFields f(j);
  EXPECT_EQ(std::string(error_of([&] { f.number("top_p", NumberRange{0, 1, true}); }).what()),
            "`top_p` must be in (0, 1], got 0");
  EXPECT_EQ(std::string(error_of([&] {
              f.number("t", NumberRange{0, std::numeric_limits<double>::infinity()});
            }).what()),
            "`t` must be >= 0, got -0.5");
  EXPECT_EQ(std::string(error_of([&] { f.integer("k", 0, 20); }).what()),
            "`k` must be in [0, 20], got 30");
  EXPECT_EQ(f.integer("ok"), 2);  // integral float accepted
}

TEST(JsonFields, NestedPathsPrefixParams) {
  const json j = {{"role", 5}};
  JsonFields f(j, "messages[3].");
  auto e = error_of([&] { f.string("role"); });
  EXPECT_EQ(e.param(), "messages[3].role");
  EXPECT_EQ(std::string(error_of([] { JsonFields g(json::array()); }).what()),
            "the request body must be a JSON object, got array");
}

TEST(JsonFields, TokenIds) {
  EXPECT_EQ(read_token_ids(json::parse("[1, 2, 151643]"), "prompt"),
            (std::vector<int32_t>{1, 2, 151643}));
  EXPECT_EQ(error_of([] { read_token_ids(json::parse("[1, -2]"), "prompt"); }).status(), 400);
  EXPECT_EQ(std::string(error_of([] { read_token_ids(json::parse("[1, \"x\"]"), "prompt"); }).what()),
            "`prompt[1]` must be an integer token id, got string");
  EXPECT_EQ(error_of([] { read_token_ids(json::parse("[4294967296]"), "p"); }).status(), 400);
}
