// Statement execution: output, control flow, loops, assignments, macros and frames.
#include "text/jinja/interpreter.h"

#include <fmt/format.h>

#include "text/jinja/error.h"
#include "text/jinja/filters.h"
#include "text/jinja/operators.h"
#include "text/jinja/predicates.h"
#include "text/jinja/runtime_objects.h"
#include "text/jinja/value_format.h"

namespace moeserve::text::jinja {

// ---- Scope ------------------------------------------------------------------------------------

const Value* Scope::find(std::string_view name) const {
  for (const Scope* s = this; s; s = s->parent_.get()) {
    for (const auto& [key, value] : s->vars_)
      if (key == name) return &value;
  }
  return nullptr;
}

void Scope::set(std::string_view name, Value value) {
  for (auto& [key, v] : vars_) {
    if (key == name) {
      v = std::move(value);
      return;
    }
  }
  vars_.emplace_back(std::string(name), std::move(value));
}

// ---- Interpreter --------------------------------------------------------------------------------

Interpreter::Interpreter(const TemplateAst& ast, const std::string& template_name, const RenderLimits& limits)
    : ast_(ast), name_(template_name), limits_(limits) {}

Interpreter::~Interpreter() {
  for (const auto& weak : tracked_)
    if (auto object = weak.lock()) object->release();
}

Interpreter::DepthGuard::DepthGuard(Interpreter& in) : in_(in) {
  if (++in_.call_depth_ > in_.limits_.max_call_depth) {
    --in_.call_depth_;
    limit_error(fmt::format("maximum recursion depth of {} exceeded (macro calls or recursive loops nested too deeply)",
                            in_.limits_.max_call_depth));
  }
}

std::string Interpreter::render(const ScopePtr& globals) {
  std::string out;
  OutputGuard output(*this, &out);
  FrameGuard frame(*this, std::make_shared<Scope>(globals));
  exec_list(ast_.body);
  return out;
}

void Interpreter::emit(std::string_view text) {
  if (out_->size() + text.size() > limits_.max_output_bytes)
    limit_error(fmt::format("the output would exceed {} bytes", limits_.max_output_bytes));
  out_->append(text);
}

void Interpreter::check_string_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes)
    limit_error(fmt::format("a string of {} bytes exceeds the limit of {}", bytes, limits_.max_output_bytes));
}

void Interpreter::count_iteration() {
  if (++iterations_ > limits_.max_loop_iterations)
    limit_error(fmt::format("more than {} loop iterations and macro calls", limits_.max_loop_iterations));
}

Interpreter::Flow Interpreter::exec_list(const StmtList& body) {
  for (const auto& stmt : body) {
    Flow flow = exec(*stmt);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec(const Stmt& stmt) {
  try {
    switch (stmt.kind) {
      case StmtKind::kText: emit(static_cast<const TextStmt&>(stmt).text); return Flow::kNormal;
      case StmtKind::kPrint: {
        Value v = eval(*static_cast<const PrintStmt&>(stmt).expr);
        if (v.is_string())
          emit(v.as_string());
        else
          emit(to_str(v));
        return Flow::kNormal;
      }
      case StmtKind::kIf: {
        const auto& s = static_cast<const IfStmt&>(stmt);
        for (const auto& [test, body] : s.branches)
          if (eval(*test).truthy()) return exec_list(body);
        return exec_list(s.else_body);
      }
      case StmtKind::kFor: return exec_for(static_cast<const ForStmt&>(stmt));
      case StmtKind::kSet: exec_set(static_cast<const SetStmt&>(stmt)); return Flow::kNormal;
      case StmtKind::kSetBlock: exec_set_block(static_cast<const SetBlockStmt&>(stmt)); return Flow::kNormal;
      case StmtKind::kMacro: exec_macro(static_cast<const MacroStmt&>(stmt)); return Flow::kNormal;
      case StmtKind::kCallBlock: exec_call_block(static_cast<const CallBlockStmt&>(stmt)); return Flow::kNormal;
      case StmtKind::kFilterBlock: exec_filter_block(static_cast<const FilterBlockStmt&>(stmt)); return Flow::kNormal;
      case StmtKind::kWith: exec_with(static_cast<const WithStmt&>(stmt)); return Flow::kNormal;
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
      case StmtKind::kScope: return exec_scope(static_cast<const ScopeStmt&>(stmt));
      case StmtKind::kUnsupported:
        runtime_error(fmt::format("'{}' needs a template loader, which chat templates are rendered without",
                                  static_cast<const UnsupportedStmt&>(stmt).tag));
    }
  } catch (const TemplateError& e) {
    if (e.line() == 0) throw e.located(name_, stmt.line);
    throw;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec_for(const ForStmt& stmt) { return run_loop(stmt, eval(*stmt.iterable), 0); }

// Jinja's for loop: the optional `if` filter runs first (so loop.length counts kept
// items) and each iteration gets a fresh frame.
Interpreter::Flow Interpreter::run_loop(const ForStmt& stmt, const Value& iterable, int depth) {
  std::vector<Value> items = iterate(iterable);
  ScopePtr outer = scope_;
  if (stmt.condition) {
    std::vector<Value> kept;
    for (const Value& item : items) {
      count_iteration();
      FrameGuard frame(*this, std::make_shared<Scope>(outer));
      assign(stmt.target, item);
      if (eval(*stmt.condition).truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  auto loop = std::make_shared<LoopObject>(std::move(items), depth, stmt, outer);
  track(loop);
  Value loop_value = Value::object(loop);
  // Like Jinja, `else` runs unless some iteration ran to its end: a loop left by `break`
  // in its first pass, or one whose every pass hit `continue`, runs the else block too.
  bool iterated = false;
  for (size_t i = 0; i < loop->items().size(); ++i) {
    count_iteration();
    loop->set_index(i);
    FrameGuard frame(*this, std::make_shared<Scope>(outer));
    assign(stmt.target, loop->items()[i]);
    scope_->set("loop", loop_value);
    Flow flow = exec_list(stmt.body);
    if (flow == Flow::kBreak) break;
    if (flow == Flow::kNormal) iterated = true;
  }
  if (!iterated) return exec_list(stmt.else_body);
  return Flow::kNormal;
}

Value Interpreter::run_recursive_loop(const ForStmt& stmt, const ScopePtr& scope, const Value& iterable, int depth) {
  DepthGuard guard(*this);
  std::string out;
  OutputGuard output(*this, &out);
  FrameGuard frame(*this, scope);
  run_loop(stmt, iterable, depth);
  return Value::string(std::move(out));
}

void Interpreter::assign(const Target& target, const Value& value) {
  switch (target.kind) {
    case Target::Kind::kName: scope_->set(target.name, value); return;
    case Target::Kind::kNamespaceAttr: {
      const Value* ns = scope_->find(target.name);
      auto* object = ns && ns->is_object() ? dynamic_cast<Namespace*>(&ns->as_object()) : nullptr;
      if (!object) runtime_error("cannot assign attribute on non-namespace object");
      object->set(target.attribute, value);
      return;
    }
    case Target::Kind::kTuple: {
      std::vector<Value> items = iterate(value);
      size_t n = target.items.size();
      if (items.size() < n)
        runtime_error(fmt::format("not enough values to unpack (expected {}, got {})", n, items.size()));
      if (items.size() > n) runtime_error(fmt::format("too many values to unpack (expected {})", n));
      for (size_t i = 0; i < n; ++i) assign(target.items[i], items[i]);
      return;
    }
  }
}

void Interpreter::exec_set(const SetStmt& stmt) { assign(stmt.target, eval(*stmt.value)); }

std::string Interpreter::render_body(const StmtList& body, const ScopePtr& frame) {
  std::string out;
  OutputGuard output(*this, &out);
  FrameGuard guard(*this, frame);
  exec_list(body);
  return out;
}

void Interpreter::exec_set_block(const SetBlockStmt& stmt) {
  Value body = Value::string(render_body(stmt.body, std::make_shared<Scope>(scope_)));
  if (stmt.filter) body = apply_filter_chain(*stmt.filter, body);
  assign(stmt.target, body);
}

void Interpreter::exec_macro(const MacroStmt& stmt) {
  auto macro = std::make_shared<MacroObject>(stmt.def, scope_);
  track(macro);
  scope_->set(stmt.def.name, Value::object(std::move(macro)));
}

void Interpreter::exec_call_block(const CallBlockStmt& stmt) {
  const auto& call = static_cast<const CallExpr&>(*stmt.call);
  Value callee = eval(*call.callee);
  CallArgs args = eval_args(call.args);
  auto caller = std::make_shared<MacroObject>(stmt.caller, scope_);
  track(caller);
  args.keywords.emplace_back("caller", Value::object(std::move(caller)));
  Value result = this->call(callee, args);
  emit(to_str(result));
}

void Interpreter::exec_filter_block(const FilterBlockStmt& stmt) {
  Value body = Value::string(render_body(stmt.body, std::make_shared<Scope>(scope_)));
  emit(to_str(apply_filter_chain(*stmt.filter, body)));
}

void Interpreter::exec_with(const WithStmt& stmt) {
  std::vector<Value> values;
  for (const auto& assignment : stmt.assignments) values.push_back(eval(*assignment.second));
  FrameGuard frame(*this, std::make_shared<Scope>(scope_));
  for (size_t i = 0; i < values.size(); ++i) assign(stmt.assignments[i].first, values[i]);
  exec_list(stmt.body);
}

Interpreter::Flow Interpreter::exec_scope(const ScopeStmt& stmt) {
  if (!stmt.new_frame) return exec_list(stmt.body);
  FrameGuard frame(*this, std::make_shared<Scope>(scope_));
  return exec_list(stmt.body);
}

Value Interpreter::invoke_macro(const MacroDef& def, const ScopePtr& closure, const CallArgs& args) {
  DepthGuard guard(*this);
  count_iteration();
  auto frame = std::make_shared<Scope>(closure);
  size_t n_params = def.params.size();
  std::vector<std::optional<Value>> bound(n_params);
  for (size_t i = 0; i < args.positional.size() && i < n_params; ++i) bound[i] = args.positional[i];
  std::optional<Value> caller;
  auto kwargs = std::make_shared<Dict>();
  for (const auto& [key, value] : args.keywords) {
    auto it = std::find(def.params.begin(), def.params.end(), key);
    size_t index = static_cast<size_t>(it - def.params.begin());
    if (it != def.params.end() && index >= args.positional.size()) {
      bound[index] = value;
    } else if (key == "caller" && def.uses_caller && !caller) {
      caller = value;
    } else if (def.uses_kwargs) {
      kwargs->set(Value::string(key), value);
    } else if (key == "caller") {
      runtime_error(fmt::format("macro '{}' was invoked with two values for the special caller argument", def.name));
    } else {
      runtime_error(fmt::format("macro '{}' takes no keyword argument '{}'", def.name, key));
    }
  }
  if (args.positional.size() > n_params && !def.uses_varargs)
    runtime_error(fmt::format("macro '{}' takes not more than {} argument(s)", def.name, n_params));

  std::string out;
  OutputGuard output(*this, &out);
  FrameGuard scope_guard(*this, frame);
  size_t first_default = n_params - def.defaults.size();
  for (size_t i = 0; i < n_params; ++i) {
    if (bound[i]) {
      frame->set(def.params[i], *bound[i]);
    } else if (i >= first_default) {
      frame->set(def.params[i], eval(*def.defaults[i - first_default]));
    } else {
      frame->set(def.params[i], Value::undefined(fmt::format("parameter '{}' was not provided", def.params[i])));
    }
  }
  if (def.uses_caller)
    frame->set("caller", caller ? *caller : Value::undefined("No caller defined"));
  if (def.uses_kwargs) frame->set("kwargs", Value::dict(kwargs));
  if (def.uses_varargs) {
    std::vector<Value> extra;
    for (size_t i = n_params; i < args.positional.size(); ++i) extra.push_back(args.positional[i]);
    frame->set("varargs", Value::sequence(std::move(extra), SequenceKind::kTuple));
  }
  exec_list(def.body);
  return Value::string(std::move(out));
}

// ---- services --------------------------------------------------------------------------------

Value Interpreter::call(const Value& callee, const CallArgs& args) {
  if (callee.is_undefined()) raise_undefined(callee);
  if (callee.is_object() && callee.as_object().callable()) return callee.as_object().call(*this, args);
  runtime_error(fmt::format("'{}' object is not callable", callee.type_name()));
}

Value Interpreter::call_filter(std::string_view name, const Value& input, const CallArgs& args) {
  FilterFn fn = lookup_filter(name);
  if (!fn) runtime_error(fmt::format("No filter named '{}'.", name));
  return fn(*this, input, args);
}

bool Interpreter::call_test(std::string_view name, const Value& input, const CallArgs& args) {
  TestFn fn = lookup_test(name);
  if (!fn) runtime_error(fmt::format("No test named '{}'.", name));
  return fn(*this, input, args);
}

}  // namespace moeserve::text::jinja
