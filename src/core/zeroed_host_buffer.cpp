#include "core/zeroed_host_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"

namespace moeserve {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;  // x86-64 / arm64 (4 KiB base pages) PMD size
// Populating is split over threads only in pieces at least this large.
constexpr size_t kMinBytesPerThread = size_t(256) << 20;
constexpr size_t kMaxThreads = 4;

// Writes one byte of every page of [begin, begin + length): each page is allocated now.
void touch_pages(std::byte* begin, size_t length, size_t page) {
  volatile std::byte* p = begin;
  for (size_t off = 0; off < length; off += page) p[off] = std::byte{0};
}

// Makes every page of [begin, begin + length) resident and writable; returns 0 or an errno.
int populate(std::byte* begin, size_t length, size_t page) {
  if (length == 0) return 0;
#ifdef MADV_POPULATE_WRITE
  int err;
  do {
    if (::madvise(begin, length, MADV_POPULATE_WRITE) == 0) return 0;
    err = errno;
  } while (err == EINTR);
  // EINVAL: a kernel before 5.14 does not know MADV_POPULATE_WRITE; touch the pages instead.
  // Anything else (ENOMEM, EFAULT, EHWPOISON) means the memory is not there.
  if (err != EINVAL) return err;
#endif
  touch_pages(begin, length, page);
  return 0;
}

// Populates [base, base + length) in up to kMaxThreads pieces split at huge-page boundaries;
// returns 0 or the first errno.
int populate_parallel(std::byte* base, size_t length, size_t page) {
  const size_t hw = std::max<size_t>(1, std::thread::hardware_concurrency());
  const size_t n = std::clamp<size_t>(length / kMinBytesPerThread, 1, std::min(hw, kMaxThreads));
  if (n == 1) return populate(base, length, page);

  const auto start = reinterpret_cast<uintptr_t>(base);
  const auto cut = [&](size_t i) -> size_t {  // offset where piece i starts
    if (i == 0) return 0;
    if (i == n) return length;
    const uintptr_t at = (start + length / n * i + kHugePage - 1) / kHugePage * kHugePage;
    return std::min(size_t(at - start), length);
  };
  std::vector<int> errors(n, 0);
  std::vector<std::thread> threads;
  threads.reserve(n - 1);
  for (size_t i = 1; i < n; ++i) {
    const auto job = [&, i] { errors[i] = populate(base + cut(i), cut(i + 1) - cut(i), page); };
    try {
      threads.emplace_back(job);
    } catch (const std::system_error&) {
      job();  // no thread to spare: do that piece here
    }
  }
  errors[0] = populate(base, cut(1), page);
  for (auto& t : threads) t.join();
  for (int e : errors)
    if (e != 0) return e;
  return 0;
}

}  // namespace

ZeroedHostBuffer::ZeroedHostBuffer(size_t bytes) {
  if (bytes == 0) return;
  const auto fail_for = [bytes](int err) {
    fail("cannot allocate {} bytes ({:.2f} GiB) of zeroed host memory: {}", bytes, double(bytes) / double(1ull << 30),
         std::strerror(err));
  };
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  if (bytes > SIZE_MAX - page) fail_for(ENOMEM);
  const size_t mapped = (bytes + page - 1) / page * page;

  // Private anonymous memory comes zeroed from the kernel.
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail_for(errno);
  data_ = static_cast<std::byte*>(p);
  size_ = bytes;
  mapped_ = mapped;
#ifdef MADV_HUGEPAGE
  // A hint (fails harmlessly where THP is off): one fault per 2 MiB instead of per 4 KiB.
  if (mapped >= kHugePage) ::madvise(p, mapped, MADV_HUGEPAGE);
#endif
  if (const int err = populate_parallel(data_, mapped, page); err != 0) {
    release();
    fail_for(err);
  }
}

ZeroedHostBuffer::~ZeroedHostBuffer() { release(); }

ZeroedHostBuffer::ZeroedHostBuffer(ZeroedHostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)) {}

ZeroedHostBuffer& ZeroedHostBuffer::operator=(ZeroedHostBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

void ZeroedHostBuffer::release() noexcept {
  if (data_) ::munmap(data_, mapped_);
  data_ = nullptr;
  size_ = 0;
  mapped_ = 0;
}

}  // namespace moeserve
