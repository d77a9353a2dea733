#include "core/dtype.h"

#include <array>
#include <cmath>

#include "core/error.h"

namespace moeserve {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeInfo, 11> kDTypes{{
    {DType::BF16, "BF16", 2},
    {DType::F16, "F16", 2},
    {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},
    {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::I8, "I8", 1},
    {DType::U8, "U8", 1},
    {DType::I16, "I16", 2},
    {DType::I32, "I32", 4},
    {DType::I64, "I64", 8},
    {DType::BOOL, "BOOL", 1},
}};
}  // namespace

size_t dtype_size(DType t) { return kDTypes[size_t(t)].size; }
std::string_view dtype_name(DType t) { return kDTypes[size_t(t)].name; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.type;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(mant), -24);  // zero or subnormal
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u |= sign;
    std::memcpy(&f, &u, 4);
    return f;
  }
  uint32_t u;
  if (exp == 31)
    u = sign | 0x7f800000u | (mant << 13);  // inf / nan
  else
    u = sign | ((exp + 112) << 23) | (mant << 13);
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to inf
  if (a < 6.103515625e-05f) {                // subnormal range: multiples of 2^-24
    const float q = std::nearbyint(a * 16777216.0f);  // round-half-even under default mode
    return sign | uint16_t(q);
  }
  // Normal: round mantissa to 10 bits, nearest even.
  uint32_t v = u & 0x7fffffffu;
  v += 0xfffu + ((v >> 13) & 1u);
  const uint32_t exp = (v >> 23) - 112;
  return sign | uint16_t((exp << 10) | ((v >> 13) & 0x3ffu));
}

float fp8_e4m3_to_f32(uint8_t v) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  if (exp == 0xf && mant == 0x7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(float(mant), -9);  // subnormal: mant/8 * 2^-6
  return sign * std::ldexp(1.0f + float(mant) / 8.0f, exp - 7);
}

uint8_t f32_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to max finite
  // Find the nearest representable value by scanning the 127 non-negative finite codes
  // (exact, and fast enough for quantization tools; kernels never call this).
  uint8_t best = 0;
  float best_err = a;
  for (uint8_t c = 1; c <= 0x7e; ++c) {
    const float v = fp8_e4m3_to_f32(c);
    const float err = std::fabs(v - a);
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_err = err;
    }
  }
  return sign | best;
}

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::BF16: {
      auto p = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::F16: {
      auto p = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(p[i]);
      return;
    }
    case DType::F64: {
      auto p = static_cast<const double*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = float(p[i]);
      return;
    }
    case DType::F8_E4M3: {
      auto p = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = fp8_e4m3_to_f32(p[i]);
      return;
    }
    case DType::I8: {
      auto p = static_cast<const int8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = float(p[i]);
      return;
    }
    case DType::U8: {
      auto p = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = float(p[i]);
      return;
    }
    case DType::I16: {
      auto p = static_cast<const int16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = float(p[i]);
      return;
    }
    case DType::I32: {
      auto p = static_cast<const int32_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = float(p[i]);
      return;
    }
    case DType::I64: {
      auto p = static_cast<const int64_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = float(p[i]);
      return;
    }
    case DType::BOOL: {
      auto p = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = p[i] ? 1.0f : 0.0f;
      return;
    }
  }
  fail("convert_to_f32: unsupported dtype {}", int(t));
}

}  // namespace moeserve
