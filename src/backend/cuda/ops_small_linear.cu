// Kernel declared in ops_small_linear.h: one warp per output column n, four rows of x per
// warp (the weight row is read once for the four), 8 warps per block.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_small_linear.h"

namespace moeserve::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 4;  // rows of x per warp

__global__ void linear_f32_input_kernel(const float* __restrict__ x, int M, int K, const bf16* __restrict__ w,
                                        int N, float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int m0 = blockIdx.y * kRows;
  if (n >= N) return;
  const bf16* wr = w + size_t(n) * K;
  float acc[kRows] = {0.0f, 0.0f, 0.0f, 0.0f};
  // Chunks of 8 weights (one 16-byte load); K % 8 == 0 is checked on the host.
  for (int k = lane * 8; k < K; k += 32 * 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(wr + k);
    const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
    float wf[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(w2[i]);
      wf[2 * i] = f.x;
      wf[2 * i + 1] = f.y;
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (m0 + r >= M) break;
      const float* xr = x + size_t(m0 + r) * K + k;
      const float4 a = *reinterpret_cast<const float4*>(xr);
      const float4 b = *reinterpret_cast<const float4*>(xr + 4);
      float s = acc[r];
      s = fmaf(a.x, wf[0], s);
      s = fmaf(a.y, wf[1], s);
      s = fmaf(a.z, wf[2], s);
      s = fmaf(a.w, wf[3], s);
      s = fmaf(b.x, wf[4], s);
      s = fmaf(b.y, wf[5], s);
      s = fmaf(b.z, wf[6], s);
      s = fmaf(b.w, wf[7], s);
      acc[r] = s;
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float v = acc[r];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0 && m0 + r < M) y[size_t(m0 + r) * N + n] = v;
  }
}

}  // namespace

bool small_linear_supported(const DeviceLinear& w) {
  return w.format == quant::WeightFormat::Dense && w.K % 8 == 0 && w.dense.size() == size_t(w.N) * size_t(w.K);
}

void linear_f32_input(const float* x, int M, const DeviceLinear& w, float* y, cudaStream_t stream) {
  if (M == 0) return;
  if (!small_linear_supported(w)) throw Error("linear_f32_input: needs a dense bf16 weight with K % 8 == 0");
  dim3 grid(unsigned((w.N + kWarps - 1) / kWarps), unsigned((M + kRows - 1) / kRows));
  linear_f32_input_kernel<<<grid, kWarps * 32, 0, stream>>>(x, M, int(w.K), w.dense.data(), int(w.N), y);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
