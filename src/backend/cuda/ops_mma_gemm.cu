// Kernels of ops_mma_gemm.h: Y[M, N] f32 = X[M, K] f32 · Wᵀ on bf16 tensor cores
// (mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, ldmatrix; sm_80+, so the same code runs on
// the H200 (sm_90) and the DGX Spark (sm_121, <= 99 KB of shared memory per block)).
//
// Data layout. x: f32 [M, K] row-major (16-byte aligned rows: K % 16 == 0). W: [N, K] row-major,
// bf16 (DeviceLinear::dense), e4m3 bytes (fp8, with f32 scale [ceil(N/128)][ceil(K/128)]) or
// int8 (with f32 scale[N]). y: f32 [M, N] row-major.
//
// Parallelisation. One CTA per (BM rows of X) x (BN rows of W) output tile; the 1-D grid is
// rasterised in groups of 8 row tiles (all column tiles of a group before the next group), so
// the CTAs resident together share their X and W tiles through L2. A CTA walks K in tiles of BK:
//   - each thread loads its share of the next k tile from global memory into registers (X as
//     float4, W as 16-byte chunks) before it computes the current one (one tile in flight);
//   - after computing, it converts that share and stores it into the other of two shared-memory
//     buffers: X (FP8: first multiplied by the scale of the CTA's 128-column block and the tile's
//     128-k block: BN and BK divide 128) split into bf16 hi and lo planes, W converted to bf16
//     (exact for e4m3 / int8);
//     one __syncthreads per k tile separates the buffers' reads and writes;
//   - the warps (WM x WN, warp tile (BM/WM) x (BN/WN)) read fragments with ldmatrix (rows padded
//     to BK + 8 bf16: conflict-free) and issue the MMAs.
// Rows >= M and columns >= N are zero-filled in shared memory and never stored; k16 steps at or
// beyond K are not executed (K % 16 == 0), so a partial last k tile adds nothing.
//
// Exact arithmetic of one output (m, n) (ops_mma_gemm.h): for each k16 step in ascending k,
// C = mma(hi(x[m, k..k+15]), w[n, k..k+15], C), then C = mma(lo(...), w[...], C). A tensor-core
// MMA computes each element of C from that element's row of A, column of B and old value only,
// so C(m, n) sees the same operands in the same order whatever the tiling, the row's position in
// its tile, M, or the other rows: the result is bit-identical for every M and every MmaTiling
// (batch invariance; chunked prefill equals token-by-token decode). FP8: x' = x ⊗ s before the
// split (s = scale[n/128][k/128], split2_scaled: every kernel scales the same x by the same s),
// C runs over all of K; INT8: y = C ⊗ s[n]; accumulate: y = y_old ⊕ v. Explicit __fmul_rn /
// __fadd_rn keep the compiler from contracting these differently in different instantiations.
//
// Tilings (all give the same bits; picked by M, and by N for the grid size):
//   Small  BM=16,  BN=32,  BK=128, 4 warps (1x4), warp tile 16x8   M <= 16
//   Medium BM=64,  BN=64,  BK=64,  4 warps (2x2), warp tile 32x32  M <= 64, or (Small or Medium,
//                                                                  by pick_tiling's estimate) when
//                                                                  Large would launch fewer CTAs
//                                                                  than SMs / under variant 4 when
//                                                                  estimated faster than wgmma
//   Large  BM=128, BN=128, BK=32,  8 warps (4x2), warp tile 32x64  otherwise, under variant 0
//   LargePipelined: the same tile and warps, a 4-stage cp.async ring, x split in registers
//          (ops_mma_gemm_pipelined.cu)                              otherwise, under variant 1
//   Wide   BM=128, BN=256, BK=32, 8 warps (2x4), warp tile 64x64, a 3-stage cp.async ring
//          (ops_mma_gemm_pipelined.cu)                              variant 2, where
//                                                                   prefer_wide (below) says so,
//                                                                   else LargePipelined
//   LargePipelined2Cta: LargePipelined at <= 128 registers, 2 CTAs per SM on the H200
//                                                                   variant 3 (variant 4 off
//                                                                   sm_90a)
//   Wgmma128 / Wgmma256: BM=128, BN=128 / 256, BK=32, 2 warpgroups of wgmma m64n128k16, a 4-stage
//          cp.async ring (ops_mma_gemm_wgmma.cu; sm_90a)             variant 4 (default), by
//                                                                   wgmma_wide (below)
// Shared memory: 2 buffers x (2·BM + BN)·(BK + 8) bf16 = 34.8 / 55.3 / 61.4 KB (Small / Medium /
// Large); LargePipelined 98,304 B (96 KB) for every weight kind; Wide 98,304 B (bf16) / 90,112 B
// (e4m3 / int8).
//
// Roofline. Useful work 2·M·N·K FLOP; the tensor cores execute twice that (hi and lo MMAs) plus
// the zero rows of a partial M tile (a Small tile at M = 1 is 1/16 useful). Against the H200's
// dense bf16 peak (~990 TFLOP/s, quoted for wgmma; mma.sync measured ~650, bench_mma_peak) the
// useful ceiling is therefore ~325 TFLOP/s. Minimum HBM traffic: W once (N·K·{2,1,1} bytes) + X once
// (M·K·4) + Y (M·N·4, twice with accumulate); X and W tiles are re-read by the other CTAs of their
// row / column from L2. The kernel is weight-bandwidth-bound while
// 4·M·N·K / peak < N·K·elem / bandwidth, i.e. for M below about peak·elem / (4·bandwidth)
// (bf16 weights: ~2x the FP8 / INT8 crossover); above that, compute-bound.
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/ops_mma_gemm.h"
#include "backend/cuda/ops_mma_gemm_common.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace moeserve::cuda {
namespace {

using namespace mma_frag;         // split2, the exact weight conversions, ldmatrix, mma_bf16
using namespace mma_gemm_detail;  // WKind, convert16, split2_scaled, raster, store_fragments

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
  static_assert(BK % 32 == 0, "k tile");
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

  int m0, n0;
  raster(int(blockIdx.x), M, N, BM, BN, m0, n0);

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
  // FP8: this CTA's scale row (BN divides 128: one 128-column block per CTA).
  const int kb_count = (K + 127) / 128;
  const float* scale_row = kKind == WKind::Fp8 ? scale + size_t(n0 / 128) * kb_count : scale;
  auto store_tile = [&](int buf, int k0) {
    // FP8: the tile's k block (BK divides 128: one per tile) scales x before the split.
    const float s = kKind == WKind::Fp8 ? __ldg(scale_row + k0 / 128) : 1.f;
    bf16* xhi = smem + buf * T::kBufElems;
    bf16* xlo = xhi + BM * S;
    bf16* ws = xlo + BM * S;
#pragma unroll
    for (int i = 0; i < kXLoads; ++i) {
      const int c = tid + i * T::kThreads, r = c / kXPerRow, col = (c % kXPerRow) * 4;
      uint2 hi, lo;
      split2_scaled<kKind>(xr[i].x, xr[i].y, s, hi.x, lo.x);
      split2_scaled<kKind>(xr[i].z, xr[i].w, s, hi.y, lo.y);
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

  float c[MI][NI][4];  // the MMA accumulator, over all of K
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[mi][ni][e] = 0.f;

  auto compute_tile = [&](int buf, int k0) {
    const uint32_t xhi = sbase + uint32_t(buf * T::kBufElems * 2);
    const uint32_t xlo = xhi + uint32_t(BM * S * 2), ws = xlo + uint32_t(BM * S * 2);
    const int steps = min(BK, K - k0) / 16;
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
  store_tile(0, 0);
  __syncthreads();
  for (int kt = 0; kt < kt_count; ++kt) {
    const bool more = kt + 1 < kt_count;  // uniform
    if (more) load_tile((kt + 1) * BK);
    compute_tile(kt & 1, kt * BK);
    // The buffer every warp finished reading before the last barrier.
    if (more) store_tile((kt + 1) & 1, (kt + 1) * BK);
    __syncthreads();
  }
  store_fragments<kKind>(c, m0 + warp_m * T::kWarpM, n0 + warp_n * T::kWarpN, lane, M, N, scale, y, accumulate);
}

// ---- host side --------------------------------------------------------------------------------

int sm_count() { return current_device_sm_count(); }

// Opts the kernel in to > 48 KB of dynamic shared memory, once per device.
template <class T, WKind kKind>
void ensure_smem_opt_in() {
  if constexpr (T::kSmemBytes > 48 * 1024) opt_in_dynamic_smem<mma_gemm_kernel<T, kKind>>(T::kSmemBytes);
}

template <class T>
void ensure_smem_opt_in_all_kinds() {
  ensure_smem_opt_in<T, WKind::Bf16>();
  ensure_smem_opt_in<T, WKind::Fp8>();
  ensure_smem_opt_in<T, WKind::Int8>();
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

template <class T>
void launch_format(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate, cudaStream_t stream) {
  const int N = int(w.N), K = int(w.K);
  dispatch_weight_kind(w, [&](auto kind, const uint8_t* wp, const float* scale) {
    launch<T, decltype(kind)::value>(x, M, wp, scale, N, K, y, accumulate, stream);
  });
}

std::atomic<int> g_variant{4};  // set_mma_gemm_variant

// Auto, variant 2: Wide or LargePipelined by an estimate of the time in 128x128-tile units with
// one CTA per SM: a 128x128 grid takes waves(T128) units; a 128x256 grid waves(T256) x 2 units
// divided by the 64x64 warp tile's assumed throughput gain (kWideGainNum / kWideGainDen: fewer
// shared-memory bytes per MMA, an ASSUMPTION to retune from bench_mma_gemm --tiling
// wide / large-pipelined). On 132 SMs: 1,024 tiles of 128x128 = 8 waves vs 512 wide = 4 waves
// (16384 x 3072 at M = 1,024): Wide; 396 tiles = 3 waves vs 198 = 2 waves: LargePipelined (the
// last wide wave would leave 66 SMs idle).
constexpr long long kWideGainNum = 4, kWideGainDen = 3;
bool prefer_wide(int M, int N, int sms) {
  const long long mt = (M + 127) / 128;
  const long long t128 = mt * ((N + 127) / 128), t256 = mt * ((N + 255) / 256);
  const long long w128 = (t128 + sms - 1) / sms, w256 = (t256 + sms - 1) / sms;
  return w256 * 2 * kWideGainDen < w128 * kWideGainNum;  // 2·w256 / gain < w128
}

// Auto, variant 4: for bf16 W, Wgmma256 when its grid (one CTA per SM) fills the SMs at least once
// and takes no more waves than Wgmma128's (two CTAs per SM, each taking about as long as half a
// 256-wide tile; a grid of less than one wave runs faster on the smaller tiles: the router, 256
// columns at M 8K, 81 vs 102 us); FP8 / INT8 W always Wgmma128 (equal or faster at the 122B
// shapes, M 1K and 8K: docs/PERF.md, session 11).
bool wgmma_wide(int M, int N, int sms) {
  const long long mt = (M + 127) / 128;
  const long long t128 = mt * ((N + 127) / 128), t256 = mt * ((N + 255) / 256);
  return t256 >= sms && (t256 + sms - 1) / sms <= (t128 + 2LL * sms - 1) / (2LL * sms);
}

// Prompt GEMMs with few output tiles (M > 64 but a small N: the DeltaNet b / a projections, the
// router, the shared-expert gate, the KV projections, ...) are latency-bound: a CTA walks all of K
// whatever its tile, so the tiling with the shortest k loop can win though it wastes MMA columns.
// Estimated time of a tiling: the longer of its per-CTA k-loop floor (proportional to K) and its
// padded work at its throughput. The constants are the H200's (bench_mma_gemm, docs/PERF.md
// session 11: floors at K 3072 of 26 / 55 / ~82 us, 44 / 95 / ~195 useful TFLOP/s on 132 SMs),
// the throughput scaled by the SM count elsewhere.
struct TilingCost {
  int bm, bn;
  double floor_us_at_3072, tflops_per_sm;
};
constexpr TilingCost kSmallCost{16, 32, 26.0, 44.0 / 132}, kMediumCost{64, 64, 55.0, 95.0 / 132},
    kWgmmaCost{128, 128, 82.0, 195.0 / 132};
double estimated_us(const TilingCost& c, int M, int N, int K, int sms) {
  const double rows = double((M + c.bm - 1) / c.bm) * c.bm, cols = double((N + c.bn - 1) / c.bn) * c.bn;
  const double work_us = 2.0 * rows * cols * K / (c.tflops_per_sm * 1e12 * sms) * 1e6;
  return std::max(c.floor_us_at_3072 * K / 3072.0, work_us);
}

MmaTiling pick_tiling(int M, int N, int K, bool bf16_w) {
  if (M <= SmallTile::BM) return MmaTiling::Small;
  if (M <= MediumTile::BM) return MmaTiling::Medium;
  const long long large_tiles =
      (long long)((M + LargeTile::BM - 1) / LargeTile::BM) * ((N + LargeTile::BN - 1) / LargeTile::BN);
  const int sms = sm_count();
  const int variant = g_variant.load(std::memory_order_relaxed);
  const double small_us = estimated_us(kSmallCost, M, N, K, sms);
  const double medium_us = estimated_us(kMediumCost, M, N, K, sms);
  const MmaTiling few = small_us < medium_us ? MmaTiling::Small : MmaTiling::Medium;
  if (variant == 4 && mma_gemm_wgmma_available()) {
    if (estimated_us(kWgmmaCost, M, N, K, sms) > std::min(small_us, medium_us)) return few;
  } else if (large_tiles < sms) {
    return few;
  }
  switch (variant) {
    case 0:
      return MmaTiling::Large;
    case 1:
      return MmaTiling::LargePipelined;
    case 3:
      return MmaTiling::LargePipelined2Cta;
    case 4:
      if (!mma_gemm_wgmma_available()) return MmaTiling::LargePipelined2Cta;
      return bf16_w && wgmma_wide(M, N, sms) ? MmaTiling::Wgmma256 : MmaTiling::Wgmma128;
    default:
      return prefer_wide(M, N, sms) ? MmaTiling::Wide : MmaTiling::LargePipelined;
  }
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
              MmaTiling tiling) {
  if (w.K % 16 != 0)
    throw Error("mma_gemm: K = " + std::to_string(w.K) + " is not a multiple of 16 (use quant_gemv for this weight)");
  if (!mma_gemm_supported(w))
    throw Error("mma_gemm: unsupported weight format or shape (supported: bf16, FP8 block, INT8)");
  if (M < 0) throw Error("mma_gemm: negative M");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0) throw Error("mma_gemm: x must be 16-byte aligned");
  if (M == 0) return;
  if (tiling == MmaTiling::Auto)  // (dispatch_weight_kind: every other format runs as bf16 W)
    tiling = pick_tiling(M, int(w.N), int(w.K),
                         w.format != quant::WeightFormat::Fp8Block && w.format != quant::WeightFormat::Int8Rowwise);
  switch (tiling) {
    case MmaTiling::Small:
      launch_format<SmallTile>(x, M, w, y, accumulate, stream);
      break;
    case MmaTiling::Medium:
      launch_format<MediumTile>(x, M, w, y, accumulate, stream);
      break;
    case MmaTiling::Large:
      launch_format<LargeTile>(x, M, w, y, accumulate, stream);
      break;
    case MmaTiling::Wide:
      mma_gemm_pipelined_launch(x, M, w, y, accumulate, stream, PipelinedKernel::Wide);
      break;
    case MmaTiling::LargePipelined2Cta:
      mma_gemm_pipelined_launch(x, M, w, y, accumulate, stream, PipelinedKernel::Tile128TwoCtas);
      break;
    case MmaTiling::Wgmma128:
      mma_gemm_wgmma_launch(x, M, w, y, accumulate, stream, 128);
      break;
    case MmaTiling::Wgmma256:
      mma_gemm_wgmma_launch(x, M, w, y, accumulate, stream, 256);
      break;
    default:  // LargePipelined
      mma_gemm_pipelined_launch(x, M, w, y, accumulate, stream, PipelinedKernel::Tile128);
      break;
  }
}

void set_mma_gemm_variant(int variant) {
  if (variant < 0 || variant > 4)
    throw Error("mma_gemm: variant " + std::to_string(variant) +
                " (0 register-staged Large, 1 pipelined 128x128, 2 pipelined 128x256 where it fills the SMs, 3 "
                "pipelined 128x128 at two CTAs per SM, 4 wgmma on sm_90a GPUs, else 3)");
  g_variant.store(variant, std::memory_order_relaxed);
}

int mma_gemm_variant() { return g_variant.load(std::memory_order_relaxed); }

void mma_gemm(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate, cudaStream_t stream) {
  mma_gemm(x, M, w, y, accumulate, stream, MmaTiling::Auto);
}

void mma_gemm_prepare() {
  ensure_smem_opt_in_all_kinds<SmallTile>();
  ensure_smem_opt_in_all_kinds<MediumTile>();
  ensure_smem_opt_in_all_kinds<LargeTile>();
  mma_gemm_pipelined_prepare();
  mma_gemm_wgmma_prepare();
}

}  // namespace moeserve::cuda
