// What one latency-bound step of a kernel costs when many CTAs do it at once: the fused one-token
// expert kernel's tail (ops_moe_int_stream.cu) has every one of its down CTAs read the same 16 KB of
// act planes right after a grid-wide wait, and its act exchange runs while each CTA's own ring of
// down weights (up to ~86 KB per CTA) is in flight. This benchmark separates the two effects:
//   - broadcast: G CTAs read the same S bytes at the same moment (every thread issues its 16-byte
//     __ldcg loads, then uses them), optionally from R replicas (CTA c reads copy c % R), so that
//     each L2 line is asked for by G / R CTAs;
//   - queued: each CTA first issues Q bytes of its own cp.async copies from cold memory (its ring),
//     then does the broadcast read and one __threadfence + atomicAdd round trip, so the time of
//     those behind the CTA's own copies shows.
// All CTAs are resident (cooperative launch) and start together (a grid-wide count); thread 0 of
// each CTA stamps %globaltimer around each part. Per configuration, the median and p90 over CTAs and
// launches:
//   issue  : the CTA's Q bytes of cp.async issued (its threads past their last copy instruction);
//   read   : the S-byte broadcast read, loads issued to values used, after __syncthreads;
//   atomic : thread 0's __threadfence + atomicAdd after the read;
//   landed : the CTA's copies all landed (from the start).
//
//   bench_l2_contention [--launches 12] [--threads 192]
//
// Roofline: none (latency). The numbers say whether staging 16 KB in ~2.5 us (run S25-7) is the L2
// serving one line to 192 CTAs, or the CTA's own copies ahead of its loads.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda_bench_check.h"

namespace {

__device__ unsigned g_start[4096];  // one start count per launch (zeroed by the host before a series)
__device__ unsigned g_atomic_sink;

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

struct Probe {
  const uint4* bcast;     // R replicas of S bytes, contiguous
  int bcast_vecs;         // S / 16
  int replicas;
  const uint4* stream;    // cold memory for the CTAs' own copies
  size_t stream_offset;   // vectors: this launch's region (a fresh one per launch)
  int own_vecs;           // Q / 16 per CTA
  int launch;             // g_start slot
  unsigned long long* out;  // [grid][4]: issue, read, atomic, landed (ns)
  unsigned* sink;
};

__global__ void __launch_bounds__(256) probe_kernel(Probe p) {
  extern __shared__ uint4 ring[];
  const int tid = threadIdx.x, nthr = blockDim.x, cta = blockIdx.x;
  // Start together: every CTA arrives, thread 0 polls until all have.
  __syncthreads();
  if (tid == 0) {
    atomicAdd(&g_start[p.launch], 1u);
    while (ld_acquire(&g_start[p.launch]) < gridDim.x) {
    }
  }
  __syncthreads();
  const unsigned long long t0 = now_ns();
  // The CTA's own copies: thread t copies vectors t, t + nthr, ... of its region into the ring.
  const uint4* own = p.stream + p.stream_offset + size_t(cta) * p.own_vecs;
  for (int i = tid; i < p.own_vecs; i += nthr) cp_async16(ring + i, own + i);
  asm volatile("cp.async.commit_group;" ::: "memory");
  __syncthreads();
  const unsigned long long t1 = now_ns();
  // The broadcast read: all loads out, then used.
  const uint4* src = p.bcast + size_t(cta % p.replicas) * p.bcast_vecs;
  constexpr int kMax = 16;
  uint4 v[kMax];
#pragma unroll
  for (int j = 0; j < kMax; ++j) {
    const int i = tid + j * nthr;
    v[j] = i < p.bcast_vecs ? __ldcg(src + i) : make_uint4(0, 0, 0, 0);
  }
  unsigned x = 0;
#pragma unroll
  for (int j = 0; j < kMax; ++j) x ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  if (x == 0x9e3779b9u) p.sink[0] = x;  // keeps the loads; never true for the fill below
  __syncthreads();
  const unsigned long long t2 = now_ns();
  unsigned long long t3 = t2;
  if (tid == 0) {
    __threadfence();
    atomicAdd(&g_atomic_sink, 1u);
    t3 = now_ns();
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  const unsigned long long t4 = now_ns();
  if (tid == 0) {
    unsigned long long* o = p.out + size_t(cta) * 4;
    o[0] = t1 - t0;
    o[1] = t2 - t1;
    o[2] = t3 - t2;
    o[3] = t4 - t0;
  }
}

struct Config {
  int grid, bytes, replicas, own_bytes;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_l2_contention: a broadcast read by many CTAs, and a CTA's loads behind its own copies"};
  int launches = 12, threads = 192;
  app.add_option("--launches", launches, "timed launches per configuration (after 2 untimed)");
  app.add_option("--threads", threads, "threads per CTA (<= 256; a read of S bytes needs S / 16 <= 16 x threads)");
  CLI11_PARSE(app, argc, argv);
  if (threads < 32 || threads > 256 || threads % 32 != 0 || launches < 1 || launches + 2 > 4096) {
    std::fprintf(stderr, "bench_l2_contention: --threads a multiple of 32 in 32..256, --launches 1..4094\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const std::vector<Config> configs = {
      {1, 16384, 1, 0},      {64, 16384, 1, 0},     {192, 16384, 1, 0},    {256, 16384, 1, 0},
      {256, 1024, 1, 0},     {256, 32768, 1, 0},    {256, 16384, 4, 0},    {256, 16384, 16, 0},
      {256, 0, 1, 16384},    {256, 0, 1, 49152},    {256, 0, 1, 88064},    {256, 16384, 1, 16384},
      {256, 16384, 1, 49152}, {256, 16384, 1, 88064}, {256, 16384, 16, 88064}, {192, 16384, 1, 88064},
  };
  int max_smem = 0;
  CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  const int smem = std::min(max_smem, 88064);
  CHECK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const size_t stream_bytes = size_t(2) << 30;  // cold: each launch reads a region not read before
  uint4 *stream = nullptr, *bcast = nullptr;
  unsigned* sink = nullptr;
  unsigned long long* out = nullptr;
  CHECK(cudaMalloc(&stream, stream_bytes));
  CHECK(cudaMemset(stream, 0x5a, stream_bytes));
  CHECK(cudaMalloc(&bcast, size_t(16) * 32768));
  CHECK(cudaMemset(bcast, 0x11, size_t(16) * 32768));
  CHECK(cudaMalloc(&sink, 64));
  CHECK(cudaMalloc(&out, size_t(1024) * 4 * sizeof(unsigned long long)));
  std::printf("%s, %d SMs, %d threads per CTA, %d launches per row; us, median (p90)\n", prop.name,
              prop.multiProcessorCount, threads, launches);
  std::printf("%6s %8s %8s %8s | %15s %15s %15s %15s\n", "CTAs", "read B", "replicas", "own B", "issue", "read",
              "atomic", "landed");
  size_t offset = 0;
  for (const Config& c : configs) {
    if (c.own_bytes > smem || c.bytes / 16 > 16 * threads) continue;
    std::vector<unsigned> zero(4096, 0u);
    CHECK(cudaMemcpyToSymbol(g_start, zero.data(), zero.size() * sizeof(unsigned)));
    std::vector<double> part[4];
    for (int l = 0; l < launches + 2; ++l) {
      Probe p{bcast, c.bytes / 16, c.replicas, stream, 0, c.own_bytes / 16, l, out, sink};
      const size_t need = size_t(c.grid) * p.own_vecs;
      if ((offset + need) * 16 > stream_bytes) offset = 0;
      p.stream_offset = offset;
      offset += need;
      void* args[] = {&p};
      CHECK(cudaLaunchCooperativeKernel((const void*)probe_kernel, dim3(unsigned(c.grid)), dim3(unsigned(threads)),
                                        args, size_t(smem), nullptr));
      CHECK(cudaDeviceSynchronize());
      if (l < 2) continue;
      std::vector<unsigned long long> h(size_t(c.grid) * 4);
      CHECK(cudaMemcpy(h.data(), out, h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
      for (int i = 0; i < c.grid; ++i)
        for (int j = 0; j < 4; ++j) part[j].push_back(double(h[size_t(i) * 4 + j]) * 1e-3);
    }
    std::printf("%6d %8d %8d %8d |", c.grid, c.bytes, c.replicas, c.own_bytes);
    for (int j = 0; j < 4; ++j) std::printf(" %6.2f (%6.2f)", percentile(part[j], 0.5), percentile(part[j], 0.9));
    std::printf("\n");
  }
  cudaFree(stream);
  cudaFree(bcast);
  cudaFree(sink);
  cudaFree(out);
  return 0;
}
