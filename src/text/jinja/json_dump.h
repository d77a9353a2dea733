// Python's json.dumps() on runtime values: the tojson filter as transformers defines it
// (json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)).
// Key order is the dict's insertion order; floats use repr(); non-ASCII is kept as UTF-8
// unless ensure_ascii is set.
#pragma once
#include <optional>
#include <string>

#include "text/jinja/value.h"

namespace moeserve::text::jinja {

struct JsonDumpOptions {
  bool ensure_ascii = false;
  // nullopt: everything on one line; otherwise a newline plus this string per level
  // (json.dumps turns an int indent into that many spaces).
  std::optional<std::string> indent;
  // Default separators are (", ", ": "), or (",", ": ") when indent is set.
  std::optional<std::string> item_separator;
  std::optional<std::string> key_separator;
  bool sort_keys = false;
};

std::string json_dumps(const Value& v, const JsonDumpOptions& options);

}  // namespace moeserve::text::jinja
