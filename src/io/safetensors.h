// safetensors checkpoint files: a strict, bounds-checked reader (mmap) and a streaming writer.
//
// Layout (https://github.com/huggingface/safetensors, "Format"):
//   8 bytes   N, unsigned little-endian: the header size
//   N bytes   UTF-8 JSON object: name -> {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
//             plus an optional "__metadata__": {string: string}
//   rest      the data section; offsets are relative to its start.
// The reader enforces what the reference implementation enforces: offsets are [begin <= end],
// each tensor's byte size is numel * dtype size, and the ranges, sorted, tile the data section
// exactly (no overlap, no hole, no trailing bytes). Every violation is a moeserve::Error naming
// the file and the tensor.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "io/mapped_file.h"

namespace moeserve::io {

// One tensor's entry in a safetensors header; data_begin/data_end are byte offsets in the data
// section, as stored in the file.
struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t data_begin, data_end;
};

// A parsed and validated header.
struct SafetensorsHeader {
  uint64_t header_size = 0;             // N
  uint64_t data_offset = 0;             // 8 + N: where the data section starts in the file
  std::vector<TensorInfo> tensors;      // in header (JSON text) order
  std::map<std::string, std::string> metadata;
};

// Largest header accepted (the reference reader uses 100 MB as well).
inline constexpr uint64_t kMaxSafetensorsHeaderSize = 100'000'000;

// Parses and validates the header of a whole safetensors file held in memory (file_bytes must
// cover the entire file, so that the data section's extent can be checked). `source` names
// the file in error messages. Never reads outside file_bytes; throws moeserve::Error on any
// malformed input. This is what SafetensorsFile::open uses, and the fuzzing entry point.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file_bytes,
                                           const std::string& source);

// A read-only, memory-mapped safetensors file, validated strictly at open. Tensor views point
// into the mapping (mapped PROT_READ: do not write through them) and keep it alive.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }  // header order
  const TensorInfo* find(const std::string& name) const;  // nullptr if absent
  // A view into the mapping; throws naming the file if the tensor is absent.
  Tensor tensor(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // Size of the whole file in bytes, and where the data section starts in it.
  uint64_t file_size() const;
  uint64_t data_offset() const { return header_.data_offset; }
  // The mapping itself (for loaders that prefetch or copy whole byte ranges).
  const std::shared_ptr<MappedFile>& mapping() const { return mapping_; }

 private:
  SafetensorsFile() = default;

  std::filesystem::path path_;
  std::shared_ptr<MappedFile> mapping_;  // owned also by every tensor view
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;  // name -> position in header_.tensors
};

// Streaming writer: all tensors are declared up front (so the header can be written first),
// then each tensor's bytes are streamed with write_tensor() in declared order, whole or in
// consecutive chunks. Tensors are laid out contiguously in declaration order. Every write is
// checked; finish() verifies that everything declared was written, flushes, fsyncs and closes.
// Not atomic: callers that need atomicity write into a temporary directory and rename it.
class SafetensorsWriter {
 public:
  using Declaration = std::pair<std::string, std::pair<DType, Shape>>;

  SafetensorsWriter(std::filesystem::path path, std::vector<Declaration> decl,
                    std::map<std::string, std::string> metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends bytes to tensor `name`, which must be the current tensor (the first declared one
  // not yet complete); nbytes may be a chunk, but must not overflow the tensor.
  void write_tensor(const std::string& name, const void* bytes, size_t nbytes);
  void finish();

 private:
  void write_raw(const void* bytes, size_t nbytes);
  void flush_buffer();
  void skip_empty_tensors();

  std::filesystem::path path_;
  int fd_ = -1;
  std::vector<std::byte> buffer_;    // coalesces small writes
  std::vector<TensorInfo> entries_;  // declaration order
  size_t current_ = 0;               // index of the tensor being written
  uint64_t written_in_current_ = 0;
  bool finished_ = false;
};

// Writes whole tensors (in the given order) with their metadata.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace moeserve::io
