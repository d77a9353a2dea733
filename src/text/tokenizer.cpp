#include "text/tokenizer.h"

#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/bpe.h"
#include "text/pretokenizer.h"
#include "text/tokenizer_added_tokens.h"
#include "text/tokenizer_config.h"
#include "text/tokenizer_decoder.h"
#include "text/tokenizer_normalizer.h"
#include "text/tokenizer_post_processor.h"
#include "text/unicode.h"

namespace moeserve::text {

using nlohmann::json;

struct Tokenizer::Impl {
  std::string source;
  Normalizer normalizer;
  AddedVocabulary added;
  PreTokenizer pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  PostProcessor post_processor;
  TokenDecoder decoder;
  TokenizerConfig config;
  int32_t vocab_size = 0;
  // Decoded bytes of every id: token_bytes[offsets[id] .. offsets[id+1]); `has_token` marks
  // the ids that name a token.
  std::string token_bytes;
  std::vector<uint32_t> token_offsets;
  std::vector<uint8_t> has_token;
  std::vector<uint8_t> special;

  // The token string of `id` (added tokens first, as HF looks them up), or nullptr.
  const std::string* token_string(int32_t id) const {
    if (const AddedToken* added_token = added.find(id)) return &added_token->content;
    return model->id_to_token(id);
  }

  std::optional<int32_t> id_of(std::string_view token) const {
    if (auto id = added.find(token)) return id;
    return model->token_to_id(token);
  }

  // Steps 3-4 of encode() for text outside added tokens.
  void encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
    thread_local PreTokenizedPieces pieces;
    pre_tokenizer.split(text, pieces);
    for (std::string_view piece : pieces.pieces) model->encode(piece, ids);
  }
};

namespace {

std::string field(const std::string& source, std::string_view name) {
  return fmt::format("{}: {}", source, name);
}

void build_model(Tokenizer::Impl& impl, const json& tokenizer_json, const TokenizerOptions& options) {
  auto model_it = tokenizer_json.find("model");
  if (model_it == tokenizer_json.end() || !model_it->is_object())
    fail("{} has no \"model\" object", impl.source);
  const json& model = *model_it;
  std::string type;
  if (auto t = model.find("type"); t != model.end() && t->is_string()) {
    type = t->get<std::string>();
  } else if (model.contains("merges")) {
    type = "BPE";  // old files omit the type; only BPE has merges
  }
  if (type != "BPE") {
    fail("{}: model type '{}' is not supported (moeserve implements BPE tokenizers)",
         field(impl.source, "model.type"), type.empty() ? "(missing)" : type);
  }
  impl.model = std::make_unique<BpeModel>(model, field(impl.source, "model"),
                                          impl.pre_tokenizer.byte_level(),
                                          options.word_cache_capacity);
}

void build_decode_tables(Tokenizer::Impl& impl) {
  int32_t limit = impl.model->id_limit();
  for (const AddedToken& token : impl.added.tokens()) limit = std::max(limit, token.id + 1);
  impl.vocab_size = limit;
  const size_t n = static_cast<size_t>(limit);
  impl.token_offsets.assign(n + 1, 0);
  impl.has_token.assign(n, 0);
  impl.special.assign(n, 0);
  for (size_t id = 0; id < n; ++id) {
    impl.token_offsets[id] = static_cast<uint32_t>(impl.token_bytes.size());
    // Added tokens with normalized=false (the special tokens) decode to their content as
    // written; normalized added tokens go through the decoder like model tokens, as HF
    // tokenizers (Rust) does: checked against tokenizers 0.23 in reference_ids_hf.json,
    // where a normalized "café" token decodes through ByteLevel to "caf\uFFFD".
    if (const AddedToken* added_token = impl.added.find(static_cast<int32_t>(id))) {
      impl.token_bytes += added_token->normalized ? impl.decoder.token_bytes(added_token->content)
                                                  : added_token->content;
      impl.has_token[id] = 1;
    } else if (const std::string* token = impl.model->id_to_token(static_cast<int32_t>(id))) {
      impl.token_bytes += impl.decoder.token_bytes(*token);
      impl.has_token[id] = 1;
    }
    if (impl.token_bytes.size() > std::numeric_limits<uint32_t>::max())
      fail("{}: the vocabulary is too large", impl.source);
  }
  impl.token_offsets[n] = static_cast<uint32_t>(impl.token_bytes.size());
  for (const AddedToken& token : impl.added.tokens())
    if (token.special) impl.special[static_cast<size_t>(token.id)] = 1;
}

}  // namespace

Tokenizer Tokenizer::from_json(const json& tokenizer_json, const json& config_json,
                               const std::string& source, const TokenizerOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->source = source;
  if (!tokenizer_json.is_object()) fail("{}: the top level must be a JSON object", source);
  auto part = [&](const char* key) -> const json& {
    static const json null_value;
    auto it = tokenizer_json.find(key);
    return it == tokenizer_json.end() ? null_value : *it;
  };
  impl->normalizer = Normalizer::from_json(part("normalizer"), field(source, "normalizer"));
  impl->pre_tokenizer = PreTokenizer::from_json(part("pre_tokenizer"), field(source, "pre_tokenizer"));
  build_model(*impl, tokenizer_json, options);
  impl->added = AddedVocabulary::from_json(part("added_tokens"), impl->normalizer,
                                           field(source, "added_tokens"));
  impl->post_processor =
      PostProcessor::from_json(part("post_processor"), field(source, "post_processor"));
  impl->decoder = TokenDecoder::from_json(part("decoder"), field(source, "decoder"));
  if (!config_json.is_null())
    impl->config = TokenizerConfig(config_json, source + " (tokenizer_config.json)");
  build_decode_tables(*impl);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::filesystem::path& dir_or_file,
                          const TokenizerOptions& options) {
  namespace fs = std::filesystem;
  fs::path tokenizer_path = dir_or_file;
  std::error_code ec;
  if (fs::is_directory(dir_or_file, ec)) tokenizer_path = dir_or_file / "tokenizer.json";
  if (!fs::is_regular_file(tokenizer_path, ec)) {
    fail("no tokenizer found: {} does not exist (expected a model directory with "
         "tokenizer.json, or the tokenizer.json file)",
         tokenizer_path.string());
  }
  const json tokenizer_json = read_json_file(tokenizer_path);
  json config_json;  // null unless the file exists
  const fs::path config_path = tokenizer_path.parent_path() / "tokenizer_config.json";
  if (fs::is_regular_file(config_path, ec)) config_json = read_json_file(config_path);
  return from_json(tokenizer_json, config_json, tokenizer_path.string(), options);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& impl = *impl_;
  if (text.size() >= std::numeric_limits<uint32_t>::max())
    fail("the text to encode is too long ({} bytes; the limit is 4 GiB)", text.size());
  check_utf8(text, "the text to encode");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4 + 8);

  std::vector<TextSegment> raw_segments;
  impl.added.split_raw(text, raw_segments);
  std::vector<TextSegment> normalized_segments;
  for (const TextSegment& segment : raw_segments) {
    if (segment.token_id >= 0) {
      ids.push_back(segment.token_id);
      continue;
    }
    if (impl.normalizer.empty() && !impl.added.has_normalized_patterns()) {
      impl.encode_plain(segment.text, ids);
      continue;
    }
    const std::string normalized = impl.normalizer.apply(segment.text);
    normalized_segments.clear();
    impl.added.split_normalized(normalized, normalized_segments);
    for (const TextSegment& part : normalized_segments) {
      if (part.token_id >= 0) ids.push_back(part.token_id);
      else impl.encode_plain(part.text, ids);
    }
  }
  if (add_special_tokens) impl.post_processor.apply(ids);
  return ids;
}

bool Tokenizer::append_token_bytes(int32_t id, bool skip_special_tokens, bool first,
                                   std::string& out) const {
  const Impl& impl = *impl_;
  if (id < 0 || id >= impl.vocab_size) return false;
  const size_t index = static_cast<size_t>(id);
  if (!impl.has_token[index]) return false;
  if (skip_special_tokens && impl.special[index]) return false;
  if (!first) out += impl.decoder.separator();
  out.append(impl.token_bytes, impl.token_offsets[index],
             impl.token_offsets[index + 1] - impl.token_offsets[index]);
  return true;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  bool first = true;
  for (int32_t id : ids)
    if (append_token_bytes(id, skip_special_tokens, first, bytes)) first = false;
  if (!find_invalid_utf8(bytes)) return bytes;
  return utf8_lossy(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->id_of(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (const std::string* token = impl_->token_string(id)) return *token;
  fail("token id {} is not in the vocabulary of {} (ids 0..{})", id, impl_->source,
       impl_->vocab_size - 1);
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[static_cast<size_t>(id)];
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added.tokens(); }

const std::optional<std::string>& Tokenizer::bos_token() const { return impl_->config.bos_token(); }
const std::optional<std::string>& Tokenizer::eos_token() const { return impl_->config.eos_token(); }
const std::optional<std::string>& Tokenizer::pad_token() const { return impl_->config.pad_token(); }
const std::optional<std::string>& Tokenizer::unk_token() const { return impl_->config.unk_token(); }

namespace {
std::optional<int32_t> id_of_name(const Tokenizer& tokenizer,
                                  const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  return tokenizer.token_to_id(*name);
}
}  // namespace

std::optional<int32_t> Tokenizer::bos_token_id() const { return id_of_name(*this, bos_token()); }
std::optional<int32_t> Tokenizer::eos_token_id() const { return id_of_name(*this, eos_token()); }
std::optional<int32_t> Tokenizer::pad_token_id() const { return id_of_name(*this, pad_token()); }
std::optional<int32_t> Tokenizer::unk_token_id() const { return id_of_name(*this, unk_token()); }

const nlohmann::json& Tokenizer::config() const { return impl_->config.json(); }

const std::string& Tokenizer::source() const { return impl_->source; }

}  // namespace moeserve::text
