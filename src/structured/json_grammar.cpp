#include "structured/json_grammar.h"

#include <utility>

namespace moeserve::structured {

JsonGrammar::JsonGrammar() {
  nodes.resize(4);
  nodes[kAny].kind = NodeKind::Any;
  nodes[kAnyObject].kind = NodeKind::Object;
  nodes[kAnyObject].additional = kAny;
  nodes[kAnyArray].kind = NodeKind::Array;
  nodes[kAnyArray].items = kAny;
  nodes[kAnyString].kind = NodeKind::String;
  literals = {"true", "false", "null"};
}

uint32_t JsonGrammar::add_node(JsonNode node) {
  nodes.push_back(std::move(node));
  return uint32_t(nodes.size() - 1);
}

uint32_t JsonGrammar::add_literal(std::string text) {
  for (size_t i = 0; i < literals.size(); ++i)
    if (literals[i] == text) return uint32_t(i);
  literals.push_back(std::move(text));
  return uint32_t(literals.size() - 1);
}

JsonGrammar any_json_object() {
  JsonGrammar g;
  g.root = JsonGrammar::kAnyObject;
  return g;
}

JsonGrammar regex_text(std::string_view pattern) {
  JsonGrammar g;
  g.patterns.push_back(RegexDfa::compile(pattern, RegexDfa::Match::Full, RegexDfa::all_bytes()));
  JsonNode node;
  node.kind = NodeKind::Pattern;
  node.pattern = 0;
  g.root = g.add_node(std::move(node));
  g.leading_whitespace = false;
  return g;
}

const std::array<bool, 256>& json_string_bytes() {
  static const std::array<bool, 256> bytes = [] {
    std::array<bool, 256> b{};
    for (int c = 0x20; c <= 0xF4; ++c) b[size_t(c)] = true;
    for (int c : {0x08, 0x09, 0x0A, 0x0C, 0x0D}) b[size_t(c)] = true;
    return b;
  }();
  return bytes;
}

JsonGrammar literal_choice(const std::vector<std::string>& texts) {
  JsonGrammar g;
  JsonNode choice;
  choice.kind = NodeKind::AnyOf;
  for (const auto& text : texts) {
    JsonNode literal;
    literal.kind = NodeKind::Literal;
    literal.literal = g.add_literal(text);
    choice.options.push_back(g.add_node(std::move(literal)));
  }
  g.root = g.add_node(std::move(choice));
  g.leading_whitespace = false;
  return g;
}

}  // namespace moeserve::structured
