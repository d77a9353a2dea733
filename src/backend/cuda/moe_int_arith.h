// The integer form of the GPTQ INT4 routed-expert products (moe_routed_experts_int, ops_moe.h):
// the arithmetic every kernel of that form follows, written once for the device kernels and for
// the CPU reference of the tests (plain C++ when not compiled by nvcc).
//
// Why: a product of INT4 weights (exact small integers q - z) with activations quantised to
// 16-bit integers per 128-k block is an EXACT integer per weight group. Exact sums do not depend
// on the order they are added in, so a dp4a kernel on CUDA cores, an s8/u8 mma.sync kernel and a
// CPU loop all give the same integer, and with one fixed f32 fold over the groups, the same bits:
// batch invariance (and prompt == generated tokens) holds across kernel families for free. The
// kernels get cheap: two LOP3 turn a GPTQ word into 8 u8 lanes for dp4a / IMMA, against ~25
// instructions per word for the exact f32 (q - z)·x FMAs of the f32 form.
//
// Definitions (per token row x of length K, K % kKStep == 0; per weight column n):
//   1. Activation blocks b = 0 .. ceil(K/kXBlock) - 1 of kXBlock consecutive k (the last one shorter
//      when K % kXBlock != 0: k from kXBlock·b to min(K, kXBlock·(b + 1)) - 1):
//        amax_b = max |x_k| over the block (exact);
//        amax_b == 0 (or not finite): s_b = 0, inv_b = 0; else s_b = amax_b / kXMax,
//        inv_b = kXMax / amax_b (f32 divisions, round to nearest);
//        X_k = clamp(rint(x_k · inv_b), -kXMax, kXMax) (f32 product rounded to nearest, then to
//        the nearest integer, ties to even): |X_k| <= 32767.
//   2. Units u = 0 .. K/U - 1 of U = min(g, kXBlock) consecutive k, g the GPTQ group size
//      (g % kXBlock == 0 or kXBlock % g == 0, and K % U == 0; a unit never straddles a block or a
//      group; the unit's block is b(u) = U·u / kXBlock):
//        D_u = Σ_{k in u} (q_k - z_u) · X_k, computed EXACTLY in int32
//        (|D_u| <= 128 · 16 · 32767 < 2^26; q in [0, 15]; z = 8 for symmetric GPTQ, else the
//        stored 4-bit zero + 1, in [1, 16], of the unit's group and column).
//      Any split works: e.g. Σ q·X − z·ΣX, or 256·Σ q·hi + Σ q·lo with X = 256·hi + lo,
//      hi = X >> 8 (signed byte), lo = X & 0xFF (unsigned byte): all exact.
//   3. The output, a fixed f32 fold over the units in ascending k from 0:
//        c_u = s_{b(u)} · scale_{g(u), n} (f32 product rounded to nearest; the f16 scale
//        converted exactly), acc = fmaf(float(D_u), c_u, acc) (float(D_u) rounds to nearest;
//        |D_u| may exceed 2^24), y_n = acc after the last unit.
//   4. gate/up: act = silu_mul_rn(gate y, up y) (ops_moe_internal.cuh); down quantises each
//      slot's act row (length I) by 1. and folds by 3.; the combine is combine_routed's
//      (ops_moe.cu): acc = fmaf(w_r, y_r, acc) over ranks r from 0, residual + acc, then
//      fmaf(sigmoid(shared gate logit), shared, ·).
// Precision: X keeps 16 bits relative to its block's largest |x| (error <= amax_b / 65534 per
// element; the f32 form keeps all 24 bits of each x). Checked against the transformers fixtures
// by the model tests.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define MOESERVE_INT_HD __host__ __device__ __forceinline__
#else
#include <cmath>
#define MOESERVE_INT_HD inline
#endif

namespace moeserve::cuda::moe_int {

constexpr int kXBlock = 128;   // activation scale block (k)
constexpr int kXMax = 32767;   // |X| <= kXMax
constexpr int kKStep = 64;     // K (H and I) must be a multiple of it: the dp4a kernels' 64-k items, k32 MMA steps

struct XScale {
  float s;    // X · s ≈ x
  float inv;  // x · inv ≈ X
};

// 1.: the scale pair of a block from its max |x|.
MOESERVE_INT_HD XScale x_scale(float amax) {
#if defined(__CUDA_ARCH__)
  const bool ok = amax > 0.0f && isfinite(amax);
  if (!ok) return {0.0f, 0.0f};
  return {__fdiv_rn(amax, float(kXMax)), __fdiv_rn(float(kXMax), amax)};
#else
  const bool ok = amax > 0.0f && std::isfinite(amax);
  if (!ok) return {0.0f, 0.0f};
  return {amax / float(kXMax), float(kXMax) / amax};
#endif
}

// 1.: X of one element.
MOESERVE_INT_HD int quantize_x(float x, float inv) {
#if defined(__CUDA_ARCH__)
  const int v = __float2int_rn(__fmul_rn(x, inv));
#else
  const float p = x * inv;
  const int v = int(std::nearbyint(p));  // the default rounding mode: to nearest, ties to even
#endif
  return v < -kXMax ? -kXMax : (v > kXMax ? kXMax : v);
}

// The unit length U of 2. for GPTQ group size g (0 when the form does not cover g).
MOESERVE_INT_HD int unit_length(int g) {
  if (g <= 0) return 0;
  if (g >= kXBlock) return g % kXBlock == 0 ? kXBlock : 0;
  return kXBlock % g == 0 ? g : 0;
}

// 3. in parts: a unit's two factors (computable by any thread, in any order) and the ordered step.
MOESERVE_INT_HD float unit_value(int32_t d) {  // float(D_u), rounded to nearest
#if defined(__CUDA_ARCH__)
  return __int2float_rn(d);
#else
  return float(d);
#endif
}
MOESERVE_INT_HD float unit_coef(float s_block, float scale) {  // c_u = s_b · scale, rounded to nearest
#if defined(__CUDA_ARCH__)
  return __fmul_rn(s_block, scale);
#else
  return s_block * scale;
#endif
}
MOESERVE_INT_HD float fold_step(float acc, float value, float coef) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(value, coef, acc);
#else
  return std::fma(value, coef, acc);
#endif
}

// 3.: one fold step.
MOESERVE_INT_HD float fold_unit(float acc, int32_t d, float s_block, float scale) {
  return fold_step(acc, unit_value(d), unit_coef(s_block, scale));
}

}  // namespace moeserve::cuda::moe_int
