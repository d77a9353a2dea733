// Kernels declared in ops_basic.h. One block per row; vectorised where the row allows.
#include "backend/cuda/act_types.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_basic.h"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 256;

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

__global__ void embedding_kernel(const int32_t* ids, const bf16* table, int H, float* out) {
  const int m = blockIdx.x;
  const bf16* row = table + size_t(ids[m]) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) out[size_t(m) * H + i] = __bfloat162float(row[i]);
}

__global__ void add_rms_norm_kernel(float* residual, const float* delta, const float* w, int H, float eps,
                                    bf16* out, float* out_f32) {
  const int m = blockIdx.x;
  float* r = residual + size_t(m) * H;
  const float* d = delta ? delta + size_t(m) * H : nullptr;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float v = r[i];
    if (d) {
      v += d[i];
      r[i] = v;
    }
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / float(H) + eps);
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    const float y = r[i] * inv * (1.0f + w[i]);
    if (out) out[size_t(m) * H + i] = __float2bfloat16(y);
    if (out_f32) out_f32[size_t(m) * H + i] = y;
  }
}

__global__ void silu_mul_kernel(const bf16* gu, int I, bf16* act) {
  const int m = blockIdx.x;
  const bf16* row = gu + size_t(m) * 2 * I;
  for (int i = threadIdx.x; i < I; i += blockDim.x) {
    const float g = __bfloat162float(row[i]);
    const float u = __bfloat162float(row[I + i]);
    act[size_t(m) * I + i] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
  }
}

template <typename T>
__global__ void silu_mul_split_kernel(const T* g, const T* u, int I, T* act) {
  const size_t base = size_t(blockIdx.x) * I;
  for (int i = threadIdx.x; i < I; i += blockDim.x) {
    const float gv = to_f32(g[base + i]);
    act[base + i] = from_f32<T>(gv / (1.0f + __expf(-gv)) * to_f32(u[base + i]));
  }
}

template <typename T>
__global__ void gather_rows_kernel(const T* src, const int32_t* rows, int H, T* dst) {
  const T* s = src + size_t(rows[blockIdx.x]) * H;
  T* d = dst + size_t(blockIdx.x) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) d[i] = s[i];
}

__global__ void add_scaled_rows_kernel(float* residual, const float* x, const float* gate_logit, int H) {
  const int m = blockIdx.x;
  const float s = gate_logit ? 1.0f / (1.0f + __expf(-gate_logit[m])) : 1.0f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) residual[size_t(m) * H + i] += s * x[size_t(m) * H + i];
}

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

}  // namespace

void embedding_lookup(const int32_t* ids, int M, const bf16* table, int H, float* out, cudaStream_t stream) {
  if (M == 0) return;
  embedding_kernel<<<M, kThreads, 0, stream>>>(ids, table, H, out);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

void add_rms_norm(float* residual, const float* delta, const float* w, int M, int H, float eps, bf16* out,
                  cudaStream_t stream, float* out_f32) {
  if (M == 0) return;
  add_rms_norm_kernel<<<M, kThreads, 0, stream>>>(residual, delta, w, H, eps, out, out_f32);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

void silu_mul(const bf16* gate_up, int M, int I, bf16* act, cudaStream_t stream) {
  if (M == 0) return;
  silu_mul_kernel<<<M, kThreads, 0, stream>>>(gate_up, I, act);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

void silu_mul_split(const bf16* g, const bf16* u, int M, int I, bf16* act, cudaStream_t stream) {
  if (M == 0) return;
  silu_mul_split_kernel<bf16><<<M, kThreads, 0, stream>>>(g, u, I, act);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

void silu_mul_split(const float* g, const float* u, int M, int I, float* act, cudaStream_t stream) {
  if (M == 0) return;
  silu_mul_split_kernel<float><<<M, kThreads, 0, stream>>>(g, u, I, act);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

void gather_rows(const bf16* src, const int32_t* rows, int R, int H, bf16* dst, cudaStream_t stream) {
  if (R == 0) return;
  gather_rows_kernel<bf16><<<R, kThreads, 0, stream>>>(src, rows, H, dst);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

void gather_rows(const float* src, const int32_t* rows, int R, int H, float* dst, cudaStream_t stream) {
  if (R == 0) return;
  gather_rows_kernel<float><<<R, kThreads, 0, stream>>>(src, rows, H, dst);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

void add_scaled_rows(float* residual, const float* x, const float* gate_logit, int M, int H, cudaStream_t stream) {
  if (M == 0) return;
  add_scaled_rows_kernel<<<M, kThreads, 0, stream>>>(residual, x, gate_logit, H);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

void argmax_rows(const float* logits, int R, int V, int32_t* out, cudaStream_t stream) {
  if (R == 0) return;
  argmax_kernel<<<R, 1024, 0, stream>>>(logits, V, out);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
