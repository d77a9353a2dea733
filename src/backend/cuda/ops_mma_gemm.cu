// Kernels of ops_mma_gemm.h: Y[M, N] f32 = X[M, K] f32 · Wᵀ on bf16 tensor cores
// (mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32; sm_80+, so the same code runs on the H200
// (sm_90) and the DGX Spark (sm_121, <= 99 KB of shared memory per block)). Two kernels:
// mma_gemm_kernel (prefill-sized M: register-staged double buffer, ldmatrix) and
// mma_stream_kernel (small M: a cp.async ring that streams W, optional split-K).
//
// Data layout. x: f32 [M, K] row-major (16-byte aligned rows: K % 16 == 0). W: [N, K] row-major,
// bf16 (DeviceLinear::dense), e4m3 bytes (fp8, with f32 scale [ceil(N/128)][ceil(K/128)]) or
// int8 (with f32 scale[N]). y: f32 [M, N] row-major.
//
// Exact arithmetic of one output (m, n) (ops_mma_gemm.h): K is cut into 1024-wide segments;
// within one, for each k16 step in ascending k, C = mma(hi(x[m, k..k+15]), w[n, k..k+15], C), then
// C = mma(lo(...), w[...], C); FP8 flushes C into a = fma(C, s, a) at every 128-k block boundary
// (BN divides 128, so one scale per CTA and block); the segment values are added in ascending
// order, t = ((0 ⊕ v0) ⊕ v1) ⊕ ...; INT8: y = t ⊗ s[n]; accumulate: y = y_old ⊕ y. A tensor-core
// MMA computes each element of C from that element's row of A, column of B and old value only,
// so C(m, n) sees the same operands in the same order whatever the kernel, the tiling, the
// row's position in its tile, M, the other rows, or which CTA computed which segment: the result
// is bit-identical for every M, MmaTiling and MmaSplitK (batch invariance; chunked prefill equals
// token-by-token decode). Explicit __fmaf_rn / __fmul_rn / __fadd_rn keep the compiler from
// contracting these differently in different instantiations. Every k tile starts a 128-k block
// and a segment only at its first k16 step (BK divides 128), where the previous ones are closed.
//
// mma_gemm_kernel. One CTA per (BM rows of X) x (BN rows of W) output tile; the 1-D grid is
// rasterised in groups of 8 row tiles (all column tiles of a group before the next group), so
// the CTAs resident together share their X and W tiles through L2. A CTA walks all of K in tiles
// of BK:
//   - each thread loads its share of the next k tile from global memory into registers (X as
//     float4, W as 16-byte chunks) before it computes the current one (one tile in flight);
//   - after computing, it converts that share and stores it into the other of two shared-memory
//     buffers: X split into bf16 hi and lo planes, W converted to bf16 (exact for e4m3 / int8);
//     one __syncthreads per k tile separates the buffers' reads and writes;
//   - the warps (WM x WN, warp tile (BM/WM) x (BN/WN)) read fragments with ldmatrix (rows padded
//     to BK + 8 bf16: conflict-free) and issue the MMAs; at segment ends tot ⊕= value in
//     registers (Large FP8: tot in per-thread local memory, touched once per 1024 k, since C, a
//     and tot would not fit the register file together).
// Rows >= M and columns >= N are zero-filled in shared memory and never stored; k16 steps at or
// beyond K are not executed (K % 16 == 0), so a partial last k tile adds nothing.
//
// mma_stream_kernel. One CTA per (BM x BN) output tile and, with split-K, per K segment
// (grid = tiles x split, the row tiles of one column tile adjacent so they share W in L2):
//   - a ring of `stages` shared-memory buffers, filled with cp.async 16-byte copies straight from
//     global memory (no registers): the raw X tile (f32, rows padded to BK + 8 floats) and the raw
//     W tile (bytes as stored, rows padded by 16 bytes); stages - 1 k tiles are in flight while
//     one is computed; one __syncthreads per k tile. Rows >= M / >= N are never copied (the ring
//     is zeroed once), k >= K is never copied nor executed;
//   - fragments are read from the raw tiles with plain shared loads (conflict-free strides) and
//     converted in registers: X pairs split into hi / lo bf16x2, W pairs converted to bf16x2;
//   - split == 1: the CTA walks all of K and adds the segments in registers; split = nseg: the
//     CTA computes one segment and writes its value to the per-device workspace [nseg, M, N]; the
//     last CTA of the tile to arrive (an atomic counter per tile, reset by it) adds the nseg
//     values in ascending order from 0, scales (INT8), accumulates and writes y.
//
// Tilings (all give the same bits; Auto picks by M, and by N for the grid size):
//   Stream16 BM=16,  BN=64,  BK=128, 4 warps (1x4), warp tile 16x16  M <= 16
//   Stream64 BM=64,  BN=128, BK=64,  8 warps (2x4), warp tile 32x32  M <= 64
//   Medium   BM=64,  BN=64,  BK=64,  4 warps (2x2), warp tile 32x32  M > 64 when Large would
//                                                                    launch fewer CTAs than SMs
//   Large    BM=128, BN=128, BK=32,  8 warps (4x2), warp tile 32x64  otherwise
//   Small    BM=16,  BN=32,  BK=128, 4 warps (1x4), warp tile 16x8   (forced only: tests, bench)
// Shared memory: mma_gemm_kernel 2 buffers x (2·BM + BN)·(BK + 8) bf16 = 34.8 / 55.3 / 61.4 KB
// (Small / Medium / Large); mma_stream_kernel stages x (BM·(BK + 8)·4 + BN·(BK·elem + 16)) bytes,
// stages = min(4, what fits 96 KB): Stream16 FP8/INT8 4 x 17.5 KB = 70 KB, bf16 3 x 25.5 KB =
// 76.5 KB; Stream64 FP8/INT8 3 x 28 KB = 84 KB, bf16 2 x 36 KB = 72 KB.
// Split-K (stream tilings): when the tiles are fewer than 2 per SM and K has >= 2 segments
// (e.g. N = 3072, K = 8192 at M <= 16: 48 tiles -> 384 CTAs), if split·M·N floats fit the
// 16 MB workspace.
//
// Roofline. Useful work 2·M·N·K FLOP; the tensor cores execute twice that (hi and lo MMAs) plus
// the zero rows of a partial M tile (a 16-row tile at M = 1 is 1/16 useful). Against the H200's
// dense bf16 peak (~990 TFLOP/s, quoted for wgmma; mma.sync reaches only part of it) the useful
// ceiling is therefore at most ~half. Minimum HBM traffic: W once (N·K·{2,1,1} bytes) + X once
// (M·K·4) + Y (M·N·4, twice with accumulate); X and W tiles are re-read by the other CTAs of their
// row / column from L2. The kernel is weight-bandwidth-bound while
// 4·M·N·K / peak < N·K·elem / bandwidth, i.e. for M below about peak·elem / (4·bandwidth)
// (bf16 weights: ~2x the FP8 / INT8 crossover); above that, compute-bound. Per kernel:
//   - mma_gemm_kernel (Medium / Large, M > 64): compute-bound at prefill sizes; one k tile in
//     flight per CTA, so at small M it cannot keep enough bytes in flight to stream W.
//   - Stream16 (M <= 16): bound by streaming W from HBM once (N·K·elem bytes) at the copy
//     bandwidth, which needs ~bandwidth x latency bytes in flight (Little's law): per CTA
//     (stages - 1) W tiles = 24 KB (FP8 / INT8) or 32 KB (bf16), 2-3 CTAs per SM on the H200,
//     so every SM must get tiles: split-K supplies them for few column tiles. L2 traffic besides
//     W: X re-read once per column tile (M·K·4·N/64 bytes: at M = 16 as many bytes as FP8 W), the
//     split's values 2·split·M·N·4 bytes (small against W at M <= 16).
//   - Stream64 (M <= 64): the same, 16 KB (FP8 / INT8, 2 CTAs per SM) or 16 KB (bf16, 3 CTAs per
//     SM) in flight per CTA; X re-read from L2 once per 128-column tile (M·K·4·N/128: at M = 64
//     twice the FP8 W bytes); FP8 / INT8 turns compute-bound towards M = 64 (crossover above).
#include <cuda_fp8.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_mma_gemm.h"

namespace moeserve::cuda {
namespace {

enum class WKind { Bf16, Fp8, Int8 };

constexpr int kGroupM = 8;  // row tiles per raster group
constexpr int kSegK = 1024;  // K segment (ops_mma_gemm.h)
static_assert(kSegK % 128 == 0, "segments are whole 128-k blocks");

template <int BM_, int BN_, int BK_, int WM_, int WN_, int MinBlocks_>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, kMinBlocks = MinBlocks_;
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kWarpM = BM / WM, kWarpN = BN / WN;  // warp tile
  static constexpr int MI = kWarpM / 16, NI = kWarpN / 8;   // m16 / n8 fragments per warp
  static constexpr int S = BK + 8;                          // bf16 elements per shared-memory row
  static constexpr int kBufElems = (2 * BM + BN) * S;       // X hi, X lo, W
  static constexpr int kSmemBytes = 2 * kBufElems * 2;      // two buffers of bf16
  static_assert(kWarpM % 16 == 0 && kWarpN % 8 == 0, "warp tile");
  static_assert(NI == 1 || NI % 2 == 0, "B fragments are loaded in pairs of n8 tiles");
  static_assert(BK % 32 == 0 && 128 % BK == 0, "k tile: 128-k blocks start at k tiles");
  // Row stride S·2 bytes = 16·(BK/8 + 1): an odd number of 16-byte units, so the 8 row addresses
  // of one ldmatrix 8x8 matrix fall in 8 different 16-byte bank groups.
  static_assert(((BK / 8 + 1) % 2) == 1, "conflict-free padding");
  static_assert(128 % BN == 0, "one FP8 scale row per CTA");
  static_assert((BM * BK / 4) % kThreads == 0 && (BN * BK / 16) % kThreads == 0, "loader shares");
  static_assert(kSmemBytes <= 99 * 1024, "DGX Spark: <= 99 KB of shared memory per block");
};

using SmallTile = Tile<16, 32, 128, 1, 4, 4>;
using MediumTile = Tile<64, 64, 64, 2, 2, 2>;
using LargeTile = Tile<128, 128, 32, 4, 2, 1>;

// ---- device helpers ---------------------------------------------------------------------------

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

// 16 weight bytes (k ascending) -> 16 bf16 in two uint4 (k .. k+7, k+8 .. k+15).
template <WKind kKind>
__device__ __forceinline__ void convert16(uint4 raw, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[8];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if constexpr (kKind == WKind::Fp8) {
      o[2 * q] = fp8x2_to_bf16x2(w[q]);
      o[2 * q + 1] = fp8x2_to_bf16x2(w[q] >> 16);
    } else {
      o[2 * q] = i8x2_to_bf16x2(w[q]);
      o[2 * q + 1] = i8x2_to_bf16x2(w[q] >> 16);
    }
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t addr, uint32_t (&r)[2]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// c += a · b over one 16x8x16 step (f32 accumulate). Registers only (not volatile: the
// compiler may schedule it; the data dependence on c keeps each output's MMA order).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- the kernel -------------------------------------------------------------------------------

template <class T, WKind kKind>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks)
    mma_gemm_kernel(const float* __restrict__ x, int M, const uint8_t* __restrict__ w, const float* __restrict__ scale,
                    int N, int K, float* __restrict__ y, bool accumulate) {
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, S = T::S, MI = T::MI, NI = T::NI;
  constexpr int kElemBytes = kKind == WKind::Bf16 ? 2 : 1;
  constexpr int kXPerRow = BK / 4;                      // float4 chunks per X row
  constexpr int kXLoads = BM * kXPerRow / T::kThreads;  // per thread per k tile
  constexpr int kWElems = 16 / kElemBytes;              // weights per 16-byte chunk
  constexpr int kWPerRow = BK / kWElems;                // chunks per W row
  constexpr int kWLoads = BN * kWPerRow / T::kThreads;  // per thread per k tile
  static_assert(BM * kXPerRow % T::kThreads == 0 && BN * kWPerRow % T::kThreads == 0, "loader shares");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);
  const uint32_t sbase = uint32_t(__cvta_generic_to_shared(smem_raw));

  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / T::WN, warp_n = warp % T::WN;

  // Grouped raster: kGroupM row tiles x all column tiles, row tile fastest inside a group.
  const int mt = (M + BM - 1) / BM, nt = (N + BN - 1) / BN;
  const int pid = int(blockIdx.x), per_group = kGroupM * nt;
  const int first_m = (pid / per_group) * kGroupM;
  const int gsize = min(mt - first_m, kGroupM);
  const int m0 = (first_m + (pid % per_group) % gsize) * BM;
  const int n0 = ((pid % per_group) / gsize) * BN;

  // ---- global -> registers -> shared memory (one k tile in flight) ----
  float4 xr[kXLoads];
  uint4 wr[kWLoads];
  auto load_tile = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kXLoads; ++i) {
      const int c = tid + i * T::kThreads, m = m0 + c / kXPerRow, k = k0 + (c % kXPerRow) * 4;
      xr[i] = m < M && k < K ? __ldg(reinterpret_cast<const float4*>(x + size_t(m) * K + k))
                             : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int i = 0; i < kWLoads; ++i) {
      const int c = tid + i * T::kThreads, n = n0 + c / kWPerRow, k = k0 + (c % kWPerRow) * kWElems;
      wr[i] = n < N && k < K ? __ldg(reinterpret_cast<const uint4*>(w + (size_t(n) * K + k) * kElemBytes))
                             : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  auto store_tile = [&](int buf) {
    bf16* xhi = smem + buf * T::kBufElems;
    bf16* xlo = xhi + BM * S;
    bf16* ws = xlo + BM * S;
#pragma unroll
    for (int i = 0; i < kXLoads; ++i) {
      const int c = tid + i * T::kThreads, r = c / kXPerRow, col = (c % kXPerRow) * 4;
      uint2 hi, lo;
      split2(xr[i].x, xr[i].y, hi.x, lo.x);
      split2(xr[i].z, xr[i].w, hi.y, lo.y);
      *reinterpret_cast<uint2*>(xhi + r * S + col) = hi;
      *reinterpret_cast<uint2*>(xlo + r * S + col) = lo;
    }
#pragma unroll
    for (int i = 0; i < kWLoads; ++i) {
      const int c = tid + i * T::kThreads, r = c / kWPerRow, col = (c % kWPerRow) * kWElems;
      if constexpr (kKind == WKind::Bf16) {
        *reinterpret_cast<uint4*>(ws + r * S + col) = wr[i];
      } else {
        uint4 lo, hi;
        convert16<kKind>(wr[i], lo, hi);
        *reinterpret_cast<uint4*>(ws + r * S + col) = lo;
        *reinterpret_cast<uint4*>(ws + r * S + col + 8) = hi;
      }
    }
  };

  // ---- per-lane ldmatrix addresses (bytes from a plane's start, at k step 0) ----
  // A (x4): matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
  // = the m16n8k16 A fragment a0..a3; lanes 8j..8j+7 address matrix j's rows.
  uint32_t a_off[MI];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
    a_off[mi] =
        uint32_t(((warp_m * T::kWarpM + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * S + (lane >> 4) * 8) * 2);
  // B (W rows = n, k contiguous; x4 covers two n8 tiles): matrices (n 0-7, k 0-7), (n 0-7, k 8-15),
  // (n 8-15, k 0-7), (n 8-15, k 8-15) = b0, b1 of the first tile, b0, b1 of the second.
  constexpr int kBLoads = NI == 1 ? 1 : NI / 2;
  uint32_t b_off[kBLoads];
#pragma unroll
  for (int j = 0; j < kBLoads; ++j)
    b_off[j] = uint32_t(
        ((warp_n * T::kWarpN + j * 16 + (lane & 7) + (NI == 1 ? 0 : (lane >> 4) * 8)) * S + ((lane >> 3) & 1) * 8) * 2);

  float c[MI][NI][4];    // the running MMA accumulator (FP8: of the current 128-k block)
  float acc[MI][NI][4];  // FP8 only: the sum of scaled blocks
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[mi][ni][e] = acc[mi][ni][e] = 0.f;

  // The running total of finished K segments (ops_mma_gemm.h): tot = tot ⊕ segment value.
  // Large FP8 would need a third 64-register array (C, acc, tot) and spill inside the k loop;
  // there tot lives in per-thread local memory (L1), touched once per 1024 k.
  constexpr bool kTotInMemory = kKind == WKind::Fp8 && MI * NI * 4 >= 64;
  using TotT = std::conditional_t<kTotInMemory, volatile float, float>;  // volatile: every access is a load/store
  float tot_store[MI * NI * 4];
  TotT* tot = tot_store;
#pragma unroll
  for (int i = 0; i < MI * NI * 4; ++i) tot[i] = 0.f;

  const int kb_count = (K + 127) / 128;
  auto flush_block = [&](int kb) {  // FP8: acc = fma(C, s, acc); C = 0
    const float s = __ldg(scale + size_t(n0 / 128) * kb_count + kb);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[mi][ni][e] = __fmaf_rn(c[mi][ni][e], s, acc[mi][ni][e]);
          c[mi][ni][e] = 0.f;
        }
  };

  auto end_segment = [&]() {  // tot = tot ⊕ (FP8: acc, else C); that value restarts at 0
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float& v = kKind == WKind::Fp8 ? acc[mi][ni][e] : c[mi][ni][e];
          TotT& t = tot[(mi * NI + ni) * 4 + e];
          t = __fadd_rn(t, v);
          v = 0.f;
        }
  };

  auto compute_tile = [&](int buf, int k0) {
    const uint32_t xhi = sbase + uint32_t(buf * T::kBufElems * 2);
    const uint32_t xlo = xhi + uint32_t(BM * S * 2), ws = xlo + uint32_t(BM * S * 2);
    const int steps = min(BK, K - k0) / 16;
    // 128-k blocks and K segments start at k tiles (BK divides 128): close the previous ones.
    if constexpr (kKind == WKind::Fp8) {
      if (k0 > 0 && (k0 & 127) == 0) flush_block(k0 / 128 - 1);
    }
    if (k0 > 0 && k0 % kSegK == 0) end_segment();
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      if (ks >= steps) break;  // uniform over the CTA
      uint32_t ah[MI][4], al[MI][4], b[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        ldmatrix_x4(xhi + a_off[mi] + ks * 32, ah[mi]);
        ldmatrix_x4(xlo + a_off[mi] + ks * 32, al[mi]);
      }
      if constexpr (NI == 1) {
        ldmatrix_x2(ws + b_off[0] + ks * 32, b[0]);
      } else {
#pragma unroll
        for (int j = 0; j < NI / 2; ++j) {
          uint32_t r[4];
          ldmatrix_x4(ws + b_off[j] + ks * 32, r);
          b[2 * j][0] = r[0], b[2 * j][1] = r[1], b[2 * j + 1][0] = r[2], b[2 * j + 1][1] = r[3];
        }
      }
      // Per output: the hi MMA of this k step, then its lo MMA (all hi first for ILP).
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma_bf16(c[mi][ni], ah[mi], b[ni]);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma_bf16(c[mi][ni], al[mi], b[ni]);
    }
  };

  // ---- main loop: compute buffer kt&1 while tile kt+1 is in flight, then store it ----
  const int kt_count = (K + BK - 1) / BK;
  load_tile(0);
  store_tile(0);
  __syncthreads();
  for (int kt = 0; kt < kt_count; ++kt) {
    const bool more = kt + 1 < kt_count;  // uniform
    if (more) load_tile((kt + 1) * BK);
    compute_tile(kt & 1, kt * BK);
    if (more) store_tile((kt + 1) & 1);  // the buffer every warp finished reading before the last barrier
    __syncthreads();
  }
  if constexpr (kKind == WKind::Fp8) flush_block(kb_count - 1);
  end_segment();

  // ---- epilogue: C fragment element e of (mi, ni) is row g (+8 for e >= 2), column 2t + (e & 1) ----
  const bool vec2 = (N & 1) == 0 && (reinterpret_cast<uintptr_t>(y) & 7) == 0;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + warp_m * T::kWarpM + mi * 16 + (lane >> 2) + h * 8;
        const int n = n0 + warp_n * T::kWarpN + ni * 8 + (lane & 3) * 2;
        if (m >= M || n >= N) continue;
        const bool two = n + 1 < N;
        float v0 = tot[(mi * NI + ni) * 4 + 2 * h];
        float v1 = tot[(mi * NI + ni) * 4 + 2 * h + 1];
        if constexpr (kKind == WKind::Int8) {
          v0 = __fmul_rn(v0, __ldg(scale + n));
          if (two) v1 = __fmul_rn(v1, __ldg(scale + n + 1));
        }
        float* p = y + size_t(m) * N + n;
        if (two && vec2) {
          float2 o = make_float2(v0, v1);
          if (accumulate) {
            const float2 old = *reinterpret_cast<const float2*>(p);
            o = make_float2(__fadd_rn(old.x, v0), __fadd_rn(old.y, v1));
          }
          *reinterpret_cast<float2*>(p) = o;
        } else {
          p[0] = accumulate ? __fadd_rn(p[0], v0) : v0;
          if (two) p[1] = accumulate ? __fadd_rn(p[1], v1) : v1;
        }
      }
}

// ---- the small-M streaming kernel ----------------------------------------------------------------

// Tiling of mma_stream_kernel: BM x BN output tile, BK-wide k tiles, WM x WN warps. A stage of the
// cp.async ring holds the raw X tile (f32, rows padded to BK + 8 floats) and the raw W tile (the
// weight bytes as stored, rows padded by 16 bytes); the number of stages per weight format is the
// most that fits 96 KB (at most 4), so one block fits the DGX Spark's 99 KB.
template <int BM_, int BN_, int BK_, int WM_, int WN_>
struct StreamTile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_;
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kWarpM = BM / WM, kWarpN = BN / WN;
  static constexpr int MI = kWarpM / 16, NI = kWarpN / 8;
  static constexpr int XS = BK + 8;  // floats per X row in shared memory
  static constexpr int kXBytes = BM * XS * 4;
  static constexpr int ws_row(int elem) { return BK * elem + 16; }  // bytes per W row
  static constexpr int stage_bytes(int elem) { return kXBytes + BN * ws_row(elem); }
  static constexpr int stages(int elem) {
    return 96 * 1024 / stage_bytes(elem) < 4 ? 96 * 1024 / stage_bytes(elem) : 4;
  }
  static constexpr int smem_bytes(int elem) { return stages(elem) * stage_bytes(elem); }
  static_assert(kWarpM % 16 == 0 && kWarpN % 8 == 0, "warp tile");
  static_assert(128 % BK == 0 && BK % 16 == 0, "128-k blocks and K segments start at k tiles");
  static_assert(128 % BN == 0, "one FP8 scale row per CTA");
  // X rows: 4·XS bytes ≡ 32 (mod 128), so a half-warp's float2 fragment loads (4 rows x 8 floats)
  // hit 32 distinct banks. W rows: (ws_row / 4) mod 32 ∈ {4, 20}, so the 8 rows x 4 words one
  // fragment load touches are 32 distinct banks. Both strides are multiples of 16 (cp.async).
  static_assert((XS * 4) % 128 == 32, "X padding");
  static_assert((ws_row(1) / 4) % 32 == 4 || (ws_row(1) / 4) % 32 == 20, "W padding (1-byte weights)");
  static_assert((ws_row(2) / 4) % 32 == 4 || (ws_row(2) / 4) % 32 == 20, "W padding (bf16 weights)");
  static_assert(stages(1) >= 2 && stages(2) >= 2, "at least double buffering");
  static_assert(smem_bytes(1) <= 99 * 1024 && smem_bytes(2) <= 99 * 1024, "DGX Spark: <= 99 KB per block");
};

using Stream16Tile = StreamTile<16, 64, 128, 1, 4>;  // M <= 16: warp tile 16 x 16
using Stream64Tile = StreamTile<64, 128, 64, 2, 4>;  // M <= 64: warp tile 32 x 32

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(__cvta_generic_to_global(src))
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Grid: tiles x split CTAs, blockIdx.x = tile·split + segment; tile = n_tile·mt + m_tile (the
// row tiles of one column tile are neighbours: they share the W tile through L2).
// split == 1: the CTA walks all of K, adding the K segments in registers (tot ⊕= value).
// split == nseg: the CTA computes one K segment, writes its value to ws[segment][m][n] (f32,
// [nseg, M, N]), and the last CTA of the tile to finish (counters[tile], reset to 0 by it) adds
// the nseg values in ascending order from 0 and writes y: the same operations as split == 1.
template <class T, WKind kKind>
__global__ void __launch_bounds__(T::kThreads)
    mma_stream_kernel(const float* __restrict__ x, int M, const uint8_t* __restrict__ w,
                      const float* __restrict__ scale, int N, int K, float* __restrict__ y, bool accumulate,
                      int split, float* __restrict__ ws, int* __restrict__ counters) {
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, MI = T::MI, NI = T::NI, XS = T::XS;
  constexpr int kElem = kKind == WKind::Bf16 ? 2 : 1;
  constexpr int WS = T::ws_row(kElem), kStages = T::stages(kElem);
  constexpr int kStageBytes = T::stage_bytes(kElem), kSmemBytes = T::smem_bytes(kElem);
  constexpr int kXChunks = BM * BK / 4;            // 16-byte chunks of an X tile
  constexpr int kWChunks = BN * BK * kElem / 16;   // 16-byte chunks of a W tile
  constexpr int kWChunksPerRow = BK * kElem / 16;
  static_assert(kXChunks % T::kThreads == 0 && kWChunks % T::kThreads == 0, "loader shares");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ int s_last;
  const uint32_t sbase = uint32_t(__cvta_generic_to_shared(smem_raw));

  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / T::WN, warp_n = warp % T::WN;
  const int g = lane >> 2, t4 = lane & 3;  // fragment row group and thread in group

  const int mt = (M + BM - 1) / BM;
  const int seg = int(blockIdx.x) % split, tile = int(blockIdx.x) / split;
  const int m0 = (tile % mt) * BM, n0 = (tile / mt) * BN;
  const int k_begin = split > 1 ? seg * kSegK : 0;
  const int k_end = split > 1 ? min(K, k_begin + kSegK) : K;
  const int ntiles = (k_end - k_begin + BK - 1) / BK;

  // Zero the ring once: rows >= M / >= N are never loaded and stay 0 (their outputs are not
  // stored anyway; this keeps every value the MMAs see defined).
  for (int i = tid; i < kSmemBytes / 16; i += T::kThreads) reinterpret_cast<uint4*>(smem_raw)[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();

  auto load_tile = [&](int stage, int kt) {
    const int k0 = k_begin + kt * BK;
    const uint32_t xs = sbase + uint32_t(stage * kStageBytes), wsm = xs + uint32_t(T::kXBytes);
#pragma unroll
    for (int i = 0; i < kXChunks / T::kThreads; ++i) {
      const int c = tid + i * T::kThreads, r = c / (BK / 4), col = (c % (BK / 4)) * 4;
      const int m = m0 + r, k = k0 + col;
      if (m < M && k < k_end) cp_async16(xs + uint32_t((r * XS + col) * 4), x + size_t(m) * K + k);
    }
#pragma unroll
    for (int i = 0; i < kWChunks / T::kThreads; ++i) {
      const int c = tid + i * T::kThreads, r = c / kWChunksPerRow, cb = (c % kWChunksPerRow) * 16;
      const int n = n0 + r, k = k0 + cb / kElem;
      if (n < N && k < k_end) cp_async16(wsm + uint32_t(r * WS + cb), w + (size_t(n) * K + k) * kElem);
    }
  };

  bool m_active[MI];  // warp-uniform: m16 fragments wholly at or beyond M are skipped
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) m_active[mi] = m0 + warp_m * T::kWarpM + mi * 16 < M;

  float c[MI][NI][4], acc[MI][NI][4], tot[MI][NI][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[mi][ni][e] = acc[mi][ni][e] = tot[mi][ni][e] = 0.f;

  const int kb_count = (K + 127) / 128;
  auto flush_block = [&](int kb) {  // FP8: acc = fma(C, s, acc); C = 0
    const float s = __ldg(scale + size_t(n0 / 128) * kb_count + kb);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[mi][ni][e] = __fmaf_rn(c[mi][ni][e], s, acc[mi][ni][e]);
          c[mi][ni][e] = 0.f;
        }
  };
  auto end_segment = [&]() {  // tot = tot ⊕ (FP8: acc, else C); that value restarts at 0
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float& v = kKind == WKind::Fp8 ? acc[mi][ni][e] : c[mi][ni][e];
          tot[mi][ni][e] = __fadd_rn(tot[mi][ni][e], v);
          v = 0.f;
        }
  };

  // Fragments straight from the raw tiles: A (m16n8k16, row-major) register j holds x[row, k..k+1]
  // with row = g (+8 for j = 1, 3), k = 2·t4 (+8 for j = 2, 3), split into hi and lo here; B
  // register j holds w[n = g, k = 2·t4 (+8 for j = 1) .. +1], converted to bf16 here (exact).
  auto compute_tile = [&](int stage, int k0) {
    const float* xs = reinterpret_cast<const float*>(smem_raw + stage * kStageBytes);
    const unsigned char* wsm = smem_raw + stage * kStageBytes + T::kXBytes;
    const int steps = min(BK, k_end - k0) / 16;
    // 128-k blocks and K segments start at k tiles (BK divides 128): close the previous ones.
    if constexpr (kKind == WKind::Fp8) {
      if (k0 > k_begin && (k0 & 127) == 0) flush_block(k0 / 128 - 1);
    }
    if (k0 > k_begin && k0 % kSegK == 0) end_segment();
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      if (ks >= steps) break;  // uniform over the CTA
      uint32_t ah[MI][4], al[MI][4], b[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        if (!m_active[mi]) continue;
        const float* p = xs + (warp_m * T::kWarpM + mi * 16 + g) * XS + ks * 16 + 2 * t4;
        const float2 v0 = *reinterpret_cast<const float2*>(p);
        const float2 v1 = *reinterpret_cast<const float2*>(p + 8 * XS);
        const float2 v2 = *reinterpret_cast<const float2*>(p + 8);
        const float2 v3 = *reinterpret_cast<const float2*>(p + 8 * XS + 8);
        split2(v0.x, v0.y, ah[mi][0], al[mi][0]);
        split2(v1.x, v1.y, ah[mi][1], al[mi][1]);
        split2(v2.x, v2.y, ah[mi][2], al[mi][2]);
        split2(v3.x, v3.y, ah[mi][3], al[mi][3]);
      }
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const unsigned char* p = wsm + (warp_n * T::kWarpN + ni * 8 + g) * WS + ks * 16 * kElem;
        if constexpr (kKind == WKind::Bf16) {
          b[ni][0] = *reinterpret_cast<const uint32_t*>(p + 4 * t4);
          b[ni][1] = *reinterpret_cast<const uint32_t*>(p + 16 + 4 * t4);
        } else {
          const uint32_t r0 = *reinterpret_cast<const uint16_t*>(p + 2 * t4);
          const uint32_t r1 = *reinterpret_cast<const uint16_t*>(p + 8 + 2 * t4);
          if constexpr (kKind == WKind::Fp8) {
            b[ni][0] = fp8x2_to_bf16x2(r0);
            b[ni][1] = fp8x2_to_bf16x2(r1);
          } else {
            b[ni][0] = i8x2_to_bf16x2(r0);
            b[ni][1] = i8x2_to_bf16x2(r1);
          }
        }
      }
      // Per output: the hi MMA of this k step, then its lo MMA.
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
        if (m_active[mi])
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) mma_bf16(c[mi][ni], ah[mi], b[ni]);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
        if (m_active[mi])
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) mma_bf16(c[mi][ni], al[mi], b[ni]);
    }
  };

  // ---- the cp.async ring: kStages - 1 tiles in flight while one is computed ----
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ntiles) load_tile(s, s);
    cp_async_commit();  // always commit (possibly empty): the group count stays uniform
  }
  for (int kt = 0; kt < ntiles; ++kt) {
    cp_async_wait<kStages - 2>();  // this thread's copies of tile kt have landed
    __syncthreads();               // everyone's have; everyone finished computing tile kt - 1
    const int next = kt + kStages - 1;
    if (next < ntiles) load_tile(next % kStages, next);  // the stage of tile kt - 1
    cp_async_commit();
    compute_tile(kt % kStages, k_begin + kt * BK);
  }
  cp_async_wait<0>();
  if constexpr (kKind == WKind::Fp8) flush_block((k_end - 1) / 128);
  end_segment();

  // ---- epilogue: C fragment element e of (mi, ni) is row g (+8 for e >= 2), column 2·t4 + (e & 1) ----
  if (split > 1) {
    // This segment's value (tot = 0 ⊕ value; the same sum as the value itself in the final adds).
    float* part = ws + size_t(seg) * size_t(M) * size_t(N);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int m = m0 + warp_m * T::kWarpM + mi * 16 + g + (e >> 1) * 8;
          const int n = n0 + warp_n * T::kWarpN + ni * 8 + 2 * t4 + (e & 1);
          if (m < M && n < N) part[size_t(m) * N + n] = tot[mi][ni][e];
        }
    __threadfence();  // the values are visible device-wide before this CTA is counted
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(counters + tile, 1) == split - 1;
    __syncthreads();
    if (!s_last) return;  // uniform over the CTA
    __threadfence();      // the other CTAs' values (read past L1 with __ldcg)
    for (int i = tid; i < BM * BN; i += T::kThreads) {
      const int m = m0 + i / BN, n = n0 + i % BN;
      if (m >= M || n >= N) continue;
      float v = 0.f;
      for (int s = 0; s < split; ++s) v = __fadd_rn(v, __ldcg(ws + (size_t(s) * M + m) * N + n));
      if constexpr (kKind == WKind::Int8) v = __fmul_rn(v, __ldg(scale + n));
      float* p = y + size_t(m) * N + n;
      *p = accumulate ? __fadd_rn(*p, v) : v;
    }
    if (tid == 0) counters[tile] = 0;  // every CTA of the tile has counted: ready for the next launch
    return;
  }
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = m0 + warp_m * T::kWarpM + mi * 16 + g + (e >> 1) * 8;
        const int n = n0 + warp_n * T::kWarpN + ni * 8 + 2 * t4 + (e & 1);
        if (m >= M || n >= N) continue;
        float v = tot[mi][ni][e];
        if constexpr (kKind == WKind::Int8) v = __fmul_rn(v, __ldg(scale + n));
        float* p = y + size_t(m) * N + n;
        *p = accumulate ? __fadd_rn(*p, v) : v;
      }
}

// ---- host side --------------------------------------------------------------------------------

int current_device() {
  int dev = 0;
  MOESERVE_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

int sm_count() {  // of the current device, cached per device
  static std::atomic<int> cache[64] = {};
  const int dev = current_device();
  if (dev < 64 && cache[dev].load() > 0) return cache[dev].load();
  int n = 0;
  MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  if (dev < 64) cache[dev].store(n);
  return n;
}

// Opts a kernel in to > 48 KB of dynamic shared memory, once per device (a static per kernel).
template <auto kKernel, int kBytes>
void ensure_opt_in() {
  if constexpr (kBytes > 48 * 1024) {
    static std::atomic<uint64_t> done{0};
    const int dev = current_device();
    const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
    if (!bit || !(done.load() & bit)) {
      MOESERVE_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
      done.fetch_or(bit);
    }
  }
}

template <class T, WKind kKind>
void ensure_smem_opt_in() {
  ensure_opt_in<mma_gemm_kernel<T, kKind>, T::kSmemBytes>();
}

template <class T, WKind kKind>
void ensure_stream_opt_in() {
  ensure_opt_in<mma_stream_kernel<T, kKind>, T::smem_bytes(kKind == WKind::Bf16 ? 2 : 1)>();
}

template <class T>
void ensure_smem_opt_in_all_kinds() {
  ensure_smem_opt_in<T, WKind::Bf16>();
  ensure_smem_opt_in<T, WKind::Fp8>();
  ensure_smem_opt_in<T, WKind::Int8>();
}

template <class T>
void ensure_stream_opt_in_all_kinds() {
  ensure_stream_opt_in<T, WKind::Bf16>();
  ensure_stream_opt_in<T, WKind::Fp8>();
  ensure_stream_opt_in<T, WKind::Int8>();
}

// ---- split-K workspace: one per device, allocated once (mma_gemm_prepare(), or the first call
// that is not inside CUDA-graph capture), never freed. The split path is taken only when its
// values fit (split·M·N floats, one counter per tile); otherwise the kernel walks all of K in
// one CTA, which gives the same bits.
constexpr size_t kSplitFloats = size_t(4) << 20;  // 16 MB of segment values
constexpr int kSplitCounters = 1 << 16;           // tiles

struct SplitWorkspace {
  float* values = nullptr;  // [split, M, N]
  int* counters = nullptr;  // [tiles], 0 between launches
};

std::mutex g_ws_mutex;
SplitWorkspace g_ws[64];

// The current device's workspace, allocated here when missing and `stream` is not capturing
// (nullptr when it cannot be had: the call then does not split).
const SplitWorkspace* split_workspace(cudaStream_t stream, bool may_allocate) {
  const int dev = current_device();
  if (dev >= 64) return nullptr;
  std::lock_guard<std::mutex> lock(g_ws_mutex);
  SplitWorkspace& ws = g_ws[dev];
  if (ws.values) return &ws;
  if (!may_allocate) return nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MOESERVE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  void* values = nullptr;
  void* counters = nullptr;
  MOESERVE_CUDA_CHECK(cudaMalloc(&values, kSplitFloats * sizeof(float)));
  MOESERVE_CUDA_CHECK(cudaMalloc(&counters, size_t(kSplitCounters) * sizeof(int)));
  MOESERVE_CUDA_CHECK(cudaMemsetAsync(counters, 0, size_t(kSplitCounters) * sizeof(int), stream));
  MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream));  // zeroed before any stream's kernel reads them
  ws.counters = static_cast<int*>(counters);
  ws.values = static_cast<float*>(values);
  return &ws;
}

int k_segments(int K) { return (K + kSegK - 1) / kSegK; }

template <class T>
long long stream_tiles(int M, int N) {
  return (long long)((M + T::BM - 1) / T::BM) * ((N + T::BN - 1) / T::BN);
}

// How many CTAs share one tile along K: 1, or every K segment its own CTA when there are fewer
// tiles than 2 waves of one CTA per SM (Auto) and the values fit the workspace.
template <class T>
int stream_split(int M, int N, int K, MmaSplitK mode, bool have_workspace) {
  const int nseg = k_segments(K);
  if (nseg <= 1 || mode == MmaSplitK::Off || !have_workspace) return 1;
  const long long tiles = stream_tiles<T>(M, N);
  if (tiles > kSplitCounters || size_t(nseg) * size_t(M) * size_t(N) > kSplitFloats) return 1;
  if (mode == MmaSplitK::On) return nseg;
  return tiles < 2LL * sm_count() ? nseg : 1;
}

template <class T, WKind kKind>
void launch(const float* x, int M, const uint8_t* w, const float* scale, int N, int K, float* y, bool accumulate,
            cudaStream_t stream) {
  auto* kernel = mma_gemm_kernel<T, kKind>;
  ensure_smem_opt_in<T, kKind>();
  const long long tiles = (long long)((M + T::BM - 1) / T::BM) * ((N + T::BN - 1) / T::BN);
  if (tiles > INT_MAX) throw Error("mma_gemm: too many tiles for the launch grid");
  kernel<<<unsigned(tiles), T::kThreads, T::kSmemBytes, stream>>>(x, M, w, scale, N, K, y, accumulate);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

template <class T, WKind kKind>
void launch_stream(const float* x, int M, const uint8_t* w, const float* scale, int N, int K, float* y,
                   bool accumulate, cudaStream_t stream, MmaSplitK mode) {
  ensure_stream_opt_in<T, kKind>();
  const SplitWorkspace* ws = mode == MmaSplitK::Off ? nullptr : split_workspace(stream, /*may_allocate=*/true);
  const int split = stream_split<T>(M, N, K, mode, ws != nullptr);
  const long long ctas = stream_tiles<T>(M, N) * split;
  if (ctas > INT_MAX) throw Error("mma_gemm: too many tiles for the launch grid");
  constexpr int kBytes = T::smem_bytes(kKind == WKind::Bf16 ? 2 : 1);
  mma_stream_kernel<T, kKind><<<unsigned(ctas), T::kThreads, kBytes, stream>>>(
      x, M, w, scale, N, K, y, accumulate, split, split > 1 ? ws->values : nullptr,
      split > 1 ? ws->counters : nullptr);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_format(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate, cudaStream_t stream) {
  const int N = int(w.N), K = int(w.K);
  switch (w.format) {
    case quant::WeightFormat::Fp8Block:
      launch<T, WKind::Fp8>(x, M, w.fp8.data(), w.scale.data(), N, K, y, accumulate, stream);
      break;
    case quant::WeightFormat::Int8Rowwise:
      launch<T, WKind::Int8>(x, M, reinterpret_cast<const uint8_t*>(w.int8.data()), w.scale.data(), N, K, y, accumulate,
                             stream);
      break;
    default:  // Dense, NVFP4 (bf16 at load)
      launch<T, WKind::Bf16>(x, M, reinterpret_cast<const uint8_t*>(w.dense.data()), nullptr, N, K, y, accumulate,
                             stream);
      break;
  }
}

template <class T>
void launch_stream_format(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate,
                          cudaStream_t stream, MmaSplitK mode) {
  const int N = int(w.N), K = int(w.K);
  switch (w.format) {
    case quant::WeightFormat::Fp8Block:
      launch_stream<T, WKind::Fp8>(x, M, w.fp8.data(), w.scale.data(), N, K, y, accumulate, stream, mode);
      break;
    case quant::WeightFormat::Int8Rowwise:
      launch_stream<T, WKind::Int8>(x, M, reinterpret_cast<const uint8_t*>(w.int8.data()), w.scale.data(), N, K, y,
                                    accumulate, stream, mode);
      break;
    default:  // Dense, NVFP4 (bf16 at load)
      launch_stream<T, WKind::Bf16>(x, M, reinterpret_cast<const uint8_t*>(w.dense.data()), nullptr, N, K, y,
                                    accumulate, stream, mode);
      break;
  }
}

MmaTiling pick_tiling(int M, int N) {
  if (M <= Stream16Tile::BM) return MmaTiling::Stream16;
  if (M <= Stream64Tile::BM) return MmaTiling::Stream64;
  const long long large_tiles =
      (long long)((M + LargeTile::BM - 1) / LargeTile::BM) * ((N + LargeTile::BN - 1) / LargeTile::BN);
  return large_tiles >= sm_count() ? MmaTiling::Large : MmaTiling::Medium;
}

}  // namespace

bool mma_gemm_supported(const DeviceLinear& w) {
  switch (w.format) {
    case quant::WeightFormat::Dense:
    case quant::WeightFormat::Nvfp4:
    case quant::WeightFormat::Fp8Block:
    case quant::WeightFormat::Int8Rowwise:
      return w.K > 0 && w.K % 16 == 0 && w.N > 0 && w.N <= INT_MAX && w.K <= INT_MAX;
    default:
      return false;
  }
}

void mma_gemm(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate, cudaStream_t stream,
              MmaTiling tiling, MmaSplitK split) {
  if (w.K % 16 != 0)
    throw Error("mma_gemm: K = " + std::to_string(w.K) + " is not a multiple of 16 (use quant_gemv for this weight)");
  if (!mma_gemm_supported(w))
    throw Error("mma_gemm: unsupported weight format or shape (supported: bf16, FP8 block, INT8)");
  if (M < 0) throw Error("mma_gemm: negative M");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0) throw Error("mma_gemm: x must be 16-byte aligned");
  if (M == 0) return;
  if (tiling == MmaTiling::Auto) tiling = pick_tiling(M, int(w.N));
  switch (tiling) {
    case MmaTiling::Small:
      launch_format<SmallTile>(x, M, w, y, accumulate, stream);
      break;
    case MmaTiling::Medium:
      launch_format<MediumTile>(x, M, w, y, accumulate, stream);
      break;
    case MmaTiling::Stream16:
      launch_stream_format<Stream16Tile>(x, M, w, y, accumulate, stream, split);
      break;
    case MmaTiling::Stream64:
      launch_stream_format<Stream64Tile>(x, M, w, y, accumulate, stream, split);
      break;
    default:
      launch_format<LargeTile>(x, M, w, y, accumulate, stream);
      break;
  }
}

void mma_gemm(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate, cudaStream_t stream,
              MmaTiling tiling) {
  mma_gemm(x, M, w, y, accumulate, stream, tiling, MmaSplitK::Auto);
}

void mma_gemm(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate, cudaStream_t stream) {
  mma_gemm(x, M, w, y, accumulate, stream, MmaTiling::Auto, MmaSplitK::Auto);
}

int mma_gemm_k_segments(int64_t K) { return K <= 0 ? 0 : int((K + kSegK - 1) / kSegK); }

int mma_gemm_split_segments(int64_t N, int64_t K, int M) {
  if (M <= 0 || N <= 0 || K <= 0 || N > INT_MAX || K > INT_MAX) return 1;
  const bool have = true;  // as decided once the workspace exists (ops_mma_gemm.h)
  switch (pick_tiling(M, int(N))) {
    case MmaTiling::Stream16:
      return stream_split<Stream16Tile>(M, int(N), int(K), MmaSplitK::Auto, have);
    case MmaTiling::Stream64:
      return stream_split<Stream64Tile>(M, int(N), int(K), MmaSplitK::Auto, have);
    default:
      return 1;
  }
}

void mma_gemm_prepare() {
  ensure_smem_opt_in_all_kinds<SmallTile>();
  ensure_smem_opt_in_all_kinds<MediumTile>();
  ensure_smem_opt_in_all_kinds<LargeTile>();
  ensure_stream_opt_in_all_kinds<Stream16Tile>();
  ensure_stream_opt_in_all_kinds<Stream64Tile>();
  split_workspace(nullptr, /*may_allocate=*/true);
}

}  // namespace moeserve::cuda
