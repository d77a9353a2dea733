// The normalizer of a Hugging Face tokenizer.json ("normalizer"): applied to the input text
// (outside added tokens that are not "normalized") before pre-tokenization. Supported types:
// NFC, NFD, NFKC, NFKD (utf8proc), Sequence, Prepend, Replace (String or Regex pattern).
// null means no normalization. Other types are rejected at load time with an error naming the
// type and the JSON path.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moeserve::text {

class NormalizerStep {
 public:
  virtual ~NormalizerStep() = default;
  virtual std::string apply(std::string_view text) const = 0;
};

class Normalizer {
 public:
  static Normalizer from_json(const nlohmann::json& config, const std::string& where);

  bool empty() const { return steps_.empty(); }
  // `text` (valid UTF-8) normalized.
  std::string apply(std::string_view text) const;

 private:
  std::vector<std::shared_ptr<const NormalizerStep>> steps_;
};

}  // namespace moeserve::text
