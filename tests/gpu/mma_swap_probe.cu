// Device side of test_mma_swap_symmetry.cpp: one mma.sync.m16n8k16 per trial (one warp), bf16
// or f16 inputs, f32 accumulate, so the test can compare an element with its swapped-operand twin.
#include <cuda_runtime.h>

#include <cstdint>

#include "mma_swap_probe.h"

namespace moeserve::gputest {
namespace {

// One warp per trial: A [16][16] row-major, B [8][16] (column j's 16 k values contiguous), C and
// D [16][8] row-major; 16-bit inputs as raw bits.
template <bool kF16>
__global__ void mma_trials(const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  const int trial = blockIdx.x, lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  const uint16_t* A = a + size_t(trial) * 256;
  const uint16_t* B = b + size_t(trial) * 128;
  const float* C = c + size_t(trial) * 128;
  auto pair = [](uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); };
  const uint32_t a0 = pair(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]);
  const uint32_t a1 = pair(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]);
  const uint32_t a2 = pair(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]);
  const uint32_t a3 = pair(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9]);
  const uint32_t b0 = pair(B[g * 16 + 2 * t], B[g * 16 + 2 * t + 1]);
  const uint32_t b1 = pair(B[g * 16 + 2 * t + 8], B[g * 16 + 2 * t + 9]);
  float d0 = C[g * 8 + 2 * t], d1 = C[g * 8 + 2 * t + 1], d2 = C[(g + 8) * 8 + 2 * t], d3 = C[(g + 8) * 8 + 2 * t + 1];
  if constexpr (kF16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  float* D = d + size_t(trial) * 128;
  D[g * 8 + 2 * t] = d0;
  D[g * 8 + 2 * t + 1] = d1;
  D[(g + 8) * 8 + 2 * t] = d2;
  D[(g + 8) * 8 + 2 * t + 1] = d3;
}

}  // namespace

void mma_probe_run(bool f16, int trials, const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  if (f16)
    mma_trials<true><<<trials, 32>>>(a, b, c, d);
  else
    mma_trials<false><<<trials, 32>>>(a, b, c, d);
}

}  // namespace moeserve::gputest
