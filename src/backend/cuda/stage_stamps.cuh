// In-kernel stage stamps for latency work (device code; include from .cu files only).
//
// A latency-bound kernel's time is a chain of stages (a wait, a round trip, a barrier); which one is
// long shows only from inside. In a measurement build (cmake -DMOESERVE_KERNEL_STAMPS=ON, never a
// release: every CTA prints a line), an instrumented kernel declares StageStamps<N>, marks its
// stages with mark(i) (thread 0's %globaltimer, ns) and calls print() once at its end:
//
//   KS <kernel> <cta> <a> <b> <c> <t_ref> <d_0> ... <d_11>
//
// with d_i = stamp i − the reference stamp (-1: the CTA did not reach stage i, or i >= N) and a, b, c three
// values the kernel chooses (e.g. its work item). bench/stage_stamps.py turns a run's lines into
// the medians per stage. In every other build StageStamps is empty and its calls compile to nothing,
// so the instrumented kernels are the same code.
#pragma once
#include <cstdio>

#ifndef MOESERVE_KERNEL_STAMPS
#define MOESERVE_KERNEL_STAMPS 0
#endif

namespace moeserve::cuda {

constexpr int kMaxStages = 12;

#if MOESERVE_KERNEL_STAMPS
template <int N>
struct StageStamps {
  static_assert(N >= 1 && N <= kMaxStages, "at most kMaxStages stages");
  unsigned long long t[N] = {};
  __device__ __forceinline__ void mark(int i) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    t[i] = now;
  }
  // Thread 0 prints the CTA's line, the stamps relative to stamp `ref` (kMaxStages fields; those
  // past N print -1).
  __device__ void print(const char* kernel, int ref, int a, int b, int c) const {
    if (threadIdx.x != 0) return;
    const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    long long d[kMaxStages];
#pragma unroll
    for (int i = 0; i < N; ++i) d[i] = t[i] ? (long long)(t[i] - t[ref]) : -1;
#pragma unroll
    for (int i = N; i < kMaxStages; ++i) d[i] = -1;
    printf("KS %s %u %d %d %d %llu %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld\n", kernel, cta, a, b,
           c, t[ref], d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11]);
  }
};
#else
template <int N>
struct StageStamps {
  __device__ __forceinline__ void mark(int) {}
  __device__ __forceinline__ void print(const char*, int, int, int, int) const {}
};
#endif

}  // namespace moeserve::cuda
