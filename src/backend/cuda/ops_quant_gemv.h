// Row-tiled matmuls on CUDA cores: Y[M, N] = X[M, K] · Wᵀ with W in GPTQ INT4, FP8
// block-128, INT8 row-wise or BF16 (Dense, and NVFP4 dequantised at load), dequantised in
// registers, fp32 accumulation, and a fixed reduction order per output: a row's result
// never depends on M or on the other rows (batch invariance), for any M (tiles of 16 rows).
// Roofline at decode (M <= 16): bytes(W) / bandwidth. For large M every row tile re-reads
// W (from L2 when the tiles of one weight slice run together) and the FMAs run on CUDA
// cores: this is the batch-invariant baseline, not the prefill kernel (docs/PERF.md).
#pragma once
#include <cuda_runtime.h>

#include <span>
#include <string>

#include "backend/cuda/device_linear.h"

namespace moeserve::cuda {

void quant_gemv(const bf16* x, int M, const DeviceLinear& w, void* y, bool y_f32, bool accumulate,
                cudaStream_t stream);
// The same with f32 activations (the model's path: x is not rounded to bf16). With y_f32 and a
// weight that row_gemv_supported(), this is row_gemv_f32 (below) with one job.
void quant_gemv(const float* x, int M, const DeviceLinear& w, void* y, bool y_f32, bool accumulate,
                cudaStream_t stream);

// Several projections of the same f32 x (q/k/v, gate/up): y_i [M, N_i] f32 = x·W_iᵀ. Weights
// that row_gemv_supported(), of any mix of FP8 / INT8 / bf16 and one K, run as row_gemv_f32
// (one launch per kMaxRowJobs); each output is bit-identical to its own quant_gemv. Anything
// else runs as separate launches.
struct LinearOut {
  const DeviceLinear* w;
  float* y;
};
void quant_gemv_multi(const float* x, int M, std::span<const LinearOut> outs, cudaStream_t stream);

// ---- Row GEMVs of generated tokens over f32 activations (ops_quant_gemv_multi.cu) ----------
// y_i [M, N_i] f32 (=, or += with accumulate) x [M, K] · W_iᵀ for FP8 block-128, INT8
// row-wise and bf16 (Dense / NVFP4) weights with K % 4 == 0, up to kMaxRowJobs jobs of ANY mix
// of these formats (one K, the same x) in ONE launch (more jobs: one launch per kMaxRowJobs).
// Each output is bit-identical to a launch of its job alone, at any M (a row's bits never depend
// on M, on the other rows or jobs, or on the grid): its summation order depends on K only.
// quant_gemv / quant_gemv_multi with f32 x and f32 y, and linear_f32_input(_multi), take this
// path whenever row_gemv_supported(), so all of them give these bits. x (and g, u below): f32
// rows of K, 16-byte aligned base; y must not alias x. Throws when a job is not supported or
// the jobs' K differ. M <= 2 runs a streaming kernel (a warp per 1 or 4 rows over all of K, a
// ring of weight loads in flight), M >= 3 a kernel of token tiles (one weight load serves up to
// 8 tokens); both sum every output in the same order. Layout, summation order (INT8: the row
// scale multiplies the finished sum), parallelisation, roofline: ops_quant_gemv_multi.cu.
constexpr int kMaxRowJobs = 8;
struct RowGemvJob {
  const DeviceLinear* w;
  float* y;
  bool accumulate = false;
};
bool row_gemv_supported(const DeviceLinear& w);
// Measurement only (bench_kernels --gemv-variant): forces the kernel shape of one-token,
// non-gated launches (0 = chosen by shape; 1..17: see launch() in ops_quant_gemv_multi.cu). Every
// shape gives the same bits.
void set_row_gemv_one_token_variant(int v);
// Measurement: whether the one/two-token streaming kernel (lean feed) issues its first weight loads
// before griddepcontrol.wait (true, the default: they overlap the previous kernel) or after it. The
// same bits either way. Read at launch time.
void set_row_gemv_early_loads(bool early);
// The form of the token-tile kernel (every launch of M >= 3, and gated M >= 2 whose tile holds
// two or more tokens), process-wide, for A/B measurements; all give the same bits. 2 (the
// default; docs/PERF.md run S7: q_proj at 8 tokens 36.9 us instead of 60.7, batch 64 decode
// 866.6 tok/s instead of 621.6): form 1 with 8 warps always. 0: row_gemv_f32_kernel (a CTA is
// 8/S row groups x S K-slices, x through L1). 1:
// row_gemv_f32_tiled_smem_kernel (a CTA is 8 or 6 warps x 4 rows over all of K, x staged
// once per CTA in shared memory, one step ahead; weights one step ahead in registers; 6 warps
// where that spreads a short launch more evenly over the SMs). Throws on other values.
// Read at launch time: a captured CUDA graph keeps the form it was captured with.
void set_row_gemv_tiled_variant(int v);
int row_gemv_tiled_variant();
void row_gemv_f32(const float* x, int M, std::span<const RowGemvJob> jobs, cudaStream_t stream);
// y (+)= W · (silu(g) ⊙ u) with g, u f32 [M, K] (the shared expert's down projection without a
// silu_mul launch): bit-identical to silu_mul_split(g, u) followed by row_gemv_f32. Needs
// row_gemv_gated_supported(w) (row_gemv_supported and K <= 11776: a row of silu(g)·u is staged
// in shared memory).
bool row_gemv_gated_supported(const DeviceLinear& w);
void row_gemv_f32_gated(const float* g, const float* u, int M, const DeviceLinear& w, float* y, bool accumulate,
                        cudaStream_t stream);

// How the M <= 2 streaming kernel (row_gemv_f32 and row_gemv_f32_gated at one or two tokens)
// feeds its weights, process-wide, for A/B measurements in one binary; both feeds give the
// same bits. Lean (the default): the register ring with lean addressing (running pointers,
// immediate offsets, no bounds tests) where K % 512 == 0, else Registers; the tiled kernel (M >=
// 3) takes the lean form too. Registers: a ring of 4-byte loads per lane in registers. Read at
// launch time: a captured CUDA graph keeps the feed it was captured with.
enum class RowGemvFeed { Registers = 0, Lean = 1 };
void set_row_gemv_feed(RowGemvFeed feed);
// "registers" or "lean" (bench flags); throws Error otherwise (also for the removed feeds
// "cp-async" and "bulk").
RowGemvFeed parse_row_gemv_feed(const std::string& name);
RowGemvFeed row_gemv_feed();

// The one- and two-token streaming kernel's form for tall launches (>= 64 rows per SM),
// process-wide, for A/B measurements; both give the same bits (every warp sums whole rows).
// Wide (the default): a one-step weight ring in 80 registers, 3 CTAs per SM (docs/PERF.md run
// S22-2: in_proj 19.0 us instead of 23.1, the INT8 LM head 190 instead of 216, a batch-1 step
// 3.71-3.73 ms instead of 3.94-3.95); at two tokens 2 rows per warp with a two-step ring, also
// 3 CTAs per SM (run S22-5: a batch-2 step 6.32 ms instead of 6.61-6.64). Shape: 4 rows per warp,
// the two-step ring in 128 registers, 2 CTAs per SM. Gated launches and the Registers feed always
// take Shape's form. Read at launch time: a captured CUDA graph keeps the form it was captured with.
enum class RowGemvRows { Shape = 0, Wide = 1 };
void set_row_gemv_rows(RowGemvRows rows);
// "wide" or "shape" (bench flags); throws Error otherwise.
RowGemvRows parse_row_gemv_rows(const std::string& name);
// The streaming kernel's shape for a non-gated launch of M (1 or 2) tokens over jobs with these
// row counts (at most kMaxRowJobs) and this K, under the current settings, on the current GPU
// (tests).
struct RowGemvStreamShape {
  int rows_per_warp, ctas_per_sm, depth;
};
RowGemvStreamShape row_gemv_stream_shape(std::span<const int64_t> job_rows, int M, int K);

}  // namespace moeserve::cuda
