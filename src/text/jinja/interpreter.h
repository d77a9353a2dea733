// Tree-walking interpreter for a parsed template. It reproduces the runtime behaviour of
// Jinja2 as transformers runs it: Python value semantics, Jinja scoping (a for-loop body
// or macro call is a new frame whose assignments do not leak, `if` is not), the loop
// object, macros with caller/varargs/kwargs, and the sandbox's refusal to mutate.
//
// One Interpreter renders one template once; it is not shared between threads.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/call_args.h"
#include "text/jinja/value.h"

namespace moeserve::text::jinja {

// Guards against runaway templates. Real chat templates stay far below these.
struct RenderLimits {
  size_t max_output_bytes = 256u << 20;     // also caps any single string built
  uint64_t max_loop_iterations = 10'000'000;  // over the whole render
  int max_call_depth = 200;                 // nested macro calls / recursive loops
};

// A frame of variables. Lookups walk to the parent frames; assignments go to this one.
class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent = nullptr) : parent_(std::move(parent)) {}
  const Value* find(std::string_view name) const;
  void set(std::string_view name, Value value);
  const std::shared_ptr<Scope>& parent() const { return parent_; }

 private:
  std::shared_ptr<Scope> parent_;
  std::vector<std::pair<std::string, Value>> vars_;
};
using ScopePtr = std::shared_ptr<Scope>;

class Interpreter {
 public:
  Interpreter(const TemplateAst& ast, const std::string& template_name, const RenderLimits& limits);
  // Releases every tracked object, so no reference cycle outlives the render.
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders the template with `globals` (builtins and the caller's variables) as the
  // outermost frame.
  std::string render(const ScopePtr& globals);

  // ---- services for filters, tests, methods and builtin objects ----
  Value call(const Value& callee, const CallArgs& args);
  Value call_filter(std::string_view name, const Value& input, const CallArgs& args);
  bool call_test(std::string_view name, const Value& input, const CallArgs& args);
  const RenderLimits& limits() const { return limits_; }
  // Registers an object that may close a reference cycle (see Object::release).
  void track(const std::shared_ptr<Object>& object) { tracked_.push_back(object); }
  // Throws a limit error when a string of `bytes` would exceed the limits.
  void check_string_size(size_t bytes) const;
  // Calls a macro (or a call block's caller) defined by `def` with `closure` as parent frame.
  Value invoke_macro(const MacroDef& def, const ScopePtr& closure, const CallArgs& args);
  // Runs a `recursive` for loop again over `iterable` (what `loop(children)` does).
  Value run_recursive_loop(const ForStmt& stmt, const ScopePtr& scope, const Value& iterable, int depth);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec_list(const StmtList& body);
  Flow exec(const Stmt& stmt);
  Flow exec_for(const ForStmt& stmt);
  Flow run_loop(const ForStmt& stmt, const Value& iterable, int depth);
  void exec_set(const SetStmt& stmt);
  void exec_set_block(const SetBlockStmt& stmt);
  void exec_macro(const MacroStmt& stmt);
  void exec_call_block(const CallBlockStmt& stmt);
  void exec_filter_block(const FilterBlockStmt& stmt);
  void exec_with(const WithStmt& stmt);
  Flow exec_scope(const ScopeStmt& stmt);

  Value eval(const Expr& expr);
  Value eval_inner(const Expr& expr);
  Value eval_name(const NameExpr& expr);
  Value eval_call(const CallExpr& expr);
  Value eval_filter(const FilterExpr& expr);
  Value apply_filter(const FilterExpr& expr, const Value& input);
  Value eval_test(const TestExpr& expr);
  Value eval_getitem(const GetitemExpr& expr);
  Value eval_compare(const CompareExpr& expr);
  CallArgs eval_args(const CallArgsExpr& args);
  // Applies a filter chain whose innermost input is null to `input` (filter blocks).
  Value apply_filter_chain(const Expr& chain, const Value& input);

  void assign(const Target& target, const Value& value);
  // Renders `body` into a string in a new child frame of the current one.
  std::string render_body(const StmtList& body, const ScopePtr& frame);
  void emit(std::string_view text);
  void count_iteration();

  // RAII: enter a frame / redirect output.
  class FrameGuard {
   public:
    FrameGuard(Interpreter& in, ScopePtr frame) : in_(in), saved_(std::move(in.scope_)) { in_.scope_ = std::move(frame); }
    ~FrameGuard() { in_.scope_ = std::move(saved_); }
   private:
    Interpreter& in_;
    ScopePtr saved_;
  };
  class OutputGuard {
   public:
    OutputGuard(Interpreter& in, std::string* target) : in_(in), saved_(in.out_) { in_.out_ = target; }
    ~OutputGuard() { in_.out_ = saved_; }
   private:
    Interpreter& in_;
    std::string* saved_;
  };
  class DepthGuard {
   public:
    explicit DepthGuard(Interpreter& in);
    ~DepthGuard() { --in_.call_depth_; }
   private:
    Interpreter& in_;
  };

  const TemplateAst& ast_;
  const std::string& name_;
  RenderLimits limits_;
  ScopePtr scope_;
  std::string* out_ = nullptr;
  uint64_t iterations_ = 0;
  int call_depth_ = 0;
  std::vector<std::weak_ptr<Object>> tracked_;
};

}  // namespace moeserve::text::jinja
