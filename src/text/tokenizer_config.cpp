#include "text/tokenizer_config.h"


#include "core/error.h"
#include "core/file_text.h"

namespace moeserve::text {
namespace {

std::optional<std::string> token_name(const nlohmann::json& config, const char* key,
                                      const std::string& where) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  fail("{}: \"{}\" must be a string, an object with a \"content\" string, or null (got {})",
       where, key, it->dump());
}

}  // namespace

TokenizerConfig::TokenizerConfig(nlohmann::json json, const std::string& where)
    : json_(std::move(json)) {
  if (!json_.is_object()) fail("{}: the top level must be a JSON object", where);
  bos_token_ = token_name(json_, "bos_token", where);
  eos_token_ = token_name(json_, "eos_token", where);
  pad_token_ = token_name(json_, "pad_token", where);
  unk_token_ = token_name(json_, "unk_token", where);
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  const std::string text = read_file_text(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{} is not valid JSON: {}", path.string(), e.what());
  }
}

}  // namespace moeserve::text
