#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace moeserve::io {

namespace {
// Closes a file descriptor at scope exit.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open {}: {}", path.string(), std::strerror(errno));
  FdGuard guard{fd};

  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("cannot stat {}: {}", path.string(), std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("{} is not a regular file", path.string());
  if (st.st_size <= 0) fail("{} is empty", path.string());

  void* p = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) fail("cannot map {} ({} bytes): {}", path.string(), st.st_size, std::strerror(errno));

  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->data_ = static_cast<std::byte*>(p);
  file->size_ = uint64_t(st.st_size);
  return file;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_t(size_));
}

void MappedFile::prefetch(uint64_t offset, uint64_t length) const {
  if (offset >= size_ || length == 0) return;
  length = std::min(length, size_ - offset);
  // madvise needs a page-aligned start.
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  const uint64_t aligned = offset / page * page;
  ::madvise(data_ + aligned, size_t(length + (offset - aligned)), MADV_WILLNEED);
}

}  // namespace moeserve::io
