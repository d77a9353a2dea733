#include "quant/gptq_int4.h"

#include <vector>

#include "core/error.h"
#include "quant/format_checks.h"

namespace moeserve::quant {

namespace {

constexpr uint32_t kSymmetricZeroWord = 0x77777777u;  // eight stored nibbles 7: zero 8 (v1)

std::string dims(int64_t a, int64_t b) { return fmt::format("[{}, {}]", a, b); }

// The group of every input row k (g_idx, or k / group_size), checked against the G groups.
const std::vector<int32_t>& groups_of_rows(const QuantWeight& w, int64_t num_groups) {
  thread_local std::vector<int32_t> group;
  const int64_t K = w.in_features;
  group.resize(size_t(K));
  auto it = w.parts.find("g_idx");
  if (it != w.parts.end()) {
    const int32_t* g_idx = it->second.data<int32_t>();
    for (int64_t k = 0; k < K; ++k) {
      MOESERVE_CHECK(g_idx[k] >= 0 && g_idx[k] < num_groups, "weight '{}': g_idx[{}] = {} is outside [0, {})",
                     w.name, k, g_idx[k], num_groups);
      group[size_t(k)] = g_idx[k];
    }
  } else {
    for (int64_t k = 0; k < K; ++k) group[size_t(k)] = int32_t(k / w.group_size);
  }
  return group;
}

}  // namespace

QuantWeight gptq_int4_weight(std::string name, int64_t out_features, int64_t in_features,
                             const GptqInt4Params& params, Tensor qweight, Tensor qzeros, Tensor scales,
                             Tensor g_idx, const PartLabels& labels) {
  const int64_t N = out_features, K = in_features;
  MOESERVE_CHECK(N > 0 && K > 0, "{}: GPTQ INT4 weight of shape [{}, {}]", labels.weight, N, K);
  MOESERVE_CHECK(qweight.defined(), "{}: missing qweight", labels.weight);
  MOESERVE_CHECK(scales.defined(), "{}: has qweight but no scales (GPTQ INT4 needs qweight, scales and qzeros)",
                 labels.weight);
  MOESERVE_CHECK(params.sym || qzeros.defined(),
                 "{}: asymmetric GPTQ INT4 (sym = false) needs qzeros, which the checkpoint does not have",
                 labels.weight);
  MOESERVE_CHECK(K % 8 == 0, "{}: in_features {} is not a multiple of 8, which INT4 packing along K needs",
                 labels.weight, K);
  const int64_t group = params.group_size == -1 ? K : params.group_size;
  MOESERVE_CHECK(group > 0, "{}: group size {} is not positive (or -1 for per-channel)", labels.weight,
                 params.group_size);
  MOESERVE_CHECK(K % group == 0, "{}: group size {} does not divide in_features {}", labels.weight, group, K);
  const int64_t G = K / group;

  check_part_dtype(qweight, {DType::I32}, labels, "qweight");
  check_part_shape(qweight, {K / 8, N}, labels, "qweight",
                   "[K/8, N] = " + dims(K / 8, N) + ": eight 4-bit codes along K per int32");
  check_part_dtype(scales, {DType::F16}, labels, "scales");
  check_part_shape(scales, {G, N}, labels, "scales",
                   "[K/group, N] = " + dims(G, N) + " with group size " + std::to_string(group));
  if (qzeros.defined()) {
    MOESERVE_CHECK(N % 8 == 0, "{}: out_features {} is not a multiple of 8, which qzeros packing along N needs",
                   labels.of("qzeros"), N);
    check_part_dtype(qzeros, {DType::I32}, labels, "qzeros");
    check_part_shape(qzeros, {G, N / 8}, labels, "qzeros",
                     "[K/group, N/8] = " + dims(G, N / 8) + ": eight 4-bit zero points along N per int32");
    if (params.sym) {
      const uint32_t* z = qzeros.data<uint32_t>();
      for (int64_t i = 0; i < qzeros.numel(); ++i)
        MOESERVE_CHECK(z[i] == kSymmetricZeroWord,
                       "{}: quantization_config says sym = true (every zero point 8, words 0x77777777) but word {} "
                       "is 0x{:08x}; the checkpoint is asymmetric or its config is wrong",
                       labels.of("qzeros"), i, z[i]);
    }
  }
  if (g_idx.defined()) {
    check_part_dtype(g_idx, {DType::I32}, labels, "g_idx");
    check_part_shape(g_idx, {K}, labels, "g_idx", "[K]: the group of each input row");
    const int32_t* gi = g_idx.data<int32_t>();
    for (int64_t k = 0; k < K; ++k)
      MOESERVE_CHECK(gi[k] >= 0 && gi[k] < G, "{}: g_idx[{}] = {} is outside [0, {}) (K {} / group size {})",
                     labels.of("g_idx"), k, gi[k], G, K, group);
  }

  QuantWeight w;
  w.format = WeightFormat::GptqInt4;
  w.out_features = N;
  w.in_features = K;
  w.group_size = group;
  w.sym = params.sym;
  w.name = std::move(name);
  w.parts["qweight"] = std::move(qweight);
  w.parts["scales"] = std::move(scales);
  if (qzeros.defined()) w.parts["qzeros"] = std::move(qzeros);
  if (g_idx.defined()) w.parts["g_idx"] = std::move(g_idx);
  return w;
}

void dequantize_gptq_int4_rows(const QuantWeight& w, int64_t row_begin, int64_t row_end, float* out) {
  const int64_t N = w.out_features, K = w.in_features;
  const Tensor& qweight = w.part("qweight");
  const Tensor& scales = w.part("scales");
  // Guards against a hand-built QuantWeight whose parts disagree (gptq_int4_weight checks all).
  MOESERVE_CHECK(w.group_size > 0 && K % 8 == 0 && K % w.group_size == 0 && qweight.dtype() == DType::I32 &&
                     qweight.shape() == Shape({K / 8, N}) && scales.dtype() == DType::F16 &&
                     scales.shape() == Shape({K / w.group_size, N}),
                 "weight '{}': GPTQ INT4 parts do not match [{}, {}] with group size {}", w.name, N, K, w.group_size);
  const int64_t G = K / w.group_size, rows = row_end - row_begin;
  const std::vector<int32_t>& group = groups_of_rows(w, G);

  // Zero point and fp32 scale of every (group, row) of this row range.
  thread_local std::vector<float> scale;
  thread_local std::vector<int32_t> zero;
  scale.resize(size_t(G * rows));
  zero.assign(size_t(G * rows), 8);
  const uint16_t* s16 = scales.data<uint16_t>();
  const Tensor* qzeros = nullptr;
  if (!w.sym) {
    qzeros = &w.part("qzeros");
    MOESERVE_CHECK(qzeros->dtype() == DType::I32 && qzeros->shape() == Shape({G, N / 8}) && N % 8 == 0,
                   "weight '{}': qzeros does not match [{}, {}]", w.name, G, N / 8);
  }
  for (int64_t j = 0; j < G; ++j)
    for (int64_t n = row_begin; n < row_end; ++n) {
      const size_t at = size_t(j * rows + (n - row_begin));
      scale[at] = f16_to_f32(s16[j * N + n]);
      if (qzeros) {
        const uint32_t word = qzeros->data<uint32_t>()[j * (N / 8) + n / 8];
        zero[at] = int32_t((word >> (4 * (n % 8))) & 0xFu) + 1;  // v1 stores zero − 1
      }
    }

  // Words of qweight are read along N (contiguous), eight codes of k each.
  const uint32_t* qw = qweight.data<uint32_t>();
  for (int64_t kw = 0; kw < K / 8; ++kw)
    for (int64_t n = row_begin; n < row_end; ++n) {
      const uint32_t word = qw[kw * N + n];
      float* row = out + (n - row_begin) * K + kw * 8;
      for (int j = 0; j < 8; ++j) {
        const int64_t at = int64_t(group[size_t(kw * 8 + j)]) * rows + (n - row_begin);
        const int32_t q = int32_t((word >> (4 * j)) & 0xFu);
        row[j] = float(q - zero[size_t(at)]) * scale[size_t(at)];
      }
    }
}

}  // namespace moeserve::quant
