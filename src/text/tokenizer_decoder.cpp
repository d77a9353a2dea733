#include "text/tokenizer_decoder.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/bpe_byte_level.h"

namespace moeserve::text {

TokenDecoder TokenDecoder::from_json(const nlohmann::json& config, const std::string& where) {
  TokenDecoder decoder;
  if (config.is_null()) return decoder;
  if (!config.is_object()) fail("{} must be an object", where);
  auto type_it = config.find("type");
  if (type_it == config.end() || !type_it->is_string()) fail("{}.type must be a string", where);
  const std::string type = type_it->get<std::string>();
  if (type != "ByteLevel")
    fail("{}: decoder type '{}' is not supported (supported: ByteLevel, or none)", where, type);
  decoder.byte_level_ = true;
  return decoder;
}

std::string TokenDecoder::token_bytes(std::string_view token) const {
  std::string out;
  if (byte_level_ && byte_level_to_bytes(token, out)) return out;
  return std::string(token);
}

}  // namespace moeserve::text
