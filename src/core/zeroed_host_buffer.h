// Zero-filled host memory that is backed by real pages before the constructor returns.
//
// For large pools allocated once at start-up (the CPU KV cache): an anonymous mapping (zero
// pages from the kernel), transparent huge pages where the kernel offers them, and every page
// populated up front, so that the memory exists when the server says ready and a later write
// cannot fail for lack of it. Much faster than std::vector's single-threaded zero fill.
// Linux only (mmap, madvise), like the rest of moeserve.
#pragma once
#include <cstddef>

namespace moeserve {

class ZeroedHostBuffer {
 public:
  ZeroedHostBuffer() = default;
  // Allocates and populates `bytes` zeroed bytes (page-aligned; none for 0). Throws
  // moeserve::Error naming the size and the system's reason when the memory is not there.
  explicit ZeroedHostBuffer(size_t bytes);
  ~ZeroedHostBuffer();
  ZeroedHostBuffer(ZeroedHostBuffer&& other) noexcept;
  ZeroedHostBuffer& operator=(ZeroedHostBuffer&& other) noexcept;
  ZeroedHostBuffer(const ZeroedHostBuffer&) = delete;
  ZeroedHostBuffer& operator=(const ZeroedHostBuffer&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  void release() noexcept;

  std::byte* data_ = nullptr;
  size_t size_ = 0;     // bytes asked for
  size_t mapped_ = 0;   // bytes mapped (size_ rounded up to whole pages)
};

}  // namespace moeserve
