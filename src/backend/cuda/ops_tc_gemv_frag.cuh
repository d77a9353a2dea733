// Register-level pieces of the tc_gemv kernels (ops_tc_gemv.cu; arithmetic in ops_tc_gemv.h):
// the f16 MMA, the exact e4m3 / int8 -> f16 pair conversions of the A operand, the f16 hi/lo
// split of scaled activations (B operand) and the streaming 16-byte weight load. Device code;
// include from .cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace moeserve::cuda::tc_frag {

// c (+)= a · b over one m16n8k16 step, f16 inputs, f32 accumulate. Not volatile: the data
// dependence on c keeps each output's MMA order.
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c = a · b + 0 (a fresh accumulator: the bits of mma_f16 on c = +0.0, the zero as an operand).
__device__ __forceinline__ void mma_f16_zc(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

// The two e4m3 bytes in bits 15..0 of v (low byte first) -> f16x2 (low half first), exactly.
__device__ __forceinline__ uint32_t e4m3x2_lo_to_f16x2(uint32_t v) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v & 0xFFFFu), __NV_E4M3);
  return uint32_t(r.x) | (uint32_t(r.y) << 16);
}
// The two e4m3 bytes in bits 31..16 of v -> f16x2, exactly.
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t v) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v >> 16), __NV_E4M3);
  return uint32_t(r.x) | (uint32_t(r.y) << 16);
}

// INT8: vx = a word of 4 int8 XOR 0x80808080 (each byte q + 128 as unsigned); sel picks two of its
// bytes into bytes 0 and 2 of the result, and bytes 1 and 3 take 0x64 from the constant: the f16
// pair (1024 + q0 + 128, 1024 + q1 + 128) (f16 spacing in [1024, 2048) is 1, so exact), minus
// 1152 in one HSUB2 (exact: the results are integers |q| <= 128). sel 0x5150: bytes 0, 1 of vx;
// 0x5352: bytes 2, 3.
__device__ __forceinline__ uint32_t i8x2_to_f16x2(uint32_t vx, uint32_t sel) {
  const uint32_t v = __byte_perm(vx, 0x64646464u, sel);
  const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&v), __half2(__half(1152.0f), __half(1152.0f)));
  return *reinterpret_cast<const uint32_t*>(&h);
}

// f16 split of an already scaled pair: hi = f16_rn(a), lo = f16_rn(a − hi) (a − hi exact in f32).
__device__ __forceinline__ void split_f16(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 hf = __half22float2(h);
  const __half2 l = __floats2half2_rn(__fsub_rn(a, hf.x), __fsub_rn(b, hf.y));
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// Streaming 16-byte weight load: read once, kept out of L1. volatile: issued where written (before
// the PDL wait; the compiler may not sink it).
__device__ __forceinline__ uint4 ld_stream128(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// 2^e as a float for e in [-126, 127] (exponent arithmetic, exact).
__device__ __forceinline__ float exp2i(int e) { return __uint_as_float(uint32_t(127 + e) << 23); }

}  // namespace moeserve::cuda::tc_frag
