#include "structured/json_matcher.h"

#include <algorithm>
#include <cstring>

namespace moeserve::structured {

namespace {

// A stack: Root, at most kMaxNesting containers, and the key or value being read inside the
// innermost one (a container only starts where a frame is left above it).
constexpr int kMaxFrames = kMaxNesting + 2;
// More ways to read the same bytes than this (e.g. a huge enum at its first byte) are cut:
// the grammar then accepts fewer texts, never texts it should not.
constexpr size_t kMaxStacks = 256;

// Lexical states (Frame::sub), per frame kind.
enum RootSub : uint8_t { kRootValue, kRootDone };
enum ObjectSub : uint8_t { kObjBrace, kObjOpen, kObjKey, kObjColon, kObjValue, kObjAfterValue, kObjAfterComma };
enum ArraySub : uint8_t { kArrBracket, kArrOpen, kArrValue, kArrAfterValue };
// Strings: kStrC1..kStrC3 wait for 1..3 continuation bytes (80-BF); kStrE0/ED/F0/F4 are
// the lead bytes whose next byte has a narrower range (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF); kStrU4..kStrU1 wait for hex digits of \uXXXX. An
// escaped surrogate must come in a pair, high (\uD800-\uDBFF) then low (\uDC00-\uDFFF), as
// strict parsers require: kStrUD is the second digit after a 'D', kStrHighU2/U1 the rest of
// a high one, then kStrLowSlash, kStrLowU, kStrLowD and kStrLowC read "\uD" and [C-F].
enum StringSub : uint8_t {
  kStrQuote, kStrNormal, kStrEscape, kStrU4, kStrU3, kStrU2, kStrU1, kStrUD, kStrHighU2, kStrHighU1,
  kStrLowSlash, kStrLowU, kStrLowD, kStrLowC,
  kStrC1, kStrC2, kStrC3, kStrE0, kStrED, kStrF0, kStrF4,
};
enum NumberSub : uint8_t { kNumStart, kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };
constexpr uint8_t kStringCounts = 1;   // Frame::flags of a String with a length limit
constexpr uint8_t kStringPattern = 2;  // ... with a pattern: aux is its RegexDfa state
constexpr uint8_t kNumberInteger = 1;  // Frame::flags of a Number that takes no fraction or exponent
constexpr uint8_t kNumberRanged = 2;   // ... an integer with bounds: aux holds its magnitude so far
constexpr uint8_t kNumberNegative = 4;  // ... and it has a minus sign

bool is_ws(uint8_t b) { return b == ' ' || b == '\n' || b == '\t' || b == '\r'; }
bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }
bool number_complete(uint8_t sub) { return sub == kNumZero || sub == kNumInt || sub == kNumFrac || sub == kNumExp; }

// A bounded, non-integer number's magnitude in units of 10^-kDecimalFractionDigits.
int64_t decimal_units(const Frame& f) {
  int64_t step = kDecimalUnit;
  for (int i = 0; i < f.ws; ++i) step /= 10;
  return int64_t(f.aux) * kDecimalUnit + int64_t(f.aux2) * step;
}

Frame make_frame(FrameKind kind, uint32_t node) {
  Frame f;
  f.kind = kind;
  f.node = node;
  return f;
}

}  // namespace

struct JsonMatcher::Stack {
  int n = 0;
  Frame f[kMaxFrames];

  Frame& top() { return f[n - 1]; }
  const Frame& top() const { return f[n - 1]; }
  bool push(const Frame& frame) {
    if (n >= kMaxFrames) return false;
    f[n++] = frame;
    return true;
  }
  void copy_from(const Stack& other) {
    n = other.n;
    std::memcpy(f, other.f, sizeof(Frame) * size_t(n));
  }
};

std::string MatchState::key() const {
  std::string k;
  k.resize(frames.size() * sizeof(Frame) + ends.size() * sizeof(uint16_t));
  std::memcpy(k.data(), frames.data(), frames.size() * sizeof(Frame));
  std::memcpy(k.data() + frames.size() * sizeof(Frame), ends.data(), ends.size() * sizeof(uint16_t));
  return k;
}

MatchState JsonMatcher::start() const {
  Stack s;
  s.push(make_frame(FrameKind::Root, 0));
  s.push(make_frame(FrameKind::Value, g_.root));
  MatchState state;
  emit(s, state);
  return state;
}

void JsonMatcher::emit(const Stack& s, MatchState& out) {
  if (out.ends.size() >= kMaxStacks) return;
  out.frames.insert(out.frames.end(), s.f, s.f + s.n);
  out.ends.push_back(uint16_t(out.frames.size()));
}

void JsonMatcher::dedupe(MatchState& state) {
  if (state.ends.size() < 2) return;
  // Few stacks: quadratic, in place, keeping the first of equal ones.
  size_t write_frames = 0, kept = 0, begin = 0;
  for (size_t i = 0; i < state.ends.size(); ++i) {
    const size_t end = state.ends[i], len = end - begin;
    bool seen = false;
    for (size_t j = 0, jb = 0; j < kept && !seen; jb = state.ends[j], ++j) {
      seen = state.ends[j] - jb == len &&
             std::memcmp(&state.frames[jb], &state.frames[begin], len * sizeof(Frame)) == 0;
    }
    if (!seen) {
      if (write_frames != begin) std::memmove(&state.frames[write_frames], &state.frames[begin], len * sizeof(Frame));
      write_frames += len;
      state.ends[kept++] = uint16_t(write_frames);
    }
    begin = end;
  }
  state.frames.resize(write_frames);
  state.ends.resize(kept);
}

void JsonMatcher::feed(const MatchState& in, uint8_t byte, MatchState& out) const {
  out.frames.clear();
  out.ends.clear();
  // Reused: a fresh Stack would initialise all kMaxFrames frames at every byte of a trie walk.
  thread_local Stack s;
  size_t begin = 0;
  for (uint16_t end : in.ends) {
    s.n = int(end - begin);
    std::memcpy(s.f, &in.frames[begin], sizeof(Frame) * (end - begin));
    advance(s, byte, out);
    begin = end;
  }
  if (in.ends.size() > 1 || out.ends.size() > 1) dedupe(out);
}

bool JsonMatcher::feed_all(MatchState& state, std::string_view bytes) const {
  MatchState next;
  for (char c : bytes) {
    feed(state, uint8_t(c), next);
    std::swap(state, next);
    if (state.dead()) return false;
  }
  return true;
}

bool JsonMatcher::can_end(const MatchState& state) const {
  size_t begin = 0;
  for (uint16_t end : state.ends) {
    // A number at the end of the text ends with it.
    size_t top = end - 1;
    while (top > begin && ((state.frames[top].kind == FrameKind::Number && number_done(state.frames[top])) ||
                           (state.frames[top].kind == FrameKind::Pattern &&
                            g_.patterns[size_t(g_.nodes[state.frames[top].node].pattern)].accepting(
                                state.frames[top].aux))))
      --top;
    // Only a Root can be below a finished number; a number inside a container is not the end.
    const Frame& f = state.frames[top];
    if (f.kind == FrameKind::Root && (f.sub == kRootDone || top + 1 < end)) return true;
    begin = end;
  }
  return false;
}

bool JsonMatcher::in_plain_string(const MatchState& state, uint32_t* max_chars) const {
  if (state.dead()) return false;
  uint32_t room = 0;
  for (uint16_t end : state.ends) {
    const Frame& f = state.frames[end - 1];
    if (f.kind != FrameKind::String || f.sub != kStrNormal || (f.flags & kStringPattern)) return false;
    if (!(f.flags & kStringCounts)) {
      room = kUnbounded;
    } else {
      const uint32_t max = g_.nodes[f.node].max_length;
      room = std::max(room, max - std::min(max, f.aux));
    }
  }
  *max_chars = room;
  return true;
}

// Whether a Number frame holds a whole number (of its range, for a range-checked integer).
bool JsonMatcher::number_done(const Frame& f) const {
  if (!number_complete(f.sub)) return false;
  if (!(f.flags & kNumberRanged)) return true;
  const JsonNode& node = g_.nodes[f.node];
  int64_t value = int64_t(f.aux);
  if (!(f.flags & kNumberInteger)) value = decimal_units(f);
  if (f.flags & kNumberNegative) value = -value;
  return value >= node.min_value && value <= node.max_value;
}

// Whether some value whose magnitude (in units) lies in [lo, hi] is in the frame's range, with
// the frame's sign.
bool JsonMatcher::decimal_hits(const Frame& f, int64_t lo, int64_t hi) const {
  const JsonNode& node = g_.nodes[f.node];
  const bool negative = f.flags & kNumberNegative;
  const int64_t a = negative ? -hi : lo, b = negative ? -lo : hi;
  return a <= node.max_value && b >= node.min_value;
}

// A bounded, non-integer number takes `byte`: true when it is one of its characters and a value
// of the range stays reachable. Magnitude so far: aux (integer part) + aux2 / 10^ws (fraction).
// With j more integer digits and a fraction, an integer prefix P reaches the units
// [P * 10^j * U, (P + 1) * 10^j * U - 1]; a fraction prefix V with k digits reaches
// [V, V + 10^(6 - k) - 1] (U = kDecimalUnit, bounds already on that grid, so a hit interval
// always holds a value that can be written).
bool JsonMatcher::decimal_step(Frame& f, uint8_t b) const {
  auto int_viable = [&](int64_t p) {
    for (int64_t scale = 1; p * scale < kDecimalIntegerLimit || (p == 0 && scale == 1); scale *= 10) {
      if (decimal_hits(f, p * scale * kDecimalUnit, (p + 1) * scale * kDecimalUnit - 1)) return true;
      if (p == 0) break;  // no leading zeros: 0 takes only a fraction
    }
    return false;
  };
  auto fraction_viable = [&](uint32_t fraction, int digits) {
    int64_t step = kDecimalUnit;
    for (int i = 0; i < digits; ++i) step /= 10;
    const int64_t v = int64_t(f.aux) * kDecimalUnit + int64_t(fraction) * step;
    return decimal_hits(f, v, v + step - 1);
  };
  const bool digit = is_digit(b);
  switch (f.sub) {
    case kNumStart:
      if (b == '-') {
        if (g_.nodes[f.node].min_value > -1) return false;
        f.flags |= kNumberNegative;
        f.sub = kNumMinus;
        return true;
      }
      [[fallthrough]];
    case kNumMinus:
      if (!digit || !int_viable(b - '0')) return false;
      f.aux = uint32_t(b - '0');
      f.sub = b == '0' ? kNumZero : kNumInt;
      return true;
    case kNumZero:
    case kNumInt:
      if (b == '.') {
        if (!decimal_hits(f, int64_t(f.aux) * kDecimalUnit, int64_t(f.aux + 1) * kDecimalUnit - 1)) return false;
        f.sub = kNumDot;
        return true;
      }
      if (!digit || f.sub == kNumZero) return false;
      if (int64_t(f.aux) * 10 + (b - '0') >= kDecimalIntegerLimit || !int_viable(int64_t(f.aux) * 10 + (b - '0')))
        return false;
      f.aux = f.aux * 10 + uint32_t(b - '0');
      return true;
    case kNumDot:
    case kNumFrac:
      if (!digit || f.ws >= kDecimalFractionDigits) return false;
      if (!fraction_viable(f.aux2 * 10 + uint32_t(b - '0'), f.ws + 1)) return false;
      f.aux2 = f.aux2 * 10 + uint32_t(b - '0');
      ++f.ws;
      f.sub = kNumFrac;
      return true;
    default:
      return false;
  }
}

// Whether a range-checked integer whose digits so far make `magnitude` (with the frame's sign)
// can still end inside its range: with j more digits it lies in [m * 10^j, m * 10^j + 10^j - 1]
// (negated for a minus sign). No leading zeros: a 0 takes no more digits.
bool JsonMatcher::integer_viable(const Frame& f, int64_t magnitude) const {
  const JsonNode& node = g_.nodes[f.node];
  const bool negative = f.flags & kNumberNegative;
  int64_t lo = magnitude, hi = magnitude;
  while (lo <= kMaxIntegerBound) {
    const int64_t a = negative ? -hi : lo, b = negative ? -lo : hi;
    if (a <= node.max_value && b >= node.min_value) return true;
    if (magnitude == 0) break;
    lo = lo * 10;
    hi = hi * 10 + 9;
  }
  return false;
}

// Moves a String-with-pattern or Pattern frame's regex past `byte`; false when it refuses it.
bool JsonMatcher::pattern_step(Frame& f, uint8_t byte) const {
  const uint32_t next = g_.patterns[size_t(g_.nodes[f.node].pattern)].next(f.aux, byte);
  if (next == RegexDfa::kDead) return false;
  f.aux = next;
  return true;
}

// The frame on top of `s` is done: pop it and move its parent past the value (or key).
void JsonMatcher::complete(Stack& s) const {
  --s.n;
  Frame& p = s.top();
  p.ws = 0;
  switch (p.kind) {
    case FrameKind::Root: p.sub = kRootDone; break;
    case FrameKind::Object: p.sub = p.sub == kObjKey ? kObjColon : kObjAfterValue; break;
    case FrameKind::Array: {
      p.sub = kArrAfterValue;
      // Only `count >= min_items` and `count < max_items` matter: without a maximum the count
      // stops at min_items, so that a long array does not make a new state (and cache key)
      // at every item.
      const JsonNode& node = g_.nodes[p.node];
      if (node.max_items != kUnbounded || p.aux < node.min_items) ++p.aux;
      break;
    }
    default: break;  // only containers and Root have children
  }
}

// Turns the Value frame on top of `s` into the frame that reads its node's kind of value,
// starting with byte `b` (not yet consumed). False when such a value cannot start with `b`.
bool JsonMatcher::begin_value(Stack& s, uint8_t b) const {
  Frame& f = s.top();
  const JsonNode& node = g_.nodes[f.node];
  const bool room_for_child = s.n < kMaxFrames;  // a container needs a frame above it
  Frame next;
  switch (node.kind) {
    case NodeKind::Any:
      if (b == '{') next = make_frame(FrameKind::Object, JsonGrammar::kAnyObject);
      else if (b == '[') next = make_frame(FrameKind::Array, JsonGrammar::kAnyArray);
      else if (b == '"') next = make_frame(FrameKind::String, JsonGrammar::kAnyString);
      else if (b == '-' || is_digit(b)) next = make_frame(FrameKind::Number, 0);
      else if (b == 't') next = make_frame(FrameKind::Literal, JsonGrammar::kTrue);
      else if (b == 'f') next = make_frame(FrameKind::Literal, JsonGrammar::kFalse);
      else if (b == 'n') next = make_frame(FrameKind::Literal, JsonGrammar::kNull);
      else return false;
      if ((next.kind == FrameKind::Object || next.kind == FrameKind::Array) && !room_for_child) return false;
      break;
    case NodeKind::Object:
      if (b != '{' || !room_for_child) return false;
      next = make_frame(FrameKind::Object, f.node);
      break;
    case NodeKind::Array:
      if (b != '[' || !room_for_child) return false;
      next = make_frame(FrameKind::Array, f.node);
      break;
    case NodeKind::String:
      if (b != '"') return false;
      next = make_frame(FrameKind::String, f.node);
      if (node.min_length > 0 || node.max_length != kUnbounded) next.flags = kStringCounts;
      if (node.pattern >= 0) next.flags = kStringPattern;
      break;
    case NodeKind::Pattern:
      next = make_frame(FrameKind::Pattern, f.node);
      break;
    case NodeKind::Number:
    case NodeKind::Integer:
      if (b != '-' && !is_digit(b)) return false;
      next = make_frame(FrameKind::Number, f.node);
      if (node.kind == NodeKind::Integer) next.flags = kNumberInteger | (node.has_range ? kNumberRanged : 0);
      else if (node.has_range) next.flags = kNumberRanged;
      break;
    case NodeKind::Literal:
      next = make_frame(FrameKind::Literal, node.literal);
      break;
    case NodeKind::AnyOf: return false;  // expanded by advance()
  }
  f = next;
  return true;
}

// Applies byte `b` to stack `s`, emitting into `out` every stack that takes it.
void JsonMatcher::advance(Stack& s, uint8_t b, MatchState& out) const {
  while (true) {
    Frame& f = s.top();
    switch (f.kind) {
      case FrameKind::Root:
        return;  // the value is complete: nothing may follow it

      case FrameKind::Value: {
        const bool root_value = s.n == 2;
        if (is_ws(b) && (g_.leading_whitespace || !root_value)) {
          if (f.ws >= g_.max_whitespace) return;
          ++f.ws;
          emit(s, out);
          return;
        }
        const JsonNode& node = g_.nodes[f.node];
        if (node.kind == NodeKind::AnyOf) {
          Stack fork;
          for (uint32_t option : node.options) {
            fork.copy_from(s);
            fork.top().node = option;
            advance(fork, b, out);
          }
          return;
        }
        if (!begin_value(s, b)) return;
        continue;  // the new frame reads `b`
      }

      case FrameKind::Object: {
        const JsonNode& node = g_.nodes[f.node];
        const auto& props = node.properties;
        const bool is_map = props.empty();
        auto can_close = [&] {
          for (size_t k = f.aux; k < props.size(); ++k)
            if (props[k].required) return false;
          return true;
        };
        if (f.sub == kObjBrace) {
          if (b != '{') return;
          f.sub = kObjOpen;
          emit(s, out);
          return;
        }
        if (is_ws(b) && f.sub != kObjKey && f.sub != kObjValue) {
          if (f.ws >= g_.max_whitespace) return;
          ++f.ws;
          emit(s, out);
          return;
        }
        switch (f.sub) {
          case kObjOpen:
          case kObjAfterComma:
            if (b == '}' && f.sub == kObjOpen) {
              if (!can_close()) return;
              complete(s);
              emit(s, out);
              return;
            }
            if (b != '"') return;
            f.ws = 0;
            if (is_map) {
              if (node.additional < 0) return;
              f.sub = kObjKey;
              Frame key = make_frame(FrameKind::String, JsonGrammar::kAnyString);
              key.sub = kStrNormal;
              if (!s.push(key)) return;
              emit(s, out);
              return;
            }
            // Each property that may come next (those up to the next required one) reads
            // its key; the bytes to come decide which.
            {
              Stack fork;
              for (size_t k = f.aux; k < props.size(); ++k) {
                fork.copy_from(s);
                fork.top().aux = uint32_t(k + 1);
                fork.top().sub = kObjKey;
                Frame key = make_frame(FrameKind::Literal, props[k].key_literal);
                if (fork.push(key)) emit(fork, out);
                if (props[k].required) break;
              }
            }
            return;
          case kObjColon:
            if (b != ':') return;
            f.sub = kObjValue;
            f.ws = 0;
            {
              const uint32_t value = is_map ? uint32_t(node.additional) : props[f.aux - 1].value;
              if (!s.push(make_frame(FrameKind::Value, value))) return;
            }
            emit(s, out);
            return;
          case kObjAfterValue:
            if (b == '}') {
              if (!can_close()) return;
              complete(s);
              emit(s, out);
              return;
            }
            if (b != ',') return;
            if (!is_map && f.aux >= props.size()) return;  // no property left to come
            f.sub = kObjAfterComma;
            f.ws = 0;
            emit(s, out);
            return;
          default:
            return;  // kObjKey / kObjValue: a child frame is on top
        }
      }

      case FrameKind::Array: {
        const JsonNode& node = g_.nodes[f.node];
        if (f.sub == kArrBracket) {
          if (b != '[') return;
          f.sub = kArrOpen;
          emit(s, out);
          return;
        }
        if (is_ws(b)) {
          if (f.ws >= g_.max_whitespace) return;
          ++f.ws;
          emit(s, out);
          return;
        }
        if (b == ']') {
          const bool may_close = f.sub == kArrOpen ? node.min_items == 0 : f.aux >= node.min_items;
          if (!may_close) return;
          complete(s);
          emit(s, out);
          return;
        }
        if (f.sub == kArrAfterValue) {
          if (b != ',' || f.aux >= node.max_items) return;
          f.sub = kArrValue;
          f.ws = 0;
          if (!s.push(make_frame(FrameKind::Value, node.items))) return;
          emit(s, out);
          return;
        }
        // kArrOpen: the first item starts with `b`.
        if (node.max_items == 0) return;
        f.sub = kArrValue;
        f.ws = 0;
        if (!s.push(make_frame(FrameKind::Value, node.items))) return;
        continue;
      }

      case FrameKind::String: {
        const bool counts = f.flags & kStringCounts;
        // A new character may start (its first byte is `b`).
        auto take_char = [&] {
          if (!counts) return true;
          if (f.aux >= g_.nodes[f.node].max_length) return false;
          ++f.aux;
          return true;
        };
        const bool patterned = f.flags & kStringPattern;
        auto continuation = [&](uint8_t lo, uint8_t hi, uint8_t next) {
          if (b < lo || b > hi) return;
          if (patterned && !pattern_step(f, b)) return;
          f.sub = next;
          emit(s, out);
        };
        switch (f.sub) {
          case kStrQuote:
            if (b != '"') return;
            f.sub = kStrNormal;
            emit(s, out);
            return;
          case kStrNormal:
            if (b == '"') {
              if (counts && f.aux < g_.nodes[f.node].min_length) return;
              if (patterned && !g_.patterns[size_t(g_.nodes[f.node].pattern)].accepting(f.aux)) return;
              complete(s);
              emit(s, out);
              return;
            }
            if (b < 0x20) return;  // control characters must be escaped
            if (b >= 0x80 && (b < 0xC2 || b > 0xF4)) return;  // not a UTF-8 lead byte
            if (patterned && b != '\\' && !pattern_step(f, b)) return;
            if (patterned && b == '\\') {
              // Only if some escape's character continues the pattern (else a dead end).
              const RegexDfa& dfa = g_.patterns[size_t(g_.nodes[f.node].pattern)];
              bool any = false;
              for (uint8_t d : {uint8_t('"'), uint8_t('\\'), uint8_t('/'), uint8_t(0x08), uint8_t(0x0C), uint8_t(0x0A),
                                uint8_t(0x0D), uint8_t(0x09)})
                any = any || dfa.next(f.aux, d) != RegexDfa::kDead;
              if (!any) return;
            }
            if (!take_char()) return;
            if (b == '\\') f.sub = kStrEscape;
            else if (b < 0x80) f.sub = kStrNormal;
            else if (b < 0xE0) f.sub = kStrC1;
            else if (b == 0xE0) f.sub = kStrE0;
            else if (b == 0xED) f.sub = kStrED;
            else if (b < 0xF0) f.sub = kStrC2;
            else if (b == 0xF0) f.sub = kStrF0;
            else if (b == 0xF4) f.sub = kStrF4;
            else f.sub = kStrC3;
            emit(s, out);
            return;
          case kStrEscape:
            if (b == 'u') {
              if (patterned) return;  // the pattern reads decoded characters: \uXXXX is not offered
              f.sub = kStrU4;
            } else if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' || b == 't') {
              if (patterned) {
                const uint8_t decoded = b == 'b' ? 0x08 : b == 'f' ? 0x0C : b == 'n' ? 0x0A : b == 'r' ? 0x0D
                                      : b == 't' ? 0x09 : b;
                if (!pattern_step(f, decoded)) return;
              }
              f.sub = kStrNormal;
            } else {
              return;
            }
            emit(s, out);
            return;
          case kStrU4:
            if (!is_hex(b)) return;
            f.sub = (b == 'd' || b == 'D') ? kStrUD : kStrU3;
            emit(s, out);
            return;
          case kStrUD:  // \uD?: 0-7 plain, 8-B a high surrogate, C-F a lone low one
            if (b >= '0' && b <= '7') f.sub = kStrU2;
            else if (b == '8' || b == '9' || (b >= 'a' && b <= 'b') || (b >= 'A' && b <= 'B')) f.sub = kStrHighU2;
            else return;
            emit(s, out);
            return;
          case kStrU3:
          case kStrU2:
          case kStrU1:
          case kStrHighU2:
          case kStrHighU1:
            if (!is_hex(b)) return;
            f.sub = f.sub == kStrU1       ? uint8_t(kStrNormal)
                    : f.sub == kStrHighU1 ? uint8_t(kStrLowSlash)
                                          : uint8_t(f.sub + 1);
            emit(s, out);
            return;
          case kStrLowSlash: if (b == '\\') { f.sub = kStrLowU; emit(s, out); } return;
          case kStrLowU: if (b == 'u') { f.sub = kStrLowD; emit(s, out); } return;
          case kStrLowD: if (b == 'd' || b == 'D') { f.sub = kStrLowC; emit(s, out); } return;
          case kStrLowC:
            if ((b >= 'c' && b <= 'f') || (b >= 'C' && b <= 'F')) {
              f.sub = kStrU2;
              emit(s, out);
            }
            return;
          case kStrC1: continuation(0x80, 0xBF, kStrNormal); return;
          case kStrC2: continuation(0x80, 0xBF, kStrC1); return;
          case kStrC3: continuation(0x80, 0xBF, kStrC2); return;
          case kStrE0: continuation(0xA0, 0xBF, kStrC1); return;
          case kStrED: continuation(0x80, 0x9F, kStrC1); return;
          case kStrF0: continuation(0x90, 0xBF, kStrC2); return;
          case kStrF4: continuation(0x80, 0x8F, kStrC2); return;
          default: return;
        }
      }

      case FrameKind::Number: {
        const bool integer = f.flags & kNumberInteger;
        if ((f.flags & kNumberRanged) && !integer) {
          if (decimal_step(f, b)) {
            emit(s, out);
            return;
          }
          // Not a character of the number here: it ends the number, if the number is whole.
          const bool in_number =
              is_digit(b) || b == '-' || ((b == '.' || b == 'e' || b == 'E') && number_complete(f.sub));
          if (in_number || !number_done(f)) return;
          complete(s);
          continue;
        }
        if ((f.flags & kNumberRanged) && (f.sub == kNumStart || f.sub == kNumMinus || is_digit(b))) {
          // A range-checked integer: each digit must keep a value of the range reachable.
          if (b == '-' && f.sub == kNumStart) {
            if (g_.nodes[f.node].min_value > -1) return;  // no negative value is in range
            f.flags |= kNumberNegative;
            f.sub = kNumMinus;
          } else if (!is_digit(b) || f.sub == kNumZero || (f.sub == kNumMinus && b == '0')) {
            return;  // no leading zeros, no -0
          } else {
            const int64_t magnitude = int64_t(f.aux) * 10 + (b - '0');
            if (magnitude > kMaxIntegerBound || !integer_viable(f, magnitude)) return;
            f.aux = uint32_t(magnitude);
            f.sub = b == '0' && f.sub == kNumStart ? kNumZero : kNumInt;
          }
          emit(s, out);
          return;
        }
        uint8_t next = 0xff;
        switch (f.sub) {
          case kNumStart:
            if (b == '-') next = kNumMinus;
            else if (b == '0') next = kNumZero;
            else if (is_digit(b)) next = kNumInt;
            break;
          case kNumMinus:
            if (b == '0') next = kNumZero;
            else if (is_digit(b)) next = kNumInt;
            break;
          case kNumZero:
          case kNumInt:
            if (f.sub == kNumInt && is_digit(b)) next = kNumInt;
            else if (b == '.' && !integer) next = kNumDot;
            else if ((b == 'e' || b == 'E') && !integer) next = kNumE;
            else if (is_digit(b)) return;  // no leading zeros
            break;
          case kNumDot:
            if (is_digit(b)) next = kNumFrac;
            break;
          case kNumFrac:
            if (is_digit(b)) next = kNumFrac;
            else if (b == 'e' || b == 'E') next = kNumE;
            break;
          case kNumE:
            if (b == '+' || b == '-') next = kNumESign;
            else if (is_digit(b)) next = kNumExp;
            break;
          case kNumESign:
          case kNumExp:
            if (is_digit(b)) next = kNumExp;
            break;
          default: break;
        }
        if (next != 0xff) {
          f.sub = next;
          emit(s, out);
          return;
        }
        // `b` is not part of the number: a complete number ends here, and `b` goes to its parent.
        if (!number_done(f)) return;
        complete(s);
        continue;
      }

      case FrameKind::Pattern:
        if (pattern_step(f, b)) {
          emit(s, out);
          return;
        }
        // Refused: an accepted text ends here (a large enum's value), and `b` goes to the parent.
        if (!g_.patterns[size_t(g_.nodes[f.node].pattern)].accepting(f.aux)) return;
        complete(s);
        continue;

      case FrameKind::Literal: {
        const std::string& text = g_.literals[f.node];
        if (f.aux >= text.size() || uint8_t(text[f.aux]) != b) return;
        if (++f.aux == text.size()) complete(s);
        emit(s, out);
        return;
      }
    }
    return;
  }
}

}  // namespace moeserve::structured
