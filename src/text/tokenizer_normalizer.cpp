#include "text/tokenizer_normalizer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/pretokenizer_regex.h"
#include "text/unicode.h"

namespace moeserve::text {
namespace {

using nlohmann::json;

class UnicodeFormStep final : public NormalizerStep {
 public:
  explicit UnicodeFormStep(NormalForm form) : form_(form) {}
  std::string apply(std::string_view text) const override {
    return normalize_unicode(text, form_);
  }

 private:
  NormalForm form_;
};

// Prepend {prepend}: adds the string in front of non-empty text.
class PrependStep final : public NormalizerStep {
 public:
  explicit PrependStep(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string apply(std::string_view text) const override {
    if (text.empty()) return {};
    std::string out = prefix_;
    out.append(text);
    return out;
  }

 private:
  std::string prefix_;
};

// Replace {pattern: {String|Regex}, content}: replaces every match.
class ReplaceStep final : public NormalizerStep {
 public:
  ReplaceStep(const json& config, const std::string& where) {
    auto pattern = config.find("pattern");
    auto content = config.find("content");
    if (content == config.end() || !content->is_string())
      fail("{}.content must be a string", where);
    content_ = content->get<std::string>();
    check_utf8(content_, where + ".content");
    if (pattern == config.end() || !pattern->is_object())
      fail("{}.pattern must be an object {{\"Regex\": ...}} or {{\"String\": ...}}", where);
    if (auto re = pattern->find("Regex"); re != pattern->end() && re->is_string()) {
      regex_ = std::make_unique<Regex>(re->get<std::string>(), Regex::Syntax::Pattern,
                                       where + ".pattern.Regex");
    } else if (auto s = pattern->find("String"); s != pattern->end() && s->is_string()) {
      regex_ = std::make_unique<Regex>(s->get<std::string>(), Regex::Syntax::Literal,
                                       where + ".pattern.String");
    } else {
      fail("{}.pattern must hold a string under \"Regex\" or \"String\"", where);
    }
  }

  std::string apply(std::string_view text) const override {
    std::vector<MatchSpan> matches;
    regex_->find_all(text, matches);
    if (matches.empty()) return std::string(text);
    std::string out;
    size_t previous = 0;
    for (const MatchSpan& m : matches) {
      out.append(text.substr(previous, m.start - previous));
      out += content_;
      previous = m.end;
    }
    out.append(text.substr(previous));
    return out;
  }

 private:
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

void collect_steps(const json& config, const std::string& where,
                   std::vector<std::shared_ptr<const NormalizerStep>>& steps) {
  if (!config.is_object()) fail("{} must be an object", where);
  auto type_it = config.find("type");
  if (type_it == config.end() || !type_it->is_string()) fail("{}.type must be a string", where);
  const std::string type = type_it->get<std::string>();
  if (type == "NFC") {
    steps.push_back(std::make_shared<UnicodeFormStep>(NormalForm::NFC));
  } else if (type == "NFD") {
    steps.push_back(std::make_shared<UnicodeFormStep>(NormalForm::NFD));
  } else if (type == "NFKC") {
    steps.push_back(std::make_shared<UnicodeFormStep>(NormalForm::NFKC));
  } else if (type == "NFKD") {
    steps.push_back(std::make_shared<UnicodeFormStep>(NormalForm::NFKD));
  } else if (type == "Sequence") {
    auto list = config.find("normalizers");
    if (list == config.end() || !list->is_array()) fail("{}.normalizers must be an array", where);
    for (size_t i = 0; i < list->size(); ++i)
      collect_steps((*list)[i], fmt::format("{}.normalizers[{}]", where, i), steps);
  } else if (type == "Prepend") {
    auto prefix = config.find("prepend");
    if (prefix == config.end() || !prefix->is_string()) fail("{}.prepend must be a string", where);
    check_utf8(prefix->get_ref<const std::string&>(), where + ".prepend");
    steps.push_back(std::make_shared<PrependStep>(prefix->get<std::string>()));
  } else if (type == "Replace") {
    steps.push_back(std::make_shared<ReplaceStep>(config, where));
  } else {
    fail("{}: normalizer type '{}' is not supported (supported: NFC, NFD, NFKC, NFKD, Sequence, "
         "Prepend, Replace)",
         where, type);
  }
}

}  // namespace

Normalizer Normalizer::from_json(const json& config, const std::string& where) {
  Normalizer result;
  if (!config.is_null()) collect_steps(config, where, result.steps_);
  return result;
}

std::string Normalizer::apply(std::string_view text) const {
  if (steps_.empty()) return std::string(text);
  std::string current = steps_.front()->apply(text);
  for (size_t i = 1; i < steps_.size(); ++i) current = steps_[i]->apply(current);
  return current;
}

}  // namespace moeserve::text
