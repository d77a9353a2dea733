// LinearRunner computes Y[M, N] = X[M, K] · Wᵀ for every DeviceLinear format.
// Batch-invariant mode (the default): every format and every M through the row-tiled
// kernels of ops_quant_gemv.h, whose per-output summation order is fixed, so a request's
// tokens do not depend on the batch it shares. Otherwise:
//   Dense bf16      -> cuBLASLt (bf16 in, fp32 accumulate, bf16 or f32 out).
//   GPTQ/FP8/INT8   -> small M: fused dequantising GEMV-style kernels (ops_quant_gemv.h);
//                      large M: dequantise to a bf16 scratch tile, then cuBLASLt
//                      (cuBLASLt picks kernels per M, so rows may differ in the last bits).
// Owns the cuBLASLt handle, its workspace and the dequantisation scratch, all allocated
// once at construction: run() never allocates (CUDA-graph safe).
#pragma once
#include <cublasLt.h>

#include <memory>

#include "backend/cuda/device_linear.h"

namespace moeserve::cuda {

class LinearRunner {
 public:
  // max_dense_elems: the largest N*K of any non-dense weight that may take the
  // dequantise-then-GEMM path (sizes the scratch).
  explicit LinearRunner(size_t max_dense_elems, bool batch_invariant = true);
  ~LinearRunner();
  LinearRunner(const LinearRunner&) = delete;
  LinearRunner& operator=(const LinearRunner&) = delete;

  // y: bf16 [M, N] or f32 [M, N] (y_f32). With accumulate, y (f32 only) += X·Wᵀ.
  void run(const bf16* x, int M, const DeviceLinear& w, void* y, bool y_f32, cudaStream_t stream,
           bool accumulate = false);
  // f32 activations (the model's path): always the row-tiled kernels, in either mode (with an
  // f32 output and an FP8 / INT8 / bf16 weight: row_gemv_f32, ops_quant_gemv.h).
  void run(const float* x, int M, const DeviceLinear& w, void* y, bool y_f32, cudaStream_t stream,
           bool accumulate = false);

  // Largest M for which quantised weights use the fused small-M kernels.
  static constexpr int kSmallM = 16;

 private:
  void gemm_bf16(const bf16* x, int M, const bf16* w, int N, int K, void* y, bool y_f32, bool accumulate,
                 cudaStream_t stream);
  bool batch_invariant_ = true;
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer<uint8_t> workspace_;
  DeviceBuffer<bf16> scratch_;
};

// Dequantises any non-dense DeviceLinear into bf16 [N, K] (exact up to bf16 rounding).
void dequantize_to_bf16(const DeviceLinear& w, bf16* out, cudaStream_t stream);

}  // namespace moeserve::cuda
