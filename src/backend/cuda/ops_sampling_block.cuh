// Block-wide building blocks of the sampling kernels (ops_sampling.cu): reductions and scans
// over one value per thread, the order-preserving float key, and a shared-memory bitonic sort.
// Every function is called by all threads of the block (it synchronises).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace moeserve::cuda::sampling {

constexpr float kNegInf = -__builtin_huge_valf();

// Larger float <-> larger key; -0 and +0 must be made equal by the caller (canonical()).
__device__ __forceinline__ uint32_t float_key(float x) {
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
__device__ __forceinline__ float canonical(float x) { return x == 0.0f ? 0.0f : x; }

// (value desc, id asc): the order of every "most likely first" list.
__device__ __forceinline__ bool ranks_before(float va, int32_t ia, float vb, int32_t ib) {
  return va > vb || (va == vb && ia < ib);
}

template <int kThreads>
struct BlockOps {
  static constexpr int kWarps = kThreads / 32;
  // Scratch shared by the helpers below (each call synchronises before and after use).
  struct Scratch {
    uint64_t u64[kWarps];
    uint64_t total;
    float f[kWarps];
    int32_t i[kWarps];
  };

  __device__ static uint64_t warp_inclusive_scan(uint64_t v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint64_t n = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += n;
    }
    return v;
  }

  // Exclusive prefix sum over the block (thread order); *total receives the sum.
  __device__ static uint64_t exclusive_scan(uint64_t v, Scratch& s, uint64_t* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint64_t inc = warp_inclusive_scan(v);
    __syncthreads();
    if (lane == 31) s.u64[warp] = inc;
    __syncthreads();
    if (warp == 0) {
      const uint64_t t = lane < kWarps ? s.u64[lane] : 0;
      const uint64_t ti = warp_inclusive_scan(t);
      __syncwarp();
      if (lane < kWarps) s.u64[lane] = ti - t;  // exclusive offset of each warp
      if (lane == kWarps - 1) s.total = ti;
    }
    __syncthreads();
    const uint64_t r = s.u64[warp] + inc - v;
    *total = s.total;
    __syncthreads();
    return r;
  }

  __device__ static uint64_t sum(uint64_t v, Scratch& s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s.u64[threadIdx.x >> 5] = v;
    __syncthreads();
    uint64_t t = 0;
    for (int w = 0; w < kWarps; ++w) t += s.u64[w];
    __syncthreads();
    return t;
  }

  __device__ static uint64_t min(uint64_t v, Scratch& s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const uint64_t other = __shfl_xor_sync(0xffffffffu, v, o);
      v = other < v ? other : v;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s.u64[threadIdx.x >> 5] = v;
    __syncthreads();
    uint64_t m = s.u64[0];
    for (int w = 1; w < kWarps; ++w) m = s.u64[w] < m ? s.u64[w] : m;
    __syncthreads();
    return m;
  }

  // The (value, id) that ranks first (value desc, id asc), to every thread.
  __device__ static void best(float& v, int32_t& id, Scratch& s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
      if (ranks_before(ov, oi, v, id)) {
        v = ov;
        id = oi;
      }
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
      s.f[threadIdx.x >> 5] = v;
      s.i[threadIdx.x >> 5] = id;
    }
    __syncthreads();
    v = s.f[0];
    id = s.i[0];
    for (int w = 1; w < kWarps; ++w)
      if (ranks_before(s.f[w], s.i[w], v, id)) {
        v = s.f[w];
        id = s.i[w];
      }
    __syncthreads();
  }

  // Ascending bitonic sort of keys[0, n), n a power of two.
  __device__ static void bitonic_sort(uint64_t* keys, int n) {
    for (int k = 2; k <= n; k <<= 1) {
      for (int j = k >> 1; j > 0; j >>= 1) {
        for (int i = threadIdx.x; i < n; i += kThreads) {
          const int ixj = i ^ j;
          if (ixj > i) {
            const uint64_t a = keys[i], b = keys[ixj];
            const bool ascending = (i & k) == 0;
            if ((a > b) == ascending) {
              keys[i] = b;
              keys[ixj] = a;
            }
          }
        }
        __syncthreads();
      }
    }
  }
};

}  // namespace moeserve::cuda::sampling
