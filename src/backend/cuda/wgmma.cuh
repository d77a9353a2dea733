// Hopper warpgroup MMA (wgmma, PTX ISA 8.0+, sm_90a only) for the prompt-token GEMM of
// ops_mma_gemm_wgmma.cu, the integer-form experts of ops_moe_int_wgmma.cu and tc_gemv's wgmma form
// (ops_tc_gemv_wgmma.cu): the descriptor of a 64-byte-swizzled K-major operand in shared memory,
// the fences and group waits, m64n128k16 bf16, m64nNk32 s8 x s8 / u8 and m64nNk16 f16 / bf16, all
// with A in registers. Device code; include from .cu files only.
// Everything here compiles to nothing (or a trap) outside an sm_90a pass, so the file builds for
// every target; callers keep the sm_90a code behind MOESERVE_WGMMA_ENABLED.
//
// Semantics relied on (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
//   - a warpgroup is 4 consecutive warps (warp % 4 == 0 first); all 128 threads issue each wgmma;
//   - wgmma.fence before the first wgmma and after any other write to its accumulator or A
//     registers; wgmma.commit_group closes a group; wgmma.wait_group N waits until at most N
//     groups are pending. Registers a pending wgmma reads or writes must not be touched before
//     the wait (fence_operand keeps the compiler from moving such accesses across it);
//   - shared memory written by ordinary stores must be made visible to the async proxy
//     (fence.proxy.async.shared::cta) before a wgmma reads it;
//   - A fragment of m64nNk16 in registers: warp w of the warpgroup holds rows 16w .. 16w + 15 in
//     the layout of mma.m16n8k16's A (a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..),
//     a3 = (g+8, 2t+8..); g = lane / 4, t = lane % 4);
//   - accumulator D of m64nN: warp w rows 16w + g and 16w + g + 8; for each n8 block j the four
//     registers 4j .. 4j+3 = (g, 8j+2t), (g, 8j+2t+1), (g+8, 8j+2t), (g+8, 8j+2t+1): mma.m16n8's C
//     layout, block after block.
#pragma once
#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOESERVE_WGMMA_ENABLED 1
#endif

namespace moeserve::cuda::wgmma {

// Descriptor of a K-major bf16 operand tile in shared memory with 64-byte rows (32 k) swizzled
// as CUTLASS's Swizzle<2,4,3> (16-byte chunk c of row r at r·64 + 16·(c ^ ((r >> 1) & 3))), the
// tile starting on a 512-byte boundary: 8-row core groups 512 bytes apart (stride byte offset),
// layout type 2 (64-byte swizzle); the leading byte offset is unused for this layout (1).
// k16 step s of the rows is addressed by adding 32·s bytes to the start address.
__device__ __forceinline__ uint64_t desc_sw64(uint32_t smem_addr) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(512 >> 4) << 32) |
         (uint64_t(2) << 62);
}

// desc_sw64(smem_addr + bytes) from desc_sw64(smem_addr): the start address field (bits 0..13,
// address / 16) plus bytes / 16, one 64-bit add instead of the mask-shift-or chain. Exact when
// bytes % 16 == 0 and smem_addr + bytes < 256 KB (no carry out of the field): every shared-memory
// address of a CTA.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + uint64_t(bytes >> 4); }

__device__ __forceinline__ void fence() {
#if defined(MOESERVE_WGMMA_ENABLED)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit_group() {
#if defined(MOESERVE_WGMMA_ENABLED)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wait_group() {
#if defined(MOESERVE_WGMMA_ENABLED)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Ordinary shared-memory stores -> visible to the wgmma (async proxy) reads after a barrier.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(MOESERVE_WGMMA_ENABLED)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// The 512-byte-aligned start of a kernel's dynamic shared memory (the swizzled operand tiles need
// it; the launches add 512 bytes of slack): returns its generic pointer, sbase its shared address.
__device__ __forceinline__ unsigned char* align_smem_512(unsigned char* raw, uint32_t& sbase) {
  const uint32_t raw_base = uint32_t(__cvta_generic_to_shared(raw));
  const uint32_t pad = (512u - (raw_base & 511u)) & 511u;
  sbase = raw_base + pad;
  return raw + pad;
}

// Pins a register value at this point of the program (no code motion across it).
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(int& r) { asm volatile("" : "+r"(r)::"memory"); }

// D[64 x 128] f32 += A[64 x 16] bf16 (registers, this warp's 16 rows) · B[16 x 128] bf16 (shared
// memory, K-major, desc_b), asynchronously (the caller fences, commits and waits).
__device__ __forceinline__ void mma_m64n128k16_bf16_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc_b) {
#if defined(MOESERVE_WGMMA_ENABLED)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  (void)d, (void)a, (void)desc_b;
  __trap();
#endif
}

// One asm statement per shape, the B type (s8 or u8) spliced into the instruction.
#define MOESERVE_WGMMA_S8_N64(BTYPE)                                                                             \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8." BTYPE " "                                                 \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                  \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                        \
      "{%32, %33, %34, %35}, %36, p;\n}\n"                                                                       \
      :                                                                                                          \
      "+r"(d[0][0]), "+r"(d[0][1]), "+r"(d[0][2]), "+r"(d[0][3]), "+r"(d[1][0]), "+r"(d[1][1]),                  \
      "+r"(d[1][2]), "+r"(d[1][3]), "+r"(d[2][0]), "+r"(d[2][1]), "+r"(d[2][2]), "+r"(d[2][3]),                  \
      "+r"(d[3][0]), "+r"(d[3][1]), "+r"(d[3][2]), "+r"(d[3][3]), "+r"(d[4][0]), "+r"(d[4][1]),                  \
      "+r"(d[4][2]), "+r"(d[4][3]), "+r"(d[5][0]), "+r"(d[5][1]), "+r"(d[5][2]), "+r"(d[5][3]),                  \
      "+r"(d[6][0]), "+r"(d[6][1]), "+r"(d[6][2]), "+r"(d[6][3]), "+r"(d[7][0]), "+r"(d[7][1]),                  \
      "+r"(d[7][2]), "+r"(d[7][3])                                                                               \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
#define MOESERVE_WGMMA_S8_N32(BTYPE)                                                                             \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8." BTYPE " "                                                 \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "                                 \
      "{%16, %17, %18, %19}, %20, p;\n}\n"                                                                       \
      :                                                                                                          \
      "+r"(d[0][0]), "+r"(d[0][1]), "+r"(d[0][2]), "+r"(d[0][3]), "+r"(d[1][0]), "+r"(d[1][1]),                  \
      "+r"(d[1][2]), "+r"(d[1][3]), "+r"(d[2][0]), "+r"(d[2][1]), "+r"(d[2][2]), "+r"(d[2][3]),                  \
      "+r"(d[3][0]), "+r"(d[3][1]), "+r"(d[3][2]), "+r"(d[3][3])                                                 \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

// D[64 x N] s32 (+)= A[64 x 32] s8 (registers: this warp's 16 rows in mma.m16n8k32's A layout, a0 =
// (g, 4t..4t+3), a1 = (g+8, 4t..), a2 = (g, 16+4t..), a3 = (g+8, 16+4t..)) · B[32 x N] (shared memory,
// K-major bytes, desc_b: 64-byte rows in the 64-byte swizzle, a k32 step = +32 bytes), B signed (s8)
// or unsigned (u8); scale_d == 0: D = A·B (the accumulator's old value ignored). N = 32 or 64; d in
// the f32 accumulator layout (this header's first comment). Asynchronous, as mma_m64n128k16_bf16_rs.
template <int N, bool kSignedB>
__device__ __forceinline__ void mma_m64nNk32_s8_rs(int (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc_b,
                                                   int scale_d) {
  static_assert(N == 32 || N == 64, "wgmma s8 shapes used here");
#if defined(MOESERVE_WGMMA_ENABLED)
  if constexpr (N == 64 && kSignedB) {
    MOESERVE_WGMMA_S8_N64("s8");
  } else if constexpr (N == 64) {
    MOESERVE_WGMMA_S8_N64("u8");
  } else if constexpr (kSignedB) {
    MOESERVE_WGMMA_S8_N32("s8");
  } else {
    MOESERVE_WGMMA_S8_N32("u8");
  }
#else
  (void)d, (void)a, (void)desc_b, (void)scale_d;
  __trap();
#endif
}
#undef MOESERVE_WGMMA_S8_N64
#undef MOESERVE_WGMMA_S8_N32

// One asm statement per (N, type): D[64 x N] f32 += A[64 x 16] (registers) · B[16 x N] (shared memory,
// K-major, desc_b), scale-d 1 (the caller zeroes D for a fresh sum: the bits of mma.sync on C = +0).
#define MOESERVE_WGMMA_F16_N16(TYPE)                                                                             \
  asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32." TYPE "." TYPE " "                                   \
               "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, 1, 1, 1, 0;\n"                       \
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),    \
                 "+f"(d[1][2]), "+f"(d[1][3])                                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))
#define MOESERVE_WGMMA_F16_N32(TYPE)                                                                             \
  asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE " "                                   \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "                       \
               "{%16, %17, %18, %19}, %20, 1, 1, 1, 0;\n"                                                       \
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),    \
                 "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),    \
                 "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])                                    \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))
#define MOESERVE_WGMMA_F16_N64(TYPE)                                                                             \
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " "                                   \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                        \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "              \
               "{%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"                                                       \
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),    \
                 "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),    \
                 "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),    \
                 "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),    \
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),    \
                 "+f"(d[7][2]), "+f"(d[7][3])                                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))

// D[64 x N] f32 += A[64 x 16] f16 or bf16 (registers: this warp's 16 rows in mma.m16n8k16's A layout)
// · B[16 x N] of the same type (shared memory, K-major, desc_b: 64-byte rows in the 64-byte swizzle,
// a k16 step = +32 bytes). N = 16, 32 or 64; d in the accumulator layout of this header's first
// comment. Asynchronous, as mma_m64n128k16_bf16_rs.
template <int N, bool kBf16>
__device__ __forceinline__ void mma_m64nNk16_f16_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(N == 16 || N == 32 || N == 64, "wgmma f16 shapes used here");
#if defined(MOESERVE_WGMMA_ENABLED)
  if constexpr (N == 16 && kBf16) {
    MOESERVE_WGMMA_F16_N16("bf16");
  } else if constexpr (N == 16) {
    MOESERVE_WGMMA_F16_N16("f16");
  } else if constexpr (N == 32 && kBf16) {
    MOESERVE_WGMMA_F16_N32("bf16");
  } else if constexpr (N == 32) {
    MOESERVE_WGMMA_F16_N32("f16");
  } else if constexpr (kBf16) {
    MOESERVE_WGMMA_F16_N64("bf16");
  } else {
    MOESERVE_WGMMA_F16_N64("f16");
  }
#else
  (void)d, (void)a, (void)desc_b;
  __trap();
#endif
}
#undef MOESERVE_WGMMA_F16_N16
#undef MOESERVE_WGMMA_F16_N32
#undef MOESERVE_WGMMA_F16_N64

}  // namespace moeserve::cuda::wgmma
