#include "core/host_memory.h"

#include <gtest/gtest.h>

namespace moeserve {
namespace {

TEST(HostMemory, ReadsMemAvailableInBytes) {
  const char* meminfo =
      "MemTotal:       24576000 kB\n"
      "MemFree:         1000000 kB\n"
      "MemAvailable:   20971520 kB\n"
      "Buffers:           12345 kB\n";
  EXPECT_EQ(parse_mem_available(meminfo), size_t(20971520) * 1024);
  EXPECT_EQ(parse_mem_available("MemAvailable: 7 kB"), size_t(7168));  // the last line, no newline
}

TEST(HostMemory, MissingOrMalformedMemAvailableIsUnknown) {
  EXPECT_EQ(parse_mem_available("MemTotal: 100 kB\nMemFree: 50 kB\n"), std::nullopt);
  EXPECT_EQ(parse_mem_available("MemAvailable: lots kB\n"), std::nullopt);
  EXPECT_EQ(parse_mem_available("MemAvailable: 100 MB\n"), std::nullopt);
  EXPECT_EQ(parse_mem_available(""), std::nullopt);
}

TEST(HostMemory, CgroupHeadroomIsLimitMinusUsage) {
  EXPECT_EQ(cgroup_headroom("8589934592\n", "2147483648\n"), size_t(6442450944));
  EXPECT_EQ(cgroup_headroom("1000\n", "1500\n"), size_t(0));  // over the limit: nothing left
  EXPECT_EQ(cgroup_headroom("max\n", "2147483648\n"), std::nullopt);  // no limit
  EXPECT_EQ(cgroup_headroom("12x\n", "1\n"), std::nullopt);
  EXPECT_EQ(cgroup_headroom("100\n", ""), std::nullopt);
}

TEST(HostMemory, ThisMachineReportsSomeMemory) {
  const auto avail = available_host_memory();
  ASSERT_TRUE(avail.has_value()) << "Linux reports MemAvailable in /proc/meminfo";
  EXPECT_GT(*avail, size_t(16) << 20);  // more than 16 MiB free on any machine that runs the tests
}

}  // namespace
}  // namespace moeserve
