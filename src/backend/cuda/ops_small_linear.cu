// Kernels declared in ops_small_linear.h (router, DeltaNet a/b, shared-expert gate: N <= a few
// hundred, K = hidden). K % 256 == 0: one CTA of 8 warps per output column n and 4 rows of x;
// warp w sums k in [wK/8, (w+1)K/8) (lanes take 8 consecutive k per step), a shuffle tree per
// warp, then the 8 partials in warp order: N CTAs even for N = 1, so latency, not bandwidth,
// is what is left. Otherwise one warp per column (linear_f32_input_kernel). Both orders depend
// only on K, never on M. Roofline: N·K·2 bytes of weight per call.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_small_linear.h"

namespace moeserve::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 4;  // rows of x per warp

// acc[r] += Σ_{i<8} x[m0 + r, k + i] · w_i (in i order) for the 8 bf16 weights in `raw`.
__device__ __forceinline__ void accumulate8(const uint4& raw, const float* __restrict__ x, int M, int K, int m0, int k,
                                            float (&acc)[kRows]) {
  const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
  float wf[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(w2[i]);
    wf[2 * i] = f.x;
    wf[2 * i + 1] = f.y;
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (m0 + r >= M) break;
    const float* xr = x + size_t(m0 + r) * K + k;
    const float4 a = *reinterpret_cast<const float4*>(xr);
    const float4 b = *reinterpret_cast<const float4*>(xr + 4);
    float s = acc[r];
    s = fmaf(a.x, wf[0], s);
    s = fmaf(a.y, wf[1], s);
    s = fmaf(a.z, wf[2], s);
    s = fmaf(a.w, wf[3], s);
    s = fmaf(b.x, wf[4], s);
    s = fmaf(b.y, wf[5], s);
    s = fmaf(b.z, wf[6], s);
    s = fmaf(b.w, wf[7], s);
    acc[r] = s;
  }
}

__global__ void linear_f32_input_kernel(const float* __restrict__ x, int M, int K, const bf16* __restrict__ w,
                                        int N, float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int m0 = blockIdx.y * kRows;
  if (n >= N) return;
  const bf16* wr = w + size_t(n) * K;
  float acc[kRows] = {0.0f, 0.0f, 0.0f, 0.0f};
  // Chunks of 8 weights (one 16-byte load); K % 8 == 0 is checked on the host.
  for (int k = lane * 8; k < K; k += 32 * 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(wr + k);
    accumulate8(raw, x, M, K, m0, k, acc);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float v = acc[r];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0 && m0 + r < M) y[size_t(m0 + r) * N + n] = v;
  }
}

constexpr int kSplitWarps = 8;

// Up to kMaxJobs weights with the same K (router + shared-expert gate, in_proj_b + in_proj_a):
// grid.x spans all their columns; a column's sum is the same as in a launch of its own.
constexpr int kMaxJobs = 4;
struct SplitJobs {
  const bf16* w[kMaxJobs];
  float* y[kMaxJobs];
  int N[kMaxJobs];
  int begin[kMaxJobs];  // first grid.x column of each job
  int count;
};

__global__ void linear_f32_input_split_kernel(const float* __restrict__ x, int M, int K, SplitJobs jobs) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int job = 0;
#pragma unroll
  for (int i = 1; i < kMaxJobs; ++i)
    if (i < jobs.count && int(blockIdx.x) >= jobs.begin[i]) job = i;
  const bf16* __restrict__ w = jobs.w[job];
  float* __restrict__ y = jobs.y[job];
  const int N = jobs.N[job];
  const int n = int(blockIdx.x) - jobs.begin[job];
  const int m0 = blockIdx.y * kRows;
  const int span = K / kSplitWarps;
  const bf16* wr = w + size_t(n) * K;
  float acc[kRows] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k = warp * span + lane * 8; k < (warp + 1) * span; k += 32 * 8) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(wr + k));
    accumulate8(raw, x, M, K, m0, k, acc);
  }
  __shared__ float partial[kSplitWarps][kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float v = acc[r];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) partial[warp][r] = v;
  }
  __syncthreads();
  if (threadIdx.x < kRows && m0 + int(threadIdx.x) < M) {
    float v = 0.0f;
    for (int u = 0; u < kSplitWarps; ++u) v += partial[u][threadIdx.x];
    y[size_t(m0 + threadIdx.x) * N + n] = v;
  }
}

}  // namespace

bool small_linear_supported(const DeviceLinear& w) {
  return w.format == quant::WeightFormat::Dense && w.K % 8 == 0 && w.dense.size() == size_t(w.N) * size_t(w.K);
}

void linear_f32_input(const float* x, int M, const DeviceLinear& w, float* y, cudaStream_t stream) {
  if (M == 0) return;
  if (!small_linear_supported(w)) throw Error("linear_f32_input: needs a dense bf16 weight with K % 8 == 0");
  if (w.K % (kSplitWarps * 32) == 0) {
    const SmallLinearOut one{&w, y};
    linear_f32_input_multi(x, M, std::span<const SmallLinearOut>(&one, 1), stream);
    return;
  }
  dim3 grid(unsigned((w.N + kWarps - 1) / kWarps), unsigned((M + kRows - 1) / kRows));
  linear_f32_input_kernel<<<grid, kWarps * 32, 0, stream>>>(x, M, int(w.K), w.dense.data(), int(w.N), y);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

void linear_f32_input_multi(const float* x, int M, std::span<const SmallLinearOut> outs, cudaStream_t stream) {
  if (M == 0 || outs.empty()) return;
  bool fuse = outs.size() <= size_t(kMaxJobs);
  for (const auto& o : outs) {
    if (!small_linear_supported(*o.w)) throw Error("linear_f32_input: needs a dense bf16 weight with K % 8 == 0");
    fuse = fuse && o.w->K == outs[0].w->K && o.w->K % (kSplitWarps * 32) == 0;
  }
  if (!fuse) {
    for (const auto& o : outs) linear_f32_input(x, M, *o.w, o.y, stream);
    return;
  }
  SplitJobs jobs{};
  jobs.count = int(outs.size());
  int cols = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    jobs.w[i] = outs[i].w->dense.data();
    jobs.y[i] = outs[i].y;
    jobs.N[i] = int(outs[i].w->N);
    jobs.begin[i] = cols;
    cols += int(outs[i].w->N);
  }
  const dim3 grid(unsigned(cols), unsigned((M + kRows - 1) / kRows));
  linear_f32_input_split_kernel<<<grid, kSplitWarps * 32, 0, stream>>>(x, M, int(outs[0].w->K), jobs);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
