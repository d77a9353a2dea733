// Streaming detokenizer: turns generated token ids into text one id at a time, for SSE.
//
// A byte-level token can end in the middle of a multi-byte character (an emoji is often split
// over two or three tokens). push() therefore emits only complete characters and holds back
// the at most three bytes of an unfinished one, so a client never sees a U+FFFD that the next
// token would have completed. Bytes that can no longer form a character become U+FFFD at once,
// exactly as decode() replaces them, and flush() turns a truncated tail into U+FFFD. Hence the
// concatenation of every push() and the final flush() equals decode() of all the ids.
//
// Each push costs O(length of the token): nothing is re-decoded.
#pragma once
#include <cstdint>
#include <string>

#include "text/tokenizer.h"
#include "text/unicode.h"

namespace moeserve::text {

class StreamingDetokenizer {
 public:
  // `tokenizer` must outlive the detokenizer.
  StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);

  // Adds one id; returns the text it completed (possibly empty).
  std::string push(int32_t id);
  // Ends the stream: returns what was held back (U+FFFD for an unfinished character) and
  // resets the detokenizer for a new stream.
  std::string flush();

  // Bytes held back waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return utf8_.pending_bytes(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  bool first_ = true;
  std::string bytes_;  // scratch: the bytes of the token being pushed
  Utf8LossyDecoder utf8_;
};

}  // namespace moeserve::text
