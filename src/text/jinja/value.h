// Runtime values of the Jinja interpreter. They model the Python objects that Jinja2
// templates see when transformers renders a chat template: None, bool, int, float, str
// (optionally markupsafe.Markup), list, tuple, dict (insertion ordered), Undefined, and a
// few objects (namespace, loop, macros, bound methods). Containers are immutable once
// built (the sandbox transformers uses forbids mutating them) and shared by pointer, so
// copying a Value is cheap.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace moeserve::text::jinja {

class Value;
class Object;
class Interpreter;
struct CallArgs;

// The Python flavour of a sequence: list, tuple, range (from range()), or a one-shot
// generator (what the map/select/... filters return). A generator is always truthy and
// has no len(); a range prints as range(start, stop[, step]) and is not JSON.
enum class SequenceKind : uint8_t { kList, kTuple, kRange, kGenerator };

struct Sequence {
  std::vector<Value> items;
  SequenceKind kind = SequenceKind::kList;
  int64_t range_start = 0, range_stop = 0, range_step = 1;  // kRange only
  uint32_t depth = 1;  // containers nested inside, this one included
};

// Insertion-ordered mapping with Python key semantics (1, 1.0 and True are one key).
// String keys, the common case, are indexed by hash.
class Dict {
 public:
  const Value* find(std::string_view key) const;
  const Value* find(const Value& key) const;
  // Inserts, or replaces the value in place (keeping the key's original position).
  void set(Value key, Value value);
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  // Containers nested inside, this one included.
  uint32_t depth() const { return depth_; }

 private:
  // Transparent hashing: lookups by string_view allocate nothing.
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  std::vector<std::pair<Value, Value>> entries_;
  std::unordered_map<std::string, size_t, StringHash, std::equal_to<>> string_index_;
  uint32_t depth_ = 1;
};

struct StringData {
  std::shared_ptr<const std::string> text;
  bool markup = false;  // markupsafe.Markup (from |safe, |escape): '+' escapes the other side
};

// Why a value is undefined; used for the error raised when the value is used. A
// "security" undefined stands for a method the sandbox forbids (list.append, ...).
struct UndefinedInfo {
  std::string message;
  bool security = false;
};

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kSequence,
  kDict,
  kObject,
};

class Value {
 public:
  Value() = default;  // undefined, with a generic message
  static Value undefined(std::string message, bool security = false);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double f);
  static Value string(std::string s, bool markup = false);
  static Value sequence(std::vector<Value> items, SequenceKind kind = SequenceKind::kList);
  // range(start, stop, step); the items are materialized (the sandbox caps ranges).
  static Value range(int64_t start, int64_t stop, int64_t step);
  static Value dict(std::shared_ptr<const Dict> d);
  static Value object(std::shared_ptr<Object> o);

  Kind kind() const { return static_cast<Kind>(storage_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  // int, float or bool: what Python arithmetic accepts.
  bool is_numeric() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_sequence() const { return kind() == Kind::kSequence; }
  bool is_list() const { return is_sequence() && as_sequence().kind == SequenceKind::kList; }
  bool is_tuple() const { return is_sequence() && as_sequence().kind == SequenceKind::kTuple; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_object() const { return kind() == Kind::kObject; }

  bool as_bool() const { return std::get<bool>(storage_); }
  int64_t as_int() const { return std::get<int64_t>(storage_); }
  double as_float() const { return std::get<double>(storage_); }
  // int or bool as an integer (Python's bool is an int subclass).
  int64_t as_integer_like() const { return is_bool() ? (as_bool() ? 1 : 0) : as_int(); }
  // int, bool or float as a double.
  double as_number() const;
  const std::string& as_string() const { return *std::get<StringData>(storage_).text; }
  bool is_markup() const { return is_string() && std::get<StringData>(storage_).markup; }
  const Sequence& as_sequence() const { return *std::get<std::shared_ptr<const Sequence>>(storage_); }
  const std::vector<Value>& items() const { return as_sequence().items; }
  const Dict& as_dict() const { return *std::get<std::shared_ptr<const Dict>>(storage_); }
  Object& as_object() const { return *std::get<std::shared_ptr<Object>>(storage_); }
  const std::shared_ptr<Object>& object_ptr() const { return std::get<std::shared_ptr<Object>>(storage_); }
  // Message for the error raised when an undefined value is used.
  const std::string& undefined_message() const;
  bool undefined_is_security() const;

  // How deeply containers nest in this value (0 for scalars).
  uint32_t nesting_depth() const;

  // Python truthiness.
  bool truthy() const;
  // Python's type name ('str', 'int', 'NoneType', 'list', 'dict', 'Undefined', ...).
  std::string type_name() const;

 private:
  using Storage = std::variant<std::shared_ptr<const UndefinedInfo>, std::monostate, bool, int64_t, double,
                               StringData, std::shared_ptr<const Sequence>, std::shared_ptr<const Dict>,
                               std::shared_ptr<Object>>;
  explicit Value(Storage s) : storage_(std::move(s)) {}
  Storage storage_;
};

// Objects other than plain data: namespaces, loop state, macros, functions, methods.
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;
  virtual std::string repr() const = 0;
  // Attribute lookup; returns an undefined Value when there is no such attribute.
  virtual Value attribute(std::string_view name) const;
  virtual bool callable() const { return false; }
  virtual Value call(Interpreter& interp, const CallArgs& args) const;
  // len(); nullopt-like: returns -1 when the object has no len().
  virtual int64_t length() const { return -1; }
  // Drops references to frames and values, breaking reference cycles (a macro stored in
  // the frame it closes over, a namespace holding itself). Called when a render ends.
  virtual void release() {}
};

// Containers nested deeper than this cannot be built (and the recursive algorithms --
// equality, repr, json -- stop there too): an error like Python's RecursionError instead
// of a stack overflow.
inline constexpr int kMaxNestingDepth = 512;

// Python equality (==): numbers by value across int/float/bool, containers deeply, dicts
// ignoring order, Undefined equal only to Undefined.
bool python_equals(const Value& a, const Value& b, int depth = 0);

}  // namespace moeserve::text::jinja
