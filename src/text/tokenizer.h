// The tokenizer: text <-> token ids, loaded from a Hugging Face tokenizer.json (byte-level BPE,
// as used by Qwen2/3/3.5, Llama 3 and GPT-2) plus the tokenizer_config.json next to it.
//
// encode(text) runs the same pipeline as HF tokenizers (see qwen35_arch.md section 5):
//   1. added tokens with normalized=false are cut out of the raw text (tokenizer_added_tokens.h);
//   2. the text between them is normalized (NFC for Qwen; tokenizer_normalizer.h) and the added
//      tokens with normalized=true are cut out of that;
//   3. the pre-tokenizer splits the rest into pieces (Split regex + ByteLevel; pretokenizer.h);
//   4. the BPE model encodes each piece (bpe.h), with a word cache;
//   5. with add_special_tokens, the post-processor adds its special tokens (Qwen adds none).
// decode(ids) maps each id to its bytes (the ByteLevel decoder) and reads them as UTF-8,
// replacing invalid sequences with U+FFFD; decode(encode(x)) == NFC(x).
//
// Copies share one immutable loaded state (and one word cache). All const methods, encode
// included, may be called from many threads at once.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moeserve::text {

struct AddedToken;

struct TokenizerOptions {
  // Words held by the BPE word cache (0 disables it).
  size_t word_cache_capacity = 1 << 16;
};

class Tokenizer {
 public:
  // `dir_or_file` is a model directory holding tokenizer.json (and optionally
  // tokenizer_config.json), or the tokenizer.json file itself. Errors name the file and field.
  static Tokenizer load(const std::filesystem::path& dir_or_file,
                        const TokenizerOptions& options = {});
  // From parsed JSON: `tokenizer_json` is the content of tokenizer.json, `config_json` that of
  // tokenizer_config.json (null when there is none); `source` names them in errors.
  static Tokenizer from_json(const nlohmann::json& tokenizer_json,
                             const nlohmann::json& config_json, const std::string& source,
                             const TokenizerOptions& options = {});

  // Token ids of `text`, which must be valid UTF-8 (otherwise moeserve::Error naming the byte
  // offset). With add_special_tokens the post-processor's tokens are added (none for Qwen).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;

  // Text of `ids`. Ids that name no token are skipped (as HF does); with skip_special_tokens
  // the added tokens flagged special are left out too.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token string of `id` (byte-level alphabet for BPE tokens, e.g. "Ġworld"). Throws
  // moeserve::Error for an id that names no token.
  std::string id_to_token(int32_t id) const;
  // One past the largest token id (BPE vocabulary and added tokens): 151669 for Qwen3.
  int32_t vocab_size() const;
  // Whether `id` is an added token flagged special.
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;

  // The special tokens named by tokenizer_config.json, and their ids when the vocabulary has
  // them.
  const std::optional<std::string>& bos_token() const;
  const std::optional<std::string>& eos_token() const;
  const std::optional<std::string>& pad_token() const;
  const std::optional<std::string>& unk_token() const;
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> pad_token_id() const;
  std::optional<int32_t> unk_token_id() const;

  // The whole tokenizer_config.json (an empty object when there was none); the chat template
  // lives under "chat_template".
  const nlohmann::json& config() const;
  // Where the tokenizer was loaded from (the tokenizer.json path, or the `source` given).
  const std::string& source() const;

  // Building blocks of decode(), for the streaming detokenizer: appends the separator (when
  // `first` is false) and the bytes of `id`, and returns true; returns false and appends
  // nothing when `id` names no token or is a special token being skipped.
  bool append_token_bytes(int32_t id, bool skip_special_tokens, bool first,
                          std::string& out) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace moeserve::text
