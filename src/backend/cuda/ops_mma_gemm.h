// Tensor-core GEMM for dense projections with f32 activations: Y[M, N] f32 = X[M, K] f32 · Wᵀ,
// W [N, K] in bf16 (Dense, and NVFP4 dequantised to bf16 at load), FP8 e4m3 block-128 or INT8
// row-wise, on mma.sync.m16n8k16 bf16 (sm_80+: H200 and DGX Spark), and on sm_90 also on
// wgmma m64n128k16 (the same bits: ops_mma_gemm_wgmma.cu; no TMA, no tcgen05).
//
// Arithmetic (fixed by K only, so a row's result is bit-identical for any M and any tiling):
//   FP8 only: x' = x ⊗ scale[n/128][k/128] (one f32 multiply per element; bf16 / INT8: x' = x);
//   x' = hi + lo + r with hi = bf16_rn(x'), lo = bf16_rn(x' − hi) (|r| <= 2^-16·|x'|);
//   W converted to bf16 exactly (e4m3 and int8 values fit a bf16 mantissa);
//   for each k16 step in ascending k over all of K: C = mma(A_hi, B, C), then C = mma(A_lo, B, C);
//   bf16, FP8: y = C after the last step;
//   INT8:  y = C ⊗ scale[n]                       (one f32 multiply at the end);
//   accumulate: y = y_old ⊕ value (one f32 add).
// FP8 accuracy: the block scale moves from the weight onto the activation. fl(x·s) = x·s·(1 + δ),
// |δ| <= 2^-24, and its hi + lo keep it to 2^-16 relative, so every product (hi + lo)·q is
// x·(q·s) to within (2^-16 + 2^-24) relative, the same order as scaling a per-block partial sum
// afterwards (the arithmetic before session 7: C per 128-k block, acc = fma(C, s, acc)), whose
// terms carried 2^-16 from the split and one more f32 rounding per block. The MMAs' f32
// accumulation over K is the same in both. What is gained: one accumulator per output instead of
// two (C and acc), so the 128x256 kernel's 64x64 warp tile fits in registers.
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
// 128x128 kernel, LargePipelined the cp.async-pipelined 128x128 kernel, Wide the cp.async-pipelined
// 128x256 kernel with 64x64 warp tiles, LargePipelined2Cta the 128x128 one capped at 128
// registers for two CTAs per SM (all ops_mma_gemm_pipelined.cu); Wgmma128 / Wgmma256 the wgmma
// kernels with 128x128 / 128x256 tiles (ops_mma_gemm_wgmma.cu; only where
// mma_gemm_wgmma_available(), else they throw). Auto's large-M choice runs one of them by
// set_mma_gemm_variant.
enum class MmaTiling { Auto, Small, Medium, Large, LargePipelined, Wide, LargePipelined2Cta, Wgmma128, Wgmma256 };
void mma_gemm(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate, cudaStream_t stream,
              MmaTiling tiling);

// True when the current device is an sm_90 GPU and this build has the wgmma kernels' sm_90a code.
bool mma_gemm_wgmma_available();
// The wgmma kernels' step schedule (process-wide, for A/B timing; all give the same bits):
// overlapped, a warpgroup keeps one group of MMAs in flight while it builds its next operands;
// otherwise it waits for each group before the next. Modes: 0 never overlapped, 1 always, 2 (the
// default) by weight kind: bf16 W overlapped, FP8 / INT8 W (converted to bf16 in the CTA) not,
// the faster of the two for each on the H200 (docs/PERF.md, session 11). Throws on another value.
enum class WgmmaOverlap { Never = 0, Always = 1, ByWeightKind = 2 };
void set_mma_gemm_wgmma_overlap(int mode);
int mma_gemm_wgmma_overlap();

// Which kernel Auto runs where it picks a large tiling (process-wide, for A/B timing; all give the
// same bits): 4 (default) the wgmma kernels where mma_gemm_wgmma_available() (for bf16 W,
// Wgmma256 where its grid takes no more waves than Wgmma128's at 2 CTAs per SM, else Wgmma128; FP8
// / INT8 W Wgmma128), elsewhere as 3; 3 LargePipelined2Cta; 2 Wide where its grid fills the SMs
// well enough, else LargePipelined (the rule: ops_mma_gemm.cu, prefer_wide); 1 LargePipelined; 0
// the register-staged Large. Throws on another value. On the H200 (docs/PERF.md run T6, FP8 at M
// 1K and 8K) 3 was the fastest mma.sync kernel everywhere: 150 useful TFLOP/s at 16384x3072, M 8K,
// against 144 (2), 138 (1) and 127 (0). Whatever the variant, M <= 16 runs Small and M <= 64
// Medium; above, a GEMM with few output tiles (small N) runs Small or Medium where pick_tiling's
// time estimate (ops_mma_gemm.cu) says the large kernel's longer k loop would not pay.
void set_mma_gemm_variant(int variant);
int mma_gemm_variant();

}  // namespace moeserve::cuda
