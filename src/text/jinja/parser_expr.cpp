// Expression parsing, one function per precedence level as in jinja2.parser:
// condexpr < or < and < not < compare < math1 (+ -) < concat (~) < math2 (* / // %)
// < pow (**) < unary (- +) < primary/postfix, with filters and tests applied right after
// the postfix expression of a unary operand.
#include <fmt/format.h>

#include "text/jinja/error.h"
#include "text/jinja/filters.h"
#include "text/jinja/parser_impl.h"
#include "text/jinja/predicates.h"

namespace moeserve::text::jinja {

ExprPtr Parser::parse_expression(bool with_condexpr) {
  DepthGuard depth(*this);
  return with_condexpr ? parse_condexpr() : parse_or();
}

ExprPtr Parser::parse_condexpr() {
  int line = current().line;
  ExprPtr expr1 = parse_or();
  ChainGuard chain(*this);
  while (skip_name("if")) {
    chain.link();
    FlagGuard soft(soft_, true);
    auto cond = std::make_unique<CondExpr>(line);
    cond->test = parse_or();
    if (skip_name("else")) cond->else_value = parse_condexpr();
    cond->then_value = std::move(expr1);
    expr1 = std::move(cond);
    line = current().line;
  }
  return expr1;
}

ExprPtr Parser::parse_or() {
  int line = current().line;
  ExprPtr left = parse_and();
  ChainGuard chain(*this);
  while (skip_name("or")) {
    chain.link();
    left = std::make_unique<LogicalExpr>(ExprKind::kOr, std::move(left), parse_and(), line);
    line = current().line;
  }
  return left;
}

ExprPtr Parser::parse_and() {
  int line = current().line;
  ExprPtr left = parse_not();
  ChainGuard chain(*this);
  while (skip_name("and")) {
    chain.link();
    left = std::make_unique<LogicalExpr>(ExprKind::kAnd, std::move(left), parse_not(), line);
    line = current().line;
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    int line = next().line;
    DepthGuard depth(*this);
    return std::make_unique<UnaryExpr>(ExprKind::kNot, parse_not(), line);
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  int line = current().line;
  ExprPtr expr = parse_math1();
  std::unique_ptr<CompareExpr> cmp;
  while (true) {
    CompareOp op;
    if (is_op(Op::kEq)) op = CompareOp::kEq;
    else if (is_op(Op::kNe)) op = CompareOp::kNe;
    else if (is_op(Op::kLt)) op = CompareOp::kLt;
    else if (is_op(Op::kLe)) op = CompareOp::kLe;
    else if (is_op(Op::kGt)) op = CompareOp::kGt;
    else if (is_op(Op::kGe)) op = CompareOp::kGe;
    else if (is_name("in")) op = CompareOp::kIn;
    else if (is_name("not") && look().type == TokenType::kName && look().text == "in") op = CompareOp::kNotIn;
    else break;
    next();
    if (op == CompareOp::kNotIn) next();
    if (!cmp) cmp = std::make_unique<CompareExpr>(std::move(expr), line);
    cmp->rest.emplace_back(op, parse_math1());
  }
  if (cmp) return cmp;
  return expr;
}

ExprPtr Parser::parse_math1() {
  int line = current().line;
  ExprPtr left = parse_concat();
  ChainGuard chain(*this);
  while (is_op(Op::kAdd) || is_op(Op::kSub)) {
    chain.link();
    BinaryOp op = next().op == Op::kAdd ? BinaryOp::kAdd : BinaryOp::kSub;
    left = std::make_unique<BinaryExpr>(op, std::move(left), parse_concat(), line);
    line = current().line;
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  int line = current().line;
  ExprPtr first = parse_math2();
  if (!is_op(Op::kTilde)) return first;
  auto concat = std::make_unique<ConcatExpr>(line);
  concat->parts.push_back(std::move(first));
  while (skip_op(Op::kTilde)) concat->parts.push_back(parse_math2());
  return concat;
}

ExprPtr Parser::parse_math2() {
  int line = current().line;
  ExprPtr left = parse_pow();
  ChainGuard chain(*this);
  while (is_op(Op::kMul) || is_op(Op::kDiv) || is_op(Op::kFloorDiv) || is_op(Op::kMod)) {
    chain.link();
    Op token_op = next().op;
    BinaryOp op = token_op == Op::kMul ? BinaryOp::kMul
                  : token_op == Op::kDiv ? BinaryOp::kDiv
                  : token_op == Op::kFloorDiv ? BinaryOp::kFloorDiv
                                              : BinaryOp::kMod;
    left = std::make_unique<BinaryExpr>(op, std::move(left), parse_pow(), line);
    line = current().line;
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  int line = current().line;
  ExprPtr left = parse_unary();
  ChainGuard chain(*this);
  while (skip_op(Op::kPow)) {
    chain.link();
    left = std::make_unique<BinaryExpr>(BinaryOp::kPow, std::move(left), parse_unary(), line);
    line = current().line;
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  int line = current().line;
  ExprPtr node;
  if (is_op(Op::kSub) || is_op(Op::kAdd)) {
    ExprKind kind = next().op == Op::kSub ? ExprKind::kNeg : ExprKind::kPos;
    DepthGuard depth(*this);
    node = std::make_unique<UnaryExpr>(kind, parse_unary(false), line);
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ExprPtr Parser::parse_primary(bool with_namespace) {
  const Token& token = current();
  int line = token.line;
  switch (token.type) {
    case TokenType::kName: {
      std::string name = next().text;
      if (name == "true" || name == "True") return std::make_unique<ConstExpr>(Value::boolean(true), line);
      if (name == "false" || name == "False") return std::make_unique<ConstExpr>(Value::boolean(false), line);
      if (name == "none" || name == "None") return std::make_unique<ConstExpr>(Value::none(), line);
      if (with_namespace && is_op(Op::kDot)) {
        next();
        std::string attribute = expect_identifier();
        return std::make_unique<NamespaceRefExpr>(name, attribute, line);
      }
      for (auto& names : macro_names_) names.insert(name);
      return std::make_unique<NameExpr>(name, line);
    }
    case TokenType::kString: {
      std::string text = next().text;
      while (current().type == TokenType::kString) text += next().text;  // "a" "b" -> "ab"
      return std::make_unique<ConstExpr>(Value::string(std::move(text)), line);
    }
    case TokenType::kInteger: return std::make_unique<ConstExpr>(Value::integer(next().int_value), line);
    case TokenType::kFloat: return std::make_unique<ConstExpr>(Value::floating(next().float_value), line);
    case TokenType::kOperator:
      if (token.op == Op::kLParen) {
        next();
        DepthGuard depth(*this);
        ExprPtr e = parse_tuple(false, true, {}, true);
        expect_op(Op::kRParen);
        return e;
      }
      if (token.op == Op::kLBracket) return parse_list();
      if (token.op == Op::kLBrace) return parse_dict();
      break;
    default: break;
  }
  fail(fmt::format("unexpected '{}'", describe_token(token)), line);
}

ExprPtr Parser::parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end,
                            bool explicit_parentheses, bool with_namespace) {
  int line = current().line;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) expect_op(Op::kComma);
    if (at_tuple_end(extra_end)) break;
    items.push_back(simplified ? parse_primary(with_namespace) : parse_expression(with_condexpr));
    if (is_op(Op::kComma))
      is_tuple = true;
    else
      break;
    line = current().line;
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parentheses)
      fail(fmt::format("Expected an expression, got '{}'", describe_token(current())), current().line);
  }
  auto tuple = std::make_unique<SequenceExpr>(ExprKind::kTuple, line);
  tuple->items = std::move(items);
  return tuple;
}

ExprPtr Parser::parse_list() {
  int line = expect_op(Op::kLBracket).line;
  DepthGuard depth(*this);
  auto list = std::make_unique<SequenceExpr>(ExprKind::kList, line);
  while (!is_op(Op::kRBracket)) {
    if (!list->items.empty()) expect_op(Op::kComma);
    if (is_op(Op::kRBracket)) break;
    list->items.push_back(parse_expression());
  }
  expect_op(Op::kRBracket);
  return list;
}

ExprPtr Parser::parse_dict() {
  int line = expect_op(Op::kLBrace).line;
  DepthGuard depth(*this);
  auto dict = std::make_unique<DictExpr>(line);
  while (!is_op(Op::kRBrace)) {
    if (!dict->items.empty()) expect_op(Op::kComma);
    if (is_op(Op::kRBrace)) break;
    ExprPtr key = parse_expression();
    expect_op(Op::kColon);
    dict->items.emplace_back(std::move(key), parse_expression());
  }
  expect_op(Op::kRBrace);
  return dict;
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  ChainGuard chain(*this);
  while (true) {
    if (is_op(Op::kDot) || is_op(Op::kLBracket)) {
      chain.link();
      node = parse_subscript(std::move(node));
    } else if (is_op(Op::kLParen)) {
      chain.link();
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  ChainGuard chain(*this);
  while (true) {
    if (is_op(Op::kPipe)) {
      node = parse_filter(std::move(node), false);
    } else if (is_name("is")) {
      chain.link();
      node = parse_test(std::move(node));
    } else if (is_op(Op::kLParen)) {
      chain.link();
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr node) {
  const Token& token = next();
  int line = token.line;
  if (token.op == Op::kDot) {
    const Token& attr = current();
    if (attr.type == TokenType::kName) {
      std::string name = next().text;
      return std::make_unique<GetattrExpr>(std::move(node), std::move(name), line);
    }
    if (attr.type != TokenType::kInteger) fail("expected name or number", attr.line);
    auto index = std::make_unique<ConstExpr>(Value::integer(next().int_value), attr.line);
    return std::make_unique<GetitemExpr>(std::move(node), std::move(index), line);
  }
  // '['
  DepthGuard depth(*this);
  std::vector<ExprPtr> args;
  while (!is_op(Op::kRBracket)) {
    if (!args.empty()) expect_op(Op::kComma);
    args.push_back(parse_subscribed());
  }
  expect_op(Op::kRBracket);
  if (args.size() == 1) return std::make_unique<GetitemExpr>(std::move(node), std::move(args[0]), line);
  auto tuple = std::make_unique<SequenceExpr>(ExprKind::kTuple, line);
  tuple->items = std::move(args);
  return std::make_unique<GetitemExpr>(std::move(node), std::move(tuple), line);
}

ExprPtr Parser::parse_subscribed() {
  int line = current().line;
  auto slice = std::make_unique<SliceExpr>(line);
  if (is_op(Op::kColon)) {
    next();
  } else {
    ExprPtr node = parse_expression();
    if (!is_op(Op::kColon)) return node;
    next();
    slice->start = std::move(node);
  }
  if (!is_op(Op::kColon) && !is_op(Op::kRBracket) && !is_op(Op::kComma)) slice->stop = parse_expression();
  if (skip_op(Op::kColon)) {
    if (!is_op(Op::kRBracket) && !is_op(Op::kComma)) slice->step = parse_expression();
  }
  return slice;
}

CallArgsExpr Parser::parse_call_args() {
  int line = expect_op(Op::kLParen).line;
  DepthGuard depth(*this);
  CallArgsExpr args;
  auto ensure = [&](bool ok) {
    if (!ok) fail("invalid syntax for function call expression", line);
  };
  bool require_comma = false;
  while (!is_op(Op::kRParen)) {
    if (require_comma) {
      expect_op(Op::kComma);
      if (is_op(Op::kRParen)) break;  // trailing comma
    }
    if (is_op(Op::kMul)) {
      ensure(!args.star_args && !args.star_kwargs);
      next();
      args.star_args = parse_expression();
    } else if (is_op(Op::kPow)) {
      ensure(!args.star_kwargs);
      next();
      args.star_kwargs = parse_expression();
    } else if (current().type == TokenType::kName && look().type == TokenType::kOperator &&
               look().op == Op::kAssign) {
      ensure(!args.star_kwargs);
      std::string key = next().text;
      next();
      args.keywords.emplace_back(std::move(key), parse_expression());
    } else {
      ensure(!args.star_args && !args.star_kwargs && args.keywords.empty());
      args.positional.push_back(parse_expression());
    }
    require_comma = true;
  }
  expect_op(Op::kRParen);
  return args;
}

ExprPtr Parser::parse_call(ExprPtr node) {
  int line = current().line;
  auto call = std::make_unique<CallExpr>(std::move(node), line);
  call->args = parse_call_args();
  return call;
}

ExprPtr Parser::parse_filter(ExprPtr node, bool start_inline) {
  ChainGuard chain(*this);
  while (is_op(Op::kPipe) || start_inline) {
    chain.link();
    if (!start_inline) next();
    start_inline = false;
    const Token& token = current();
    int line = token.line;
    std::string name = expect_identifier();
    while (skip_op(Op::kDot)) {
      name += '.';
      name += expect_identifier();
    }
    auto filter = std::make_unique<FilterExpr>(std::move(node), name, line);
    filter->fn = lookup_filter(name);
    if (!filter->fn && !soft_) fail(fmt::format("No filter named '{}'.", name), line);
    if (is_op(Op::kLParen)) filter->args = parse_call_args();
    node = std::move(filter);
  }
  return node;
}

ExprPtr Parser::parse_test(ExprPtr node) {
  int line = next().line;  // 'is'
  bool negated = skip_name("not");
  std::string name = expect_identifier();
  while (skip_op(Op::kDot)) {
    name += '.';
    name += expect_identifier();
  }
  auto test = std::make_unique<TestExpr>(std::move(node), name, line);
  test->fn = lookup_test(name);
  if (!test->fn && !soft_) fail(fmt::format("No test named '{}'.", name), line);
  const Token& t = current();
  bool arg_start = t.type == TokenType::kName || t.type == TokenType::kString || t.type == TokenType::kInteger ||
                   t.type == TokenType::kFloat ||
                   (t.type == TokenType::kOperator &&
                    (t.op == Op::kLParen || t.op == Op::kLBracket || t.op == Op::kLBrace));
  if (is_op(Op::kLParen)) {
    test->args = parse_call_args();
  } else if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
    // `x is divisibleby 3`, `x is sameas none`: one argument without parentheses.
    if (is_name("is")) fail("You cannot chain multiple tests with is", t.line);
    test->args.positional.push_back(parse_postfix(parse_primary()));
  }
  if (negated) return std::make_unique<UnaryExpr>(ExprKind::kNot, std::move(test), line);
  return test;
}

}  // namespace moeserve::text::jinja
