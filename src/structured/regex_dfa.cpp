#include "structured/regex_dfa.h"

#include <algorithm>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"

namespace moeserve::structured {

namespace {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr size_t kMaxNfaStates = 200000;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // codepoints, sorted, disjoint

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
    else out.emplace_back(lo, hi);
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalize(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodepoint) out.emplace_back(next, kMaxCodepoint);
  return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMAScript WhiteSpace and LineTerminator.
const Ranges kSpace = {{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                       {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Ranges kDot = complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});

// ---- parsing: pattern -> tree ----------------------------------------------------------

struct Node {
  enum Kind { Set, Concat, Alt, Repeat } kind = Set;
  Ranges set;
  std::vector<int> children;
  int min = 0, max = 0;  // Repeat; max -1: unbounded
};

class Parser {
 public:
  explicit Parser(std::string_view pattern) : pattern_(pattern) { decode(); }

  // The tree of the whole pattern; *start / *end say whether ^ / $ anchored it.
  int parse(bool* start, bool* end) {
    size_t from = 0, to = cps_.size();
    *start = to > 0 && cps_[0] == '^';
    if (*start) from = 1;
    *end = false;
    if (to > from && cps_[to - 1] == '$') {
      size_t slashes = 0;
      while (to - 1 - slashes > from && cps_[to - 2 - slashes] == '\\') ++slashes;
      if (slashes % 2 == 0) {
        *end = true;
        --to;
      }
    }
    pos_ = from;
    end_ = to;
    const int root = alternation();
    if (pos_ != end_) error(fmt::format("unexpected `{}`", char_name(cps_[pos_])));
    return root;
  }
  std::vector<Node> nodes;

 private:
  [[noreturn]] void error(const std::string& what) const {
    throw Error(fmt::format("pattern `{}`: {}", pattern_, what));
  }
  static std::string char_name(uint32_t c) { return c < 0x80 ? std::string(1, char(c)) : fmt::format("U+{:04X}", c); }

  void decode() {
    for (size_t i = 0; i < pattern_.size();) {
      const auto b = uint8_t(pattern_[i]);
      const size_t len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
      if (i + len > pattern_.size()) error("not valid UTF-8");
      uint32_t c = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
      for (size_t k = 1; k < len; ++k) c = (c << 6) | (uint8_t(pattern_[i + k]) & 0x3F);
      cps_.push_back(c);
      i += len;
    }
  }

  bool more() const { return pos_ < end_; }
  uint32_t peek() const { return cps_[pos_]; }
  int add(Node n) {
    nodes.push_back(std::move(n));
    return int(nodes.size() - 1);
  }
  int set_node(Ranges r) {
    Node n;
    n.kind = Node::Set;
    n.set = normalize(std::move(r));
    return add(std::move(n));
  }

  int alternation() {
    std::vector<int> options{concatenation()};
    while (more() && peek() == '|') {
      ++pos_;
      options.push_back(concatenation());
    }
    if (options.size() == 1) return options[0];
    Node n;
    n.kind = Node::Alt;
    n.children = std::move(options);
    return add(std::move(n));
  }

  int concatenation() {
    Node n;
    n.kind = Node::Concat;
    while (more() && peek() != '|' && peek() != ')') n.children.push_back(repetition());
    return add(std::move(n));
  }

  bool read_number(int* value) {
    const size_t from = pos_;
    int64_t v = 0;
    while (more() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > 10000) error("a repetition count above 10000");
      ++pos_;
    }
    *value = int(v);
    return pos_ > from;
  }

  // {n}, {n,}, {n,m} at pos_ (on '{'); false (pos_ unchanged) when it is not one.
  bool braces(int* min, int* max) {
    const size_t at = pos_;
    ++pos_;
    if (!read_number(min)) {
      pos_ = at;
      return false;
    }
    *max = *min;
    if (more() && peek() == ',') {
      ++pos_;
      if (!read_number(max)) *max = -1;
    }
    if (!more() || peek() != '}') {
      pos_ = at;
      return false;
    }
    ++pos_;
    if (*max >= 0 && *max < *min) error("a repetition {n,m} with m < n");
    return true;
  }

  int repetition() {
    int child = atom();
    while (more()) {
      int min = 0, max = 0;
      const uint32_t c = peek();
      if (c == '*') min = 0, max = -1, ++pos_;
      else if (c == '+') min = 1, max = -1, ++pos_;
      else if (c == '?') min = 0, max = 1, ++pos_;
      else if (c == '{' && braces(&min, &max)) {
      } else break;
      if (more() && peek() == '?') ++pos_;  // lazy: the same texts
      Node n;
      n.kind = Node::Repeat;
      n.children = {child};
      n.min = min;
      n.max = max;
      child = add(std::move(n));
    }
    return child;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (!more()) error("a short hexadecimal escape");
      const uint32_t c = peek();
      int d = c >= '0' && c <= '9' ? int(c - '0') : c >= 'a' && c <= 'f' ? int(c - 'a' + 10)
                                                     : c >= 'A' && c <= 'F' ? int(c - 'A' + 10) : -1;
      if (d < 0) error("a bad hexadecimal escape");
      v = v * 16 + uint32_t(d);
      ++pos_;
    }
    return v;
  }

  // After a backslash: the set it stands for. `in_class`: \b is a backspace there.
  Ranges escape(bool in_class) {
    if (!more()) error("a trailing backslash");
    const uint32_t c = peek();
    ++pos_;
    switch (c) {
      case 'd': return kDigit;
      case 'D': return complement(kDigit);
      case 'w': return kWord;
      case 'W': return complement(kWord);
      case 's': return kSpace;
      case 'S': return complement(kSpace);
      case 't': return {{'\t', '\t'}};
      case 'n': return {{'\n', '\n'}};
      case 'r': return {{'\r', '\r'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case 'x': { const uint32_t v = hex(2); return {{v, v}}; }
      case 'u': { const uint32_t v = hex(4); return {{v, v}}; }
      case '0':
        if (more() && peek() >= '0' && peek() <= '9') error("octal escapes are not supported");
        return {{0, 0}};
      case 'b':
        if (in_class) return {{0x08, 0x08}};
        error("word boundaries (\\b) are not supported");
      case 'B': error("word boundaries (\\B) are not supported");
      case 'k': error("named backreferences are not supported");
      case 'p':
      case 'P': error("Unicode property escapes are not supported");
      case 'c': error("control escapes (\\c) are not supported");
      default:
        if (c >= '1' && c <= '9') error("backreferences are not supported");
        return {{c, c}};  // an escaped metacharacter or any other character stands for itself
    }
  }

  Ranges char_class() {
    bool negate = false;
    if (more() && peek() == '^') {
      negate = true;
      ++pos_;
    }
    Ranges set;
    bool first = true;
    while (true) {
      if (!more()) error("an unterminated class [...]");
      uint32_t c = peek();
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      ++pos_;
      Ranges item = c == '\\' ? escape(true) : Ranges{{c, c}};
      // A range a-b: both ends single characters.
      if (more() && peek() == '-' && pos_ + 1 < end_ && cps_[pos_ + 1] != ']' && item.size() == 1 &&
          item[0].first == item[0].second) {
        ++pos_;
        const uint32_t d = peek();
        ++pos_;
        Ranges hi = d == '\\' ? escape(true) : Ranges{{d, d}};
        if (hi.size() != 1 || hi[0].first != hi[0].second) error("a class range with a class escape at its end");
        if (hi[0].first < item[0].first) error("a class range out of order");
        item = {{item[0].first, hi[0].first}};
      }
      set.insert(set.end(), item.begin(), item.end());
    }
    return negate ? complement(set) : normalize(set);
  }

  int atom() {
    const uint32_t c = peek();
    ++pos_;
    switch (c) {
      case '(': {
        if (more() && peek() == '?') {
          ++pos_;
          if (more() && peek() == ':') {
            ++pos_;
          } else if (more() && peek() == '<' && pos_ + 1 < end_ && cps_[pos_ + 1] != '=' && cps_[pos_ + 1] != '!') {
            while (more() && peek() != '>') ++pos_;  // a named group: the name does not matter
            if (!more()) error("an unterminated group name");
            ++pos_;
          } else {
            error("lookahead and lookbehind are not supported");
          }
        }
        const int inner = alternation();
        if (!more() || peek() != ')') error("an unclosed group");
        ++pos_;
        return inner;
      }
      case '[': return set_node(char_class());
      case '.': return set_node(kDot);
      case '\\': return set_node(escape(false));
      case '^':
      case '$': error(fmt::format("`{}` is supported only at the very start / end of the pattern", char(c)));
      case '*':
      case '+':
      case '?': error(fmt::format("nothing to repeat before `{}`", char(c)));
      default: return set_node({{c, c}});
    }
  }

  std::string_view pattern_;
  std::vector<uint32_t> cps_;
  size_t pos_ = 0, end_ = 0;
};

// ---- codepoint ranges -> UTF-8 byte-range sequences (no surrogates) ------------------------

using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;

int utf8_length(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

std::vector<uint8_t> utf8_bytes(uint32_t c) {
  if (c < 0x80) return {uint8_t(c)};
  if (c < 0x800) return {uint8_t(0xC0 | (c >> 6)), uint8_t(0x80 | (c & 0x3F))};
  if (c < 0x10000) return {uint8_t(0xE0 | (c >> 12)), uint8_t(0x80 | ((c >> 6) & 0x3F)), uint8_t(0x80 | (c & 0x3F))};
  return {uint8_t(0xF0 | (c >> 18)), uint8_t(0x80 | ((c >> 12) & 0x3F)), uint8_t(0x80 | ((c >> 6) & 0x3F)),
          uint8_t(0x80 | (c & 0x3F))};
}

// Splits [lo, hi] until each piece is a product of byte ranges (every byte position ranges
// independently), as byte sequences.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteSeq>& out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {  // surrogates have no UTF-8 form
    if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
    return;
  }
  for (uint32_t b : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= b && hi > b) {
      utf8_sequences(lo, b, out);
      utf8_sequences(b + 1, hi, out);
      return;
    }
  }
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;  // the last i continuation bytes
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  const auto a = utf8_bytes(lo), b = utf8_bytes(hi);
  ByteSeq seq;
  for (size_t k = 0; k < a.size(); ++k) seq.emplace_back(a[k], b[k]);
  out.push_back(std::move(seq));
}

// ---- Thompson NFA over bytes ---------------------------------------------------------------

struct Nfa {
  struct Edge {
    uint8_t lo, hi;
    uint32_t to;
  };
  std::vector<std::vector<Edge>> edges;
  std::vector<std::vector<uint32_t>> eps;

  uint32_t state() {
    if (edges.size() >= kMaxNfaStates) throw Error("the pattern is too large (its automaton)");
    edges.emplace_back();
    eps.emplace_back();
    return uint32_t(edges.size() - 1);
  }

  // Adds the tree `id` between `from` and a new state, which it returns.
  uint32_t build(const std::vector<Node>& nodes, int id, uint32_t from) {
    const Node& n = nodes[size_t(id)];
    switch (n.kind) {
      case Node::Set: {
        const uint32_t to = state();
        std::vector<ByteSeq> seqs;
        for (const auto& [lo, hi] : n.set) utf8_sequences(lo, hi, seqs);
        for (const ByteSeq& seq : seqs) {
          uint32_t at = from;
          for (size_t k = 0; k < seq.size(); ++k) {
            const uint32_t next = k + 1 == seq.size() ? to : state();
            edges[at].push_back({seq[k].first, seq[k].second, next});
            at = next;
          }
        }
        return to;
      }
      case Node::Concat: {
        uint32_t at = from;
        for (int c : n.children) at = build(nodes, c, at);
        return at;
      }
      case Node::Alt: {
        const uint32_t to = state();
        for (int c : n.children) {
          const uint32_t s = state();
          eps[from].push_back(s);
          eps[build(nodes, c, s)].push_back(to);
        }
        return to;
      }
      case Node::Repeat: {
        uint32_t at = from;
        for (int i = 0; i < n.min; ++i) at = build(nodes, n.children[0], at);
        if (n.max < 0) {  // a loop: at -> body -> at, and out
          const uint32_t loop = state();
          eps[at].push_back(loop);
          eps[build(nodes, n.children[0], loop)].push_back(loop);
          return loop;
        }
        const uint32_t to = state();
        for (int i = n.min; i < n.max; ++i) {
          eps[at].push_back(to);
          at = build(nodes, n.children[0], at);
        }
        eps[at].push_back(to);
        return to;
      }
    }
    return from;
  }

  void closure(std::vector<uint32_t>& set) const {
    std::vector<uint32_t> stack(set);
    std::vector<bool> in(edges.size(), false);
    for (uint32_t s : set) in[s] = true;
    while (!stack.empty()) {
      const uint32_t s = stack.back();
      stack.pop_back();
      for (uint32_t t : eps[s])
        if (!in[t]) {
          in[t] = true;
          set.push_back(t);
          stack.push_back(t);
        }
    }
    std::sort(set.begin(), set.end());
  }
};

}  // namespace

std::array<bool, 256> RegexDfa::all_bytes() {
  std::array<bool, 256> all;
  all.fill(true);
  return all;
}

RegexDfa RegexDfa::compile(std::string_view pattern, Match match, const std::array<bool, 256>& producible) {
  Parser parser(pattern);
  bool anchored_start = false, anchored_end = false;
  int root = parser.parse(&anchored_start, &anchored_end);
  std::vector<Node> nodes = std::move(parser.nodes);
  if (match == Match::Search) {  // unanchored sides take any text
    Node any;
    any.kind = Node::Set;
    any.set = {{0, kMaxCodepoint}};
    nodes.push_back(any);
    Node star;
    star.kind = Node::Repeat;
    star.children = {int(nodes.size() - 1)};
    star.min = 0;
    star.max = -1;
    nodes.push_back(star);
    const int anything = int(nodes.size() - 1);
    Node seq;
    seq.kind = Node::Concat;
    if (!anchored_start) seq.children.push_back(anything);
    seq.children.push_back(root);
    if (!anchored_end) seq.children.push_back(anything);
    nodes.push_back(seq);
    root = int(nodes.size() - 1);
  }
  Nfa nfa;
  const uint32_t start = nfa.state();
  const uint32_t accept = nfa.build(nodes, root, start);

  // Subset construction.
  RegexDfa dfa;
  std::map<std::vector<uint32_t>, uint32_t> ids;
  std::vector<std::vector<uint32_t>> sets;
  std::vector<uint32_t> first{start};
  nfa.closure(first);
  ids[first] = 0;
  sets.push_back(first);
  for (size_t d = 0; d < sets.size(); ++d) {
    std::array<std::vector<uint32_t>, 256> moves;
    for (uint32_t s : sets[d])
      for (const auto& e : nfa.edges[s])
        for (int b = e.lo; b <= e.hi; ++b)
          if (producible[size_t(b)]) moves[size_t(b)].push_back(e.to);
    dfa.table_.resize((d + 1) * 256, kDead);
    for (int b = 0; b < 256; ++b) {
      auto& next = moves[size_t(b)];
      if (next.empty()) continue;
      std::sort(next.begin(), next.end());
      next.erase(std::unique(next.begin(), next.end()), next.end());
      nfa.closure(next);
      auto [it, added] = ids.emplace(next, uint32_t(sets.size()));
      if (added) {
        if (sets.size() >= kMaxStates)
          throw Error(fmt::format("pattern `{}`: too complex (more than {} automaton states)", pattern, kMaxStates));
        sets.push_back(next);
      }
      dfa.table_[d * 256 + size_t(b)] = it->second;
    }
    dfa.accepting_.push_back(std::binary_search(sets[d].begin(), sets[d].end(), accept));
  }

  // Drop the states from which no accepting state can be reached.
  const size_t n = sets.size();
  std::vector<std::vector<uint32_t>> back(n);
  for (size_t d = 0; d < n; ++d)
    for (int b = 0; b < 256; ++b)
      if (const uint32_t t = dfa.table_[d * 256 + size_t(b)]; t != kDead) back[t].push_back(uint32_t(d));
  std::vector<bool> live(n, false);
  std::vector<uint32_t> stack;
  for (size_t d = 0; d < n; ++d)
    if (dfa.accepting_[d]) {
      live[d] = true;
      stack.push_back(uint32_t(d));
    }
  while (!stack.empty()) {
    const uint32_t d = stack.back();
    stack.pop_back();
    for (uint32_t p : back[d])
      if (!live[p]) {
        live[p] = true;
        stack.push_back(p);
      }
  }
  if (!live[0]) throw Error(fmt::format("pattern `{}`: no text it accepts can be written here", pattern));
  for (auto& t : dfa.table_)
    if (t != kDead && !live[t]) t = kDead;
  return dfa;
}

RegexDfa RegexDfa::from_literals(const std::vector<std::string>& texts) {
  RegexDfa dfa;
  dfa.table_.assign(256, kDead);
  dfa.accepting_.assign(1, false);
  for (const std::string& text : texts) {
    uint32_t s = 0;
    for (char c : text) {
      uint32_t& next = dfa.table_[size_t(s) * 256 + uint8_t(c)];
      if (next == kDead) {
        next = uint32_t(dfa.accepting_.size());
        dfa.accepting_.push_back(false);
        dfa.table_.resize(dfa.table_.size() + 256, kDead);
      }
      s = dfa.table_[size_t(s) * 256 + uint8_t(c)];  // `next` may dangle after the resize
    }
    dfa.accepting_[s] = true;
  }
  return dfa;
}

bool RegexDfa::matches(std::string_view text) const {
  uint32_t s = start();
  for (char c : text) {
    s = next(s, uint8_t(c));
    if (s == kDead) return false;
  }
  return accepting(s);
}

}  // namespace moeserve::structured
