// moe_int_detail::int_wgmma_launch (ops_moe_int_internal.cuh): the integer-form GPTQ experts'
// 32- and 64-slot tiles (int_mma's mid and large tile lists, ops_moe_int_mma.cu) on Hopper warpgroup
// MMAs (wgmma m64nNk32, s8 x s8 / u8 -> s32; sm_90a code, run on sm_90 GPUs only; the DGX Spark keeps
// the mma.sync kernels). Same operands, tiles and bits as int_mma_kernel: per (slot, column) and unit
// u of 128 k, D_u = Σ (q − z)·X exactly (X = 256·hi + lo), then acc = fma(RN(D_u), s_b·scale, acc)
// over the units in k order (moe_int_arith.h).
//
// Why a second kernel: int_mma_kernel runs m16n8k32 at mma.sync's integer rate with the weights as
// the B operand, so every n8 tile of columns unpacks its GPTQ words again for every 16 slots, and
// the zero-point term costs a per-slot bias in every accumulator. Here the weights are the A operand
// (the swapped product out^T = W^T·X^T) in registers as q − z (s8): a warp unpacks each GPTQ word once
// per CTA, the zero point is in the operand (no Σ X term), and the slots' X planes are the B operand
// in shared memory. PERF.md session 12: the expert block 12% (1K tokens) / 18% (8K) faster.
//
// Layout. Weights: GPTQ qweight [E][K/8][N] i32, scales f16 [E][K/g][N], qzeros [E][K/g][N/8] (as
// loaded). X: the quantised planes hi (s8) / lo (u8) [rows][K], k permuted inside every 32-k block
// (ops_moe_int_mma_layout.h), and s_b f32 per (row, 128-k block).
// A fragment (m64nNk32, 8-bit, registers; mma.m16n8k32's A layout per warp): thread (g = lane / 4,
// t = lane % 4) of warp w holds weight columns c = 16w + g (a0, a2) and c + 8 (a1, a3); a0 / a1 =
// word t of the 32-k block with its even nibbles (w & 0x0F0F0F0F: physical k 8t + 2i -> logical
// 4t + i), a2 / a3 the odd nibbles ((w >> 4) & 0x0F0F0F0F -> logical 16 + 4t + i): the X planes'
// permutation, so the products pair the right k; each byte becomes q − z by (q + 128 − z) ^ 0x80.
// B: the tile's rows of a plane, K-major, 64-byte rows in the 64-byte swizzle (wgmma.cuh
// desc_sw64), a 128-k stage as two 64-k sub-tiles. D (s32, the f32 accumulator layout): rows =
// weight columns, columns = the tile's slots; it holds H' = Σ (q − z)·hi and L' = Σ (q − z)·lo (the
// first k step with scale-d 0). Exact floats without a conversion: the bits of H' + 0x4B400000 are
// the float 12582912 + H' (|H'| < 2^19, where the ulp is 1), minus 12582912; d = fma(H', 256, L') =
// RN(D_u): int_mma_kernel's values exactly (there the bias and the zero term enter as the MMA's C).
//
// Parallelisation. CTA = 2 warpgroups (256 threads) per (tile, 128 weight columns): gate_up: 64
// gate columns (warpgroup 0) and the same 64 up columns (warpgroup 1), act = silu_mul_rn(g, u) in
// the epilogue through shared memory; down: 128 columns, 64 per warpgroup. Grid (N / 64 or N / 128,
// tile capacity); CTAs past the list's tile count exit at once. K is walked in 128-k stages (one
// unit each) through a ring of kStages cp.async stages, kStages − 2 ahead; per stage one barrier,
// then each warpgroup unpacks its A registers, issues its 8 wgmmas (4 k32 steps x hi and lo), waits
// and folds; the other warpgroup and the SM's other CTA keep the tensor cores busy meanwhile. Two
// CTAs per SM (<= 128 registers).
//
// Shared memory per stage: hi and lo planes (2 x kTok x 128 B), weight words [16][128 + 8] u32
// (the 8-word pad: the 4 word rows x 8 columns of an A load hit 32 banks), scales [128] f16, zero
// words [16] u32, s_b [kTok] f32: 26.5 KB (kTok 64, 4 stages) / 17.5 KB (kTok 32, 6 stages).
//
// Roofline (122B-A10B, E 256, top-8, H 3072, I 1024, g128). Per (slot, column, unit): 256 integer
// MACs on the tensor cores (128 k x hi and lo: 1/16 cycle of an SM at wgmma's ~4,096 8-bit MACs per
// cycle) and the fold, 7 thread instructions (2 IADD, 2 FADD, FFMA, FMUL, FFMA: 1/18 cycle at 128
// lanes): the fold and the MMAs cost about the same, and the fold sets the pace (ncu, PERF.md:
// ~1.9 instructions issued per cycle per SM). L2 -> SM per stage 16 KB of X and 8 KB of weights for
// 64 x 128 x 128 x 2 MACs. At 8K tokens: gate_up 65,536 slots x 2,048 columns x 24 units.
#include <atomic>
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/moe_int_arith.h"
#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/ops_moe_int_internal.cuh"
#include "backend/cuda/smem_opt_in.h"
#include "backend/cuda/wgmma.cuh"
#include "core/error.h"

namespace moeserve::cuda {
namespace {
std::atomic<bool> g_int_wgmma{true};
}  // namespace
void set_moe_int_wgmma(bool on) { g_int_wgmma.store(on); }
bool moe_int_wgmma() { return g_int_wgmma.load(); }
}  // namespace moeserve::cuda

namespace moeserve::cuda::moe_int_detail {
namespace {

using namespace moe_detail;
using mma_frag::cp_async16;
using mma_frag::cp_async4;
using mma_frag::cp_async_commit;
using mma_frag::cp_async_wait;


// The stage of a CTA: kTok slots per tile (the wgmma N), 128 weight columns (gate_up: 64 of gate and
// 64 of up; down: 128), a 128-k unit. Byte offsets inside a stage (sub-tiles 512-byte aligned).
template <int kTok_>
struct WgT {
  static constexpr int kTok = kTok_;
  static constexpr int BK = 128, BR = 128, kThreads = 256;
  static constexpr int kNB = kTok / 8;                 // n8 blocks of an accumulator
  static constexpr int kSub = kTok * 64;               // a plane's 64-k sub-tile [kTok][64 B]
  static constexpr int kHiOff = 0, kLoOff = 2 * kSub;  // plane = 2 sub-tiles
  static constexpr int kWStride = BR + 8;              // words per weight word row
  static constexpr int kWOff = 4 * kSub;
  static constexpr int kScaleOff = kWOff + (BK / 8) * kWStride * 4;
  static constexpr int kZeroOff = kScaleOff + BR * 2;
  static constexpr int kSbOff = kZeroOff + (BR / 8) * 4;
  static constexpr int kStageBytes = (kSbOff + kTok * 4 + 511) / 512 * 512;
  static constexpr int kStages = kTok == 64 ? 4 : 6;  // 2 CTAs per SM: <= 113 KB each
  static constexpr int kSmemBytes = kStages * kStageBytes + 512;  // + alignment slack
  static constexpr int kXChunks = 2 * kTok * 8 / kThreads;       // 16-byte X chunks per thread and stage
  static constexpr int kWChunks = (BK / 8) * (BR / 4) / kThreads;  // 2
  static_assert(kTok == 32 || kTok == 64, "wgmma N");
  static_assert(kWOff % 512 == 0 && kSub % 512 == 0 && kScaleOff % 16 == 0 && kSbOff % 16 == 0, "alignment");
  static_assert(kXChunks * kThreads == 2 * kTok * 8 && (kTok * 8) % kThreads == 0, "X copies: whole planes per i");
  static_assert(kWChunks * kThreads == (BK / 8) * (BR / 4), "weight copies");
  static_assert(kStages >= 3 && kNB * 4 * 128 * 4 <= kStageBytes * kStages, "ring, epilogue exchange");
};

// Two CTAs per SM (<= 128 registers, <= 108 KB of shared memory each).
template <int kMats, int kTok, bool kSym>
__global__ void __launch_bounds__(256, 2)
    int_wgmma_kernel(APlanes a, int row_div, TileList tiles, ExpertView w0, ExpertView w1, float* __restrict__ out) {
#if defined(MOESERVE_WGMMA_ENABLED)
  using T = WgT<kTok>;
  constexpr int S = T::kStages, NB = T::kNB, kThreads = T::kThreads;
  const int tile = int(blockIdx.y);
  if (tile >= *tiles.num_tiles) return;  // uniform over the CTA, before any barrier
  const int e = tiles.expert[tile], start = tiles.start[tile], count = tiles.count[tile];
  const int N = w0.N, K = w0.K, gsize = w0.group;
  const int n0 = int(blockIdx.x) * (T::BR / kMats);  // first column of each matrix
  const int KT = K / T::BK;                           // stages = units (U = 128)

  extern __shared__ __align__(16) unsigned char wg_raw[];
  uint32_t sbase = 0;
  unsigned char* smem = wgmma::align_smem_512(wg_raw, sbase);

  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wi = warp & 3, g = lane >> 2, t4 = lane & 3;

  // Rows no copy fills (past the slot count) and columns past N stay zero in every stage.
  for (int i = tid; i < S * T::kStageBytes / 16; i += kThreads)
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0u, 0u, 0u, 0u);

  // ---- this thread's copies (sources at k = 0; a stage adds kt·128 bytes / 16 word rows) ----
  // X: chunk c = tid + i·256 = (plane, row r, 16-byte chunk cc = tid % 8 of the 128 k).
  // Sources as 32-bit byte offsets into the plane (rows·K < 2^32: int_wgmma_serves; kNoRow: a row past
  // the slot count), so that the copy state stays in few registers.
  constexpr uint32_t kNoRow = 0xFFFFFFFFu;
  uint32_t xoff[T::kXChunks], xdst[T::kXChunks];
#pragma unroll
  for (int i = 0; i < T::kXChunks; ++i) {
    const int c = tid + i * kThreads, plane = c / (kTok * 8), r = (c / 8) % kTok, cc = c % 8;
    xoff[i] = r < count ? uint32_t(tiles.order[start + r] / row_div) * uint32_t(K) + uint32_t(cc * 16) : kNoRow;
    const int swz = 16 * ((cc % 4) ^ ((r >> 1) & 3));  // desc_sw64's chunk order
    xdst[i] = uint32_t((plane ? T::kLoOff : T::kHiOff) + (cc / 4) * T::kSub + r * 64 + swz);
  }
  // Weights: word rows tid / 32 and + 8, columns 4·(tid % 32) .. + 3 of the CTA's 128.
  const int wcol = 4 * (tid % 32), wrow = tid / 32;
  const int wmat = kMats == 2 ? wcol / 64 : 0;
  const int wn = n0 + (kMats == 2 ? wcol % 64 : wcol);
  const bool wvalid = wn < N;  // N % 8 == 0 (int_wgmma_serves): a chunk is all in or all out
  const int32_t* wsrc = (wmat ? w1.qweight : w0.qweight) + (size_t(e) * (K / 8) + wrow) * N + wn;
  const uint32_t wdst = uint32_t(T::kWOff + (wrow * T::kWStride + wcol) * 4);
  // Scales (threads 0..15: 8 columns each) and zero words (threads 16..31: one word of 8 columns).
  const int scol = 8 * (tid & 15);
  const int smat = kMats == 2 ? scol / 64 : 0;
  const int sn = n0 + (kMats == 2 ? scol % 64 : scol);
  const __half* sscales = smat ? w1.scales : w0.scales;
  const int32_t* szeros = smat ? w1.qzeros : w0.qzeros;
  const bool svalid = tid < 32 && sn < N && (tid < 16 || !kSym);
  // Slot metadata: thread tid < count copies row tid's s_b.
  const int mrow = tid < count && tid < kTok ? tiles.order[start + tid] / row_div : -1;
  const int blocks_per_row = K / 128;

  auto load_stage = [&](int slot, int kt) {
    const uint32_t st = sbase + uint32_t(slot * T::kStageBytes);
#pragma unroll
    for (int i = 0; i < T::kXChunks; ++i)  // chunk i's plane: i·256 / (kTok·8) (a plane is 1 or 2 x 256 chunks)
      if (xoff[i] != kNoRow)
        cp_async16(st + xdst[i], ((i * kThreads) / (kTok * 8) ? a.lo : a.hi) + xoff[i] + uint32_t(kt) * 128u);
    if (wvalid) {
      const int32_t* src = wsrc + size_t(kt) * 16 * N;
#pragma unroll
      for (int i = 0; i < T::kWChunks; ++i)
        cp_async16(st + wdst + uint32_t(i * 8 * T::kWStride * 4), src + size_t(i * 8) * N);
    }
    if (svalid) {
      const size_t grow = size_t(e) * (K / gsize) + size_t(kt * 128 / gsize);
      if (tid < 16)
        cp_async16(st + uint32_t(T::kScaleOff + scol * 2), sscales + grow * N + sn);
      else
        cp_async4(st + uint32_t(T::kZeroOff + (tid - 16) * 4), szeros + grow * (N / 8) + sn / 8);
    }
    if (mrow >= 0) cp_async4(st + uint32_t(T::kSbOff + tid * 4), a.sb + size_t(mrow) * blocks_per_row + kt);
  };

  // ---- this thread's fragments ----
  const int colA = 64 * wg + 16 * wi + g;  // stage column of D rows g (colA) and g + 8 (colA + 8)
  const uint32_t a_off = uint32_t(T::kWOff + (t4 * T::kWStride + colA) * 4);

  float acc[NB][4];
#pragma unroll
  for (int j = 0; j < NB; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[j][q] = 0.0f;
  int hs[NB][4], ls[NB][4];  // the unit's H', L' (exact integers)
  uint32_t af[4][4];         // the unit's A registers, kept until its group is done

  // Unit kt (stage slot `slot`): the A registers (q − z as s8: per byte (q + 128 − z) ^ 0x80, no
  // carry between bytes since 113 <= q + 128 − z <= 143), then the hi chain and the lo chain.
  auto issue = [&](int slot) {
    const unsigned char* stp = smem + slot * T::kStageBytes;
    const uint32_t st = sbase + uint32_t(slot * T::kStageBytes);
    uint32_t zc0 = 0x78787878u, zc1 = 0x78787878u;  // (128 − z)·0x01010101, z = 8
    if constexpr (!kSym) {
      const uint32_t zw0 = *reinterpret_cast<const uint32_t*>(stp + T::kZeroOff + (colA / 8) * 4);
      const uint32_t zw1 = *reinterpret_cast<const uint32_t*>(stp + T::kZeroOff + (colA / 8 + 1) * 4);
      zc0 = uint32_t(127 - int((zw0 >> (4 * (colA % 8))) & 0xFu)) * 0x01010101u;  // 128 − (stored + 1)
      zc1 = uint32_t(127 - int((zw1 >> (4 * (colA % 8))) & 0xFu)) * 0x01010101u;
    }
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      const uint32_t wa = *reinterpret_cast<const uint32_t*>(stp + a_off + kb * 4 * T::kWStride * 4);
      const uint32_t wb = *reinterpret_cast<const uint32_t*>(stp + a_off + kb * 4 * T::kWStride * 4 + 32);
      af[kb][0] = ((wa & 0x0F0F0F0Fu) + zc0) ^ 0x80808080u;
      af[kb][1] = ((wb & 0x0F0F0F0Fu) + zc1) ^ 0x80808080u;
      af[kb][2] = (((wa >> 4) & 0x0F0F0F0Fu) + zc0) ^ 0x80808080u;
      af[kb][3] = (((wb >> 4) & 0x0F0F0F0Fu) + zc1) ^ 0x80808080u;
    }
    wgmma::fence();
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
      wgmma::mma_m64nNk32_s8_rs<kTok, true>(
          hs, af[kb], wgmma::desc_sw64(st + uint32_t(T::kHiOff + (kb >> 1) * T::kSub + (kb & 1) * 32)), kb);
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
      wgmma::mma_m64nNk32_s8_rs<kTok, false>(
          ls, af[kb], wgmma::desc_sw64(st + uint32_t(T::kLoOff + (kb >> 1) * T::kSub + (kb & 1) * 32)), kb);
    wgmma::commit_group();
  };
  // After the wait: the accumulators are final and the A registers free from here on.
  auto pin = [&]() {
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        wgmma::fence_operand(hs[j][q]);
        wgmma::fence_operand(ls[j][q]);
      }
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
#pragma unroll
      for (int r = 0; r < 4; ++r) wgmma::fence_operand(af[kb][r]);
  };
  // fold_unit of the unit in stage slot `slot`: acc = fma(RN(D_u), s_b·scale, acc), with H', L' exact
  // floats through the bias 0x4B400000 (|H'| < 2^19, |L'| < 2^20).
  auto fold = [&](int slot) {
    const unsigned char* stp = smem + slot * T::kStageBytes;
    const float sc0 = __half2float(*reinterpret_cast<const __half*>(stp + T::kScaleOff + colA * 2));
    const float sc1 = __half2float(*reinterpret_cast<const __half*>(stp + T::kScaleOff + (colA + 8) * 2));
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      if (8 * j >= count) break;  // n8 blocks past the tile's slots (CTA-uniform): nothing to fold
      const float2 sbp = *reinterpret_cast<const float2*>(stp + T::kSbOff + (8 * j + 2 * t4) * 4);  // slots n, n+1
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float hf = __fsub_rn(__int_as_float(hs[j][q] + kMagicBits), kMagic);
        const float lf = __fsub_rn(__int_as_float(ls[j][q] + kMagicBits), kMagic);
        const float d = __fmaf_rn(hf, 256.0f, lf);
        acc[j][q] = __fmaf_rn(d, __fmul_rn((q & 1) ? sbp.y : sbp.x, q < 2 ? sc0 : sc1), acc[j][q]);
      }
    }
  };

  __syncthreads();  // the zeroing is done before any copy lands
#pragma unroll
  for (int s = 0; s < S - 2; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();  // always (possibly empty): the group count stays uniform
  }
  // Stage kt: wait for its copies (everyone's, after the barrier, which also orders every thread's
  // fold of unit kt − 1 before its slot is refilled two stages later), refill the slot of stage
  // kt − 2, issue unit kt, wait for it and fold it. The two warpgroups of a CTA and the two CTAs of
  // an SM keep the tensor cores busy while one of them folds.
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<S - 3>();  // this thread's copies of stage kt have landed
    wgmma::fence_proxy_async_shared();
    __syncthreads();
    const int ahead = kt + S - 2;
    if (ahead < KT) load_stage(ahead % S, ahead);
    cp_async_commit();
    issue(kt % S);
    wgmma::wait_group<0>();
    pin();
    fold(kt % S);
  }
  cp_async_wait<0>();

  // ---- epilogue: acc[j][q] is column colA (+8 for q >= 2) x slot 8j + 2·t4 + (q & 1) ----
  if constexpr (kMats == 2) {
    __syncthreads();  // every thread is done with the stages: reuse them for the gate values
    float* xch = reinterpret_cast<float*>(smem);
    const int ti = tid & 127;
    if (wg == 0) {
#pragma unroll
      for (int j = 0; j < NB; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) xch[(j * 4 + q) * 128 + ti] = acc[j][q];
    }
    __syncthreads();
    if (wg == 1) {
#pragma unroll
      for (int j = 0; j < NB; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int r = 8 * j + 2 * t4 + (q & 1), col = n0 + 16 * wi + g + (q >= 2 ? 8 : 0);
          if (r < count && col < N)
            out[size_t(tiles.order[start + r]) * N + col] = silu_mul_rn(xch[(j * 4 + q) * 128 + ti], acc[j][q]);
        }
    }
  } else {
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int r = 8 * j + 2 * t4 + (q & 1), col = n0 + colA + (q >= 2 ? 8 : 0);
        if (r < count && col < N) out[size_t(tiles.order[start + r]) * N + col] = acc[j][q];
      }
  }
#else
  using T = WgT<kTok>;  // (referenced, so that the sm_121 pass does not warn)
  static_assert(T::kStages > 0, "tile");
  (void)a, (void)row_div, (void)tiles, (void)w0, (void)w1, (void)out;
  __trap();  // never launched: int_wgmma_serves is false without sm_90a code
#endif
}

template <int kMats, int kTok, bool kSym>
void launch(const APlanes& a, int row_div, const TileList& tiles, int grid_tiles, const ExpertView& w0,
            const ExpertView& w1, float* out, cudaStream_t stream) {
  using T = WgT<kTok>;
  if (grid_tiles <= 0) return;
  opt_in_dynamic_smem<int_wgmma_kernel<kMats, kTok, kSym>>(T::kSmemBytes, true);
  const int cols = T::BR / kMats;
  const dim3 grid(unsigned((w0.N + cols - 1) / cols), unsigned(grid_tiles));
  int_wgmma_kernel<kMats, kTok, kSym><<<grid, T::kThreads, T::kSmemBytes, stream>>>(a, row_div, tiles, w0, w1, out);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

template <int kMats, int kTok>
void launch_sym(bool sym, const APlanes& a, int row_div, const TileList& tiles, int grid_tiles, const ExpertView& w0,
                const ExpertView& w1, float* out, cudaStream_t stream) {
  if (sym)
    launch<kMats, kTok, true>(a, row_div, tiles, grid_tiles, w0, w1, out, stream);
  else
    launch<kMats, kTok, false>(a, row_div, tiles, grid_tiles, w0, w1, out, stream);
}

}  // namespace

bool int_wgmma_serves(int U, int K, int N, long long rows) {
#if defined(MOESERVE_CUDA_SM90A)
  return moe_int_wgmma() && U == 128 && K % 128 == 0 && N % 8 == 0 && rows >= 0 &&
         static_cast<unsigned long long>(rows) * static_cast<unsigned long long>(K) < (1ULL << 32) &&
         current_device_compute_capability() == 90;
#else
  (void)U, (void)K, (void)N, (void)rows;
  return false;
#endif
}

void int_wgmma_launch(int kMats, int tile_slots, bool sym, const APlanes& a, int row_div, const TileList& tiles,
                      int grid_tiles, const ExpertView& w0, const ExpertView& w1, float* out, cudaStream_t stream) {
  if (!int_wgmma_serves(128, w0.K, w0.N, 0))
    throw Error("moe_int_wgmma: needs an sm_90 GPU, a build with sm_90a code, K % 128 == 0 and N % 8 == 0");
  if (kMats == 2 && tile_slots == 64)
    launch_sym<2, 64>(sym, a, row_div, tiles, grid_tiles, w0, w1, out, stream);
  else if (kMats == 2 && tile_slots == 32)
    launch_sym<2, 32>(sym, a, row_div, tiles, grid_tiles, w0, w1, out, stream);
  else if (kMats == 1 && tile_slots == 64)
    launch_sym<1, 64>(sym, a, row_div, tiles, grid_tiles, w0, w1, out, stream);
  else if (kMats == 1 && tile_slots == 32)
    launch_sym<1, 32>(sym, a, row_div, tiles, grid_tiles, w0, w1, out, stream);
  else
    throw Error("moe_int_wgmma: tiles of " + std::to_string(tile_slots) + " slots, " + std::to_string(kMats) +
                " matrices are not a kernel");
}

}  // namespace moeserve::cuda::moe_int_detail
