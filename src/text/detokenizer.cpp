#include "text/detokenizer.h"

namespace moeserve::text {

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamingDetokenizer::push(int32_t id) {
  bytes_.clear();
  if (!tokenizer_->append_token_bytes(id, skip_special_tokens_, first_, bytes_)) return {};
  first_ = false;
  std::string text;
  utf8_.feed(bytes_, text);
  return text;
}

std::string StreamingDetokenizer::flush() {
  std::string text;
  utf8_.finish(text);
  first_ = true;
  return text;
}

}  // namespace moeserve::text
