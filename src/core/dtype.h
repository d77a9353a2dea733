// Element types of checkpoint tensors and their conversions to fp32.
// Names follow the safetensors spec (BF16, F16, F32, F8_E4M3, I32, I8, U8, I64, ...).
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace moeserve {

enum class DType : uint8_t { BF16, F16, F32, F64, F8_E4M3, I8, U8, I16, I32, I64, BOOL };

// Bytes per element.
size_t dtype_size(DType t);
// The safetensors name ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType t);
// Parses a safetensors dtype name; nullopt when unknown.
std::optional<DType> parse_dtype(std::string_view name);

// bf16: the top 16 bits of an IEEE fp32.
inline float bf16_to_f32(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round-to-nearest-even fp32 -> bf16 (NaN stays NaN), as torch's .to(bfloat16).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
// float8_e4m3fn (OCP FN variant: no infinities, 0x7f/0xff are NaN, max 448).
float fp8_e4m3_to_f32(uint8_t v);
// Round-to-nearest-even with saturation to +-448, as torch's .to(float8_e4m3fn) after clamp.
uint8_t f32_to_fp8_e4m3(float f);

// Converts n elements of type t at src to fp32.
void convert_to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace moeserve
