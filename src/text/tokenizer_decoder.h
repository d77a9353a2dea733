// The decoder of a Hugging Face tokenizer.json ("decoder"), reduced to what ids -> text needs
// for byte-level BPE. Both supported forms are token-local, which is what lets the streaming
// detokenizer work in O(1) per token:
//   - ByteLevel: each token string maps back to bytes through the byte-level alphabet (a token
//     with a character outside the alphabet contributes its own UTF-8 bytes); the bytes of all
//     tokens are concatenated and then read as UTF-8 with invalid sequences replaced by U+FFFD.
//     Added tokens bypass the decoder: they contribute their content as written.
//   - null (no decoder): the token strings joined with single spaces (HF's default).
// Other decoder types are rejected at load time.
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace moeserve::text {

class TokenDecoder {
 public:
  static TokenDecoder from_json(const nlohmann::json& config, const std::string& where);

  // The bytes that the token string `token` contributes.
  std::string token_bytes(std::string_view token) const;
  // What goes between the contributions of two consecutive tokens.
  std::string_view separator() const { return byte_level_ ? std::string_view() : " "; }
  bool byte_level() const { return byte_level_; }

 private:
  bool byte_level_ = false;
};

}  // namespace moeserve::text
