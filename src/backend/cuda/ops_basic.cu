// Kernels declared in ops_basic.h.
//
// Layout: every operand is row-major, row m of width H (or I) starting at m·H; activations f32
// (or bf16 for the bf16 entry points), the embedding table bf16 [V, H], norm weights f32 [H].
//
// Parallelisation. At decode (M = 1..64 rows of H = 2048..3072) these kernels move a few KB to
// ~1.5 MB, so their time is launch latency plus the number of DEPENDENT memory round trips.
// Every kernel therefore issues all its loads before its first store (no loop whose loads
// must wait for the previous iteration's store because the pointers might alias):
//   - element-wise ops (embedding, SwiGLU, gather, shared-expert scaled add): a flat grid of
//     256-thread blocks over all M rows, one 16-byte chunk per thread (float4, or 8 bf16);
//     a scalar path with the same per-element arithmetic takes rows that are not 16-byte
//     aligned. Results are bit-identical to one-element-per-thread code: the grid only decides
//     which thread computes an element, never how.
//   - add_rms_norm: one block per row, ceil(H/4) threads rounded up to a warp (at most 1024),
//     each owning 4-element chunks c = t, t + T, ... that it keeps in registers: one read of
//     the row and weight, one block reduction, one write. The plan (T, chunks per thread) is a
//     function of H alone, and the sum of squares runs in a fixed order (a thread's chunks in
//     order, x..w within a chunk, then a fixed warp/block tree), so a row's result never
//     depends on M or on its neighbours (batch invariance).
//   - argmax: one 1024-thread block per row (a sampling-free fallback, not on the decode path).
// add_rms_norm launches with programmatic dependent launch (pdl.cuh) up to kPdlMaxRows rows: its
// CTAs become resident while the previous kernel (a projection adding into the residual) still
// runs, and wait for it before the first load.
// Roofline: bytes read + written (stated per kernel) over the copy bandwidth.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/act_types.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/ops_basic.h"
#include "core/error.h"

namespace moeserve::cuda {
namespace {

constexpr int kFlatThreads = 256;
constexpr int kPdlMaxRows = 256;  // per-row launches up to this many rows use PDL (pdl.cuh)

bool aligned(const void* p, uintptr_t bytes) { return p == nullptr || (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

unsigned flat_blocks(size_t items) { return unsigned((items + kFlatThreads - 1) / kFlatThreads); }

__device__ __forceinline__ size_t flat_index() { return size_t(blockIdx.x) * blockDim.x + threadIdx.x; }

// Sum over the block: warp shuffle tree, then warp 0 sums the per-warp totals with the same
// tree. Fixed order for a given blockDim.
__device__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) >> 5;
  v = (threadIdx.x < nwarps) ? warp_sums[threadIdx.x] : 0.0f;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __shared__ float total;
  if (threadIdx.x == 0) total = v;
  __syncthreads();
  const float r = total;
  __syncthreads();  // warp_sums/total reusable by a second call
  return r;
}

// 8 bf16 <-> two float4 through a 16-byte word.
__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[8]) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    f[2 * j] = __low2float(p[j]);
    f[2 * j + 1] = __high2float(p[j]);
  }
}
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  uint4 raw;
  __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    p[j].x = __float2bfloat16(f[2 * j]);
    p[j].y = __float2bfloat16(f[2 * j + 1]);
  }
  return raw;
}

__device__ __forceinline__ float silu_mul_value(float g, float u) { return g / (1.0f + __expf(-g)) * u; }
__device__ __forceinline__ float sigmoid_scale(const float* gate_logit, size_t m) {
  return gate_logit ? 1.0f / (1.0f + __expf(-gate_logit[m])) : 1.0f;
}

// ---- embedding: out[m, :] = float(table[ids[m], :]). Roofline: M·H·(2 + 4) bytes. ----
__global__ void embedding_vec_kernel(const int32_t* ids, const bf16* table, int H, size_t chunks, float* out) {
  const size_t c = flat_index();
  if (c >= chunks) return;
  const int per_row = H / 8;
  const size_t m = c / size_t(per_row), j = c % size_t(per_row);
  const uint4 raw = *reinterpret_cast<const uint4*>(table + size_t(ids[m]) * H + j * 8);
  float f[8];
  unpack8(raw, f);
  float4* o = reinterpret_cast<float4*>(out + m * H + j * 8);
  o[0] = make_float4(f[0], f[1], f[2], f[3]);
  o[1] = make_float4(f[4], f[5], f[6], f[7]);
}

__global__ void embedding_scalar_kernel(const int32_t* ids, const bf16* table, int H, size_t n, float* out) {
  const size_t e = flat_index();
  if (e >= n) return;
  const size_t m = e / size_t(H), i = e % size_t(H);
  out[e] = __bfloat162float(table[size_t(ids[m]) * H + i]);
}

// ---- add_rms_norm. Roofline: M·H·4 (residual read) [+ M·H·8: delta read, residual write]
// + M·H·4 (out_f32 write) [+ M·H·2: bf16 out write] + H·4 (weight) bytes.
// Chunk c of a row covers elements 4c .. 4c+3; chunks past the row (and elements past H in
// the last chunk) read as zero and are never stored. ----
struct NormPlan {
  int threads;     // T: a multiple of 32, at most 1024
  int per_thread;  // chunks per thread
};

NormPlan norm_plan(int H) {
  const int chunks = (H + 3) / 4;
  const int threads = std::min(1024, (chunks + 31) / 32 * 32);
  return {threads, (chunks + threads - 1) / threads};
}

__device__ __forceinline__ float4 load_chunk(const float* row, int c, int H, bool vec) {
  const int i = 4 * c;
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (vec) {  // H % 4 == 0: a chunk is all in or all out
    if (i < H) v = *reinterpret_cast<const float4*>(row + i);
    return v;
  }
  if (i < H) v.x = row[i];
  if (i + 1 < H) v.y = row[i + 1];
  if (i + 2 < H) v.z = row[i + 2];
  if (i + 3 < H) v.w = row[i + 3];
  return v;
}

__device__ __forceinline__ void store_chunk(float* row, int c, int H, bool vec, float4 v) {
  const int i = 4 * c;
  if (vec) {
    if (i < H) *reinterpret_cast<float4*>(row + i) = v;
    return;
  }
  if (i < H) row[i] = v.x;
  if (i + 1 < H) row[i + 1] = v.y;
  if (i + 2 < H) row[i + 2] = v.z;
  if (i + 3 < H) row[i + 3] = v.w;
}

__device__ __forceinline__ void store_chunk_bf16(bf16* row, int c, int H, bool vec, float4 v) {
  const int i = 4 * c;
  if (vec) {  // 8 bytes: the row base is 8-byte aligned and H % 4 == 0
    if (i < H) {
      uint2 raw;
      __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&raw);
      p[0].x = __float2bfloat16(v.x);
      p[0].y = __float2bfloat16(v.y);
      p[1].x = __float2bfloat16(v.z);
      p[1].y = __float2bfloat16(v.w);
      *reinterpret_cast<uint2*>(row + i) = raw;
    }
    return;
  }
  if (i < H) row[i] = __float2bfloat16(v.x);
  if (i + 1 < H) row[i + 1] = __float2bfloat16(v.y);
  if (i + 2 < H) row[i + 2] = __float2bfloat16(v.z);
  if (i + 3 < H) row[i + 3] = __float2bfloat16(v.w);
}

__device__ __forceinline__ float sum_squares(float ss, float4 v) {
  ss += v.x * v.x;
  ss += v.y * v.y;
  ss += v.z * v.z;
  ss += v.w * v.w;
  return ss;
}

__device__ __forceinline__ float4 norm_chunk(float4 v, float inv, float4 w) {
  return make_float4(v.x * inv * (1.0f + w.x), v.y * inv * (1.0f + w.y), v.z * inv * (1.0f + w.z),
                     v.w * inv * (1.0f + w.w));
}

// The gated add (GatedAdd): sigmoid of the row's gate logit exactly as the MoE combine computes the
// shared expert's scale (ops_moe.cu shared_scale), then one fmaf per element.
__device__ __forceinline__ float gated_scale(const GatedAdd& g, size_t m) {
  return 1.0f / (1.0f + __expf(-g.gate_logit[m]));
}
__device__ __forceinline__ float4 gated_add(float4 v, float s, float4 g) {
  return make_float4(fmaf(s, g.x, v.x), fmaf(s, g.y, v.y), fmaf(s, g.z, v.z), fmaf(s, g.w, v.w));
}

// kPer chunks per thread held in registers (the host picks kPer >= the plan's per_thread;
// extra chunks are past the row: zeros that leave the sum unchanged).
template <int kPer>
__global__ void __launch_bounds__(1024) add_rms_norm_kernel(float* residual, const float* delta, GatedAdd gated,
                                                            const float* w, int H, float eps, bool vec, bf16* out,
                                                            float* out_f32) {
  pdl_launch_dependents();
  pdl_wait();
  const size_t m = blockIdx.x;
  const int T = blockDim.x;
  float* r = residual + m * H;
  float4 v[kPer], wv[kPer];
  // All loads first (residual, delta, weight), then the residual update.
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    v[j] = load_chunk(r, threadIdx.x + j * T, H, vec);
    wv[j] = load_chunk(w, threadIdx.x + j * T, H, vec);
  }
  if (delta) {
    const float* d = delta + m * H;
    float4 dv[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) dv[j] = load_chunk(d, threadIdx.x + j * T, H, vec);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      v[j].x += dv[j].x;
      v[j].y += dv[j].y;
      v[j].z += dv[j].z;
      v[j].w += dv[j].w;
      if (!gated.values) store_chunk(r, threadIdx.x + j * T, H, vec, v[j]);
    }
  }
  if (gated.values) {
    const float* g = gated.values + m * H;
    const float sg = gated_scale(gated, m);
    float4 gv[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) gv[j] = load_chunk(g, threadIdx.x + j * T, H, vec);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      v[j] = gated_add(v[j], sg, gv[j]);
      store_chunk(r, threadIdx.x + j * T, H, vec, v[j]);
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) ss = sum_squares(ss, v[j]);
  const float inv = rsqrtf(block_sum(ss) / float(H) + eps);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const float4 y = norm_chunk(v[j], inv, wv[j]);
    if (out) store_chunk_bf16(out + m * H, threadIdx.x + j * T, H, vec, y);
    if (out_f32) store_chunk(out_f32 + m * H, threadIdx.x + j * T, H, vec, y);
  }
}

// Rows too wide for the register version (more than 4 chunks per thread, H > 16384): the same
// chunks and sum order, with a second read of the row instead of registers.
__global__ void __launch_bounds__(1024) add_rms_norm_wide_kernel(float* residual, const float* delta, GatedAdd gated,
                                                                 const float* w, int H, int per, float eps, bool vec,
                                                                 bf16* out, float* out_f32) {
  pdl_launch_dependents();
  pdl_wait();
  const size_t m = blockIdx.x;
  const int T = blockDim.x;
  float* r = residual + m * H;
  float ss = 0.0f;
  for (int j = 0; j < per; ++j) {
    float4 v = load_chunk(r, threadIdx.x + j * T, H, vec);
    if (delta) {
      const float4 dv = load_chunk(delta + m * H, threadIdx.x + j * T, H, vec);
      v.x += dv.x;
      v.y += dv.y;
      v.z += dv.z;
      v.w += dv.w;
    }
    if (gated.values)
      v = gated_add(v, gated_scale(gated, m), load_chunk(gated.values + m * H, threadIdx.x + j * T, H, vec));
    if (delta || gated.values) store_chunk(r, threadIdx.x + j * T, H, vec, v);
    ss = sum_squares(ss, v);
  }
  const float inv = rsqrtf(block_sum(ss) / float(H) + eps);
  for (int j = 0; j < per; ++j) {
    const int c = threadIdx.x + j * T;
    const float4 y = norm_chunk(load_chunk(r, c, H, vec), inv, load_chunk(w, c, H, vec));
    if (out) store_chunk_bf16(out + m * H, c, H, vec, y);
    if (out_f32) store_chunk(out_f32 + m * H, c, H, vec, y);
  }
}

// ---- SwiGLU, fused [gate | up] rows (bf16). Roofline: M·I·(4 + 2) bytes. ----
__global__ void silu_mul_vec_kernel(const bf16* gu, int I, size_t chunks, bf16* act) {
  const size_t c = flat_index();
  if (c >= chunks) return;
  const int per_row = I / 8;
  const size_t m = c / size_t(per_row), i = (c % size_t(per_row)) * 8;
  const bf16* row = gu + m * 2 * I;
  float g[8], u[8], y[8];
  unpack8(*reinterpret_cast<const uint4*>(row + i), g);
  unpack8(*reinterpret_cast<const uint4*>(row + I + i), u);
#pragma unroll
  for (int j = 0; j < 8; ++j) y[j] = silu_mul_value(g[j], u[j]);
  *reinterpret_cast<uint4*>(act + m * I + i) = pack8(y);
}

__global__ void silu_mul_scalar_kernel(const bf16* gu, int I, size_t n, bf16* act) {
  const size_t e = flat_index();
  if (e >= n) return;
  const size_t m = e / size_t(I), i = e % size_t(I);
  const bf16* row = gu + m * 2 * I;
  act[e] = __float2bfloat16(silu_mul_value(__bfloat162float(row[i]), __bfloat162float(row[I + i])));
}

// ---- SwiGLU of separate projections: act = silu(g)·u over the flat [M·I] arrays (rows are
// contiguous, so chunks may straddle rows). Roofline: M·I·3·sizeof(T) bytes. ----
template <typename T>
struct Vec16;  // 16 bytes of T
template <>
struct Vec16<float> {
  static constexpr int kN = 4;
  __device__ static void load(const float* p, float (&f)[4]) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    f[0] = v.x;
    f[1] = v.y;
    f[2] = v.z;
    f[3] = v.w;
  }
  __device__ static void store(float* p, const float (&f)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
  }
};
template <>
struct Vec16<bf16> {
  static constexpr int kN = 8;
  __device__ static void load(const bf16* p, float (&f)[8]) { unpack8(*reinterpret_cast<const uint4*>(p), f); }
  __device__ static void store(bf16* p, const float (&f)[8]) { *reinterpret_cast<uint4*>(p) = pack8(f); }
};

// One thread per kN-element chunk; with vec (all three arrays 16-byte aligned) full chunks
// move as 16-byte words, the tail chunk and unaligned arrays element by element.
template <typename T>
__global__ void silu_mul_split_kernel(const T* g, const T* u, size_t n, bool vec, T* act) {
  constexpr int kN = Vec16<T>::kN;
  const size_t e0 = flat_index() * kN;
  if (e0 >= n) return;
  if (vec && e0 + kN <= n) {
    float gv[kN], uv[kN], y[kN];
    Vec16<T>::load(g + e0, gv);
    Vec16<T>::load(u + e0, uv);
#pragma unroll
    for (int j = 0; j < kN; ++j) y[j] = silu_mul_value(gv[j], uv[j]);
    Vec16<T>::store(act + e0, y);
    return;
  }
  float gv[kN], uv[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j)
    if (e0 + j < n) {
      gv[j] = to_f32(g[e0 + j]);
      uv[j] = to_f32(u[e0 + j]);
    }
#pragma unroll
  for (int j = 0; j < kN; ++j)
    if (e0 + j < n) act[e0 + j] = from_f32<T>(silu_mul_value(gv[j], uv[j]));
}

// ---- gather: dst[r, :] = src[rows[r], :]. Roofline: 2·R·H·sizeof(T) bytes. ----
__global__ void gather_rows_vec_kernel(const uint4* src, const int32_t* rows, int row_words, size_t words,
                                       uint4* dst) {
  const size_t c = flat_index();
  if (c >= words) return;
  const size_t r = c / size_t(row_words), j = c % size_t(row_words);
  dst[c] = src[size_t(rows[r]) * row_words + j];
}

template <typename T>
__global__ void gather_rows_scalar_kernel(const T* src, const int32_t* rows, int H, size_t n, T* dst) {
  const size_t e = flat_index();
  if (e >= n) return;
  const size_t r = e / size_t(H), i = e % size_t(H);
  dst[e] = src[size_t(rows[r]) * H + i];
}

// ---- residual[m, :] += sigmoid(gate_logit[m])·x[m, :]. Roofline: M·H·12 + M·4 bytes. ----
__global__ void add_scaled_rows_vec_kernel(float* residual, const float* x, const float* gate_logit, int H,
                                           size_t chunks) {
  const size_t c = flat_index();
  if (c >= chunks) return;
  const size_t m = c / size_t(H / 4);
  const float s = sigmoid_scale(gate_logit, m);
  float4* rp = reinterpret_cast<float4*>(residual) + c;
  float4 r = *rp;
  const float4 xv = reinterpret_cast<const float4*>(x)[c];
  r.x += s * xv.x;
  r.y += s * xv.y;
  r.z += s * xv.z;
  r.w += s * xv.w;
  *rp = r;
}

__global__ void add_scaled_rows_scalar_kernel(float* residual, const float* x, const float* gate_logit, int H,
                                              size_t n) {
  const size_t e = flat_index();
  if (e >= n) return;
  const float s = sigmoid_scale(gate_logit, e / size_t(H));
  residual[e] += s * x[e];
}

// ---- argmax (first index on ties). Roofline: R·V·4 bytes. ----
__global__ void argmax_kernel(const float* logits, int V, int32_t* out) {
  const int r = blockIdx.x;
  const float* row = logits + size_t(r) * V;
  float best = -INFINITY;
  int best_i = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = row[i];
    if (v > best || (v == best && i < best_i)) {
      best = v;
      best_i = i;
    }
  }
  // Warp then block reduction of (value, index), smaller index wins ties.
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ov > best || (ov == best && oi < best_i)) {
      best = ov;
      best_i = oi;
    }
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int nwarps = (blockDim.x + 31) >> 5;
    float b = sv[0];
    int bi = si[0];
    for (int w = 1; w < nwarps; ++w)
      if (sv[w] > b || (sv[w] == b && si[w] < bi)) {
        b = sv[w];
        bi = si[w];
      }
    out[r] = bi;
  }
}

template <typename T>
void launch_silu_mul_split(const T* g, const T* u, int M, int I, T* act, cudaStream_t stream) {
  if (M == 0 || I == 0) return;
  const size_t n = size_t(M) * size_t(I);
  const size_t chunks = (n + Vec16<T>::kN - 1) / Vec16<T>::kN;
  const bool vec = aligned(g, 16) && aligned(u, 16) && aligned(act, 16);
  silu_mul_split_kernel<T><<<flat_blocks(chunks), kFlatThreads, 0, stream>>>(g, u, n, vec, act);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_gather_rows(const T* src, const int32_t* rows, int R, int H, T* dst, cudaStream_t stream) {
  if (R == 0 || H == 0) return;
  const size_t row_bytes = size_t(H) * sizeof(T);
  if (row_bytes % 16 == 0 && aligned(src, 16) && aligned(dst, 16)) {
    const int row_words = int(row_bytes / 16);
    const size_t words = size_t(R) * size_t(row_words);
    gather_rows_vec_kernel<<<flat_blocks(words), kFlatThreads, 0, stream>>>(
        reinterpret_cast<const uint4*>(src), rows, row_words, words, reinterpret_cast<uint4*>(dst));
  } else {
    const size_t n = size_t(R) * size_t(H);
    gather_rows_scalar_kernel<T><<<flat_blocks(n), kFlatThreads, 0, stream>>>(src, rows, H, n, dst);
  }
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_lookup(const int32_t* ids, int M, const bf16* table, int H, float* out, cudaStream_t stream) {
  if (M == 0 || H == 0) return;
  if (H % 8 == 0 && aligned(table, 16) && aligned(out, 16)) {
    const size_t chunks = size_t(M) * size_t(H / 8);
    embedding_vec_kernel<<<flat_blocks(chunks), kFlatThreads, 0, stream>>>(ids, table, H, chunks, out);
  } else {
    const size_t n = size_t(M) * size_t(H);
    embedding_scalar_kernel<<<flat_blocks(n), kFlatThreads, 0, stream>>>(ids, table, H, n, out);
  }
  MOESERVE_CUDA_CHECK_LAUNCH();
}

void add_rms_norm(float* residual, const float* delta, const float* w, int M, int H, float eps, bf16* out,
                  cudaStream_t stream, float* out_f32) {
  add_rms_norm(residual, delta, GatedAdd{}, w, M, H, eps, out, stream, out_f32);
}

void add_rms_norm(float* residual, const float* delta, GatedAdd gated, const float* w, int M, int H, float eps,
                  bf16* out, cudaStream_t stream, float* out_f32) {
  if (M == 0) return;
  if ((gated.values == nullptr) != (gated.gate_logit == nullptr))
    throw Error("add_rms_norm: a gated add needs both its values and its gate logits");
  const NormPlan p = norm_plan(H);
  // Vector chunks need every row 16-byte aligned (f32) / 8-byte aligned (bf16 out).
  const bool vec = H % 4 == 0 && aligned(residual, 16) && aligned(delta, 16) && aligned(gated.values, 16) &&
                   aligned(w, 16) && aligned(out_f32, 16) && aligned(out, 8);
  const dim3 grid{unsigned(M)}, block{unsigned(p.threads)};
  const bool pdl = M <= kPdlMaxRows;  // one CTA per row: about one wave
  if (p.per_thread == 1)
    launch_pdl(pdl, add_rms_norm_kernel<1>, grid, block, 0, stream, residual, delta, gated, w, H, eps, vec, out,
               out_f32);
  else if (p.per_thread == 2)
    launch_pdl(pdl, add_rms_norm_kernel<2>, grid, block, 0, stream, residual, delta, gated, w, H, eps, vec, out,
               out_f32);
  else if (p.per_thread <= 4)
    launch_pdl(pdl, add_rms_norm_kernel<4>, grid, block, 0, stream, residual, delta, gated, w, H, eps, vec, out,
               out_f32);
  else
    launch_pdl(pdl, add_rms_norm_wide_kernel, grid, block, 0, stream, residual, delta, gated, w, H, p.per_thread, eps,
               vec, out, out_f32);
}

void silu_mul(const bf16* gate_up, int M, int I, bf16* act, cudaStream_t stream) {
  if (M == 0 || I == 0) return;
  if (I % 8 == 0 && aligned(gate_up, 16) && aligned(act, 16)) {
    const size_t chunks = size_t(M) * size_t(I / 8);
    silu_mul_vec_kernel<<<flat_blocks(chunks), kFlatThreads, 0, stream>>>(gate_up, I, chunks, act);
  } else {
    const size_t n = size_t(M) * size_t(I);
    silu_mul_scalar_kernel<<<flat_blocks(n), kFlatThreads, 0, stream>>>(gate_up, I, n, act);
  }
  MOESERVE_CUDA_CHECK_LAUNCH();
}

void silu_mul_split(const bf16* g, const bf16* u, int M, int I, bf16* act, cudaStream_t stream) {
  launch_silu_mul_split(g, u, M, I, act, stream);
}

void silu_mul_split(const float* g, const float* u, int M, int I, float* act, cudaStream_t stream) {
  launch_silu_mul_split(g, u, M, I, act, stream);
}

void gather_rows(const bf16* src, const int32_t* rows, int R, int H, bf16* dst, cudaStream_t stream) {
  launch_gather_rows(src, rows, R, H, dst, stream);
}

void gather_rows(const float* src, const int32_t* rows, int R, int H, float* dst, cudaStream_t stream) {
  launch_gather_rows(src, rows, R, H, dst, stream);
}

void add_scaled_rows(float* residual, const float* x, const float* gate_logit, int M, int H, cudaStream_t stream) {
  if (M == 0 || H == 0) return;
  if (H % 4 == 0 && aligned(residual, 16) && aligned(x, 16)) {
    const size_t chunks = size_t(M) * size_t(H / 4);
    add_scaled_rows_vec_kernel<<<flat_blocks(chunks), kFlatThreads, 0, stream>>>(residual, x, gate_logit, H, chunks);
  } else {
    const size_t n = size_t(M) * size_t(H);
    add_scaled_rows_scalar_kernel<<<flat_blocks(n), kFlatThreads, 0, stream>>>(residual, x, gate_logit, H, n);
  }
  MOESERVE_CUDA_CHECK_LAUNCH();
}

void argmax_rows(const float* logits, int R, int V, int32_t* out, cudaStream_t stream) {
  if (R == 0) return;
  argmax_kernel<<<R, 1024, 0, stream>>>(logits, V, out);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
