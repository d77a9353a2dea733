// Kernels of ops_quant_gemv.h and dequantize_to_bf16 (linear_runner.h). f32 activations with
// an f32 output and an FP8 / INT8 / bf16 weight (the model's generated tokens) take the row
// GEMV of ops_quant_gemv_multi.cu instead; the kernels here serve bf16 activations, bf16
// outputs, GPTQ and K % 4 != 0.
//
// Any M: rows of X are taken in tiles of 16 (grid x = row tile, the fastest-varying index,
// so the tiles that need one weight slice run together and share it through L2); every
// output is summed in the same order whatever M is (batch invariance).
//
// GPTQ (qweight [K/8, N] i32): a block is 8 warps x 32 lanes; lane = column n (a warp reads
// 32 consecutive words = 128 B per packed row, coalesced), warp w takes packed rows
// kp ≡ w (mod 8); the 8 partial sums are added in warp order through shared memory.
// FP8 / INT8 / BF16 ([N, K]): K % 16 == 0: one warp per R output rows for a tile of MT rows of
// x (row_gemv_vec_kernel, 16-byte weight and x loads, FP8 converted in pairs; R and MT picked
// by M, and at M = 1 R = 4, 2 or 1 keeps >= 2 CTAs per SM busy); otherwise one warp per row,
// element by element (row_gemv_kernel). Each lane takes 16 weights per step (a warp covers
// 512 k), scales per 128-block (FP8) or per row (INT8); warp-shuffle sum.
// Roofline (decode): the weight bytes (N·K·elem) once per call; x re-reads hit L1/L2.
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/act_types.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/linear_runner.h"
#include "backend/cuda/ops_quant_gemv.h"

namespace moeserve::cuda {
namespace {

constexpr int kMaxM = LinearRunner::kSmallM;

__device__ __forceinline__ float fp8_to_float(uint8_t v) {
  __nv_fp8_e4m3 f;
  f.__x = v;
  return float(f);
}

__device__ __forceinline__ void store_out(void* y, bool y_f32, bool accumulate, size_t idx, float v) {
  if (y_f32) {
    float* p = static_cast<float*>(y) + idx;
    *p = accumulate ? *p + v : v;
  } else {
    static_cast<bf16*>(y)[idx] = __float2bfloat16(v);
  }
}

// ---- GPTQ INT4 ------------------------------------------------------------------------
template <typename TX>
__global__ void gptq_gemv_kernel(const TX* __restrict__ x, int M, const int32_t* __restrict__ qweight,
                                 const __half* __restrict__ scales, const int32_t* __restrict__ qzeros,
                                 const int32_t* __restrict__ g_idx, int N, int K, int group, bool sym, void* y,
                                 bool y_f32, bool accumulate) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n = blockIdx.y * 32 + lane;
  x += size_t(blockIdx.x) * kMaxM * K;  // this block's row tile
  M = min(kMaxM, M - int(blockIdx.x) * kMaxM);
  const size_t y_off = size_t(blockIdx.x) * kMaxM * N;
  float acc[kMaxM];
#pragma unroll
  for (int m = 0; m < kMaxM; ++m) acc[m] = 0.0f;
  if (n < N) {
    for (int kp = warp; kp < K / 8; kp += 8) {
      const uint32_t word = uint32_t(qweight[size_t(kp) * N + n]);
      float wv[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int k = kp * 8 + j;
        const int g = g_idx ? g_idx[k] : k / group;
        const float s = __half2float(scales[size_t(g) * N + n]);
        const int zero = sym ? 8 : int((uint32_t(qzeros[size_t(g) * (N / 8) + n / 8]) >> (4 * (n % 8))) & 0xF) + 1;
        wv[j] = float(int((word >> (4 * j)) & 0xF) - zero) * s;
      }
#pragma unroll
      for (int m = 0; m < kMaxM; ++m) {
        if (m < M) {
          const TX* xr = x + size_t(m) * K + kp * 8;
          float sum = 0.0f;
#pragma unroll
          for (int j = 0; j < 8; ++j) sum += wv[j] * to_f32(xr[j]);
          acc[m] += sum;
        }
      }
    }
  }
  __shared__ float partial[8][kMaxM][32];
#pragma unroll
  for (int m = 0; m < kMaxM; ++m) partial[warp][m][lane] = acc[m];
  __syncthreads();
  if (warp == 0 && n < N) {
    for (int m = 0; m < M; ++m) {
      float v = 0.0f;
      for (int w = 0; w < 8; ++w) v += partial[w][m][lane];
      store_out(y, y_f32, accumulate, y_off + size_t(m) * N + n, v);
    }
  }
}

// ---- FP8 block-128 and INT8 row-wise: one warp per output row ---------------------------
enum class RowKind { Fp8, Int8, Bf16 };

__device__ __forceinline__ void load16(const uint8_t* row, int k0, int K, bool vec, float (&wv)[16],
                                       RowKind kind) {
  if (kind == RowKind::Bf16) {
    const bf16* r = reinterpret_cast<const bf16*>(row);
    if (vec) {
      const uint4 p0 = *reinterpret_cast<const uint4*>(r + k0);
      const uint4 p1 = *reinterpret_cast<const uint4*>(r + k0 + 8);
      const __nv_bfloat162* a = reinterpret_cast<const __nv_bfloat162*>(&p0);
      const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&p1);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 fa = __bfloat1622float2(a[j]), fb = __bfloat1622float2(b[j]);
        wv[2 * j] = fa.x;
        wv[2 * j + 1] = fa.y;
        wv[8 + 2 * j] = fb.x;
        wv[8 + 2 * j + 1] = fb.y;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j) wv[j] = k0 + j < K ? __bfloat162float(r[k0 + j]) : 0.0f;
    }
    return;
  }
  const bool fp8 = kind == RowKind::Fp8;
  if (vec) {
    const uint4 packed = *reinterpret_cast<const uint4*>(row + k0);
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&packed);
#pragma unroll
    for (int j = 0; j < 16; ++j) wv[j] = fp8 ? fp8_to_float(b[j]) : float(int8_t(b[j]));
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint8_t b = k0 + j < K ? row[k0 + j] : 0;
      wv[j] = fp8 ? fp8_to_float(b) : float(int8_t(b));
    }
  }
}

template <RowKind kKind, typename TX>
__global__ void row_gemv_kernel(const TX* __restrict__ x, int M, const uint8_t* __restrict__ w,
                                const float* __restrict__ scale, int N, int K, void* y, bool y_f32,
                                bool accumulate) {
  constexpr bool kFp8 = kKind == RowKind::Fp8;
  constexpr size_t kElemBytes = kKind == RowKind::Bf16 ? 2 : 1;
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.y * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (n >= N) return;
  x += size_t(blockIdx.x) * kMaxM * K;  // this block's row tile
  M = min(kMaxM, M - int(blockIdx.x) * kMaxM);
  const size_t y_off = size_t(blockIdx.x) * kMaxM * N;
  const int kb = (K + 127) / 128;
  float acc[kMaxM];
#pragma unroll
  for (int m = 0; m < kMaxM; ++m) acc[m] = 0.0f;
  const uint8_t* row = w + size_t(n) * K * kElemBytes;
  const bool vec = (K % 16) == 0;
  for (int k0 = lane * 16; k0 < K; k0 += 32 * 16) {
    float wv[16];
    load16(row, k0, K, vec, wv, kKind);
    const float s = kFp8 ? scale[size_t(n / 128) * kb + k0 / 128] : 1.0f;
#pragma unroll
    for (int m = 0; m < kMaxM; ++m) {
      if (m < M) {
        const TX* xr = x + size_t(m) * K;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < 16; ++j)
          if (k0 + j < K) sum += wv[j] * to_f32(xr[k0 + j]);
        acc[m] += sum * s;
      }
    }
  }
  const float row_scale = kKind == RowKind::Int8 ? scale[n] : 1.0f;
  for (int m = 0; m < M; ++m) {
    float v = acc[m];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) store_out(y, y_f32, accumulate, y_off + size_t(m) * N + n, v * row_scale);
  }
}

// Vector path (K % 16 == 0): each warp computes R consecutive output rows, so one x load
// serves R rows; lane L takes k in [16L + 512s, 16L + 512s + 16) for steps s, and loads step
// s+1's weights before it computes step s (two steps of R·16 B per lane in flight).
// Per (row, token): the lane sums its 16 products in k order, scales the chunk sum (FP8 block
// scale; 16 | 128), adds it to its accumulator; a shuffle tree finishes. The arithmetic of a
// (row, token) is the same for every (MT, R) variant and every M: batch invariant.

// Up to kMaxJobs weights of one format and one K that read the same x (q/k/v, gate/up):
// one launch, grid.y spans the jobs' row blocks; each job's rows are computed exactly as in
// a launch of its own.
constexpr int kMaxJobs = 4;
struct RowJob {
  const uint8_t* w;
  const float* scale;
  int N;
  void* y;
  int block_begin;  // first grid.y block of this job
};
struct RowJobs {
  RowJob job[kMaxJobs];
  int count;
};

struct RawChunk {  // 16 weights of one row: 16 B (FP8, INT8) or 32 B (bf16)
  uint4 a, b;
};

template <RowKind kKind>
__device__ __forceinline__ void load_chunk(const uint8_t* row, int k0, RawChunk& c) {
  if constexpr (kKind == RowKind::Bf16) {
    const uint4* p = reinterpret_cast<const uint4*>(reinterpret_cast<const bf16*>(row) + k0);
    c.a = __ldg(p);
    c.b = __ldg(p + 1);
  } else {
    c.a = __ldg(reinterpret_cast<const uint4*>(row + k0));
  }
}

// Weights 8h .. 8h+7 of a chunk as f32.
template <RowKind kKind>
__device__ __forceinline__ void convert8(const RawChunk& c, int h, float (&w)[8]) {
  if constexpr (kKind == RowKind::Bf16) {
    const uint4 v = h == 0 ? c.a : c.b;
    const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(p[j]);
      w[2 * j] = f.x, w[2 * j + 1] = f.y;
    }
  } else {
    const uint32_t lo = h == 0 ? c.a.x : c.a.z, hi = h == 0 ? c.a.y : c.a.w;
    if constexpr (kKind == RowKind::Fp8) {
      const uint32_t words[2] = {lo, hi};
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const __half2_raw hr =
              __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t((words[q] >> (16 * j)) & 0xFFFFu), __NV_E4M3);
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
          w[4 * q + 2 * j] = f.x, w[4 * q + 2 * j + 1] = f.y;
        }
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[j] = float(int8_t((lo >> (8 * j)) & 0xFF));
        w[4 + j] = float(int8_t((hi >> (8 * j)) & 0xFF));
      }
    }
  }
}

// Steps of weights in flight per lane: a warp streams a row of K bytes in K/512 dependent
// steps, so long rows (o_proj, out_proj: K = 8192) need several in flight, not one.
// Deeper rings only where registers allow (one row of x, few rows per warp).
template <int MT, int R>
inline constexpr int kDepth = MT == 1 && R == 1 ? 4 : MT == 1 && R == 2 ? 3 : 2;

// CTAs per SM the register budget is set for: 3 at one row of x and <= 2 rows per warp
// (latency-bound decode), 2 otherwise.
template <int MT, int R>
inline constexpr int kMinBlocks = MT == 1 && R < 4 ? 3 : 2;

template <RowKind kKind, typename TX, int MT, int R>
__global__ void __launch_bounds__(256, kMinBlocks<MT, R>)
    row_gemv_vec_kernel(const TX* __restrict__ x, int M, RowJobs jobs, int K, bool y_f32, bool accumulate) {
  constexpr size_t kElemBytes = kKind == RowKind::Bf16 ? 2 : 1;
  int j = 0;
#pragma unroll
  for (int i = 1; i < kMaxJobs; ++i)
    if (i < jobs.count && int(blockIdx.y) >= jobs.job[i].block_begin) j = i;
  const uint8_t* __restrict__ w = jobs.job[j].w;
  const float* __restrict__ scale = jobs.job[j].scale;
  const int N = jobs.job[j].N;
  void* y = jobs.job[j].y;
  const int lane = threadIdx.x & 31;
  const int n0 = ((int(blockIdx.y) - jobs.job[j].block_begin) * (blockDim.x / 32) + (threadIdx.x >> 5)) * R;
  if (n0 >= N) return;
  x += size_t(blockIdx.x) * MT * K;  // this block's tile of MT rows of x
  M = min(MT, M - int(blockIdx.x) * MT);
  const size_t y_off = size_t(blockIdx.x) * MT * N;
  const int kb = (K + 127) / 128;
  const uint8_t* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = w + size_t(min(n0 + r, N - 1)) * K * kElemBytes;  // missing rows repeat N-1
  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;
  // A ring of D steps of weights in flight per lane: step k0 + 512·D is loaded into the slot
  // that step k0 just used. The arithmetic per step is unchanged.
  constexpr int D = kDepth<MT, R>;
  constexpr int kStep = 32 * 16;
  RawChunk ring[D][R];
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (lane * 16 + d * kStep < K) {
#pragma unroll
      for (int r = 0; r < R; ++r) load_chunk<kKind>(rows[r], lane * 16 + d * kStep, ring[d][r]);
    }
  for (int k00 = lane * 16; k00 < K; k00 += D * kStep) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int k0 = k00 + d * kStep;
      if (k0 >= K) break;
      float s[R];
#pragma unroll
      for (int r = 0; r < R; ++r)
        s[r] = kKind == RowKind::Fp8 ? __ldg(scale + size_t(min(n0 + r, N - 1) / 128) * kb + k0 / 128) : 1.0f;
      if constexpr (MT > 8) {
        // Large x tiles: all 16 weights of each row first, then one chunk sum per (row, token)
        // at a time (no [R][MT] partial sums held: registers for 2 CTAs per SM). The same fma
        // sequence per (row, token) as the branch below.
        float wv[R][16];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float lo[8], hi[8];
          convert8<kKind>(ring[d][r], 0, lo);
          convert8<kKind>(ring[d][r], 1, hi);
#pragma unroll
          for (int q = 0; q < 8; ++q) wv[r][q] = lo[q], wv[r][8 + q] = hi[q];
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          if (m >= M) break;
          float xa[8], xb[8];
          load8(x + size_t(m) * K + k0, xa);
          load8(x + size_t(m) * K + k0 + 8, xb);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float c = 0.0f;
#pragma unroll
            for (int q = 0; q < 8; ++q) c = fmaf(wv[r][q], xa[q], c);
#pragma unroll
            for (int q = 0; q < 8; ++q) c = fmaf(wv[r][8 + q], xb[q], c);
            acc[r][m] = fmaf(c, s[r], acc[r][m]);
          }
        }
      } else {
        float c[R][MT];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int m = 0; m < MT; ++m) c[r][m] = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float wv[R][8];
#pragma unroll
          for (int r = 0; r < R; ++r) convert8<kKind>(ring[d][r], h, wv[r]);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            if (m >= M) break;
            float xv[8];
            load8(x + size_t(m) * K + k0 + 8 * h, xv);
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int q = 0; q < 8; ++q) c[r][m] = fmaf(wv[r][q], xv[q], c[r][m]);
          }
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int m = 0; m < MT; ++m) acc[r][m] = fmaf(c[r][m], s[r], acc[r][m]);
      }
      if (k0 + D * kStep < K) {
#pragma unroll
        for (int r = 0; r < R; ++r) load_chunk<kKind>(rows[r], k0 + D * kStep, ring[d][r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int n = n0 + r;
    const float row_scale = kKind == RowKind::Int8 && n < N ? scale[n] : 1.0f;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (m >= M) break;
      float v = acc[r][m];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0 && n < N) store_out(y, y_f32, accumulate, y_off + size_t(m) * N + n, v * row_scale);
    }
  }
}

// ---- dequantisation to bf16 [N, K] ------------------------------------------------------
__global__ void gptq_dequant_kernel(const int32_t* qweight, const __half* scales, const int32_t* qzeros,
                                    const int32_t* g_idx, int N, int K, int group, bool sym, bf16* out) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;  // over (kp, n)
  if (i >= size_t(K / 8) * N) return;
  const int kp = int(i / N), n = int(i % N);
  const uint32_t word = uint32_t(qweight[i]);
  for (int j = 0; j < 8; ++j) {
    const int k = kp * 8 + j;
    const int g = g_idx ? g_idx[k] : k / group;
    const float s = __half2float(scales[size_t(g) * N + n]);
    const int zero = sym ? 8 : int((uint32_t(qzeros[size_t(g) * (N / 8) + n / 8]) >> (4 * (n % 8))) & 0xF) + 1;
    out[size_t(n) * K + k] = __float2bfloat16(float(int((word >> (4 * j)) & 0xF) - zero) * s);
  }
}

template <bool kFp8>
__global__ void byte_dequant_kernel(const uint8_t* w, const float* scale, int N, int K, bf16* out) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(N) * K) return;
  const int n = int(i / K), k = int(i % K);
  const float v = kFp8 ? fp8_to_float(w[i]) * scale[size_t(n / 128) * ((K + 127) / 128) + k / 128]
                       : float(int8_t(w[i])) * scale[n];
  out[i] = __float2bfloat16(v);
}

}  // namespace

namespace {

RowKind row_kind(quant::WeightFormat f) {
  switch (f) {
    case quant::WeightFormat::Fp8Block:
      return RowKind::Fp8;
    case quant::WeightFormat::Int8Rowwise:
      return RowKind::Int8;
    default:
      return RowKind::Bf16;  // Dense and NVFP4 (dequantised to bf16 at load)
  }
}

// One row_gemv_vec_kernel launch over `count` weights sharing format and K. The (MT, R)
// variant is picked by M: rows of x per tile and output rows per warp (registers vs loads in
// flight); every variant computes each output with the same arithmetic.
template <RowKind kKind, typename TX, int MT, int R>
void launch_vec_variant(const TX* x, int M, RowJobs jobs, const int* rows_per_job, int K, bool y_f32, bool accumulate,
                        cudaStream_t stream) {
  int blocks = 0;
  for (int i = 0; i < jobs.count; ++i) {
    jobs.job[i].block_begin = blocks;
    blocks += (rows_per_job[i] + 8 * R - 1) / (8 * R);
  }
  if (blocks > 65535) throw Error("quant_gemv: N too large for the launch grid");
  const dim3 grid(unsigned((M + MT - 1) / MT), unsigned(blocks));
  row_gemv_vec_kernel<kKind, TX, MT, R><<<grid, 256, 0, stream>>>(x, M, jobs, K, y_f32, accumulate);
}

int sm_count() { return current_device_sm_count(); }

template <RowKind kKind, typename TX>
void launch_vec_kind(const TX* x, int M, const RowJobs& jobs, const int* rows_per_job, int K, bool y_f32,
                     bool accumulate, cudaStream_t stream) {
  if (M == 1) {
    // As many rows per warp as keep >= 2 CTAs per SM busy: few-row, long-K weights (o_proj,
    // out_proj: 3072 x 8192) need more warps, not more rows per warp.
    int rows = 0;
    for (int i = 0; i < jobs.count; ++i) rows += rows_per_job[i];
    const int want = 2 * sm_count();
    if (rows / 32 >= want)
      launch_vec_variant<kKind, TX, 1, 4>(x, M, jobs, rows_per_job, K, y_f32, accumulate, stream);
    else if (rows / 16 >= want)
      launch_vec_variant<kKind, TX, 1, 2>(x, M, jobs, rows_per_job, K, y_f32, accumulate, stream);
    else
      launch_vec_variant<kKind, TX, 1, 1>(x, M, jobs, rows_per_job, K, y_f32, accumulate, stream);
  }
  else if (M <= 4)
    launch_vec_variant<kKind, TX, 4, 2>(x, M, jobs, rows_per_job, K, y_f32, accumulate, stream);
  else if (M <= 8)
    launch_vec_variant<kKind, TX, 8, 2>(x, M, jobs, rows_per_job, K, y_f32, accumulate, stream);
  else
    launch_vec_variant<kKind, TX, 16, 2>(x, M, jobs, rows_per_job, K, y_f32, accumulate, stream);
}

template <typename TX>
void launch_vec(const TX* x, int M, const DeviceLinear* const* ws, void* const* ys, int count, bool y_f32,
                bool accumulate, cudaStream_t stream) {
  RowJobs jobs{};
  jobs.count = count;
  int rows[kMaxJobs];
  const RowKind kind = row_kind(ws[0]->format);
  for (int i = 0; i < count; ++i) {
    const DeviceLinear& w = *ws[i];
    const uint8_t* bytes = kind == RowKind::Fp8    ? w.fp8.data()
                           : kind == RowKind::Int8 ? reinterpret_cast<const uint8_t*>(w.int8.data())
                                                   : reinterpret_cast<const uint8_t*>(w.dense.data());
    jobs.job[i] = {bytes, kind == RowKind::Bf16 ? nullptr : w.scale.data(), int(w.N), ys[i], 0};
    rows[i] = int(w.N);
  }
  const int K = int(ws[0]->K);
  switch (kind) {
    case RowKind::Fp8:
      launch_vec_kind<RowKind::Fp8, TX>(x, M, jobs, rows, K, y_f32, accumulate, stream);
      break;
    case RowKind::Int8:
      launch_vec_kind<RowKind::Int8, TX>(x, M, jobs, rows, K, y_f32, accumulate, stream);
      break;
    case RowKind::Bf16:
      launch_vec_kind<RowKind::Bf16, TX>(x, M, jobs, rows, K, y_f32, accumulate, stream);
      break;
  }
}

template <typename TX>
void launch_gemv(const TX* x, int M, const DeviceLinear& w, void* y, bool y_f32, bool accumulate,
                 cudaStream_t stream) {
  if (M == 0) return;
  const int N = int(w.N), K = int(w.K);
  const unsigned row_tiles = unsigned((M + kMaxM - 1) / kMaxM);
  if ((N + 7) / 8 > 65535) throw Error("quant_gemv: N too large for the launch grid");
  const bool vec = K % 16 == 0;  // 16-byte weight and activation loads
  const DeviceLinear* wp = &w;
  switch (w.format) {
    case quant::WeightFormat::GptqInt4:
      gptq_gemv_kernel<TX><<<dim3(row_tiles, unsigned((N + 31) / 32)), 256, 0, stream>>>(
          x, M, w.qweight.data(), w.scales.data(), w.qzeros.data(), w.g_idx.size() ? w.g_idx.data() : nullptr, N, K,
          int(w.group_size), w.sym, y, y_f32, accumulate);
      break;
    case quant::WeightFormat::Fp8Block:
      if (vec)
        launch_vec<TX>(x, M, &wp, &y, 1, y_f32, accumulate, stream);
      else
        row_gemv_kernel<RowKind::Fp8, TX><<<dim3(row_tiles, unsigned((N + 7) / 8)), 256, 0, stream>>>(
            x, M, w.fp8.data(), w.scale.data(), N, K, y, y_f32, accumulate);
      break;
    case quant::WeightFormat::Int8Rowwise:
      if (vec)
        launch_vec<TX>(x, M, &wp, &y, 1, y_f32, accumulate, stream);
      else
        row_gemv_kernel<RowKind::Int8, TX><<<dim3(row_tiles, unsigned((N + 7) / 8)), 256, 0, stream>>>(
            x, M, reinterpret_cast<const uint8_t*>(w.int8.data()), w.scale.data(), N, K, y, y_f32, accumulate);
      break;
    case quant::WeightFormat::Dense:
    case quant::WeightFormat::Nvfp4:  // dequantised to bf16 at load
      if (vec)
        launch_vec<TX>(x, M, &wp, &y, 1, y_f32, accumulate, stream);
      else
        row_gemv_kernel<RowKind::Bf16, TX><<<dim3(row_tiles, unsigned((N + 7) / 8)), 256, 0, stream>>>(
            x, M, reinterpret_cast<const uint8_t*>(w.dense.data()), nullptr, N, K, y, y_f32, accumulate);
      break;
    default:
      throw Error("quant_gemv: unsupported weight format");
  }
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void quant_gemv(const bf16* x, int M, const DeviceLinear& w, void* y, bool y_f32, bool accumulate,
                cudaStream_t stream) {
  launch_gemv(x, M, w, y, y_f32, accumulate, stream);
}

void quant_gemv(const float* x, int M, const DeviceLinear& w, void* y, bool y_f32, bool accumulate,
                cudaStream_t stream) {
  if (y_f32 && row_gemv_supported(w)) {  // the generated-token kernel (ops_quant_gemv_multi.cu)
    const RowGemvJob job{&w, static_cast<float*>(y), accumulate};
    row_gemv_f32(x, M, std::span<const RowGemvJob>(&job, 1), stream);
    return;
  }
  launch_gemv(x, M, w, y, y_f32, accumulate, stream);
}

void quant_gemv_multi(const float* x, int M, std::span<const LinearOut> outs, cudaStream_t stream) {
  if (M == 0 || outs.empty()) return;
  bool fuse = true;  // any mix of FP8 / INT8 / bf16 with one K: row_gemv_f32's launches
  for (const auto& o : outs) fuse = fuse && row_gemv_supported(*o.w) && o.w->K == outs[0].w->K;
  if (!fuse) {
    for (const auto& o : outs) quant_gemv(x, M, *o.w, o.y, true, false, stream);
    return;
  }
  RowGemvJob jobs[kMaxRowJobs];
  for (size_t b = 0; b < outs.size(); b += kMaxRowJobs) {
    const size_t n = std::min(outs.size() - b, size_t(kMaxRowJobs));
    for (size_t i = 0; i < n; ++i) jobs[i] = RowGemvJob{outs[b + i].w, outs[b + i].y, false};
    row_gemv_f32(x, M, std::span<const RowGemvJob>(jobs, n), stream);
  }
}

void dequantize_to_bf16(const DeviceLinear& w, bf16* out, cudaStream_t stream) {
  const int N = int(w.N), K = int(w.K);
  switch (w.format) {
    case quant::WeightFormat::GptqInt4: {
      const size_t n = size_t(K / 8) * N;
      gptq_dequant_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(
          w.qweight.data(), w.scales.data(), w.qzeros.data(), w.g_idx.size() ? w.g_idx.data() : nullptr, N, K,
          int(w.group_size), w.sym, out);
      break;
    }
    case quant::WeightFormat::Fp8Block: {
      const size_t n = size_t(N) * K;
      byte_dequant_kernel<true><<<unsigned((n + 255) / 256), 256, 0, stream>>>(w.fp8.data(), w.scale.data(), N, K, out);
      break;
    }
    case quant::WeightFormat::Int8Rowwise: {
      const size_t n = size_t(N) * K;
      byte_dequant_kernel<false><<<unsigned((n + 255) / 256), 256, 0, stream>>>(
          reinterpret_cast<const uint8_t*>(w.int8.data()), w.scale.data(), N, K, out);
      break;
    }
    case quant::WeightFormat::Dense:
    case quant::WeightFormat::Nvfp4:
      MOESERVE_CUDA_CHECK(cudaMemcpyAsync(out, w.dense.data(), w.dense.bytes(), cudaMemcpyDeviceToDevice, stream));
      return;
  }
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
