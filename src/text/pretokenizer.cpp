#include "text/pretokenizer.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/pretokenizer_regex.h"

namespace moeserve::text {
namespace {

using nlohmann::json;

// GPT-2's split pattern, used by ByteLevel when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

bool bool_field(const json& config, const char* key, bool fallback, const std::string& where) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail("{}.{} must be true or false", where, key);
  return it->get<bool>();
}

SplitBehavior parse_behavior(const json& value, const std::string& where) {
  if (!value.is_string()) fail("{}.behavior must be a string", where);
  // Accept the serialized names (MergedWithPrevious) and the Python ones (merged_with_previous).
  std::string name;
  for (char c : value.get<std::string>())
    if (c != '_') name.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (name == "removed") return SplitBehavior::Removed;
  if (name == "isolated") return SplitBehavior::Isolated;
  if (name == "mergedwithprevious") return SplitBehavior::MergedWithPrevious;
  if (name == "mergedwithnext") return SplitBehavior::MergedWithNext;
  if (name == "contiguous") return SplitBehavior::Contiguous;
  fail("{}.behavior '{}' is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, "
       "Contiguous",
       where, value.get<std::string>());
}

class SplitStep final : public PreTokenizerStep {
 public:
  SplitStep(const json& config, const std::string& where)
      : behavior_(parse_behavior(config.value("behavior", json()), where)),
        invert_(bool_field(config, "invert", false, where)),
        regex_(make_regex(config, where)) {}

  void apply(std::vector<std::string_view>& pieces, std::deque<std::string>&,
             std::vector<std::string_view>& scratch) const override {
    scratch.clear();
    thread_local std::vector<MatchSpan> matches;
    for (std::string_view piece : pieces) {
      matches.clear();
      regex_->find_all(piece, matches);
      split_by_matches(piece, matches, behavior_, invert_, scratch);
    }
    pieces.swap(scratch);
  }

 private:
  static std::unique_ptr<Regex> make_regex(const json& config, const std::string& where) {
    auto pattern = config.find("pattern");
    if (pattern == config.end() || !pattern->is_object())
      fail("{}.pattern must be an object {{\"Regex\": ...}} or {{\"String\": ...}}", where);
    if (auto re = pattern->find("Regex"); re != pattern->end() && re->is_string())
      return std::make_unique<Regex>(re->get<std::string>(), Regex::Syntax::Pattern,
                                     where + ".pattern.Regex");
    if (auto s = pattern->find("String"); s != pattern->end() && s->is_string())
      return std::make_unique<Regex>(s->get<std::string>(), Regex::Syntax::Literal,
                                     where + ".pattern.String");
    fail("{}.pattern must hold a string under \"Regex\" or \"String\"", where);
  }

  SplitBehavior behavior_;
  bool invert_;
  std::unique_ptr<Regex> regex_;
};

class ByteLevelStep final : public PreTokenizerStep {
 public:
  ByteLevelStep(const json& config, const std::string& where)
      : add_prefix_space_(bool_field(config, "add_prefix_space", true, where)) {
    // HF defaults: add_prefix_space = true, use_regex = true.
    if (bool_field(config, "use_regex", true, where))
      gpt2_ = std::make_unique<Regex>(kGpt2Pattern, Regex::Syntax::Pattern,
                                      where + " (GPT-2 pattern)");
  }

  void apply(std::vector<std::string_view>& pieces, std::deque<std::string>& arena,
             std::vector<std::string_view>& scratch) const override {
    if (add_prefix_space_) {
      for (auto& piece : pieces) {
        if (piece.empty() || piece.front() != ' ') {
          std::string& owned = arena.emplace_back();
          owned.reserve(piece.size() + 1);
          owned.push_back(' ');
          owned.append(piece);
          piece = owned;
        }
      }
    }
    if (!gpt2_) return;
    scratch.clear();
    thread_local std::vector<MatchSpan> matches;
    for (std::string_view piece : pieces) {
      matches.clear();
      gpt2_->find_all(piece, matches);
      split_by_matches(piece, matches, SplitBehavior::Isolated, false, scratch);
    }
    pieces.swap(scratch);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> gpt2_;
};

// Appends the steps of `config` (flattening sequences) to `steps`; sets `byte_level`.
void collect_steps(const json& config, const std::string& where,
                   std::vector<std::shared_ptr<const PreTokenizerStep>>& steps,
                   bool& byte_level) {
  if (!config.is_object()) fail("{} must be an object", where);
  auto type_it = config.find("type");
  if (type_it == config.end() || !type_it->is_string()) fail("{}.type must be a string", where);
  const std::string type = type_it->get<std::string>();
  if (byte_level) {
    fail("{}: a '{}' pre-tokenizer after ByteLevel is not supported (ByteLevel must be the "
         "last step)",
         where, type);
  }
  if (type == "Sequence") {
    auto list = config.find("pretokenizers");
    if (list == config.end() || !list->is_array())
      fail("{}.pretokenizers must be an array", where);
    for (size_t i = 0; i < list->size(); ++i)
      collect_steps((*list)[i], fmt::format("{}.pretokenizers[{}]", where, i), steps,
                    byte_level);
  } else if (type == "Split") {
    steps.push_back(std::make_shared<SplitStep>(config, where));
  } else if (type == "ByteLevel") {
    steps.push_back(std::make_shared<ByteLevelStep>(config, where));
    byte_level = true;
  } else {
    fail("{}: pre-tokenizer type '{}' is not supported (supported: Split, ByteLevel, Sequence)",
         where, type);
  }
}

}  // namespace

void split_by_matches(std::string_view text, const std::vector<MatchSpan>& matches,
                      SplitBehavior behavior, bool invert, std::vector<std::string_view>& out) {
  struct Part {
    size_t start, end;
    bool is_match;
  };
  thread_local std::vector<Part> parts;
  parts.clear();
  // The parts cover the whole text: gaps between matches are non-matches.
  size_t previous_end = 0;
  for (const MatchSpan& m : matches) {
    if (m.start != previous_end) parts.push_back({previous_end, m.start, invert});
    parts.push_back({m.start, m.end, !invert});
    previous_end = m.end;
  }
  if (previous_end != text.size()) parts.push_back({previous_end, text.size(), invert});

  auto emit = [&](size_t start, size_t end) {
    if (end > start) out.push_back(text.substr(start, end - start));
  };
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (const Part& p : parts) emit(p.start, p.end);
      return;
    case SplitBehavior::Removed:
      for (const Part& p : parts)
        if (!p.is_match) emit(p.start, p.end);
      return;
    case SplitBehavior::Contiguous:
    case SplitBehavior::MergedWithPrevious: {
      // Contiguous: runs of parts with the same kind become one piece. MergedWithPrevious: a
      // match joins the piece before it (unless that piece is itself a match).
      thread_local std::vector<std::pair<size_t, size_t>> merged;
      merged.clear();
      bool previous_match = false;
      for (const Part& p : parts) {
        const bool join = behavior == SplitBehavior::Contiguous
                              ? p.is_match == previous_match
                              : p.is_match && !previous_match;
        if (join && !merged.empty()) {
          merged.back().second = p.end;
        } else {
          merged.emplace_back(p.start, p.end);
        }
        previous_match = p.is_match;
      }
      for (auto [s, e] : merged) emit(s, e);
      return;
    }
    case SplitBehavior::MergedWithNext: {
      // A match joins the piece after it (unless that piece is itself a match): the mirror
      // image of MergedWithPrevious, computed right to left.
      thread_local std::vector<std::pair<size_t, size_t>> merged;
      merged.clear();
      bool previous_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().first = it->start;
        } else {
          merged.emplace_back(it->start, it->end);
        }
        previous_match = it->is_match;
      }
      for (auto it = merged.rbegin(); it != merged.rend(); ++it) emit(it->first, it->second);
      return;
    }
  }
}

PreTokenizer PreTokenizer::from_json(const nlohmann::json& config, const std::string& where) {
  PreTokenizer result;
  if (!config.is_null()) collect_steps(config, where, result.steps_, result.byte_level_);
  return result;
}

void PreTokenizer::split(std::string_view text, PreTokenizedPieces& out) const {
  out.clear();
  if (text.empty()) return;
  out.pieces.push_back(text);
  thread_local std::vector<std::string_view> scratch;
  for (const auto& step : steps_) {
    step->apply(out.pieces, out.arena, scratch);
    if (out.pieces.empty()) return;
  }
}

}  // namespace moeserve::text
