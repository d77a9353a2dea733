// Objects a template can hold besides plain data: functions, macros, the `loop` variable,
// namespace(), cycler() and joiner(). They mirror jinja2.runtime / jinja2.utils.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/call_args.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/value.h"

namespace moeserve::text::jinja {

// A callable implemented in C++ (range, namespace, raise_exception, loop.cycle, ...).
class FunctionObject : public Object {
 public:
  using Fn = std::function<Value(Interpreter&, const CallArgs&)>;
  FunctionObject(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string type_name() const override { return "function"; }
  std::string repr() const override { return "<function " + name_ + ">"; }
  bool callable() const override { return true; }
  Value call(Interpreter& interp, const CallArgs& args) const override { return fn_(interp, args); }

 private:
  std::string name_;
  Fn fn_;
};

Value make_function(std::string name, FunctionObject::Fn fn);

// {% macro %} (or the caller of a {% call %} block), closed over its defining frame.
class MacroObject : public Object {
 public:
  MacroObject(const MacroDef& def, ScopePtr closure) : def_(def), closure_(std::move(closure)) {}
  std::string type_name() const override { return "Macro"; }
  std::string repr() const override { return "<Macro '" + def_.name + "'>"; }
  Value attribute(std::string_view name) const override;
  bool callable() const override { return true; }
  Value call(Interpreter& interp, const CallArgs& args) const override;
  void release() override { closure_.reset(); }

 private:
  const MacroDef& def_;
  ScopePtr closure_;
};

// The `loop` variable of a for loop.
class LoopObject : public Object, public std::enable_shared_from_this<LoopObject> {
 public:
  LoopObject(std::vector<Value> items, int depth, const ForStmt& stmt, ScopePtr scope)
      : items_(std::move(items)), depth_(depth), stmt_(stmt), scope_(std::move(scope)) {}
  void set_index(size_t index) { index_ = index; }
  const std::vector<Value>& items() const { return items_; }

  std::string type_name() const override { return "LoopContext"; }
  std::string repr() const override;
  Value attribute(std::string_view name) const override;
  int64_t length() const override { return static_cast<int64_t>(items_.size()); }
  bool callable() const override { return true; }
  // loop(children) in a `recursive` loop.
  Value call(Interpreter& interp, const CallArgs& args) const override;
  void release() override {
    scope_.reset();
    items_.clear();
    last_changed_.reset();
  }

 private:
  std::vector<Value> items_;
  size_t index_ = 0;
  int depth_;
  const ForStmt& stmt_;
  ScopePtr scope_;
  mutable std::optional<Value> last_changed_;
};

// namespace(...): the one mutable object, assigned with {% set ns.attr = value %}.
class Namespace : public Object {
 public:
  std::string type_name() const override { return "Namespace"; }
  std::string repr() const override;
  Value attribute(std::string_view name) const override;
  void set(const std::string& name, Value value) { attrs_.set(Value::string(name), std::move(value)); }
  Dict& attrs() { return attrs_; }
  void release() override { attrs_ = Dict(); }

 private:
  Dict attrs_;
};

class Cycler : public Object, public std::enable_shared_from_this<Cycler> {
 public:
  explicit Cycler(std::vector<Value> items) : items_(std::move(items)) {}
  std::string type_name() const override { return "Cycler"; }
  std::string repr() const override { return "<Cycler>"; }
  Value attribute(std::string_view name) const override;

 private:
  std::vector<Value> items_;
  mutable size_t pos_ = 0;
};

}  // namespace moeserve::text::jinja
