// Tensor-core GEMVs of generated tokens over f32 activations (the tc_gemv family,
// ops_tc_gemv.cu): y [M, N] f32 (=, or += with accumulate) x [M, K] · Wᵀ for FP8 block-128,
// INT8 row-wise and bf16 (Dense; NVFP4 is bf16 after load) weights on mma.sync m16n8k16 (sm_80+
// PTX only: the H200 and the DGX Spark), "swapAB": the weights are the MMA's A operand (16 output
// rows per m16 fragment), the tokens its B operand (8 tokens per n8 column block), so a batch-1
// launch wastes MMA columns, not dequantisation work.
//
// Batch invariant ON ITS OWN: each output's bits depend on K, the format, the weight row and its
// own token's x only (never on M, the other tokens, the other jobs, N or the grid); they differ
// from row_gemv_f32's (ops_quant_gemv.h), which sums in another order on CUDA cores.
//
// The arithmetic (fixed by K and the format; the kernels compute exactly this):
//   K is cut into B = ceil(K/128) blocks of 128 k; a last partial block is zero-padded (zero
//   weights times zero x add exact zeros). Inside each 64-k chunk of a block, k is permuted
//   (tc_gemv_logical_k below: a thread's one 16-byte weight load feeds its A registers of 4
//   k16 steps) and x is staged in the same permuted order, so each MMA pairs W[n][k] with
//   x[m][k] of the same physical k.
//   FP8 (e4m3, converted EXACTLY to f16 by cvt e4m3x2 -> f16x2: every e4m3 value, subnormals
//   included, is an f16 normal or zero):
//     for token m and block b: a = max |x[m][k]| over the block; P = a == 0 ? 0 :
//     min(14 - ilogb(a), 126) (so |x·2^P| < 2^15; the clamp only touches blocks whose max is
//     below 2^-112, keeping 2^P and 2^-P normal floats); x'' = x·2^P (__fmul_rn: exact but for
//     f32 underflow of values far below the block max, which f16 flushes anyway);
//     hi = f16_rn(x''), lo = f16_rn(x'' − hi) (x'' − hi is exact in f32): 22 significant bits
//     of each x relative to its block's max.
//     C_b = the block's 8 k16 steps in order (logical k16 step i = 0..7), each mma_f16(W, hi)
//     then mma_f16(W, lo) (m16n8k16, f16 inputs, f32 accumulate), from +0.
//     S(K) slices: S = 8 if B >= 8, else the largest power of two <= B; slice j holds blocks
//     [floor(j·B/S), floor((j+1)·B/S)) (never empty). Per output and slice:
//     acc_j = +0, then acc_j = fma(C_b, s[n/128][b] · 2^-P, acc_j) over the slice's blocks in
//     order (s·2^-P one __fmul_rn: exact in the normal range).
//     y = acc_0, then y = y + acc_j for j = 1 .. S-1 (__fadd_rn, in slice order).
//   INT8 row-wise: q -> f16 exactly (f16 bits 0x6400 | (q ^ 0x80) = 1024 + q + 128, minus 1152
//     in one HSUB2); the same x'', C_b; acc_j = fma(C_b, 2^-P, acc_j); y = (the slice fold) ·
//     s_row[n] (one __fmul_rn).
//   bf16: bf16 MMAs; x split hi = bf16_rn(x), lo = bf16_rn(x − hi) (no P: mma_frag::split2);
//     acc_j = acc_j + C_b (__fadd_rn); y = the slice fold.
//   accumulate: y_out = y_out + y (__fadd_rn). Every f32 operation outside the MMAs is an
//   explicit _rn intrinsic.
//
// Kernel forms (chosen by M and the launch's rows; all give the same bits): ops_tc_gemv.cu:
// lean (M <= 8: x staged once per CTA, no barrier in the main loop), stepped with in-CTA staging,
// stepped over planes pre-converted once per launch (9 <= M <= 256; a process-wide workspace, see
// tc_gemv_reserve); on sm_90 GPUs the 9-256-token launches take the wgmma form instead
// (ops_tc_gemv_wgmma.h: wgmma m64nNk16 with the same A registers and the planes as its B).
#pragma once
#include <cuda_runtime.h>

#include <span>

#include "backend/cuda/device_linear.h"
#include "backend/cuda/ops_quant_gemv.h"  // RowGemvJob, kMaxRowJobs

namespace moeserve::cuda {

// FP8 block-128 (e4m3 + f32 block scales), INT8 row-wise, Dense bf16 (and NVFP4, bf16 at load)
// with K % 16 == 0 and buffers of the stated sizes.
bool tc_gemv_supported(const DeviceLinear& w);

// The contract of row_gemv_f32 (ops_quant_gemv.h): y_i (+)= x · W_iᵀ for up to kMaxRowJobs jobs
// of any mix of the formats over one K and one x in ONE launch (more jobs: more launches), each
// output bit-identical to its job alone at any M. x: f32 [M, K] rows, 16-byte aligned base; y
// must not alias x. Throws when a job is not supported or the jobs' K differ.
void tc_gemv_f32(const float* x, int M, std::span<const RowGemvJob> jobs, cudaStream_t stream);

// y (+)= W · (silu(g) ⊙ u), g and u f32 [M, K]: x = silu(g)·u is computed while staging, with
// silu_mul_split's expression, so the result is bit-identical to silu_mul_split (ops_basic.h,
// f32) followed by tc_gemv_f32.
bool tc_gemv_gated_supported(const DeviceLinear& w);
void tc_gemv_f32_gated(const float* g, const float* u, int M, const DeviceLinear& w, float* y, bool accumulate,
                       cudaStream_t stream);

// The k permutation inside a 64-k chunk (part of the arithmetic; the test checks it). The MMA's
// logical k of physical offset p (0..63) in the chunk:
//   FP8 / INT8 (a thread t4 = lane % 4 loads bytes 16·t4 .. 16·t4 + 15 of a row's chunk; word s
//   of that load feeds k16 step s):
//     p = 16·t4 + 4·s + r (r = 0..3)  <->  logical 16·s + 8·(r >> 1) + 2·t4 + (r & 1).
//   bf16 (16 bytes = 8 k: the thread's load h = 0, 1 covers physical 32·h + 8·t4 .. + 7; its
//   words 0, 1 feed step 2h, words 2, 3 step 2h + 1):
//     p = 32·h + 8·t4 + 4·s + r (s = 0, 1)  <->  logical 16·(2h + s) + 8·(r >> 1) + 2·t4 + (r & 1).
// Each is a bijection of 0..63.
__host__ __device__ constexpr int tc_gemv_logical_k(bool bf16, int p) {
  if (!bf16) {
    const int t4 = p >> 4, s = (p >> 2) & 3, r = p & 3;
    return 16 * s + 8 * (r >> 1) + 2 * t4 + (r & 1);
  }
  const int h = p >> 5, t4 = (p >> 3) & 3, s = (p >> 2) & 1, r = p & 3;
  return 16 * (2 * h + s) + 8 * (r >> 1) + 2 * t4 + (r & 1);
}

// The number of K slices S(K) of the arithmetic above and slice j's first block.
__host__ __device__ constexpr int tc_gemv_slices(int blocks) {
  return blocks >= 8 ? 8 : blocks >= 4 ? 4 : blocks >= 2 ? 2 : 1;
}
__host__ __device__ constexpr int tc_gemv_slice_begin(int blocks, int slices, int j) { return j * blocks / slices; }

// Measurement only (bench_kernels --tc-gemv-split): forces the number of warps that split K
// inside a CTA (1, 2, 4 or 8; 0 = chosen by shape; clamped to what the shape allows). Every
// choice gives the same bits.
void set_tc_gemv_split(int warps_over_k);

// Measurement and tests only: forces the kernel form. 0 = chosen by shape; 1 = the stepped form
// with in-CTA staging (x converted per step, one barrier per step); 2 = the lean form (whole x
// staged once, no barrier in the main loop) wherever it applies (M <= 8 and its shared memory
// fits; else stepped); 3 = the stepped form over pre-converted planes (a planes kernel converts x
// once per launch; any M); 4 = the wgmma form (ops_tc_gemv_wgmma.h: sm_90 GPUs, any M; elsewhere 3).
// Every form gives the same bits.
void set_tc_gemv_form(int form);

// Measurement only: whether shape-chosen launches of 9..256 tokens may take the wgmma form on sm_90
// GPUs (true, the default) or keep the mma.sync forms (false). The same bits either way.
void set_tc_gemv_wgmma(bool on);

// Sizes the pre-converted planes workspace (launches of 9 <= M <= 256 tokens) for up to max_M tokens of
// K (both f16 and bf16 planes: 2 x ceil(K/128) x max_M x 528 B) NOW. Call it before capturing a
// CUDA graph: the workspace cannot grow during a capture, and a captured launch that would need a
// larger one falls back to the in-CTA staging (the same bits, slower). Not needed for correctness.
void tc_gemv_reserve(int max_M, int K);

}  // namespace moeserve::cuda
