// Syntax tree of a parsed template (the subset of jinja2.nodes that templates without
// inheritance use). Expressions and statements are small structs tagged by kind; the
// interpreter switches on the kind. Every node carries its source line for errors.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace moeserve::text::jinja {

class Interpreter;

// Filters and "is" tests are resolved to functions at parse time.
using FilterFn = Value (*)(Interpreter& interp, const Value& input, const CallArgs& args);
using TestFn = bool (*)(Interpreter& interp, const Value& input, const CallArgs& args);

// ---- expressions -------------------------------------------------------------------

enum class ExprKind {
  kConst, kName, kList, kTuple, kDict, kGetattr, kGetitem, kSlice, kCall, kFilter, kTest,
  kNeg, kPos, kNot, kAnd, kOr, kBinary, kConcat, kCompare, kCondExpr,
  kNamespaceRef,  // ns.attr as an assignment target; only seen by the parser
};

struct Expr {
  Expr(ExprKind k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
  ExprKind kind;
  int line;
};
using ExprPtr = std::unique_ptr<Expr>;

struct ConstExpr : Expr {
  ConstExpr(Value v, int l) : Expr(ExprKind::kConst, l), value(std::move(v)) {}
  Value value;
};

struct NameExpr : Expr {
  NameExpr(std::string n, int l) : Expr(ExprKind::kName, l), name(std::move(n)) {}
  std::string name;
};

// List or tuple literal.
struct SequenceExpr : Expr {
  SequenceExpr(ExprKind k, int l) : Expr(k, l) {}
  std::vector<ExprPtr> items;
};

struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(ExprKind::kDict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

// obj.name: attribute first, then item (jinja's environment.getattr).
struct GetattrExpr : Expr {
  GetattrExpr(ExprPtr o, std::string a, int l) : Expr(ExprKind::kGetattr, l), object(std::move(o)), attribute(std::move(a)) {}
  ExprPtr object;
  std::string attribute;
};

// obj[index]: item first, then attribute for string keys (environment.getitem).
struct GetitemExpr : Expr {
  GetitemExpr(ExprPtr o, ExprPtr i, int l) : Expr(ExprKind::kGetitem, l), object(std::move(o)), index(std::move(i)) {}
  ExprPtr object;
  ExprPtr index;
};

// start:stop:step inside a subscript; omitted parts are null.
struct SliceExpr : Expr {
  explicit SliceExpr(int l) : Expr(ExprKind::kSlice, l) {}
  ExprPtr start, stop, step;
};

struct CallArgsExpr {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  ExprPtr star_args;    // *args
  ExprPtr star_kwargs;  // **kwargs
};

struct CallExpr : Expr {
  CallExpr(ExprPtr c, int l) : Expr(ExprKind::kCall, l), callee(std::move(c)) {}
  ExprPtr callee;
  CallArgsExpr args;
};

// input|name(args). `input` is null for the filter of a filter block or block set,
// whose input is the rendered body.
struct FilterExpr : Expr {
  FilterExpr(ExprPtr in, std::string n, int l) : Expr(ExprKind::kFilter, l), input(std::move(in)), name(std::move(n)) {}
  ExprPtr input;
  std::string name;
  FilterFn fn = nullptr;  // null: unknown filter in a conditional branch, an error if reached
  CallArgsExpr args;
};

struct TestExpr : Expr {
  TestExpr(ExprPtr in, std::string n, int l) : Expr(ExprKind::kTest, l), input(std::move(in)), name(std::move(n)) {}
  ExprPtr input;
  std::string name;
  TestFn fn = nullptr;  // null: unknown test in a conditional branch, an error if reached
  CallArgsExpr args;
};

// -x, +x, not x.
struct UnaryExpr : Expr {
  UnaryExpr(ExprKind k, ExprPtr o, int l) : Expr(k, l), operand(std::move(o)) {}
  ExprPtr operand;
};

// a and b, a or b (short-circuit, yield an operand like Python).
struct LogicalExpr : Expr {
  LogicalExpr(ExprKind k, ExprPtr a, ExprPtr b, int l) : Expr(k, l), left(std::move(a)), right(std::move(b)) {}
  ExprPtr left, right;
};

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };

struct BinaryExpr : Expr {
  BinaryExpr(BinaryOp o, ExprPtr a, ExprPtr b, int l)
      : Expr(ExprKind::kBinary, l), op(o), left(std::move(a)), right(std::move(b)) {}
  BinaryOp op;
  ExprPtr left, right;
};

// a ~ b ~ c: str() of each part, joined.
struct ConcatExpr : Expr {
  explicit ConcatExpr(int l) : Expr(ExprKind::kConcat, l) {}
  std::vector<ExprPtr> parts;
};

enum class CompareOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

// a < b <= c ...: chained like Python.
struct CompareExpr : Expr {
  CompareExpr(ExprPtr f, int l) : Expr(ExprKind::kCompare, l), first(std::move(f)) {}
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
};

// a if test else b (else part optional: undefined when false).
struct CondExpr : Expr {
  explicit CondExpr(int l) : Expr(ExprKind::kCondExpr, l) {}
  ExprPtr test, then_value, else_value;
};

struct NamespaceRefExpr : Expr {
  NamespaceRefExpr(std::string n, std::string a, int l)
      : Expr(ExprKind::kNamespaceRef, l), name(std::move(n)), attribute(std::move(a)) {}
  std::string name;
  std::string attribute;
};

// ---- assignment targets --------------------------------------------------------------

struct Target {
  enum class Kind { kName, kTuple, kNamespaceAttr };
  Kind kind = Kind::kName;
  std::string name;           // kName; the namespace variable for kNamespaceAttr
  std::string attribute;      // kNamespaceAttr
  std::vector<Target> items;  // kTuple
  int line = 0;
};

// ---- statements ------------------------------------------------------------------------

enum class StmtKind {
  kText, kPrint, kIf, kFor, kSet, kSetBlock, kMacro, kCallBlock, kFilterBlock, kWith,
  kBreak, kContinue, kScope, kUnsupported,
};

struct Stmt {
  Stmt(StmtKind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
  StmtKind kind;
  int line;
};
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

struct TextStmt : Stmt {
  TextStmt(std::string t, int l) : Stmt(StmtKind::kText, l), text(std::move(t)) {}
  std::string text;
};

struct PrintStmt : Stmt {
  PrintStmt(ExprPtr e, int l) : Stmt(StmtKind::kPrint, l), expr(std::move(e)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(int l) : Stmt(StmtKind::kIf, l) {}
  std::vector<std::pair<ExprPtr, StmtList>> branches;  // if + elifs
  StmtList else_body;
};

struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(StmtKind::kFor, l) {}
  Target target;
  ExprPtr iterable;
  ExprPtr condition;  // for x in y if condition
  bool recursive = false;
  StmtList body;
  StmtList else_body;
};

struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(StmtKind::kSet, l) {}
  Target target;
  ExprPtr value;
};

// {% set x | filters %}body{% endset %}
struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(int l) : Stmt(StmtKind::kSetBlock, l) {}
  Target target;
  ExprPtr filter;  // a FilterExpr chain whose innermost input is null, or null
  StmtList body;
};

// A macro, or the anonymous "caller" of a call block.
struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  StmtList body;
  bool uses_caller = false;
  bool uses_varargs = false;
  bool uses_kwargs = false;
  int line = 0;
};

struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(StmtKind::kMacro, l) {}
  MacroDef def;
};

struct CallBlockStmt : Stmt {
  explicit CallBlockStmt(int l) : Stmt(StmtKind::kCallBlock, l) {}
  MacroDef caller;
  ExprPtr call;  // a CallExpr
};

struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(int l) : Stmt(StmtKind::kFilterBlock, l) {}
  ExprPtr filter;  // FilterExpr chain, innermost input null
  StmtList body;
};

struct WithStmt : Stmt {
  explicit WithStmt(int l) : Stmt(StmtKind::kWith, l) {}
  std::vector<std::pair<Target, ExprPtr>> assignments;
  StmtList body;
};

// {% block name %}, {% generation %}: render the body in place (no inheritance).
struct ScopeStmt : Stmt {
  ScopeStmt(int l, bool scoped_frame) : Stmt(StmtKind::kScope, l), new_frame(scoped_frame) {}
  bool new_frame;
  StmtList body;
};

// include/import/extends: parse, but fail when reached (no template loader).
struct UnsupportedStmt : Stmt {
  UnsupportedStmt(std::string t, int l) : Stmt(StmtKind::kUnsupported, l), tag(std::move(t)) {}
  std::string tag;
};

struct TemplateAst {
  StmtList body;
};

}  // namespace moeserve::text::jinja
