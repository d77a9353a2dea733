// The runtime's TokenConstraint for JSON output: a JsonMatcher state per sequence, masks from
// a TokenMasker shared by every sequence of the same grammar.
//
// With a reasoning model the constraint can wait: `start_after_token` (the reasoning parser's
// </think> id, when the prompt leaves a think block open) lets the model think freely and
// applies the grammar from the token after it, as vLLM does with a reasoning parser.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>

#include "runtime/token_constraint.h"
#include "structured/token_mask.h"

namespace moeserve::structured {

class JsonConstraintFactory : public runtime::TokenConstraintFactory {
 public:
  JsonConstraintFactory(std::shared_ptr<const TokenMasker> masker, std::optional<int32_t> start_after_token)
      : masker_(std::move(masker)), start_after_token_(start_after_token) {}
  std::unique_ptr<runtime::TokenConstraint> start() const override;

 private:
  std::shared_ptr<const TokenMasker> masker_;
  std::optional<int32_t> start_after_token_;
};

}  // namespace moeserve::structured
