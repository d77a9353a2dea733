// Tensor-core GEMM for dense projections with f32 activations: Y[M, N] f32 = X[M, K] f32 · Wᵀ,
// W [N, K] in bf16 (Dense, and NVFP4 dequantised to bf16 at load), FP8 e4m3 block-128 or INT8
// row-wise, on mma.sync.m16n8k16 bf16 (sm_80+: H200 and DGX Spark; no wgmma / tcgen05 / TMA).
//
// Arithmetic (fixed by K only, so a row's result is bit-identical for any M, any tiling and
// whether or not K is split across CTAs):
//   x = hi + lo + r with hi = bf16_rn(x), lo = bf16_rn(x − hi) (|r| <= 2^-16·|x|);
//   W converted to bf16 exactly (e4m3 and int8 values fit a bf16 mantissa);
//   K is cut into segments of 1024 (the last one shorter; mma_gemm_k_segments(K) of them);
//   within a segment, for each k16 step in ascending k: C = mma(A_hi, B, C), then
//   C = mma(A_lo, B, C), with C = 0 at the segment's start; the segment's value v_s is
//     bf16, INT8: C after its last step;
//     FP8:        C restarts at 0 for every 128-wide k block; after each block
//                 a = fma(C, scale[n/128][k/128], a) (f32, a = 0 at the segment's start); v_s = a;
//   t = (((0 ⊕ v_0) ⊕ v_1) ⊕ ...) in ascending segment order (one f32 add each);
//   bf16, FP8: y = t;   INT8: y = t ⊗ scale[n] (one f32 multiply);
//   accumulate: y = y_old ⊕ y (one f32 add).
// Kernel layouts, tilings, the split-K path and the rooflines: ops_mma_gemm.cu.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_linear.h"

namespace moeserve::cuda {

// True when mma_gemm handles this weight: Dense / NVFP4 (bf16), Fp8Block or Int8Rowwise with
// K % 16 == 0 (GPTQ INT4 is not supported).
bool mma_gemm_supported(const DeviceLinear& w);

// y [M, N] f32 (=, or += when accumulate) x [M, K] f32 · Wᵀ, any M >= 0 and any N. Throws a
// moeserve::Error for an unsupported format or K % 16 != 0. x must be 16-byte aligned and must
// not overlap y. Kernels that need more than 48 KB of shared memory are opted in on the first
// call per device (cudaFuncSetAttribute), and the split-K workspace (below) is allocated by the
// first call per device that is not inside CUDA-graph capture: call mma_gemm_prepare() first.
//
// Split-K workspace: one per device, owned by ops_mma_gemm (16 MB of segment values + 256 KB of
// tile counters, allocated once, never freed). Calls that split K use it, so calls on one device
// must not run concurrently on different streams (the model issues them on its one stream). A
// call that finds no workspace (first call inside capture without mma_gemm_prepare()) or whose
// values do not fit it does not split: same bits, fewer CTAs.
void mma_gemm(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate, cudaStream_t stream);

// Does the first-call set-up for the current device now (the shared-memory opt-ins, the split-K
// workspace), so that a later first call may happen inside CUDA-graph capture. Not inside capture.
void mma_gemm_prepare();

// The CTA tilings (ops_mma_gemm.cu). Auto picks by M and N (Stream16 for M <= 16, Stream64 for
// M <= 64, Medium or Large above); the others force one, for the tests (every tiling must give
// bit-identical results) and the benchmark. Split-K applies to the Stream tilings only: Auto
// splits when the tiles are fewer than two per SM and K has several segments; Off never, On
// always (when K has several segments and the values fit the workspace).
enum class MmaTiling { Auto, Small, Medium, Large, Stream16, Stream64 };
enum class MmaSplitK { Auto, Off, On };
void mma_gemm(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate, cudaStream_t stream,
              MmaTiling tiling);
void mma_gemm(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate, cudaStream_t stream,
              MmaTiling tiling, MmaSplitK split);

// The number of 1024-wide K segments of the arithmetic above (ceil(K / 1024)).
int mma_gemm_k_segments(int64_t K);
// How many CTAs the automatic path runs along K per output tile for this shape: 1 (no split) or
// mma_gemm_k_segments(K) (each segment its own CTA), as decided once the workspace exists.
int mma_gemm_split_segments(int64_t N, int64_t K, int M);

}  // namespace moeserve::cuda
