// float8_e4m3fn decoded to fp32 for all 256 codes (core's fp8_e4m3_to_f32, tabulated once):
// the dequantisers of FP8 and NVFP4 scales read it in their inner loops.
#pragma once
#include <array>

#include "core/dtype.h"

namespace moeserve::quant {

inline const std::array<float, 256>& fp8_e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[size_t(c)] = fp8_e4m3_to_f32(uint8_t(c));
    return t;
  }();
  return table;
}

}  // namespace moeserve::quant
