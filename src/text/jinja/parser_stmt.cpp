// Statement parsing: the template body, control tags, macros, assignment targets, and
// the token-stream helpers and error messages shared with parser_expr.cpp.
#include <algorithm>

#include <fmt/format.h>

#include "text/jinja/error.h"
#include "text/jinja/parser.h"
#include "text/jinja/parser_impl.h"

namespace moeserve::text::jinja {
namespace {

std::string quoted_list(const std::vector<std::string>& tags) {
  std::string out;
  for (size_t i = 0; i < tags.size(); ++i) {
    if (i) out += " or ";
    out += "'" + tags[i] + "'";
  }
  return out;
}

}  // namespace

TemplateAst parse_template(std::string_view source, const std::string& template_name) {
  return Parser(tokenize(source, template_name), template_name).parse();
}

// ---- token stream -------------------------------------------------------------------

const Token& Parser::next() {
  const Token& t = tokens_[pos_];
  if (t.type != TokenType::kEof) ++pos_;
  return t;
}

bool Parser::is_name(const std::string& value) const {
  return current().type == TokenType::kName && current().text == value;
}

bool Parser::is_op(Op op) const { return current().type == TokenType::kOperator && current().op == op; }

bool Parser::skip_name(const std::string& value) {
  if (!is_name(value)) return false;
  next();
  return true;
}

bool Parser::skip_op(Op op) {
  if (!is_op(op)) return false;
  next();
  return true;
}

const Token& Parser::expect(TokenType type) {
  if (current().type != type) {
    Token wanted;
    wanted.type = type;
    fail_unexpected(describe_token(wanted));
  }
  return next();
}

const Token& Parser::expect_op(Op op) {
  if (!is_op(op)) fail_unexpected(std::string(op_text(op)));
  return next();
}

const Token& Parser::expect_name(const std::string& value) {
  if (!is_name(value)) fail_unexpected(value);
  return next();
}

std::string Parser::expect_identifier() {
  if (current().type != TokenType::kName) fail_unexpected("name");
  return next().text;
}

bool Parser::at_tuple_end(const std::vector<std::string>& extra_end) const {
  TokenType t = current().type;
  if (t == TokenType::kVariableEnd || t == TokenType::kBlockEnd || is_op(Op::kRParen)) return true;
  return std::any_of(extra_end.begin(), extra_end.end(), [&](const std::string& n) { return is_name(n); });
}

void Parser::fail(const std::string& message, int line) const {
  throw TemplateError(TemplateError::Kind::kSyntax, message, name_, line);
}

void Parser::fail_unexpected(const std::string& expected) const {
  if (current().type == TokenType::kEof) {
    fail(fmt::format("unexpected end of template, expected '{}'.", expected), current().line);
  }
  fail(fmt::format("expected token '{}', got '{}'", expected, describe_token(current())), current().line);
}

void Parser::fail_unknown_tag(const std::string& tag, int line) const {
  std::string message = fmt::format("Encountered unknown tag '{}'.", tag);
  if (!end_tag_stack_.empty()) {
    bool expected_elsewhere = false;
    for (const auto& tags : end_tag_stack_)
      expected_elsewhere |= std::find(tags.begin(), tags.end(), tag) != tags.end();
    std::string looking = quoted_list(end_tag_stack_.back());
    if (expected_elsewhere)
      message += fmt::format(
          " You probably made a nesting mistake. Jinja is expecting this tag, but currently looking for {}.",
          looking);
    else
      message += fmt::format(" Jinja was looking for the following tags: {}.", looking);
  }
  if (!tag_stack_.empty())
    message += fmt::format(" The innermost block that needs to be closed is '{}'.", tag_stack_.back());
  fail(message, line);
}

void Parser::fail_eof(const std::vector<std::string>& end_tags) const {
  std::string message = "Unexpected end of template.";
  if (!end_tags.empty()) message += fmt::format(" Jinja was looking for the following tags: {}.", quoted_list(end_tags));
  if (!tag_stack_.empty())
    message += fmt::format(" The innermost block that needs to be closed is '{}'.", tag_stack_.back());
  fail(message, current().line);
}

Parser::DepthGuard::DepthGuard(Parser& p) : parser_(p) {
  if (++parser_.depth_ > kMaxParseDepth)
    parser_.fail(fmt::format("the template nests deeper than {} levels", kMaxParseDepth), parser_.current().line);
}

void Parser::ChainGuard::link() {
  ++links_;
  if (++parser_.depth_ > kMaxParseDepth)
    parser_.fail(fmt::format("the template nests deeper than {} levels", kMaxParseDepth), parser_.current().line);
}

// ---- body -------------------------------------------------------------------------------

TemplateAst Parser::parse() {
  TemplateAst ast;
  ast.body = subparse({});
  return ast;
}

StmtList Parser::subparse(const std::vector<std::string>& end_tags) {
  StmtList body;
  if (!end_tags.empty()) end_tag_stack_.push_back(end_tags);
  struct PopEndTags {
    Parser& p;
    bool active;
    ~PopEndTags() {
      if (active) p.end_tag_stack_.pop_back();
    }
  } pop{*this, !end_tags.empty()};

  while (current().type != TokenType::kEof) {
    const Token& token = current();
    switch (token.type) {
      case TokenType::kData:
        body.push_back(std::make_unique<TextStmt>(token.text, token.line));
        next();
        break;
      case TokenType::kVariableBegin: {
        next();
        int line = current().line;
        ExprPtr e = parse_tuple(false, true, {}, false);
        expect(TokenType::kVariableEnd);
        body.push_back(std::make_unique<PrintStmt>(std::move(e), line));
        break;
      }
      case TokenType::kBlockBegin: {
        next();
        if (current().type == TokenType::kName &&
            std::find(end_tags.begin(), end_tags.end(), current().text) != end_tags.end())
          return body;
        body.push_back(parse_statement());
        expect(TokenType::kBlockEnd);
        break;
      }
      default:
        fail_unexpected("template data");
    }
  }
  return body;
}

StmtList Parser::parse_statements(const std::vector<std::string>& end_tags, bool drop_needle) {
  skip_op(Op::kColon);
  expect(TokenType::kBlockEnd);
  DepthGuard depth(*this);
  StmtList body = subparse(end_tags);
  if (current().type == TokenType::kEof) fail_eof(end_tags);
  if (drop_needle) next();
  return body;
}

StmtPtr Parser::parse_statement() {
  const Token& token = current();
  if (token.type != TokenType::kName) fail("tag name expected", token.line);
  std::string tag = token.text;
  int line = token.line;
  static const std::vector<std::string> kKnown = {"for",   "if",      "set",      "macro",    "call",
                                                  "filter", "with",   "block",    "print",    "break",
                                                  "continue", "generation", "include", "import", "from",
                                                  "extends", "autoescape"};
  if (std::find(kKnown.begin(), kKnown.end(), tag) == kKnown.end()) fail_unknown_tag(tag, line);
  tag_stack_.push_back(tag);
  struct PopTag {
    Parser& p;
    ~PopTag() { p.tag_stack_.pop_back(); }
  } pop{*this};

  if (tag == "for") return parse_for();
  if (tag == "if") return parse_if();
  if (tag == "set") return parse_set();
  if (tag == "macro") return parse_macro();
  if (tag == "call") return parse_call_block();
  if (tag == "filter") return parse_filter_block();
  if (tag == "with") return parse_with();
  if (tag == "block") return parse_block();
  if (tag == "print") return parse_print();
  if (tag == "break") return parse_loop_control(StmtKind::kBreak);
  if (tag == "continue") return parse_loop_control(StmtKind::kContinue);
  if (tag == "generation") return parse_generation();
  if (tag == "autoescape") fail("the 'autoescape' tag is not supported (chat templates render without escaping)", line);
  return parse_unsupported(tag);
}

StmtPtr Parser::parse_for() {
  auto stmt = std::make_unique<ForStmt>(expect_name("for").line);
  stmt->target = parse_assign_target(true, false, {"in"}, false);
  expect_name("in");
  stmt->iterable = parse_tuple(false, false, {"recursive"}, false);
  if (skip_name("if")) {
    FlagGuard hard(soft_, false);
    stmt->condition = parse_expression();
  }
  stmt->recursive = skip_name("recursive");
  {
    FlagGuard hard(soft_, false);
    ++loop_depth_;
    stmt->body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
  }
  if (next().text != "endfor") stmt->else_body = parse_statements({"endfor"}, true);
  return stmt;
}

StmtPtr Parser::parse_if() {
  auto stmt = std::make_unique<IfStmt>(expect_name("if").line);
  FlagGuard soft(soft_, true);
  while (true) {
    ExprPtr test = parse_tuple(false, false, {}, false);
    StmtList body = parse_statements({"elif", "else", "endif"}, false);
    stmt->branches.emplace_back(std::move(test), std::move(body));
    const Token& token = next();
    if (token.text == "elif") continue;
    if (token.text == "else") stmt->else_body = parse_statements({"endif"}, true);
    break;
  }
  return stmt;
}

StmtPtr Parser::parse_set() {
  int line = next().line;
  Target target = parse_assign_target(true, false, {}, true);
  if (skip_op(Op::kAssign)) {
    auto stmt = std::make_unique<SetStmt>(line);
    stmt->target = std::move(target);
    stmt->value = parse_tuple(false, true, {}, false);
    return stmt;
  }
  auto stmt = std::make_unique<SetBlockStmt>(line);
  stmt->target = std::move(target);
  FlagGuard hard(soft_, false);
  stmt->filter = parse_filter(nullptr, false);
  stmt->body = parse_statements({"endset"}, true);
  return stmt;
}

void Parser::parse_signature(MacroDef& def) {
  expect_op(Op::kLParen);
  while (!is_op(Op::kRParen)) {
    if (!def.params.empty()) expect_op(Op::kComma);
    Target arg = parse_assign_target(false, true, {}, false);
    if (skip_op(Op::kAssign)) {
      FlagGuard hard(soft_, false);
      def.defaults.push_back(parse_expression());
    } else if (!def.defaults.empty()) {
      fail("non-default argument follows default argument", arg.line);
    }
    def.params.push_back(arg.name);
  }
  expect_op(Op::kRParen);
}

void Parser::parse_macro_body(MacroDef& def, const std::string& end_tag) {
  FlagGuard hard(soft_, false);
  int saved_loop_depth = loop_depth_;
  loop_depth_ = 0;
  macro_names_.emplace_back();
  def.body = parse_statements({end_tag}, true);
  std::set<std::string> names = std::move(macro_names_.back());
  macro_names_.pop_back();
  loop_depth_ = saved_loop_depth;
  auto free_name = [&](const std::string& n) {
    return names.count(n) && std::find(def.params.begin(), def.params.end(), n) == def.params.end();
  };
  def.uses_caller = free_name("caller");
  def.uses_varargs = free_name("varargs");
  def.uses_kwargs = free_name("kwargs");
}

StmtPtr Parser::parse_macro() {
  auto stmt = std::make_unique<MacroStmt>(next().line);
  stmt->def.line = stmt->line;
  stmt->def.name = parse_assign_target(false, true, {}, false).name;
  parse_signature(stmt->def);
  parse_macro_body(stmt->def, "endmacro");
  return stmt;
}

StmtPtr Parser::parse_call_block() {
  auto stmt = std::make_unique<CallBlockStmt>(next().line);
  stmt->caller.name = "caller";
  stmt->caller.line = stmt->line;
  if (is_op(Op::kLParen)) parse_signature(stmt->caller);
  stmt->call = parse_expression();
  if (stmt->call->kind != ExprKind::kCall) fail("expected call", stmt->line);
  parse_macro_body(stmt->caller, "endcall");
  return stmt;
}

StmtPtr Parser::parse_filter_block() {
  auto stmt = std::make_unique<FilterBlockStmt>(next().line);
  FlagGuard hard(soft_, false);
  stmt->filter = parse_filter(nullptr, true);
  stmt->body = parse_statements({"endfilter"}, true);
  return stmt;
}

StmtPtr Parser::parse_with() {
  auto stmt = std::make_unique<WithStmt>(next().line);
  while (current().type != TokenType::kBlockEnd) {
    if (!stmt->assignments.empty()) expect_op(Op::kComma);
    Target target = parse_assign_target(true, false, {}, false);
    expect_op(Op::kAssign);
    stmt->assignments.emplace_back(std::move(target), parse_expression());
  }
  FlagGuard hard(soft_, false);
  stmt->body = parse_statements({"endwith"}, true);
  return stmt;
}

StmtPtr Parser::parse_block() {
  int line = next().line;
  std::string block_name = expect_identifier();
  skip_name("scoped");
  skip_name("required");
  if (is_op(Op::kSub)) fail("Block names in Jinja have to be valid Python identifiers and may not contain hyphens, use an underscore instead.", line);
  auto stmt = std::make_unique<ScopeStmt>(line, true);
  FlagGuard hard(soft_, false);
  stmt->body = parse_statements({"endblock"}, true);
  skip_name(block_name);
  return stmt;
}

StmtPtr Parser::parse_print() {
  int line = next().line;
  auto stmt = std::make_unique<ScopeStmt>(line, false);
  while (current().type != TokenType::kBlockEnd) {
    if (!stmt->body.empty()) expect_op(Op::kComma);
    int expr_line = current().line;
    stmt->body.push_back(std::make_unique<PrintStmt>(parse_expression(), expr_line));
  }
  return stmt;
}

StmtPtr Parser::parse_loop_control(StmtKind kind) {
  int line = next().line;
  if (loop_depth_ == 0)
    fail(fmt::format("'{}' outside loop", kind == StmtKind::kBreak ? "break" : "continue"), line);
  return std::make_unique<Stmt>(kind, line);
}

StmtPtr Parser::parse_generation() {
  // transformers' AssistantTracker extension: the body renders in place (as a call
  // block, so in its own frame); the tracked offsets matter only for training masks.
  auto stmt = std::make_unique<ScopeStmt>(next().line, true);
  FlagGuard hard(soft_, false);
  stmt->body = parse_statements({"endgeneration"}, true);
  return stmt;
}

StmtPtr Parser::parse_unsupported(const std::string& tag) {
  int line = next().line;
  while (current().type != TokenType::kBlockEnd && current().type != TokenType::kEof) next();
  return std::make_unique<UnsupportedStmt>(tag, line);
}

// ---- assignment targets -------------------------------------------------------------------

Target Parser::parse_assign_target(bool with_tuple, bool name_only, const std::vector<std::string>& extra_end,
                                   bool with_namespace) {
  if (name_only) {
    Target t;
    t.line = current().line;
    t.name = expect_identifier();
    return t;
  }
  ExprPtr e = with_tuple ? parse_tuple(true, true, extra_end, false, with_namespace) : parse_primary(with_namespace);
  return to_target(*e);
}

Target Parser::to_target(const Expr& e) {
  Target t;
  t.line = e.line;
  switch (e.kind) {
    case ExprKind::kName:
      t.kind = Target::Kind::kName;
      t.name = static_cast<const NameExpr&>(e).name;
      return t;
    case ExprKind::kNamespaceRef: {
      const auto& ref = static_cast<const NamespaceRefExpr&>(e);
      t.kind = Target::Kind::kNamespaceAttr;
      t.name = ref.name;
      t.attribute = ref.attribute;
      return t;
    }
    case ExprKind::kTuple:
      t.kind = Target::Kind::kTuple;
      for (const auto& item : static_cast<const SequenceExpr&>(e).items) t.items.push_back(to_target(*item));
      return t;
    default: {
      const char* what = e.kind == ExprKind::kConst ? "const" : e.kind == ExprKind::kList ? "list" : "expression";
      fail(fmt::format("can't assign to '{}'", what), e.line);
    }
  }
}

}  // namespace moeserve::text::jinja
