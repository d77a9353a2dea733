#include "text/reasoning_parser.h"

#include <array>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "text/parser_tags.h"

namespace moeserve::text {
namespace {

constexpr std::array<std::string_view, 1> kNames = {"qwen3"};

}  // namespace

std::span<const std::string_view> ReasoningParser::names() { return kNames; }

std::unique_ptr<ReasoningParser> ReasoningParser::create(std::string_view name, bool prompt_ends_in_think) {
  for (std::string_view known : kNames) {
    if (name == known) return std::make_unique<ReasoningParser>(prompt_ends_in_think);
  }
  fail("unknown reasoning parser '{}' (valid: {})", name, fmt::join(kNames, ", "));
}

ReasoningParser::ReasoningParser(bool prompt_ends_in_think) : prompt_ends_in_think_(prompt_ends_in_think) {}

ReasoningParser::Delta ReasoningParser::push(std::string_view new_text) {
  Delta out;
  held_.append(new_text);
  process(/*at_end=*/false, out);
  return out;
}

ReasoningParser::Delta ReasoningParser::finish() {
  Delta out;
  process(/*at_end=*/true, out);
  return out;
}

ReasoningParser::Delta ReasoningParser::parse(std::string_view text, bool prompt_ends_in_think) {
  ReasoningParser parser(prompt_ends_in_think);
  Delta all = parser.push(text);
  Delta tail = parser.finish();
  all.reasoning += tail.reasoning;
  all.content += tail.content;
  return all;
}

void ReasoningParser::process(bool at_end, Delta& out) {
  for (;;) {
    switch (phase_) {
      case Phase::kStart: {
        // Only a "<think>" at the very first byte opens (or repeats) the block.
        const TagMatch m = match_tag_at_start(held_, kThinkOpen);
        if (m == TagMatch::kFull) {
          held_.erase(0, kThinkOpen.size());
          phase_ = Phase::kReasoning;
          continue;
        }
        if (m == TagMatch::kPartial && !at_end) return;
        if (held_.empty() && !at_end) return;  // nothing seen yet
        phase_ = prompt_ends_in_think_ ? Phase::kReasoning : Phase::kContent;
        continue;
      }
      case Phase::kReasoning: {
        const std::size_t close = held_.find(kThinkClose);
        if (close != std::string::npos) {
          out.reasoning.append(held_, 0, close);
          held_.erase(0, close + kThinkClose.size());
          phase_ = Phase::kContent;
          continue;
        }
        const std::size_t keep = at_end ? 0 : partial_tag_suffix(held_, kThinkClose);
        out.reasoning.append(held_, 0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return;
      }
      case Phase::kContent:
        out.content += held_;
        held_.clear();
        return;
    }
  }
}

bool prompt_ends_in_open_think(std::string_view rendered_prompt) {
  const std::size_t turn = rendered_prompt.rfind("<|im_start|>");
  const std::string_view last_turn = turn == std::string_view::npos ? rendered_prompt : rendered_prompt.substr(turn);
  const std::size_t open = last_turn.rfind(kThinkOpen);
  if (open == std::string_view::npos) return false;
  return last_turn.find(kThinkClose, open) == std::string_view::npos;
}

}  // namespace moeserve::text
