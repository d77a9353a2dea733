#include "server/choice_decoder.h"

#include "server/utf8.h"

namespace moeserve::server {

using runtime::FinishReason;

ChoiceDecoder::ChoiceDecoder(const text::Tokenizer& tokenizer, ChoiceDecoderOptions options)
    : options_(std::move(options)),
      detokenizer_(tokenizer, options_.skip_special_tokens),
      stops_(options_.stop, options_.include_stop_str_in_output) {
  if (options_.parse_output) {
    parser_.emplace(options_.reasoning_parser, options_.tool_parser, options_.tools,
                    options_.prompt_ends_in_think, options_.tool_call_ids);
    if (!options_.parser_prefix.empty()) {
      // Forced by the prompt; anything the parser would emit for it is not new output.
      parser_->push(options_.parser_prefix);
    }
  }
}

void ChoiceDecoder::release(std::string piece, Update& update) {
  if (piece.empty()) return;
  text_ += piece;
  if (parser_) {
    auto d = parser_->push(piece);
    update.parsed.reasoning += d.reasoning;
    update.parsed.content += d.content;
    for (auto& call : d.tool_calls) update.parsed.tool_calls.push_back(std::move(call));
  }
  update.text += piece;
}

ChoiceDecoder::Update ChoiceDecoder::consume(const runtime::RequestOutput& output) {
  Update update;
  if (finished_) return update;
  prompt_tokens_ = output.num_prompt_tokens;
  if (!output.prompt_logprobs.empty() && prompt_logprobs_.empty())
    prompt_logprobs_ = output.prompt_logprobs;

  if (options_.discard_generated) {
    runtime::RequestOutput prompt_only = output;
    prompt_only.finish = output.finish == FinishReason::Abort ? FinishReason::Abort : FinishReason::Length;
    prompt_only.stop_token.reset();
    if (output.finish != FinishReason::None || !output.new_tokens.empty()) finish(prompt_only, update);
    return update;
  }
  for (size_t i = 0; i < output.new_tokens.size(); ++i) {
    const int32_t id = output.new_tokens[i];
    ++completion_tokens_;
    if (i < output.logprobs.size()) {
      logprobs_.push_back(output.logprobs[i]);
      update.logprobs.push_back(output.logprobs[i]);
      text_offsets_.push_back(int(raw_chars_));
      update.text_offsets.push_back(int(raw_chars_));
    }
    std::string piece = detokenizer_.push(id);
    raw_chars_ += utf8_length(piece);
    auto r = stops_.feed(piece);
    release(std::move(r.text), update);
    if (r.stopped) {
      stop_string_ = std::move(r.stopped);
      runtime::RequestOutput stopped = output;
      stopped.finish = FinishReason::Stop;
      finish(stopped, update);
      return update;
    }
  }
  if (output.finish != FinishReason::None) finish(output, update);
  return update;
}

void ChoiceDecoder::finish(const runtime::RequestOutput& output, Update& update) {
  if (!stop_string_) {
    // Flush the detokenizer's unfinished character, then what the stop matcher held back.
    auto r = stops_.feed(detokenizer_.flush());
    release(std::move(r.text), update);
    if (r.stopped) stop_string_ = std::move(r.stopped);
    else release(stops_.flush(), update);
  }
  if (parser_) {
    auto d = parser_->finish();
    update.parsed.reasoning += d.reasoning;
    update.parsed.content += d.content;
    for (auto& call : d.tool_calls) update.parsed.tool_calls.push_back(std::move(call));
  }
  engine_finish_ = stop_string_ ? FinishReason::Stop : output.finish;
  stop_token_ = output.stop_token;
  error_ = output.error;
  finished_ = true;
  update.finished = true;
}

std::string ChoiceDecoder::finish_reason() const {
  if (parser_ && options_.tool_calls_finish_reason && engine_finish_ != FinishReason::Abort &&
      parser_->result().finished_with_tool_calls())
    return "tool_calls";
  switch (engine_finish_) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    case FinishReason::None: break;
  }
  return "stop";
}

nlohmann::json ChoiceDecoder::stop_reason() const {
  if (stop_string_) return *stop_string_;
  if (engine_finish_ == FinishReason::Stop && stop_token_ &&
      !options_.eos_token_ids.count(*stop_token_))
    return *stop_token_;
  return nullptr;
}

const text::OutputParser::Result* ChoiceDecoder::parsed() const {
  return parser_ ? &parser_->result() : nullptr;
}

}  // namespace moeserve::server
