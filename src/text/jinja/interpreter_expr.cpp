// Expression evaluation.
#include <fmt/format.h>

#include "text/jinja/error.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/operators.h"
#include "text/jinja/value_format.h"

namespace moeserve::text::jinja {

Value Interpreter::eval(const Expr& expr) {
  try {
    return eval_inner(expr);
  } catch (const TemplateError& e) {
    if (e.line() == 0) throw e.located(name_, expr.line);
    throw;
  }
}

Value Interpreter::eval_inner(const Expr& expr) {
  switch (expr.kind) {
    case ExprKind::kConst: return static_cast<const ConstExpr&>(expr).value;
    case ExprKind::kName: return eval_name(static_cast<const NameExpr&>(expr));
    case ExprKind::kList:
    case ExprKind::kTuple: {
      const auto& seq = static_cast<const SequenceExpr&>(expr);
      std::vector<Value> items;
      items.reserve(seq.items.size());
      for (const auto& item : seq.items) items.push_back(eval(*item));
      return Value::sequence(std::move(items), expr.kind == ExprKind::kTuple ? SequenceKind::kTuple : SequenceKind::kList);
    }
    case ExprKind::kDict: {
      auto dict = std::make_shared<Dict>();
      for (const auto& [key, value] : static_cast<const DictExpr&>(expr).items) {
        Value k = eval(*key);
        dict->set(std::move(k), eval(*value));
      }
      return Value::dict(std::move(dict));
    }
    case ExprKind::kGetattr: {
      const auto& e = static_cast<const GetattrExpr&>(expr);
      return get_attribute(eval(*e.object), e.attribute);
    }
    case ExprKind::kGetitem: return eval_getitem(static_cast<const GetitemExpr&>(expr));
    case ExprKind::kCall: return eval_call(static_cast<const CallExpr&>(expr));
    case ExprKind::kFilter: return eval_filter(static_cast<const FilterExpr&>(expr));
    case ExprKind::kTest: return eval_test(static_cast<const TestExpr&>(expr));
    case ExprKind::kNeg: return negate(eval(*static_cast<const UnaryExpr&>(expr).operand));
    case ExprKind::kPos: return unary_plus(eval(*static_cast<const UnaryExpr&>(expr).operand));
    case ExprKind::kNot: return Value::boolean(!eval(*static_cast<const UnaryExpr&>(expr).operand).truthy());
    case ExprKind::kAnd: {
      const auto& e = static_cast<const LogicalExpr&>(expr);
      Value left = eval(*e.left);
      return left.truthy() ? eval(*e.right) : left;
    }
    case ExprKind::kOr: {
      const auto& e = static_cast<const LogicalExpr&>(expr);
      Value left = eval(*e.left);
      return left.truthy() ? left : eval(*e.right);
    }
    case ExprKind::kBinary: {
      const auto& e = static_cast<const BinaryExpr&>(expr);
      Value left = eval(*e.left);
      Value right = eval(*e.right);
      return binary_op(e.op, left, right, limits_.max_output_bytes);
    }
    case ExprKind::kConcat: {
      std::string out;
      for (const auto& part : static_cast<const ConcatExpr&>(expr).parts) {
        Value v = eval(*part);
        std::string text = v.is_string() ? v.as_string() : to_str(v);
        check_string_size(out.size() + text.size());
        out += text;
      }
      return Value::string(std::move(out));
    }
    case ExprKind::kCompare: return eval_compare(static_cast<const CompareExpr&>(expr));
    case ExprKind::kCondExpr: {
      const auto& e = static_cast<const CondExpr&>(expr);
      if (eval(*e.test).truthy()) return eval(*e.then_value);
      if (e.else_value) return eval(*e.else_value);
      return Value::undefined(fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was defined.", expr.line));
    }
    case ExprKind::kSlice:
    case ExprKind::kNamespaceRef: break;
  }
  runtime_error("internal error: unexpected expression");
}

Value Interpreter::eval_name(const NameExpr& expr) {
  if (const Value* v = scope_->find(expr.name)) return *v;
  return Value::undefined(fmt::format("'{}' is undefined", expr.name));
}

Value Interpreter::eval_getitem(const GetitemExpr& expr) {
  Value object = eval(*expr.object);
  if (expr.index->kind == ExprKind::kSlice) {
    const auto& s = static_cast<const SliceExpr&>(*expr.index);
    Value start = s.start ? eval(*s.start) : Value::none();
    Value stop = s.stop ? eval(*s.stop) : Value::none();
    Value step = s.step ? eval(*s.step) : Value::none();
    return get_slice(object, start, stop, step);
  }
  return get_item(object, eval(*expr.index));
}

CallArgs Interpreter::eval_args(const CallArgsExpr& args) {
  CallArgs out;
  for (const auto& e : args.positional) out.positional.push_back(eval(*e));
  for (const auto& [key, e] : args.keywords) out.keywords.emplace_back(key, eval(*e));
  if (args.star_args) {
    for (Value& v : iterate(eval(*args.star_args))) out.positional.push_back(std::move(v));
  }
  if (args.star_kwargs) {
    Value mapping = eval(*args.star_kwargs);
    if (!mapping.is_dict()) runtime_error(fmt::format("argument after ** must be a mapping, not {}", mapping.type_name()));
    for (const auto& [k, v] : mapping.as_dict().entries()) {
      if (!k.is_string()) runtime_error("keywords must be strings");
      out.keywords.emplace_back(k.as_string(), v);
    }
  }
  return out;
}

Value Interpreter::eval_call(const CallExpr& expr) {
  Value callee = eval(*expr.callee);
  CallArgs args = eval_args(expr.args);
  return call(callee, args);
}

Value Interpreter::eval_filter(const FilterExpr& expr) {
  Value input = expr.input ? eval(*expr.input) : Value();
  return apply_filter(expr, input);
}

Value Interpreter::apply_filter(const FilterExpr& expr, const Value& input) {
  if (!expr.fn) runtime_error(fmt::format("No filter named '{}'.", expr.name));
  CallArgs args = eval_args(expr.args);
  return expr.fn(*this, input, args);
}

Value Interpreter::apply_filter_chain(const Expr& chain, const Value& input) {
  if (chain.kind != ExprKind::kFilter) return eval(chain);
  const auto& filter = static_cast<const FilterExpr&>(chain);
  try {
    Value inner = filter.input ? apply_filter_chain(*filter.input, input) : input;
    return apply_filter(filter, inner);
  } catch (const TemplateError& e) {
    if (e.line() == 0) throw e.located(name_, chain.line);
    throw;
  }
}

Value Interpreter::eval_test(const TestExpr& expr) {
  Value input = eval(*expr.input);
  if (!expr.fn) runtime_error(fmt::format("No test named '{}'.", expr.name));
  CallArgs args = eval_args(expr.args);
  return Value::boolean(expr.fn(*this, input, args));
}

Value Interpreter::eval_compare(const CompareExpr& expr) {
  Value left = eval(*expr.first);
  for (const auto& [op, operand] : expr.rest) {
    Value right = eval(*operand);
    if (!compare(op, left, right)) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

}  // namespace moeserve::text::jinja
