#include "gpu_test_quant.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "quant/quantize_fp8_block.h"

namespace moeserve::gputest {

namespace {

quant::QuantWeight base(quant::WeightFormat format, int64_t N, int64_t K, const std::string& name) {
  quant::QuantWeight w;
  w.format = format;
  w.out_features = N;
  w.in_features = K;
  w.name = name;
  return w;
}

}  // namespace

TestWeight make_dense_bf16(Rng& rng, int64_t N, int64_t K, float scale) {
  TestWeight t;
  t.label = "dense-bf16";
  t.dequant = random_bf16(rng, size_t(N * K), scale);
  Tensor w = Tensor::empty(DType::BF16, {N, K});
  auto* p = w.data<uint16_t>();
  for (size_t i = 0; i < t.dequant.size(); ++i) p[i] = f32_to_bf16(t.dequant[i]);
  t.weight = quant::dense_weight(std::move(w), "test.dense_bf16");
  return t;
}

TestWeight make_gptq(Rng& rng, int64_t N, int64_t K, int64_t group, bool sym, bool act_order, float scale) {
  if (K % 8 || K % group || N % 8) throw Error("make_gptq: K % 8, K % group and N % 8 must be 0");
  const int64_t G = K / group;
  TestWeight t;
  t.label = std::string("gptq-int4 g") + std::to_string(group) + (sym ? " sym" : " asym") + (act_order ? " act-order" : "");
  t.weight = base(quant::WeightFormat::GptqInt4, N, K, "test.gptq");
  t.weight.group_size = group;
  t.weight.sym = sym;

  std::vector<int32_t> g_idx(static_cast<size_t>(K));
  if (act_order) {
    std::vector<int32_t> perm(static_cast<size_t>(K));
    std::iota(perm.begin(), perm.end(), 0);
    for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[size_t(rng.integer(0, int64_t(i) - 1))]);
    for (int64_t k = 0; k < K; ++k) g_idx[size_t(k)] = int32_t(perm[size_t(k)] / group);
  } else {
    for (int64_t k = 0; k < K; ++k) g_idx[size_t(k)] = int32_t(k / group);
  }

  Tensor scales = Tensor::empty(DType::F16, {G, N});
  std::vector<float> scale_f32(size_t(G * N));
  for (int64_t i = 0; i < G * N; ++i) {
    const uint16_t h = f32_to_f16(scale * rng.uniform(0.5f, 1.5f));
    scales.data<uint16_t>()[i] = h;
    scale_f32[size_t(i)] = f16_to_f32(h);
  }
  std::vector<int32_t> zero(size_t(G * N), 8);
  if (!sym)
    for (auto& z : zero) z = int32_t(rng.integer(1, 15));
  Tensor qzeros = Tensor::empty(DType::I32, {G, N / 8});
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < N; ++n) {
      const uint32_t stored = uint32_t(zero[size_t(g * N + n)] - 1) & 0xFu;  // GPTQ v1: zero − 1
      auto& word = qzeros.data<uint32_t>()[g * (N / 8) + n / 8];
      word |= stored << (4 * (n % 8));
    }

  Tensor qweight = Tensor::empty(DType::I32, {K / 8, N});
  t.dequant.assign(size_t(N * K), 0.0f);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) {
      const uint32_t q = uint32_t(rng.integer(0, 15));
      qweight.data<uint32_t>()[(k / 8) * N + n] |= q << (4 * (k % 8));
      const int64_t g = g_idx[size_t(k)];
      t.dequant[size_t(n * K + k)] = float(int(q) - zero[size_t(g * N + n)]) * scale_f32[size_t(g * N + n)];
    }
  t.weight.parts["qweight"] = std::move(qweight);
  t.weight.parts["scales"] = std::move(scales);
  t.weight.parts["qzeros"] = std::move(qzeros);
  if (act_order) {
    Tensor gi = Tensor::empty(DType::I32, {K});
    std::copy(g_idx.begin(), g_idx.end(), gi.data<int32_t>());
    t.weight.parts["g_idx"] = std::move(gi);
  }
  return t;
}

TestWeight make_fp8_block(Rng& rng, int64_t N, int64_t K, float scale, bool bf16_scales) {
  const int64_t nb = (N + 127) / 128, kb = (K + 127) / 128;
  TestWeight t;
  t.label = std::string("fp8-block ") + (bf16_scales ? "bf16" : "f32") + " scales";
  t.weight = base(quant::WeightFormat::Fp8Block, N, K, "test.fp8");
  t.weight.group_size = 128;
  const std::vector<float> w = random_f32(rng, size_t(N * K), scale);
  std::vector<float> s(size_t(nb * kb), 0.0f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      float& a = s[size_t((n / 128) * kb + k / 128)];
      a = std::max(a, std::abs(w[size_t(n * K + k)]));
    }
  Tensor scale_t = Tensor::empty(bf16_scales ? DType::BF16 : DType::F32, {nb, kb});
  for (size_t i = 0; i < s.size(); ++i) {
    float v = s[i] > 0 ? s[i] / 448.0f : 1.0f;
    if (bf16_scales) {
      scale_t.data<uint16_t>()[i] = f32_to_bf16(v);
      v = round_bf16(v);
    } else {
      scale_t.data<float>()[i] = v;
    }
    s[i] = v;  // the stored multiplier
  }
  Tensor q = Tensor::empty(DType::F8_E4M3, {N, K});
  t.dequant.resize(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const float sv = s[size_t((n / 128) * kb + k / 128)];
      // quant::round_to_fp8_e4m3 equals core's f32_to_fp8_e4m3 (a scan of all codes; tested in
      // tools-convert) and is ~50x faster: 16 experts at the 122B shape quantise in seconds.
      const uint8_t b = quant::round_to_fp8_e4m3(w[size_t(n * K + k)] / sv);
      q.data<uint8_t>()[n * K + k] = b;
      t.dequant[size_t(n * K + k)] = fp8_e4m3_to_f32(b) * sv;
    }
  t.weight.parts["weight"] = std::move(q);
  t.weight.parts["weight_scale_inv"] = std::move(scale_t);
  return t;
}

TestWeight make_int8_rowwise(Rng& rng, int64_t N, int64_t K, float scale) {
  TestWeight t;
  t.label = "int8-rowwise";
  t.weight = base(quant::WeightFormat::Int8Rowwise, N, K, "test.int8");
  Tensor q = Tensor::empty(DType::I8, {N, K});
  Tensor s = Tensor::empty(DType::F32, {N});
  t.dequant.resize(size_t(N * K));
  for (int64_t n = 0; n < N; ++n) {
    const float sv = scale * rng.uniform(0.5f, 1.5f) / 127.0f;
    s.data<float>()[n] = sv;
    for (int64_t k = 0; k < K; ++k) {
      const int8_t v = int8_t(rng.integer(-127, 127));
      q.data<int8_t>()[n * K + k] = v;
      t.dequant[size_t(n * K + k)] = float(v) * sv;
    }
  }
  t.weight.parts["weight"] = std::move(q);
  t.weight.parts["row_scales"] = std::move(s);
  return t;
}

quant::QuantWeight dense_f32(const std::vector<float>& w, int64_t N, int64_t K, const std::string& name) {
  return quant::dense_weight(Tensor::from_f32(w, {N, K}), name);
}

std::vector<float> abs_values(const std::vector<float>& v) {
  std::vector<float> a(v.size());
  for (size_t i = 0; i < v.size(); ++i) a[i] = std::abs(v[i]);
  return a;
}

}  // namespace moeserve::gputest
