// Reasoning parser: splits generated text into `reasoning_content` and `content` at the
// <think> ... </think> block of Qwen3 / Qwen3.5 models, incrementally while streaming.
//
// Behaviour (the facts follow vLLM's `qwen3` reasoning parser for Qwen3/Qwen3.5):
//   - Qwen3.5 templates end the generation prompt inside an open think block
//     ("<|im_start|>assistant\n<think>\n", spec qwen35_arch.md section 5), so the output
//     holds only "</think>": the server says so with `prompt_ends_in_think`, and the parser
//     starts in reasoning.
//   - Qwen3 (and earlier) templates leave "<think>" to the model: with
//     `prompt_ends_in_think` false, a "<think>" at the very start of the output opens the
//     block; otherwise the output is plain content.
//   - A redundant "<think>" at the very start is dropped in both modes.
//   - Text before "</think>" is reasoning, text after it is content (verbatim: the
//     template's newlines around the tags are kept, as vLLM keeps them).
//   - No "</think>" ever (the output was cut by max_tokens): everything is reasoning.
//   - Once the block is closed, later tags are ordinary content.
// Streaming: text may arrive a byte, a token or several tokens (speculative decoding) at
// a time, and a tag may be split anywhere. The parser never emits part of a tag and holds
// back only the shortest suffix that could still become one.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace moeserve::text {

// The tags of a think block (added tokens of the Qwen3 / Qwen3.5 tokenizers).
inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";

class ReasoningParser {
 public:
  struct Delta {
    std::string reasoning;
    std::string content;
    bool empty() const { return reasoning.empty() && content.empty(); }
  };

  // The names `--reasoning-parser` accepts.
  static std::span<const std::string_view> names();

  // Throws moeserve::Error naming the valid names when `name` is unknown.
  static std::unique_ptr<ReasoningParser> create(std::string_view name, bool prompt_ends_in_think);

  explicit ReasoningParser(bool prompt_ends_in_think);

  // Feeds the next piece of generated text; returns what can be emitted now.
  Delta push(std::string_view new_text);
  // The end of generation: emits everything held back.
  Delta finish();

  // True while generated text is still going to reasoning.
  bool in_reasoning() const { return phase_ == Phase::kReasoning || (phase_ == Phase::kStart && prompt_ends_in_think_); }

  // Non-streaming: the split of a whole output (same result as push + finish).
  static Delta parse(std::string_view text, bool prompt_ends_in_think);

 private:
  enum class Phase { kStart, kReasoning, kContent };
  void process(bool at_end, Delta& out);

  bool prompt_ends_in_think_;
  Phase phase_ = Phase::kStart;
  std::string held_;  // text not yet emitted: at most a tag prefix, between pushes
};

// Whether a rendered chat prompt leaves generation inside an open think block: the last
// ChatML turn (the text after the last "<|im_start|>") has a "<think>" with no "</think>"
// after it. True for the Qwen3.5 generation prompt with thinking on; false for
// "enable_thinking=false" (an empty closed block) and for Qwen3 prompts.
bool prompt_ends_in_open_think(std::string_view rendered_prompt);

}  // namespace moeserve::text
