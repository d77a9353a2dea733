#include "server/completion_request.h"

#include <fmt/format.h>

#include "server/api_error.h"
#include "server/json_fields.h"

namespace moeserve::server {

using nlohmann::json;

namespace {
std::vector<CompletionPrompt> parse_prompts(const JsonFields& f, const RequestLimits& limits) {
  const json* prompt = f.get("prompt");
  if (!prompt) throw_bad_request("`prompt` is required", "prompt");
  std::vector<CompletionPrompt> prompts;
  auto check_ids = [&](const std::vector<int32_t>& ids, const std::string& param) {
    if (ids.empty()) throw_bad_request(fmt::format("`{}` must not be empty", param), param);
    for (int32_t id : ids)
      if (limits.vocab_size > 0 && id >= limits.vocab_size)
        throw_bad_request(fmt::format("`{}`: token id {} is out of vocabulary (size {})", param, id,
                                      limits.vocab_size),
                          "prompt");
  };
  if (prompt->is_string()) {
    prompts.push_back({prompt->get<std::string>(), {}});
  } else if (prompt->is_array()) {
    if (prompt->empty()) throw_bad_request("`prompt` must not be empty", "prompt");
    const json& first = (*prompt)[0];
    if (first.is_number_integer()) {
      CompletionPrompt p;
      p.token_ids = read_token_ids(*prompt, "prompt");
      check_ids(p.token_ids, "prompt");
      prompts.push_back(std::move(p));
    } else {
      for (size_t i = 0; i < prompt->size(); ++i) {
        const json& item = (*prompt)[i];
        const std::string param = fmt::format("prompt[{}]", i);
        if (item.is_string()) {
          prompts.push_back({item.get<std::string>(), {}});
        } else if (item.is_array()) {
          CompletionPrompt p;
          p.token_ids = read_token_ids(item, param);
          check_ids(p.token_ids, param);
          prompts.push_back(std::move(p));
        } else {
          throw_bad_request(fmt::format("`{}` must be a string or a list of token ids, got {}", param,
                                        json_type_name(item)),
                            "prompt");
        }
      }
    }
  } else {
    throw_bad_request(fmt::format("`prompt` must be a string, a list of strings or token ids, got {}",
                                  json_type_name(*prompt)),
                      "prompt");
  }
  return prompts;
}
}  // namespace

CompletionRequest parse_completion_request(const json& body,
                                           const std::vector<std::string>& served_names,
                                           const RequestLimits& limits,
                                           const SamplingDefaults& sampling_defaults) {
  JsonFields f(body);
  CompletionRequest r;
  r.model = resolve_model(f, served_names);
  r.prompts = parse_prompts(f, limits);
  if (auto v = f.boolean("add_special_tokens")) r.add_special_tokens = *v;
  r.generation = parse_generation_options(f, limits, Endpoint::Completions, sampling_defaults);
  if (int64_t(r.prompts.size()) * r.generation.n > limits.max_choices)
    throw_bad_request(fmt::format("{} prompts x n={} makes more choices than one request may have ({})",
                                  r.prompts.size(), r.generation.n, limits.max_choices),
                      "prompt");
  return r;
}

}  // namespace moeserve::server
