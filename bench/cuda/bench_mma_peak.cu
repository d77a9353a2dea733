// The tensor-core ceiling of mma.sync (the instruction our prompt-token kernels use on the H200
// and the DGX Spark): back-to-back MMAs on register operands, no memory traffic, so the rate is
// the pipe's own. It tells how far the GEMMs of ops_mma_gemm / ops_moe_mma are from what
// mma.sync can do at all (wgmma's published peak is not reachable with mma.sync).
//
//   bench_mma_peak [--warps 4,8,16,32] [--chains 4,8] [--iters 4096]
//
// Each warp runs `chains` independent accumulator chains (C registers of one output tile each)
// for `iters` steps; the grid is resident (the SM count x CTAs of 4..32 warps). FLOP per MMA:
// 2·m·n·k. Shapes (sm_80+; e4m3 needs sm_89+):
//   bf16 m16n8k16 f32 acc, f16 m16n8k16 f32 acc, tf32 m16n8k8 f32 acc, s8 m16n8k32 s32 acc,
//   e4m3 m16n8k32 f32 acc.
// Roofline: the dense peaks quoted for the H200 (wgmma): ~990 bf16/f16, ~495 tf32, ~1,980 fp8 /
// int8 TFLOP/s.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_bench_check.h"

namespace {

enum Kind { kBf16, kF16, kTf32, kS8, kE4m3 };

template <int K>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (K == kBf16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else if constexpr (K == kF16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else if constexpr (K == kTf32)
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else if constexpr (K == kS8)
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+r"(*reinterpret_cast<int*>(&c[0])), "+r"(*reinterpret_cast<int*>(&c[1])),
                   "+r"(*reinterpret_cast<int*>(&c[2])), "+r"(*reinterpret_cast<int*>(&c[3]))
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

constexpr double flop_per_mma(int kind) {
  return kind == kTf32 ? 2.0 * 16 * 8 * 8 : kind == kS8 || kind == kE4m3 ? 2.0 * 16 * 8 * 32 : 2.0 * 16 * 8 * 16;
}

// Operands come from the (zero) input so the compiler cannot fold them; the sum is stored only
// when it equals a magic value (never), so the MMAs cannot be dropped.
template <int Kind, int Chains>
__global__ void mma_loop_kernel(const uint32_t* __restrict__ in, int iters, float* __restrict__ out) {
  uint32_t a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = in[(threadIdx.x + i) & 31];
  for (int i = 0; i < 2; ++i) b[i] = in[(threadIdx.x + 4 + i) & 31];
  float c[Chains][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int ch = 0; ch < Chains; ++ch) mma<Kind>(c[ch], a, b);
  }
  float s = 0.f;
#pragma unroll
  for (int ch = 0; ch < Chains; ++ch) s += c[ch][0] + c[ch][1] + c[ch][2] + c[ch][3];
  if (s == 1234.5f) out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

template <int Kind, int Chains>
double run(int sms, int warps, int iters, const uint32_t* in, float* out) {
  const int threads = std::min(warps, 32) * 32;
  const int blocks_per_sm = std::max(1, warps / 32);
  const int grid = sms * blocks_per_sm;
  auto* k = mma_loop_kernel<Kind, Chains>;
  k<<<grid, threads>>>(in, iters, out);  // warm-up
  CHECK(cudaGetLastError());
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaEventRecord(e0));
  k<<<grid, threads>>>(in, iters, out);
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  const double mmas = double(grid) * threads / 32 * Chains * iters;
  return mmas * flop_per_mma(Kind) / (ms * 1e-3) / 1e12;
}

template <int Kind>
void row(const char* name, int sms, const std::vector<int>& warps, const std::vector<int>& chains, int iters,
         const uint32_t* in, float* out) {
  for (int ch : chains)
    for (int w : warps) {
      double t = 0;
      if (ch <= 2) t = run<Kind, 2>(sms, w, iters, in, out);
      else if (ch <= 4) t = run<Kind, 4>(sms, w, iters, in, out);
      else t = run<Kind, 8>(sms, w, iters, in, out);
      std::printf("%-6s chains %d  warps/SM %-3d  %8.1f TFLOP/s\n", name, ch <= 2 ? 2 : ch <= 4 ? 4 : 8, w, t);
    }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mma.sync throughput ceiling (register operands)"};
  std::string warps_s = "4,8,16,32", chains_s = "4,8";
  int iters = 4096;
  app.add_option("--warps", warps_s, "warps per SM (<= 32 per CTA; 64 = two CTAs of 32)");
  app.add_option("--chains", chains_s, "independent accumulators per warp (2, 4 or 8)");
  app.add_option("--iters", iters, "MMA steps per chain");
  CLI11_PARSE(app, argc, argv);
  auto parse = [](const std::string& s) {
    std::vector<int> v;
    size_t p = 0;
    while (p < s.size()) {
      size_t q = s.find(',', p);
      if (q == std::string::npos) q = s.size();
      v.push_back(std::stoi(s.substr(p, q - p)));
      p = q + 1;
    }
    return v;
  };
  const auto warps = parse(warps_s), chains = parse(chains_s);
  int dev = 0, sms = 0, major = 0, minor = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  uint32_t* in = nullptr;
  float* out = nullptr;
  CHECK(cudaMalloc(&in, 64 * sizeof(uint32_t)));
  CHECK(cudaMemset(in, 0, 64 * sizeof(uint32_t)));
  CHECK(cudaMalloc(&out, size_t(sms) * 2048 * sizeof(float)));
  std::printf("sm_%d%d, %d SMs, %d MMA steps per chain\n", major, minor, sms, iters);
  row<kBf16>("bf16", sms, warps, chains, iters, in, out);
  row<kF16>("f16", sms, warps, chains, iters, in, out);
  row<kTf32>("tf32", sms, warps, chains, iters, in, out);
  row<kS8>("s8", sms, warps, chains, iters, in, out);
  if (major * 10 + minor >= 89) row<kE4m3>("e4m3", sms, warps, chains, iters, in, out);
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  return 0;
}
