// The tests' own packers for the published quantised layouts, written from the format
// descriptions (../shared/spec/qwen35_arch.md section 4) and following the recipes of
// tests/fixtures/make_qwen35_fixtures.py, independent of src/quant. Each returns the packed
// tensors (by on-disk suffix) and the dequantised weight computed here with the format's
// formula, so a test can compare the library against it.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace moeserve::quant::testing {

struct Packed {
  std::map<std::string, Tensor> tensors;  // suffix ("qweight", "weight_scale_inv", ...) -> tensor
  std::vector<float> dequantized;         // W' [N, K] by the format's formula
};

inline Tensor new_tensor(DType dtype, Shape shape) { return Tensor::empty(dtype, std::move(shape)); }

// GPTQ v1 INT4 (fixture script gptq_quantize): sym scale amax/7.5 and zero 8; asym
// scale (max - min)/15 with zero round(-min/scale) in [1, 15]; optional act-order g_idx from
// a random permutation. q = clamp(round(W/s) + z, 0, 15); W' = (q - z) * s.
inline Packed pack_gptq_int4(const std::vector<float>& W, int64_t N, int64_t K, int64_t group, bool sym,
                             bool act_order, std::mt19937& rng) {
  const int64_t G = K / group;
  std::vector<int32_t> g_idx(static_cast<size_t>(K));
  if (act_order) {
    std::vector<int64_t> perm(static_cast<size_t>(K));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < K; ++i) g_idx[size_t(perm[size_t(i)])] = int32_t(i / group);
  } else {
    for (int64_t k = 0; k < K; ++k) g_idx[size_t(k)] = int32_t(k / group);
  }
  std::vector<uint16_t> scales(size_t(G * N));
  std::vector<int32_t> zeros(size_t(G * N));
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < N; ++n) {
      float lo = 0.0f, hi = 0.0f, amax = 0.0f;
      for (int64_t k = 0; k < K; ++k)
        if (g_idx[size_t(k)] == g) {
          const float w = W[size_t(n * K + k)];
          lo = std::min(lo, w), hi = std::max(hi, w), amax = std::max(amax, std::fabs(w));
        }
      const float s = sym ? std::max(amax / 7.5f, 1e-6f) : std::max((hi - lo) / 15.0f, 1e-6f);
      scales[size_t(g * N + n)] = f32_to_f16(s);
      zeros[size_t(g * N + n)] =
          sym ? 8 : std::clamp(int32_t(std::nearbyint(-lo / f16_to_f32(scales[size_t(g * N + n)]))), 1, 15);
    }
  Packed p;
  Tensor qweight = new_tensor(DType::I32, {K / 8, N});
  std::vector<uint32_t> qw(size_t(K / 8 * N), 0);
  p.dequantized.resize(size_t(N * K));
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t g = g_idx[size_t(k)];
      const float s = f16_to_f32(scales[size_t(g * N + n)]);
      const int32_t z = zeros[size_t(g * N + n)];
      const int32_t q = std::clamp(int32_t(std::nearbyint(W[size_t(n * K + k)] / s)) + z, 0, 15);
      qw[size_t((k / 8) * N + n)] |= uint32_t(q) << (4 * (k % 8));
      p.dequantized[size_t(n * K + k)] = float(q - z) * s;
    }
  std::memcpy(qweight.bytes(), qw.data(), qweight.nbytes());
  Tensor qzeros = new_tensor(DType::I32, {G, N / 8});
  std::vector<uint32_t> qz(size_t(G * (N / 8)), 0);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < N; ++n) qz[size_t(g * (N / 8) + n / 8)] |= uint32_t(zeros[size_t(g * N + n)] - 1) << (4 * (n % 8));
  std::memcpy(qzeros.bytes(), qz.data(), qzeros.nbytes());
  Tensor sc = new_tensor(DType::F16, {G, N});
  std::memcpy(sc.bytes(), scales.data(), sc.nbytes());
  p.tensors = {{"qweight", qweight}, {"qzeros", qzeros}, {"scales", sc}};
  if (act_order) {
    Tensor gi = new_tensor(DType::I32, {K});
    std::memcpy(gi.bytes(), g_idx.data(), gi.nbytes());
    p.tensors["g_idx"] = gi;
  }
  return p;
}

// FP8 block (fixture script fp8_block_quantize): s = amax(block) / 448 in the scale dtype,
// q = e4m3(W / s), W' = float(q) * s.
inline Packed pack_fp8_block(const std::vector<float>& W, int64_t N, int64_t K, int64_t bn, int64_t bk,
                             DType scale_dtype) {
  const int64_t rows = (N + bn - 1) / bn, cols = (K + bk - 1) / bk;
  std::vector<float> s(size_t(rows * cols));
  Tensor scale = new_tensor(scale_dtype, {rows, cols});
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      float amax = 0.0f;
      for (int64_t n = i * bn; n < std::min(N, (i + 1) * bn); ++n)
        for (int64_t k = j * bk; k < std::min(K, (j + 1) * bk); ++k) amax = std::max(amax, std::fabs(W[size_t(n * K + k)]));
      const float v = std::max(amax / 448.0f, 1e-8f);
      if (scale_dtype == DType::BF16) {
        scale.data<uint16_t>()[i * cols + j] = f32_to_bf16(v);
        s[size_t(i * cols + j)] = bf16_to_f32(f32_to_bf16(v));
      } else {
        scale.data<float>()[i * cols + j] = v;
        s[size_t(i * cols + j)] = v;
      }
    }
  Packed p;
  Tensor q = new_tensor(DType::F8_E4M3, {N, K});
  p.dequantized.resize(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const float sv = s[size_t((n / bn) * cols + k / bk)];
      const uint8_t code = f32_to_fp8_e4m3(std::clamp(W[size_t(n * K + k)] / sv, -448.0f, 448.0f));
      q.data<uint8_t>()[n * K + k] = code;
      p.dequantized[size_t(n * K + k)] = fp8_e4m3_to_f32(code) * sv;
    }
  p.tensors = {{"weight", q}, {"weight_scale_inv", scale}};
  return p;
}

inline constexpr float kE2m1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// NVFP4 (fixture script nvfp4_quantize): per-tensor scale from amax, per-16 F8_E4M3 scales,
// nearest E2M1 code (ties to the even code). compressed-tensors: factor = float(scale) /
// global_scale; ModelOpt: factor = float(scale) * scale_2; W' = e2m1 * factor.
inline Packed pack_nvfp4(const std::vector<float>& W, int64_t N, int64_t K, bool modelopt) {
  float amax = 0.0f;
  for (float w : W) amax = std::max(amax, std::fabs(w));
  const float global = 448.0f * 6.0f / amax, scale_2 = amax / (448.0f * 6.0f);
  Packed p;
  Tensor packed = new_tensor(DType::U8, {N, K / 2});
  Tensor scales = new_tensor(DType::F8_E4M3, {N, K / 16});
  p.dequantized.resize(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K / 16; ++j) {
      float gamax = 0.0f;
      for (int64_t i = 0; i < 16; ++i) gamax = std::max(gamax, std::fabs(W[size_t(n * K + j * 16 + i)]));
      const float want = modelopt ? gamax / 6.0f / scale_2 : gamax / 6.0f * global;
      const uint8_t sc = f32_to_fp8_e4m3(std::min(want, 448.0f));
      scales.data<uint8_t>()[n * (K / 16) + j] = sc;
      const float factor = modelopt ? fp8_e4m3_to_f32(sc) * scale_2 : fp8_e4m3_to_f32(sc) / global;
      const float safe = factor == 0.0f ? 1.0f : factor;
      for (int64_t i = 0; i < 16; ++i) {
        const float x = W[size_t(n * K + j * 16 + i)] / safe;
        const float a = std::min(std::fabs(x), 6.0f);
        int best = 0;
        for (int c = 1; c < 8; ++c)
          if (std::fabs(a - kE2m1Values[c]) < std::fabs(a - kE2m1Values[best])) best = c;
        const int code = best | (x < 0 ? 8 : 0);
        const float v = (code & 8) ? -kE2m1Values[code & 7] : kE2m1Values[code & 7];
        p.dequantized[size_t(n * K + j * 16 + i)] = v * factor;
        uint8_t& byte = packed.data<uint8_t>()[n * (K / 2) + (j * 16 + i) / 2];
        byte = uint8_t(byte | (code << (4 * (i % 2))));
      }
    }
  Tensor one = new_tensor(DType::F32, modelopt ? Shape{} : Shape{1});
  one.data<float>()[0] = 1.0f;
  if (modelopt) {
    Tensor s2 = new_tensor(DType::F32, {});
    s2.data<float>()[0] = scale_2;
    p.tensors = {{"weight", packed}, {"weight_scale", scales}, {"weight_scale_2", s2}, {"input_scale", one}};
  } else {
    Tensor g = new_tensor(DType::F32, {1});
    g.data<float>()[0] = global;
    p.tensors = {{"weight_packed", packed}, {"weight_scale", scales}, {"weight_global_scale", g},
                 {"input_global_scale", one}};
  }
  return p;
}

// Normal(0, 1/sqrt(K)) weights.
inline std::vector<float> random_weight(int64_t N, int64_t K, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f / std::sqrt(float(K)));
  std::vector<float> w(size_t(N * K));
  for (float& x : w) x = d(rng);
  return w;
}

}  // namespace moeserve::quant::testing
