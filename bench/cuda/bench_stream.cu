// Streaming-read bandwidth by load style and size: what one launch that reads S bytes of
// weights (read once, as a decode step reads each layer's) can reach, inside a CUDA graph of
// back-to-back programmatic dependent launches (the decode step's chain).
//
//   bench_stream [--sizes-mb 1.6,3.2,8,12.6,25,50,64,128,765] [--launches 20] [--reps 5]
//   bench_stream --sizes-mb 13,26 --only ld128     (contiguous ld128 against the banded expert pattern)
//
// Each launch reads a different window of a 2 GB buffer (rotating, so nothing stays in the
// 50 MB L2) and folds every word into an xor that is stored only if it equals a magic value
// (so the loads cannot be dropped). Load styles, each with a few depths (bytes in flight per
// warp = the depth x the bytes one warp instruction moves):
//   ld32  : lane loads 4 bytes (a warp instruction = one 128-byte line), U per lane in flight;
//   ld128 : lane loads 16 bytes (a warp instruction = 512 bytes), U per lane in flight;
//   cpasync: 16-byte cp.async.cg per lane into a per-warp shared-memory ring of D x 512 B
//            stages (cp.async.wait_group), read back from shared memory;
//   bulk  : one lane per warp issues 1-D bulk copies (cp.async.bulk, sm_90+) of B bytes into a
//           per-warp ring of D stages completing on mbarriers;
//   band  : ld128 in the GPTQ expert kernels' order (128-byte column bands down rows of R bytes).
// The grid is persistent (resident CTAs x SMs), 256 threads per CTA, a warp walks its own
// contiguous share of the window. Time per launch = graph time / launches.
// Roofline: S bytes / the copy bandwidth (measured here too: cudaMemcpy device to device,
// read + write, and reported as read bandwidth equivalent 2·bytes / time).
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_bench_check.h"

namespace {

constexpr int kThreads = 256;
constexpr uint32_t kMagic = 0x9E3779B9u;

__device__ __forceinline__ void gdc_launch() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void gdc_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ uint32_t ld32(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.b32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ld128(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.b32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The warp's share of the window: [begin, end) in units of `unit` bytes.
__device__ __forceinline__ void warp_share(size_t units, size_t& begin, size_t& end) {
  const size_t warps = size_t(gridDim.x) * (kThreads / 32);
  const size_t w = size_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  begin = units * w / warps;
  end = units * (w + 1) / warps;
}

__device__ __forceinline__ void finish(uint32_t acc, uint32_t* out) {
  gdc_wait();
  if (acc == kMagic) out[blockIdx.x * kThreads + threadIdx.x] = acc;
}

template <int U>
__global__ void __launch_bounds__(kThreads) read_ld32(const uint8_t* __restrict__ base, size_t bytes, uint32_t* out) {
  gdc_launch();
  const int lane = threadIdx.x & 31;
  size_t b, e;
  warp_share(bytes / (128 * U), b, e);  // units of U lines
  uint32_t acc = 0;
  for (size_t u = b; u < e; ++u) {
    uint32_t v[U];
    const uint8_t* p = base + u * 128 * U + 4 * lane;
#pragma unroll
    for (int i = 0; i < U; ++i) v[i] = ld32(p + 128 * i);
#pragma unroll
    for (int i = 0; i < U; ++i) acc ^= v[i];
  }
  finish(acc, out);
}

template <int U>
__global__ void __launch_bounds__(kThreads) read_ld128(const uint8_t* __restrict__ base, size_t bytes, uint32_t* out) {
  gdc_launch();
  const int lane = threadIdx.x & 31;
  size_t b, e;
  warp_share(bytes / (512 * U), b, e);
  uint32_t acc = 0;
  for (size_t u = b; u < e; ++u) {
    uint4 v[U];
    const uint8_t* p = base + u * 512 * U + 16 * lane;
#pragma unroll
    for (int i = 0; i < U; ++i) v[i] = ld128(p + 512 * i);
#pragma unroll
    for (int i = 0; i < U; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  }
  finish(acc, out);
}

// ld128 over a "banded" window, the access pattern of the GPTQ expert kernels (qweight [K/8][N] i32: a
// CTA reads one 128-byte band of columns down all K/8 rows): the window is rows of R bytes (R = 4·N:
// 4,096 for the 122B gate/up, 12,288 for down), each row 32·R/4096 bands of 128 bytes; the linear
// offset a warp walks is band-major (band, row, byte), so consecutive 512-byte warp loads are 4 rows
// of one band, R bytes apart. Same bytes as ld128, another order.
template <int U, int R>
__global__ void __launch_bounds__(kThreads) read_ld128_band(const uint8_t* __restrict__ base, size_t bytes,
                                                            uint32_t* out) {
  gdc_launch();
  const int lane = threadIdx.x & 31;
  size_t b, e;
  warp_share(bytes / (512 * U), b, e);
  const size_t rows = bytes / R, band_bytes = rows * 128;
  uint32_t acc = 0;
  for (size_t u = b; u < e; ++u) {
    uint4 v[U];
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const size_t lin = u * 512 * U + 512 * size_t(i) + 16 * lane;
      const size_t band = lin / band_bytes, rem = lin - band * band_bytes;
      v[i] = ld128(base + (rem / 128) * R + band * 128 + rem % 128);
    }
#pragma unroll
    for (int i = 0; i < U; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  }
  finish(acc, out);
}

// Per-warp ring of D stages of 512 B: lane L copies bytes [16L, 16L + 16) of each stage.
template <int D>
__global__ void __launch_bounds__(kThreads) read_cpasync(const uint8_t* __restrict__ base, size_t bytes,
                                                         uint32_t* out) {
  gdc_launch();
  extern __shared__ uint4 smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint4* ring = smem + size_t(warp) * D * 32;
  size_t b, e;
  warp_share(bytes / 512, b, e);
  auto issue = [&](size_t u, int slot) {
    const uint32_t dst = uint32_t(__cvta_generic_to_shared(ring + slot * 32 + lane));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(base + u * 512 + 16 * lane) : "memory");
  };
  for (int d = 0; d < D; ++d) {
    if (b + d < e) issue(b + d, d);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  uint32_t acc = 0;
  int slot = 0;
  for (size_t u = b; u < e; ++u) {
    asm volatile("cp.async.wait_group %0;" ::"n"(D - 1) : "memory");
    __syncwarp();
    // Each lane reads a different lane's word (as a GEMV lane reads another lane's bytes).
    const uint4 v = ring[slot * 32 + ((lane + 1) & 31)];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
    __syncwarp();
    if (u + D < e) issue(u + D, slot);
    asm volatile("cp.async.commit_group;" ::: "memory");
    slot = slot + 1 == D ? 0 : slot + 1;
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  finish(acc, out);
}

// Per-warp ring of D stages of B bytes filled by 1-D bulk copies issued by lane 0.
template <int D, int B>
__global__ void __launch_bounds__(kThreads) read_bulk(const uint8_t* __restrict__ base, size_t bytes, uint32_t* out) {
#if __CUDA_ARCH__ >= 900
  gdc_launch();
  extern __shared__ uint4 smem[];
  __shared__ uint64_t bar[kThreads / 32][D];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint4* ring = smem + size_t(warp) * D * (B / 16);
  size_t b, e;
  warp_share(bytes / B, b, e);
  if (lane == 0)
    for (int d = 0; d < D; ++d)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(uint32_t(__cvta_generic_to_shared(&bar[warp][d]))));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncwarp();
  auto issue = [&](size_t u, int slot) {
    const uint32_t mb = uint32_t(__cvta_generic_to_shared(&bar[warp][slot]));
    const uint32_t dst = uint32_t(__cvta_generic_to_shared(ring + slot * (B / 16)));
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mb), "n"(B) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(base + u * B), "n"(B), "r"(mb)
                 : "memory");
  };
  if (lane == 0)
    for (int d = 0; d < D; ++d)
      if (b + d < e) issue(b + d, d);
  uint32_t acc = 0;
  int slot = 0;
  uint32_t phase = 0;
  for (size_t u = b; u < e; ++u) {
    const uint32_t mb = uint32_t(__cvta_generic_to_shared(&bar[warp][slot]));
    uint32_t done = 0;
    while (!done)
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
          : "=r"(done)
          : "r"(mb), "r"(phase)
          : "memory");
#pragma unroll
    for (int i = 0; i < B / 512; ++i) {
      const uint4 v = ring[slot * (B / 16) + i * 32 + lane];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    __syncwarp();
    if (lane == 0 && u + D < e) issue(u + D, slot);
    if (++slot == D) slot = 0, phase ^= 1;
  }
  finish(acc, out);
#endif
}

struct Variant {
  std::string name;
  const void* fn;
  size_t smem;
  size_t unit;  // bytes per warp work unit (the window is rounded down to a multiple)
};

template <typename K>
Variant make(std::string name, K* fn, size_t smem, size_t unit) {
  return Variant{std::move(name), reinterpret_cast<const void*>(fn), smem, unit};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"streaming-read bandwidth by load style and size"};
  std::string sizes_s = "1.6,3.2,8,12.6,25,38,64,128,765";
  int launches = 20, reps = 5;
  bool pdl = true;
  std::string ctas_s = "0,3";
  app.add_option("--sizes-mb", sizes_s, "window sizes in MB (1e6 bytes)");
  app.add_option("--launches", launches, "launches per graph");
  app.add_option("--reps", reps, "graph replays (median)");
  app.add_option("--pdl", pdl, "programmatic dependent launches");
  app.add_option("--ctas", ctas_s, "CTAs per SM to run, comma-separated (0 = as many as fit)");
  std::string only;
  app.add_option("--only", only, "run only the variants whose name contains this substring");
  CLI11_PARSE(app, argc, argv);
  std::vector<double> sizes;
  for (size_t p = 0; p < sizes_s.size();) {
    size_t q = sizes_s.find(',', p);
    if (q == std::string::npos) q = sizes_s.size();
    sizes.push_back(std::stod(sizes_s.substr(p, q - p)));
    p = q + 1;
  }
  std::vector<int> ctas;
  for (size_t p = 0; p < ctas_s.size();) {
    size_t q = ctas_s.find(',', p);
    if (q == std::string::npos) q = ctas_s.size();
    ctas.push_back(std::stoi(ctas_s.substr(p, q - p)));
    p = q + 1;
  }
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const size_t pool = size_t(2) << 30;
  uint8_t* buf = nullptr;
  uint32_t* out = nullptr;
  CHECK(cudaMalloc(&buf, pool));
  CHECK(cudaMemset(buf, 1, pool));
  CHECK(cudaMalloc(&out, size_t(4096) * kThreads * 4));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));

  // Copy bandwidth: 512 MB device to device.
  {
    const size_t n = size_t(512) << 20;
    float best = 1e30f;
    for (int r = 0; r < 5; ++r) {
      CHECK(cudaEventRecord(e0, s));
      CHECK(cudaMemcpyAsync(buf + n, buf, n, cudaMemcpyDeviceToDevice, s));
      CHECK(cudaEventRecord(e1, s));
      CHECK(cudaEventSynchronize(e1));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      best = std::min(best, ms);
    }
    std::printf("copy bandwidth (read + write): %.1f GB/s\n", 2.0 * double(n) / (best * 1e6));
  }

  std::vector<Variant> vs = {
      make("ld32 U8", read_ld32<8>, 0, 128 * 8),          make("ld32 U16", read_ld32<16>, 0, 128 * 16),
      make("ld32 U32", read_ld32<32>, 0, 128 * 32),       make("ld128 U2", read_ld128<2>, 0, 512 * 2),
      make("ld128 U4", read_ld128<4>, 0, 512 * 4),        make("ld128 U8", read_ld128<8>, 0, 512 * 8),
      make("cpasync D4", read_cpasync<4>, 8 * 4 * 512, 512),
      make("cpasync D8", read_cpasync<8>, 8 * 8 * 512, 512),
      make("cpasync D16", read_cpasync<16>, 8 * 16 * 512, 512),
      make("bulk D4 x2KB", read_bulk<4, 2048>, 8 * 4 * 2048, 2048),
      make("bulk D8 x1KB", read_bulk<8, 1024>, 8 * 8 * 1024, 1024),
      make("bulk D4 x4KB", read_bulk<4, 4096>, 8 * 4 * 4096, 4096),
      make("bulk D2 x8KB", read_bulk<2, 8192>, 8 * 2 * 8192, 8192),
      make("band4K U4", read_ld128_band<4, 4096>, 0, 4096 * 16),
      make("band4K U8", read_ld128_band<8, 4096>, 0, 4096 * 32),
      make("band12K U4", read_ld128_band<4, 12288>, 0, 12288 * 16),
      make("band12K U8", read_ld128_band<8, 12288>, 0, 12288 * 32),
  };
  if (!only.empty())
    vs.erase(std::remove_if(vs.begin(), vs.end(), [&](const Variant& v) { return v.name.find(only) == std::string::npos; }),
             vs.end());
  std::printf("%-14s %6s", "variant", "CTA/SM");
  for (double mb : sizes) std::printf(" %8.1fMB", mb);
  std::printf("   (us per launch / GB/s)\n");
  for (int cap : ctas)
  for (auto& v : vs) {
    if (v.smem > 48 * 1024)
      CHECK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(v.smem)));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v.fn, kThreads, v.smem));
    if (cap > 0) {
      if (cap > per_sm) continue;
      per_sm = cap;
    }
    const int grid = per_sm * sms;
    std::printf("%-14s %6d", v.name.c_str(), per_sm);
    std::vector<std::string> gbs;
    for (double mb : sizes) {
      const size_t bytes = size_t(mb * 1e6) / v.unit * v.unit;
      const size_t windows = pool / bytes;
      cudaGraph_t g;
      CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      for (int l = 0; l < launches; ++l) {
        const uint8_t* base = buf + (size_t(l) % windows) * bytes;
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(unsigned(grid));
        cfg.blockDim = dim3(kThreads);
        cfg.dynamicSmemBytes = v.smem;
        cfg.stream = s;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = pdl ? 1 : 0;
        void* args[] = {&base, const_cast<size_t*>(&bytes), &out};
        CHECK(cudaLaunchKernelExC(&cfg, v.fn, args));
      }
      CHECK(cudaStreamEndCapture(s, &g));
      cudaGraphExec_t ge;
      CHECK(cudaGraphInstantiate(&ge, g, 0));
      CHECK(cudaGraphLaunch(ge, s));  // warm-up
      std::vector<float> t;
      for (int r = 0; r < reps; ++r) {
        CHECK(cudaEventRecord(e0, s));
        CHECK(cudaGraphLaunch(ge, s));
        CHECK(cudaEventRecord(e1, s));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms);
      }
      std::sort(t.begin(), t.end());
      const double us = 1e3 * t[t.size() / 2] / launches;
      std::printf(" %10.2f", us);
      char b[32];
      std::snprintf(b, sizeof b, " %10.0f", double(bytes) / (us * 1e3));
      gbs.push_back(b);
      CHECK(cudaGraphExecDestroy(ge));
      CHECK(cudaGraphDestroy(g));
    }
    std::printf("\n%-14s %6s", "", "GB/s");
    for (auto& x : gbs) std::printf("%s", x.c_str());
    std::printf("\n");
  }
  CHECK(cudaGetLastError());
  return 0;
}
