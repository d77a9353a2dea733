// Register-level helpers of the bf16 tensor-core kernels (mma.sync.m16n8k16, ldmatrix, cp.async;
// sm_80+, so the H200 (sm_90) and the DGX Spark (sm_121)): the f32 -> bf16 hi/lo split of
// activations, exact weight -> bf16 conversions and the MMA itself, shared by ops_mma_gemm.cu,
// ops_moe_mma.cu and ops_attention_mma.cu (the arithmetic of ops_mma_gemm.h). Device code;
// include from .cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace moeserve::cuda::mma_frag {

__device__ __forceinline__ uint32_t bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }

// hi = bf16_rn(a), lo = bf16_rn(a − hi) for a pair (a, b); a − hi is exact in f32.
__device__ __forceinline__ void split2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  hi = bits(h);
  lo = bits(__floats2bfloat162_rn(__fsub_rn(a, hf.x), __fsub_rn(b, hf.y)));
}

// Two e4m3 bytes (low byte first) -> bf16x2, exactly (e4m3 -> f16 -> f32 -> bf16 are all exact).
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint32_t v) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v & 0xFFFFu), __NV_E4M3);
  return bits(__float22bfloat162_rn(__half22float2(__half2(raw))));
}

// Two int8 bytes (low byte first) -> bf16x2, exactly (|q| <= 128 has <= 8 significant bits).
__device__ __forceinline__ uint32_t i8x2_to_bf16x2(uint32_t v) {
  return bits(__floats2bfloat162_rn(float(int8_t(v & 0xFFu)), float(int8_t((v >> 8) & 0xFFu))));
}

// 16 e4m3 bytes (k ascending) -> 16 bf16 in two uint4 (k .. k+7, k+8 .. k+15).
__device__ __forceinline__ void fp8x16_to_bf16(uint4 raw, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[8];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    o[2 * q] = fp8x2_to_bf16x2(w[q]);
    o[2 * q + 1] = fp8x2_to_bf16x2(w[q] >> 16);
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// One GPTQ word (nibble j = q[k + j], low nibble first) -> the 8 bf16 values q − zero (k ascending),
// exactly: nibble pair (2p, 2p+1) or 0x4300 is the bf16 pair (128 + q) (bf16 spacing at 128 is 1),
// minus the bf16 (128 + zero) gives q − zero, an integer in [−16, 15], exactly.
__device__ __forceinline__ uint4 gptq_word_to_bf16x8(uint32_t word, int zero) {
  const uint32_t z = 0x4300u + uint32_t(zero);  // bf16(128 + zero), zero in [0, 16]
  const uint32_t z2 = z | (z << 16);
  const __nv_bfloat162 zz = *reinterpret_cast<const __nv_bfloat162*>(&z2);
  uint32_t o[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const uint32_t v = ((word >> (8 * p)) & 0xFu) | (((word >> (8 * p + 4)) & 0xFu) << 16) | 0x43004300u;
    o[p] = bits(__hsub2(*reinterpret_cast<const __nv_bfloat162*>(&v), zz));
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t addr, uint32_t (&r)[2]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// One GPTQ word's nibbles 2j, 2j+1 (k = 2j, 2j+1 of the word) -> the bf16 pair (q − zero) exactly;
// zz = the bf16 pair (128 + zero, 128 + zero) (as gptq_word_to_bf16x8, one pair).
__device__ __forceinline__ uint32_t gptq_pair_to_bf16x2(uint32_t word, int j, uint32_t zz) {
  const uint32_t v = ((word >> (8 * j)) & 0xFu) | (((word >> (8 * j + 4)) & 0xFu) << 16) | 0x43004300u;
  return bits(__hsub2(*reinterpret_cast<const __nv_bfloat162*>(&v), *reinterpret_cast<const __nv_bfloat162*>(&zz)));
}

// gptq_pair_to_bf16x2_prmt's per-thread byte selector for nibble pair j (k = 2j, 2j+1 of a word):
// result byte 0 <- byte j of the word (q0 in its low nibble), byte 2 <- byte j of word >> 4 (q1 in
// its low nibble); bytes 1 and 3 take byte 0 of the word (masked away).
__host__ __device__ constexpr uint32_t gptq_pair_selector(int j) { return uint32_t(j) | (uint32_t(4 + j) << 8); }

// The same bits as gptq_pair_to_bf16x2(word, j, zz) with sel = gptq_pair_selector(j): it builds the
// same bf16 pair v = (128 + q0, 128 + q1) (low half first) and subtracts the same zz with the same
// __hsub2, but in three integer instructions (SHF word >> 4, PRMT, LOP3 (x & 0x000F000F) |
// 0x43004300) instead of the variable shifts and masks of the per-nibble form. (One PRMT cannot do
// it without the shift: q1 sits in bits 7..4 of its byte, and bit 7 of a bf16's low byte is an
// exponent bit, so the nibble must move down into the mantissa.)
__device__ __forceinline__ uint32_t gptq_pair_to_bf16x2_prmt(uint32_t word, uint32_t sel, uint32_t zz) {
  const uint32_t v = (__byte_perm(word, word >> 4, sel) & 0x000F000Fu) | 0x43004300u;
  return bits(__hsub2(*reinterpret_cast<const __nv_bfloat162*>(&v), *reinterpret_cast<const __nv_bfloat162*>(&zz)));
}

// GPTQ nibbles 0 and 4 of x (bits 3..0 and 19..16; the caller shifts a word by 4·j to bring nibbles
// j, j + 4 there) -> the bf16 pair (q_j − zero, q_{j+4} − zero), low half first, exactly: (x &
// 0x000F000F) | 0x43004300 is the bf16 pair (128 + q_j, 128 + q_{j+4}) (bf16 spacing at 128 is 1),
// minus zz = the bf16 pair (128 + zero) as gptq_pair_to_bf16x2. magic must hold 0x43004300 in a
// register (pass a value the compiler cannot fold): the mask is LOP3's one immediate, so the AND-OR
// is a single LOP3 (0xEA: (a & b) | c) instead of two. Per pair: one LOP3 + one HSUB2.
__device__ __forceinline__ uint32_t gptq_nibbles_j_j4_to_bf16x2(uint32_t x, uint32_t magic, uint32_t zz) {
  uint32_t v;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(x), "r"(0x000F000Fu), "r"(magic));
  return bits(__hsub2(*reinterpret_cast<const __nv_bfloat162*>(&v), *reinterpret_cast<const __nv_bfloat162*>(&zz)));
}

// The k permutation of the GPTQ "word" MMA form (ops_moe_mma.cu form 3) inside each block of 32
// consecutive k (4 GPTQ words of a column): logical position L = 16·s + 8·h + 2·t + i (k16 step s,
// B register h, MMA thread t = lane % 4, half i of the bf16 pair) holds physical k
// P = 8·t + 4·i + 2·s + h, i.e. nibble j = 2·s + h (+ 4·i) of word t. So thread t's B registers of
// both k16 steps come from its one word t (register (s, h) = nibbles j, j + 4 with j = 2·s + h),
// and the activations are stored with their k at these logical positions (ldmatrix then yields
// the matching A fragments). Physical offset p (0..31) -> logical offset; p + 1 (p even) lands at
// +8 (h 0 -> 1).
__host__ __device__ constexpr int kperm32_logical(int p) { return 8 * (p & 3) + 2 * (p >> 3) + ((p >> 2) & 1); }

// cp.async (sm_80+): 16 bytes (L2 only) or 4 bytes global -> shared, asynchronously; a commit
// closes a group, wait_group<N> waits until at most N of this thread's groups are pending.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(__cvta_generic_to_global(src))
               : "memory");
}
// 16 bytes global -> shared; src_bytes 0 fills the 16 bytes with zeros and reads nothing.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(__cvta_generic_to_global(src)),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(__cvta_generic_to_global(src))
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// c += a · b over one 16x8x16 step (f32 accumulate). Not volatile: the data dependence on c
// keeps each output's MMA order.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const uint32_t b[2] = {b0, b1};
  mma_bf16(c, a, b);
}

// c = a · b + 0 (a fresh accumulator: the same bits as mma_bf16 on a c of +0.0, with the zero
// as the instruction's RZ operand instead of 4 MOVs that clear c first).
__device__ __forceinline__ void mma_bf16_zc(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

}  // namespace moeserve::cuda::mma_frag
