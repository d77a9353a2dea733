// tokenizer_config.json, the transformers-side companion of tokenizer.json: the names of the
// bos/eos/pad/unk tokens, the chat template, and other settings. Kept whole (the chat-template
// code reads "chat_template" from it); the special-token names are parsed here. A token may be
// written as a string or as an AddedToken object {"content": "...", ...}.
#pragma once
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace moeserve::text {

class TokenizerConfig {
 public:
  TokenizerConfig() : json_(nlohmann::json::object()) {}
  // `where` names the source in errors (the file path).
  TokenizerConfig(nlohmann::json json, const std::string& where);

  const nlohmann::json& json() const { return json_; }
  const std::optional<std::string>& bos_token() const { return bos_token_; }
  const std::optional<std::string>& eos_token() const { return eos_token_; }
  const std::optional<std::string>& pad_token() const { return pad_token_; }
  const std::optional<std::string>& unk_token() const { return unk_token_; }

 private:
  nlohmann::json json_;
  std::optional<std::string> bos_token_, eos_token_, pad_token_, unk_token_;
};

// Reads and parses a JSON file; errors name the file (and the line/column of a syntax error).
nlohmann::json read_json_file(const std::filesystem::path& path);

}  // namespace moeserve::text
