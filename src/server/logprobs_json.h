// Log-probabilities in the OpenAI response shapes.
//   chat:        choice.logprobs = {"content": [{"token", "logprob", "bytes",
//                                    "top_logprobs": [{"token", "logprob", "bytes"}]}]}
//   completions: choice.logprobs = {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
//   prompt_logprobs (vLLM): [null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]
// A token's text is its decoded string (U+FFFD where it holds part of a character); `bytes`
// are its raw bytes, which concatenate to the exact output. -inf is sent as -9999.0 (JSON
// has no infinity), as vLLM does.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/request_output.h"
#include "text/tokenizer.h"

namespace moeserve::server {

class LogprobFormatter {
 public:
  explicit LogprobFormatter(const text::Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  std::string token_text(int32_t id) const;
  std::vector<uint8_t> token_bytes(int32_t id) const;

  // Entries of chat's logprobs.content.
  nlohmann::json chat_content(std::span<const runtime::TokenLogprob> logprobs) const;

  // Completions' logprobs object. `prompt` (echo) prepends the prompt tokens: their
  // logprobs (null for the first) and text offsets starting at 0; the generated tokens'
  // offsets are shifted by `generated_offset_base`.
  nlohmann::json completion(std::span<const runtime::TokenLogprob> logprobs,
                            std::span<const int> text_offsets, int generated_offset_base) const;
  nlohmann::json completion_with_prompt(std::span<const int32_t> prompt_tokens,
                                        std::span<const std::optional<runtime::TokenLogprob>> prompt_logprobs,
                                        std::span<const runtime::TokenLogprob> logprobs,
                                        std::span<const int> text_offsets) const;

  // vLLM's prompt_logprobs list.
  nlohmann::json prompt_logprobs(
      std::span<const std::optional<runtime::TokenLogprob>> logprobs) const;

 private:
  const text::Tokenizer& tokenizer_;
};

// -inf and NaN as -9999.0.
double json_logprob(float logprob);

}  // namespace moeserve::server
