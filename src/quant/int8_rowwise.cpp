#include "quant/int8_rowwise.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "quant/format_checks.h"

namespace moeserve::quant {

QuantWeight quantize_int8_rowwise(const QuantWeight& w) {
  const int64_t N = w.out_features, K = w.in_features;
  MOESERVE_CHECK(N > 0 && K > 0, "weight '{}': cannot quantise a weight of shape [{}, {}]", w.name, N, K);
  Tensor q = Tensor::empty(DType::I8, {N, K});
  Tensor scales = Tensor::empty(DType::F32, {N});
  // A few MiB of fp32 rows at a time.
  const int64_t rows_per_chunk = std::max<int64_t>(1, (int64_t(1) << 20) / K);
  std::vector<float> rows;
  for (int64_t r0 = 0; r0 < N; r0 += rows_per_chunk) {
    const int64_t r1 = std::min(N, r0 + rows_per_chunk);
    rows.resize(size_t((r1 - r0) * K));
    w.dequantize_rows(r0, r1, rows.data());
    for (int64_t n = r0; n < r1; ++n) {
      const float* row = rows.data() + (n - r0) * K;
      float amax = 0.0f;
      for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(row[k]));
      MOESERVE_CHECK(std::isfinite(amax), "weight '{}': row {} holds a non-finite value; cannot quantise to INT8",
                     w.name, n);
      const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
      int8_t* dst = q.data<int8_t>() + n * K;
      for (int64_t k = 0; k < K; ++k)
        dst[k] = int8_t(std::clamp(std::round(row[k] / scale), -127.0f, 127.0f));
      scales.data<float>()[n] = scale;
    }
  }
  return int8_rowwise_weight(w.name, std::move(q), std::move(scales), PartLabels::in_memory(w.name));
}

QuantWeight int8_rowwise_weight(std::string name, Tensor weight, Tensor row_scales, const PartLabels& labels) {
  check_part_dtype(weight, {DType::I8}, labels, "weight");
  MOESERVE_CHECK(weight.ndim() == 2 && weight.dim(0) > 0 && weight.dim(1) > 0, "{}: shape {}, expected [N, K]",
                 labels.of("weight"), shape_to_string(weight.shape()));
  const int64_t N = weight.dim(0), K = weight.dim(1);
  check_part_dtype(row_scales, {DType::F32}, labels, "row_scales");
  check_part_shape(row_scales, {N}, labels, "row_scales", "[N]: one scale per output row");
  QuantWeight w;
  w.format = WeightFormat::Int8Rowwise;
  w.out_features = N;
  w.in_features = K;
  w.name = std::move(name);
  w.parts["weight"] = std::move(weight);
  w.parts["row_scales"] = std::move(row_scales);
  return w;
}

void dequantize_int8_rowwise_rows(const QuantWeight& w, int64_t row_begin, int64_t row_end, float* out) {
  const int64_t N = w.out_features, K = w.in_features;
  const Tensor& q = w.part("weight");
  const Tensor& scales = w.part("row_scales");
  MOESERVE_CHECK(q.dtype() == DType::I8 && q.shape() == Shape({N, K}) && scales.dtype() == DType::F32 &&
                     scales.shape() == Shape({N}),
                 "weight '{}': INT8 row-wise parts do not match [{}, {}]", w.name, N, K);
  for (int64_t n = row_begin; n < row_end; ++n) {
    const int8_t* src = q.data<int8_t>() + n * K;
    const float s = scales.data<float>()[n];
    float* dst = out + (n - row_begin) * K;
    for (int64_t k = 0; k < K; ++k) dst[k] = float(src[k]) * s;
  }
}

}  // namespace moeserve::quant
