#include "text/jinja/runtime_objects.h"

#include <fmt/format.h>

#include "text/jinja/error.h"
#include "text/jinja/value_format.h"

namespace moeserve::text::jinja {

Value make_function(std::string name, FunctionObject::Fn fn) {
  return Value::object(std::make_shared<FunctionObject>(std::move(name), std::move(fn)));
}

// ---- MacroObject ----------------------------------------------------------------------------

Value MacroObject::attribute(std::string_view name) const {
  if (name == "name") return Value::string(def_.name);
  if (name == "arguments") {
    std::vector<Value> params;
    for (const auto& p : def_.params) params.push_back(Value::string(p));
    return Value::sequence(std::move(params), SequenceKind::kTuple);
  }
  if (name == "catch_kwargs") return Value::boolean(def_.uses_kwargs);
  if (name == "catch_varargs") return Value::boolean(def_.uses_varargs);
  if (name == "caller") return Value::boolean(def_.uses_caller);
  return Object::attribute(name);
}

Value MacroObject::call(Interpreter& interp, const CallArgs& args) const {
  if (!closure_) runtime_error("macro '" + def_.name + "' called after its template finished rendering");
  return interp.invoke_macro(def_, closure_, args);
}

// ---- LoopObject -----------------------------------------------------------------------------

std::string LoopObject::repr() const { return fmt::format("<LoopContext {}/{}>", index_ + 1, items_.size()); }

Value LoopObject::attribute(std::string_view name) const {
  int64_t i = static_cast<int64_t>(index_);
  int64_t n = static_cast<int64_t>(items_.size());
  if (name == "index0") return Value::integer(i);
  if (name == "index") return Value::integer(i + 1);
  if (name == "revindex") return Value::integer(n - i);
  if (name == "revindex0") return Value::integer(n - i - 1);
  if (name == "first") return Value::boolean(i == 0);
  if (name == "last") return Value::boolean(i == n - 1);
  if (name == "length") return Value::integer(n);
  if (name == "depth") return Value::integer(depth_ + 1);
  if (name == "depth0") return Value::integer(depth_);
  if (name == "previtem") {
    if (i == 0) return Value::undefined("there is no previous item");
    return items_[index_ - 1];
  }
  if (name == "nextitem") {
    if (i + 1 >= n) return Value::undefined("there is no next item");
    return items_[index_ + 1];
  }
  if (name == "cycle") {
    std::shared_ptr<const LoopObject> self = shared_from_this();
    return make_function("cycle", [self](Interpreter&, const CallArgs& args) {
      if (args.positional.empty()) runtime_error("no items for cycling given");
      return args.positional[self->index_ % args.positional.size()];
    });
  }
  if (name == "changed") {
    std::shared_ptr<const LoopObject> self = shared_from_this();
    return make_function("changed", [self](Interpreter&, const CallArgs& args) {
      Value current = Value::sequence(args.positional, SequenceKind::kTuple);
      if (self->last_changed_ && python_equals(*self->last_changed_, current)) return Value::boolean(false);
      self->last_changed_ = current;
      return Value::boolean(true);
    });
  }
  return Object::attribute(name);
}

Value LoopObject::call(Interpreter& interp, const CallArgs& args) const {
  if (!stmt_.recursive) runtime_error("Tried to call non recursive loop. Maybe you forgot the 'recursive' modifier.");
  if (args.positional.size() != 1 || !args.keywords.empty())
    runtime_error("loop() takes exactly one argument, the iterable to recurse into");
  return interp.run_recursive_loop(stmt_, scope_, args.positional[0], depth_ + 1);
}

// ---- Namespace ------------------------------------------------------------------------------

std::string Namespace::repr() const {
  // A namespace can hold itself; stop like Python's RecursionError instead of recursing.
  static thread_local int active = 0;
  if (active > kMaxNestingDepth) runtime_error("maximum recursion depth exceeded while getting the repr of an object");
  ++active;
  struct Leave {
    ~Leave() { --active; }
  } leave;
  std::string out = "<Namespace ";
  out += to_repr(Value::dict(std::make_shared<const Dict>(attrs_)));
  out += '>';
  return out;
}

Value Namespace::attribute(std::string_view name) const {
  if (const Value* v = attrs_.find(name)) return *v;
  return Object::attribute(name);
}

// ---- Cycler ---------------------------------------------------------------------------------

Value Cycler::attribute(std::string_view name) const {
  std::shared_ptr<const Cycler> self = shared_from_this();
  if (name == "items") return Value::sequence(items_);
  if (name == "current") return items_[pos_];
  if (name == "next") {
    return make_function("next", [self](Interpreter&, const CallArgs& args) {
      if (!args.empty()) runtime_error("next() takes no arguments");
      Value rv = self->items_[self->pos_];
      self->pos_ = (self->pos_ + 1) % self->items_.size();
      return rv;
    });
  }
  if (name == "reset") {
    return make_function("reset", [self](Interpreter&, const CallArgs&) {
      self->pos_ = 0;
      return Value::none();
    });
  }
  return Object::attribute(name);
}

}  // namespace moeserve::text::jinja
