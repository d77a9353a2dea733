// Checkpoint name normalisation (see checkpoint.h; ../shared/spec/qwen35_arch.md 3.1-3.3).
#include <array>
#include <string_view>

#include "io/checkpoint.h"

namespace moeserve::io {

namespace {
bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }
}  // namespace

std::optional<std::string> canonical_tensor_name(const std::string& source_name) {
  const std::string_view name = source_name;
  // Vision tower: not part of the text model.
  for (std::string_view skipped : {"model.visual.", "visual."})
    if (starts_with(name, skipped)) return std::nullopt;
  // The LM head as some third-party exports of the composite model save it.
  constexpr std::string_view kWrappedHead = "language_model.lm_head.";
  if (starts_with(name, kWrappedHead)) return "lm_head." + std::string(name.substr(kWrappedHead.size()));
  // Text-model prefixes, longest first: "model.language_model." (composite model),
  // "language_model.model." (some third-party exports), "model." (ForCausalLM).
  static constexpr std::array<std::string_view, 3> kPrefixes = {
      "model.language_model.", "language_model.model.", "model."};
  for (std::string_view prefix : kPrefixes)
    if (starts_with(name, prefix)) return std::string(name.substr(prefix.size()));
  // "lm_head.*", "mtp.*" and anything else are canonical as they are.
  return source_name;
}

}  // namespace moeserve::io
