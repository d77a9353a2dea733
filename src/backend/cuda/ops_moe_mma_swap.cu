// swapAB expert kernels (ops_moe_mma_swap.cuh): moe_routed_experts_mma's variant 8 at decode sizes
// (<= 4 slots per expert on average, GPTQ INT4 experts). The expert's weight columns are the MMA's
// A operand (16 output columns per m16 fragment) and a tile's <= 4 slots its B operand (one n8
// fragment, half used), so an empty slot wastes an MMA column, not dequantisation work.
//
// Bits. Every output gets exactly the word form's (ops_moe_mma.cu kernel form 3) operations: per
// group of g k (in ascending order), for each 32-k block, for its two k16 steps s in order,
// C = mma(x_hi, B, C) then C = mma(x_lo, B, C), C = +0 at the group's first MMA (RZ, mma_bf16_zc),
// B = the exact bf16 (q − zero), the activations' k permuted inside the block (kperm32_logical); then
// acc = fma(C, float(scale[group][n]), acc) from acc = +0 over the groups in ascending order. An MMA
// computes D[i][j] from A row i, B column j and C[i][j] only, so with the operands swapped the
// element (n, slot) sees the same 16 exact products at the same k positions and the same C: the
// same bits (SwapTiling* tests). gate_up: act = silu_mul_rn(gate, up), split to hi / lo bf16
// (split2) at the permuted position; down: y[slot][n] = acc (f32), then the combine, exactly
// combine_kernel's (ops_moe.cu): acc = fma(w_r, y_r, acc) over the ranks from 0, residual + acc,
// fma(1 / (1 + e^-gate), shared, ·).
//
// Layout. qweight [E][K/8][N] int32 (word (kw, n): k 8kw .. 8kw+7 of column n, low nibble first),
// scales f16 [E][K/g][N], qzeros [E][K/g][N/8] (stored zero − 1), all as checkpointed. x f32 [M, H];
// act_hi / act_lo bf16 [M·k, I] (row = order position; fused form: slot), each 32-k block permuted
// (the word form's down input); y f32 [M·k, H] by slot; arrivals int32 [M][H/32].
//
// Two forms (swap_experts):
//   fused routing (M <= 8, E <= 256): gate_up grid (⌈I/16 / nc⌉, M·k), CTA row = slot m·k + r: warp 0
//     routes token m (route_token, the grouping kernel's function: the same ids / weight bits;
//     rounds 0..r only, all k in the CTA (0, m·k) that publishes ids / weights) while the other
//     warps split x row m into the planes; then it streams expert ids[slot]. down grid
//     (⌈H/32 / nc⌉, M·k) reads ids[slot]. Two launches, no grouping, no combine launch.
//   tiled (more tokens): route_and_group with tiles of <= kSwapTile slots of one expert; grids
//     (⌈I/16 / nc⌉, tiles) and (⌈H/32 / nc⌉, tiles), CTAs past *num_tiles exit after the PDL wait.
//   nc = column blocks per CTA (below), per launch (choose_nc) or forced (set_swap_columns_per_cta).
//
// Parallelisation. CTA = 8 warps on one tile (fused: one slot) x nc column blocks of 32 weight columns
// (gate_up: 16 gate + 16 up columns 16·nb .., the SwiGLU CTA-local; down: 32 columns 32·nb ..), all
// of K each. The CTA streams its column blocks as ONE sequence of units v = c·groups + gi (column
// block c of the CTA, group gi): the prologue (PDL wait, fused routing, x split / act copy, tile
// reads, first loads) is paid once per CTA, and the weight ring keeps streaming across column
// blocks (a ring slot's next unit may be the next block's, issued while this block is folded). The
// description below is of units: "group" = unit, K's groups = the CTA's nc·K/g units.
// Thread (g = lane / 4, t4 = lane % 4) owns the CTA columns 4g .. 4g + 3 (gate_up: gate for g < 4,
// up for g >= 4): per 32-k block b its A words are word row 4b + t4 of those 4 columns, ONE 16-byte
// LDG straight into registers (no shared-memory ring for weights); m16 fragment f rows g, g + 8 <-
// columns 4g + 2f, 4g + 2f + 1; A regs of step s = nibble pairs (j, j + 4), j = 2s (k lo) / 2s + 1
// (k hi) of the word (kperm32 order), converted as form 3 converts its B word: 3 SHF, 4 LOP3
// ((x & 0x000F000F) | 0x43004300 in one lop3), 4 HSUB2 per word. K is cut into rounds of kGR groups
// (8 blocks per warp: g 128 16 groups, g 64 32, g 32 64); in round r warp w computes the groups
// r·kGR + 8j + w (j = 0 .. 8/(g/32) − 1), each group's C independent of the others. The warp's 8
// blocks of a round sit in an 8-deep register ring (static slots by unrolling): a block's slot is
// refilled with the same slot's block of round r + 1 right after its words are converted, so 8
// blocks (4 KB per warp, 32 KB per CTA) are in flight while the warp computes; the zero words
// (asymmetric) ride along one per group. No barrier inside a round: each warp stores its groups'
// raw C in cbuf[group][slot][column] (slot rows of 33 floats: conflict-free), then ONE
// __syncthreads per round, then warp j (j < the tile's slot count) folds slot j's 32 columns
// (lane = column) over the round's units in order: acc = fma(C, scale, acc), from acc = +0 at a
// column block's first group; at a block's last group the fold warp runs that block's epilogue
// (below) while the other warps already compute the next round. The round's scales
// (f16 [kGR][32], each unit's row of its column block) come by cp.async, issued one round ahead
// (prologue / after the previous round's barrier) into one of two buffers. cbuf is
// double-buffered when the CTA has more than one round (one
// buffer plus a barrier before the next round's stores where two do not fit 99 KB: g 32 gate_up).
// B operand: the tile's activation rows ONCE per CTA as bf16 hi / lo planes [count][K + 8] (odd
// 16-byte units per row: conflict-free ldmatrix; rows past the count read the last slot's row,
// computed and discarded): gate_up splits its x rows (f32, 16-byte loads) in the prologue exactly
// as split_rows_perm32_kernel pairs them; down copies its act rows (cp.async). Per block and thread:
// 2 ldmatrix.x4 (hi, lo).
// Down + combine: the fold warp stores y[slot][n0 + lane], fences, and lane 0 counts the slot in
// arrivals[token][nb] (atomicAdd; per token and 32 columns, whatever nc); the warp whose arrival
// completes the token's k slots combines the
// token's 32 columns (other slots' y rows by ld.global.cg) into the residual and resets the counter
// to 0. gate_up's CTA (0, 0) zeroes the step's counters first (after its PDL wait; the down kernel
// touches them only after its own), so the workspace may hold anything on entry.
// PDL: both kernels wait (pdl_wait) before any global access: the expert ids come from routing, so
// no weight is requested earlier; they let the next kernel launch after the prologue.
//
// Shared memory (dynamic, bytes): cbuf nbuf x kGR x slots x 33 x 4, scales 2 x kGR x 64, planes
// slots x (K + 8) x 4 (slots = 4 tiled, 1 fused). 122B-A10B (H 3072, I 1024, g 128): gate_up tiled
// 66.6 KB (several rounds: nbuf 2), fused 18.2 KB; down (nc > 1: nbuf 2) tiled 34.6 KB, fused
// 10.2 KB (nc 1: 26.4, 8.1). Limit 99 KB (DGX Spark): shapes above it (large H at small g) are not served (swap_supported). Registers: <= 128
// (__launch_bounds__(256, 2), no spills on sm_90 / sm_121), so 2 CTAs (16 warps, 64 KB of weights
// in flight) per SM where shared memory allows. The ring (32 registers) stays live through the
// fold and the epilogues (the next round's loads in flight): word addresses are 32-bit offsets
// from the parameter pointers (swap_supported: E·K/8·N < 2^31).
// Column blocks per CTA (choose_nc): 256 threads, 8 blocks (4 KB) in flight per warp, 32 KB per CTA,
// kept (not 1 CTA of 512 threads per SM): with <= 2 CTAs per SM a full wave holds 64 KB per SM in
// flight, above the ~32-48 KB that streams HBM. nc (1 .. 8) minimises the modelled time
// ⌈CTAs / (SMs · CTAs per SM)⌉ · (nc + 0.5) (0.5: a CTA's fixed cost in column blocks, a model
// constant), the larger nc on ties. 122B-A10B on 132 SMs, 2 CTAs per SM: batch 1 (8 rows) gate_up
// nc 2 (256 CTAs, one wave), down nc 3 (256); batch 8 (64 rows) gate_up nc 8 (512), down nc 8 (768).
//
// Roofline (122B-A10B: E 256, top-8, H 3072, I 1024, g 128). Bytes: every tile (fused: every slot)
// reads its expert's gate / up / down words once (4.7 MB per expert, 1.5% scales) plus its slots'
// activations from L2 once per CTA (gate_up: 4·H bytes per slot per CTA, I/16/nc CTAs per tile;
// down: 4·I per slot, H/32/nc CTAs): at batch 1, 8 slots: 37.7 MB of weights. CTAs: gate_up
// 64/nc per tile, each streaming nc·48 KB of words; down 96/nc per tile, nc·16 KB.
// MMA work: 8 MMAs per warp per 32-k block = 2 MMAs per weight word (hi and lo), far below the
// tensor cores' rate; the cost is the instructions per weight word: per block and thread 1 LDG.128
// (4 words), 2 LDSM.x4, 12 SHF, 16 LOP3, 16 HSUB2, 8 HMMA and the ring's addressing. Counted (no
// cuobjdump on the build machine) as the growth of the cubin's .text when the ring holds 16 blocks
// instead of 8 (8 more blocks per warp and round, their groups' C stores / zero words and 8 more
// prologue loads), / 8 / 16 bytes: g 128 ~75 (sm_90) / ~82 (sm_121) per block and thread, all of it
// included; the block body alone is estimated at ~63-67 (the previous shared-memory-ring kernels:
// 56), the rest per group (C stores, zero words) and the refills' 64-bit addressing.
#include <algorithm>
#include <atomic>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/ops_moe_mma_swap.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace moeserve::cuda {
namespace {

using namespace moe_detail;
using namespace mma_frag;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRing = 8;           // 32-k blocks per warp per round: the register ring's depth
constexpr int kCStride = 33;       // floats per cbuf slot row (32 columns + 1: conflict-free stores)
constexpr int kSmemMax = 99 * 1024;  // the DGX Spark's per-block limit

// Group size G, SL slot rows per tile (kSwapTile tiled, 1 fused).
template <int G, int SL>
struct SwapCfg {
  static constexpr int kBPG = G / 32;          // 32-k blocks per group
  static constexpr int kGPW = kRing / kBPG;    // groups per warp per round
  static constexpr int kGR = kWarps * kGPW;    // groups per round
  static constexpr int kCBufBytes = kGR * SL * kCStride * 4;
  static constexpr int kSBufBytes = kGR * 32 * 2;
  // Rounds of a CTA streaming nc column blocks (nc·K/G units of one group of one column block).
  __host__ __device__ static int rounds(int K, int nc) { return (nc * (K / G) + kGR - 1) / kGR; }
  __host__ __device__ static int smem_bytes(int K, int nbuf) {
    return nbuf * kCBufBytes + 2 * kSBufBytes + SL * (K + 8) * 4;
  }
  // Two C buffers (no barrier before a round's stores) when the CTA has several rounds and they fit.
  static int nbuf(int K, int nc) { return rounds(K, nc) > 1 && smem_bytes(K, 2) <= kSmemMax ? 2 : 1; }
  static_assert(G == 32 || G == 64 || G == 128, "GPTQ groups");
  static_assert(kCBufBytes % 16 == 0 && kSBufBytes % 16 == 0, "16-byte aligned regions");
  static_assert(kGR * 4 <= kThreads, "one scale chunk per thread per round");
};

struct SwapArgs {
  const float* x;       // gate_up: x f32 [M, H]
  const float* logits;  // fused gate_up: router logits f32 [M, E]
  int E, top_k, M;
  TileList tiles;      // tiled form
  ExpertView w0, w1;   // gate_up: gate, up; down: down, down
  bf16* act_hi;        // gate_up: out; down: in
  bf16* act_lo;
  float* y;            // down: [M·k, H] by slot
  int32_t* ids;        // fused gate_up: written; fused down: read
  float* weights;      // fused gate_up: written; down: read (the combine)
  int32_t* arrivals;   // [M][H/32]
  float* residual;
  const float* shared_out;
  const float* shared_gate;
  int nbuf;  // C buffers (SwapCfg::nbuf)
  int nc;    // column blocks per CTA (the last CTA of a row: the remainder)
};

// x row xr (f32, K) -> row j of the planes hi / lo (u32 pairs, (K + 8) / 2 per row), each 32-k
// block permuted exactly as split_rows_perm32_kernel pairs it: unit u = 8 consecutive k (word
// t = u % 4 of its block); physical k 8t + j' and 8t + 4 + j' form the bf16 pair at logical 8j' + 2t,
// i.e. u32 16·block + t + 4j' of the row. Threads t of nt.
__device__ __forceinline__ void split_row_to_planes(const float* __restrict__ xr, int K, uint32_t* hp, uint32_t* lp,
                                                    int j, int t, int nt) {
  const int upr = K / 8;
  for (int ku = t; ku < upr; ku += nt) {
    const float4* src = reinterpret_cast<const float4*>(xr) + 2 * ku;
    const float4 va = __ldcg(src), vb = __ldcg(src + 1);
    const float av[4] = {va.x, va.y, va.z, va.w}, bv[4] = {vb.x, vb.y, vb.z, vb.w};
    const int base = j * ((K + 8) / 2) + (ku >> 2) * 16 + (ku & 3);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      uint32_t h, l;
      split2(av[jj], bv[jj], h, l);
      hp[base + 4 * jj] = h;
      lp[base + 4 * jj] = l;
    }
  }
}

// One CTA: gate_up (kGateUp) or down, group size G, fused routing (kFused: one slot per CTA row) or
// a tile of route_and_group (<= kSwapTile slots) x the 32 weight columns of column block blockIdx.x.
template <bool kGateUp, int G, bool kFused>
__global__ void __launch_bounds__(kThreads, 2) swap_kernel(const SwapArgs a) {
  constexpr int SL = kFused ? 1 : kSwapTile;
  using C = SwapCfg<G, SL>;
  constexpr int kBPG = C::kBPG, kGPW = C::kGPW, kGR = C::kGR;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int32_t s_ids[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  __shared__ int s_row[SL];

  const int N = a.w0.N, K = a.w0.K, groups = K / G, k = a.top_k;
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
  // Column blocks (gate_up: 16 gate + 16 up columns, down: 32 columns): this CTA's cb0 .. cb0 + ncb − 1
  // (a.nc of them; the row's last CTA the remainder), U units of one group of one column block.
  constexpr int kColStep = kGateUp ? 16 : 32;
  const int cb0 = int(blockIdx.x) * a.nc, ncb = min(a.nc, N / kColStep - cb0), U = ncb * groups;
  const int n0 = cb0 * kColStep;  // the CTA's first column (of gate / up / down)
  const int nbuf = a.nbuf;
  const uint32_t sbase = uint32_t(__cvta_generic_to_shared(smem));
  const int sbuf_off = nbuf * C::kCBufBytes, plane_off = sbuf_off + 2 * C::kSBufBytes;
  uint32_t* hp = reinterpret_cast<uint32_t*>(smem + plane_off);  // gate_up: the x planes as u32 pairs

  pdl_wait();  // routing, tiles, x / act, ids / weights, arrivals, residual: all earlier kernels'
  if (kGateUp && blockIdx.x == 0 && blockIdx.y == 0)  // the down kernel's arrival counters of this step
    for (int i = tid; i < a.M * (K / 32); i += kThreads) a.arrivals[i] = 0;

  int e = 0, count = 1, start = 0;
  if constexpr (kFused) {
    const int slot = int(blockIdx.y);
    if constexpr (kGateUp) {
      // Warp 0 routes the slot's token (rounds 0..r; the publisher all k) while the others split
      // its x row into the planes (count 1: the lo plane right after the hi plane's row).
      const int m = slot / k, r = slot % k;
      const bool publisher = blockIdx.x == 0 && r == 0;
      if (warp == 0)
        route_token<8>(a.logits + size_t(m) * a.E, a.E, publisher ? k : r + 1, s_ids, s_w);  // E <= 256
      else
        split_row_to_planes(a.x + size_t(m) * K, K, hp, hp + (K + 8) / 2, 0, tid - 32, kThreads - 32);
      __syncthreads();
      e = min(max(s_ids[r], 0), a.E - 1);  // in range even for non-finite logits
      if (publisher && tid < k) {          // the down kernel reads the token's routing from here
        a.ids[size_t(m) * k + tid] = min(max(s_ids[tid], 0), a.E - 1);
        a.weights[size_t(m) * k + tid] = s_w[tid];
      }
    } else {
      e = min(max(__ldcg(a.ids + slot), 0), a.E - 1);
    }
  } else {
    const int t = int(blockIdx.y);
    if (t >= __ldcg(a.tiles.num_tiles)) return;  // uniform over the CTA, before any barrier
    e = __ldcg(a.tiles.expert + t);
    start = __ldcg(a.tiles.start + t);
    count = __ldcg(a.tiles.count + t);
  }
  // Tiled: each slot's output row (gate_up: its act row = order position; down: its y row = slot),
  // kept in shared memory for the epilogue (not in a register across the main loop).
  if (!kFused && tid < count) s_row[tid] = kGateUp ? start + tid : __ldcg(a.tiles.order + start + tid);

  // ---- this thread's weight stream: word rows 4b + t4 of block b, columns col0 .. col0 + 3 ----
  // The CTA streams column blocks cb0 .. cb0 + ncb − 1 as ONE sequence of units v = c·groups + gi
  // (column block c, group gi): round r, warp w, ring slot j holds unit r·kGR + 8j + w, so a ring
  // slot's next unit may lie in the next column block and the loads never drain between blocks.
  const bool upm = kGateUp && g >= 4;
  const int col0 = n0 + 4 * (kGateUp ? (g & 3) : g);
  const bool my_sym = upm ? a.w1.sym : a.w0.sym;
  // The thread's words: qweight (gate_up: of gate or up, from the parameters) + qoff + a unit's
  // offset, all 32-bit (swap_supported: E·K/8·N < 2^31), no 64-bit pointer held across the loop.
  const int qoff = (e * (K / 8) + t4) * N + col0;
  auto words = [&](int off) {
    return reinterpret_cast<const uint4*>((upm ? a.w1.qweight : a.w0.qweight) + (qoff + off));
  };
  const int blk_stride = 4 * N;  // int32 per 32-k block
  // v / groups as a multiply-high: m = 2^31 / groups + 1 gives floor(2v·m / 2^32) = floor(v / groups)
  // exactly while v·groups < 2^31 (v < 8·groups, groups <= 2^11 here).
  const uint32_t magic = (1u << 31) / uint32_t(groups) + 1u;
  auto unit_cb = [&](int v) { return int(__umulhi(uint32_t(v) * 2u, magic)); };
  // Unit v's words (block kb at + kb·blk_stride) as an offset from qoff.
  auto unit_off = [&](int v) {
    const int c = unit_cb(v), gi = v - c * groups;
    return c * kColStep + gi * (kBPG * blk_stride);
  };
  // Unit v's zero word: qzeros (gate_up: of gate or up, from the parameters) + a 32-bit offset (no
  // 64-bit pointer held across the main loop).
  const int zoff = e * groups * (N / 8) + col0 / 8;
  auto zero_src = [&](int v) {
    const int c = unit_cb(v), gi = v - c * groups;
    return (upm ? a.w1.qzeros : a.w0.qzeros) + (zoff + c * (kColStep / 8) + gi * (N / 8));
  };
  uint4 ring[kRing];
  uint32_t zring[kGPW];
#pragma unroll
  for (int i = 0; i < kRing; ++i) ring[i] = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int j = 0; j < kGPW; ++j) {  // round 0's blocks and zero words
    zring[j] = 0u;
    const int v = j * kWarps + warp;
    if (v < U) {
      const int off = unit_off(v);
#pragma unroll
      for (int kb = 0; kb < kBPG; ++kb) ring[j * kBPG + kb] = __ldg(words(off + kb * blk_stride));
      if (!my_sym) zring[j] = uint32_t(__ldg(zero_src(v)));
    }
  }

  // Round r's scales (f16 [kGR][32], 8 columns per 16-byte chunk) into scale buffer r & 1.
  auto copy_scales = [&](int r) {
    if (tid < kGR * 4) {
      const int gl = tid >> 2, q = tid & 3, v = r * kGR + gl;
      if (v < U) {
        const int c = unit_cb(v), gi = v - c * groups;
        const bool m1 = kGateUp && q >= 2;
        const int n = n0 + c * kColStep + (kGateUp ? 8 * (q & 1) : 8 * q);
        cp_async16(sbase + uint32_t(sbuf_off + (r & 1) * C::kSBufBytes + (gl * 32 + 8 * q) * 2),
                   (m1 ? a.w1.scales : a.w0.scales) + (size_t(e) * groups + gi) * N + n);
      }
    }
    cp_async_commit();
  };
  copy_scales(0);

  // ---- the B operand: the tile's activation rows as bf16 hi / lo planes [count][K + 8] ----
  const uint32_t lo_bytes = uint32_t(count * (K + 8) * 2);  // the lo plane's offset
  if constexpr (kGateUp && !kFused) {
    int xr[SL];  // x row of each slot (loaded together: one L2 round trip)
#pragma unroll
    for (int j = 0; j < SL; ++j) xr[j] = j < count ? __ldcg(a.tiles.order + start + j) / k : 0;
#pragma unroll
    for (int j = 0; j < SL; ++j)
      if (j < count) split_row_to_planes(a.x + size_t(xr[j]) * K, K, hp, hp + lo_bytes / 4, j, tid, kThreads);
  }
  if constexpr (!kGateUp) {  // act rows (row = order position; fused: slot), 16-byte chunks
    const int cpr = K / 8;
    for (int c = tid; c < count * cpr; c += kThreads) {
      const int j = c / cpr, q = c - j * cpr;
      const size_t off = size_t(kFused ? int(blockIdx.y) : start + j) * K + 8 * q;
      const uint32_t d = sbase + uint32_t(plane_off + (j * (K + 8) + 8 * q) * 2);
      cp_async16(d, a.act_hi + off);
      cp_async16(d + lo_bytes, a.act_lo + off);
    }
    cp_async_commit();
  }
  pdl_launch_dependents();
  cp_async_wait<0>();
  __syncthreads();  // the planes and round 0's scales

  // ldmatrix lane address of block 0: row lane % 8 (clamped to the last slot), 8-k matrix lane / 8.
  const uint32_t bq = sbase + uint32_t(plane_off + (min(lane & 7, count - 1) * (K + 8) + (lane >> 3) * 8) * 2);
  const uint32_t magic43 = 0x43004300u | (uint32_t(blockDim.x) >> 31);  // opaque: stays in a register
  const int rounds = (U + kGR - 1) / kGR;

  // Epilogue of one column block (fold warps: slot `warp`, CTA column `lane`; warp-uniform).
  auto epilogue = [&](int c, float acc) {
    const int my_row = kFused ? int(blockIdx.y) : s_row[warp];  // written before the prologue's barrier
    const int nc0 = n0 + c * kColStep;                          // the column block's first column
    if constexpr (kGateUp) {  // lanes 0..15 gate, 16..31 up of columns nc0 + lane % 16
      const float up = __shfl_down_sync(0xffffffffu, acc, 16);
      if (lane < 16) {
        const int n = nc0 + lane;
        uint32_t hi, lo;
        split2(silu_mul_rn(acc, up), 0.f, hi, lo);  // the low halves: split2 of the value alone
        const size_t o = size_t(my_row) * N + (n & ~31) + kperm32_logical(n & 31);
        a.act_hi[o] = __ushort_as_bfloat16(uint16_t(hi & 0xFFFFu));
        a.act_lo[o] = __ushort_as_bfloat16(uint16_t(lo & 0xFFFFu));
      }
    } else {
      const int slot = my_row, m = slot / k, h = nc0 + lane;
      a.y[size_t(slot) * N + h] = acc;
      __threadfence();  // this lane's y before the slot's arrival
      __syncwarp();
      int last = 0;
      if (lane == 0) {
        __threadfence();
        int32_t* ctr = a.arrivals + size_t(m) * (N / 32) + (nc0 >> 5);
        last = atomicAdd(ctr, 1) == k - 1;  // the token's k-th slot of these columns
        if (last) atomicExch(ctr, 0);       // no other arrival this step: back to zero for the next
      }
      last = __shfl_sync(0xffffffffu, last, 0);
      if (last) {
        __threadfence();  // the other slots' y (their arrivals came before ours)
        // combine_kernel's arithmetic for (token m, column h).
        // (The CTA's next-round loads are in flight here: few live registers, one pointer per row.)
        const float* wr = a.weights + size_t(m) * k;
        const float* yr = a.y + size_t(m) * k * N + h;
        float sum = 0.0f;
#pragma unroll 4
        for (int rr = 0; rr < k; ++rr, yr += N) sum = __fmaf_rn(__ldcg(wr + rr), __ldcg(yr), sum);
        float o = __fadd_rn(__ldcg(a.residual + size_t(m) * N + h), sum);
        if (a.shared_out) {
          const float sig = 1.0f / (1.0f + __expf(-__ldcg(a.shared_gate + m)));  // combine_kernel's shared_scale
          o = __fmaf_rn(sig, __ldcg(a.shared_out + size_t(m) * N + h), o);
        }
        a.residual[size_t(m) * N + h] = o;
      }
    }
  };

  float acc = 0.f;  // fold warps (warp < count): slot `warp`, CTA column `lane`

  for (int r = 0; r < rounds; ++r) {
    if (nbuf == 1 && r > 0) __syncthreads();  // one C buffer: round r − 1's fold has read it
    float* cb = reinterpret_cast<float*>(smem + (r & (nbuf - 1)) * C::kCBufBytes);
#pragma unroll
    for (int j = 0; j < kGPW; ++j) {
      const int gl = j * kWarps + warp, v = r * kGR + gl;
      if (v >= U) continue;  // warp-uniform
      // The unit's group gi (its k range): its B rows start at block gi·kBPG of the planes.
      const uint32_t pg = bq + uint32_t((v - unit_cb(v) * groups) * (kBPG * 64));
      const bool pre = v + kGR < U;            // this ring slot's unit of round r + 1 exists
      // That unit's column block and group (one multiply-high for its words and zero word).
      const int cn = unit_cb(v + kGR), gn = v + kGR - cn * groups;
      const int noff = pre ? cn * kColStep + gn * (kBPG * blk_stride) : 0;
      uint32_t zz[4];
      if (my_sym) {
#pragma unroll
        for (int q = 0; q < 4; ++q) zz[q] = 0x43084308u;  // bf16 pair (128 + 8)
      } else {
        const uint32_t zw = zring[j];
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // column col0 + q: nibble (4g + q) % 8 of its zero word
          const uint32_t z = 0x4300u + ((zw >> (4 * (4 * (g & 1) + q))) & 0xFu) + 1u;
          zz[q] = z | (z << 16);
        }
        if (pre)
          zring[j] = uint32_t(__ldg((upm ? a.w1.qzeros : a.w0.qzeros) + (zoff + cn * (kColStep / 8) + gn * (N / 8))));
      }
      float c[2][4];
#pragma unroll
      for (int kb = 0; kb < kBPG; ++kb) {
        const int i = j * kBPG + kb;
        const uint32_t wd[4] = {ring[i].x, ring[i].y, ring[i].z, ring[i].w};
        // A fragments: a[f][s] = {(row g, j), (row g + 8, j), (row g, j + 1), (row g + 8, j + 1)},
        // j = 2s, each the nibble pair (j', j' + 4) of the row's word; rows g, g + 8 = words 2f, 2f + 1.
        uint32_t af[2][2][4];
#pragma unroll
        for (int f = 0; f < 2; ++f)
#pragma unroll
          for (int s2 = 0; s2 < 2; ++s2) {
            af[f][s2][0] = gptq_nibbles_j_j4_to_bf16x2(wd[2 * f] >> (8 * s2), magic43, zz[2 * f]);
            af[f][s2][1] = gptq_nibbles_j_j4_to_bf16x2(wd[2 * f + 1] >> (8 * s2), magic43, zz[2 * f + 1]);
            af[f][s2][2] = gptq_nibbles_j_j4_to_bf16x2(wd[2 * f] >> (8 * s2 + 4), magic43, zz[2 * f]);
            af[f][s2][3] = gptq_nibbles_j_j4_to_bf16x2(wd[2 * f + 1] >> (8 * s2 + 4), magic43, zz[2 * f + 1]);
          }
        // The slot's unit of the next round (possibly the next column block's).
        if (pre) ring[i] = __ldg(words(noff + kb * blk_stride));
        // B fragments (step s, register h: k 16s + 8h + 2t4 ..) from the planes.
        const uint32_t p = pg + uint32_t(kb * 64);
        uint32_t rh[4], rl[4];
        ldmatrix_x4(p, rh);
        ldmatrix_x4(p + lo_bytes, rl);
        // Per output: step 0 hi, step 0 lo, step 1 hi, step 1 lo; the group's first MMA from C = +0.
#pragma unroll
        for (int s2 = 0; s2 < 2; ++s2) {
#pragma unroll
          for (int f = 0; f < 2; ++f) {
            if (kb == 0 && s2 == 0)
              mma_bf16_zc(c[f], af[f][0], rh[0], rh[1]);
            else
              mma_bf16(c[f], af[f][s2], rh[2 * s2], rh[2 * s2 + 1]);
          }
#pragma unroll
          for (int f = 0; f < 2; ++f) mma_bf16(c[f], af[f][s2], rl[2 * s2], rl[2 * s2 + 1]);
        }
      }
      // C element q of fragment f: A row g (+8 for q >= 2) = CTA column 4g + 2f (+1), slot 2t4 + (q & 1).
#pragma unroll
      for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int slot = 2 * t4 + (q & 1);
          if (slot < SL) cb[(gl * SL + slot) * kCStride + 4 * g + 2 * f + (q >> 1)] = c[f][q];
        }
    }
    cp_async_wait<0>();  // this thread's scale copies of round r
    __syncthreads();     // every warp's C of round r and every thread's scales are in
    if (r + 1 < rounds) copy_scales(r + 1);  // into the buffer round r − 1's fold read (done: barrier)
    if (warp < count) {  // warp-uniform: slot `warp`, column `lane`, the round's units in order
      const float* cr = cb + warp * kCStride + lane;
      const __half* sr = reinterpret_cast<const __half*>(smem + sbuf_off + (r & 1) * C::kSBufBytes) + lane;
      const int ng = min(kGR, U - r * kGR);
      int fold_c = unit_cb(r * kGR), fold_g = r * kGR - fold_c * groups;  // the round's first unit
      // Segments of one column block: its groups in ascending order from acc = +0, then its
      // epilogue at the block's last group (while the other warps stream round r + 1).
      for (int gl = 0; gl < ng;) {
        const int seg = min(ng - gl, groups - fold_g);
#pragma unroll 8
        for (int i = 0; i < seg; ++i)
          acc = __fmaf_rn(cr[(gl + i) * SL * kCStride], __half2float(sr[(gl + i) * 32]), acc);
        gl += seg;
        fold_g += seg;
        if (fold_g == groups) {
          epilogue(fold_c, acc);
          acc = 0.f;
          fold_g = 0;
          ++fold_c;
        }
      }
    }
  }
}

// Column blocks per CTA: 0 = chosen per launch (choose_nc), 1 .. kMaxNc forced (tests, benchmarks).
std::atomic<int> g_forced_nc{0};
constexpr int kMaxNc = 8;
// A CTA's fixed cost (PDL wait, routing or the x split / act copy, first-load latency, the last
// round's drain) in column blocks of streaming: a model constant of choose_nc, not a measurement.
constexpr double kCtaOverhead = 0.5;

struct SwapDevice {
  int sms = 0, smem_sm = 0, reserved = 0;
};
const SwapDevice& swap_device() {
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static SwapDevice devs[kMaxDevices];
  int dev = 0;
  MOESERVE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) throw Error("moe_mma swap: device index out of range");
  std::lock_guard<std::mutex> lock(mu);
  SwapDevice& d = devs[dev];
  if (d.sms == 0) {
    MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&d.reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
    MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
  }
  return d;
}

// Column blocks per CTA for nblocks column blocks x rows CTA rows (tiled: an estimate of the tiles
// that run): the nc of least modelled time waves·(nc + kCtaOverhead), waves = ⌈CTAs / (SMs x CTAs
// per SM)⌉ (<= 2 per SM: the launch bounds; fewer where shared memory allows fewer), the larger nc
// on ties (fewer prologues). Every nc gives the same bits; set_moe_swap_columns_per_cta forces one.
template <int G, int SL>
int choose_nc(int K, int nblocks, int rows) {
  using C = SwapCfg<G, SL>;
  const int forced = g_forced_nc.load();
  if (forced > 0) return std::min(forced, nblocks);
  const SwapDevice& d = swap_device();
  int best = 1;
  double best_cost = 0.0;
  for (int nc = 1; nc <= std::min(kMaxNc, nblocks); ++nc) {
    const int smem = C::smem_bytes(K, C::nbuf(K, nc)) + 1024 + d.reserved;  // + the static arrays
    const long long per_sm = std::clamp(d.smem_sm / smem, 1, 2);
    const long long wave = std::max(1LL, d.sms * per_sm);
    const long long ctas = (long long)((nblocks + nc - 1) / nc) * std::max(rows, 1);
    const double cost = double((ctas + wave - 1) / wave) * (nc + kCtaOverhead);
    if (nc == 1 || cost <= best_cost) best = nc, best_cost = cost;
  }
  return best;
}

template <bool kGateUp, int G, bool kFused>
void launch_swap(SwapArgs a, int grid_y, int rows_est, cudaStream_t stream) {
  using C = SwapCfg<G, kFused ? 1 : kSwapTile>;
  opt_in_dynamic_smem<swap_kernel<kGateUp, G, kFused>>(kSmemMax, true);
  const int K = a.w0.K, nblocks = a.w0.N / (kGateUp ? 16 : 32);
  a.nc = choose_nc<G, kFused ? 1 : kSwapTile>(K, nblocks, rows_est);
  a.nbuf = C::nbuf(K, a.nc);
  const int grid_x = (nblocks + a.nc - 1) / a.nc;
  launch_pdl(true, swap_kernel<kGateUp, G, kFused>, dim3(unsigned(grid_x), unsigned(grid_y)), dim3(kThreads),
             size_t(C::smem_bytes(K, a.nbuf)), stream, a);
}

template <bool kGateUp, bool kFused>
void launch_swap_group(const SwapArgs& a, int grid_y, int rows_est, cudaStream_t stream) {
  switch (a.w0.group) {
    case 32:
      launch_swap<kGateUp, 32, kFused>(a, grid_y, rows_est, stream);
      break;
    case 64:
      launch_swap<kGateUp, 64, kFused>(a, grid_y, rows_est, stream);
      break;
    case 128:
      launch_swap<kGateUp, 128, kFused>(a, grid_y, rows_est, stream);
      break;
    default:
      throw Error("moe_mma swap: GPTQ group must be 32, 64 or 128");
  }
}

// The tiled form's shared memory (the larger) at group g and K (one C buffer: the fallback).
int swap_smem_min(int g, int K) {
  switch (g) {
    case 32:
      return SwapCfg<32, kSwapTile>::smem_bytes(K, 1);
    case 64:
      return SwapCfg<64, kSwapTile>::smem_bytes(K, 1);
    default:
      return SwapCfg<128, kSwapTile>::smem_bytes(K, 1);
  }
}

template <bool kGateUp, bool kFused>
void opt_in_group() {
  opt_in_dynamic_smem<swap_kernel<kGateUp, 32, kFused>>(kSmemMax, true);
  opt_in_dynamic_smem<swap_kernel<kGateUp, 64, kFused>>(kSmemMax, true);
  opt_in_dynamic_smem<swap_kernel<kGateUp, 128, kFused>>(kSmemMax, true);
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
         ex.gate.N == s.intermediate && ex.gate.K == s.hidden && ex.down.N == s.hidden &&
         ex.down.K == s.intermediate && swap_smem_min(int(ex.gate.group_size), s.hidden) <= kSmemMax &&
         swap_smem_min(int(ex.down.group_size), s.intermediate) <= kSmemMax &&
         // the kernels' 32-bit word offsets: E·K/8·N words per projection
         int64_t(s.num_experts) * (s.hidden / 8) * s.intermediate < (int64_t(1) << 31);
}

void swap_experts(const float* x, const float* router_logits, const MoeShape& s, const DeviceExperts& ex, int M,
                  const TileList* tiles, int grid_tiles, const SwapBuffers& b, float* residual,
                  const float* shared_out, const float* shared_gate_logit, cudaStream_t stream) {
  const bool fused = tiles == nullptr;
  if (fused && !swap_fused_routing(s, M)) throw Error("moe_mma swap: fused routing needs M <= 8 and E <= 256");
  SwapArgs a{};
  a.x = x;
  a.logits = router_logits;
  a.E = s.num_experts;
  a.top_k = s.top_k;
  a.M = M;
  if (tiles) a.tiles = *tiles;
  a.act_hi = b.act_hi;
  a.act_lo = b.act_lo;
  a.y = b.y;
  a.ids = b.ids;
  a.weights = b.weights;
  a.arrivals = b.arrivals;
  a.residual = residual;
  a.shared_out = shared_out;
  a.shared_gate = shared_gate_logit;
  const int slots = M * s.top_k;
  const int rows = fused ? slots : grid_tiles;
  // The tiles that run (for choose_nc): about one per expert used, at most one per slot.
  const int rows_est = fused ? slots : std::min(grid_tiles, std::min(slots, s.num_experts));
  a.w0 = view_of(ex.gate);
  a.w1 = view_of(ex.up);
  if (fused)
    launch_swap_group<true, true>(a, rows, rows_est, stream);
  else
    launch_swap_group<true, false>(a, rows, rows_est, stream);
  a.w0 = a.w1 = view_of(ex.down);
  if (fused)
    launch_swap_group<false, true>(a, rows, rows_est, stream);
  else
    launch_swap_group<false, false>(a, rows, rows_est, stream);
}

void set_swap_columns_per_cta(int nc) {
  if (nc < 0 || nc > kMaxNc) throw Error("moe_mma swap: columns per CTA must be 0 (chosen per launch) .. 8");
  g_forced_nc.store(nc);
}
int swap_columns_per_cta() { return g_forced_nc.load(); }

void swap_prepare() {
  opt_in_group<true, true>();
  opt_in_group<true, false>();
  opt_in_group<false, true>();
  opt_in_group<false, false>();
}

}  // namespace moe_detail
}  // namespace moeserve::cuda
