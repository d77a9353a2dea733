// Tensor-core GEMM for dense projections with f32 activations: Y[M, N] f32 = X[M, K] f32 · Wᵀ,
// W [N, K] in bf16 (Dense, and NVFP4 dequantised to bf16 at load), FP8 e4m3 block-128 or INT8
// row-wise, on mma.sync.m16n8k16 bf16 (sm_80+: H200 and DGX Spark; no wgmma / tcgen05 / TMA).
//
// Arithmetic (fixed by K only, so a row's result is bit-identical for any M and any tiling):
//   x = hi + lo + r with hi = bf16_rn(x), lo = bf16_rn(x − hi) (|r| <= 2^-16·|x|);
//   W converted to bf16 exactly (e4m3 and int8 values fit a bf16 mantissa);
//   for each k16 step in ascending k: C = mma(A_hi, B, C), then C = mma(A_lo, B, C);
//   bf16:  y = C after the last step;
//   INT8:  y = C ⊗ scale[n]                       (one f32 multiply at the end);
//   FP8:   C restarts at 0 for every 128-wide k block; after each block
//          acc = fma(C, scale[n/128][k/128], acc)  (f32, blocks in ascending order), y = acc;
//   accumulate: y = y_old ⊕ value (one f32 add).
// Kernel layout, tiling and roofline: ops_mma_gemm.cu.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/device_linear.h"

namespace moeserve::cuda {

// True when mma_gemm handles this weight: Dense / NVFP4 (bf16), Fp8Block or Int8Rowwise with
// K % 16 == 0 (GPTQ INT4 is not supported).
bool mma_gemm_supported(const DeviceLinear& w);

// y [M, N] f32 (=, or += when accumulate) x [M, K] f32 · Wᵀ, any M >= 0 and any N. Throws a
// moeserve::Error for an unsupported format or K % 16 != 0. x must be 16-byte aligned and must
// not overlap y. Kernels that need more than 48 KB of shared memory are opted in on the first
// call per device (cudaFuncSetAttribute): make that first call outside CUDA-graph capture.
void mma_gemm(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate, cudaStream_t stream);

// Does the first-call set-up (the shared-memory opt-ins) for the current device now, so that a
// later first call may happen inside CUDA-graph capture.
void mma_gemm_prepare();

// The CTA tilings (ops_mma_gemm.cu). Auto picks by M and N; the others force one, for the tests
// (every tiling must give bit-identical results) and the benchmark. Large is the register-staged
// 128x128 kernel, LargePipelined the cp.async-pipelined 128x128 kernel (ops_mma_gemm_pipelined.cu);
// Auto's large-M choice runs one of the two by set_mma_gemm_variant.
enum class MmaTiling { Auto, Small, Medium, Large, LargePipelined };
void mma_gemm(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate, cudaStream_t stream,
              MmaTiling tiling);

// Which kernel Auto runs where it picks the 128x128 tiling (process-wide, for A/B timing; both give
// the same bits): 1 (default) LargePipelined, 0 the register-staged Large. Throws on another value.
void set_mma_gemm_variant(int variant);
int mma_gemm_variant();

}  // namespace moeserve::cuda
