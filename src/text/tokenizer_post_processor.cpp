#include "text/tokenizer_post_processor.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/bpe.h"

namespace moeserve::text {
namespace {

using nlohmann::json;

int32_t checked_id(const json& value, const std::string& where) {
  if (!value.is_number_integer()) fail("{} must be an integer token id", where);
  const int64_t id = value.get<int64_t>();
  if (id < 0 || id >= kMaxTokenId) fail("{}: token id {} is outside 0..{}", where, id, kMaxTokenId - 1);
  return static_cast<int32_t>(id);
}

// The ids of a ["[CLS]", 101] pair (BertProcessing / RobertaProcessing).
int32_t pair_id(const json& config, const char* key, const std::string& where) {
  auto it = config.find(key);
  if (it == config.end() || !it->is_array() || it->size() != 2)
    fail("{}.{} must be a [token, id] pair", where, key);
  return checked_id((*it)[1], fmt::format("{}.{}[1]", where, key));
}

}  // namespace

PostProcessor PostProcessor::from_json(const json& config, const std::string& where) {
  PostProcessor result;
  if (!config.is_null()) result.add(config, where);
  return result;
}

void PostProcessor::add(const json& config, const std::string& where) {
  if (!config.is_object()) fail("{} must be an object", where);
  auto type_it = config.find("type");
  if (type_it == config.end() || !type_it->is_string()) fail("{}.type must be a string", where);
  const std::string type = type_it->get<std::string>();
  std::vector<int32_t> before, after;
  if (type == "ByteLevel") {
    return;
  } else if (type == "Sequence") {
    auto list = config.find("processors");
    if (list == config.end() || !list->is_array()) fail("{}.processors must be an array", where);
    for (size_t i = 0; i < list->size(); ++i)
      add((*list)[i], fmt::format("{}.processors[{}]", where, i));
    return;
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    before.push_back(pair_id(config, "cls", where));
    after.push_back(pair_id(config, "sep", where));
  } else if (type == "TemplateProcessing") {
    auto single = config.find("single");
    if (single == config.end() || !single->is_array()) fail("{}.single must be an array", where);
    auto specials = config.find("special_tokens");
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const json& item = (*single)[i];
      const std::string at = fmt::format("{}.single[{}]", where, i);
      if (item.contains("Sequence")) {
        const json& seq = item["Sequence"];
        if (!seq.is_object() || seq.value("id", std::string()) != "A")
          fail("{}: a single-sequence template may only contain the sequence A", at);
        if (seen_sequence) fail("{}: the sequence A appears twice", at);
        seen_sequence = true;
      } else if (item.contains("SpecialToken")) {
        const json& special = item["SpecialToken"];
        if (!special.is_object() || !special.contains("id") || !special["id"].is_string())
          fail("{}.SpecialToken.id must be a string", at);
        const std::string name = special["id"].get<std::string>();
        if (specials == config.end() || !specials->is_object() || !specials->contains(name))
          fail("{}: special token '{}' is not defined in {}.special_tokens", at, name, where);
        const json& definition = (*specials)[name];
        auto ids = definition.find("ids");
        if (ids == definition.end() || !ids->is_array())
          fail("{}.special_tokens['{}'].ids must be an array", where, name);
        auto& target = seen_sequence ? after : before;
        for (size_t k = 0; k < ids->size(); ++k)
          target.push_back(
              checked_id((*ids)[k], fmt::format("{}.special_tokens['{}'].ids[{}]", where, name, k)));
      } else {
        fail("{} must be {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}", at);
      }
    }
    if (!seen_sequence) fail("{}.single does not contain the sequence A", where);
  } else {
    fail("{}: post-processor type '{}' is not supported (supported: ByteLevel, "
         "TemplateProcessing, BertProcessing, RobertaProcessing, Sequence)",
         where, type);
  }
  // This processor wraps everything added so far.
  prefix_.insert(prefix_.begin(), before.begin(), before.end());
  suffix_.insert(suffix_.end(), after.begin(), after.end());
}

void PostProcessor::apply(std::vector<int32_t>& ids) const {
  if (!prefix_.empty()) ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
  ids.insert(ids.end(), suffix_.begin(), suffix_.end());
}

}  // namespace moeserve::text
