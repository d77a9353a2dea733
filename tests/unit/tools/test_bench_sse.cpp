// SSE parsing: every split of a stream into two or three network chunks gives the same
// events as the whole stream; line-ending variants, comments, multi-line data, BOM.
#include <gtest/gtest.h>

#include "tools/bench_sse.h"

using moeserve::tools::SseEvent;
using moeserve::tools::SseParser;

namespace {

std::vector<SseEvent> parse_in_pieces(const std::string& stream, const std::vector<size_t>& cuts) {
  SseParser p;
  std::vector<SseEvent> out;
  size_t prev = 0;
  for (size_t c : cuts) {
    p.feed(std::string_view(stream).substr(prev, c - prev), out);
    prev = c;
  }
  p.feed(std::string_view(stream).substr(prev), out);
  p.finish(out);
  return out;
}

std::vector<std::string> data_of(const std::vector<SseEvent>& evs) {
  std::vector<std::string> d;
  for (const auto& e : evs) d.push_back(e.data);
  return d;
}

// The kind of stream an OpenAI-compatible server sends, with CRLF and CR line ends mixed in
// and a keep-alive comment.
const std::string kStream =
    "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n"
    ": ping\r\n\r\n"
    "data: {\"choices\":[{\"delta\":{\"content\":\"lo\\n\"}}]}\r\n\r\n"
    "event: usage\rdata: {\"usage\":{\"completion_tokens\":2}}\r\r"
    "data:[DONE]\n\n";
const std::vector<std::string> kExpected = {
    "{\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}",
    "{\"choices\":[{\"delta\":{\"content\":\"lo\\n\"}}]}",
    "{\"usage\":{\"completion_tokens\":2}}",
    "[DONE]",
};

}  // namespace

TEST(SseParser, WholeStream) {
  auto evs = parse_in_pieces(kStream, {});
  EXPECT_EQ(data_of(evs), kExpected);
  ASSERT_EQ(evs.size(), 4u);
  EXPECT_EQ(evs[0].event, "message");
  EXPECT_EQ(evs[2].event, "usage");
  EXPECT_EQ(evs[3].event, "message");  // the event type resets after each dispatch
}

TEST(SseParser, EveryTwoWaySplit) {
  for (size_t cut = 0; cut <= kStream.size(); ++cut)
    ASSERT_EQ(data_of(parse_in_pieces(kStream, {cut})), kExpected) << "split at byte " << cut;
}

TEST(SseParser, EveryThreeWaySplit) {
  for (size_t a = 0; a <= kStream.size(); a += 3)
    for (size_t b = a; b <= kStream.size(); ++b)
      ASSERT_EQ(data_of(parse_in_pieces(kStream, {a, b})), kExpected) << "splits at " << a << ", " << b;
}

TEST(SseParser, ByteByByte) {
  SseParser p;
  std::vector<SseEvent> out;
  for (char c : kStream) p.feed(std::string_view(&c, 1), out);
  EXPECT_EQ(data_of(out), kExpected);
}

TEST(SseParser, MultiLineDataAndFields) {
  auto evs = parse_in_pieces("id: 7\ndata: first\ndata\ndata:  two spaces\nretry: 10\nunknown: x\n\n", {});
  ASSERT_EQ(evs.size(), 1u);
  // "data" without a colon adds an empty line; only one leading space is dropped.
  EXPECT_EQ(evs[0].data, "first\n\n two spaces");
  EXPECT_EQ(evs[0].id, "7");
}

TEST(SseParser, EventWithoutDataIsNotDispatched) {
  auto evs = parse_in_pieces("event: ping\n\n: comment only\n\ndata: x\n\n", {});
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_EQ(evs[0].data, "x");
  EXPECT_EQ(evs[0].event, "message");
}

TEST(SseParser, ByteOrderMarkIsSkippedEvenWhenSplit) {
  const std::string s = "\xEF\xBB\xBF" "data: a\n\n";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    auto evs = parse_in_pieces(s, {cut});
    ASSERT_EQ(evs.size(), 1u) << cut;
    EXPECT_EQ(evs[0].data, "a") << cut;
  }
  // A stream that merely starts like a BOM keeps its bytes.
  auto evs = parse_in_pieces("\xEF" "data: b\n\n", {1});
  EXPECT_TRUE(evs.empty());  // the field name is "\xEF" "data", not "data"
}

TEST(SseParser, UnterminatedLastEventIsDispatchedAtFinish) {
  auto evs = parse_in_pieces("data: 1\n\ndata: [DONE]\n", {});
  EXPECT_EQ(data_of(evs), (std::vector<std::string>{"1", "[DONE]"}));
  evs = parse_in_pieces("data: [DONE]", {4});
  EXPECT_EQ(data_of(evs), (std::vector<std::string>{"[DONE]"}));
}
