// The pre-tokenizer: splits a normalized text segment into the pieces ("words") that the BPE
// model encodes independently. Built from the "pre_tokenizer" object of a Hugging Face
// tokenizer.json. Supported types:
//   - Split {pattern: {Regex|String}, behavior, invert}: behaviors Isolated, Removed,
//     MergedWithPrevious, MergedWithNext, Contiguous, with the semantics of HF tokenizers'
//     NormalizedString::split (empty pieces are dropped).
//   - ByteLevel {add_prefix_space, use_regex}: optionally prefixes each piece with a space
//     (unless it already starts with one) and splits it with the GPT-2 pattern; then marks the
//     pieces as byte-level, which the BPE model applies when it maps bytes to symbols. Because
//     that mapping happens in the model, ByteLevel must be the last step.
//   - Sequence {pretokenizers: [...]}: the steps in order (nested sequences are flattened).
// Anything else is rejected at load time with an error naming the type and the JSON path.
//
// Immutable after construction; split() may run on many threads at once.
#pragma once
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/pretokenizer_regex.h"

namespace moeserve::text {

// The pieces of one segment. Views point into the segment text or into `arena` (text that a
// step created, such as a piece with a prefix space added); a deque keeps those addresses
// stable while more strings are added.
struct PreTokenizedPieces {
  std::vector<std::string_view> pieces;
  std::deque<std::string> arena;

  void clear() {
    pieces.clear();
    arena.clear();
  }
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class PreTokenizerStep {
 public:
  virtual ~PreTokenizerStep() = default;
  // Replaces `pieces` by their refinement. `scratch` is a reusable buffer.
  virtual void apply(std::vector<std::string_view>& pieces, std::deque<std::string>& arena,
                     std::vector<std::string_view>& scratch) const = 0;
};

class PreTokenizer {
 public:
  // `config` is the "pre_tokenizer" value (null means: the whole segment is one piece).
  // `where` names it in errors, e.g. "/models/qwen/tokenizer.json: pre_tokenizer".
  static PreTokenizer from_json(const nlohmann::json& config, const std::string& where);

  // Splits `text` (valid UTF-8) into out.pieces (out is cleared first).
  void split(std::string_view text, PreTokenizedPieces& out) const;

  // Whether the pieces are to be encoded at the byte level (a ByteLevel step is present).
  bool byte_level() const { return byte_level_; }

 private:
  std::vector<std::shared_ptr<const PreTokenizerStep>> steps_;
  bool byte_level_ = false;
};

// The pieces of `text` for `matches` (non-overlapping, ascending spans of regex matches in
// `text`) under `behavior`, appended to `out`; `invert` swaps the roles of matches and the
// text between them. Exposed for tests.
void split_by_matches(std::string_view text, const std::vector<MatchSpan>& matches,
                      SplitBehavior behavior, bool invert, std::vector<std::string_view>& out);

}  // namespace moeserve::text
