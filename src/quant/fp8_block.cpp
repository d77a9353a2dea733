#include "quant/fp8_block.h"

#include <array>
#include <vector>

#include "core/error.h"
#include "quant/format_checks.h"
#include "quant/fp8_table.h"

namespace moeserve::quant {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

QuantWeight fp8_block_weight(std::string name, int64_t out_features, int64_t in_features, const Fp8BlockShape& block,
                             Tensor weight, Tensor weight_scale_inv, const PartLabels& labels) {
  const int64_t N = out_features, K = in_features;
  MOESERVE_CHECK(N > 0 && K > 0, "{}: FP8 weight of shape [{}, {}]", labels.weight, N, K);
  MOESERVE_CHECK(block.rows > 0 && block.cols > 0, "{}: FP8 block shape [{}, {}] is not positive", labels.weight,
                 block.rows, block.cols);
  MOESERVE_CHECK(weight_scale_inv.defined(),
                 "{}: F8_E4M3 weight without weight_scale_inv (FP8 block format needs one scale per {}x{} block)",
                 labels.weight, block.rows, block.cols);
  check_part_dtype(weight, {DType::F8_E4M3}, labels, "weight");
  check_part_shape(weight, {N, K}, labels, "weight", "[out_features, in_features]");
  check_part_dtype(weight_scale_inv, {DType::BF16, DType::F16, DType::F32}, labels, "weight_scale_inv");
  const int64_t bn = ceil_div(N, block.rows), bk = ceil_div(K, block.cols);
  check_part_shape(weight_scale_inv, {bn, bk}, labels, "weight_scale_inv",
                   "[ceil(N/" + std::to_string(block.rows) + "), ceil(K/" + std::to_string(block.cols) + ")] for W [" +
                       std::to_string(N) + ", " + std::to_string(K) + "]");
  QuantWeight w;
  w.format = WeightFormat::Fp8Block;
  w.out_features = N;
  w.in_features = K;
  w.group_size = block.cols;
  w.block_rows = block.rows;
  w.name = std::move(name);
  w.parts["weight"] = std::move(weight);
  w.parts["weight_scale_inv"] = std::move(weight_scale_inv);
  return w;
}

void dequantize_fp8_block_rows(const QuantWeight& w, int64_t row_begin, int64_t row_end, float* out) {
  const int64_t N = w.out_features, K = w.in_features;
  const Tensor& weight = w.part("weight");
  const Tensor& scale = w.part("weight_scale_inv");
  const int64_t br = w.block_rows > 0 ? w.block_rows : w.group_size, bc = w.group_size;
  MOESERVE_CHECK(br > 0 && bc > 0 && weight.dtype() == DType::F8_E4M3 && weight.shape() == Shape({N, K}) &&
                     scale.shape() == Shape({ceil_div(N, br), ceil_div(K, bc)}),
                 "weight '{}': FP8 block parts do not match [{}, {}] with blocks {}x{}", w.name, N, K, br, bc);
  const int64_t scale_cols = ceil_div(K, bc);
  const std::array<float, 256>& fp8 = fp8_e4m3_table();
  thread_local std::vector<float> row_scales;
  row_scales.resize(size_t(scale_cols));
  const uint8_t* q = weight.data<uint8_t>();
  const size_t scale_size = dtype_size(scale.dtype());
  for (int64_t n = row_begin; n < row_end; ++n) {
    convert_to_f32(scale.dtype(), scale.bytes() + size_t((n / br) * scale_cols) * scale_size, row_scales.data(),
                   size_t(scale_cols));
    const uint8_t* src = q + n * K;
    float* dst = out + (n - row_begin) * K;
    for (int64_t k = 0; k < K; ++k) dst[k] = fp8[src[k]] * row_scales[size_t(k / bc)];
  }
}

}  // namespace moeserve::quant
