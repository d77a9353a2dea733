// Grouped expert kernels for row-major experts (FP8 block-128 e4m3 [E][N][K] with f32 scales
// [E][ceil(N/128)][ceil(K/128)]; Dense bf16 [E][N][K]) and the element-wise fallback for every
// other case (GPTQ with act-order g_idx or odd shapes, where K % 16 != 0).
//
// Parallelisation: a CTA is (expert tile, 8 output rows), one warp per row n. Vector path
// (K % 16 == 0): lane L reads 16 consecutive weights per step (16 B FP8 / 32 B bf16; a warp
// covers 512 k), dequantises them in registers and uses them for every token of the tile
// (one pass over the row per tile of <= 8 tokens); per token the lane sums its 16 products,
// scales the chunk sum by the FP8 block scale (16 | 128) and adds it to its accumulator; a
// warp-shuffle tree finishes the row. The order depends only on k (batch invariant).
// Roofline (decode): the selected experts' weights once per step: 3·I·H bytes (FP8) or
// 6·I·H bytes (bf16) per distinct expert.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_moe_internal.cuh"

namespace moeserve::cuda::moe_detail {
namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ void load16_weights(const ExpertView& w, int e, int n, int k0, float (&f)[16],
                                               float& scale) {
  if (w.format == int(quant::WeightFormat::Fp8Block)) {
    const uint8_t* row = w.fp8 + (size_t(e) * w.N + n) * w.K;
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(row + k0));
    const __nv_fp8x2_storage_t* p = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(p[i], __NV_E4M3);
      const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&hr));
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
    const int nb = (w.N + 127) / 128, kb = (w.K + 127) / 128;
    scale = __ldg(w.scale + (size_t(e) * nb + n / 128) * kb + k0 / 128);
  } else {
    const bf16* row = w.dense + (size_t(e) * w.N + n) * w.K;
    float a[8], b[8];
    load8(row + k0, a);
    load8(row + k0 + 8, b);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      f[i] = a[i];
      f[8 + i] = b[i];
    }
    scale = 1.0f;
  }
}

// acc[p][j] += Σ_k W_p[n,k]·x_j[k] for this lane's k, NP projections sharing x.
template <int NP, typename T>
__device__ __forceinline__ void row_dot(const ExpertView (&w)[NP], int e, int n, const T* const (&xrow)[kTokenTile],
                                        int tn, float (&acc)[NP][kTokenTile]) {
  const int lane = threadIdx.x & 31, K = w[0].K;
  const bool vec = (K % 16) == 0 && w[0].format != int(quant::WeightFormat::GptqInt4);
  if (vec) {
    for (int k0 = lane * 16; k0 < K; k0 += 32 * 16) {
      float f[NP][16], s[NP];
#pragma unroll
      for (int p = 0; p < NP; ++p) load16_weights(w[p], e, n, k0, f[p], s[p]);
#pragma unroll
      for (int j = 0; j < kTokenTile; ++j) {
        if (j >= tn) break;
        float xa[8], xb[8];
        load8(xrow[j] + k0, xa);
        load8(xrow[j] + k0 + 8, xb);
#pragma unroll
        for (int p = 0; p < NP; ++p) {
          float c = 0.0f;
#pragma unroll
          for (int i = 0; i < 8; ++i) c = fmaf(f[p][i], xa[i], c);
#pragma unroll
          for (int i = 0; i < 8; ++i) c = fmaf(f[p][8 + i], xb[i], c);
          acc[p][j] = fmaf(c, s[p], acc[p][j]);
        }
      }
    }
  } else {
    for (int k = lane; k < K; k += 32) {
      float f[NP];
#pragma unroll
      for (int p = 0; p < NP; ++p) f[p] = expert_weight_at(w[p], e, n, k);
#pragma unroll
      for (int j = 0; j < kTokenTile; ++j) {
        if (j >= tn) break;
        const float xv = to_f32(xrow[j][k]);
#pragma unroll
        for (int p = 0; p < NP; ++p) acc[p][j] = fmaf(f[p], xv, acc[p][j]);
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    rows_gate_up_kernel(const T* __restrict__ x, int k_top, TileList tiles, ExpertView gate, ExpertView up,
                        float* __restrict__ act) {
  const int t = blockIdx.x;
  if (t >= *tiles.num_tiles) return;
  const int I = gate.N, H = gate.K;
  const int n = blockIdx.y * kWarps + (threadIdx.x >> 5);
  if (n >= I) return;
  const int e = tiles.expert[t], first = tiles.start[t], tn = tiles.count[t];
  const T* xrow[kTokenTile];
  int slot[kTokenTile];
#pragma unroll
  for (int j = 0; j < kTokenTile; ++j) {
    slot[j] = j < tn ? tiles.order[first + j] : 0;
    xrow[j] = x + size_t(slot[j] / k_top) * H;
  }
  float acc[2][kTokenTile];
#pragma unroll
  for (int j = 0; j < kTokenTile; ++j) acc[0][j] = acc[1][j] = 0.0f;
  const ExpertView w[2] = {gate, up};
  row_dot<2, T>(w, e, n, xrow, tn, acc);
#pragma unroll
  for (int j = 0; j < kTokenTile; ++j) {
    const float g = warp_sum(acc[0][j]), u = warp_sum(acc[1][j]);
    if ((threadIdx.x & 31) == 0 && j < tn) act[size_t(slot[j]) * I + n] = silu_mul(g, u);
  }
}

__global__ void __launch_bounds__(kWarps * 32)
    rows_down_kernel(const float* __restrict__ act, TileList tiles, ExpertView down, float* __restrict__ y) {
  const int t = blockIdx.x;
  if (t >= *tiles.num_tiles) return;
  const int H = down.N, I = down.K;
  const int n = blockIdx.y * kWarps + (threadIdx.x >> 5);
  if (n >= H) return;
  const int e = tiles.expert[t], first = tiles.start[t], tn = tiles.count[t];
  const float* xrow[kTokenTile];
  int slot[kTokenTile];
#pragma unroll
  for (int j = 0; j < kTokenTile; ++j) {
    slot[j] = j < tn ? tiles.order[first + j] : 0;
    xrow[j] = act + size_t(slot[j]) * I;
  }
  float acc[1][kTokenTile];
#pragma unroll
  for (int j = 0; j < kTokenTile; ++j) acc[0][j] = 0.0f;
  const ExpertView w[1] = {down};
  row_dot<1, float>(w, e, n, xrow, tn, acc);
#pragma unroll
  for (int j = 0; j < kTokenTile; ++j) {
    const float v = warp_sum(acc[0][j]);
    if ((threadIdx.x & 31) == 0 && j < tn) y[size_t(slot[j]) * H + n] = v;
  }
}

}  // namespace

template <typename T>
void rows_gate_up(const T* x, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
                  float* act, cudaStream_t stream) {
  const dim3 grid(unsigned(grid_tiles), unsigned((s.intermediate + kWarps - 1) / kWarps));
  rows_gate_up_kernel<T><<<grid, kWarps * 32, 0, stream>>>(x, s.top_k, tiles, view_of(ex.gate), view_of(ex.up), act);
  MOESERVE_CUDA_CHECK_LAUNCH();
}
template void rows_gate_up<float>(const float*, const MoeShape&, const DeviceExperts&, const TileList&, int, float*,
                                  cudaStream_t);
template void rows_gate_up<bf16>(const bf16*, const MoeShape&, const DeviceExperts&, const TileList&, int, float*,
                                 cudaStream_t);

void rows_down(const float* act, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
               float* y, cudaStream_t stream) {
  const dim3 grid(unsigned(grid_tiles), unsigned((s.hidden + kWarps - 1) / kWarps));
  rows_down_kernel<<<grid, kWarps * 32, 0, stream>>>(act, tiles, view_of(ex.down), y);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda::moe_detail
