// The cp.async-pipelined kernels of mma_gemm (ops_mma_gemm.h): MmaTiling::LargePipelined (CTA
// 128 x 128, variant 1), LargePipelined2Cta (the same capped at 128 registers for two CTAs per
// SM, variant 3, the default) and Wide (CTA 128 x 256, variant 2 where its grid fills the SMs:
// ops_mma_gemm.cu, prefer_wide). One templated kernel (PipeCfg) serves all three:
// Y[M, N] f32 = X[M, K] f32 · Wᵀ on mma.sync.m16n8k16 bf16 with the same bits as every other
// tiling (ops_mma_gemm.cu's header: FP8 x' = x ⊗ s[n/128][k/128] before the split; per output,
// per k16 step ascending over all of K, C = mma(hi, w, C) then C = mma(lo, w, C); INT8 C ⊗ s[n];
// accumulate y_old ⊕ v; the split, epilogue and weight conversion are the shared functions of
// ops_mma_gemm_common.cuh). sm_80+ PTX only (cp.async, ldmatrix, mma.sync): the H200 and the DGX
// Spark (<= 99 KB of shared memory) alike.
//
// Data layout. x: f32 [M, K] row-major, 16-byte aligned rows (K % 16 == 0). W: [N, K] row-major,
// bf16, e4m3 bytes (f32 scale [ceil(N/128)][ceil(K/128)]) or int8 (f32 scale[N]). y: f32 [M, N].
//
// Parallelisation. One CTA of 8 warps per output tile, the grouped raster of the register-staged
// kernels:
//   128x128: 4 x 2 warps, warp tile 32 x 64 (MI = 2 m16 x NI = 8 n8 fragments), 4 stages,
//            two bf16 W buffers; 1 CTA per SM (LargePipelined, 142-150 registers) or 2 where the
//            shared memory allows (LargePipelined2Cta, 128 registers, no spills);
//   128x256: 2 x 4 warps, warp tile 64 x 64 (MI = 4 x NI = 8: 128 accumulator registers; the FP8
//            arithmetic keeps one accumulator per output, so it fits), 3 stages, one bf16 W
//            buffer.
// K is walked in tiles of BK = 32 through a ring of kStages shared-memory stages filled by
// cp.async (16-byte chunks, zero-filled beyond M, N and K): while tile kt is computed, the copies
// of tiles kt+1 .. kt+kStages-1 are in flight (about two 128x256 tiles' or three 128x128 tiles'
// compute time to cover L2 / HBM latency).
//   - x stays f32 in its stage ([128][32] floats, 16-byte chunks XOR-swizzled per row, x_chunk:
//     no padding, conflict-free). Each warp builds its A fragments straight from it: four 8-byte
//     loads per m16 fragment, FP8-scaled and split in registers into the bf16 hi and lo fragments
//     (split2_scaled, the function the staged kernels use; FP8: the scale of the warp's own
//     128-column block, as its 64 columns lie in one). The split is spread between the MMAs, and
//     no x hi/lo planes are written (the price: the WN warps of a row all split it).
//   - bf16 W is copied straight into its stage in ldmatrix layout ([BN][32] bf16, chunks
//     swizzled by w_chunk: conflict-free ldmatrix).
//   - e4m3 / int8 W arrives raw (chunk c of the tile at byte 16c; chunk c = row c/2, k half c%2,
//     so a warp's copies read whole 32-byte sectors); after waiting for its own copies, each
//     thread converts exactly the chunks it copied (no barrier needed in between) into a bf16 W
//     buffer (the bf16 stage layout; conflict-free stores).
// Iteration kt: issue the copies of tile kt+kStages-1 (into the stage of tile kt-1), the MMAs of
// tile kt's first k16 step, load the second step's fragments, wait for this thread's copies of
// tile kt+1, convert its W chunks of tile kt+1, barrier, the second step's MMAs. Two W buffers
// (128x128): the conversion writes the buffer of tile kt-1, last read before the previous
// barrier, so one barrier per k tile. One W buffer (128x256, e4m3 / int8: two would exceed
// 99 KB): a barrier before the conversion (every warp holds its last W fragments of tile kt in
// registers), so two per k tile. After the last barrier, tile kt+1 is complete for every warp,
// and the MMAs queued before it keep the tensor pipe busy across it.
//
// Shared memory. 128x128: 4 stages x (16,384 B x + 4,096 B raw W) + 2 x 8,192 B bf16 W =
// 98,304 B (e4m3 / int8); 4 x (16,384 + 8,192) = 98,304 B (bf16). 128x256: 3 x (16,384 + 8,192)
// + 16,384 = 90,112 B (e4m3 / int8); 3 x (16,384 + 16,384) = 98,304 B (bf16). All <= 99 KB (DGX
// Spark); 1 CTA per SM, but 2 of LargePipelined2Cta on the H200 (2 x 96 KB of 228 KB).
//
// Roofline. Useful 2·M·N·K FLOP, executed twice (hi and lo MMAs). HBM: W once + x once + y
// (twice with accumulate) at best; x and W tiles are re-read from L2 by the other CTAs of their
// row / column. L2 -> SM per k tile: 16 KB of x + BN·32 (e4m3 / int8) or BN·64 (bf16) bytes of W
// for 128·BN·32·4 executed FLOP (e4m3: ~100 FLOP per byte at 128x128, ~170 at 128x256).
// Shared memory per k16 step and warp: A 16·kWarpM·4 bytes (f32) + B 16·kWarpN·2 bytes (bf16)
// read for 2·MI·NI MMAs: 128x128 2 KB + 2 KB for 32 MMAs = 128 B per MMA; 128x256 4 KB + 2 KB for
// 64 MMAs = 96 B per MMA. Adding the per-tile writes (x 16 KB, raw W, its conversion's re-read
// and bf16 stores), e4m3 per k tile: 128x128 96 KB for 512 MMAs (~188 B / MMA), 128x256 144 KB
// for 1,024 MMAs (~141 B / MMA): 3/4 of the shared-memory traffic per MMA.
#include <climits>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/ops_mma_gemm.h"
#include "backend/cuda/ops_mma_gemm_common.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace moeserve::cuda {
namespace {

using namespace mma_frag;
using namespace mma_gemm_detail;

// One kernel shape: CTA tile BM x BN, WM x WN warps (warp tile kWarpM x kWarpN), BK = 32, a ring
// of kStages cp.async stages, kWBufs bf16 W buffers for e4m3 / int8 (2: the next tile converts
// into the buffer the current one does not read; 1: an extra barrier before the conversion),
// kMinBlocks CTAs per SM asked of the register allocator (__launch_bounds__).
template <int BM_, int BN_, int WM_, int WN_, int Stages_, int WBufs_, int MinBlocks_ = 1>
struct PipeCfg {
  static constexpr int BM = BM_, BN = BN_, BK = 32, WM = WM_, WN = WN_, kMinBlocks = MinBlocks_;
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kWarpM = BM / WM, kWarpN = BN / WN;
  static constexpr int MI = kWarpM / 16, NI = kWarpN / 8;
  static constexpr int kStages = Stages_, kWBufs = WBufs_;
  static constexpr int kXBytes = BM * BK * 4;      // [BM][32] f32, 16-byte chunks swizzled
  static constexpr int kWBf16Bytes = BN * BK * 2;  // [BN][32] bf16, 16-byte chunks swizzled
  static constexpr int kWRawBytes = BN * BK;       // one raw e4m3 / int8 tile
  static constexpr int kXChunks = BM * BK / 4 / kThreads;       // 16-byte x chunks per thread and tile
  static constexpr int kWRawChunks = BN * BK / 16 / kThreads;   // raw W chunks per thread and tile
  static constexpr int kWBf16Chunks = BN * BK / 8 / kThreads;   // bf16 W chunks per thread and tile
  // The swizzles below assume 128-byte x rows (8 chunks) and 64-byte W rows (4 chunks); a warp's
  // 64 output columns lie in one 128-column FP8 scale block.
  static_assert(BK == 32 && NI % 2 == 0 && 128 % kWarpN == 0 && kWarpM % 16 == 0, "tile shape");
  static_assert(kXChunks * kThreads * 16 == kXBytes && kWRawChunks * kThreads * 16 == kWRawBytes &&
                    kWBf16Chunks * kThreads * 16 == kWBf16Bytes && kXChunks >= 1 && kWRawChunks >= 1,
                "loader shares");
  static_assert(kStages >= 3 && (kWBufs == 1 || kWBufs == 2), "pipeline");

  template <WKind kKind>
  static constexpr int stage_bytes() {
    return kXBytes + (kKind == WKind::Bf16 ? kWBf16Bytes : kWRawBytes);
  }
  template <WKind kKind>
  static constexpr int smem_bytes() {
    return kStages * stage_bytes<kKind>() + (kKind == WKind::Bf16 ? 0 : kWBufs * kWBf16Bytes);
  }
};
// 128x128, 8 warps of 32x64 (MI 2 x NI 8), 4 stages, 2 W buffers: 98,304 B (every kind).
using Pipe128 = PipeCfg<128, 128, 4, 2, 4, 2>;
// The same with registers capped at 128 (ptxas: no spills) so that two CTAs share an SM where the
// shared memory allows (H200: 2 x 96 KB of 228 KB; the DGX Spark still fits one): 16 warps per SM
// to hide latency and to overlap one CTA's barrier with the other's MMAs.
using Pipe128x2 = PipeCfg<128, 128, 4, 2, 4, 2, 2>;
// 128x256, 8 warps of 64x64 (MI 4 x NI 8), 3 stages, 1 W buffer: 98,304 B (bf16: 3 x (16 + 16 KB)),
// 90,112 B (e4m3 / int8: 3 x (16 + 8 KB) + 16 KB).
using Pipe256 = PipeCfg<128, 256, 2, 4, 3, 1>;
template <class P>
constexpr bool fits_spark() {
  return P::template smem_bytes<WKind::Fp8>() <= 99 * 1024 && P::template smem_bytes<WKind::Bf16>() <= 99 * 1024;
}
static_assert(fits_spark<Pipe128>() && fits_spark<Pipe128x2>() && fits_spark<Pipe256>(),
              "DGX Spark: <= 99 KB of shared memory per block");


// sm_12x (DGX Spark: ~100 KB of shared memory per SM) never fits two of these CTAs: there
// Pipe128x2 keeps the register budget of one CTA per SM (capped, it spilled a few bytes).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
constexpr bool kOneCtaPerSm = true;
#else
constexpr bool kOneCtaPerSm = false;
#endif

template <class P, WKind kKind>
__global__ void __launch_bounds__(P::kThreads, kOneCtaPerSm ? 1 : P::kMinBlocks)
    mma_gemm_pipelined_kernel(const float* __restrict__ x, int M, const uint8_t* __restrict__ w,
                              const float* __restrict__ scale, int N, int K, float* __restrict__ y, bool accumulate) {
  constexpr int BM = P::BM, BN = P::BN, BK = P::BK, MI = P::MI, NI = P::NI;
  constexpr int kStageBytes = P::template stage_bytes<kKind>();
  constexpr bool kRawW = kKind != WKind::Bf16;

  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t sbase = uint32_t(__cvta_generic_to_shared(smem));
  // Stage s: x at s·kStageBytes, its W (bf16 tile or raw bytes) kXBytes later; the bf16 W
  // buffers of e4m3 / int8 after the stages.
  constexpr int kWBufOffset = P::kStages * kStageBytes;

  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / P::WN, warp_n = warp % P::WN;
  int m0, n0;
  raster(int(blockIdx.x), M, N, BM, BN, m0, n0);

  // ---- global -> stage (cp.async; zero-fill outside [M, N, K]) ----
  auto load_tile = [&](int stage, int k0) {
    const uint32_t sx = sbase + uint32_t(stage * kStageBytes), sw = sx + uint32_t(P::kXBytes);
#pragma unroll
    for (int i = 0; i < P::kXChunks; ++i) copy_x_chunk(sx, x, M, K, m0, k0, tid + i * P::kThreads);
    if constexpr (kRawW) {
#pragma unroll
      for (int i = 0; i < P::kWRawChunks; ++i) copy_w_raw_chunk(sw, w, N, K, n0, k0, tid + i * P::kThreads);
    } else {
#pragma unroll
      for (int i = 0; i < P::kWBf16Chunks; ++i) copy_w_bf16_chunk(sw, w, N, K, n0, k0, tid + i * P::kThreads);
    }
  };
  // e4m3 / int8: the raw chunks this thread copied into `stage` -> bf16 W buffer `buf` (after its
  // own wait: no barrier needed between the copy and the conversion).
  auto convert_w = [&](int stage, int buf) {
    if constexpr (kRawW) {
#pragma unroll
      for (int i = 0; i < P::kWRawChunks; ++i)
        convert_w_chunk<kKind>(smem + stage * kStageBytes + P::kXBytes, smem + kWBufOffset + buf * P::kWBf16Bytes,
                               tid + i * P::kThreads);
    }
  };

  // ---- per-lane fragment addresses ----
  // A: lane (g, t) = (lane/4, lane%4) holds rows g and g+8, columns 2t, 2t+1 and 2t+8, 2t+9 of the
  // m16 x k16 fragment (a0 = (g, 2t), a1 = (g+8, 2t), a2 = (g, 2t+8), a3 = (g+8, 2t+8); lower k in
  // the low half), the layout ldmatrix gives the staged kernels. Rows g and g+8 share the swizzle
  // (r mod 4 = g mod 4); column 16·ks + 2t + 8h is logical chunk 4·ks + t/2 + 2h, float 2(t%2).
  const int g = lane >> 2, t = lane & 3;
  int a_row[MI], a_col[BK / 16][2];  // floats from the stage's start
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) a_row[mi] = (warp_m * P::kWarpM + mi * 16 + g) * BK;
#pragma unroll
  for (int ks = 0; ks < BK / 16; ++ks)
#pragma unroll
    for (int h = 0; h < 2; ++h) a_col[ks][h] = x_chunk(g, 4 * ks + (t >> 1) + 2 * h) * 4 + (t & 1) * 2;
  // B (x4 covers two n8 tiles): matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
  // (n 8-15, k 8-15) = b0, b1 of the first tile, b0, b1 of the second; lane l addresses row
  // n = (tile base, a multiple of 8) + l%8 (+8 for l >= 16), logical chunk 2·ks + (l/8)%2. The
  // swizzle depends only on n%8 = l%8, so the chunk offset is the same for every j.
  uint32_t b_row[NI / 2], b_col[BK / 16];  // bytes from the W tile's start
#pragma unroll
  for (int j = 0; j < NI / 2; ++j) b_row[j] = uint32_t((warp_n * P::kWarpN + j * 16 + (lane & 7) + (lane >> 4) * 8) * 64);
#pragma unroll
  for (int ks = 0; ks < BK / 16; ++ks) b_col[ks] = uint32_t(w_chunk(lane & 7, 2 * ks + ((lane >> 3) & 1)) * 16);

  float c[MI][NI][4];  // the MMA accumulator, over all of K
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[mi][ni][e] = 0.f;

  // FP8: the scale row of this warp's 128-column block (its kWarpN columns lie in one). A warp
  // wholly beyond N (BN = 256 at N <= 128) computes only discarded outputs: clamp its row.
  const int kb_count = (K + 127) / 128;
  const float* scale_row = scale;
  if constexpr (kKind == WKind::Fp8)
    scale_row = scale + size_t(min((n0 + warp_n * P::kWarpN) / 128, (N - 1) / 128)) * kb_count;

  // Tile kt's MMAs. With `next` (tile kt+1 exists), after the last k step's fragments are in
  // registers (every shared-memory read of tile kt done) and before its MMAs: wait for this
  // thread's copies of tile kt+1, convert its W chunks, and the CTA barrier. The warps thus resume
  // with MMAs whose operands are ready while the tensor pipe still holds the ones queued before
  // the barrier, instead of all restarting with shared-memory loads. With one W buffer, a barrier
  // before the conversion first makes sure no warp still reads tile kt's W.
  auto compute_tile = [&](int stage, int buf, int k0, bool next) {
    const float* xs = reinterpret_cast<const float*>(smem + stage * kStageBytes);
    const uint32_t wt = kRawW ? sbase + uint32_t(kWBufOffset + buf * P::kWBf16Bytes)
                              : sbase + uint32_t(stage * kStageBytes + P::kXBytes);
    const int steps = min(BK, K - k0) / 16;
    // FP8: tile kt lies in one 128-k block (BK divides 128): x ⊗ its scale before the split.
    const float s = kKind == WKind::Fp8 ? __ldg(scale_row + k0 / 128) : 1.f;
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      if (ks >= steps) break;  // uniform over the CTA
      uint32_t ah[MI][4], al[MI][4], b[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        const float* p = xs + a_row[mi];
        const float2 v0 = *reinterpret_cast<const float2*>(p + a_col[ks][0]);           // (g, 2t)
        const float2 v1 = *reinterpret_cast<const float2*>(p + 8 * BK + a_col[ks][0]);  // (g+8, 2t)
        const float2 v2 = *reinterpret_cast<const float2*>(p + a_col[ks][1]);           // (g, 2t+8)
        const float2 v3 = *reinterpret_cast<const float2*>(p + 8 * BK + a_col[ks][1]);  // (g+8, 2t+8)
        split2_scaled<kKind>(v0.x, v0.y, s, ah[mi][0], al[mi][0]);
        split2_scaled<kKind>(v1.x, v1.y, s, ah[mi][1], al[mi][1]);
        split2_scaled<kKind>(v2.x, v2.y, s, ah[mi][2], al[mi][2]);
        split2_scaled<kKind>(v3.x, v3.y, s, ah[mi][3], al[mi][3]);
      }
#pragma unroll
      for (int j = 0; j < NI / 2; ++j) {
        uint32_t r[4];
        ldmatrix_x4(wt + b_row[j] + b_col[ks], r);
        b[2 * j][0] = r[0], b[2 * j][1] = r[1], b[2 * j + 1][0] = r[2], b[2 * j + 1][1] = r[3];
      }
      if (ks == BK / 16 - 1 && next) {  // uniform; `next` implies a full tile, so this step runs
        cp_async_wait<P::kStages - 2>();
        if constexpr (P::kWBufs == 1) {
          if constexpr (kRawW) __syncthreads();  // every warp holds its last W fragments of tile kt
          convert_w((stage + 1) % P::kStages, 0);
        } else {
          // W buffer buf ^ 1 held tile kt-1, last read before the previous barrier.
          convert_w((stage + 1) % P::kStages, buf ^ 1);
        }
        __syncthreads();
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

  // ---- main loop ----
  // Commit groups: one per tile (empty past the last), so wait<kStages - 2> after the group of
  // tile kt + kStages - 1 was committed means this thread's copies of tile kt + 1 are complete.
  // The barrier(s) of iteration kt sit inside compute_tile (see there); after the last one, tile
  // kt+1's stage and W buffer are complete, and tile kt's stage is no longer read (so iteration
  // kt+1 refills it with tile kt + kStages; with two W buffers it converts tile kt+2 into tile
  // kt's buffer).
  constexpr int S = P::kStages;
  const int kt_count = (K + BK - 1) / BK;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < kt_count) load_tile(s, s * BK);
    cp_async_commit();
  }
  cp_async_wait<S - 2>();
  convert_w(0, 0);
  __syncthreads();
  for (int kt = 0; kt < kt_count; ++kt) {
    // Refill the stage of tile kt - 1: every thread finished reading it before the last barrier.
    const int ahead = kt + S - 1;
    if (ahead < kt_count) load_tile(ahead % S, ahead * BK);
    cp_async_commit();
    compute_tile(kt % S, P::kWBufs == 1 ? 0 : (kt & 1), kt * BK, kt + 1 < kt_count);
  }
  cp_async_wait<0>();  // only empty groups can be left; keeps the kernel's exit clean

  store_fragments<kKind>(c, m0 + warp_m * P::kWarpM, n0 + warp_n * P::kWarpN, lane, M, N, scale, y, accumulate);
}

// ---- host side --------------------------------------------------------------------------------

// Opts the kernel in to its > 48 KB of dynamic shared memory (and Pipe128x2 to the largest
// carve-out, so that 2 CTAs can fit), once per device.
template <class P, WKind kKind>
void ensure_opt_in() {
  opt_in_dynamic_smem<mma_gemm_pipelined_kernel<P, kKind>>(P::template smem_bytes<kKind>(), P::kMinBlocks > 1);
}

template <class P, WKind kKind>
void launch(const float* x, int M, const uint8_t* w, const float* scale, int N, int K, float* y, bool accumulate,
            cudaStream_t stream) {
  ensure_opt_in<P, kKind>();
  const long long tiles = (long long)((M + P::BM - 1) / P::BM) * ((N + P::BN - 1) / P::BN);
  if (tiles > INT_MAX) throw Error("mma_gemm: too many tiles for the launch grid");
  mma_gemm_pipelined_kernel<P, kKind><<<unsigned(tiles), P::kThreads, P::template smem_bytes<kKind>(), stream>>>(
      x, M, w, scale, N, K, y, accumulate);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

template <class P>
void launch_format(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate, cudaStream_t stream) {
  const int N = int(w.N), K = int(w.K);
  dispatch_weight_kind(w, [&](auto kind, const uint8_t* wp, const float* scale) {
    launch<P, decltype(kind)::value>(x, M, wp, scale, N, K, y, accumulate, stream);
  });
}

template <class P>
void prepare() {
  ensure_opt_in<P, WKind::Bf16>();
  ensure_opt_in<P, WKind::Fp8>();
  ensure_opt_in<P, WKind::Int8>();
}

}  // namespace

void mma_gemm_pipelined_launch(const float* x, int M, const DeviceLinear& w, float* y, bool accumulate,
                               cudaStream_t stream, PipelinedKernel kernel) {
  switch (kernel) {
    case PipelinedKernel::Wide:
      launch_format<Pipe256>(x, M, w, y, accumulate, stream);
      break;
    case PipelinedKernel::Tile128TwoCtas:
      launch_format<Pipe128x2>(x, M, w, y, accumulate, stream);
      break;
    default:
      launch_format<Pipe128>(x, M, w, y, accumulate, stream);
      break;
  }
}

void mma_gemm_pipelined_prepare() {
  prepare<Pipe128>();
  prepare<Pipe128x2>();
  prepare<Pipe256>();
}

}  // namespace moeserve::cuda
