// The weight formats of the generated-token GEMV families (row_gemv_f32 in ops_quant_gemv_multi.cu,
// tc_gemv in ops_tc_gemv.cu): one CTA-uniform format code per job, and the dispatch that names each
// kernel's per-format code once. Include from .cu files only.
#pragma once
#include <type_traits>

#include "backend/cuda/device_linear.h"

namespace moeserve::cuda::row_format {

enum : int { kFp8 = 0, kInt8 = 1, kBf16 = 2 };

// The job's format code: FP8 block-128, INT8 row-wise, or bf16 (Dense, and NVFP4 dequantised at load).
inline int fmt_of(const DeviceLinear& w) {
  switch (w.format) {
    case quant::WeightFormat::Fp8Block:
      return kFp8;
    case quant::WeightFormat::Int8Rowwise:
      return kInt8;
    default:
      return kBf16;
  }
}

// Calls body(std::integral_constant<int, F>{}) with the format code F (CTA-uniform: a CTA serves one
// job), so a kernel's per-format code is compiled once per format.
template <typename Body>
__device__ __forceinline__ void with_format(int fmt, Body&& body) {
  switch (fmt) {
    case kFp8:
      body(std::integral_constant<int, kFp8>{});
      break;
    case kInt8:
      body(std::integral_constant<int, kInt8>{});
      break;
    default:
      body(std::integral_constant<int, kBf16>{});
      break;
  }
}

}  // namespace moeserve::cuda::row_format
