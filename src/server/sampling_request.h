// The request fields that chat and completions share: sampling (temperature, top_p, ...,
// logit_bias, seed), stopping (max_tokens, stop, stop_token_ids, ignore_eos), n, streaming
// options. Validated here with OpenAI/vLLM ranges and mapped onto runtime::SamplingParams.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "runtime/sampling_params.h"
#include "server/json_fields.h"
#include "server/structured_output.h"

namespace moeserve::server {

// Server-wide limits that requests are checked against.
struct RequestLimits {
  int max_model_len = 4096;
  int max_n = 16;           // --max-n
  int max_choices = 256;    // prompts x n of one completions request (the server uses max-num-seqs)
  int max_logprobs = 20;    // OpenAI's top_logprobs maximum; the engine's max_logprobs
  int64_t vocab_size = 0;   // token ids (logit_bias, stop_token_ids, prompts) must be below it
};

// Defaults for sampling fields a request leaves out: the model's generation_config.json
// (vLLM's --generation-config auto). Unset fields keep OpenAI's defaults.
struct SamplingDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::optional<int> max_tokens;  // generation_config's max_new_tokens
  bool empty() const {
    return !temperature && !top_p && !min_p && !repetition_penalty && !top_k && !max_tokens;
  }
};

enum class Endpoint { Chat, Completions };

struct GenerationOptions {
  runtime::SamplingParams sampling;  // max_tokens is set once the prompt length is known
  std::optional<int> max_tokens;     // as requested (max_completion_tokens or max_tokens)
  std::optional<int> default_max_tokens;  // the model's cap when the request sets none
  std::vector<std::string> stop;     // stop strings
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  int n = 1;
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  bool continuous_usage_stats = false;  // stream_options.continuous_usage_stats (vLLM)
  bool echo = false;                    // completions: prompt text before the completion
  // Completions with echo and max_tokens 0 (how lm-eval scores a prompt): the engine
  // generates one token that is thrown away.
  bool prompt_only = false;
  ResponseFormat response_format;  // the endpoint turns it into sampling.constraint
};

GenerationOptions parse_generation_options(const JsonFields& fields, const RequestLimits& limits,
                                           Endpoint endpoint, const SamplingDefaults& defaults = {});

// Picks max_tokens for a prompt of `prompt_tokens` tokens and checks the total against
// max_model_len (400 with vLLM's "maximum context length" message otherwise). Without an
// explicit max_tokens: chat gets the rest of the context, completions get 16 (OpenAI's
// default), capped to the rest of the context.
void finalize_max_tokens(GenerationOptions& options, int prompt_tokens, const RequestLimits& limits,
                         Endpoint endpoint);

// The `model` field against the served names: absent takes the first; unknown is a 404.
std::string resolve_model(const JsonFields& fields, const std::vector<std::string>& served_names);

}  // namespace moeserve::server
