// A whole file mapped read-only into memory (POSIX mmap), released when the last owner goes.
// Checkpoint tensors are views into such mappings, so a 100 GB model costs page cache, not
// heap. The file must not be truncated while mapped (the kernel would raise SIGBUS on access).
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>

namespace moeserve::io {

class MappedFile {
 public:
  // Maps `path`; throws moeserve::Error naming the file if it cannot be opened, is not a
  // regular file, or is empty (an empty file cannot be mapped).
  static std::shared_ptr<MappedFile> open(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  std::span<const std::byte> bytes() const { return {data_, size_t(size_)}; }

  // Hints the kernel to start reading [offset, offset + length) (madvise WILLNEED); a no-op
  // outside the file. Loaders call this ahead of copying weights to the device.
  void prefetch(uint64_t offset, uint64_t length) const;

 private:
  MappedFile() = default;

  std::filesystem::path path_;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace moeserve::io
