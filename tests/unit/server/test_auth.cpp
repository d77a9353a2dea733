#include <gtest/gtest.h>

#include "server/auth.h"

using moeserve::server::ApiKeyAuth;

TEST(ApiKeyAuth, BearerTokens) {
  ApiKeyAuth auth({"sk-secret"});
  EXPECT_TRUE(auth.enabled());
  EXPECT_TRUE(auth.accepts("Bearer sk-secret"));
  EXPECT_TRUE(auth.accepts("bearer sk-secret"));
  EXPECT_FALSE(auth.accepts("Bearer sk-secre"));
  EXPECT_FALSE(auth.accepts("Bearer sk-secret2"));
  EXPECT_FALSE(auth.accepts("sk-secret"));
  EXPECT_FALSE(auth.accepts(""));
  EXPECT_TRUE(ApiKeyAuth({}).accepts(""));
}

TEST(ApiKeyAuth, OnlyApiRoutesNeedAKey) {
  EXPECT_TRUE(ApiKeyAuth::route_requires_key("/v1/chat/completions"));
  EXPECT_TRUE(ApiKeyAuth::route_requires_key("/v1/models"));
  EXPECT_TRUE(ApiKeyAuth::route_requires_key("/tokenize"));
  EXPECT_FALSE(ApiKeyAuth::route_requires_key("/health"));
  EXPECT_FALSE(ApiKeyAuth::route_requires_key("/metrics"));
  EXPECT_FALSE(ApiKeyAuth::route_requires_key("/v1x"));
}
