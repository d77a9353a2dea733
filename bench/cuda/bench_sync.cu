// What a wait between CTAs costs on this GPU: the latency floor under the fused one-token expert
// kernel's tail (ops_moe_int_stream.cu), whose act blocks meet at counters in global memory (4 CTAs
// per block, then the whole grid). Each kernel runs `rounds` back-to-back barriers; the time per
// barrier is the kernel's time (events around `launches` launches) over launches x rounds.
//
//   bench_sync [--rounds 200] [--launches 20] [--threads 192] [--grid 256]
//
// Barriers measured (every CTA: __syncthreads, then thread 0 arrives and waits, then __syncthreads):
//   grid  : a grid-wide count in global memory (thread 0 arrives, then polls with ld.acquire.gpu
//           until the count reaches round x grid), as the fused kernel's wait; three ways to
//           arrive: __threadfence + atomicAdd (the kernels' pattern), atom.add.release.gpu,
//           red.release.gpu.add;
//   group4: the same within groups of 4 consecutive CTAs (an act block's 4 gate/up CTAs);
//   cluster4: barrier.cluster arrive.release / wait.acquire in clusters of 4 CTAs (sm_90+: the
//           hardware barrier of a thread block cluster), plus one float per CTA written into CTA
//           0's shared memory (distributed shared memory) and read back after the barrier;
//   l2 load: one thread's dependent __ldcg chain over 4 KB (each load's address from the last),
//           the L2 round trip that each polling step and each published value costs.
// And whether a launch may be cooperative and clustered at once (cudaLaunchKernelEx with both
// attributes): the fused kernel's grid-wide wait needs the cooperative guarantee, a cluster
// exchange the cluster one.
// Roofline: none (latency): the numbers bound how short a chain of such waits can be.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <string>

#include "cuda_bench_check.h"

namespace {

// [0], [1]: the grid's count and its finished CTAs; [2 + 2g], [3 + 2g]: group g's. Zero between
// launches: the last CTA to finish sets its pair back.
__device__ unsigned g_count[1024];

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// How thread 0 arrives: kFenceAtomic __threadfence() then atomicAdd (the kernels' pattern today);
// kAtomRelease one atom.add.release.gpu; kRedRelease red.release.gpu.add (no value returned).
enum Arrive { kFenceAtomic = 0, kAtomRelease = 1, kRedRelease = 2 };

// Thread 0 arrives at *count and waits until it reaches target; the CTA waits for thread 0.
template <int kArrive>
__device__ __forceinline__ void counter_barrier(unsigned* count, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if constexpr (kArrive == kFenceAtomic) {
      __threadfence();
      atomicAdd(count, 1u);
    } else if constexpr (kArrive == kAtomRelease) {
      unsigned old;
      asm volatile("atom.add.release.gpu.global.u32 %0, [%1], 1;" : "=r"(old) : "l"(count) : "memory");
    } else {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
    }
    while (ld_acquire(count) < target) {
    }
  }
  __syncthreads();
}

// After its last barrier: the n-th CTA to finish zeroes the pair (count, finished).
__device__ __forceinline__ void finish(unsigned* pair, unsigned n) {
  if (threadIdx.x == 0 && atomicAdd(&pair[1], 1u) == n - 1) {
    atomicExch(&pair[0], 0u);
    atomicExch(&pair[1], 0u);
  }
}

template <int kArrive>
__global__ void grid_barrier_kernel(int rounds) {
  const unsigned G = gridDim.x;
  for (int r = 1; r <= rounds; ++r) counter_barrier<kArrive>(&g_count[0], unsigned(r) * G);
  finish(&g_count[0], G);
}

template <int kArrive>
__global__ void group4_barrier_kernel(int rounds) {
  unsigned* pair = &g_count[2 + 2 * (blockIdx.x / 4)];
  for (int r = 1; r <= rounds; ++r) counter_barrier<kArrive>(pair, unsigned(r) * 4u);
  finish(pair, 4u);
}

__global__ void cluster4_barrier_kernel(int rounds, float* sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ float slot[4];
  unsigned rank = 0;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(&slot[rank]));
  unsigned remote = 0;  // slot[rank] in CTA 0's shared memory
  asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(remote) : "r"(local));
  float acc = 0.0f;
  for (int r = 1; r <= rounds; ++r) {
    if (threadIdx.x == 0) asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(float(r + rank)));
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    if (rank == 0 && threadIdx.x < 4) acc += slot[threadIdx.x];
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  }
  if (acc == -1.0f) *sink = acc;  // never: keeps the reads
#else
  if (rounds < 0) *sink = 0.0f;
#endif
}

__global__ void l2_chain_kernel(const unsigned* next, int steps, unsigned* sink) {
  unsigned i = 0;
  for (int s = 0; s < steps; ++s) i = __ldcg(next + i);
  *sink = i;
}

// ms for `launches` launches of launch().
template <class Launch>
float time_launches(int launches, Launch launch) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  launch();  // warm-up
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaEventRecord(a));
  for (int i = 0; i < launches; ++i) launch();
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms = 0.0f;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms;
}

cudaError_t launch_ex(const void* kernel, int grid, int threads, bool cooperative, int cluster, void** args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(grid));
  cfg.blockDim = dim3(unsigned(threads));
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (cooperative) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n].val.cooperative = 1;
    ++n;
  }
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = unsigned(cluster);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = unsigned(n);
  return cudaLaunchKernelExC(&cfg, kernel, args);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_sync: the cost of a barrier between CTAs (global counters, clusters) and an L2 round trip"};
  int rounds = 200, launches = 20, threads = 192, grid = 256;
  app.add_option("--rounds", rounds, "barriers per launch");
  app.add_option("--launches", launches, "timed launches");
  app.add_option("--threads", threads, "threads per CTA");
  app.add_option("--grid", grid, "CTAs (a multiple of 4; all resident: cooperative launches)");
  CLI11_PARSE(app, argc, argv);
  if (grid % 4 != 0 || 2 + 2 * (grid / 4) > 1024 || rounds < 1 || launches < 1) {
    std::fprintf(stderr, "bench_sync: --grid must be a multiple of 4 (<= 2044), --rounds and --launches >= 1\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs; grid %d x %d threads, %d barriers per launch, %d launches\n", prop.name,
              prop.multiProcessorCount, grid, threads, rounds, launches);
  const double per = 1e3 / (double(launches) * rounds);  // ms -> us per barrier

  void* args_rounds[] = {&rounds};
  auto coop = [&](const void* k) {
    return time_launches(launches, [&] { CHECK(launch_ex(k, grid, threads, true, 1, args_rounds)); });
  };
  const float t_empty = [&] {
    int zero = 0;
    void* a[] = {&zero};
    return time_launches(launches, [&] {
      CHECK(launch_ex((const void*)grid_barrier_kernel<kFenceAtomic>, grid, threads, true, 1, a));
    });
  }();
  std::printf("launch with no barrier: %.2f us per launch (subtracted below)\n", 1e3 * t_empty / launches);
  const void* grids[] = {(const void*)grid_barrier_kernel<kFenceAtomic>, (const void*)grid_barrier_kernel<kAtomRelease>,
                         (const void*)grid_barrier_kernel<kRedRelease>};
  const void* groups[] = {(const void*)group4_barrier_kernel<kFenceAtomic>,
                          (const void*)group4_barrier_kernel<kAtomRelease>,
                          (const void*)group4_barrier_kernel<kRedRelease>};
  const char* arrive_names[] = {"__threadfence + atomicAdd", "atom.add.release.gpu", "red.release.gpu.add"};
  for (int v = 0; v < 3; ++v) {
    const float t_grid = coop(grids[v]), t_group = coop(groups[v]);
    std::printf("arrive by %-26s grid barrier (%d CTAs) %.3f us, group of 4 %.3f us\n", arrive_names[v], grid,
                (t_grid - t_empty) * per, (t_group - t_empty) * per);
  }

  float* sink = nullptr;
  CHECK(cudaMalloc(&sink, 4096 * sizeof(unsigned)));
  void* args_cluster[] = {&rounds, &sink};
  cudaError_t e = launch_ex((const void*)cluster4_barrier_kernel, grid, threads, false, 4, args_cluster);
  if (e == cudaSuccess && (e = cudaDeviceSynchronize()) == cudaSuccess) {
    int zero = 0;
    void* args_zero[] = {&zero, &sink};
    const float t0 = time_launches(launches, [&] {
      CHECK(launch_ex((const void*)cluster4_barrier_kernel, grid, threads, false, 4, args_zero));
    });
    const float t1 = time_launches(launches, [&] {
      CHECK(launch_ex((const void*)cluster4_barrier_kernel, grid, threads, false, 4, args_cluster));
    });
    // Two cluster barriers per round (publish, then the slot's reuse).
    std::printf("cluster-of-4 barrier (barrier.cluster, + a DSMEM store): %.3f us\n", (t1 - t0) * per / 2);
  } else {
    std::printf("cluster-of-4 launch failed: %s\n", cudaGetErrorString(e));
    cudaGetLastError();
  }
  e = launch_ex((const void*)cluster4_barrier_kernel, grid, threads, true, 4, args_cluster);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  std::printf("cooperative + clusters of 4 in one launch: %s\n",
              e == cudaSuccess ? "accepted" : cudaGetErrorString(e));
  cudaGetLastError();

  // A dependent L2 chain: 1,024 words, next[i] = (i + 97) % 1024 (stride past a 128-byte line).
  constexpr int kWords = 1024, kSteps = 2000;
  unsigned host[kWords];
  for (int i = 0; i < kWords; ++i) host[i] = unsigned((i + 97) % kWords);
  unsigned* next = nullptr;
  CHECK(cudaMalloc(&next, sizeof(host)));
  CHECK(cudaMemcpy(next, host, sizeof(host), cudaMemcpyHostToDevice));
  const float t_chain = time_launches(launches, [&] {
    l2_chain_kernel<<<1, 1>>>(next, kSteps, reinterpret_cast<unsigned*>(sink));
  });
  const float t_chain0 = time_launches(launches, [&] {
    l2_chain_kernel<<<1, 1>>>(next, 0, reinterpret_cast<unsigned*>(sink));
  });
  std::printf("L2 round trip (dependent __ldcg chain): %.3f us\n",
              (t_chain - t_chain0) * 1e3 / (double(launches) * kSteps));
  cudaFree(next);
  cudaFree(sink);
  return 0;
}
