#include "text/jinja/json_dump.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "text/jinja/error.h"
#include "text/jinja/py_number.h"
#include "text/jinja/py_string.h"

namespace moeserve::text::jinja {
namespace {

class JsonWriter {
 public:
  explicit JsonWriter(const JsonDumpOptions& options) : options_(options) {
    item_separator_ = options.item_separator.value_or(options.indent ? "," : ", ");
    key_separator_ = options.key_separator.value_or(": ");
  }

  void write(const Value& v, int depth) {
    if (depth > kMaxNestingDepth) runtime_error("maximum recursion depth exceeded while encoding a JSON object");
    switch (v.kind()) {
      case Kind::kNone: out_ += "null"; return;
      case Kind::kBool: out_ += v.as_bool() ? "true" : "false"; return;
      case Kind::kInt: out_ += std::to_string(v.as_int()); return;
      case Kind::kFloat: out_ += float_text(v.as_float()); return;
      case Kind::kString: write_string(v.as_string()); return;
      case Kind::kSequence:
        if (v.as_sequence().kind == SequenceKind::kGenerator || v.as_sequence().kind == SequenceKind::kRange) break;
        write_array(v.items(), depth);
        return;
      case Kind::kDict: write_object(v.as_dict(), depth); return;
      default: break;
    }
    runtime_error("Object of type " + v.type_name() + " is not JSON serializable");
  }

  std::string take() { return std::move(out_); }

 private:
  static std::string float_text(double f) {
    if (std::isnan(f)) return "NaN";
    if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
    return py::float_repr(f);
  }

  void newline_indent(int level) {
    out_ += '\n';
    for (int i = 0; i < level; ++i) out_ += *options_.indent;
  }

  void write_array(const std::vector<Value>& items, int depth) {
    if (items.empty()) {
      out_ += "[]";
      return;
    }
    out_ += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out_ += item_separator_;
      if (options_.indent) newline_indent(depth + 1);
      write(items[i], depth + 1);
    }
    if (options_.indent) newline_indent(depth);
    out_ += ']';
  }

  // JSON object keys: str as is; int, float, bool and None converted like json.dumps.
  std::string key_text(const Value& key) {
    switch (key.kind()) {
      case Kind::kString: return key.as_string();
      case Kind::kInt: return std::to_string(key.as_int());
      case Kind::kFloat: return float_text(key.as_float());
      case Kind::kBool: return key.as_bool() ? "true" : "false";
      case Kind::kNone: return "null";
      default: runtime_error("keys must be str, int, float, bool or None, not " + key.type_name());
    }
  }

  void write_object(const Dict& d, int depth) {
    if (d.empty()) {
      out_ += "{}";
      return;
    }
    std::vector<const std::pair<Value, Value>*> entries;
    for (const auto& e : d.entries()) entries.push_back(&e);
    if (options_.sort_keys) sort_entries(entries);
    out_ += '{';
    bool first = true;
    for (const auto* e : entries) {
      if (!first) out_ += item_separator_;
      first = false;
      if (options_.indent) newline_indent(depth + 1);
      write_string(key_text(e->first));
      out_ += key_separator_;
      write(e->second, depth + 1);
    }
    if (options_.indent) newline_indent(depth);
    out_ += '}';
  }

  // sorted(d.items()): keys of one comparable kind (all str, or all numbers).
  static void sort_entries(std::vector<const std::pair<Value, Value>*>& entries) {
    bool all_strings = std::all_of(entries.begin(), entries.end(), [](auto* e) { return e->first.is_string(); });
    bool all_numbers = std::all_of(entries.begin(), entries.end(), [](auto* e) { return e->first.is_numeric(); });
    if (all_strings) {
      std::stable_sort(entries.begin(), entries.end(),
                       [](auto* a, auto* b) { return a->first.as_string() < b->first.as_string(); });
    } else if (all_numbers) {
      std::stable_sort(entries.begin(), entries.end(),
                       [](auto* a, auto* b) { return a->first.as_number() < b->first.as_number(); });
    } else {
      runtime_error("'<' not supported between dict keys of different types in tojson(sort_keys=true)");
    }
  }

  void write_string(const std::string& s) {
    out_ += '"';
    size_t pos = 0;
    while (pos < s.size()) {
      unsigned char c = static_cast<unsigned char>(s[pos]);
      switch (c) {
        case '"': out_ += "\\\""; ++pos; continue;
        case '\\': out_ += "\\\\"; ++pos; continue;
        case '\n': out_ += "\\n"; ++pos; continue;
        case '\r': out_ += "\\r"; ++pos; continue;
        case '\t': out_ += "\\t"; ++pos; continue;
        case '\b': out_ += "\\b"; ++pos; continue;
        case '\f': out_ += "\\f"; ++pos; continue;
        default: break;
      }
      if (c < 0x20) {
        out_ += fmt::format("\\u{:04x}", c);
        ++pos;
        continue;
      }
      if (!options_.ensure_ascii) {
        if (c < 0x80) {
          out_ += static_cast<char>(c);
          ++pos;
        } else {
          size_t start = pos;
          py::decode_utf8(s, pos);
          out_.append(s, start, pos - start);
        }
        continue;
      }
      // ensure_ascii: everything outside ' '..'~' as \uXXXX (UTF-16 surrogate pairs).
      if (c >= 0x20 && c < 0x7F) {
        out_ += static_cast<char>(c);
        ++pos;
        continue;
      }
      char32_t cp = py::decode_utf8(s, pos);
      if (cp >= 0x10000) {
        char32_t v = cp - 0x10000;
        out_ += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        out_ += fmt::format("\\u{:04x}", static_cast<uint32_t>(cp));
      }
    }
    out_ += '"';
  }

  const JsonDumpOptions& options_;
  std::string item_separator_;
  std::string key_separator_;
  std::string out_;
};

}  // namespace

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
  JsonWriter writer(options);
  writer.write(v, 0);
  return writer.take();
}

}  // namespace moeserve::text::jinja
