// DeviceBuffer (device_buffer.h): allocation failures name their cause.
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/device_buffer.h"

namespace moeserve::cuda {
namespace {

TEST(DeviceBuffer, AnAllocationLargerThanTheGpuSaysOutOfGpuMemory) {
  const size_t huge = size_t(1) << 50;  // 1 PiB: more than any GPU holds
  try {
    DeviceBuffer<uint8_t> b(huge);
    FAIL() << "allocated 1 PiB";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of GPU memory: cannot allocate 1125899906842624 bytes on the GPU"), std::string::npos)
        << msg;
  }
  // The device is still usable: the failure was cleared.
  DeviceBuffer<float> small(256);
  EXPECT_EQ(small.size(), 256u);
  EXPECT_NE(small.data(), nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace moeserve::cuda
