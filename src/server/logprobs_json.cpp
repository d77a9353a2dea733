#include "server/logprobs_json.h"

#include "server/utf8.h"

#include <cmath>

namespace moeserve::server {

using nlohmann::json;

double json_logprob(float logprob) {
  if (std::isnan(logprob) || std::isinf(logprob)) return -9999.0;
  return double(logprob);
}

std::string LogprobFormatter::token_text(int32_t id) const {
  const int32_t ids[1] = {id};
  return tokenizer_.decode(ids, /*skip_special_tokens=*/false);
}

std::vector<uint8_t> LogprobFormatter::token_bytes(int32_t id) const {
  std::string bytes;
  tokenizer_.append_token_bytes(id, /*skip_special_tokens=*/false, /*first=*/true, bytes);
  return {bytes.begin(), bytes.end()};
}

json LogprobFormatter::chat_content(std::span<const runtime::TokenLogprob> logprobs) const {
  json content = json::array();
  for (const auto& lp : logprobs) {
    json top = json::array();
    for (const auto& [id, value] : lp.top)
      top.push_back({{"token", token_text(id)}, {"logprob", json_logprob(value)},
                     {"bytes", token_bytes(id)}});
    content.push_back({{"token", token_text(lp.token)},
                       {"logprob", json_logprob(lp.logprob)},
                       {"bytes", token_bytes(lp.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return content;
}

namespace {
json top_map(const LogprobFormatter& f, const runtime::TokenLogprob& lp) {
  json top = json::object();
  for (const auto& [id, value] : lp.top) top[f.token_text(id)] = json_logprob(value);
  return top;
}
}  // namespace

json LogprobFormatter::completion(std::span<const runtime::TokenLogprob> logprobs,
                                  std::span<const int> text_offsets,
                                  int generated_offset_base) const {
  json out = {{"tokens", json::array()}, {"token_logprobs", json::array()},
              {"top_logprobs", json::array()}, {"text_offset", json::array()}};
  for (size_t i = 0; i < logprobs.size(); ++i) {
    out["tokens"].push_back(token_text(logprobs[i].token));
    out["token_logprobs"].push_back(json_logprob(logprobs[i].logprob));
    out["top_logprobs"].push_back(top_map(*this, logprobs[i]));
    out["text_offset"].push_back(generated_offset_base + (i < text_offsets.size() ? text_offsets[i] : 0));
  }
  return out;
}

json LogprobFormatter::completion_with_prompt(
    std::span<const int32_t> prompt_tokens,
    std::span<const std::optional<runtime::TokenLogprob>> prompt_logprobs,
    std::span<const runtime::TokenLogprob> logprobs, std::span<const int> text_offsets) const {
  json out = completion({}, {}, 0);
  int offset = 0;
  for (size_t i = 0; i < prompt_tokens.size(); ++i) {
    const std::string t = token_text(prompt_tokens[i]);
    const auto* lp = i < prompt_logprobs.size() && prompt_logprobs[i] ? &*prompt_logprobs[i] : nullptr;
    out["tokens"].push_back(t);
    out["token_logprobs"].push_back(lp ? json(json_logprob(lp->logprob)) : json(nullptr));
    out["top_logprobs"].push_back(lp ? top_map(*this, *lp) : json(nullptr));
    out["text_offset"].push_back(offset);
    offset += int(utf8_length(t));
  }
  const json generated = completion(logprobs, text_offsets, offset);
  for (const auto& [key, values] : generated.items())
    for (const auto& v : values) out[key].push_back(v);
  return out;
}

json LogprobFormatter::prompt_logprobs(
    std::span<const std::optional<runtime::TokenLogprob>> logprobs) const {
  json out = json::array();
  for (size_t i = 0; i < logprobs.size(); ++i) {
    if (!logprobs[i]) {
      out.push_back(nullptr);
      continue;
    }
    const auto& lp = *logprobs[i];
    json entry = json::object();
    // The actual prompt token first, then the top alternatives with their rank (1-based).
    std::optional<int> own_rank;
    for (size_t r = 0; r < lp.top.size(); ++r)
      if (lp.top[r].first == lp.token) own_rank = int(r) + 1;
    entry[std::to_string(lp.token)] = {{"logprob", json_logprob(lp.logprob)},
                                       {"rank", own_rank ? json(*own_rank) : json(nullptr)},
                                       {"decoded_token", token_text(lp.token)}};
    for (size_t r = 0; r < lp.top.size(); ++r) {
      const auto& [id, value] = lp.top[r];
      entry[std::to_string(id)] = {{"logprob", json_logprob(value)},
                                   {"rank", int(r) + 1},
                                   {"decoded_token", token_text(id)}};
    }
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace moeserve::server
