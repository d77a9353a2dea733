// Strict parser of safetensors headers. Rules follow the reference implementation
// (huggingface/safetensors, tensor.rs `read_metadata` / `Metadata::validate`):
//   - 8-byte little-endian N, N <= 100 MB, 8 + N <= file size;
//   - the header is a UTF-8 JSON object starting with '{' (trailing spaces allowed: writers
//     pad it to a multiple of 8 bytes);
//   - each entry {"dtype": known name, "shape": [non-negative ints], "data_offsets": [b, e]}
//     with b <= e, e within the data section and e - b == numel * dtype size;
//   - sorted by offset, the ranges tile the data section exactly: no overlap, no hole, no
//     trailing bytes;
//   - "__metadata__", if present, maps strings to strings; no key appears twice.
#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"

namespace moeserve::io {

namespace {

using json = nlohmann::json;

constexpr std::string_view kMetadataKey = "__metadata__";

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | uint64_t(std::to_integer<uint8_t>(p[i]));
  return v;
}

// A JSON text that is at most this deep is enough for a safetensors header:
// root object (1) -> entry object (2) -> shape / data_offsets array (3).
constexpr int kMaxDepth = 3;

// First pass over the header text (SAX, linear time): records the top-level keys in document
// order (the DOM object sorts them), rejects duplicate keys, nesting deeper than a header
// needs (before any DOM is built), and syntax errors. nlohmann's callback parser would do
// the same in one pass, but it rescans the parent object after every entry: quadratic in the
// number of tensors.
class HeaderScanner final : public json::json_sax_t {
 public:
  HeaderScanner(const std::string& source, std::vector<std::string>& key_order)
      : source_(source), key_order_(key_order) {}

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return enter(); }
  bool start_array(std::size_t) override { return enter(); }
  bool end_object() override { return leave(); }
  bool end_array() override { return leave(); }
  bool key(string_t& key) override {
    if (depth_ == 1) {
      if (!seen_.insert(key).second) fail("{}: header has the key '{}' twice", source_, key);
      key_order_.push_back(key);
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    fail("{}: header is not valid JSON: {}", source_, e.what());
  }

 private:
  bool enter() {
    if (++depth_ > kMaxDepth)
      fail("{}: tensor '{}': JSON nested deeper than a safetensors header allows (shape and "
           "data_offsets hold plain integers)",
           source_, key_order_.empty() ? std::string() : key_order_.back());
    return true;
  }
  bool leave() {
    --depth_;
    return true;
  }

  const std::string& source_;
  std::vector<std::string>& key_order_;
  std::set<std::string> seen_;
  int depth_ = 0;
};

json parse_header_json(std::string_view text, const std::string& source,
                       std::vector<std::string>& key_order) {
  HeaderScanner scanner(source, key_order);
  try {
    json::sax_parse(text.begin(), text.end(), &scanner);
    // The scan accepted the text: the DOM parse cannot fail on syntax.
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", source, e.what());
  }
}

std::string json_type(const json& j) { return j.type_name(); }

// A non-negative JSON integer, or an error naming the field.
uint64_t as_u64(const json& j, const std::string& source, const std::string& tensor,
                const char* field) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer())
    fail("{}: tensor '{}': {} has the negative value {}", source, tensor, field, j.get<int64_t>());
  fail("{}: tensor '{}': {} must hold non-negative integers, found {} {}", source, tensor, field,
       json_type(j), j.dump());
}

TensorInfo parse_entry(const std::string& name, const json& entry, uint64_t data_size,
                       const std::string& source) {
  if (!entry.is_object())
    fail("{}: tensor '{}': entry must be a JSON object, found {}", source, name, json_type(entry));
  auto field = [&](const char* key) -> const json& {
    auto it = entry.find(key);
    if (it == entry.end()) fail("{}: tensor '{}': missing field '{}'", source, name, key);
    return *it;
  };

  const json& dtype_j = field("dtype");
  if (!dtype_j.is_string())
    fail("{}: tensor '{}': dtype must be a string, found {}", source, name, json_type(dtype_j));
  const std::string dtype_name_str = dtype_j.get<std::string>();
  const std::optional<DType> dtype = parse_dtype(dtype_name_str);
  if (!dtype) fail("{}: tensor '{}': unsupported dtype '{}'", source, name, dtype_name_str);

  const json& shape_j = field("shape");
  if (!shape_j.is_array())
    fail("{}: tensor '{}': shape must be an array, found {}", source, name, json_type(shape_j));
  TensorInfo info{name, *dtype, {}, 0, 0};
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : shape_j) {
    const uint64_t dim = as_u64(d, source, name, "shape");
    if (dim > uint64_t(std::numeric_limits<int64_t>::max()))
      fail("{}: tensor '{}': shape dimension {} is too large", source, name, dim);
    info.shape.push_back(int64_t(dim));
    overflow = overflow || __builtin_mul_overflow(numel, dim, &numel);
  }
  uint64_t nbytes = 0;
  overflow = overflow || numel > uint64_t(std::numeric_limits<int64_t>::max()) ||
             __builtin_mul_overflow(numel, uint64_t(dtype_size(*dtype)), &nbytes);
  // A product that overflows is only harmless if some later dimension is 0; the reference
  // rejects it regardless, and so do we.
  if (overflow)
    fail("{}: tensor '{}': shape {} overflows 64-bit element or byte counts", source, name,
         shape_j.dump());

  const json& off_j = field("data_offsets");
  if (!off_j.is_array() || off_j.size() != 2)
    fail("{}: tensor '{}': data_offsets must be an array [begin, end], found {}", source, name,
         off_j.dump());
  info.data_begin = as_u64(off_j[0], source, name, "data_offsets");
  info.data_end = as_u64(off_j[1], source, name, "data_offsets");
  if (info.data_begin > info.data_end)
    fail("{}: tensor '{}': data_offsets [{}, {}] has begin after end", source, name,
         info.data_begin, info.data_end);
  if (info.data_end > data_size)
    fail("{}: tensor '{}': data_offsets [{}, {}] run past the end of the data section ({} bytes); "
         "is the file truncated?",
         source, name, info.data_begin, info.data_end, data_size);
  if (info.data_end - info.data_begin != nbytes)
    fail("{}: tensor '{}': data_offsets [{}, {}] hold {} bytes, but {} {} needs {}", source, name,
         info.data_begin, info.data_end, info.data_end - info.data_begin, dtype_name_str,
         shape_to_string(info.shape), nbytes);
  return info;
}

std::map<std::string, std::string> parse_metadata(const json& j, const std::string& source) {
  std::map<std::string, std::string> out;
  if (j.is_null()) return out;
  if (!j.is_object())
    fail("{}: __metadata__ must be an object of strings, found {}", source, json_type(j));
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string())
      fail("{}: __metadata__ value of '{}' must be a string, found {}", source, key,
           json_type(value));
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

// The ranges, sorted by offset, must cover [0, data_size) exactly once.
void check_tiling(const std::vector<TensorInfo>& tensors, uint64_t data_size,
                  const std::string& source) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const TensorInfo& x = tensors[a];
    const TensorInfo& y = tensors[b];
    return std::tie(x.data_begin, x.data_end) < std::tie(y.data_begin, y.data_end);
  });
  uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (size_t i : order) {
    const TensorInfo& t = tensors[i];
    if (t.data_begin < pos)
      fail("{}: tensor '{}' (bytes [{}, {})) overlaps tensor '{}' (bytes [{}, {}))", source,
           t.name, t.data_begin, t.data_end, prev->name, prev->data_begin, prev->data_end);
    if (t.data_begin > pos) {
      if (prev)
        fail("{}: {} unused bytes between tensor '{}' (ends at {}) and tensor '{}' (starts at {})",
             source, t.data_begin - pos, prev->name, pos, t.name, t.data_begin);
      fail("{}: {} unused bytes at the start of the data section before tensor '{}'", source,
           t.data_begin, t.name);
    }
    pos = t.data_end;
    prev = &t;
  }
  if (pos != data_size)
    fail("{}: {} trailing bytes after the last tensor (data section {} bytes, tensors cover {})",
         source, data_size - pos, data_size, pos);
}

}  // namespace

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file_bytes,
                                           const std::string& source) {
  const uint64_t file_size = file_bytes.size();
  if (file_size < 8)
    fail("{}: {} bytes is too short for a safetensors file (the 8-byte header length is missing)",
         source, file_size);
  SafetensorsHeader header;
  header.header_size = read_le64(file_bytes.data());
  if (header.header_size > kMaxSafetensorsHeaderSize)
    fail("{}: header length {} exceeds the limit of {} bytes (not a safetensors file?)", source,
         header.header_size, kMaxSafetensorsHeaderSize);
  if (header.header_size > file_size - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes)", source,
         header.header_size, file_size);
  header.data_offset = 8 + header.header_size;
  const uint64_t data_size = file_size - header.data_offset;

  const std::string_view text(reinterpret_cast<const char*>(file_bytes.data() + 8),
                              size_t(header.header_size));
  if (text.empty() || text.front() != '{')
    fail("{}: header must be a JSON object starting with '{{'", source);

  std::vector<std::string> key_order;
  const json root = parse_header_json(text, source, key_order);
  if (!root.is_object()) fail("{}: header must be a JSON object", source);

  header.tensors.reserve(key_order.size());
  for (const std::string& key : key_order) {
    const json& value = root.at(key);
    if (key == kMetadataKey)
      header.metadata = parse_metadata(value, source);
    else
      header.tensors.push_back(parse_entry(key, value, data_size, source));
  }
  check_tiling(header.tensors, data_size, source);
  return header;
}

}  // namespace moeserve::io
