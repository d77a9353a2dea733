// The activation side of tc_gemv's arithmetic (ops_tc_gemv.h), shared by its mma.sync kernels
// (ops_tc_gemv.cu) and its wgmma form (ops_tc_gemv_wgmma.cu) so that both stage the same bits:
// one warp converts one (token, 128-k block) unit, lane L the 4 physical k 4L .. 4L + 3.
// Device code; include from .cu files only.
#pragma once
#include <cstdint>

#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/ops_tc_gemv_frag.cuh"
#include "backend/cuda/row_weight_format.cuh"

namespace moeserve::cuda::tc_piece {

// ops_basic.cu's silu_mul_value, the same expression (the gated test checks the bits).
__device__ __forceinline__ float silu_mul_value(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

// Lane L's piece of a unit, converted for format F's MMAs: the fragment coordinates (k16 step i8
// of the block, thread t4 of the MMA's B layout) of its four values, the hi / lo pairs (h0, l0: the
// piece's k 4L, 4L + 1 = the B registers' logical k 2·t4, 2·t4 + 1 of step i8; h1, l1: 4L + 2, 4L
// + 3 = logical 8 + 2·t4, +1), and the unit's 2^-P (FP8 / INT8: f16 split of x·2^P with P from the
// warp's max |x|; bf16: bf16 split, 2^-P = 1). The whole warp calls it (a shuffle max).
template <int F>
__device__ __forceinline__ float split_piece(float4 v, int lane, int& i8, int& t4, uint32_t& h0, uint32_t& h1,
                                             uint32_t& l0, uint32_t& l1) {
  using row_format::kBf16;
  const int c = lane >> 4, f = lane & 15;
  t4 = F == kBf16 ? (f & 7) >> 1 : f >> 2;
  i8 = F == kBf16 ? 4 * c + 2 * (f >> 3) + (f & 1) : 4 * c + (f & 3);
  float pinv = 1.0f;
  if constexpr (F == kBf16) {
    mma_frag::split2(v.x, v.y, h0, l0);
    mma_frag::split2(v.z, v.w, h1, l1);
  } else {
    float a = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    const int e = int((__float_as_uint(a) >> 23) & 0xFFu) - 127;  // ilogb(a) for normal a
    const int P = a == 0.0f ? 0 : min(14 - e, 126);               // subnormal a: e = -127 -> clamped
    const float sc = tc_frag::exp2i(P);
    tc_frag::split_f16(__fmul_rn(v.x, sc), __fmul_rn(v.y, sc), h0, l0);
    tc_frag::split_f16(__fmul_rn(v.z, sc), __fmul_rn(v.w, sc), h1, l1);
    pinv = tc_frag::exp2i(-P);
  }
  return pinv;
}

}  // namespace moeserve::cuda::tc_piece
