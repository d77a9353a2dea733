// Small decisions of `moeserve serve` that need no model.
#include <gtest/gtest.h>

#include <thread>

#include "server/serve_command.h"

namespace moeserve::server {
namespace {

TEST(ServeCommand, SamplerThreads) {
  EXPECT_EQ(sampler_threads_for(3, "cpu"), 3);
  EXPECT_EQ(sampler_threads_for(3, "cuda"), 3);
  EXPECT_EQ(sampler_threads_for(0, "cpu"), 1);  // the CPU backend's threads run the model
  const int gpu = sampler_threads_for(0, "cuda");
  EXPECT_GE(gpu, 1);
  EXPECT_LE(gpu, 8);
  EXPECT_EQ(gpu, std::max(1, std::min(8, int(std::thread::hardware_concurrency()) / 2)));
}

}  // namespace
}  // namespace moeserve::server
