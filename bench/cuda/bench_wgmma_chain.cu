// The rate of tc_gemv's wgmma step alone (ops_tc_gemv_wgmma.cu): per 128-k block each warpgroup
// issues 16 register-A m64n64k16 f16 wgmmas (hi and lo planes of 8 k16 steps) into one
// accumulator chain, commits and waits. Here one CTA of two warpgroups per SM does only that, on
// operands already in registers and shared memory: no weight loads, no conversion, no fold. It
// tells how much of tc_gemv's time per block the MMAs themselves take (session 16: 0.58 us per
// block and CTA at ~960 TFLOP/s, against ~1.4 us per block in the kernel).
//
//   bench_wgmma_chain [--iters 20000]
//
// Variants: N 64 one chain (the kernel's form); N 64 two interleaved chains (two blocks at once);
// m64n128k16 bf16 one chain (hi | lo side by side, 8 per block). FLOP per wgmma 2·64·N·16.
// Roofline: the H200's dense f16 / bf16 peak, ~990 TFLOP/s. sm_90 only (wgmma).
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>

#include "backend/cuda/wgmma.cuh"
#include "cuda_bench_check.h"

namespace {

using namespace moeserve::cuda;

constexpr int kThreads = 256;  // two warpgroups
constexpr int kTile = 65536;   // shared-memory B operand bytes read by the variants

enum Variant { kN64One, kN64Two, kN128One };

template <int V>
__global__ void __launch_bounds__(kThreads, 1) wgmma_chain_kernel(float* out, int iters) {
  extern __shared__ __align__(1024) unsigned char raw[];
  uint32_t sbase = 0;
  unsigned char* smem = wgmma::align_smem_512(raw, sbase);
  // f16 values around 1 (the rate does not depend on them; no NaN / Inf).
  for (int i = int(threadIdx.x); i < kTile / 4; i += kThreads)
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3c003c00u ^ ((uint32_t(i) * 2654435761u) & 0x03ff03ffu);
  wgmma::fence_proxy_async_shared();
  __syncthreads();
  uint32_t a[8][4];
  for (int s = 0; s < 8; ++s)
    for (int r = 0; r < 4; ++r) a[s][r] = 0x3c003c00u + threadIdx.x + 7u * s + r;
  float c0[8][4] = {}, c1[8][4] = {}, c2[16][4] = {};
  for (int it = 0; it < iters; ++it) {
    wgmma::fence();
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      if constexpr (V == kN128One) {
        const uint32_t off = uint32_t((s >> 1) * 8192 + (s & 1) * 32);
        wgmma::mma_m64n128k16_bf16_rs(c2, a[s], wgmma::desc_sw64(sbase + off));
      } else {
        const uint32_t off = uint32_t((s >> 1) * 4096 + (s & 1) * 32);
        wgmma::mma_m64nNk16_f16_rs<64, false>(c0, a[s], wgmma::desc_sw64(sbase + off));
        if constexpr (V == kN64Two) wgmma::mma_m64nNk16_f16_rs<64, false>(c1, a[7 - s], wgmma::desc_sw64(sbase + 32768 + off));
        wgmma::mma_m64nNk16_f16_rs<64, false>(c0, a[s], wgmma::desc_sw64(sbase + 16384 + off));
        if constexpr (V == kN64Two) wgmma::mma_m64nNk16_f16_rs<64, false>(c1, a[7 - s], wgmma::desc_sw64(sbase + 49152 + off));
      }
    }
    wgmma::commit_group();
    wgmma::wait_group<0>();
    for (int j = 0; j < 8; ++j)
      for (int i = 0; i < 4; ++i) wgmma::fence_operand(c0[j][i]), wgmma::fence_operand(c1[j][i]);
    for (int j = 0; j < 16; ++j)
      for (int i = 0; i < 4; ++i) wgmma::fence_operand(c2[j][i]);
  }
  float t = 0.0f;
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < 4; ++i) t += c0[j][i] + c1[j][i];
  for (int j = 0; j < 16; ++j)
    for (int i = 0; i < 4; ++i) t += c2[j][i];
  out[blockIdx.x * kThreads + threadIdx.x] = t;
}

template <int V>
void run(const char* name, double flop_per_iter_per_wg, int sms, int iters, float* out) {
  const int smem = kTile + 1024;
  CHECK(cudaFuncSetAttribute(wgmma_chain_kernel<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  wgmma_chain_kernel<V><<<sms, kThreads, smem>>>(out, 100);  // warm-up
  CHECK(cudaGetLastError());
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaEventRecord(a));
  wgmma_chain_kernel<V><<<sms, kThreads, smem>>>(out, iters);
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms = 0.0f;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  const double flop = flop_per_iter_per_wg * 2.0 * sms * iters;
  std::printf("%-34s %9.3f ms  %7.1f TFLOP/s  %.3f us per block and CTA\n", name, ms, flop / ms / 1e9,
              ms * 1e3 / iters);
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wgmma chain rate (tc_gemv's MMA step alone)"};
  int iters = 20000;
  app.add_option("--iters", iters, "blocks per CTA");
  CLI11_PARSE(app, argc, argv);
  int dev = 0, major = 0, minor = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (major != 9 || minor != 0) {
    std::printf("bench_wgmma_chain: needs an sm_90 GPU (wgmma); this one is sm_%d%d\n", major, minor);
    return 1;
  }
  float* out = nullptr;
  CHECK(cudaMalloc(&out, size_t(sms) * kThreads * sizeof(float)));
  const double mma64 = 2.0 * 64 * 64 * 16;
  std::printf("one CTA of 2 warpgroups per SM (%d SMs), %d blocks each\n", sms, iters);
  run<kN64One>("m64n64k16, one chain (tc_gemv)", 16 * mma64, sms, iters, out);
  run<kN64Two>("m64n64k16, two chains", 32 * mma64, sms, iters, out);
  run<kN128One>("m64n128k16, one chain", 8 * 2 * mma64, sms, iters, out);
  CHECK(cudaFree(out));
  return 0;
}
