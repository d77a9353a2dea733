// Helpers for the streaming-parser tests: the ways one text is cut into pushes.
#pragma once
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "text/output_parser.h"

namespace moeserve::text::testutil {

// Every way the tests feed `text` to a streaming parser:
//   - one push (the whole text) and no push at all of an empty text,
//   - two pushes, cut at every byte position,
//   - one byte per push,
//   - for each seed, random chunks of 1..16 bytes (tokens and speculative bursts),
//     with an empty push thrown in now and then.
inline std::vector<std::vector<std::string>> all_chunkings(std::string_view text, int seeds) {
  std::vector<std::vector<std::string>> out;
  out.push_back({std::string(text)});
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    out.push_back({std::string(text.substr(0, cut)), std::string(text.substr(cut))});
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  out.push_back(std::move(bytes));
  for (int seed = 0; seed < seeds; ++seed) {
    std::mt19937 rng(static_cast<unsigned>(seed) * 7919u + 17u);
    std::vector<std::string> chunks;
    std::size_t pos = 0;
    while (pos < text.size()) {
      if (rng() % 11 == 0) chunks.emplace_back();
      const std::size_t len = 1 + rng() % 16;
      chunks.emplace_back(text.substr(pos, len));
      pos += len;
    }
    out.push_back(std::move(chunks));
  }
  return out;
}

inline std::string describe(const std::vector<std::string>& chunks) {
  std::string s = "[";
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    if (i) s += ", ";
    s += testing::PrintToString(chunks[i]);
  }
  return s + "]";
}

// Deterministic ids ("call_0", "call_1", ...) so that two runs compare equal.
inline ToolParser::IdGenerator counting_ids() {
  return [n = 0]() mutable { return "call_" + std::to_string(n++); };
}

// The assistant message as an OpenAI client assembles it from streamed deltas.
struct Message {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
  bool operator==(const Message&) const = default;
};

inline std::ostream& operator<<(std::ostream& os, const Message& m) {
  os << "{reasoning=" << testing::PrintToString(m.reasoning) << ", content=" << testing::PrintToString(m.content)
     << ", tool_calls=[";
  for (const ToolCall& c : m.tool_calls) os << c.to_json().dump() << " ";
  return os << "]}";
}

// Applies streamed tool-call deltas the way a client does, checking their OpenAI shape:
// a call starts with a header (index = the next index, id, name, empty arguments), then
// only argument fragments for the newest call follow.
inline void apply_tool_call_delta(const ToolCallDelta& d, std::vector<ToolCall>& calls) {
  const nlohmann::json j = d.to_json();
  if (d.is_header()) {
    EXPECT_EQ(d.index, static_cast<int>(calls.size())) << j.dump();
    EXPECT_EQ(j.value("type", ""), "function") << j.dump();
    EXPECT_FALSE(d.name.empty()) << j.dump();
    EXPECT_EQ(d.arguments, "") << j.dump();
    calls.push_back({d.id, d.name, ""});
    return;
  }
  EXPECT_FALSE(j.contains("id")) << j.dump();
  EXPECT_FALSE(j["function"].contains("name")) << j.dump();
  ASSERT_EQ(d.index + 1, static_cast<int>(calls.size())) << j.dump();
  calls.back().arguments += d.arguments;
}

inline void apply(const OutputParser::Delta& d, Message& m) {
  m.reasoning += d.reasoning;
  m.content += d.content;
  for (const ToolCallDelta& t : d.tool_calls) apply_tool_call_delta(t, m.tool_calls);
}

inline Message from_result(const OutputParser::Result& r) {
  return {r.reasoning_content, r.content, r.tool_calls};
}

struct OutputSetup {
  std::string reasoning_parser = "none";
  std::string tool_parser = "none";
  nlohmann::json tools;
  bool prompt_ends_in_think = false;
};

// Streams `chunks` through a fresh OutputParser; also checks that the parser's own
// aggregate equals what the client assembled.
inline Message stream(const OutputSetup& s, const std::vector<std::string>& chunks) {
  OutputParser parser(s.reasoning_parser, s.tool_parser, s.tools, s.prompt_ends_in_think, counting_ids());
  Message m;
  for (const std::string& c : chunks) apply(parser.push(c), m);
  apply(parser.finish(), m);
  EXPECT_EQ(from_result(parser.result()), m);
  return m;
}

inline Message one_shot(const OutputSetup& s, std::string_view text) {
  return stream(s, {std::string(text)});
}

// Every chunking of `text` gives the one-shot message.
inline void expect_split_invariant(const OutputSetup& s, std::string_view text, int seeds = 12) {
  const Message expected = one_shot(s, text);
  for (const std::vector<std::string>& chunks : all_chunkings(text, seeds)) {
    const Message got = stream(s, chunks);
    ASSERT_EQ(got, expected) << "text=" << testing::PrintToString(std::string(text)) << "\nchunks=" << describe(chunks);
  }
}

}  // namespace moeserve::text::testutil
