// Walks a JsonGrammar one byte at a time: a pushdown automaton whose state is a set of
// stacks (a stack per way the bytes so far can be read; anyOf options and object keys that
// share a prefix fork it, and a byte that a stack cannot take drops that stack).
//
// A stack holds frames from the outside in: a Root frame, then one frame per value being
// read (an object, an array, a string, ...). A frame is 16 bytes and states are flat arrays
// of frames, so copying a state costs a memcpy; equal states have equal bytes (key()), which
// is what the token mask cache (token_mask.h) looks up.
//
// Only prefixes of texts the grammar accepts are live: every live state can still be
// completed (a closing brace is refused while a required property is missing, a comma when no
// property is left, etc.), so a mask built from it never leaves a sequence without a token.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "structured/json_grammar.h"

namespace moeserve::structured {

enum class FrameKind : uint8_t { Root, Value, Object, Array, String, Number, Literal, Pattern };

struct Frame {
  uint32_t aux = 0;   // Object: next property index; Array: items done (up to min_items when
                      // there is no maximum); String: characters (when limited) or the pattern's
                      // state; Literal: position; Number (range-checked): the magnitude so far;
                      // Pattern: the regex's state
  uint32_t aux2 = 0;  // Number (bounded, not integer): the fraction digits typed so far, as an integer
  uint32_t node = 0;  // grammar node (Literal: the literal's index)
  FrameKind kind = FrameKind::Root;
  uint8_t sub = 0;    // the frame's lexical state (json_matcher.cpp)
  uint8_t ws = 0;     // whitespace bytes in the current gap; Number (bounded): fraction digits
  uint8_t flags = 0;  // String: counts characters / has a pattern; Number: integer only, range-checked, negative
};
static_assert(sizeof(Frame) == 16, "frames are compared and hashed as bytes");

// A set of stacks: frames of stack i are frames[ends[i-1] .. ends[i]) (ends[-1] = 0).
struct MatchState {
  std::vector<Frame> frames;
  std::vector<uint16_t> ends;

  bool dead() const { return ends.empty(); }
  size_t num_stacks() const { return ends.size(); }
  // The state as bytes: equal for equal states (the mask cache's key).
  std::string key() const;
};

class JsonMatcher {
 public:
  explicit JsonMatcher(const JsonGrammar& grammar) : g_(grammar) {}

  // Nothing read yet: a value of the root node is expected (after up to max_whitespace bytes).
  MatchState start() const;
  // The state after `byte`; dead() when no stack can take it. `out` may not alias `in`.
  void feed(const MatchState& in, uint8_t byte, MatchState& out) const;
  // Feeds `bytes` in order; false (and `state` dead) once one is refused.
  bool feed_all(MatchState& state, std::string_view bytes) const;
  // Whether the bytes so far form a whole text of the grammar (end of sequence allowed).
  bool can_end(const MatchState& state) const;
  // Whether every stack is inside a string, between characters, with no length limit: then
  // any run of plain characters (no '"', '\\' or control byte, whole UTF-8 sequences) leaves
  // the state as it is. Sets *max_chars to the most characters any stack can still take
  // (kUnbounded when none counts).
  bool in_plain_string(const MatchState& state, uint32_t* max_chars) const;

  const JsonGrammar& grammar() const { return g_; }

 private:
  struct Stack;
  void advance(Stack& s, uint8_t b, MatchState& out) const;
  bool begin_value(Stack& s, uint8_t b) const;
  void complete(Stack& s) const;
  bool number_done(const Frame& f) const;
  bool pattern_step(Frame& f, uint8_t byte) const;
  bool integer_viable(const Frame& f, int64_t magnitude) const;
  bool decimal_hits(const Frame& f, int64_t lo_units, int64_t hi_units) const;
  bool decimal_step(Frame& f, uint8_t byte) const;
  static void emit(const Stack& s, MatchState& out);
  static void dedupe(MatchState& state);

  const JsonGrammar& g_;
};

}  // namespace moeserve::structured
