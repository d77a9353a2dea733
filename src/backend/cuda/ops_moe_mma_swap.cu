// swapAB expert kernels (ops_moe_mma_swap.cuh): moe_routed_experts_mma's variant 8 at decode sizes
// (<= 4 slots per expert on average, GPTQ INT4 experts). The prompt path's small tiling puts a
// tile's slots in the m16 rows of the MMA (15 of 16 rows empty at batch 1); here the expert's
// weight columns are the MMA's A operand (16 output columns per m16 fragment) and the tile's <= 8
// slots its B operand (one n8 fragment), so an empty slot wastes an MMA column, not dequantisation.
//
// Bits. Every output gets exactly the word form's (ops_moe_mma.cu kernel form 3) operations: per
// group of g k (in ascending order), for each 32-k block, for its two k16 steps s in order,
// C = mma(x_hi, B, C) then C = mma(x_lo, B, C), C = +0 at the group's first MMA (RZ, mma_bf16_zc),
// B = the exact bf16 (q − zero), the activations' k permuted inside the block (kperm32_logical); then
// acc = fma(C, float(scale[group][n]), acc) from acc = +0. An MMA computes D[i][j] from A row i,
// B column j and C[i][j] only, so with the operands swapped the element (n, slot) sees the same 16
// exact products at the same k positions and the same C: the same bits (the GPU test
// SwapTilingMatchesWordFormBitForBit checks it). gate_up: act = silu_mul_rn(gate, up), split to hi /
// lo bf16 (split2) at the permuted position; down: y[slot][n] = acc (f32); combine_routed follows.
//
// Layout. qweight [E][K/8][N] int32 (word (kw, n): k 8kw .. 8kw+7 of column n, low nibble first),
// scales f16 [E][K/g][N], qzeros [E][K/g][N/8] (stored zero − 1), all as checkpointed. gate_up:
// x f32 [M, H] (token = slot / top_k), act_hi / act_lo bf16 [M·k, I] by order position p (each
// 32-k block permuted: the word form's down input, the prompt path's act buffer); down: act planes
// in, y f32 [M·k, H] by slot.
//
// Parallelisation. Grid (N / columns per CTA, max_tiles): CTA (nb, t) computes tile t's <= 8 slots
// x 32 weight columns over ALL of K: gate_up 16 gate + 16 up columns n0 = 16·nb .. (the SwiGLU is
// CTA-local), down 32 columns n0 = 32·nb ..; CTAs at or past *num_tiles exit after the PDL wait.
// 4 warps split K at GROUP granularity: round r = groups 4r .. 4r + 3, warp w computes group 4r + w
// (each group's C is independent), stores its raw C in shared memory, and after a barrier each
// thread folds its two outputs (column c and 16 + c, slot j: tid = 8c + j) over the round's 4
// groups IN ORDER (acc = fma(C, s, acc)), so every output sees the word form's sequence of ops.
// Per warp and group the two m16 fragments cover the CTA's 32 columns: thread (g = lane / 4,
// t4 = lane % 4) owns the stage columns 4g .. 4g + 3 (fragment f rows g, g + 8 <- columns 4g + 2f,
// 4g + 2f + 1), so ONE 16-byte LDS gives it the 4 words of its A rows for a 32-k block (word row
// t4 of the block: with the kperm32 order thread t4's A registers of both k16 steps come from word
// t4 of each row: A regs a0..a3 = (row g, k lo), (row g + 8, k lo), (row g, k hi), (row g + 8, k hi)
// of step s = nibble pairs (j, j + 4), j = 2s (k lo) or 2s + 1 (k hi), converted exactly as form 3
// converts its B word: 3 SHF, 4 LOP3 ((x & 0x000F000F) | 0x43004300 in one lop3), 4 HSUB2 per word.
// B fragments (b0 = k 2t4.., b1 = k 2t4 + 8.. of slot g), one ldmatrix.x4 per plane and block from
// bf16 hi / lo planes in the kperm32 order: down from the act planes (copied per round), gate_up
// from the tile's x split ONCE per CTA in its prologue (the fused split, no split launch: x f32 rows
// read with 16-byte loads, split2 into the planes exactly as split_rows_perm32_kernel pairs them)
// when count·(K + 8)·4 bytes fit the stages' activation region (the 122B shape, K 3072: up to 4
// slots at g 64 / 128, 2 at g 32; decode tiles mostly hold 1-2), else (bigger tiles) x f32 copied
// per round and split in registers: thread (g, t4) reads x[slot g][8t4 .. 8t4 + 7] of the block
// (2 LDS.128) and builds b(s, h) = split2(x[8t4 + 2s + h], x[8t4 + 4 + 2s + h]), the same pairs.
// Weights, scales, zeros and activations of a round form one stage of a cp.async ring (16-byte
// copies; a packed word row of the CTA is 2 x 64 (gate_up) or 128 (down) contiguous bytes), kStages
// stages, kStages − 1 rounds in flight while one is computed; two barriers per round (stage landed
// / C stored). Activation rows past the tile's slot count are never copied (zeroed once; their MMA
// columns are computed and discarded).
//
// Shared memory: C [4][32][10] f32 (5 KB), then per stage (KR = 4g k) words [KR/8][40] (32 columns
// + 8 pad: the 16-byte LDS of thread (g, t4) at word row t4, column 4g hit distinct banks), scales
// f16 [4][32], zero words [4][4]; then per stage the activations: x f32 [8][KR + 4] (gate_up; the
// two LDS.128 conflict-free) or act hi / lo bf16 [8][KR + 8] (down; odd 16-byte units per row:
// conflict-free ldmatrix). The stages' activations are one region, which gate_up's whole-tile x
// planes ([count][K + 8] x 2, odd 16-byte units per row) reuse. g 128: 3 stages (gate_up 84.3 KB,
// down 84.7 KB); g 64: 6 (85.6 / 86.4 KB); g 32: 8 (60.5 / 61.5 KB): 2 (3 at g 32) CTAs per SM on the
// H200, 1 on the DGX Spark (99 KB per block).
//
// Roofline (122B-A10B: E 256, top-8, H 3072, I 1024, g 128). Bytes: every tile reads its expert's
// gate / up / down words once (4.7 MB per expert, 1.5% scales) plus its slots' activations from L2
// once per column block (gate_up: 4·H bytes per slot per CTA, 64 CTAs per tile; down: 4·I per slot,
// 96 CTAs): at batch 1, 8 tiles: 37.7 MB of weights (~8.8 us at 4.3 TB/s). CTAs: gate_up
// I/16 = 64 per tile (512 at batch 1), down H/32 = 96 per tile (768), each streaming 16·K bytes of
// words (gate_up 48 KB, down 16 KB). MMA work: 8 MMAs per warp per 32-k block = 2 MMAs per weight
// word (hi and lo, 8 slot columns each), far below the tensor cores' rate; the cost is the
// instructions per weight word (SASS of the inner loop, see INSTRUCTIONS below) and the bytes in
// flight ((kStages − 1) rounds of words per CTA: g 128 2 x 8 KB, g 32 7 x 2 KB, + activations).
//
// Instructions per weight word (no cuobjdump / nvdisasm on the build machine: counted as the growth
// of the cubin's .text when the block loop runs 1 and 2 extra 32-k blocks, / 16 bytes per
// instruction; sm_121 steady at 56 per block of 4 words per thread, sm_90 56 at g 64 (its other
// deltas are noisy: scheduling changes around the loop)): per block and thread 1 LDS.128 (the 4
// words), 2 LDSM.x4 (B hi, lo), 12 SHF, 16 LOP3, 16 HSUB2, 8 HMMA (+ ~1 address): 14 per weight word,
// for 2 MMAs per word. gate_up's in-register-split path (tiles too big for the whole-tile planes)
// costs 88 per block: 22 per word (2 LDS.128 + 4 split2 instead of the 2 LDSM).
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/ops_moe_mma_swap.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace moeserve::cuda {
namespace {

using namespace moe_detail;
using namespace mma_frag;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kSmemBudget = 96 * 1024;

constexpr int cmin(int a, int b) { return a < b ? a : b; }

// One CTA shape: gate_up (kGateUp: 16 gate + 16 up columns) or down (32 columns), group size G.
template <bool kGateUp, int G>
struct SwapCfg {
  static constexpr int KR = kWarps * G;  // k per round: one group per warp
  static constexpr int kWRows = KR / 8;  // packed word rows per round
  static constexpr int kWStride = 40;    // words per stage row: 32 columns + 8 (conflict-free LDS.128)
  static constexpr int kWBytes = kWRows * kWStride * 4;
  static constexpr int kXStride = KR + 4;  // gate_up: f32 per x row (conflict-free LDS.128)
  static constexpr int kPStride = KR + 8;  // down: bf16 per act row and plane (conflict-free ldmatrix)
  static constexpr int kPlaneBytes = kSwapTile * kPStride * 2;
  static constexpr int kActBytes = kGateUp ? kSwapTile * kXStride * 4 : 2 * kPlaneBytes;
  static constexpr int kScaleOff = kWBytes;                     // f16 [kWarps][32]
  static constexpr int kZeroOff = kScaleOff + kWarps * 32 * 2;  // u32 [kWarps][4]
  static constexpr int kStageBytes = kZeroOff + kWarps * 4 * 4;  // a stage's words, scales, zeros
  static constexpr int kCStride = 10;  // floats per C row (column) [slot]: 8 + 2 (fewer conflicts)
  static constexpr int kCBytes = kWarps * 32 * kCStride * 4;
  static constexpr int kStages = cmin(8, (kSmemBudget - kCBytes) / (kStageBytes + kActBytes));
  // Shared memory: C, then the stages' words / scales / zeros, then the stages' activations (one
  // contiguous region: gate_up uses it whole for the tile's split x planes when they fit).
  static constexpr int kActBase = kCBytes + kStages * kStageBytes;
  static constexpr int kSmemBytes = kActBase + kStages * kActBytes;
  static_assert(G == 32 || G == 64 || G == 128, "GPTQ groups");
  static_assert(KR % kThreads == 0, "whole weight chunks per thread");
  static_assert(kWBytes % 16 == 0 && kActBytes % 16 == 0 && kZeroOff % 16 == 0 && kStageBytes % 16 == 0 &&
                    kCBytes % 16 == 0,
                "16-byte aligned stage parts");
  static_assert((kPStride / 8) % 2 == 1, "odd 16-byte units per act row: conflict-free ldmatrix");
  static_assert(kXStride % 32 == 4, "x rows 4 banks apart: conflict-free LDS.128");
  static_assert(kStages >= 2, "at least double buffering");
  static_assert(kSmemBytes <= 99 * 1024, "DGX Spark: <= 99 KB of shared memory per block");
};

// One CTA: tile blockIdx.y (slots order[start .. start + count) of expert e, count <= 8) x the 32
// weight columns of column block blockIdx.x, over all of K.
//   gate_up (kGateUp): x f32 rows (row = slot / top_k) -> act_hi / act_lo [p][N] (permuted);
//                      w0 = gate, w1 = up, stage columns 0..15 gate n0.., 16..31 up n0..
//   down:              act planes (row p = order position) -> y [slot][N]; w0 = w1 = down,
//                      stage columns 0..31 = n0 ..
template <bool kGateUp, int G>
__global__ void __launch_bounds__(kThreads)
    swap_kernel(const float* __restrict__ x, const bf16* __restrict__ a_hi, const bf16* __restrict__ a_lo, int top_k,
                TileList tiles, ExpertView w0, ExpertView w1, bf16* __restrict__ out_hi, bf16* __restrict__ out_lo,
                float* __restrict__ out_y) {
  using C = SwapCfg<kGateUp, G>;
  constexpr int KR = C::KR, kStages = C::kStages;
  pdl_wait();  // the tiles, x / act planes and the outputs belong to earlier kernels
  const int t = int(blockIdx.y);
  if (t >= __ldcg(tiles.num_tiles)) return;  // uniform over the CTA, before any barrier
  const int e = __ldcg(tiles.expert + t), start = __ldcg(tiles.start + t), count = __ldcg(tiles.count + t);
  const int N = w0.N, K = w0.K;
  const int n0 = int(blockIdx.x) * (kGateUp ? 16 : 32);
  const int groups = K / G, rounds = (groups + kWarps - 1) / kWarps;

  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int src_row[kSwapTile];  // gate_up: x row of each slot; down: act row
  const uint32_t sbase = uint32_t(__cvta_generic_to_shared(smem));
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  float* cbuf = reinterpret_cast<float*>(smem);
  auto stage_ptr = [&](int s) { return smem + C::kCBytes + s * C::kStageBytes; };
  auto act_off = [&](int s) { return C::kActBase + s * C::kActBytes; };  // stage s's activations (bytes)

  // gate_up: when the tile's split x planes (hi, lo bf16 [count][K + 8], k permuted per 32-k block)
  // fit the activation region, the CTA splits x once (below) and no round copies x.
  const bool whole_x = kGateUp && count * (K + 8) * 4 <= kStages * C::kActBytes;
  // Zero the stages' activation rows once (rows past count are never copied: finite B columns).
  if (!whole_x)
    for (int i = tid; i < kStages * C::kActBytes / 16; i += kThreads)
      reinterpret_cast<uint4*>(smem + C::kActBase)[i] = make_uint4(0u, 0u, 0u, 0u);
  if (tid < count) src_row[tid] = kGateUp ? __ldcg(tiles.order + start + tid) / top_k : start + tid;
  pdl_launch_dependents();
  __syncthreads();  // src_row and the zeroing before any copy or read

  const bool sym0 = w0.sym, sym1 = w1.sym;
  const int32_t* qw0 = w0.qweight + size_t(e) * (K / 8) * N + n0;
  const int32_t* qw1 = w1.qweight + size_t(e) * (K / 8) * N + n0;

  // Round r's stage: word rows r·KR/8 .., its groups' scales and zero words, the slots' activations.
  auto load_stage = [&](int s, int r) {
    const uint32_t st = sbase + uint32_t(C::kCBytes + s * C::kStageBytes), sa = sbase + uint32_t(act_off(s));
    const int kw0 = r * C::kWRows, k0 = r * KR;
#pragma unroll
    for (int i = 0; i < C::kWRows * 8 / kThreads; ++i) {  // 8 chunks of 4 columns per word row
      const int c = tid + i * kThreads, row = c >> 3, q = c & 7;
      if (kw0 + row < K / 8) {
        const int32_t* src = kGateUp ? (q < 4 ? qw0 : qw1) + size_t(kw0 + row) * N + 4 * (q & 3)
                                     : qw0 + size_t(kw0 + row) * N + 4 * q;
        cp_async16(st + uint32_t((row * C::kWStride + 4 * q) * 4), src);
      }
    }
    if constexpr (kGateUp) {  // x f32, KR/4 chunks per slot row
      constexpr int kCPR = KR / 4;
      if (!whole_x)
        for (int c = tid; c < count * kCPR; c += kThreads) {
          const int j = c / kCPR, q = c % kCPR;
          if (k0 + 4 * q < K)
            cp_async16(sa + uint32_t((j * C::kXStride + 4 * q) * 4), x + size_t(src_row[j]) * K + k0 + 4 * q);
        }
    } else {  // act hi / lo bf16, KR/8 chunks per slot row and plane
      constexpr int kCPR = KR / 8;
      for (int c = tid; c < count * kCPR; c += kThreads) {
        const int j = c / kCPR, q = c % kCPR;
        if (k0 + 8 * q < K) {
          const size_t off = size_t(src_row[j]) * K + k0 + 8 * q;
          const uint32_t d = sa + uint32_t((j * C::kPStride + 8 * q) * 2);
          cp_async16(d, a_hi + off);
          cp_async16(d + C::kPlaneBytes, a_lo + off);
        }
      }
    }
    if (tid < kWarps * 4) {  // scales: 4 chunks of 8 columns per group; each chunk's zero word
      const int w = tid >> 2, q = tid & 3, gi = r * kWarps + w;
      if (gi < groups) {
        const bool m1 = kGateUp && q >= 2;
        const int n = n0 + (kGateUp ? 8 * (q & 1) : 8 * q);
        const size_t grow = size_t(e) * groups + gi;
        cp_async16(st + uint32_t(C::kScaleOff + (w * 32 + 8 * q) * 2), (m1 ? w1.scales : w0.scales) + grow * N + n);
        if (!(m1 ? sym1 : sym0))
          cp_async4(st + uint32_t(C::kZeroOff + (w * 4 + q) * 4), (m1 ? w1.qzeros : w0.qzeros) + grow * (N / 8) + n / 8);
      }
    }
  };

  // This thread's A rows: stage columns 4g .. 4g + 3 (gate_up: gate for g < 4, up for g >= 4).
  const bool my_sym = kGateUp ? (g < 4 ? sym0 : sym1) : sym0;
  const uint32_t magic = 0x43004300u | (uint32_t(blockDim.x) >> 31);  // opaque: stays in a register
  // ldmatrix lane offset (down): row lane % 8, 8-k matrix lane / 8 of a 32-k block.
  const uint32_t lm_off = uint32_t(((lane & 7) * C::kPStride + (lane >> 3) * 8) * 2);

  // whole_x: the ldmatrix lane offset into the tile's x planes (row lane % 8, clamped to the last
  // slot: columns past count read a copy of it, computed and discarded) and the lo plane's offset.
  const uint32_t xp_off = uint32_t((min(lane & 7, count - 1) * (K + 8) + (lane >> 3) * 8) * 2);
  const uint32_t xp_lo = uint32_t(count * (K + 8) * 2);

  // Warp `warp`'s group of round r (its groups' k start at r·KR + warp·G): its raw C to
  // cbuf[warp][column][slot]. planes (gate_up): B from the tile's split x planes, else split in registers.
  auto compute_group = [&](int s, int r, int gi_local, auto planes) {
    const unsigned char* st = stage_ptr(s);
    uint32_t zz[4];
    if (my_sym) {
#pragma unroll
      for (int q = 0; q < 4; ++q) zz[q] = 0x43084308u;  // bf16 pair (128 + 8)
    } else {
      const uint32_t zw = *reinterpret_cast<const uint32_t*>(st + C::kZeroOff + (gi_local * 4 + (g >> 1)) * 4);
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // column 4g + q: nibble (4g + q) % 8 of zero word (4g + q) / 8
        const uint32_t z = 0x4300u + ((zw >> (4 * (4 * (g & 1) + q))) & 0xFu) + 1u;
        zz[q] = z | (z << 16);
      }
    }
    float c[2][4];
    const int kbase = gi_local * G;  // the group's first k in the stage
#pragma unroll
    for (int kb = 0; kb < G / 32; ++kb) {
      const uint4 wv =
          *reinterpret_cast<const uint4*>(st + (((kbase + kb * 32) / 8 + t4) * C::kWStride + 4 * g) * 4);
      const uint32_t wd[4] = {wv.x, wv.y, wv.z, wv.w};
      // B fragments of the block: bh[s][h], bl[s][h] (step s, register h: k 16s + 8h + 2t4 ..).
      uint32_t bh[2][2], bl[2][2];
      if constexpr (kGateUp && decltype(planes)::value) {
        const uint32_t p = sbase + uint32_t(C::kActBase) + xp_off + uint32_t((r * KR + kbase + kb * 32) * 2);
        uint32_t rh[4], rl[4];
        ldmatrix_x4(p, rh);
        ldmatrix_x4(p + xp_lo, rl);
        bh[0][0] = rh[0], bh[0][1] = rh[1], bh[1][0] = rh[2], bh[1][1] = rh[3];
        bl[0][0] = rl[0], bl[0][1] = rl[1], bl[1][0] = rl[2], bl[1][1] = rl[3];
      } else if constexpr (kGateUp) {
        const float* xr = reinterpret_cast<const float*>(smem + act_off(s)) + g * C::kXStride + kbase + kb * 32 + 8 * t4;
        const float4 xa = *reinterpret_cast<const float4*>(xr), xb = *reinterpret_cast<const float4*>(xr + 4);
        // logical 16s + 8h + 2t4 + i <- physical 8t4 + 4i + 2s + h (kperm32_logical)
        split2(xa.x, xb.x, bh[0][0], bl[0][0]);
        split2(xa.y, xb.y, bh[0][1], bl[0][1]);
        split2(xa.z, xb.z, bh[1][0], bl[1][0]);
        split2(xa.w, xb.w, bh[1][1], bl[1][1]);
      } else {
        const uint32_t p = sbase + uint32_t(act_off(s)) + lm_off + uint32_t((kbase + kb * 32) * 2);
        uint32_t rh[4], rl[4];
        ldmatrix_x4(p, rh);
        ldmatrix_x4(p + C::kPlaneBytes, rl);
        bh[0][0] = rh[0], bh[0][1] = rh[1], bh[1][0] = rh[2], bh[1][1] = rh[3];
        bl[0][0] = rl[0], bl[0][1] = rl[1], bl[1][0] = rl[2], bl[1][1] = rl[3];
      }
      // A fragments: a[f][s] = {(row g, j), (row g + 8, j), (row g, j + 1), (row g + 8, j + 1)}, j = 2s,
      // each the nibble pair (j', j' + 4) of the row's word; fragment f rows g, g + 8 = words 2f, 2f + 1.
      uint32_t a[2][2][4];
#pragma unroll
      for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int s2 = 0; s2 < 2; ++s2) {
          a[f][s2][0] = gptq_nibbles_j_j4_to_bf16x2(wd[2 * f] >> (8 * s2), magic, zz[2 * f]);
          a[f][s2][1] = gptq_nibbles_j_j4_to_bf16x2(wd[2 * f + 1] >> (8 * s2), magic, zz[2 * f + 1]);
          a[f][s2][2] = gptq_nibbles_j_j4_to_bf16x2(wd[2 * f] >> (8 * s2 + 4), magic, zz[2 * f]);
          a[f][s2][3] = gptq_nibbles_j_j4_to_bf16x2(wd[2 * f + 1] >> (8 * s2 + 4), magic, zz[2 * f + 1]);
        }
      // Per output: step 0 hi, step 0 lo, step 1 hi, step 1 lo; the group's first MMA from C = +0.
#pragma unroll
      for (int s2 = 0; s2 < 2; ++s2) {
#pragma unroll
        for (int f = 0; f < 2; ++f) {
          if (kb == 0 && s2 == 0)
            mma_bf16_zc(c[f], a[f][0], bh[0][0], bh[0][1]);
          else
            mma_bf16(c[f], a[f][s2], bh[s2][0], bh[s2][1]);
        }
#pragma unroll
        for (int f = 0; f < 2; ++f) mma_bf16(c[f], a[f][s2], bl[s2][0], bl[s2][1]);
      }
    }
    // C element q of fragment f: A row g (+8 for q >= 2) = stage column 4g + 2f (+1), slot 2t4 + (q & 1).
#pragma unroll
    for (int f = 0; f < 2; ++f) {
      float* row = cbuf + (gi_local * 32 + 4 * g + 2 * f) * C::kCStride + 2 * t4;
      *reinterpret_cast<float2*>(row) = make_float2(c[f][0], c[f][1]);
      *reinterpret_cast<float2*>(row + C::kCStride) = make_float2(c[f][2], c[f][3]);
    }
  };

  // The fold: thread (fc, fj) owns stage columns fc and 16 + fc of slot fj.
  const int fc = tid >> 3, fj = tid & 7;
  float acc0 = 0.f, acc1 = 0.f;

  // ---- the ring: kStages − 1 rounds in flight while one is computed ----
#pragma unroll 1  // one copy of load_stage's code for the prologue (up to 7 rounds)
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < rounds) load_stage(s, s);
    cp_async_commit();  // always (possibly empty): the group count stays uniform
  }
  if (whole_x) {  // split the tile's x rows into the planes (split_rows_perm32_kernel's pairs)
    // Unit u: 8 consecutive k of row j (word t = u % 4 of its 32-k block): physical k 8t + j' and
    // 8t + 4 + j' form the bf16 pair at logical 8j' + 2t, i.e. u32 16·block + t + 4j' of the row.
    uint32_t* hp = reinterpret_cast<uint32_t*>(smem + C::kActBase);
    uint32_t* lp = hp + xp_lo / 4;
    const int upr = K / 8;  // units per row
    for (int u = tid; u < count * upr; u += kThreads) {
      const int j = u / upr, ku = u % upr;
      const float4* src = reinterpret_cast<const float4*>(x + size_t(src_row[j]) * K) + 2 * ku;
      const float4 a = __ldcg(src), b = __ldcg(src + 1);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
      const int base = j * ((K + 8) / 2) + (ku >> 2) * 16 + (ku & 3);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        uint32_t h, l;
        split2(av[jj], bv[jj], h, l);
        hp[base + 4 * jj] = h;
        lp[base + 4 * jj] = l;
      }
    }
  }  // visible to all warps after the first round's barrier
  for (int r = 0; r < rounds; ++r) {
    cp_async_wait<kStages - 2>();  // this thread's copies of round r have landed
    __syncthreads();               // everyone's; everyone finished round r − 1 (its fold too)
    const int next = r + kStages - 1;
    if (next < rounds) load_stage(next % kStages, next);  // the stage of round r − 1
    cp_async_commit();
    const int s = r % kStages;
    if (r * kWarps + warp < groups) {  // warp-uniform
      if (whole_x)
        compute_group(s, r, warp, std::true_type{});
      else
        compute_group(s, r, warp, std::false_type{});
    }
    __syncthreads();  // the round's C are stored
    if (fj < count) {
      const __half* sc = reinterpret_cast<const __half*>(stage_ptr(s) + C::kScaleOff);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        if (r * kWarps + w >= groups) break;  // groups in order: the round's valid ones first
        acc0 = __fmaf_rn(cbuf[(w * 32 + fc) * C::kCStride + fj], __half2float(sc[w * 32 + fc]), acc0);
        acc1 = __fmaf_rn(cbuf[(w * 32 + 16 + fc) * C::kCStride + fj], __half2float(sc[w * 32 + 16 + fc]), acc1);
      }
    }
  }
  cp_async_wait<0>();

  // ---- epilogue ----
  if (fj >= count) return;
  if constexpr (kGateUp) {  // column n of gate (acc0) and up (acc1): the down kernel's permuted A planes
    const int n = n0 + fc;
    uint32_t hi, lo;
    split2(silu_mul_rn(acc0, acc1), 0.f, hi, lo);  // the low halves: split2 of the value alone
    const size_t o = size_t(start + fj) * N + (n & ~31) + kperm32_logical(n & 31);
    out_hi[o] = __ushort_as_bfloat16(uint16_t(hi & 0xFFFFu));
    out_lo[o] = __ushort_as_bfloat16(uint16_t(lo & 0xFFFFu));
  } else {
    float* orow = out_y + size_t(__ldcg(tiles.order + start + fj)) * N + n0;
    orow[fc] = acc0;
    orow[16 + fc] = acc1;
  }
}

template <bool kGateUp, int G>
void launch_swap(const float* x, const bf16* a_hi, const bf16* a_lo, int top_k, const TileList& tiles, int grid_tiles,
                 const ExpertView& w0, const ExpertView& w1, bf16* out_hi, bf16* out_lo, float* out_y,
                 cudaStream_t stream) {
  using C = SwapCfg<kGateUp, G>;
  opt_in_dynamic_smem<swap_kernel<kGateUp, G>>(C::kSmemBytes, true);
  const dim3 grid(unsigned(w0.N / (kGateUp ? 16 : 32)), unsigned(grid_tiles));
  launch_pdl(true, swap_kernel<kGateUp, G>, grid, dim3(kThreads), size_t(C::kSmemBytes), stream, x, a_hi, a_lo, top_k,
             tiles, w0, w1, out_hi, out_lo, out_y);
}

template <bool kGateUp>
void launch_swap_group(int group, const float* x, const bf16* a_hi, const bf16* a_lo, int top_k, const TileList& tiles,
                       int grid_tiles, const ExpertView& w0, const ExpertView& w1, bf16* out_hi, bf16* out_lo,
                       float* out_y, cudaStream_t stream) {
  switch (group) {
    case 32:
      launch_swap<kGateUp, 32>(x, a_hi, a_lo, top_k, tiles, grid_tiles, w0, w1, out_hi, out_lo, out_y, stream);
      break;
    case 64:
      launch_swap<kGateUp, 64>(x, a_hi, a_lo, top_k, tiles, grid_tiles, w0, w1, out_hi, out_lo, out_y, stream);
      break;
    case 128:
      launch_swap<kGateUp, 128>(x, a_hi, a_lo, top_k, tiles, grid_tiles, w0, w1, out_hi, out_lo, out_y, stream);
      break;
    default:
      throw Error("moe_mma swap: GPTQ group must be 32, 64 or 128");
  }
}

}  // namespace

namespace moe_detail {

bool swap_supported(const MoeShape& s, const DeviceExperts& ex) {
  auto ok = [](const DeviceLinear& d) {
    return d.format == quant::WeightFormat::GptqInt4 && d.g_idx.size() == 0 &&
           (d.group_size == 32 || d.group_size == 64 || d.group_size == 128) && d.K % d.group_size == 0 &&
           d.N % 32 == 0 && d.K % 32 == 0;
  };
  return ok(ex.gate) && ok(ex.up) && ok(ex.down) && ex.gate.group_size == ex.up.group_size &&
         ex.gate.N == s.intermediate && ex.gate.K == s.hidden && ex.down.N == s.hidden && ex.down.K == s.intermediate;
}

void swap_gate_up(const float* x, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
                  bf16* act_hi, bf16* act_lo, cudaStream_t stream) {
  const ExpertView g = view_of(ex.gate), u = view_of(ex.up);
  launch_swap_group<true>(g.group, x, nullptr, nullptr, s.top_k, tiles, grid_tiles, g, u, act_hi, act_lo, nullptr,
                          stream);
}

void swap_down(const bf16* act_hi, const bf16* act_lo, const MoeShape& s, const DeviceExperts& ex,
               const TileList& tiles, int grid_tiles, float* y, cudaStream_t stream) {
  const ExpertView d = view_of(ex.down);
  launch_swap_group<false>(d.group, nullptr, act_hi, act_lo, s.top_k, tiles, grid_tiles, d, d, nullptr, nullptr, y,
                           stream);
}

void swap_prepare() {
  opt_in_dynamic_smem<swap_kernel<true, 32>>(SwapCfg<true, 32>::kSmemBytes, true);
  opt_in_dynamic_smem<swap_kernel<true, 64>>(SwapCfg<true, 64>::kSmemBytes, true);
  opt_in_dynamic_smem<swap_kernel<true, 128>>(SwapCfg<true, 128>::kSmemBytes, true);
  opt_in_dynamic_smem<swap_kernel<false, 32>>(SwapCfg<false, 32>::kSmemBytes, true);
  opt_in_dynamic_smem<swap_kernel<false, 64>>(SwapCfg<false, 64>::kSmemBytes, true);
  opt_in_dynamic_smem<swap_kernel<false, 128>>(SwapCfg<false, 128>::kSmemBytes, true);
}

}  // namespace moe_detail
}  // namespace moeserve::cuda
