#include "quant/nvfp4.h"

#include <array>
#include <cmath>

#include "core/error.h"
#include "quant/format_checks.h"
#include "quant/fp8_table.h"
#include "quant/quant_config.h"

namespace moeserve::quant {

namespace {

constexpr std::array<float, 16> kE2m1 = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};


}  // namespace

float e2m1_to_f32(uint8_t code) { return kE2m1[code & 0xFu]; }

QuantWeight nvfp4_weight(std::string name, int64_t out_features, int64_t in_features, Nvfp4Flavour flavour,
                         Tensor packed, Tensor group_scale, Tensor tensor_scale, const PartLabels& labels) {
  const int64_t N = out_features, K = in_features, g = kNvfp4GroupSize;
  const bool ct = flavour == Nvfp4Flavour::CompressedTensors;
  const std::string packed_role = "weight_packed", tensor_role = ct ? "global_scale" : "weight_scale_2";
  MOESERVE_CHECK(N > 0 && K > 0, "{}: NVFP4 weight of shape [{}, {}]", labels.weight, N, K);
  MOESERVE_CHECK(K % g == 0, "{}: in_features {} is not a multiple of 16, which NVFP4 groups need", labels.weight, K);
  MOESERVE_CHECK(group_scale.defined(), "{}: NVFP4 weight without weight_scale (one F8_E4M3 scale per 16 values)",
                 labels.weight);
  MOESERVE_CHECK(tensor_scale.defined(), "{}: NVFP4 weight without {}", labels.weight,
                 ct ? "weight_global_scale" : "weight_scale_2");
  check_part_dtype(packed, {DType::U8}, labels, packed_role);
  check_part_shape(packed, {N, K / 2}, labels, packed_role, fmt::format("[N, K/2] = [{}, {}]: two codes per byte", N, K / 2));
  check_part_dtype(group_scale, {DType::F8_E4M3}, labels, "weight_scale");
  check_part_shape(group_scale, {N, K / g}, labels, "weight_scale",
                   fmt::format("[N, K/16] = [{}, {}]: one scale per 16 values", N, K / g));
  check_part_dtype(tensor_scale, {DType::F32}, labels, tensor_role);
  check_part_scalar(tensor_scale, labels, tensor_role);
  const float s = tensor_scale.data<float>()[0];
  if (ct)
    MOESERVE_CHECK(s > 0.0f, "{}: global scale {} is not positive (the weights are divided by it)",
                   labels.of(tensor_role), s);
  else
    MOESERVE_CHECK(std::isfinite(s), "{}: weight_scale_2 {} is not finite", labels.of(tensor_role), s);

  QuantWeight w;
  w.format = WeightFormat::Nvfp4;
  w.out_features = N;
  w.in_features = K;
  w.group_size = g;
  w.name = std::move(name);
  w.parts[packed_role] = std::move(packed);
  w.parts["weight_scale"] = std::move(group_scale);
  w.parts[tensor_role] = std::move(tensor_scale);
  return w;
}

void dequantize_nvfp4_rows(const QuantWeight& w, int64_t row_begin, int64_t row_end, float* out) {
  const int64_t N = w.out_features, K = w.in_features, g = kNvfp4GroupSize;
  const Tensor& packed = w.part("weight_packed");
  const Tensor& scale = w.part("weight_scale");
  const bool ct = w.has_part("global_scale");
  const Tensor& tensor_scale = w.part(ct ? "global_scale" : "weight_scale_2");
  MOESERVE_CHECK(K % g == 0 && packed.dtype() == DType::U8 && packed.shape() == Shape({N, K / 2}) &&
                     scale.dtype() == DType::F8_E4M3 && scale.shape() == Shape({N, K / g}) &&
                     tensor_scale.dtype() == DType::F32 && tensor_scale.numel() == 1,
                 "weight '{}': NVFP4 parts do not match [{}, {}]", w.name, N, K);
  const float ts = tensor_scale.data<float>()[0];
  const std::array<float, 256>& fp8 = fp8_e4m3_table();
  const uint8_t* codes = packed.data<uint8_t>();
  const uint8_t* scales = scale.data<uint8_t>();
  for (int64_t n = row_begin; n < row_end; ++n) {
    float* dst = out + (n - row_begin) * K;
    for (int64_t j = 0; j < K / g; ++j) {
      const float s = fp8[scales[n * (K / g) + j]];
      const float factor = ct ? s / ts : s * ts;
      const uint8_t* byte = codes + n * (K / 2) + j * (g / 2);
      for (int64_t i = 0; i < g / 2; ++i) {
        dst[j * g + 2 * i] = kE2m1[byte[i] & 0xFu] * factor;
        dst[j * g + 2 * i + 1] = kE2m1[byte[i] >> 4] * factor;
      }
    }
  }
}

}  // namespace moeserve::quant
