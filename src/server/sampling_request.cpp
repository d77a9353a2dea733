#include "server/sampling_request.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "server/api_error.h"

namespace moeserve::server {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

void parse_logit_bias(const JsonFields& f, const RequestLimits& limits,
                      runtime::SamplingParams& sp) {
  const auto* bias = f.object("logit_bias");
  if (!bias) return;
  for (const auto& [key, value] : bias->items()) {
    const std::string param = fmt::format("logit_bias[{}]", key);
    // Keys are token ids as strings (JSON object keys are strings).
    int64_t token = -1;
    try {
      size_t used = 0;
      token = std::stoll(key, &used);
      if (used != key.size()) token = -1;
    } catch (const std::exception&) {
      token = -1;
    }
    if (token < 0 || (limits.vocab_size > 0 && token >= limits.vocab_size))
      throw_bad_request(fmt::format("logit_bias key `{}` is not a token id in [0, {})", key,
                                    limits.vocab_size),
                        "logit_bias");
    if (!value.is_number())
      throw_bad_request(fmt::format("`{}` must be a number, got {}", param, json_type_name(value)),
                        "logit_bias");
    const double b = value.get<double>();
    if (!(b >= -100.0 && b <= 100.0))
      throw_bad_request(fmt::format("`{}` must be in [-100, 100], got {}", param, b), "logit_bias");
    sp.logit_bias[int32_t(token)] = float(b);
  }
}
}  // namespace

GenerationOptions parse_generation_options(const JsonFields& f, const RequestLimits& limits,
                                           Endpoint endpoint, const SamplingDefaults& defaults) {
  GenerationOptions o;
  auto& sp = o.sampling;
  if (defaults.temperature) sp.temperature = *defaults.temperature;
  if (defaults.top_p) sp.top_p = *defaults.top_p;
  if (defaults.top_k) sp.top_k = *defaults.top_k;
  if (defaults.min_p) sp.min_p = *defaults.min_p;
  if (defaults.repetition_penalty) sp.repetition_penalty = *defaults.repetition_penalty;
  o.default_max_tokens = defaults.max_tokens;

  if (auto v = f.number("temperature", NumberRange{0.0, kInf})) sp.temperature = *v;
  if (auto v = f.number("top_p", NumberRange{0.0, 1.0, /*min_exclusive=*/true})) sp.top_p = *v;
  if (auto v = f.integer("top_k", -1, INT32_MAX)) sp.top_k = int(*v);
  if (auto v = f.number("min_p", NumberRange{0.0, 1.0})) sp.min_p = *v;
  if (auto v = f.number("presence_penalty", NumberRange{-2.0, 2.0})) sp.presence_penalty = *v;
  if (auto v = f.number("frequency_penalty", NumberRange{-2.0, 2.0})) sp.frequency_penalty = *v;
  if (auto v = f.number("repetition_penalty", NumberRange{0.0, kInf, true}))
    sp.repetition_penalty = *v;
  if (auto v = f.integer("seed")) sp.seed = uint64_t(*v);
  parse_logit_bias(f, limits, sp);

  // max_completion_tokens is the newer name; it wins when both are given.
  std::optional<int64_t> max_tokens;
  if (endpoint == Endpoint::Chat) max_tokens = f.integer("max_completion_tokens", 1, INT32_MAX);
  if (!max_tokens) max_tokens = f.integer("max_tokens", endpoint == Endpoint::Chat ? 1 : 0, INT32_MAX);
  if (max_tokens) o.max_tokens = int(*max_tokens);
  if (auto v = f.integer("min_tokens", 0, INT32_MAX)) sp.min_tokens = int(*v);
  if (auto v = f.boolean("ignore_eos")) sp.ignore_eos = *v;
  if (auto v = f.string_or_strings("stop")) o.stop = *v;
  if (const auto* ids = f.array("stop_token_ids")) {
    sp.stop_token_ids = read_token_ids(*ids, f.param("stop_token_ids"));
    for (int32_t t : sp.stop_token_ids)
      if (limits.vocab_size > 0 && t >= limits.vocab_size)
        throw_bad_request(fmt::format("stop_token_ids: token {} is outside the vocabulary ({})", t,
                                      limits.vocab_size),
                          "stop_token_ids");
  }
  if (auto v = f.boolean("include_stop_str_in_output")) o.include_stop_str_in_output = *v;
  if (auto v = f.boolean("skip_special_tokens")) o.skip_special_tokens = *v;

  if (auto v = f.integer("n", 1, INT32_MAX)) {
    if (*v > limits.max_n)
      throw_bad_request(fmt::format("`n` must be at most {} (--max-n), got {}", limits.max_n, *v), "n");
    o.n = int(*v);
  }
  if (auto v = f.boolean("stream")) o.stream = *v;
  if (const auto* so = f.object("stream_options")) {
    JsonFields sf(*so, "stream_options.");
    if (!o.stream)
      throw_bad_request("`stream_options` can only be given when `stream` is true", "stream_options");
    if (auto v = sf.boolean("include_usage")) o.include_usage = *v;
    if (auto v = sf.boolean("continuous_usage_stats")) o.continuous_usage_stats = *v;
  }

  if (endpoint == Endpoint::Chat) {
    const bool logprobs = f.boolean("logprobs").value_or(false);
    const auto top = f.integer("top_logprobs", 0, limits.max_logprobs);
    if (top && *top > 0 && !logprobs)
      throw_bad_request("`top_logprobs` needs `logprobs` set to true", "top_logprobs");
    if (logprobs) sp.logprobs = int(top.value_or(0));
  } else {
    if (auto v = f.integer("logprobs", 0, limits.max_logprobs)) sp.logprobs = int(*v);
    if (auto v = f.boolean("echo")) o.echo = *v;
    if (auto best_of = f.integer("best_of", 1, INT32_MAX); best_of && *best_of != o.n)
      throw_bad_request("`best_of` different from `n` is not supported", "best_of");
    if (f.has("suffix")) throw_bad_request("`suffix` is not supported", "suffix");
    if (o.max_tokens == 0) {
      if (!o.echo)
        throw_bad_request("`max_tokens` must be >= 1 (0 is allowed only with `echo`)", "max_tokens");
      o.prompt_only = true;
    }
  }
  if (auto v = f.integer("prompt_logprobs", 0, limits.max_logprobs)) sp.prompt_logprobs = int(*v);

  o.response_format = parse_response_format(f);
  return o;
}

void finalize_max_tokens(GenerationOptions& o, int prompt_tokens, const RequestLimits& limits,
                         Endpoint endpoint) {
  const int64_t room = int64_t(limits.max_model_len) - prompt_tokens;
  if (room <= 0)
    throw_bad_request(fmt::format("This model's maximum context length is {} tokens. However, your "
                                  "prompt has {} tokens, which leaves no room for a completion. "
                                  "Please reduce the length of the {}.",
                                  limits.max_model_len, prompt_tokens,
                                  endpoint == Endpoint::Chat ? "messages" : "prompt"),
                      endpoint == Endpoint::Chat ? "messages" : "prompt");
  if (o.prompt_only) {
    o.sampling.max_tokens = 1;
    o.sampling.min_tokens = 0;
  } else if (o.max_tokens) {
    if (int64_t(*o.max_tokens) > room)
      throw_bad_request(
          fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                      "tokens ({} in the {}, {} in the completion). Please reduce the length of the "
                      "{} or completion.",
                      limits.max_model_len, int64_t(prompt_tokens) + *o.max_tokens, prompt_tokens,
                      endpoint == Endpoint::Chat ? "messages" : "prompt", *o.max_tokens,
                      endpoint == Endpoint::Chat ? "messages" : "prompt"),
          endpoint == Endpoint::Chat ? "max_tokens" : "max_tokens");
    o.sampling.max_tokens = *o.max_tokens;
  } else {
    int64_t n = endpoint == Endpoint::Chat ? room : std::min<int64_t>(16, room);
    if (o.default_max_tokens) n = std::min<int64_t>(n, *o.default_max_tokens);
    o.sampling.max_tokens = int(n);
  }
  if (o.sampling.min_tokens > o.sampling.max_tokens)
    throw_bad_request(fmt::format("`min_tokens` ({}) must not exceed max_tokens ({})",
                                  o.sampling.min_tokens, o.sampling.max_tokens),
                      "min_tokens");
}

std::string resolve_model(const JsonFields& f, const std::vector<std::string>& served_names) {
  auto model = f.string("model");
  if (!model) return served_names.front();
  for (const auto& name : served_names)
    if (name == *model) return name;
  throw ApiError(404, fmt::format("The model `{}` does not exist.", *model), "model");
}

}  // namespace moeserve::server
