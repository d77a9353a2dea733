// The recursive-descent parser shared by parser_stmt.cpp (statements) and
// parser_expr.cpp (expressions). Internal to the jinja folder.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace moeserve::text::jinja {

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& template_name)
      : tokens_(std::move(tokens)), name_(template_name) {}

  TemplateAst parse();

  // ---- statements (parser_stmt.cpp) ----
  StmtList subparse(const std::vector<std::string>& end_tags);
  StmtList parse_statements(const std::vector<std::string>& end_tags, bool drop_needle);
  StmtPtr parse_statement();
  StmtPtr parse_for();
  StmtPtr parse_if();
  StmtPtr parse_set();
  StmtPtr parse_macro();
  StmtPtr parse_call_block();
  StmtPtr parse_filter_block();
  StmtPtr parse_with();
  StmtPtr parse_block();
  StmtPtr parse_print();
  StmtPtr parse_loop_control(StmtKind kind);
  StmtPtr parse_generation();
  StmtPtr parse_unsupported(const std::string& tag);
  void parse_signature(MacroDef& def);
  void parse_macro_body(MacroDef& def, const std::string& end_tag);
  Target parse_assign_target(bool with_tuple, bool name_only, const std::vector<std::string>& extra_end,
                             bool with_namespace);
  Target to_target(const Expr& e);

  // ---- expressions (parser_expr.cpp) ----
  ExprPtr parse_expression(bool with_condexpr = true);
  ExprPtr parse_condexpr();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter = true);
  ExprPtr parse_primary(bool with_namespace = false);
  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end,
                      bool explicit_parentheses, bool with_namespace = false);
  ExprPtr parse_list();
  ExprPtr parse_dict();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  CallArgsExpr parse_call_args();
  ExprPtr parse_call(ExprPtr node);
  // Parses "|f1|f2(...)" (or, with start_inline, "f1|f2" right after a tag name).
  ExprPtr parse_filter(ExprPtr node, bool start_inline);
  ExprPtr parse_test(ExprPtr node);

  // ---- token stream ----
  const Token& current() const { return tokens_[pos_]; }
  const Token& look() const { return tokens_[pos_ + 1 < tokens_.size() ? pos_ + 1 : pos_]; }
  const Token& next();  // returns the token consumed
  bool is_name(const std::string& value) const;
  bool is_op(Op op) const;
  bool skip_name(const std::string& value);
  bool skip_op(Op op);
  const Token& expect(TokenType type);
  const Token& expect_op(Op op);
  const Token& expect_name(const std::string& value);
  std::string expect_identifier();
  bool at_tuple_end(const std::vector<std::string>& extra_end) const;

  [[noreturn]] void fail(const std::string& message, int line) const;
  [[noreturn]] void fail_unexpected(const std::string& expected) const;
  [[noreturn]] void fail_unknown_tag(const std::string& tag, int line) const;
  [[noreturn]] void fail_eof(const std::vector<std::string>& end_tags) const;

  // Nesting guard for recursion (expressions and blocks).
  class DepthGuard {
   public:
    explicit DepthGuard(Parser& p);
    ~DepthGuard() { --parser_.depth_; }
   private:
    Parser& parser_;
  };
  // Left-deep chains (a + b + c, x.a.b, x|f|g) nest the tree one level per link
  // without recursing; each link counts toward the depth until the chain is done.
  class ChainGuard {
   public:
    explicit ChainGuard(Parser& p) : parser_(p) {}
    ~ChainGuard() { parser_.depth_ -= links_; }
    void link();
   private:
    Parser& parser_;
    int links_ = 0;
  };
  // Saves a parser flag and restores it on scope exit.
  class FlagGuard {
   public:
    FlagGuard(bool& flag, bool value) : flag_(flag), saved_(flag) { flag_ = value; }
    ~FlagGuard() { flag_ = saved_; }
   private:
    bool& flag_;
    bool saved_;
  };

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  const std::string& name_;
  int depth_ = 0;
  // Inside an if-branch or conditional expression, unknown filters/tests are only an
  // error when evaluated (jinja's "soft frame").
  bool soft_ = false;
  int loop_depth_ = 0;
  std::vector<std::string> tag_stack_;
  std::vector<std::vector<std::string>> end_tag_stack_;
  // Names read inside each macro body being parsed (to detect caller/varargs/kwargs).
  std::vector<std::set<std::string>> macro_names_;
};

}  // namespace moeserve::text::jinja
