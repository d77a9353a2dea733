// The post-processor of a Hugging Face tokenizer.json ("post_processor"), for one input
// sequence and add_special_tokens=true: the ids are wrapped as prefix + ids + suffix.
// Supported types: ByteLevel (offsets only: adds nothing), TemplateProcessing (its "single"
// template), BertProcessing and RobertaProcessing ([cls] ids [sep]), and Sequence (applied in
// order, so later processors wrap earlier ones). null adds nothing (Qwen adds no BOS).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moeserve::text {

class PostProcessor {
 public:
  static PostProcessor from_json(const nlohmann::json& config, const std::string& where);

  // Wraps `ids` (the encoding of one sequence) with the special tokens.
  void apply(std::vector<int32_t>& ids) const;

  const std::vector<int32_t>& prefix() const { return prefix_; }
  const std::vector<int32_t>& suffix() const { return suffix_; }

 private:
  void add(const nlohmann::json& config, const std::string& where);

  std::vector<int32_t> prefix_;
  std::vector<int32_t> suffix_;
};

}  // namespace moeserve::text
