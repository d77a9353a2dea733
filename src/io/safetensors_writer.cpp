#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"

namespace moeserve::io {

namespace {

constexpr size_t kWriteBufferSize = size_t(4) << 20;

// The header JSON with tensors in declaration order (nlohmann objects would sort the keys),
// padded with spaces to a multiple of 8 bytes so that the data section starts 8-aligned.
std::string build_header(const std::vector<TensorInfo>& entries,
                         const std::map<std::string, std::string>& metadata) {
  std::string out = "{";
  bool first = true;
  auto sep = [&] {
    if (!first) out += ',';
    first = false;
  };
  if (!metadata.empty()) {
    sep();
    out += "\"__metadata__\":" + nlohmann::json(metadata).dump();
  }
  for (const TensorInfo& t : entries) {
    sep();
    out += nlohmann::json(t.name).dump();
    out += ":{\"dtype\":\"";
    out += dtype_name(t.dtype);
    out += "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) out += ',';
      out += std::to_string(t.shape[i]);
    }
    out += "],\"data_offsets\":[" + std::to_string(t.data_begin) + "," +
           std::to_string(t.data_end) + "]}";
  }
  out += '}';
  out.append((8 - out.size() % 8) % 8, ' ');
  return out;
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(std::filesystem::path path, std::vector<Declaration> decl,
                                     std::map<std::string, std::string> metadata)
    : path_(std::move(path)) {
  const std::string source = path_.string();
  std::set<std::string> names;
  uint64_t offset = 0;
  entries_.reserve(decl.size());
  for (auto& [name, type_shape] : decl) {
    auto& [dtype, shape] = type_shape;
    if (name == "__metadata__") fail("{}: '__metadata__' cannot be a tensor name", source);
    if (!names.insert(name).second) fail("{}: tensor '{}' declared twice", source, name);
    uint64_t numel = 1;
    for (int64_t d : shape) {
      if (d < 0) fail("{}: tensor '{}': negative dimension in shape {}", source, name, shape_to_string(shape));
      if (__builtin_mul_overflow(numel, uint64_t(d), &numel))
        fail("{}: tensor '{}': shape {} overflows", source, name, shape_to_string(shape));
    }
    uint64_t nbytes = 0;
    if (numel > uint64_t(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(numel, uint64_t(dtype_size(dtype)), &nbytes) ||
        __builtin_add_overflow(offset, nbytes, &offset))
      fail("{}: tensor '{}': shape {} overflows", source, name, shape_to_string(shape));
    entries_.push_back(TensorInfo{name, dtype, shape, offset - nbytes, offset});
  }

  const std::string header = build_header(entries_, metadata);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create {}: {}", source, std::strerror(errno));
  buffer_.reserve(kWriteBufferSize);
  std::byte length[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) length[i] = std::byte((n >> (8 * i)) & 0xff);
  write_raw(length, 8);
  write_raw(header.data(), header.size());
  skip_empty_tensors();
}

SafetensorsWriter::~SafetensorsWriter() {
  if (finished_) return;
  // Abandoned (an exception, or finish() never called): do not leave a truncated file behind.
  if (fd_ >= 0) ::close(fd_);
  std::error_code ec;
  std::filesystem::remove(path_, ec);
}

void SafetensorsWriter::skip_empty_tensors() {
  while (current_ < entries_.size() && entries_[current_].data_end == entries_[current_].data_begin) {
    ++current_;
    written_in_current_ = 0;
  }
}

void SafetensorsWriter::write_tensor(const std::string& name, const void* bytes, size_t nbytes) {
  const std::string source = path_.string();
  if (finished_) fail("{}: write_tensor('{}') after finish()", source, name);
  if (current_ >= entries_.size() || entries_[current_].name != name) {
    // Empty tensors are complete without any write; accept an explicit empty write for them.
    if (nbytes == 0)
      for (const TensorInfo& t : entries_)
        if (t.name == name && t.data_begin == t.data_end) return;
    if (current_ >= entries_.size())
      fail("{}: write_tensor('{}'): every declared tensor is already written", source, name);
    fail("{}: write_tensor('{}'): tensors must be written in declared order; expected '{}'", source,
         name, entries_[current_].name);
  }
  const TensorInfo& t = entries_[current_];
  const uint64_t size = t.data_end - t.data_begin;
  if (nbytes > size - written_in_current_)
    fail("{}: tensor '{}': {} bytes written, {} more would exceed its {} bytes", source, name,
         written_in_current_, nbytes, size);
  if (nbytes > 0 && bytes == nullptr) fail("{}: tensor '{}': null data", source, name);
  write_raw(bytes, nbytes);
  written_in_current_ += nbytes;
  if (written_in_current_ == size) {
    ++current_;
    written_in_current_ = 0;
    skip_empty_tensors();
  }
}

void SafetensorsWriter::write_raw(const void* bytes, size_t nbytes) {
  const auto* p = static_cast<const std::byte*>(bytes);
  if (buffer_.size() + nbytes <= kWriteBufferSize) {
    buffer_.insert(buffer_.end(), p, p + nbytes);
    return;
  }
  flush_buffer();
  if (nbytes < kWriteBufferSize) {
    buffer_.insert(buffer_.end(), p, p + nbytes);
    return;
  }
  while (nbytes > 0) {
    const ssize_t w = ::write(fd_, p, nbytes);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("cannot write {}: {}", path_.string(), std::strerror(w < 0 ? errno : EIO));
    p += w;
    nbytes -= size_t(w);
  }
}

void SafetensorsWriter::flush_buffer() {
  const std::byte* p = buffer_.data();
  size_t left = buffer_.size();
  while (left > 0) {
    const ssize_t w = ::write(fd_, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("cannot write {}: {}", path_.string(), std::strerror(w < 0 ? errno : EIO));
    p += w;
    left -= size_t(w);
  }
  buffer_.clear();
}

void SafetensorsWriter::finish() {
  if (finished_) return;
  const std::string source = path_.string();
  if (current_ < entries_.size())
    fail("{}: finish() before tensor '{}' was written ({} of {} bytes)", source,
         entries_[current_].name, written_in_current_,
         entries_[current_].data_end - entries_[current_].data_begin);
  flush_buffer();
  if (::fsync(fd_) != 0) fail("cannot sync {}: {}", source, std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot close {}: {}", source, std::strerror(errno));
  finished_ = true;
}

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Declaration> decl;
  decl.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    if (!t.defined() && t.numel() != 0)
      fail("{}: tensor '{}' has no data", path.string(), name);
    decl.push_back({name, {t.dtype(), t.shape()}});
  }
  SafetensorsWriter writer(path, std::move(decl), metadata);
  for (const auto& [name, t] : tensors) writer.write_tensor(name, t.bytes(), t.nbytes());
  writer.finish();
}

}  // namespace moeserve::io
