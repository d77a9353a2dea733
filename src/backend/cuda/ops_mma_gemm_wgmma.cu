// The Hopper kernel of mma_gemm (ops_mma_gemm.h): MmaTiling::Wgmma128 / Wgmma256 (variant 4),
// warpgroup MMAs (wgmma, sm_90a only; the H200). Same arithmetic and bits as every other tiling
// (ops_mma_gemm.h): FP8 x' = x ⊗ s[n/128][k/128] before the split into bf16 hi + lo; per output,
// per k16 step ascending over all of K, C = mma(hi, w, C) then C = mma(lo, w, C); INT8 C ⊗ s[n];
// accumulate y_old ⊕ v. A wgmma m64nNk16 step is the same f32 product-sum per output as mma.sync
// m16n8k16's (the tests check the two bit for bit: GpuOpsMmaGemm, every tiling against Auto).
// Why: mma.sync tops out at ~650 bf16 TFLOP/s on the H200 (docs/PERF.md run T4), i.e. ~325 useful
// with the hi + lo operands, and the cp.async kernels reach 150 useful; wgmma's peak is ~990.
// The DGX Spark (sm_121) has no wgmma: there the pipelined mma.sync kernels run (the launcher
// refuses these tilings off sm_90a, and Auto never picks them there).
//
// Data layout. x: f32 [M, K] row-major, 16-byte aligned rows (K % 16 == 0). W: [N, K] row-major,
// bf16, e4m3 bytes (f32 scale [ceil(N/128)][ceil(K/128)]) or int8 (f32 scale[N]). y: f32 [M, N].
//
// Parallelisation. One CTA of 2 warpgroups (256 threads) per output tile of 128 rows (tokens) x BN
// columns (BN = 128 or 256): warpgroup j computes rows 64j .. 64j + 63 as BN / 128 m64n128 halves
// (an FP8 scale block each: the halves' A operands are x scaled by different block scales).
//   - A (x hi / lo) is built in registers, as in the pipelined kernels: each warp reads its 16 rows'
//     f32 values of a k16 step from the x stage (four 8-byte loads per thread), scales them (FP8)
//     and splits them (split2_scaled): one A pair per half and step, no x planes in shared memory.
//   - B (W as bf16) is read by the wgmma from shared memory, K-major, 64-byte rows (BK = 32 k)
//     in the 64-byte swizzle (wgmma.cuh desc_sw64; the same chunk order, w_chunk, as the pipelined
//     kernels' bf16 W tiles): bf16 W is copied there straight by cp.async; e4m3 / int8 W arrives
//     raw in its stage and each thread converts the chunks it copied into one of two bf16 B buffers.
// K is walked in tiles of BK = 32 through a ring of 4 cp.async stages (the next 3 tiles, or 2 for
// bf16 W under the overlapped schedule, in flight while tile kt is computed). Per k16 step a
// warpgroup issues 2 x BN / 128 wgmmas (per half: hi, then lo, into the half's accumulators) as
// one commit group. Overlapped schedule (set_mma_gemm_wgmma_overlap; by default for bf16 W): it
// then waits for the previous step's group (wait_group 1), so its next A is built while its own
// MMAs run and one group stays in flight across the k-tile barrier; the A registers of both steps
// are kept apart (step parity) and pinned until their group is done. Otherwise it waits for the
// group just issued (wait_group 0) and the two warpgroups alternate on the tensor cores (the
// default for e4m3 / int8 W: ptxas serializes the overlapped kernels' wgmmas there, C7513, and
// the plain schedule is as fast or faster; docs/PERF.md, session 11). The conversion of
// tile kt+1's W runs while the last group of tile kt is in flight (into a B buffer no pending
// group reads: 3 buffers overlapped, 2 otherwise), then one barrier per k tile.
//
// Shared memory (+ 512 bytes to align the B tiles): 4 stages x (16 KB x + BN·32 raw W or BN·64
// bf16 W) + 3 (2) bf16 B buffers of BN·64 for e4m3 / int8: 144 (128) KB at BN 256, bf16 128 KB;
// 104 (96) KB at BN 128, bf16 96 KB: 2 CTAs per SM.
//
// Roofline. Useful 2·M·N·K FLOP, executed twice (hi and lo). Per k16 step and warpgroup the
// wgmmas read B (BN·32 bytes) twice: 64 executed FLOP per shared-memory byte; with the x stage
// (written by cp.async, read for A) and the W conversion, about 35 FLOP per byte at BN 256 against
// ~29 needed to keep the tensor cores busy at 128 B per cycle: shared memory is the second limit.
#include <atomic>
#include <climits>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/ops_mma_gemm.h"
#include "backend/cuda/ops_mma_gemm_common.cuh"
#include "backend/cuda/smem_opt_in.h"
#include "backend/cuda/wgmma.cuh"
#include "core/error.h"

namespace moeserve::cuda {
namespace {

using namespace mma_frag;
using namespace mma_gemm_detail;

// kOverlap: a warpgroup waits for its previous step's wgmma group (wait_group 1) instead of the
// one just issued (0), so that its next A is built while its own MMAs run and a group stays in
// flight across the k-tile barrier. The price: three B buffers (a lagging warpgroup may still read
// tile kt-1's while tile kt+1 is converted) and, for bf16 W read straight from the stages, a
// prefetch distance of kStages - 2 tiles instead of kStages - 1.
template <int BN_, WKind kKind, bool kOverlap_>
struct WgCfg {
  static constexpr int BM = 128, BN = BN_, BK = 32, kThreads = 256, kStages = 4;
  static constexpr bool kOverlap = kOverlap_;
  static constexpr int NH = BN / 128;  // m64n128 halves per warpgroup
  static constexpr bool kRawW = kKind != WKind::Bf16;
  static constexpr int kXBytes = BM * BK * 4;  // [128][32] f32, 16-byte chunks swizzled (x_chunk)
  static constexpr int kBBytes = BN * BK * 2;  // [BN][32] bf16, 64-byte swizzle
  static constexpr int kWStageBytes = kRawW ? BN * BK : kBBytes;
  static constexpr int kStageBytes = kXBytes + kWStageBytes;
  static constexpr int kBBufs = kRawW ? (kOverlap ? 3 : 2) : 0;
  static constexpr int kAhead = !kRawW && kOverlap ? kStages - 2 : kStages - 1;  // tiles in flight
  static constexpr int kBOffset = kStages * kStageBytes;
  static constexpr int kSmemBytes = kBOffset + kBBufs * kBBytes + 512;  // + alignment slack
  static constexpr int kXChunks = BM * BK / 4 / kThreads;              // 4
  static constexpr int kWChunks = kWStageBytes / 16 / kThreads;       // raw: 1 or 2; bf16: 2 or 4
  static constexpr int kMinBlocks = BN == 128 ? 2 : 1;
  static_assert(BN == 128 || BN == 256, "tile");
  static_assert(kStageBytes % 512 == 0 && kXBytes % 512 == 0 && kBBytes % 512 == 0, "B tiles on 512-byte boundaries");
};

template <int BN, WKind kKind, bool kOverlap>
__global__ void __launch_bounds__(256, WgCfg<BN, kKind, kOverlap>::kMinBlocks)
    mma_gemm_wgmma_kernel(const float* __restrict__ x, int M, const uint8_t* __restrict__ w,
                          const float* __restrict__ scale, int N, int K, float* __restrict__ y, bool accumulate) {
#if defined(MOESERVE_WGMMA_ENABLED)
  using P = WgCfg<BN, kKind, kOverlap>;
  constexpr int BM = P::BM, BK = P::BK, NH = P::NH, S = P::kStages, A = P::kAhead;

  extern __shared__ __align__(16) unsigned char wg_smem_raw[];
  uint32_t sbase = 0;
  unsigned char* smem = wgmma::align_smem_512(wg_smem_raw, sbase);

  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wi = warp & 3;
  int m0, n0;
  raster(int(blockIdx.x), M, N, BM, BN, m0, n0);

  // ---- global -> stage (cp.async; zero-fill outside [M, N, K]) ----
  auto load_tile = [&](int stage, int k0) {
    const uint32_t sx = sbase + uint32_t(stage * P::kStageBytes), sw = sx + uint32_t(P::kXBytes);
#pragma unroll
    for (int i = 0; i < P::kXChunks; ++i) copy_x_chunk(sx, x, M, K, m0, k0, tid + i * P::kThreads);
    if constexpr (P::kRawW) {
#pragma unroll
      for (int i = 0; i < P::kWChunks; ++i) copy_w_raw_chunk(sw, w, N, K, n0, k0, tid + i * P::kThreads);
    } else {
#pragma unroll
      for (int i = 0; i < P::kWChunks; ++i) copy_w_bf16_chunk(sw, w, N, K, n0, k0, tid + i * P::kThreads);
    }
  };
  // e4m3 / int8: the raw chunks this thread copied into `stage` -> bf16 B buffer `buf`.
  auto convert_w = [&](int stage, int buf) {
    if constexpr (P::kRawW) {
#pragma unroll
      for (int i = 0; i < P::kWChunks; ++i)
        convert_w_chunk<kKind>(smem + stage * P::kStageBytes + P::kXBytes, smem + P::kBOffset + buf * P::kBBytes,
                               tid + i * P::kThreads);
    }
  };

  // A: this warp's rows 64·wg + 16·wi + g (+8), columns as in the pipelined kernels.
  const int g = lane >> 2, t = lane & 3;
  const int a_row = (64 * wg + 16 * wi + g) * BK;  // floats from the stage's start
  int a_col[BK / 16][2];
#pragma unroll
  for (int ks = 0; ks < BK / 16; ++ks)
#pragma unroll
    for (int h = 0; h < 2; ++h) a_col[ks][h] = x_chunk(g, 4 * ks + (t >> 1) + 2 * h) * 4 + (t & 1) * 2;

  float acc[NH][16][4];
#pragma unroll
  for (int h = 0; h < NH; ++h)
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[h][j][e] = 0.f;

  // FP8: each half's 128-column scale row (a half wholly beyond N computes discarded outputs:
  // clamp its row).
  const int kb_count = (K + 127) / 128;
  const float* scale_row[NH];
#pragma unroll
  for (int h = 0; h < NH; ++h)
    scale_row[h] = kKind == WKind::Fp8 ? scale + size_t(min((n0 + 128 * h) / 128, (N - 1) / 128)) * kb_count : scale;

  // The A operands of the last two k16 steps (step parity): a pending group still reads its own.
  uint32_t ah[2][NH][4], al[2][NH][4];

  auto compute_tile = [&](int stage, int buf, int next_buf, int k0, bool next) {
    const float* xs = reinterpret_cast<const float*>(smem + stage * P::kStageBytes) + a_row;
    const uint32_t bt = P::kRawW ? sbase + uint32_t(P::kBOffset + buf * P::kBBytes)
                                 : sbase + uint32_t(stage * P::kStageBytes + P::kXBytes);
    const int steps = min(BK, K - k0) / 16;
    float s[NH];
#pragma unroll
    for (int h = 0; h < NH; ++h) s[h] = kKind == WKind::Fp8 ? __ldg(scale_row[h] + k0 / 128) : 1.f;
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      if (ks >= steps) break;  // uniform over the CTA
      const float2 v0 = *reinterpret_cast<const float2*>(xs + a_col[ks][0]);           // (g, 2t)
      const float2 v1 = *reinterpret_cast<const float2*>(xs + 8 * BK + a_col[ks][0]);  // (g+8, 2t)
      const float2 v2 = *reinterpret_cast<const float2*>(xs + a_col[ks][1]);           // (g, 2t+8)
      const float2 v3 = *reinterpret_cast<const float2*>(xs + 8 * BK + a_col[ks][1]);  // (g+8, 2t+8)
#pragma unroll
      for (int h = 0; h < NH; ++h) {
        split2_scaled<kKind>(v0.x, v0.y, s[h], ah[ks][h][0], al[ks][h][0]);
        split2_scaled<kKind>(v1.x, v1.y, s[h], ah[ks][h][1], al[ks][h][1]);
        split2_scaled<kKind>(v2.x, v2.y, s[h], ah[ks][h][2], al[ks][h][2]);
        split2_scaled<kKind>(v3.x, v3.y, s[h], ah[ks][h][3], al[ks][h][3]);
      }
      wgmma::fence();
#pragma unroll
      for (int h = 0; h < NH; ++h) {
        const uint64_t desc = wgmma::desc_sw64(bt + uint32_t(h * 128 * 64 + ks * 32));
        wgmma::mma_m64n128k16_bf16_rs(acc[h], ah[ks][h], desc);  // per output: hi first,
        wgmma::mma_m64n128k16_bf16_rs(acc[h], al[ks][h], desc);  // then lo
      }
      wgmma::commit_group();
      const bool last = ks == BK / 16 - 1 && next;  // uniform; `next` implies a full tile
      if (last) {  // tile kt+1's W while this group runs (into a B buffer no group reads)
        cp_async_wait<A - 1>();
        convert_w((stage + 1) % S, next_buf);
        wgmma::fence_proxy_async_shared();
      }
      // The A registers a group reads stay untouched (fence_operand) until the group is done.
      if constexpr (kOverlap) {
        wgmma::wait_group<1>();  // the previous step's group
#pragma unroll
        for (int h = 0; h < NH; ++h)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            wgmma::fence_operand(ah[ks ^ 1][h][e]);
            wgmma::fence_operand(al[ks ^ 1][h][e]);
          }
      } else {
        wgmma::wait_group<0>();
#pragma unroll
        for (int h = 0; h < NH; ++h)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            wgmma::fence_operand(ah[ks][h][e]);
            wgmma::fence_operand(al[ks][h][e]);
          }
      }
      if (last) __syncthreads();
    }
  };

  // ---- main loop (the pipelined kernels' schedule) ----
  // Commit groups: one per tile (empty past the last); after the group of tile kt + A, wait<A - 1>
  // means this thread's copies of tile kt + 1 are complete.
  const int kt_count = (K + BK - 1) / BK;
#pragma unroll
  for (int st = 0; st < A; ++st) {
    if (st < kt_count) load_tile(st, st * BK);
    cp_async_commit();
  }
  cp_async_wait<A - 1>();
  convert_w(0, 0);
  wgmma::fence_proxy_async_shared();
  __syncthreads();
  constexpr int nb = P::kBBufs > 0 ? P::kBBufs : 1;
  for (int kt = 0; kt < kt_count; ++kt) {
    // Refill the stage of tile kt + A - S: its x, raw W and (bf16) B are read by no pending group
    // and were last read by this CTA's threads before the last barrier.
    const int ahead = kt + A;
    if (ahead < kt_count) load_tile(ahead % S, ahead * BK);
    cp_async_commit();
    compute_tile(kt % S, kt % nb, (kt + 1) % nb, kt * BK, kt + 1 < kt_count);
  }
  wgmma::wait_group<0>();
  cp_async_wait<0>();

#pragma unroll
  for (int h = 0; h < NH; ++h) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) wgmma::fence_operand(acc[h][j][e]);
    store_fragments<kKind, 1, 16>(reinterpret_cast<const float(&)[1][16][4]>(acc[h]), m0 + 64 * wg + 16 * wi,
                                  n0 + 128 * h, lane, M, N, scale, y, accumulate);
  }
#else
  using P = WgCfg<BN, kKind, kOverlap>;  // (referenced, so that the sm_121 pass does not warn)
  static_assert(P::NH > 0 && P::kXChunks > 0 && P::kWChunks > 0 && P::kAhead > 0, "tile");
  __trap();  // never launched: mma_gemm_wgmma_launch refuses devices without sm_90a code
#endif
}

template <int BN, WKind kKind, bool kOverlap>
void ensure_opt_in() {
  using P = WgCfg<BN, kKind, kOverlap>;
  opt_in_dynamic_smem<mma_gemm_wgmma_kernel<BN, kKind, kOverlap>>(P::kSmemBytes, P::kMinBlocks > 1);
}

template <int BN, WKind kKind, bool kOverlap>
void launch(const float* x, int M, const uint8_t* w, const float* scale, int N, int K, float* y, bool accumulate,
            cudaStream_t stream) {
  using P = WgCfg<BN, kKind, kOverlap>;
  ensure_opt_in<BN, kKind, kOverlap>();
  const long long tiles = (long long)((M + P::BM - 1) / P::BM) * ((N + BN - 1) / BN);
  if (tiles > INT_MAX) throw Error("mma_gemm: too many tiles for the launch grid");
  mma_gemm_wgmma_kernel<BN, kKind, kOverlap>
      <<<unsigned(tiles), P::kThreads, P::kSmemBytes, stream>>>(x, M, w, scale, N, K, y, accumulate);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

std::atomic<int> g_overlap{int(WgmmaOverlap::ByWeightKind)};  // set_mma_gemm_wgmma_overlap

template <int BN>
void launch_format(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate, cudaStream_t stream) {
  const int N = int(w.N), K = int(w.K);
  const int mode = g_overlap.load(std::memory_order_relaxed);
  dispatch_weight_kind(w, [&](auto kind, const uint8_t* wp, const float* scale) {
    const bool overlap = mode == int(WgmmaOverlap::Always) ||
                         (mode == int(WgmmaOverlap::ByWeightKind) && decltype(kind)::value == WKind::Bf16);
    if (overlap)
      launch<BN, decltype(kind)::value, true>(x, M, wp, scale, N, K, y, accumulate, stream);
    else
      launch<BN, decltype(kind)::value, false>(x, M, wp, scale, N, K, y, accumulate, stream);
  });
}

template <int BN>
void prepare_bn() {
  ensure_opt_in<BN, WKind::Bf16, false>();
  ensure_opt_in<BN, WKind::Fp8, false>();
  ensure_opt_in<BN, WKind::Int8, false>();
  ensure_opt_in<BN, WKind::Bf16, true>();
  ensure_opt_in<BN, WKind::Fp8, true>();
  ensure_opt_in<BN, WKind::Int8, true>();
}

}  // namespace

bool mma_gemm_wgmma_available() {
#if defined(MOESERVE_CUDA_SM90A)
  return current_device_compute_capability() == 90;
#else
  return false;
#endif
}

void mma_gemm_wgmma_launch(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate,
                           cudaStream_t stream, int bn) {
  if (!mma_gemm_wgmma_available())
    throw Error("mma_gemm: the wgmma tilings need an sm_90 GPU and a build with sm_90a code "
                "(CMAKE_CUDA_ARCHITECTURES containing 90a)");
  if (bn == 256)
    launch_format<256>(x, M, w, y, accumulate, stream);
  else
    launch_format<128>(x, M, w, y, accumulate, stream);
}

void set_mma_gemm_wgmma_overlap(int mode) {
  if (mode < 0 || mode > 2)
    throw Error("mma_gemm: the wgmma overlap mode must be 0 (never), 1 (always) or 2 (by weight kind)");
  g_overlap.store(mode, std::memory_order_relaxed);
}
int mma_gemm_wgmma_overlap() { return g_overlap.load(std::memory_order_relaxed); }

void mma_gemm_wgmma_prepare() {
  if (!mma_gemm_wgmma_available()) return;
  prepare_bn<128>();
  prepare_bn<256>();
}

}  // namespace moeserve::cuda
