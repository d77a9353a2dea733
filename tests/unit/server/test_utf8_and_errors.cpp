#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/utf8.h"

using namespace moeserve::server;

TEST(Utf8, AcceptsWellFormedText) {
  EXPECT_FALSE(find_invalid_utf8(""));
  EXPECT_FALSE(find_invalid_utf8("plain ascii"));
  EXPECT_FALSE(find_invalid_utf8("Привет, 你好! \xF0\x9F\x98\x80"));  // 2, 3 and 4-byte forms
  EXPECT_FALSE(find_invalid_utf8("\xEF\xBF\xBD\xF4\x8F\xBF\xBF"));    // U+FFFD, U+10FFFF
}

TEST(Utf8, ReportsTheOffsetOfTheFirstBadByte) {
  EXPECT_EQ(find_invalid_utf8("ab\xFF"), 2u);              // never valid
  EXPECT_EQ(find_invalid_utf8("a\xC0\xAF"), 1u);           // overlong '/'
  EXPECT_EQ(find_invalid_utf8("\xE0\x80\xAF"), 0u);        // overlong 3-byte
  EXPECT_EQ(find_invalid_utf8("xy\xED\xA0\x80"), 2u);      // surrogate U+D800
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);    // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("ok\xE4\xBD"), 2u);          // truncated
  EXPECT_EQ(find_invalid_utf8("\x80"), 0u);                // stray continuation
  EXPECT_EQ(find_invalid_utf8("\xC3\x28"), 0u);            // bad continuation
}

TEST(ApiError, SerialisesLikeVllm) {
  ApiError e(404, "The model `x` does not exist.", "model");
  const auto j = e.to_json();
  EXPECT_EQ(j["error"]["message"], "The model `x` does not exist.");
  EXPECT_EQ(j["error"]["type"], "NotFoundError");
  EXPECT_EQ(j["error"]["param"], "model");
  EXPECT_EQ(j["error"]["code"], 404);
  ApiError bad(400, "boom");
  EXPECT_TRUE(bad.to_json()["error"]["param"].is_null());
  EXPECT_EQ(bad.to_json()["error"]["type"], "BadRequestError");
  EXPECT_EQ(error_type_for_status(413), "RequestEntityTooLargeError");
  EXPECT_EQ(error_type_for_status(500), "InternalServerError");
}
