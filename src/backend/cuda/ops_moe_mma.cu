// moe_routed_experts_mma (ops_moe.h): the routed-expert block for prompt-class rows with the
// expert GEMMs on bf16 tensor cores (mma.sync.m16n8k16 + ldmatrix + cp.async; sm_80+, no wgmma /
// TMA, so the same code runs on the H200 and the DGX Spark: <= 96 KB of dynamic shared memory per
// CTA, opted in by moe_mma_prepare() or the first call).
//
// Steps (one stream, no host synchronisation):
//   1. route_and_group (ops_moe.cu, the same routing as moe_routed_experts): ids / weights per slot
//      (slot = token·k + rank), then the slots grouped by expert into tiles of up to BM slots
//      (TileList; one BM per call, by the average slots per expert M·k / E: BM = 16 up to 4,
//      32 up to 40, else 64; variants 7, 8 above 4: BM per EXPERT, two tile lists, see below).
//   2. split_rows_kernel: x f32 [M, H] -> x_hi, x_lo bf16 [M, H] (hi = bf16_rn(x), lo = bf16_rn(x − hi)),
//      once per token instead of once per (expert, column block).
//   3. gate_up kernel: act[p, I] = silu(x·Wgᵀ) ⊙ (x·Wuᵀ), p = the slot's position in the tile order,
//      written directly as the hi / lo bf16 planes the down kernel reads.
//   4. down kernel:    y[slot, H] = act[p]·Wdᵀ (f32).
//   5. combine_routed (ops_moe.cu): residual[m] += Σ_r w·y[m·k + r] (+ sigmoid(gate)·shared).
//
// Data layout. x f32 [M, H] (16-byte aligned); x_hi / x_lo bf16 [M, H]; act_hi / act_lo bf16
// [M·k, I] by order position (the down kernel's A rows of a tile are contiguous; variants 5, 7, 8
// with GPTQ experts: both planes' k permuted inside every 32-k block, kperm32_logical); y f32 [M·k, H]
// by slot (the combine's layout). Experts: ops_moe.h (GPTQ qweight [E][K/8][N], scales f16
// [E][K/g][N], qzeros [E][K/g][N/8]; FP8 e4m3 [E][N][K] with f32 scales [E][ceil(N/128)][ceil(K/128)];
// bf16 [E][N][K]).
//
// Parallelisation. Grid (ceil(N / BN), max_tiles): CTA (nb, t) computes tile t's <= BM slots x the
// BN columns nb·BN.. of its expert (gate_up: BN columns of gate AND of up, so the SwiGLU epilogue
// is local; the column blocks of one tile are adjacent CTAs, so they share its A rows in L2); CTAs
// with t >= *num_tiles exit at once. Tilings (Tiling below):
//   prefill (BM 64): gate_up BN 128 + 128, down BN 256; 8 warps 2 (rows) x 4 (columns), warp tile
//                    32 x 32 (+ 32) / 32 x 64 (kernel form 1, GPTQ / FP8: 1 x 8, warp tile
//                    64 x 16 (+ 16) / 64 x 32); 1 CTA per SM (the GPTQ / FP8 accumulators: C and
//                    the scaled sum, 128 registers per thread).
//                    Used above 40 slots per expert on average (tiles mostly full).
//   32-slot (BM 32): gate_up BN 128 + 128, down BN 256 (the prefill tiling's weight tile); 8 warps
//                    1 x 8, warp tile 32 x 16 (+ 16) / 32 x 32; <= 128 registers per thread
//                    (__launch_bounds__(256, 2); no spills at sm_90 with BK 32 and each m16
//                    fragment's A loaded next to its MMAs) and <= 75 KB of shared memory, so
//                    2 CTAs per SM on the H200 (GPTQ: 39 KB, 2 per SM on the DGX Spark too).
//                    Used at 5-40 slots per expert on average (~32 at 1K tokens on 256 experts,
//                    top-8), where the prefill tiling's second row of warps (rows 32-63) would
//                    mostly have no slots and its single CTA per SM nothing to overlap with.
//   small (BM 16):   gate_up BN 32 + 32, down BN 64; 4 warps 1 x 4; several CTAs per SM, so at
//                    decode-like sizes (1-4 slots per expert) every SM streams weights.
// The CTA walks K in k tiles of BK (prefill: GPTQ 64, FP8 / bf16 32; 32-slot: 32; small: 128)
// through a ring of `stages` shared-memory buffers (2-6, as many as fit 96 KB), filled by cp.async
// straight from global memory: the A tile's hi and lo rows (bf16, rows padded to BK + 8: ldmatrix
// conflict-free), the raw weight bytes (GPTQ: packed words [BK/8][B rows] plus the k tile's group
// scales (f16) and zero words; FP8 / bf16: [B rows][BK·elem + 16 bytes], conflict-free fragment
// loads); stages − 1 tiles are in flight while one is computed, one __syncthreads per k tile. A
// fragments come from ldmatrix, B fragments from plain shared loads converted in registers
// (GPTQ nibbles − zero, e4m3, exactly). A rows past the tile's slot count and B rows past N are
// never copied (zeroed once); m16 row fragments at or past the slot count are skipped
// (warp-uniform).
//
// Kernel forms (set_moe_mma_variant, ops_moe.h: 0, 1, 5, 7, 8; 0 and 1 give the same bits, 5, 7
// and 8 their own; variants 2, 3, 4 and 6 were removed, the others keep their numbers, which
// docs/PERF.md's runs cite):
//   0: the previous kernels: GPTQ B pairs by gptq_pair_to_bf16x2 (variable shifts and masks per
//      nibble, ~6 integer instructions + HSUB2 per pair); the 64-slot tiling 2 x 4 warps, so each
//      B fragment (weight word) is loaded and converted by both rows of warps.
//   1: GPTQ B pairs by gptq_pair_to_bf16x2_prmt (SHF, PRMT with a per-lane selector,
//      LOP3 + the same HSUB2: the same bf16 pair (128 + q) minus the same (128 + zero)); the
//      group tests and indices (k % g, k / g) by mask and shift instead of integer divisions; the
//      64-slot tiling (GPTQ, FP8) 1 x 8 warps, each warp all 64 rows of 16 (+16) / 32 columns:
//      per k16 step and warp 4 x 2 A ldmatrix.x4 (was 2 x 2) and half the B loads and
//      conversions (gate_up: 8 pairs per 32 MMAs, was 16), the A registers loaded per m16
//      fragment next to its MMAs.
//   5: the GPTQ word form (kernel form 3; FP8 / bf16 run form 1): the activation planes (x by
//      split_rows_perm32_kernel, act by the gate_up epilogue) hold the k of every 32-k block
//      permuted (kperm32_logical, ops_mma_frag.cuh: logical 16·s + 8·h + 2·t + i <- physical
//      8·t + 4·i + 2·s + h), so MMA thread t's B registers of both k16 steps of the block are the
//      nibble pairs (j, j + 4), j = 2·s + h, of ONE GPTQ word (word t of its column in the block,
//      the weights keep the GPTQ layout the decode kernels read). Per word (per (mat, ni) and 32
//      k): 1 LDS.32 (word rows padded by 8 words: conflict-free), 3 SHF, 4 LOP3 ((x & 0x000F000F)
//      | 0x43004300 as one lop3, the constant in a register), 4 HSUB2, for 4·MI MMAs; form 1 spends
//      4 LDS + 4 SHF + 4 PRMT + 8 LOP3 + 4 HSUB2 on the same MMAs. m16 fragment 0's MMAs are not
//      behind the per-fragment branch; outside the 2-CTA gate_up tiling a group's first MMA per
//      output takes C = +0 from RZ (mma_bf16_zc) instead of MOVs clearing C after the flush. All
//      three GPTQ tilings use it (one k order per call, whatever the tile size), so a token's bits
//      still do not depend on M; they differ from variants 0, 1 (other products share an MMA).
//   7: variant 5's kernels with the tile size chosen PER EXPERT above 4 slots per expert
//      on average (route_and_group_mixed, ops_moe.cu): an expert of c slots gets c / 64 64-slot
//      tiles, then its remainder r = c % 64 one more 64-slot tile if r > 32, else one 32-slot tile
//      (r = 1..32). Two tile lists (32-slot: tile indices [0, mid_cap), count num_tiles[0]; 64-slot:
//      [mid_cap, ..), count num_tiles[1]) over ONE order array, so p (a slot's act row) is its
//      order position whichever list its tile is in; four expert launches: gate_up 64, gate_up 32,
//      down 64, down 32 (all act rows are written before the first down CTA), each grid sized for
//      its list's capacity (mid_cap = min(slots, E), large_cap = slots / 33), surplus CTAs exit.
//      At 1K tokens (~32 slots per expert, many experts with 33-50) an expert of 33-64 slots is one
//      64-slot pass over its weights instead of two 32-slot passes; at 8K tokens (~256 per expert)
//      a remainder of <= 32 slots runs on a 32-slot tile instead of a mostly empty 64-slot one.
//      Every tiling computes each output with the same operations, so variant 5's bits.
//   8 (default): variant 7, except that GPTQ steps of <= 4 slots per expert on average (the small tiling's
//      regime: decode sizes) run the swapAB kernels of ops_moe_mma_swap.cu: the weights as the
//      MMA's A operand (16 columns per m16 fragment, streamed straight into registers), tiles of
//      <= 4 slots (kSwapTile) as B (one n8 fragment), gate_up splitting x f32 itself (no split
//      launch), down doing the combine (an arrival counter per (token, 32 columns): the last slot's
//      CTA combines), PDL launches; up to 8 tokens (E <= 256) gate_up also routes (one CTA row per
//      slot, no grouping launch): two launches per layer. Every output gets the word form's
//      operations, so variant 5's bits.
//
// Arithmetic of one output (slot, n), fixed by K, the format and the kernel-form family (variants
// 0, 1 or 5, 7, 8) only (never by the tiling, the tile, the slot's row in it, M or the other slots:
// an MMA computes each C element from its own A row, B column and old value), for each k16 step in
// ascending (logical: variants 5, 7, 8 permute k inside each 32-k block) k: C = mma(hi, B, C),
// C = mma(lo, B, C);
//   bf16: y = C;  GPTQ: B = q − zero (exact), C restarts at 0 for each group of g k's and after
//   the group acc = fma(C, scale[g][n], acc);  FP8: B = e4m3 (exact), the same per 128-k block
//   with the block scale. Epilogues use explicit __fmaf_rn / __fmul_rn / __fdiv_rn / __fadd_rn.
// All three tilings execute exactly these operations (they differ only in how the MMAs of
// different outputs interleave), so a token's result is bit-identical for any M and any other
// tokens (batch invariance; chunked prefill equals one pass), but differs from
// moe_routed_experts' CUDA-core sums.
//
// Roofline (122B-A10B: E 256, top-8, H 3072, I 1024, INT4 g128). Weights: every expert with a slot
// is read once per tile of its slots: at 1K tokens nearly every expert, ~1.25 GB per layer (~0.3 ms
// at 4.3 TB/s); at M = 1 the 8 selected experts, 8 x 4.7 MB. MMA work: 2·(3·H·I)·slots useful FLOP
// (155 GFLOP per layer at 1K tokens), executed twice (hi and lo) plus the zero rows of partial m16
// fragments: compute-bound at prefill sizes. L2 -> SM traffic besides the weights: A rows (4 bytes
// per element, hi + lo) re-read by every column block: x by I/128 CTAs per tile, act by H/256;
// per k and CTA the prefill tiling reads 64·4 bytes of A against 256·0.5 bytes of INT4 weights,
// the 32-slot tiling 32·4 against the same 128 (an expert with 33-64 slots has 2 tiles there, so
// its weights are read twice, the second time mostly from L2: one expert's tiles are adjacent in
// the grid; variant 7 gives it one 64-slot tile: one read and one dequantisation of its weights).
// Shared-memory reads per k16 step and CTA: A 2 planes x MI ldmatrix.x4 per warp, B 2
// words per n8 tile per warp (GPTQ: 8 distinct words per LDS.32, 2 wavefronts; the word form: one
// LDS.32 of 32 distinct, conflict-free words per n8 tile per 32 k, so the same bytes in 0.5
// wavefront per k16 step), so ~1 wavefront per MMA (32-slot and form 1's 64-slot 1 x 8:
// ~1.25-1.5, their warps cover all rows but fewer columns; less in the word form). At decode-like sizes the
// weight stream is the bound: (stages − 1) k tiles of weights in flight per CTA, several CTAs
// per SM.
#include <algorithm>
#include <atomic>
#include <climits>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/ops_moe_internal.cuh"
#include "backend/cuda/ops_moe_mma_swap.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace moeserve::cuda {
namespace {

using namespace moe_detail;
using namespace mma_frag;

enum class BFmt { Bf16, Fp8, Gptq };

constexpr int kLargeBM = 64;  // slots per tile, prefill tiling
constexpr int kMidBM = 32;    // slots per tile, 32-slot prefill tiling
constexpr int kSmallBM = 16;  // slots per tile, small tiling
constexpr int kSmemBudget = 96 * 1024;

constexpr int cmin(int a, int b) { return a < b ? a : b; }

// One CTA shape: kMats = 2 (gate and up: B rows [0, BN) gate, [BN, 2·BN) up) or 1 (down); BM slots
// x BN columns per matrix; WM x WN warps; the k tile and the stage layout of weight format F.
// V: the kernel form: 0 the previous kernels, 1 GPTQ pairs dequantised with one PRMT
// (gptq_pair_to_bf16x2_prmt), group indices by shifts and, for the 64-slot tiling, 1 x 8 warps
// (each weight word converted once per CTA instead of once per row of warps); same bits. 3 the
// GPTQ word form (k-permuted A planes, one weight word per thread per 32 k); its own bits. (Forms
// 2 and 4, the 8-stage 32-slot rings of variants 4 and 6, were removed; 3 keeps its number.)
template <int kMats_, int BM_, int BN_, int WM_, int WN_, int kMinBlocks_, int kMaxStages, BFmt F, int V_ = 0>
struct Tiling {
  static constexpr int kMats = kMats_, BM = BM_, BN = BN_, WM = WM_, WN = WN_, kMinBlocks = kMinBlocks_, V = V_;
  // k tile: prefill 64 (GPTQ) / 32; 32-slot 32 (GPTQ too: with BK 64 its gate_up spills at the
  // 128-register cap of 2 CTAs per SM); small 128. The arithmetic does not depend on it.
  static constexpr int BK = BM == 64 ? (F == BFmt::Gptq ? 64 : 32) : BM == 32 ? 32 : 128;
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kWarpM = BM / WM, kWarpN = BN / WN;  // warp tile (columns per matrix)
  static constexpr int MI = kWarpM / 16, NI = kWarpN / 8;
  // Load each m16 fragment's A registers next to its MMAs (one fragment's 8 registers live, not
  // MI's): the 2-CTA tilings, under the 128-register cap, and the 4-fragment (1 x 8 warps, 64-row)
  // warp tiles, whose 4 x 8 A registers would not fit next to their 128 accumulators. Same MMAs
  // per output, same order.
  static constexpr bool kAPerFragment = kMinBlocks >= 2 || MI >= 4;
  static constexpr int BR = kMats * BN;                      // B rows (columns of the output)
  static constexpr int AS = BK + 8;                          // bf16 per A row in shared memory
  static constexpr int kAPlane = BM * AS * 2;                // bytes of one A plane (hi or lo)
  static constexpr int kElem = F == BFmt::Bf16 ? 2 : 1;
  static constexpr int kWRow = BK * kElem + 16;              // bytes per B row (bf16 / FP8)
  static constexpr int kGS = BK / 32;                        // GPTQ group slots per k tile (g >= 32)
  // GPTQ words [BK/8][kWStride]: form 3 pads each k-word row by 8 words, so the 4 threads of an
  // MMA group (t4 = 0..3: k-word rows t4 of a 32-k block, the same 8 columns) hit 32 different banks.
  static constexpr bool kWordForm = V == 3;                  // form 3: the GPTQ word form
  static constexpr int kWStride = BR + (kWordForm ? 8 : 0);
  static constexpr int kWordsBytes = (BK / 8) * kWStride * 4;
  static constexpr int kBOff = 2 * kAPlane;
  static constexpr int kScaleOff = kBOff + kWordsBytes;      // GPTQ scales f16 [kGS][BR]
  static constexpr int kZeroOff = kScaleOff + kGS * BR * 2;  // GPTQ zero words [kGS][BR/8]
  static constexpr int kBBytes = F == BFmt::Gptq ? kWordsBytes + kGS * BR * 2 + kGS * BR / 2 : BR * kWRow;
  static constexpr int kStageBytes = kBOff + kBBytes;
  static constexpr int kStages = cmin(kMaxStages, kSmemBudget / kStageBytes);
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static_assert(kWarpM % 16 == 0 && kWarpN % 8 == 0, "warp tile");
  static_assert(BK % 32 == 0 && 128 % BK == 0, "k tiles: GPTQ groups (32/64/128) and 128-k FP8 blocks align");
  static_assert((BK / 8 + 1) % 2 == 1, "A rows: an odd number of 16-byte units, conflict-free ldmatrix");
  static_assert((kWRow / 16) % 2 == 1, "B rows: an odd number of 16-byte units, conflict-free fragment loads");
  static_assert(BR % 32 == 0 && BN % 8 == 0, "GPTQ zero words and scale chunks");
  static_assert(kAPlane % 16 == 0 && kBBytes % 16 == 0 && kScaleOff % 16 == 0 && kZeroOff % 16 == 0, "16-byte stages");
  static_assert(kStages >= 2, "at least double buffering");
  static_assert(V == 0 || V == 1 || V == 3, "kernel forms 0, 1, 3");
  static_assert(V != 3 || F == BFmt::Gptq, "form 3 is the GPTQ word form");
  static_assert(kSmemBytes <= 99 * 1024, "DGX Spark: <= 99 KB of shared memory per block");
};

// Variant 0: the 64-slot tiling's 8 warps 2 x 4; variants >= 1: 1 x 8 (64 rows x 16 (+16) / 32
// columns per warp). Bf16 experts (nothing to convert) always take variant 0.
template <BFmt F, int V>
using GateUpLarge = Tiling<2, kLargeBM, 128, V == 0 ? 2 : 1, V == 0 ? 4 : 8, 1, 4, F, V>;
template <BFmt F, int V>
using DownLarge = Tiling<1, kLargeBM, 256, V == 0 ? 2 : 1, V == 0 ? 4 : 8, 1, 4, F, V>;
template <BFmt F, int V> using GateUpMid = Tiling<2, kMidBM, 128, 1, 8, 2, 4, F, V>;
template <BFmt F, int V> using DownMid = Tiling<1, kMidBM, 256, 1, 8, 2, 4, F, V>;
template <BFmt F, int V> using GateUpSmall = Tiling<2, kSmallBM, 32, 1, 4, 2, 6, F, V>;
template <BFmt F, int V> using DownSmall = Tiling<1, kSmallBM, 64, 1, 4, 2, 6, F, V>;

// x f32 [n4 float4] -> hi, lo bf16 (pairs as uint32).
__global__ void split_rows_kernel(const float4* __restrict__ x, size_t n4, uint2* __restrict__ hi,
                                  uint2* __restrict__ lo) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    const float4 v = __ldg(x + i);
    uint2 h, l;
    split2(v.x, v.y, h.x, l.x);
    split2(v.z, v.w, h.y, l.y);
    hi[i] = h;
    lo[i] = l;
  }
}

// The same split with the k of each 32-k block permuted for the GPTQ word form (form 3,
// kperm32_logical): x f32 [n8 units of 8 consecutive k] (8 | 32 and H % 32 == 0, so unit u is
// word t = u % 4 of its 32-k block). Unit u's physical k 8t + 4i + j (j = 0..3, i = 0, 1) goes to
// logical 8j + 2t + i: the pair (x[8t + j], x[8t + 4 + j]) is one bf16x2 at 8j + 2t. Reads 32 bytes,
// writes 4 x 4 bytes per plane per unit.
__global__ void split_rows_perm32_kernel(const float4* __restrict__ x, size_t n8, uint32_t* __restrict__ hi,
                                         uint32_t* __restrict__ lo) {
  for (size_t u = size_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n8; u += size_t(gridDim.x) * blockDim.x) {
    const float4 a = __ldg(x + 2 * u), b = __ldg(x + 2 * u + 1);  // i = 0: k 8t + j; i = 1: k 8t + 4 + j
    const size_t base = (u >> 2) * 16 + (u & 3);                  // in bf16 pairs: block · 16 + t
    const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t h, l;
      split2(av[j], bv[j], h, l);
      hi[base + 4 * j] = h;  // pair index (8j + 2t) / 2
      lo[base + 4 * j] = l;
    }
  }
}

// One CTA: tile blockIdx.y (slots order[start .. start + count) of expert e) x columns
// blockIdx.x·BN .. of w0 (and w1). A: hi / lo bf16 planes with K columns; gate_up: x rows
// (row = slot / top_k), down: act rows (row = order position). Out: gate_up act_hi / act_lo
// [pos, N]; down y [slot, N] f32.
template <class T, BFmt F>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks)
    moe_mma_kernel(const bf16* __restrict__ a_hi, const bf16* __restrict__ a_lo, int top_k, TileList tiles,
                   ExpertView w0, ExpertView w1, bf16* __restrict__ out_hi, bf16* __restrict__ out_lo,
                   float* __restrict__ out_y) {
  constexpr int kMats = T::kMats, BM = T::BM, BN = T::BN, BK = T::BK, BR = T::BR, AS = T::AS;
  constexpr int MI = T::MI, NI = T::NI, kThreads = T::kThreads, kStages = T::kStages;
  constexpr int kStageBytes = T::kStageBytes, kAPlane = T::kAPlane;

  const int t = int(blockIdx.y);
  if (t >= *tiles.num_tiles) return;  // uniform over the CTA, before any barrier
  const int e = tiles.expert[t], start = tiles.start[t], count = tiles.count[t];
  const int N = w0.N, K = w0.K;
  const int n0 = int(blockIdx.x) * BN;

  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t sbase = uint32_t(__cvta_generic_to_shared(smem));

  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / T::WN, warp_n = warp % T::WN;
  const int g = lane >> 2, t4 = lane & 3;  // fragment row group, thread in group

  // Zero the whole ring once: rows that no copy fills (A rows >= count, B rows >= N) stay zero,
  // so every value an MMA sees is defined (their outputs are never stored). Before any copy.
  for (int i = tid; i < T::kSmemBytes / 16; i += kThreads) reinterpret_cast<uint4*>(smem)[i] = make_uint4(0u, 0u, 0u, 0u);

  // ---- this thread's A chunks (8 bf16 of one row, both planes), fixed over k ----
  constexpr int kACPR = BK / 8, kAChunks = BM * kACPR, kAPer = (kAChunks + kThreads - 1) / kThreads;
  int arow[kAPer];  // A row of chunk tid + i·kThreads, or -1 (past the slot count / the tile)
#pragma unroll
  for (int i = 0; i < kAPer; ++i) {
    const int c = tid + i * kThreads, r = c / kACPR;
    arow[i] = -1;
    if (c < kAChunks && r < count) arow[i] = kMats == 2 ? tiles.order[start + r] / top_k : start + r;
  }

  const int gsize = w0.group;  // GPTQ group (32 / 64 / 128)
  const int groups = F == BFmt::Gptq ? K / gsize : 1;
  const int nslots = F == BFmt::Gptq ? (gsize >= BK ? 1 : BK / gsize) : 0;  // groups per k tile
  // k % gsize and k / gsize (k >= 0). Form 1: a mask and a shift (gsize is 32, 64 or 128), not
  // the integer division by a runtime value that % and / compile to (tens of instructions, twice
  // per k16 step). The same values.
  const int gshift = F == BFmt::Gptq ? 31 - __clz(gsize) : 0;
  auto gmod = [&](int k) { return T::V >= 1 ? k & (gsize - 1) : k % gsize; };
  auto gdiv = [&](int k) { return T::V >= 1 ? k >> gshift : k / gsize; };
  const bool sym0 = w0.sym, sym1 = kMats == 2 ? w1.sym : w0.sym;

  auto load_tile = [&](int stage, int k0) {
    const uint32_t st = sbase + uint32_t(stage * kStageBytes);
#pragma unroll
    for (int i = 0; i < kAPer; ++i) {
      if (arow[i] < 0) continue;
      const int c = tid + i * kThreads, r = c / kACPR, col = (c % kACPR) * 8, k = k0 + col;
      if (k < K) {
        const size_t off = size_t(arow[i]) * K + k;
        const uint32_t d = st + uint32_t((r * AS + col) * 2);
        cp_async16(d, a_hi + off);
        cp_async16(d + kAPlane, a_lo + off);
      }
    }
    if constexpr (F == BFmt::Gptq) {
      constexpr int kWCPR = BR / 4, kWChunks = (BK / 8) * kWCPR;  // 4 columns per 16-byte chunk
#pragma unroll
      for (int i = 0; i < (kWChunks + kThreads - 1) / kThreads; ++i) {
        const int c = tid + i * kThreads;
        if (c >= kWChunks) break;
        const int kw = c / kWCPR, col = (c % kWCPR) * 4;
        const bool m1 = kMats == 2 && col >= BN;
        const int n = n0 + col - (m1 ? BN : 0);
        if (n < N && k0 + kw * 8 < K)
          cp_async16(st + uint32_t(T::kBOff + (kw * T::kWStride + col) * 4),
                     (m1 ? w1.qweight : w0.qweight) + (size_t(e) * (K / 8) + k0 / 8 + kw) * N + n);
      }
      constexpr int kSCPR = BR / 8, kSChunks = T::kGS * kSCPR;  // 8 scales per chunk
#pragma unroll
      for (int i = 0; i < (kSChunks + kThreads - 1) / kThreads; ++i) {
        const int c = tid + i * kThreads;
        if (c >= kSChunks) break;
        const int s = c / kSCPR, col = (c % kSCPR) * 8, kk = k0 + s * gsize;
        const bool m1 = kMats == 2 && col >= BN;
        const int n = n0 + col - (m1 ? BN : 0);
        if (s < nslots && kk < K && n < N) {
          const size_t grow = size_t(e) * groups + gdiv(kk);
          cp_async16(st + uint32_t(T::kScaleOff + (s * BR + col) * 2), (m1 ? w1.scales : w0.scales) + grow * N + n);
          if (!(m1 ? sym1 : sym0))  // the zero word of these 8 columns
            cp_async4(st + uint32_t(T::kZeroOff + (s * (BR / 8) + col / 8) * 4),
                      (m1 ? w1.qzeros : w0.qzeros) + grow * (N / 8) + n / 8);
        }
      }
    } else {
      constexpr int kEl = 16 / T::kElem;  // weights per 16-byte chunk
      constexpr int kWCPR = BK / kEl, kWChunks = BR * kWCPR;
#pragma unroll
      for (int i = 0; i < (kWChunks + kThreads - 1) / kThreads; ++i) {
        const int c = tid + i * kThreads;
        if (c >= kWChunks) break;
        const int row = c / kWCPR, part = c % kWCPR, k = k0 + part * kEl;
        const bool m1 = kMats == 2 && row >= BN;
        const int n = n0 + row - (m1 ? BN : 0);
        if (n < N && k < K) {
          const uint32_t d = st + uint32_t(T::kBOff + row * T::kWRow + part * 16);
          if constexpr (F == BFmt::Fp8)
            cp_async16(d, (m1 ? w1.fp8 : w0.fp8) + (size_t(e) * N + n) * K + k);
          else
            cp_async16(d, (m1 ? w1.dense : w0.dense) + (size_t(e) * N + n) * K + k);
        }
      }
    }
  };

  // ---- ldmatrix lane offsets of the A fragments (bytes from a plane's start at k step 0) ----
  uint32_t a_off[MI];
  bool active[MI];  // the m16 fragment holds at least one of the tile's slots (warp-uniform)
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
    a_off[mi] = uint32_t(((warp_m * T::kWarpM + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * AS + (lane >> 4) * 8) * 2);
    active[mi] = warp_m * T::kWarpM + mi * 16 < count;
  }
  const bool any_active = active[0];  // fragments are ordered: mi = 0 is active if any is

  // B row (within the stage) of this lane's fragment column for (mat, ni): row g of the n8 tile.
  auto brow = [&](int mat, int ni) { return mat * BN + warp_n * T::kWarpN + ni * 8 + g; };

  float c[kMats][MI][NI][4];    // the running MMA accumulator (GPTQ / FP8: of the current group / block)
  float acc[kMats][MI][NI][4];  // GPTQ / FP8: the sum of scaled groups / blocks
#pragma unroll
  for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int q = 0; q < 4; ++q) c[mat][mi][ni][q] = acc[mat][mi][ni][q] = 0.f;

  // GPTQ: bf16 pair (128 + zero) of this lane's column per (mat, ni), for the current group.
  uint32_t zz[kMats][NI];
  const uint32_t psel = gptq_pair_selector(t4);  // variant 1: this lane's nibble pair (byte t4 of a word)
#pragma unroll
  for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) zz[mat][ni] = 0x43084308u;  // zero 8 (sym)
  // FP8: the block scale of each (mat, ni) n8 tile, loaded at the block's first k step.
  float fsc[kMats][NI];
#pragma unroll
  for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) fsc[mat][ni] = 0.f;

  // acc = fma(C, s, acc); C = 0. s(mat, ni, j): the scale of this lane's column 2·t4 + j of (mat, ni).
  auto flush = [&](auto&& scale_of) {
#pragma unroll
    for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float s = scale_of(mat, ni, j);
#pragma unroll
          for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              acc[mat][mi][ni][2 * h + j] = __fmaf_rn(c[mat][mi][ni][2 * h + j], s, acc[mat][mi][ni][2 * h + j]);
              c[mat][mi][ni][2 * h + j] = 0.f;
            }
        }
  };

  // GPTQ, at a group's first k: zz of the (non-symmetric) matrices from the group's zero words in
  // stage st, group slot `slot` (one 4-bit zero per column, 8 columns to a word).
  auto load_group_zeros = [&](const unsigned char* st, int slot) {
#pragma unroll
    for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        if (mat == 0 ? sym0 : sym1) continue;
        const int col = brow(mat, ni);  // col % 8 == g == the column's nibble in its zero word
        const uint32_t zw = *reinterpret_cast<const uint32_t*>(st + T::kZeroOff + (slot * (BR / 8) + col / 8) * 4);
        const uint32_t z = 0x4300u + ((zw >> (4 * g)) & 0xFu) + 1u;
        zz[mat][ni] = z | (z << 16);
      }
  };

  const int nb128 = (N + 127) / 128, kb128 = (K + 127) / 128;  // FP8 scale grid

  // Form 3 (GPTQ): the k tile in blocks of 32 k (two k16 steps; GPTQ groups of 32 / 64 / 128 and
  // the k tiles align to them, K % 32 == 0). The A planes hold each block's k permuted
  // (kperm32_logical, ops_mma_frag.cuh), so thread t4's B registers of both steps are the nibble
  // pairs (j, j + 4) of ONE word (k-word row t4 of the block, its column g): per word and (mat,
  // ni) one LDS.32 (conflict-free: kWStride), 3 SHF (w >> 4, 8, 12), 4 LOP3, 4 HSUB2 for 2·MI·2
  // MMAs (form 1: 4 LDS, 4 SHF, 4 PRMT, 8 LOP3, 4 HSUB2 for the same MMAs). m16 fragment 0 is
  // always active here (compute_tile runs only when any_active), so its MMAs are not behind a
  // branch and the scheduler may interleave them with the conversions. Per output, per k16
  // step in ascending logical k: C = mma(hi, B, C), C = mma(lo, B, C); C restarts per group.
  const uint32_t magic = 0x43004300u | (uint32_t(blockDim.x) >> 31);  // opaque: stays in a register
  auto compute_tile_words = [&](int stage, int k0) {
    const unsigned char* st = smem + stage * kStageBytes;
    const uint32_t ahi = sbase + uint32_t(stage * kStageBytes), alo = ahi + uint32_t(kAPlane);
#pragma unroll
    for (int kb = 0; kb < BK / 32; ++kb) {
      const int k = k0 + kb * 32;
      if (k >= K) break;  // uniform over the CTA (K % 32 == 0)
      const int slot = gdiv(k - k0);  // the group slot of this block in the stage
      if (gmod(k) == 0 && !(sym0 && sym1)) load_group_zeros(st, slot);  // a group starts: its zero points
      // b[mat][ni][2·s + h]: step s, register h = nibbles j, j + 4 (j = 2·s + h) of word t4.
      uint32_t b[kMats][NI][4];
#pragma unroll
      for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          const uint32_t w =
              *reinterpret_cast<const uint32_t*>(st + T::kBOff + ((kb * 4 + t4) * T::kWStride + brow(mat, ni)) * 4);
#pragma unroll
          for (int j = 0; j < 4; ++j) b[mat][ni][j] = gptq_nibbles_j_j4_to_bf16x2(w >> (4 * j), magic, zz[mat][ni]);
        }
      // The block's MMAs; fresh: the group's first block, whose first MMA per output starts C at
      // +0 (mma_bf16_zc: RZ, so the flush need not clear C; the same bits as C = 0 then mma).
      // Not in the 2-CTA gate_up tiling (32-slot): the two copies of the block's code cost it a
      // spill at the 128-register cap (sm_90); it clears C in the flush instead (same bits).
      constexpr bool kFreshC = !(kMats == 2 && T::kMinBlocks >= 2);
      auto block_mmas = [&](auto fresh) {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
          if (mi == 0 || active[mi]) {
#pragma unroll
            for (int s2 = 0; s2 < 2; ++s2) {
              const uint32_t off = a_off[mi] + uint32_t((kb * 2 + s2) * 32);
              uint32_t ah[4], al[4];
              ldmatrix_x4(ahi + off, ah);
              ldmatrix_x4(alo + off, al);
#pragma unroll
              for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) {
                  if (decltype(fresh)::value && s2 == 0)
                    mma_bf16_zc(c[mat][mi][ni], ah, b[mat][ni][0], b[mat][ni][1]);
                  else
                    mma_bf16(c[mat][mi][ni], ah, b[mat][ni][2 * s2], b[mat][ni][2 * s2 + 1]);
                }
#pragma unroll
              for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) mma_bf16(c[mat][mi][ni], al, b[mat][ni][2 * s2], b[mat][ni][2 * s2 + 1]);
            }
          }
      };
      if (kFreshC && gmod(k) == 0)
        block_mmas(std::true_type{});
      else
        block_mmas(std::false_type{});
      if (gmod(k + 32) == 0) {  // the group's last block: acc += C · scale (C is restarted by the next block)
        const __half* sc = reinterpret_cast<const __half*>(st + T::kScaleOff) + slot * BR;
#pragma unroll
        for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            // this lane's columns 2·t4, 2·t4 + 1: adjacent f16 scales, one 4-byte load (even index)
            const float2 sp = __half22float2(
                *reinterpret_cast<const __half2*>(sc + mat * BN + warp_n * T::kWarpN + ni * 8 + 2 * t4));
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const float sv = j == 0 ? sp.x : sp.y;
#pragma unroll
              for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                  acc[mat][mi][ni][2 * h + j] = __fmaf_rn(c[mat][mi][ni][2 * h + j], sv, acc[mat][mi][ni][2 * h + j]);
                  if (!kFreshC) c[mat][mi][ni][2 * h + j] = 0.f;
                }
            }
          }
      }
    }
  };

  auto compute_tile = [&](int stage, int k0) {
    const unsigned char* st = smem + stage * kStageBytes;
    const uint32_t ahi = sbase + uint32_t(stage * kStageBytes), alo = ahi + uint32_t(kAPlane);
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      const int k = k0 + ks * 16;
      if (k >= K) break;  // uniform over the CTA
      if constexpr (F == BFmt::Gptq) {
        if (gmod(k) == 0 && !(sym0 && sym1)) load_group_zeros(st, gdiv(k - k0));  // a group starts: its zero points
      } else if constexpr (F == BFmt::Fp8) {
        if (k % 128 == 0) {  // a block starts: its scales (used at its last k step)
#pragma unroll
          for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
              const int n = min(n0 + warp_n * T::kWarpN + ni * 8, N - 1);
              fsc[mat][ni] = __ldg((mat == 0 ? w0.scale : w1.scale) + (size_t(e) * nb128 + n / 128) * kb128 + k / 128);
            }
        }
      }
      // B fragments: register 0 holds W[n = g][k + 2·t4, +1], register 1 the same at k + 8.
      uint32_t b[kMats][NI][2];
#pragma unroll
      for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          const int row = brow(mat, ni);
          if constexpr (F == BFmt::Gptq) {
            const unsigned char* p = st + T::kBOff + ((ks * 2) * BR + row) * 4;
            const uint32_t w0 = *reinterpret_cast<const uint32_t*>(p);
            const uint32_t w1 = *reinterpret_cast<const uint32_t*>(p + BR * 4);
            if constexpr (T::V >= 1) {
              b[mat][ni][0] = gptq_pair_to_bf16x2_prmt(w0, psel, zz[mat][ni]);
              b[mat][ni][1] = gptq_pair_to_bf16x2_prmt(w1, psel, zz[mat][ni]);
            } else {
              b[mat][ni][0] = gptq_pair_to_bf16x2(w0, t4, zz[mat][ni]);
              b[mat][ni][1] = gptq_pair_to_bf16x2(w1, t4, zz[mat][ni]);
            }
          } else if constexpr (F == BFmt::Fp8) {
            const unsigned char* p = st + T::kBOff + row * T::kWRow + ks * 16;
            b[mat][ni][0] = fp8x2_to_bf16x2(*reinterpret_cast<const uint16_t*>(p + 2 * t4));
            b[mat][ni][1] = fp8x2_to_bf16x2(*reinterpret_cast<const uint16_t*>(p + 8 + 2 * t4));
          } else {
            const unsigned char* p = st + T::kBOff + row * T::kWRow + ks * 32;
            b[mat][ni][0] = *reinterpret_cast<const uint32_t*>(p + 4 * t4);
            b[mat][ni][1] = *reinterpret_cast<const uint32_t*>(p + 16 + 4 * t4);
          }
        }
      // Per output: this k step's hi MMA, then its lo MMA.
      if constexpr (T::kAPerFragment) {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
          if (active[mi]) {
            uint32_t ah[4], al[4];
            ldmatrix_x4(ahi + a_off[mi] + ks * 32, ah);
            ldmatrix_x4(alo + a_off[mi] + ks * 32, al);
#pragma unroll
            for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
              for (int ni = 0; ni < NI; ++ni) mma_bf16(c[mat][mi][ni], ah, b[mat][ni]);
#pragma unroll
            for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
              for (int ni = 0; ni < NI; ++ni) mma_bf16(c[mat][mi][ni], al, b[mat][ni]);
          }
      } else {  // all fragments' A first, all hi MMAs, then all lo MMAs (ILP)
        uint32_t ah[MI][4], al[MI][4];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
          if (active[mi]) {
            ldmatrix_x4(ahi + a_off[mi] + ks * 32, ah[mi]);
            ldmatrix_x4(alo + a_off[mi] + ks * 32, al[mi]);
          }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
          if (active[mi]) {
#pragma unroll
            for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
              for (int ni = 0; ni < NI; ++ni) mma_bf16(c[mat][mi][ni], ah[mi], b[mat][ni]);
          }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
          if (active[mi]) {
#pragma unroll
            for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
              for (int ni = 0; ni < NI; ++ni) mma_bf16(c[mat][mi][ni], al[mi], b[mat][ni]);
          }
      }
      if constexpr (F == BFmt::Gptq) {
        if (gmod(k + 16) == 0) {
          const int slot = gdiv(k - k0);
          const __half* sc = reinterpret_cast<const __half*>(st + T::kScaleOff) + slot * BR;
          flush([&](int mat, int ni, int j) {
            return __half2float(sc[mat * BN + warp_n * T::kWarpN + ni * 8 + 2 * t4 + j]);
          });
        }
      } else if constexpr (F == BFmt::Fp8) {
        if ((k + 16) % 128 == 0 || k + 16 == K) flush([&](int mat, int ni, int) { return fsc[mat][ni]; });
      }
    }
  };

  // ---- the cp.async ring: kStages − 1 k tiles in flight while one is computed ----
  __syncthreads();  // the zeroing above is done before any copy lands
  const int kt_count = (K + BK - 1) / BK;
  auto prologue = [&](int s) {
    if (s < kt_count) load_tile(s, s * BK);
    cp_async_commit();  // always commit (possibly empty): the group count stays uniform
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) prologue(s);
  for (int kt = 0; kt < kt_count; ++kt) {
    cp_async_wait<kStages - 2>();  // this thread's copies of tile kt have landed
    __syncthreads();               // everyone's have; everyone finished computing tile kt − 1
    const int next = kt + kStages - 1;
    if (next < kt_count) load_tile(next % kStages, next * BK);  // the stage of tile kt − 1
    cp_async_commit();
    if (any_active) {  // warp-uniform
      if constexpr (T::kWordForm)
        compute_tile_words(kt % kStages, kt * BK);
      else
        compute_tile(kt % kStages, kt * BK);
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: C fragment element q of (mi, ni) is row g (+8 for q >= 2), column 2·t4 + (q & 1) ----
  auto value = [&](int mat, int mi, int ni, int q) { return F == BFmt::Bf16 ? c[mat][mi][ni][q] : acc[mat][mi][ni][q]; };
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
    if (!active[mi]) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp_m * T::kWarpM + mi * 16 + g + h * 8;
      if (r >= count) continue;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int n = n0 + warp_n * T::kWarpN + ni * 8 + 2 * t4;  // N is even: n < N means n + 1 < N
        if (n >= N) continue;
        if constexpr (kMats == 2) {
          const float v0 = silu_mul_rn(value(0, mi, ni, 2 * h), value(1, mi, ni, 2 * h));
          const float v1 = silu_mul_rn(value(0, mi, ni, 2 * h + 1), value(1, mi, ni, 2 * h + 1));
          uint32_t hi, lo;
          split2(v0, v1, hi, lo);
          if constexpr (T::kWordForm) {  // the down kernel's A planes in the word form's k order (N % 32 == 0)
            const size_t o = size_t(start + r) * N + (n & ~31) + kperm32_logical(n & 31);  // n + 1: o + 8
            out_hi[o] = __ushort_as_bfloat16(uint16_t(hi & 0xFFFFu));
            out_hi[o + 8] = __ushort_as_bfloat16(uint16_t(hi >> 16));
            out_lo[o] = __ushort_as_bfloat16(uint16_t(lo & 0xFFFFu));
            out_lo[o + 8] = __ushort_as_bfloat16(uint16_t(lo >> 16));
          } else {
            const size_t o = size_t(start + r) * N + n;
            *reinterpret_cast<uint32_t*>(out_hi + o) = hi;
            *reinterpret_cast<uint32_t*>(out_lo + o) = lo;
          }
        } else {
          float* orow = out_y + size_t(tiles.order[start + r]) * N;
          *reinterpret_cast<float2*>(orow + n) = make_float2(value(0, mi, ni, 2 * h), value(0, mi, ni, 2 * h + 1));
        }
      }
    }
  }
}

// ---- host side ----------------------------------------------------------------------------------

struct Workspace {
  int32_t* ids;
  float* weights;
  int32_t* order;
  int32_t* num_tiles;
  int32_t* tile_expert;
  int32_t* tile_start;
  int32_t* tile_count;
  bf16* x_hi;
  bf16* x_lo;
  bf16* act_hi;
  bf16* act_lo;
  float* y;
  int32_t* arrivals;  // variant 8's down + combine: [max_tokens][H/32] counters (ops_moe_mma_swap.cuh)
};

size_t round256(size_t b) { return (b + 255) / 256 * 256; }

// The buffers in order; base == nullptr only sizes them. The tile arrays are sized for the
// smallest tile (variant 8's swap tiles of kSwapTile slots: the largest tile count); variant 7's two
// lists fit in them (mixed_tile_layout). The arrival counters need no initialisation: variant 8's
// gate_up zeroes the step's counters before its down kernel uses them (and a call leaves them at 0).
size_t carve(void* base, const MoeShape& s, int max_tokens, Workspace* w) {
  const size_t slots = size_t(max_tokens) * size_t(s.top_k);
  const size_t tiles = size_t(max_tiles(int(slots), s.num_experts, kSwapTile));  // variant 8's 4-slot tiles
  size_t off = 0;
  auto take = [&](size_t bytes) {
    void* r = base ? static_cast<uint8_t*>(base) + off : nullptr;
    off += round256(bytes);
    return r;
  };
  Workspace tmp;
  Workspace& o = w ? *w : tmp;
  o.ids = static_cast<int32_t*>(take(slots * 4));
  o.weights = static_cast<float*>(take(slots * 4));
  o.order = static_cast<int32_t*>(take(slots * 4));
  o.num_tiles = static_cast<int32_t*>(take(8));  // [2]: variant 7's two lists
  o.tile_expert = static_cast<int32_t*>(take(tiles * 4));
  o.tile_start = static_cast<int32_t*>(take(tiles * 4));
  o.tile_count = static_cast<int32_t*>(take(tiles * 4));
  o.x_hi = static_cast<bf16*>(take(size_t(max_tokens) * size_t(s.hidden) * 2));
  o.x_lo = static_cast<bf16*>(take(size_t(max_tokens) * size_t(s.hidden) * 2));
  o.act_hi = static_cast<bf16*>(take(slots * size_t(s.intermediate) * 2));
  o.act_lo = static_cast<bf16*>(take(slots * size_t(s.intermediate) * 2));
  o.y = static_cast<float*>(take(slots * size_t(s.hidden) * 4));
  o.arrivals = static_cast<int32_t*>(take(swap_arrival_count(s, max_tokens) * 4));
  return off;
}

bool projection_ok(const DeviceLinear& d, quant::WeightFormat f, int64_t N, int64_t K) {
  if (d.format != f || d.N != N || d.K != K || K % 16 != 0) return false;
  switch (f) {
    case quant::WeightFormat::GptqInt4:
      return d.g_idx.size() == 0 && (d.group_size == 32 || d.group_size == 64 || d.group_size == 128) &&
             K % d.group_size == 0 && N % 8 == 0 && d.qweight.size() > 0 && d.scales.size() > 0 &&
             (d.sym || d.qzeros.size() > 0);
    case quant::WeightFormat::Fp8Block:
      return d.fp8.size() > 0 && d.scale.size() > 0;
    case quant::WeightFormat::Dense:
    case quant::WeightFormat::Nvfp4:  // dequantised to bf16 at load
      return d.dense.size() > 0;
    default:
      return false;
  }
}

// Opts a kernel in to more than 48 KB of dynamic shared memory, once per device.
template <class T, BFmt F>
void ensure_opt_in() {
  if constexpr (T::kSmemBytes > 48 * 1024) opt_in_dynamic_smem<moe_mma_kernel<T, F>>(T::kSmemBytes);
}

// The kernel form each tiling of format F takes for form V (0, 1, 3): form 1 changes the GPTQ
// conversion (all tilings) and the 64-slot warp layout (GPTQ and FP8); form 3 (the GPTQ word
// form, permuted A planes) covers all three GPTQ tilings (one k order per call, whatever the tile
// size), FP8 takes its form-1 kernels for it; bf16 runs form 0 everywhere, FP8's 32- and 16-slot
// tilings too (nothing to dequantise there: no duplicate instantiations).
template <BFmt F> constexpr int large_form(int v) {
  return F == BFmt::Bf16 ? 0 : F == BFmt::Gptq ? v : cmin(v, 1);
}
template <BFmt F> constexpr int mid_form(int v) { return F == BFmt::Gptq ? v : 0; }
template <BFmt F> constexpr int small_form(int v) { return F == BFmt::Gptq ? v : 0; }

template <BFmt F, int V>
void opt_in_variant() {
  constexpr int L = large_form<F>(V), M = mid_form<F>(V), S = small_form<F>(V);
  ensure_opt_in<GateUpLarge<F, L>, F>();
  ensure_opt_in<DownLarge<F, L>, F>();
  ensure_opt_in<GateUpMid<F, M>, F>();
  ensure_opt_in<DownMid<F, M>, F>();
  ensure_opt_in<GateUpSmall<F, S>, F>();
  ensure_opt_in<DownSmall<F, S>, F>();
}
template <BFmt F>
void opt_in_all() {
  opt_in_variant<F, 0>();
  opt_in_variant<F, 1>();
  opt_in_variant<F, 3>();
}

template <class T, BFmt F>
void launch_one(const bf16* a_hi, const bf16* a_lo, int N, int top_k, const TileList& tiles, int grid_tiles,
                const ExpertView& w0, const ExpertView& w1, bf16* out_hi, bf16* out_lo, float* out_y,
                cudaStream_t stream) {
  ensure_opt_in<T, F>();
  const dim3 grid(unsigned((N + T::BN - 1) / T::BN), unsigned(grid_tiles));
  moe_mma_kernel<T, F><<<grid, T::kThreads, T::kSmemBytes, stream>>>(a_hi, a_lo, top_k, tiles, w0, w1, out_hi, out_lo,
                                                                      out_y);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

// gate_up then down with one tiling pair (the tiles were grouped for their BM).
template <class GU, class DN, BFmt F>
void launch_pair(const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
                 const Workspace& w, cudaStream_t stream) {
  static_assert(GU::BM == DN::BM, "one tile size per call");
  const ExpertView g = view_of(ex.gate), u = view_of(ex.up), d = view_of(ex.down);
  launch_one<GU, F>(w.x_hi, w.x_lo, s.intermediate, s.top_k, tiles, grid_tiles, g, u, w.act_hi, w.act_lo, nullptr,
                    stream);
  launch_one<DN, F>(w.act_hi, w.act_lo, s.hidden, s.top_k, tiles, grid_tiles, d, d, nullptr, nullptr, w.y, stream);
}

template <BFmt F, int V>
void launch_experts(int bm, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
                    const Workspace& w, cudaStream_t stream) {
  constexpr int L = large_form<F>(V), M = mid_form<F>(V), S = small_form<F>(V);
  if (bm == kSmallBM)
    launch_pair<GateUpSmall<F, S>, DownSmall<F, S>, F>(s, ex, tiles, grid_tiles, w, stream);
  else if (bm == kMidBM)
    launch_pair<GateUpMid<F, M>, DownMid<F, M>, F>(s, ex, tiles, grid_tiles, w, stream);
  else
    launch_pair<GateUpLarge<F, L>, DownLarge<F, L>, F>(s, ex, tiles, grid_tiles, w, stream);
}

template <BFmt F>
void launch_experts(int variant, int bm, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles,
                    int grid_tiles, const Workspace& w, cudaStream_t stream) {
  if (variant == 0)
    launch_experts<F, 0>(bm, s, ex, tiles, grid_tiles, w, stream);
  else if (variant >= 5 && F == BFmt::Gptq)  // the word form (x planes split permuted; 7, 8: its 16-slot tiles)
    launch_experts<F, 3>(bm, s, ex, tiles, grid_tiles, w, stream);
  else  // 1; 5, 7, 8 for FP8 / bf16
    launch_experts<F, 1>(bm, s, ex, tiles, grid_tiles, w, stream);
}

// Variant 7: per-expert tile sizes (route_and_group_mixed). The 32-slot list occupies tile
// indices [0, mid_cap), the 64-slot list [mid_cap, mid_cap + large_cap): mid_cap = min(slots, E)
// (at most one 32-slot tile per expert), large_cap = slots / 33 (every 64-slot tile holds >= 33
// slots), together <= max_tiles(slots, E, kSmallBM) <= the arrays' size (slots / 33 <= ceil(slots / 16)).
struct MixedLayout {
  int mid_cap, large_cap;
};
MixedLayout mixed_tile_layout(long long slots, int num_experts) {
  return {mixed_mid_cap(int(slots), num_experts), mixed_large_cap(int(slots))};
}

// Both tilings' gate_up launches, then both down launches (every act row is written before any
// down CTA reads it: one stream). Each launch's grid is sized for its list's capacity; CTAs past
// the list's count exit at once. The tilings of kernel form V give every output the same bits
// (see the header), so a slot's bits do not depend on which list its expert's tile is in.
template <BFmt F, int V>
void launch_experts_mixed(const MoeShape& s, const DeviceExperts& ex, const TileList& mid, int mid_grid,
                          const TileList& large, int large_grid, const Workspace& w, cudaStream_t stream) {
  constexpr int L = large_form<F>(V), Mf = mid_form<F>(V);
  using GUM = GateUpMid<F, Mf>;
  using DNM = DownMid<F, Mf>;
  using GUL = GateUpLarge<F, L>;
  using DNL = DownLarge<F, L>;
  static_assert(GUM::BM == kMixMid && DNM::BM == kMixMid && GUL::BM == kMixLarge && DNL::BM == kMixLarge,
                "the grouping's tile sizes");
  const ExpertView g = view_of(ex.gate), u = view_of(ex.up), d = view_of(ex.down);
  if (large_grid > 0)
    launch_one<GUL, F>(w.x_hi, w.x_lo, s.intermediate, s.top_k, large, large_grid, g, u, w.act_hi, w.act_lo, nullptr,
                       stream);
  if (mid_grid > 0)
    launch_one<GUM, F>(w.x_hi, w.x_lo, s.intermediate, s.top_k, mid, mid_grid, g, u, w.act_hi, w.act_lo, nullptr,
                       stream);
  if (large_grid > 0)
    launch_one<DNL, F>(w.act_hi, w.act_lo, s.hidden, s.top_k, large, large_grid, d, d, nullptr, nullptr, w.y, stream);
  if (mid_grid > 0)
    launch_one<DNM, F>(w.act_hi, w.act_lo, s.hidden, s.top_k, mid, mid_grid, d, d, nullptr, nullptr, w.y, stream);
}

// Variant 7's forms: variant 5's (GPTQ: the word form, 3; FP8 / bf16: 1), so the same bits as 5.
template <BFmt F>
void launch_experts_mixed(const MoeShape& s, const DeviceExperts& ex, const TileList& mid, int mid_grid,
                          const TileList& large, int large_grid, const Workspace& w, cudaStream_t stream) {
  launch_experts_mixed<F, F == BFmt::Gptq ? 3 : 1>(s, ex, mid, mid_grid, large, large_grid, w, stream);
}

std::atomic<int> g_variant{8};  // 7 (per-expert tiles over the word form) + swapAB decode-sized steps

// Variant 8 at <= 4 slots per expert (the small tiling's regime) with GPTQ experts: the swapAB kernels
// (ops_moe_mma_swap.cu: weights as the MMA's A operand, 4-slot tiles or single slots as B, the split
// fused into gate_up, the combine into down), the word form's bits.
bool swap_serves(int variant, int bm, const MoeShape& s, const DeviceExperts& ex) {
  return variant == 8 && bm == kSmallBM && swap_supported(s, ex);
}

}  // namespace

size_t moe_mma_workspace_bytes(const MoeShape& s, int max_tokens) { return carve(nullptr, s, max_tokens, nullptr); }

void set_moe_mma_variant(int variant) {
  if (variant != 0 && variant != 1 && variant != 5 && variant != 7 && variant != 8)
    throw Error("moe_mma: variant " + std::to_string(variant) +
                " is not one of 0, 1, 5, 7, 8 (2, 3, 4 and 6 were removed)");
  g_variant.store(variant);
}
int moe_mma_variant() { return g_variant.load(); }
// Variant 8's column blocks per CTA (ops_moe_mma_swap.cuh): 0 = chosen per launch, 1 .. 8 forced.
// Declared where it is used (the swap tests, benchmarks), not in ops_moe.h.
void set_moe_swap_columns_per_cta(int nc) { set_swap_columns_per_cta(nc); }
int moe_swap_columns_per_cta() { return swap_columns_per_cta(); }

void moe_mma_prepare() {
  opt_in_all<BFmt::Gptq>();
  opt_in_all<BFmt::Fp8>();
  opt_in_all<BFmt::Bf16>();
  swap_prepare();
}

bool moe_routed_experts_mma(const float* x, const float* router_logits, const MoeShape& s, const DeviceExperts& ex,
                            int M, void* workspace, size_t workspace_bytes, float* residual, cudaStream_t stream,
                            const float* shared_out, const float* shared_gate_logit) {
  const quant::WeightFormat f = ex.gate.format;
  const int64_t H = s.hidden, I = s.intermediate;
  if (H <= 0 || I <= 0 || !projection_ok(ex.gate, f, I, H) || !projection_ok(ex.up, f, I, H) ||
      !projection_ok(ex.down, f, H, I))
    return false;
  if (f == quant::WeightFormat::GptqInt4 &&
      (ex.gate.group_size != ex.up.group_size))  // the gate_up kernel reads one group size for both
    return false;
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0) return false;
  if ((shared_out == nullptr) != (shared_gate_logit == nullptr))
    throw Error("moe_mma: the shared expert output and its gate logit come together");
  if (M < 0) throw Error("moe_mma: negative M");
  if (M == 0) return true;
  if (s.top_k > kMaxTopK || s.top_k <= 0) throw Error("moe_mma: top_k must be in 1..32");
  if (s.num_experts > kMaxExperts) throw Error("moe_mma: more than 1024 experts are not supported");
  if (workspace_bytes < moe_mma_workspace_bytes(s, M)) throw Error("moe_mma: workspace too small");
  const long long slots = (long long)M * s.top_k;
  // The tile size by the average slots per expert (M·k / E; the tiles of one call all have it):
  //   <= 4  small tiles (decode-like sizes: more CTAs, weights streamed by all SMs);
  //   <= 40 32-slot tiles (the 64-slot tiling's second row of warps would mostly idle on tiles
  //         of ~32 slots; 2 CTAs per SM);
  //   else  64-slot tiles.
  // All give the same bits. Variant 7 (variant 5's kernels) sizes the tiles per expert above
  // 4 slots per expert on average: 64-slot tiles, an expert's remainder of <= 32 slots (or all
  // its slots, if <= 32) on a 32-slot tile (route_and_group_mixed), so an expert of 33-64 slots
  // takes one pass over its weights instead of two 32-slot passes.
  // Variant 8 is variant 7 except at <= 4 slots per expert with GPTQ experts: the swapAB kernels
  // (up to 8 tokens: gate_up routing each slot itself, down with the combine; more: route_and_group
  // on tiles of kSwapTile slots, gate_up, down with the combine), the same bits.
  const int variant = g_variant.load();
  const int bm = slots <= 4LL * s.num_experts ? kSmallBM : slots <= 40LL * s.num_experts ? kMidBM : kLargeBM;
  const bool mixed = (variant == 7 || variant == 8) && bm != kSmallBM;
  const bool swap = swap_serves(variant, bm, s, ex);
  const int tile = swap ? kSwapTile : bm;
  const long long grid_tiles = (slots + tile - 1) / tile + std::min<long long>(slots, s.num_experts);
  if (grid_tiles > 65535) throw Error("moe_mma: too many tokens for one launch");
  const MixedLayout mix = mixed_tile_layout(slots, s.num_experts);  // both <= grid_tiles (see MixedLayout)
  Workspace w;
  carve(workspace, s, M, &w);
  if (swap) {  // two launches up to 8 tokens (routing fused), else three (route_and_group first)
    const SwapBuffers sb{w.ids, w.weights, w.act_hi, w.act_lo, w.y, w.arrivals};
    if (swap_fused_routing(s, M)) {
      swap_experts(x, router_logits, s, ex, M, nullptr, 0, sb, residual, shared_out, shared_gate_logit, stream);
      return true;
    }
    route_and_group(router_logits, s, M, kSwapTile, w.ids, w.weights, w.num_tiles, w.tile_expert, w.tile_start,
                    w.tile_count, w.order, stream);
    const TileList tiles{w.num_tiles, w.tile_expert, w.tile_start, w.tile_count, w.order};
    swap_experts(x, router_logits, s, ex, M, &tiles, int(grid_tiles), sb, residual, shared_out, shared_gate_logit,
                 stream);
    return true;
  }
  if (mixed)
    route_and_group_mixed(router_logits, s, M, w.ids, w.weights, w.num_tiles, w.tile_expert, w.tile_start,
                          w.tile_count, mix.mid_cap, w.order, stream);
  else
    route_and_group(router_logits, s, M, bm, w.ids, w.weights, w.num_tiles, w.tile_expert, w.tile_start,
                    w.tile_count, w.order, stream);
  if (variant >= 5 && f == quant::WeightFormat::GptqInt4) {  // form 3: each 32-k block permuted (H % 32 == 0)
    const size_t n8 = size_t(M) * size_t(H) / 8;
    const unsigned blocks = unsigned(std::min<size_t>((n8 + 255) / 256, 4096));
    split_rows_perm32_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<const float4*>(x), n8,
                                                         reinterpret_cast<uint32_t*>(w.x_hi),
                                                         reinterpret_cast<uint32_t*>(w.x_lo));
    MOESERVE_CUDA_CHECK_LAUNCH();
  } else {  // x -> hi / lo bf16 planes (H % 16 == 0: whole float4s)
    const size_t n4 = size_t(M) * size_t(H) / 4;
    const unsigned blocks = unsigned(std::min<size_t>((n4 + 255) / 256, 4096));
    split_rows_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<const float4*>(x), n4,
                                                  reinterpret_cast<uint2*>(w.x_hi), reinterpret_cast<uint2*>(w.x_lo));
    MOESERVE_CUDA_CHECK_LAUNCH();
  }
  const TileList tiles{w.num_tiles, w.tile_expert, w.tile_start, w.tile_count, w.order};
  if (mixed) {
    const int lo = mix.mid_cap;  // the 64-slot list's first index
    const TileList large{w.num_tiles + 1, w.tile_expert + lo, w.tile_start + lo, w.tile_count + lo, w.order};
    switch (f) {
      case quant::WeightFormat::GptqInt4:
        launch_experts_mixed<BFmt::Gptq>(s, ex, tiles, mix.mid_cap, large, mix.large_cap, w, stream);
        break;
      case quant::WeightFormat::Fp8Block:
        launch_experts_mixed<BFmt::Fp8>(s, ex, tiles, mix.mid_cap, large, mix.large_cap, w, stream);
        break;
      default:
        launch_experts_mixed<BFmt::Bf16>(s, ex, tiles, mix.mid_cap, large, mix.large_cap, w, stream);
        break;
    }
    combine_routed(w.y, w.weights, s, M, residual, shared_out, shared_gate_logit, stream);
    return true;
  }
  switch (f) {
    case quant::WeightFormat::GptqInt4:
      launch_experts<BFmt::Gptq>(variant, bm, s, ex, tiles, int(grid_tiles), w, stream);
      break;
    case quant::WeightFormat::Fp8Block:
      launch_experts<BFmt::Fp8>(variant, bm, s, ex, tiles, int(grid_tiles), w, stream);
      break;
    default:
      launch_experts<BFmt::Bf16>(variant, bm, s, ex, tiles, int(grid_tiles), w, stream);
      break;
  }
  combine_routed(w.y, w.weights, s, M, residual, shared_out, shared_gate_logit, stream);
  return true;
}

}  // namespace moeserve::cuda
