// Entry points of ops_small_linear.h (router, DeltaNet a/b, shared-expert gate: N <= a few
// hundred, K = hidden). They run row_gemv_f32 (ops_quant_gemv_multi.cu: layout, summation
// order, parallelisation, roofline), the generated tokens' row GEMV, so these outputs have the
// same bits whether the model computes them here or in one mixed-format launch with the FP8
// projections of the same x. Roofline: N·K·2 bytes of weight per call.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_quant_gemv.h"
#include "backend/cuda/ops_small_linear.h"

namespace moeserve::cuda {

bool small_linear_supported(const DeviceLinear& w) {
  return w.format == quant::WeightFormat::Dense && w.K % 8 == 0 && w.dense.size() == size_t(w.N) * size_t(w.K) &&
         row_gemv_supported(w);
}

void linear_f32_input(const float* x, int M, const DeviceLinear& w, float* y, cudaStream_t stream) {
  const SmallLinearOut one{&w, y};
  linear_f32_input_multi(x, M, std::span<const SmallLinearOut>(&one, 1), stream);
}

void linear_f32_input_multi(const float* x, int M, std::span<const SmallLinearOut> outs, cudaStream_t stream) {
  if (M == 0 || outs.empty()) return;
  bool one_k = true;
  for (const auto& o : outs) {
    if (!small_linear_supported(*o.w)) throw Error("linear_f32_input: needs a dense bf16 weight with K % 8 == 0");
    one_k = one_k && o.w->K == outs[0].w->K;
  }
  if (!one_k) {  // row_gemv_f32 fuses one K only
    for (const auto& o : outs) linear_f32_input(x, M, *o.w, o.y, stream);
    return;
  }
  RowGemvJob jobs[kMaxRowJobs];
  for (size_t b = 0; b < outs.size(); b += kMaxRowJobs) {
    const size_t n = std::min(outs.size() - b, size_t(kMaxRowJobs));
    for (size_t i = 0; i < n; ++i) jobs[i] = RowGemvJob{outs[b + i].w, outs[b + i].y, false};
    row_gemv_f32(x, M, std::span<const RowGemvJob>(jobs, n), stream);
  }
}

}  // namespace moeserve::cuda
