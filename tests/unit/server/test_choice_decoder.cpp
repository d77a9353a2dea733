// The per-choice pipeline on canned token streams: detokenizer, stop strings, reasoning and
// tool-call parsing, token accounting, several tokens per engine output (speculative
// decoding delivers them that way).
#include <gtest/gtest.h>

#include "server/choice_decoder.h"
#include "server/logprobs_json.h"
#include "server/utf8.h"
#include "synthetic_tokenizer.h"

using namespace moeserve;
using namespace moeserve::server;
using moeserve::runtime::FinishReason;
using moeserve::runtime::RequestOutput;

namespace {
const text::Tokenizer& tok() {
  static const text::Tokenizer t = moeserve::server::testing::make_synthetic_tokenizer();
  return t;
}

// Feeds `ids` in outputs of `per_output` tokens, the last one with `finish`; returns the
// concatenated streamed text (or parsed content / reasoning).
struct Fed {
  std::string text, content, reasoning;
  std::vector<text::ToolCallDelta> calls;
  int updates_with_finish = 0;
};
Fed feed(ChoiceDecoder& d, const std::vector<int32_t>& ids, size_t per_output, FinishReason finish) {
  Fed f;
  for (size_t i = 0; i < ids.size(); i += per_output) {
    RequestOutput out;
    out.num_prompt_tokens = 3;
    for (size_t k = i; k < std::min(ids.size(), i + per_output); ++k) out.new_tokens.push_back(ids[k]);
    if (i + per_output >= ids.size()) out.finish = finish;
    auto u = d.consume(out);
    f.text += u.text;
    f.content += u.parsed.content;
    f.reasoning += u.parsed.reasoning;
    for (auto& c : u.parsed.tool_calls) f.calls.push_back(c);
    f.updates_with_finish += u.finished;
  }
  return f;
}
}  // namespace

TEST(ChoiceDecoder, MultiByteCharactersSplitAcrossTokensStreamWhole) {
  // Byte-level tokens: the emoji's 4 bytes are 4 tokens; no chunk may carry half of it.
  const std::string text = "ok 🎉 é";
  const auto ids = tok().encode(text);
  ChoiceDecoderOptions o;
  ChoiceDecoder d(tok(), o);
  std::string streamed;
  for (size_t i = 0; i < ids.size(); ++i) {
    RequestOutput out;
    out.new_tokens = {ids[i]};
    if (i + 1 == ids.size()) out.finish = FinishReason::Length;
    const auto u = d.consume(out);
    EXPECT_FALSE(find_invalid_utf8(u.text)) << "chunk " << i << " holds part of a character";
    streamed += u.text;
  }
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(d.completion_tokens(), int(ids.size()));
  EXPECT_EQ(d.finish_reason(), "length");
}

TEST(ChoiceDecoder, StopStringInsideAMultiTokenOutput) {
  const auto ids = tok().encode("one two STOP three four");
  for (size_t per_output : {1u, 2u, 5u}) {
    ChoiceDecoderOptions o;
    o.stop = {"STOP"};
    ChoiceDecoder d(tok(), o);
    const Fed f = feed(d, ids, per_output, FinishReason::Length);
    EXPECT_EQ(f.text, "one two ") << per_output;
    EXPECT_TRUE(d.finished());
    EXPECT_TRUE(d.hit_stop_string());
    EXPECT_EQ(d.finish_reason(), "stop");
    EXPECT_EQ(d.stop_reason(), "STOP");
    // Tokens up to and including the one that completed the stop string.
    EXPECT_EQ(d.completion_tokens(), int(tok().encode("one two STOP").size())) << per_output;
    EXPECT_EQ(f.updates_with_finish, 1);
  }
}

TEST(ChoiceDecoder, EosIsCountedButNotShownAndStopReasonIsNull) {
  auto ids = tok().encode("Hi you");
  const int32_t im_end = *tok().token_to_id("<|im_end|>");
  ids.push_back(im_end);
  ChoiceDecoderOptions o;
  o.eos_token_ids = {im_end};
  ChoiceDecoder d(tok(), o);
  RequestOutput out;
  out.new_tokens = ids;
  out.finish = FinishReason::Stop;
  out.stop_token = im_end;
  d.consume(out);
  EXPECT_EQ(d.text(), "Hi you");
  EXPECT_EQ(d.completion_tokens(), 3);
  EXPECT_TRUE(d.stop_reason().is_null());
  // A stop token that is not eos is reported by id and stays in the text.
  const int32_t you = tok().encode(" you").at(0);
  ChoiceDecoder d2(tok(), ChoiceDecoderOptions{});
  out.new_tokens = tok().encode("Hi you");
  out.stop_token = you;
  d2.consume(out);
  EXPECT_EQ(d2.text(), "Hi you");
  EXPECT_EQ(d2.stop_reason(), you);
}

TEST(ChoiceDecoder, ReasoningThenToolCallSplitWhateverTheChunking) {
  const std::string output =
      "Let me check.</think>\n\nSure.<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
      "</parameter>\n</function>\n</tool_call>";
  const auto ids = tok().encode(output);
  const nlohmann::json tools = nlohmann::json::parse(
      R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");
  for (size_t per_output : {1u, 3u, 64u}) {
    ChoiceDecoderOptions o;
    o.parse_output = true;
    o.reasoning_parser = "qwen3";
    o.tool_parser = "qwen3_coder";
    o.tools = tools;
    o.prompt_ends_in_think = true;
    o.tool_call_ids = [] { return std::string("call_fixed"); };
    ChoiceDecoder d(tok(), o);
    const Fed f = feed(d, ids, per_output, FinishReason::Stop);
    EXPECT_EQ(f.reasoning, "Let me check.") << per_output;
    EXPECT_EQ(f.content, "\n\nSure.") << per_output;
    ASSERT_EQ(f.calls.size(), 2u) << per_output;  // header delta, then the arguments
    EXPECT_EQ(f.calls[0].name, "get_weather");
    EXPECT_EQ(f.calls[0].id, "call_fixed");
    EXPECT_EQ(nlohmann::json::parse(f.calls[1].arguments), nlohmann::json({{"city", "Paris"}}));
    EXPECT_EQ(d.finish_reason(), "tool_calls");
    ASSERT_EQ(d.parsed()->tool_calls.size(), 1u);
    EXPECT_EQ(d.text(), output);
  }
}

TEST(ChoiceDecoder, ForcedPrefixIsParsedButNotSent) {
  ChoiceDecoderOptions o;
  o.parse_output = true;
  o.tool_parser = "qwen3_coder";
  o.tools = nlohmann::json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])");
  o.parser_prefix = "<tool_call>\n<function=f>\n";
  o.tool_calls_finish_reason = false;  // a named tool_choice
  ChoiceDecoder d(tok(), o);
  const Fed f = feed(d, tok().encode("<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"), 4,
                     FinishReason::Stop);
  EXPECT_EQ(f.content, "");
  ASSERT_EQ(d.parsed()->tool_calls.size(), 1u);
  EXPECT_EQ(d.parsed()->tool_calls[0].name, "f");
  EXPECT_EQ(d.finish_reason(), "stop");
}

TEST(ChoiceDecoder, AbortKeepsItsErrorAndDiscardModeDropsTokens) {
  ChoiceDecoder d(tok(), ChoiceDecoderOptions{});
  RequestOutput out;
  out.finish = FinishReason::Abort;
  out.error = "forward failed";
  d.consume(out);
  EXPECT_EQ(d.finish_reason(), "abort");
  EXPECT_EQ(d.error(), "forward failed");

  ChoiceDecoderOptions o;
  o.discard_generated = true;
  ChoiceDecoder p(tok(), o);
  RequestOutput scored;
  scored.new_tokens = {5};
  scored.finish = FinishReason::Length;
  scored.prompt_logprobs = {std::nullopt, runtime::TokenLogprob{7, -1.5f, {}}};
  p.consume(scored);
  EXPECT_EQ(p.text(), "");
  EXPECT_EQ(p.completion_tokens(), 0);
  EXPECT_EQ(p.prompt_logprobs().size(), 2u);
  EXPECT_EQ(p.finish_reason(), "length");
}

TEST(LogprobFormatter, BytesConcatenateToTheTextAndInfinityIsFinite) {
  LogprobFormatter f(tok());
  const std::string text = "é🎉";
  const auto ids = tok().encode(text);
  std::vector<runtime::TokenLogprob> lps;
  for (int32_t id : ids) lps.push_back({id, -std::numeric_limits<float>::infinity(), {{id, -0.5f}}});
  const auto content = f.chat_content(lps);
  std::string bytes;
  for (const auto& e : content) {
    for (int b : e["bytes"]) bytes += char(b);
    EXPECT_EQ(e["logprob"], -9999.0);
    EXPECT_EQ(e["top_logprobs"][0]["logprob"], -0.5);
  }
  EXPECT_EQ(bytes, text);
  const auto completion = f.completion(lps, std::vector<int>{0, 0, 1, 1, 1, 1}, 10);
  EXPECT_EQ(completion["text_offset"][2], 11);
  EXPECT_EQ(completion["tokens"].size(), ids.size());
}
