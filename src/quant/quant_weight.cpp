#include "quant/quant_weight.h"

#include "core/error.h"
#include "quant/fp8_block.h"
#include "quant/gptq_int4.h"
#include "quant/int8_rowwise.h"
#include "quant/nvfp4.h"

namespace moeserve::quant {

std::string_view format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Dense: return "dense";
    case WeightFormat::GptqInt4: return "gptq-int4";
    case WeightFormat::Fp8Block: return "fp8-block";
    case WeightFormat::Nvfp4: return "nvfp4";
    case WeightFormat::Int8Rowwise: return "int8-rowwise";
  }
  return "?";
}

const Tensor& QuantWeight::part(const std::string& role) const {
  auto it = parts.find(role);
  MOESERVE_CHECK(it != parts.end(), "weight '{}' ({}) has no '{}' tensor", name, format_name(format), role);
  return it->second;
}

QuantWeight dense_weight(Tensor w, std::string name) {
  MOESERVE_CHECK(w.ndim() == 2, "weight '{}' must be 2-D, got shape {}", name, shape_to_string(w.shape()));
  QuantWeight q;
  q.format = WeightFormat::Dense;
  q.out_features = w.dim(0);
  q.in_features = w.dim(1);
  q.name = std::move(name);
  q.parts["weight"] = std::move(w);
  return q;
}

void QuantWeight::dequantize_rows(int64_t row_begin, int64_t row_end, float* out) const {
  MOESERVE_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= out_features,
                 "dequantize_rows [{}, {}) out of range for '{}' with {} rows", row_begin, row_end, name,
                 out_features);
  switch (format) {
    case WeightFormat::Dense: {
      const Tensor& w = part("weight");
      MOESERVE_CHECK(w.shape() == Shape({out_features, in_features}), "weight '{}': dense tensor {} is not [{}, {}]",
                     name, shape_to_string(w.shape()), out_features, in_features);
      const size_t esize = dtype_size(w.dtype());
      convert_to_f32(w.dtype(), w.bytes() + size_t(row_begin * in_features) * esize, out,
                     size_t((row_end - row_begin) * in_features));
      return;
    }
    case WeightFormat::GptqInt4: return dequantize_gptq_int4_rows(*this, row_begin, row_end, out);
    case WeightFormat::Fp8Block: return dequantize_fp8_block_rows(*this, row_begin, row_end, out);
    case WeightFormat::Nvfp4: return dequantize_nvfp4_rows(*this, row_begin, row_end, out);
    case WeightFormat::Int8Rowwise: return dequantize_int8_rowwise_rows(*this, row_begin, row_end, out);
  }
  fail("weight '{}': unknown weight format {}", name, int(format));
}

size_t QuantWeight::stored_bytes() const {
  size_t total = 0;
  for (const auto& [role, t] : parts) total += t.nbytes();
  return total;
}

}  // namespace moeserve::quant
