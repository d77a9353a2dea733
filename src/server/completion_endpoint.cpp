// POST /v1/completions: validate, tokenize each prompt, submit prompts x n engine requests,
// respond (openai_respond.cpp).
#include <fmt/format.h>

#include "server/api_error.h"
#include "server/completion_request.h"
#include "server/openai_server.h"

namespace moeserve::server {

using nlohmann::json;

void OpenAiServer::handle_completions(const httplib::Request& req, httplib::Response& res) {
  const auto arrival = GenerationSession::Clock::now();
  const ModelServices& svc = services();
  const json body = parse_body(req);
  CompletionRequest r =
      parse_completion_request(body, config_.served_model_names, config_.limits, config_.sampling_defaults);
  auto& gen = r.generation;
  gen.sampling.constraint = structured_->factory(gen.response_format, req.body, std::nullopt);

  CompletionResponseOptions options;
  options.logprobs = gen.sampling.logprobs >= 0;
  options.prompt_logprobs = gen.sampling.prompt_logprobs >= 0;
  options.echo = gen.echo;
  // Echoed prompts with logprobs need the prompt's logprobs from the engine.
  if (gen.echo && gen.sampling.logprobs >= 0)
    gen.sampling.prompt_logprobs = std::max(gen.sampling.prompt_logprobs, gen.sampling.logprobs);

  add_model_stop_tokens(gen.sampling, svc);

  ChoiceDecoderOptions decoder;
  decoder.skip_special_tokens = gen.skip_special_tokens;
  decoder.stop = gen.stop;
  decoder.include_stop_str_in_output = gen.include_stop_str_in_output;
  decoder.eos_token_ids = svc.eos_token_ids;
  decoder.discard_generated = gen.prompt_only;

  std::vector<ChoiceSpec> choices;
  for (size_t p = 0; p < r.prompts.size(); ++p) {
    auto& prompt = r.prompts[p];
    const std::string param = r.prompts.size() == 1 ? "prompt" : fmt::format("prompt[{}]", p);
    if (prompt.text) {
      if (prompt.text->empty()) throw ApiError(400, fmt::format("`{}` must not be empty", param), "prompt");
      try {
        prompt.token_ids = svc.tokenizer->encode(*prompt.text, r.add_special_tokens);
      } catch (const Error& e) {
        throw ApiError(400, fmt::format("Cannot tokenize `{}`: {}", param, e.what()), "prompt");
      }
      if (prompt.token_ids.empty())
        throw ApiError(400, fmt::format("`{}` has no tokens", param), "prompt");
    }
    if (gen.echo)
      options.echo_texts.push_back(prompt.text ? *prompt.text
                                               : svc.tokenizer->decode(prompt.token_ids, gen.skip_special_tokens));
    GenerationOptions per_prompt = gen;
    finalize_max_tokens(per_prompt, int(prompt.token_ids.size()), config_.limits, Endpoint::Completions);
    for (int i = 0; i < gen.n; ++i) {
      ChoiceSpec spec{prompt.token_ids, per_prompt.sampling, decoder, int(p)};
      if (gen.sampling.seed) spec.sampling.seed = *gen.sampling.seed + uint64_t(i);
      choices.push_back(std::move(spec));
    }
  }

  auto session = new_session(arrival);
  session->start(std::move(choices));
  auto builder = std::make_shared<CompletionResponseBuilder>(
      ResponseHeader{make_response_id("cmpl-"), unix_time_now(), r.model}, *logprob_formatter_,
      std::move(options));
  respond(res, std::move(session), std::move(builder), gen);
}

}  // namespace moeserve::server
