#include "text/jinja/builtins.h"

#include <ctime>

#include <fmt/format.h>

#include "text/jinja/error.h"
#include "text/jinja/operators.h"
#include "text/jinja/runtime_objects.h"
#include "text/jinja/value_format.h"

namespace moeserve::text::jinja {
namespace {

// jinja2.sandbox.MAX_RANGE
constexpr int64_t kMaxRange = 100000;

Value builtin_range(Interpreter&, const CallArgs& args) {
  if (!args.keywords.empty()) runtime_error("range() takes no keyword arguments");
  size_t n = args.positional.size();
  if (n < 1 || n > 3) runtime_error(fmt::format("range expected at most 3 arguments, got {}", n));
  std::vector<int64_t> v;
  for (const Value& a : args.positional) {
    if (!(a.is_int() || a.is_bool()))
      runtime_error(fmt::format("'{}' object cannot be interpreted as an integer", a.type_name()));
    v.push_back(a.as_integer_like());
  }
  int64_t start = n == 1 ? 0 : v[0];
  int64_t stop = n == 1 ? v[0] : v[1];
  int64_t step = n == 3 ? v[2] : 1;
  if (step == 0) runtime_error("range() arg 3 must not be zero");
  // Length computed in 128 bits so extreme bounds cannot overflow.
  __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
  __int128 len = span <= 0 ? 0 : (span + (step > 0 ? step : -static_cast<__int128>(step)) - 1) /
                                    (step > 0 ? step : -static_cast<__int128>(step));
  if (len > kMaxRange)
    runtime_error(fmt::format("Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange));
  return Value::range(start, stop, step);
}

// dict(mapping_or_pairs=None, **kwargs), also the body of namespace(...).
void fill_dict(Dict& out, const CallArgs& args, const char* fn) {
  if (args.positional.size() > 1)
    runtime_error(fmt::format("{} expected at most 1 argument, got {}", fn, args.positional.size()));
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_dict()) {
      for (const auto& [k, v] : source.as_dict().entries()) out.set(k, v);
    } else {
      size_t i = 0;
      for (const Value& pair : iterate(source)) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2)
          runtime_error(fmt::format("dictionary update sequence element #{} has length {}; 2 is required", i,
                                    kv.size()));
        out.set(kv[0], kv[1]);
        ++i;
      }
    }
  }
  for (const auto& [k, v] : args.keywords) out.set(Value::string(k), v);
}

Value builtin_dict(Interpreter&, const CallArgs& args) {
  auto d = std::make_shared<Dict>();
  fill_dict(*d, args, "dict");
  return Value::dict(std::move(d));
}

Value builtin_namespace(Interpreter& in, const CallArgs& args) {
  auto ns = std::make_shared<Namespace>();
  fill_dict(ns->attrs(), args, "namespace");
  in.track(ns);
  return Value::object(std::move(ns));
}

Value builtin_cycler(Interpreter&, const CallArgs& args) {
  if (args.positional.empty()) runtime_error("at least one item has to be provided");
  return Value::object(std::make_shared<Cycler>(args.positional));
}

Value builtin_joiner(Interpreter&, const CallArgs& args) {
  auto a = bind_args("joiner", args, {"sep"});
  std::string sep = a[0] ? to_str(*a[0]) : ", ";
  auto used = std::make_shared<bool>(false);
  return make_function("joiner", [sep, used](Interpreter&, const CallArgs&) {
    if (!*used) {
      *used = true;
      return Value::string("");
    }
    return Value::string(sep);
  });
}

// transformers: raise jinja2.exceptions.TemplateError(message).
Value builtin_raise_exception(Interpreter&, const CallArgs& args) {
  auto a = bind_args("raise_exception", args, {"message"}, 1);
  throw TemplateError(TemplateError::Kind::kRaised, to_str(*a[0]));
}

// transformers: datetime.now().strftime(format), in local time.
Value builtin_strftime_now(Interpreter&, const CallArgs& args) {
  auto a = bind_args("strftime_now", args, {"format"}, 1);
  if (!a[0]->is_string())
    runtime_error(fmt::format("strftime() argument 1 must be str, not {}", a[0]->type_name()));
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  const std::string& format = a[0]->as_string();
  if (format.empty()) return Value::string("");
  std::string buf(256 + format.size() * 8, '\0');
  size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &local);
  buf.resize(n);
  return Value::string(std::move(buf));
}

}  // namespace

void install_builtins(Scope& scope) {
  scope.set("range", make_function("range", builtin_range));
  scope.set("dict", make_function("dict", builtin_dict));
  scope.set("namespace", make_function("namespace", builtin_namespace));
  scope.set("cycler", make_function("cycler", builtin_cycler));
  scope.set("joiner", make_function("joiner", builtin_joiner));
  scope.set("raise_exception", make_function("raise_exception", builtin_raise_exception));
  scope.set("strftime_now", make_function("strftime_now", builtin_strftime_now));
}

}  // namespace moeserve::text::jinja
