// What code that is not in the SM's instruction cache costs a latency-bound kernel. The decode
// step's single-pass kernels (the fused expert kernel ~121 KB of SASS, the tile-parallel decode
// attention ~96 KB, the DeltaNet decode kernel ~55 KB: cubin .text sizes) run each line of their
// code about once per CTA, between launches of other kernels on the same SMs, while the weight
// streams turn the 50 MB L2 over every ~25 us. A globaltimer trace of the decode attention kernel
// (docs/PERF.md run S25-1) spent ~5 us in a phase with no global memory access and little work.
// This program prices the instruction fetch in the conditions such a kernel meets.
//
//   bench_icache [--ctas 132] [--reps 9] [--flush-mib 1024]
//
// code_kernel<kInstr, kTag>: kInstr FFMAs in 8 independent chains, straight line (each an asm
// volatile statement: one 16-byte SASS instruction, so the code is ~kInstr x 16 B), run once by
// one warp per CTA; thread 0 stamps %globaltimer before the first and after the last. kTag makes
// a second kernel of the same size (other code at other addresses). Conditions, each timed as the
// median over CTAs and repetitions of the in-kernel time:
//   warm     the kernel launched twice in a row, the second timed (its code in every cache level);
//   L1i-cold the other kernel of the largest size (256 KB of other code) between the two: the
//            SMs' instruction caches hold other code, L2 still holds this kernel's;
//   L2-cold  a streaming read of --flush-mib MiB between the two: the code is fetched from HBM;
//   loaded   L2-cold, and the kernel runs while a streaming read on another stream keeps HBM busy
//            on the other SMs (the decode step's situation: the next GEMV's weights in flight).
// Roofline: none (latency). The warm time is the issue floor (~1 instruction per cycle for one
// warp); (cold - warm) / KB is what a kernel pays per KB of code it runs cold.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda_bench_check.h"

namespace {

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One CTA of one warp: kInstr FFMAs in 8 chains, straight line; out[2·cta] = start, [2·cta + 1] =
// end (ns). kTag only makes another instance.
template <int kInstr, int kTag>
__global__ void __launch_bounds__(32) code_kernel(float a, float b, unsigned long long* stamps, float* sink) {
  float c[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) c[j] = float(threadIdx.x + j + kTag);
  const unsigned long long t0 = global_ns();
#pragma unroll
  for (int i = 0; i < kInstr / 8; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(c[j]) : "f"(a), "f"(b));
  }
  const unsigned long long t1 = global_ns();
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += c[j];
  if (threadIdx.x == 0) {
    stamps[2 * blockIdx.x] = t0;
    stamps[2 * blockIdx.x + 1] = t1;
  }
  if (s == 12345.0f) sink[threadIdx.x] = s;  // keeps the chains live
}

// Streams n 16-byte vectors (grid-stride, through L2, not L1) into one sum per thread; with
// kHog, each CTA also takes most of its SM's shared memory so that no other CTA joins it.
template <bool kHog>
__global__ void stream_kernel(const uint4* __restrict__ p, size_t n, int passes, unsigned* sink) {
  extern __shared__ unsigned hog[];
  unsigned s = 0;
  for (int r = 0; r < passes; ++r)
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
      const uint4 v = __ldcg(p + i);  // normal L2 priority: it evicts what was there
      s += v.x ^ v.y ^ v.z ^ v.w;
    }
  if (kHog && s == 0x9e3779b9u) hog[threadIdx.x] = s;
  if (s == 0x9e3779b9u) sink[0] = s;
}

struct Buffers {
  uint4* flush = nullptr;
  size_t flush_vecs = 0;
  unsigned long long* stamps = nullptr;
  float* fsink = nullptr;
  unsigned* usink = nullptr;
};

using CodeFn = void (*)(float, float, unsigned long long*, float*);

void flush_l2(const Buffers& B, cudaStream_t s) {
  stream_kernel<false><<<1024, 512, 0, s>>>(B.flush, B.flush_vecs, 1, B.usink);
  CHECK(cudaGetLastError());
}

// In-kernel ns of each CTA of the last launch.
std::vector<double> spans(const Buffers& B, int ctas) {
  std::vector<unsigned long long> h(size_t(2) * ctas);
  CHECK(cudaMemcpy(h.data(), B.stamps, h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  std::vector<double> v;
  for (int i = 0; i < ctas; ++i) v.push_back(double(h[2 * i + 1] - h[2 * i]));
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

enum Condition { kWarm, kL1iCold, kL2Cold, kLoaded, kConditions };
const char* const kConditionNames[kConditions] = {"warm", "L1i-cold", "L2-cold", "loaded"};

// Median in-kernel us of fn over reps repetitions of one condition.
double measure(CodeFn fn, CodeFn other, Condition c, const Buffers& B, int ctas, int reps, int sms,
               cudaStream_t s0, cudaStream_t s1) {
  std::vector<double> all;
  for (int r = 0; r < reps; ++r) {
    fn<<<ctas, 32, 0, s0>>>(1.0001f, 0.5f, B.stamps, B.fsink);
    if (c == kL1iCold) other<<<ctas, 32, 0, s0>>>(1.0001f, 0.5f, B.stamps, B.fsink);
    if (c == kL2Cold || c == kLoaded) flush_l2(B, s0);
    CHECK(cudaStreamSynchronize(s0));
    if (c == kLoaded) {
      // The load on all but `ctas` SMs (one CTA each: most of the shared memory), long enough to
      // outlast the code kernel, started first.
      int smem = 0;
      CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
      CHECK(cudaFuncSetAttribute(stream_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      stream_kernel<true><<<std::max(1, sms - ctas), 1024, size_t(smem), s1>>>(B.flush, B.flush_vecs, 1, B.usink);
      CHECK(cudaGetLastError());
    }
    fn<<<ctas, 32, 0, s0>>>(1.0001f, 0.5f, B.stamps, B.fsink);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    const std::vector<double> v = spans(B, ctas);
    all.insert(all.end(), v.begin(), v.end());
  }
  return median(all) / 1000.0;
}

template <int kInstr>
void run_size(const Buffers& B, int ctas, int reps, int sms, cudaStream_t s0, cudaStream_t s1) {
  const CodeFn fn = code_kernel<kInstr, 0>, other = code_kernel<16384, 1>;
  cudaFuncAttributes fa{};
  CHECK(cudaFuncGetAttributes(&fa, fn));
  double t[kConditions];
  for (int c = 0; c < kConditions; ++c) t[c] = measure(fn, other, Condition(c), B, ctas, reps, sms, s0, s1);
  const double kb = double(kInstr) * 16.0 / 1024.0;  // the loop's code; the kernel adds a few lines
  std::printf("%6d FFMA (%6.0f KB)  %8.3f  %8.3f  %8.3f  %8.3f   %7.4f  %7.4f  %7.4f\n", kInstr, kb, t[kWarm],
              t[kL1iCold], t[kL2Cold], t[kLoaded], (t[kL1iCold] - t[kWarm]) / kb, (t[kL2Cold] - t[kWarm]) / kb,
              (t[kLoaded] - t[kWarm]) / kb);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_icache: the cost of running code that is not in the instruction cache"};
  int ctas = 0, reps = 9, flush_mib = 1024;
  app.add_option("--ctas", ctas, "CTAs of one warp per launch (default: a quarter of the SMs)");
  app.add_option("--reps", reps, "repetitions per condition (the median over CTAs and repetitions)");
  app.add_option("--flush-mib", flush_mib, "MiB streamed to flush L2 (and to load HBM in 'loaded')");
  CLI11_PARSE(app, argc, argv);
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  if (ctas <= 0) ctas = std::max(1, sms / 4);
  if (ctas >= sms || reps < 1 || flush_mib < 64) {
    std::fprintf(stderr, "bench_icache: --ctas below the SM count (%d), --reps >= 1, --flush-mib >= 64\n", sms);
    return 2;
  }
  Buffers B;
  B.flush_vecs = size_t(flush_mib) * 1024 * 1024 / sizeof(uint4);
  CHECK(cudaMalloc(&B.flush, B.flush_vecs * sizeof(uint4)));
  CHECK(cudaMemset(B.flush, 1, B.flush_vecs * sizeof(uint4)));
  CHECK(cudaMalloc(&B.stamps, size_t(2) * sms * sizeof(unsigned long long)));
  CHECK(cudaMalloc(&B.fsink, 32 * sizeof(float)));
  CHECK(cudaMalloc(&B.usink, sizeof(unsigned)));
  cudaStream_t s0, s1;
  CHECK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  std::printf("%s, %d SMs, L2 %d MB; %d CTAs of one warp; %d repetitions; flush %d MiB\n", prop.name, sms,
              prop.l2CacheSize >> 20, ctas, reps, flush_mib);
  std::printf("in-kernel us (median over CTAs)     ");
  for (const char* name : kConditionNames) std::printf("  %8s", name);
  std::printf("   us per KB over warm: L1i-cold / L2-cold / loaded\n");
  run_size<256>(B, ctas, reps, sms, s0, s1);
  run_size<1024>(B, ctas, reps, sms, s0, s1);
  run_size<4096>(B, ctas, reps, sms, s0, s1);
  run_size<16384>(B, ctas, reps, sms, s0, s1);
  CHECK(cudaFree(B.flush));
  CHECK(cudaFree(B.stamps));
  CHECK(cudaFree(B.fsink));
  CHECK(cudaFree(B.usink));
  return 0;
}
