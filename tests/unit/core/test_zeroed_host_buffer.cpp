#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/zeroed_host_buffer.h"

using namespace moeserve;

namespace {

// Every page's first and last byte and `samples` random offsets of [0, size) are zero.
void expect_all_zero(const ZeroedHostBuffer& b, uint64_t seed, int samples = 4096) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const std::byte* d = b.data();
  for (size_t off = 0; off < b.size(); off += page) {
    ASSERT_EQ(d[off], std::byte{0}) << "first byte of the page at " << off;
    const size_t last = std::min(off + page, b.size()) - 1;
    ASSERT_EQ(d[last], std::byte{0}) << "last byte of the page at " << off;
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, b.size() - 1);
  for (int i = 0; i < samples; ++i) {
    const size_t off = pick(rng);
    ASSERT_EQ(d[off], std::byte{0}) << "byte " << off;
  }
}

}  // namespace

TEST(ZeroedHostBuffer, SmallBufferIsZeroedAndWritable) {
  ZeroedHostBuffer b(1000);  // less than a page
  ASSERT_NE(b.data(), nullptr);
  EXPECT_EQ(b.size(), 1000u);
  EXPECT_FALSE(b.empty());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % uintptr_t(::sysconf(_SC_PAGESIZE)), 0u);
  expect_all_zero(b, 1, 256);
  for (size_t i = 0; i < b.size(); ++i) b.data()[i] = std::byte(i * 7 + 1);
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b.data()[i], std::byte(i * 7 + 1)) << i;
}

TEST(ZeroedHostBuffer, LargeBufferIsZeroedAndWritable) {
  // 600 MiB + 3 bytes: populated by two threads where there are cores, huge pages, a partial last page.
  const size_t bytes = (size_t(600) << 20) + 3;
  ZeroedHostBuffer b(bytes);
  ASSERT_NE(b.data(), nullptr);
  EXPECT_EQ(b.size(), bytes);
  expect_all_zero(b, 2);
  float* f = reinterpret_cast<float*>(b.data());
  const size_t n = bytes / sizeof(float);
  for (size_t i : {size_t(0), size_t(1), n / 3, n / 2, n - 1}) f[i] = float(i) + 0.5f;
  for (size_t i : {size_t(0), size_t(1), n / 3, n / 2, n - 1}) EXPECT_EQ(f[i], float(i) + 0.5f);
  b.data()[bytes - 1] = std::byte{0x5a};
  EXPECT_EQ(b.data()[bytes - 1], std::byte{0x5a});
  EXPECT_EQ(f[n / 2 + 1], 0.0f);  // a neighbour of a written value is still zero
}

TEST(ZeroedHostBuffer, ZeroBytesIsEmpty) {
  ZeroedHostBuffer b(0);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(b.data(), nullptr);
  ZeroedHostBuffer d;
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(d.data(), nullptr);
}

TEST(ZeroedHostBuffer, MoveLeavesTheSourceEmpty) {
  ZeroedHostBuffer a(3 << 20);
  a.data()[12345] = std::byte{42};
  std::byte* const p = a.data();

  ZeroedHostBuffer b(std::move(a));
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), size_t(3) << 20);
  EXPECT_EQ(b.data()[12345], std::byte{42});

  ZeroedHostBuffer c(4096);
  c = std::move(b);  // c's own page is released
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.size(), size_t(3) << 20);
  EXPECT_EQ(c.data()[12345], std::byte{42});

  ZeroedHostBuffer& self = c;
  c = std::move(self);  // self-move keeps the buffer
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.data()[12345], std::byte{42});
}

TEST(ZeroedHostBuffer, AbsurdSizeThrowsNamingTheSize) {
  for (const size_t bytes : {size_t(1) << 60, SIZE_MAX}) {
    try {
      ZeroedHostBuffer b(bytes);
      FAIL() << "allocating " << bytes << " bytes did not throw";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(std::to_string(bytes) + " bytes"), std::string::npos) << message;
      EXPECT_NE(message.find("Cannot allocate memory"), std::string::npos) << message;
    }
  }
}
