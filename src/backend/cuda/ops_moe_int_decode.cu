// The integer form of the GPTQ INT4 routed experts (moe_int_arith.h) for steps of 1 ..
// kIntDecodeMaxTokens tokens: two dp4a kernels on CUDA cores, routing fused into gate/up, the act
// quantisation into gate/up's tail and the combine into down (int_decode, ops_moe_int_internal.cuh).
//
// Layout: the checkpoint's own: qweight [E][K/8][N] int32 (nibble j of word (kp, n) = q[8kp + j, n]),
// scales f16 [E][K/g][N], qzeros [E][K/g][N/8] (stored zero - 1); x f32 [M, H]; router logits f32
// [M, E]; residual f32 [M, H]. Workspace (ops_moe_int_decode.cuh): ids, weights [M·k], act [M·k, I]
// f32 by slot = m·k + rank, and the act rows quantised: planes [M·k, I/8] x 16 B, block scales, ΣX.
//
// Arithmetic (moe_int_arith.h, exactly): an activation row is quantised per 128-k block by one warp
// (quantize_block: amax by a shuffle max, x_scale, quantize_x) into X = 256·hi + lo as two byte
// planes in the order dp4a wants: per packed row (8 k) one 16-byte vector {hi of k 0,2,4,6 | hi of
// k 1,3,5,7 | lo of k 0,2,4,6 | lo of k 1,3,5,7} (hi = X >> 8 signed, lo = X & 0xFF unsigned), the
// block scale s_b, and ΣX per 32 k. A GPTQ word w gives lo_w = w & 0x0F0F0F0F (q of k 0,2,4,6) and
// hi_w = (w >> 4) & 0x0F0F0F0F (k 1,3,5,7); per column A = Σ q·hi and B = Σ q·lo by four dp4a per
// word, and per sub-unit (min(U, 64) k: 64, or 32 when U = 32) the exact integer P = 256·A + B −
// z·ΣX goes to shared memory. After a barrier one lane per output adds the sub-units of a unit
// (exact: D_u) and folds the units in ascending k with fold_unit (step 3). No sum depends on M,
// the grid, the tile or the thread split: a token gets the same bits in any batch, and the same as
// int_form_linear and the tensor-core form. The routing is route_token's (ops_moe_internal.cuh)
// bit for bit: route_rounds below differs only in how it finds each round's arg-max.
//
// Why this decomposition (the latency chain at M = 1; 122B-A10B: H 3072, I 1024, k 8, g 128):
// the weights gate/up reads depend on the routing, the routing on the router logits, written by
// the previous kernel. So the chain of a gate/up CTA is: pdl_wait -> logits (one L2 round trip) ->
// softmax + arg-max rounds -> weight loads (one DRAM round trip) -> dp4a -> fold -> act. A separate
// routing kernel would add a grid boundary and one more L2 round trip (the ids) to that chain and
// save nothing on it; what made the previous version slow was not the chain but the work beside
// it: every WARP routed its token itself (~1,500 instructions, 44 % of the kernel's, issued by all
// 16 warps of an SM before their weight streams could run at full rate) and every down CTA
// re-quantised all k act rows of its token. Now:
//   - one warp per CTA and token routes (rounds 0 .. r of the CTA's last rank; all k where the CTA
//     publishes the token's ids / weights for down) while the other warps quantise the x rows;
//     the arg-max rounds use redux.sync (two warp reductions per round instead of five shuffle
//     pairs) and keep the chosen ids in shared memory (route_token's per-round arrays are local
//     memory). Fixed part per CTA (estimated from the source, no SASS listing here): one routing
//     warp (~250 instructions of softmax + ~45 per round: ~600 at k 8) and ~4 quantize_block (~90
//     each) + ~50 of setup per other warp at M = 1: ~4,100 warp instructions per CTA against ~12,000
//     (8 x 1,508) before; per tile then one fold warp (~450 + the arrival ~40, + ~100 when last);
//   - the act rows are quantised once per (slot, 128-column block): the gate/up CTAs that finish a
//     block's 32-column tiles count their arrivals (g_act_arrivals, one counter per (slot, block));
//     the last one reads the block's 128 act values back from L2 and writes its planes, s_b and ΣX
//     to the workspace, and sets the counter back to 0. Down just copies them to shared memory;
//   - CTAs are persistent: a grid of at most 2 CTAs per SM, each CTA a contiguous range of tiles
//     (the ranges differ by at most one tile), so the prologue is paid once per CTA, and a thread's
//     register ring runs on across its tiles (the next tile's first item is requested before the
//     tile's barrier). A range covers at most two tokens (the grid holds >= M CTAs): <= 2 routing
//     warps, <= 2 x rows, <= 2 tokens' act planes.
//
// Items: a thread's unit of work is (series, 4 columns, chunk of 8 packed rows = 64 k): 8 16-byte
// weight loads (ld.global.nc.L1::no_allocate.v4), plus per sub-unit that starts a GPTQ group the
// group's 4 scales (8 bytes, cp.async into shared memory) and, asymmetric, its zero word. Item i of
// a tile: lane i % L (L = series x column quads, quads fastest: a warp's loads cover whole row
// segments), chunk i / L. The CTA numbers the items of its range q = j·IT + i (tile j, IT items per
// tile); thread t runs q = t, t + 256, ... with a two-item register ring (the next item's loads
// are issued before the current one is computed: 8-16 rows, 128-256 bytes in flight per thread all
// the time), across tile boundaries, at most ceil(256 / IT) tiles ahead (1 at the 122B shapes).
// Per tile: items; barrier; warp j % 8 folds tile j (double-buffered sub-unit sums, scales in
// ahead + 2 buffers: the other warps go on with the next tile meanwhile; the fold warp rotates).
//
// gate/up (int_gate_up_kernel): tile = (slot, 32 columns of I: one 128-byte line of a packed row),
//   series gate and up of the slot's expert, L = 16, IT = 16·H/64; tiles M·k·I/32, numbered slot-
//   major. Prologue: routing warps (above), the other warps quantise the range's x rows (__ldcg:
//   written by the previous kernel) into shared memory; barrier. Fold: lane c folds gate and up of
//   column c (two chains), writes act = silu_mul_rn(g, u), then the block arrival (above).
// down (int_down_kernel): tile = (token, 8 columns of H), all k ranks (series = ranks, L = 2k, IT =
//   2k·I/64); tiles M·H/8, numbered token-major. Prologue: cp.async of the range's tokens' planes
//   (row stride I/8 + 1 vectors: the ranks' rows on different banks), s_b and ΣX; each thread
//   requests its first item as soon as it has read its rank's id; ids / weights, the residual and
//   shared values of the range's outputs to shared memory; barrier. Fold: k·8 chains (two per lane
//   at a time) into y, then combine_kernel's steps (ops_moe.cu) per column: acc = fmaf(w_r, y_r,
//   acc) over r from 0, o = residual + acc, with the shared expert o = fmaf(1 / (1 + __expf(-logit)),
//   shared, o).
// Threads 256, __launch_bounds__(256, 2) (<= 128 registers). Grid: min(tiles, max(M, 2 x SMs))
//   (1 x SMs when two CTAs do not fit in shared memory). Shared memory (bytes per CTA, up_layout /
//   down_layout; nt = tokens a range may cover, 1 at M = 1 or one tile per CTA, else 2):
//   gate/up planes nt·H/8·16, sub-unit sums 2·2·(H/sub)·32·4, scales nsc·2·(H/g)·32·2, s_b, ΣX and
//   a tile table; down planes nt·k·(I/8 + 1)·16, sums 2·k·(I/sub)·8·4, scales nsc·k·(I/g)·8·2, y
//   k·8·4, s_b, ΣX, residual / shared values 2·8 per tile and a tile table (nsc = 3 scale buffers
//   when a tile has >= 256 items, else a power of two >= ahead + 2).
//   122B-A10B: gate/up 40,432 B at M = 1, 47,168 B at M = 8; down 29,472 B at M = 1, 48,064 B at
//   M = 8 (+ 512 / 528 static): two CTAs per SM on the H200, and on the DGX Spark if its 99 KB per
//   SM hold two (plan_launch decides per device from its attributes; else one per SM). A shape whose CTA fits neither way
//   (or more (slot, block) counts than g_act_arrivals holds) runs int_mma (the same bits).
// Grids at the 122B shape on the H200 (132 SMs): M = 1 gate/up 256 tiles (96 KB each, 3 items per
//   thread) on 256 CTAs, down 384 tiles (32 KB, 1 item per thread) on 264 CTAs (1-2 each); M = 8
//   gate/up 2048 tiles on 264 CTAs (7-8 each), down 3072 on 264 (11-12 each). Registers (ptxas,
//   sm_90 / sm_121): gate/up 128 / 109-124, down 128 / 122-128, no spills.
// PDL: both kernels are programmatic dependent launches and wait (pdl_wait) before touching any
//   global memory (the experts to read depend on the routing, which needs the logits; down's on the
//   ids gate/up writes); they let their dependents launch after their prologue. shared_ready: the
//   stream waits for it before the down launch (the only kernel that reads shared_out).
//   g_act_arrivals: zero at module load, and the last arrival of a block sets it back to zero, so
//   it is zero between launches (graph replays, any workspace). Per device; gate/up launches on one
//   device must not overlap (they run in stream order on the model's stream; with PDL a gate/up
//   waits for the previous down, which waited for the previous gate/up).
// Roofline (bytes per layer): M·k·(2·I·H/2 + 2·(H/g)·I·2) for gate/up and M·k·(H·I/2 + (I/g)·H·2)
//   for down (+ zeros when asymmetric; a token's repeated expert is read again; tokens are not
//   grouped at M <= 8): 122B at M = 1 25.2 MB + 12.6 MB = 37.7 MB of weights + 1.2 MB of scales.
//   Activations from L2: x (4·H) per gate/up CTA and token, act (4·128 per block, once) and the
//   act planes (2·I bytes + s_b and ΣX per slot) per down CTA and token.
// Instructions per weight word: 1 LOP3, 1 SHF + 1 LOP3, 4 dp4a (+ 1/4 of a 16-byte shared load of
//   X), against ~25 for the f32 form (ops_moe_decode.cu); per item ~25 more for its addresses.
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <mutex>
#include <string>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/per_device.h"
#include "backend/cuda/moe_int_arith.h"
#include "backend/cuda/ops_moe_int_decode.cuh"
#include "backend/cuda/ops_moe_int_decode_common.cuh"
#include "backend/cuda/ops_moe_int_internal.cuh"
#include "backend/cuda/ops_moe_internal.cuh"
#include "backend/cuda/pdl.cuh"
#include "core/error.h"

namespace moeserve::cuda::moe_int_detail {
namespace {

using async_copy::cp_async16;
using async_copy::cp_async8;  // the 4 group scales (8 bytes): no register holds them in flight
using async_copy::cp_async_commit;
using async_copy::cp_async_wait;
using moe_detail::ExpertView;
using moe_detail::kMaxTopK;
using moe_detail::silu_mul_rn;
using moe_detail::view_of;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunkRows = 8;   // packed rows per item (64 k)
constexpr int kUpCols = 32;     // gate/up tile: columns of I (4 tiles per 128-column act block)
constexpr int kDownCols = 8;    // down tile: columns of H (2 column quads per rank)
constexpr int kMaxRangeTokens = 2;
static_assert(kUpCols == kActTileCols, "act_block_arrive counts 4 gate/up tiles per act block");

// Arrival counts of the act blocks, one per (slot, 128-column block) of a launch (see the header).
constexpr int kArrivalSlots = 1 << 15;
__device__ unsigned g_act_arrivals[kArrivalSlots];

// ---- shared memory ---------------------------------------------------------------------------

__host__ __device__ constexpr int round16(int b) { return (b + 15) / 16 * 16; }

// Byte offsets of a CTA's dynamic shared memory.
struct SmemLayout {
  int planes, dp, sc, ys, sblk, sx, res, tiles, bytes;
  int dp_buf, sc_buf;  // elements per buffer of dp (int) and sc (half)
};
// Scale buffers for a prefetch distance of `ahead` tiles: the tiles j - 1 (its fold) .. j + ahead
// (their cp.async) are in use at once; a power of two above 3 (the index a mask).
__host__ __device__ constexpr int scale_buffers(int ahead) {
  int n = 4;
  while (n < ahead + 2) n *= 2;
  return ahead <= 1 ? 3 : n;
}
__host__ __device__ constexpr int scale_buffer(int jq, int nsc) { return nsc == 3 ? jq % 3 : jq & (nsc - 1); }
// How many tiles past the current one a thread's next item may lie (IT items per tile).
__host__ __device__ constexpr int tiles_ahead(int IT) { return (kThreads + IT - 1) / IT; }
// rows activation rows (planes: pstride 16-byte vectors per row; s_b: nbs floats per row; ΣX: sxs
// ints per row), series outputs per column, C columns, K, group g, sub_k k per sub-unit, ys_floats
// floats of fold results, res_floats floats of combine inputs, len_max tiles.
__host__ __device__ constexpr SmemLayout smem_layout(int rows, int pstride, int nbs, int sxs, int series, int K, int C,
                                                     int g, int sub_k, int ys_floats, int res_floats, int len_max,
                                                     int nsc) {
  SmemLayout L{};
  L.dp_buf = series * (K / sub_k) * C;
  L.sc_buf = series * (K / g) * C;
  L.planes = 0;
  L.dp = L.planes + rows * pstride * 16;           // int   [2][series][K/sub_k][C]
  L.sc = L.dp + round16(2 * L.dp_buf * 4);         // half  [nsc][series][K/g][C]
  L.ys = L.sc + round16(nsc * L.sc_buf * 2);       // float [ys_floats]
  L.sblk = L.ys + round16(ys_floats * 4);          // float [rows][nbs]
  L.sx = L.sblk + round16(rows * nbs * 4);         // int   [rows][sxs]
  L.res = L.sx + round16(rows * sxs * 4);          // float [res_floats]
  L.tiles = L.res + round16(res_floats * 4);       // int4  [len_max]
  L.bytes = L.tiles + len_max * 16;
  return L;
}
// Items per tile: gate/up 16 lanes (gate | up x 8 column quads) x H/64 chunks; down 2k lanes
// (rank x 2 column quads) x I/64 chunks.
__host__ __device__ constexpr int up_items(int H) { return 16 * (H / 64); }
__host__ __device__ constexpr int down_items(int I, int k) { return 2 * k * (I / 64); }
__host__ __device__ constexpr SmemLayout up_layout(int H, int nt, int g, int sub_k, int len_max) {
  return smem_layout(nt, H / 8, blocks_of(H), H / 32, 2, H, kUpCols, g, sub_k, 0, 0, len_max,
                     scale_buffers(tiles_ahead(up_items(H))));
}
__host__ __device__ constexpr SmemLayout down_layout(int I, int k, int nt, int g, int sub_k, int nbs, int sxs,
                                                     int len_max) {
  return smem_layout(nt * k, I / 8 + 1, nbs, sxs, k, I, kDownCols, g, sub_k, k * kDownCols,
                     2 * len_max * kDownCols, len_max, scale_buffers(tiles_ahead(down_items(I, k))));
}

// ---- the dp4a items --------------------------------------------------------------------------

__device__ __forceinline__ uint4 ld_stream(const int32_t* p) {  // weights: never written, read once
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// One series' weights of one expert at an item's 4 columns n..n+3 (n % 4 == 0).
struct Operand {
  const int32_t* q;   // qweight [K/8][N] + n
  const __half* sc;   // scales [K/g][N] + n
  const int32_t* z;   // qzeros [K/g][N/8] + n/8 (asymmetric)
};


// kSub packed rows per sub-unit (4: U = 32; 8: U >= 64); kNs sub-units per item.
template <int kSub>
struct Item {
  static constexpr int kNs = kChunkRows / kSub;
  uint4 w[kChunkRows];  // packed rows k0/8 .. k0/8 + 7, columns n..n+3
  uint32_t z[kNs];      // the zero word of a sub-unit's group (asymmetric)
};

// Requests an item: its 8 rows into registers, its sub-units' zero words (asymmetric) into
// registers, and the scales of the groups its sub-units start into sc[grp·C + 0..3] (shared
// memory, the item's series and column quad), as one cp.async group (committed, maybe empty).
template <bool kSym, int kSub>
__device__ __forceinline__ void load_item(Item<kSub>& it, const Operand& op, int N, int g, int k0, __half* sc,
                                          int C) {
  const int32_t* p = op.q + size_t(k0 / 8) * N;
#pragma unroll
  for (int j = 0; j < kChunkRows; ++j) it.w[j] = ld_stream(p + size_t(j) * N);
#pragma unroll
  for (int j = 0; j < Item<kSub>::kNs; ++j) {
    const int kk = k0 + j * 8 * kSub, grp = kk / g;
    if (kk - grp * g == 0) cp_async8(sc + size_t(grp) * C, op.sc + size_t(grp) * N);
    if constexpr (!kSym) it.z[j] = uint32_t(__ldg(op.z + size_t(grp) * (N / 8)));
  }
  cp_async_commit();
}

// The item's exact sub-unit sums P = Σ (q - z)·X of its 4 columns -> dp[j·C + 0..3] (dp at the
// item's first sub-unit, column 4c). xp: the planes of packed row k0/8; sxq: ΣX of 32-k quarter
// k0/32; zshift = 4·(n % 8).
template <bool kSym, int kSub>
__device__ __forceinline__ void compute_item(const Item<kSub>& it, const uint4* xp, const int* sxq, int zshift,
                                             int* dp, int C) {
#pragma unroll
  for (int j = 0; j < Item<kSub>::kNs; ++j) {
    int A[4] = {0, 0, 0, 0};                 // Σ q·hi (s8 x u8 products: q <= 15 is a valid s8)
    unsigned B[4] = {0u, 0u, 0u, 0u};        // Σ q·lo (u8 x u8)
#pragma unroll
    for (int rr = 0; rr < kSub; ++rr) {
      const int row = j * kSub + rr;
      const uint4 xv = xp[row];  // {hi even k, hi odd k, lo even k, lo odd k}
      const uint32_t wc[4] = {it.w[row].x, it.w[row].y, it.w[row].z, it.w[row].w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const uint32_t we = wc[c] & 0x0F0F0F0Fu;         // q of k 0, 2, 4, 6
        const uint32_t wo = (wc[c] >> 4) & 0x0F0F0F0Fu;  // q of k 1, 3, 5, 7
        A[c] = __dp4a(int(we), int(xv.x), A[c]);
        A[c] = __dp4a(int(wo), int(xv.y), A[c]);
        B[c] = __dp4a(we, xv.z, B[c]);
        B[c] = __dp4a(wo, xv.w, B[c]);
      }
    }
    int sxs = sxq[j * kSub / 4];
    if constexpr (kSub == 8) sxs += sxq[j * kSub / 4 + 1];
    int P[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int z = kSym ? 8 : int((it.z[j] >> (zshift + 4 * c)) & 0xFu) + 1;
      P[c] = A[c] * 256 + int(B[c]) - z * sxs;  // exact: |P| < 2^26
    }
    *reinterpret_cast<int4*>(dp + j * C) = make_int4(P[0], P[1], P[2], P[3]);
  }
}

// Step 3 for two outputs side by side (two independent chains): D_u = the unit's sub-unit sums
// (exact), acc = fold_unit(acc, D_u, s_b, scale) over the units in ascending k from 0. dp / sc:
// the output's sums and scales (at its column; stride C per sub-unit / group); sb: its act row's
// block scales.
__device__ __forceinline__ float2 fold2(const int* dp0, const __half* sc0, const float* sb0, const int* dp1,
                                        const __half* sc1, const float* sb1, int K, int C, int U, int g, int sub_k) {
  const int nu = K / U, spu = U / sub_k;
  float a0 = 0.0f, a1 = 0.0f;
#pragma unroll 4
  for (int u = 0; u < nu; ++u) {
    int d0 = 0, d1 = 0;
    for (int j = 0; j < spu; ++j) {
      d0 += dp0[(u * spu + j) * C];
      d1 += dp1[(u * spu + j) * C];
    }
    const int b = u * U / mi::kXBlock, gi = u * U / g;
    a0 = mi::fold_unit(a0, d0, sb0[b], __half2float(sc0[gi * C]));
    a1 = mi::fold_unit(a1, d1, sb1[b], __half2float(sc1[gi * C]));
  }
  return make_float2(a0, a1);
}

// ---- the item ring over a CTA's tiles ----------------------------------------------------------

// This thread's items of tile j (q .. < qend, step kThreads; IT items per tile) with a two-item
// register ring: X holds item q on entry (its loads issued when `have`, else they are issued
// first); the next item's loads are issued before the current item is computed, but only below
// lim (the end of tile j + ahead: the scale buffers of later tiles may still be read by a fold).
// Returns true when Y holds the next item q on exit. load(Item&, q, tile) / compute(const Item&,
// q, tile).
template <int kSub, class Load, class Compute>
__device__ __forceinline__ bool ring_tile(Item<kSub>& X, Item<kSub>& Y, int& q, bool& have, int j, int IT, int qend,
                                          int lim, Load& load, Compute& compute) {
  if (q >= qend) return false;
  if (!have) load(X, q, j);
  for (;;) {
    int q2 = q + kThreads;
    have = q2 < lim;
    if (have) load(Y, q2, q2 < qend ? j : q2 / IT);
    compute(X, q, j);
    q = q2;
    if (q >= qend) return true;
    q2 = q + kThreads;
    have = q2 < lim;
    if (have) load(X, q2, q2 < qend ? j : q2 / IT);
    compute(Y, q, j);
    q = q2;
    if (q >= qend) return false;
  }
}

// All tiles of the CTA's range (len tiles of IT items): per tile this thread's items, its cp.async
// scales of the tile landed, a barrier, then warp j % kWarps folds tile j (fold(j)) while the
// others go on. q / have: this thread's next item and whether A already holds its loads (else A
// gets them here when the item lies within the first 1 + ahead tiles). ahead = ceil(kThreads / IT):
// how many tiles past the current one a thread's next item may lie (scale buffers: ahead + 2).
template <int kSub, class Load, class Compute, class Fold>
__device__ __forceinline__ void run_tiles(int len, int IT, int ahead, Item<kSub>& A, Item<kSub>& B, int q, bool have,
                                          Load& load, Compute& compute, Fold& fold) {
  const int total = len * IT, warp = threadIdx.x >> 5;
  if (!have && q < min(total, (1 + ahead) * IT)) {
    load(A, q, q / IT);
    have = true;
  }
  bool flip = false;  // B holds item q
  for (int j = 0; j < len; ++j) {
    const int qend = (j + 1) * IT, lim = min(total, qend + ahead * IT);
    const bool odd = flip ? ring_tile(B, A, q, have, j, IT, qend, lim, load, compute)
                          : ring_tile(A, B, q, have, j, IT, qend, lim, load, compute);
    flip = flip != odd;
    // The newest cp.async group is the next item's (tile j + 1) when `have`: only it may still fly.
    if (have)
      cp_async_wait<1>();
    else
      cp_async_wait<0>();
    __syncthreads();
    if (warp == j % kWarps) fold(j);
  }
}

// ---- gate/up ---------------------------------------------------------------------------------

struct UpArgs {
  const float* x;       // [M, H]
  bool x_vec;           // x is 16-byte aligned
  const float* logits;  // [M, E]
  int E, k, U;          // experts, top-k, unit length of gate/up
  int tiles, len_max;   // M·k·I/32 tiles; the longest range of a CTA
  int32_t* ids;         // [M·k] (the publishing CTAs)
  float* weights;       // [M·k]
  float* act;           // [M·k, I]
  uint4* aplanes;       // [M·k, I/8] (the last arrival of each 128-column block)
  float* asblk;         // [M·k, nbs]
  int* asx;             // [M·k, sxs]
  int nbs, sxs;
};


// Grid: CTA b runs tiles [b·tiles/G, (b+1)·tiles/G), tile t = (slot t / (I/32), columns 32·(t % (I/32))).
template <bool kSym, int kSub>
__global__ void __launch_bounds__(kThreads, 2) int_gate_up_kernel(UpArgs a, ExpertView gate, ExpertView up) {
  extern __shared__ uint4 smem_up[];
  __shared__ int32_t s_ids[kMaxRangeTokens][kMaxTopK];
  __shared__ float s_p[kMaxRangeTokens][kMaxTopK];
  constexpr int kSubK = 8 * kSub;
  const int H = gate.K, I = gate.N, g = gate.group, E = a.E, k = a.k;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int NB = I / kUpCols, tpt = k * NB;  // tiles per slot, per token
  const int t0 = int((long long)blockIdx.x * a.tiles / gridDim.x);
  const int t1 = int((long long)(blockIdx.x + 1) * a.tiles / gridDim.x);
  const int len = t1 - t0, m0 = t0 / tpt, nt = (t1 - 1) / tpt - m0 + 1;  // nt <= 2 (the plan)
  const int nsu = H / kSubK, ng = H / g, nbH = blocks_of(H);
  const SmemLayout lay = up_layout(H, nt > 1 ? kMaxRangeTokens : 1, g, kSubK, a.len_max);
  char* base = reinterpret_cast<char*>(smem_up);
  uint4* planes = reinterpret_cast<uint4*>(base + lay.planes);  // [nt][H/8]
  int* dp = reinterpret_cast<int*>(base + lay.dp);
  __half* scs = reinterpret_cast<__half*>(base + lay.sc);
  float* sblk = reinterpret_cast<float*>(base + lay.sblk);  // [nt][nbH]
  int* sx = reinterpret_cast<int*>(base + lay.sx);          // [nt][H/32]
  int4* tiles = reinterpret_cast<int4*>(base + lay.tiles);  // {slot, first column, token - m0, rank}

  pdl_wait();
  if (warp < nt) {
    // Token m0 + warp: rank r's expert needs rounds 0..r; the CTA holding the token's first tile
    // publishes all k for down.
    const int m = m0 + warp, first = m * tpt;
    const bool publish = t0 <= first && first < t1;
    const int rounds = publish || warp + 1 < nt ? k : ((t1 - 1) / NB) % k + 1;
    const float psum = route_rounds(a.logits + size_t(m) * E, E, rounds, s_ids[warp], s_p[warp]);
    if (publish) {
      __syncwarp();
      if (lane < k) {
        a.ids[size_t(m) * k + lane] = min(max(s_ids[warp][lane], 0), E - 1);  // in range for any logits
        a.weights[size_t(m) * k + lane] = s_p[warp][lane] / psum;
      }
    }
  } else {
    quantize_rows(a.x + size_t(m0) * H, nt, H, a.x_vec, planes, H / 8, 16, sblk, sx, nt);
  }
  for (int j = tid; j < len; j += kThreads) {
    const int t = t0 + j, slot = t / NB, m = slot / k;
    tiles[j] = make_int4(slot, (t - slot * NB) * kUpCols, m - m0, slot - m * k);
  }
  __syncthreads();
  pdl_launch_dependents();

  const int IT = up_items(H), ahead = tiles_ahead(IT), nsc = scale_buffers(ahead);
  const size_t qstride = size_t(H / 8) * I, sstride = size_t(ng) * I, zstride = size_t(ng) * (I / 8);
  // Item q of tile jq: i = q - jq·IT, lane i % 16 (series s = lane / 8: 0 gate, 1 up; quad c =
  // lane % 8), chunk i / 16.
  auto load = [&](Item<kSub>& it, int q, int jq) {
    const int i = q - jq * IT, ln = i & 15, ch = i >> 4, s = ln >> 3, c = ln & 7;
    const int4 ti = tiles[jq];
    const int e = min(max(s_ids[ti.z][ti.w], 0), E - 1);  // in range even for non-finite logits
    const int n = ti.y + 4 * c;
    const ExpertView& v = s ? up : gate;
    const Operand op{v.qweight + size_t(e) * qstride + n, v.scales + size_t(e) * sstride + n,
                     kSym ? nullptr : v.qzeros + size_t(e) * zstride + n / 8};
    load_item<kSym, kSub>(it, op, I, g, ch * 64, scs + scale_buffer(jq, nsc) * lay.sc_buf + s * ng * kUpCols + 4 * c,
                          kUpCols);
  };
  auto compute = [&](const Item<kSub>& it, int q, int jq) {
    const int i = q - jq * IT, ln = i & 15, ch = i >> 4, s = ln >> 3, c = ln & 7, k0 = ch * 64;
    const int tm = tiles[jq].z;
    compute_item<kSym, kSub>(it, planes + tm * (H / 8) + k0 / 8, sx + tm * (H / 32) + k0 / 32, 4 * ((4 * c) % 8),
                             dp + (jq & 1) * lay.dp_buf + (s * nsu + k0 / kSubK) * kUpCols + 4 * c, kUpCols);
  };
  auto fold = [&](int j) {  // lane c: gate and up of column c, act, the block arrival
    const int4 ti = tiles[j];
    const int* d = dp + (j & 1) * lay.dp_buf + lane;
    const __half* sc = scs + scale_buffer(j, nsc) * lay.sc_buf + lane;
    const float* sb = sblk + ti.z * nbH;
    const float2 gu = fold2(d, sc, sb, d + nsu * kUpCols, sc + ng * kUpCols, sb, H, kUpCols, a.U, g, kSubK);
    a.act[size_t(ti.x) * I + ti.y + lane] = silu_mul_rn(gu.x, gu.y);
    act_block_arrive(a, g_act_arrivals, ti.x, ti.y / kUpCols, I);
  };
  Item<kSub> A, B;
  run_tiles<kSub>(len, IT, ahead, A, B, tid, false, load, compute, fold);
}

// ---- down + combine --------------------------------------------------------------------------

struct DownArgs {
  const uint4* aplanes;  // [M·k, I/8] (gate/up)
  const float* asblk;    // [M·k, nbs]
  const int* asx;        // [M·k, sxs]
  int nbs, sxs;
  const int32_t* ids;    // [M·k] (gate/up)
  const float* weights;  // [M·k]
  int k, U;              // top-k, unit length of down
  int tiles, len_max;    // M·H/8 tiles; the longest range of a CTA
  unsigned magic;        // ceil(2^32 / (2k)): i / (2k) = umulhi(i, magic) for the item numbers of a tile
  float* residual;       // [M, H]
  const float* shared;   // [M, H] or null
  const float* gate_logit;  // [M]
};

// Grid: CTA b runs tiles [b·tiles/G, (b+1)·tiles/G), tile t = (token t / (H/8), columns 8·(t % (H/8))).
template <bool kSym, int kSub>
__global__ void __launch_bounds__(kThreads, 2) int_down_kernel(DownArgs a, ExpertView down) {
  extern __shared__ uint4 smem_down[];
  __shared__ int32_t s_ids[kMaxRangeTokens][kMaxTopK];
  __shared__ float s_w[kMaxRangeTokens][kMaxTopK];
  __shared__ float s_sig[kMaxRangeTokens];
  constexpr int kSubK = 8 * kSub;
  constexpr int kC = kDownCols;
  const int H = down.N, I = down.K, g = down.group, k = a.k;
  const int tid = threadIdx.x, lane = tid & 31;
  const int NB = H / kC;  // tiles per token
  const int t0 = int((long long)blockIdx.x * a.tiles / gridDim.x);
  const int t1 = int((long long)(blockIdx.x + 1) * a.tiles / gridDim.x);
  const int len = t1 - t0, m0 = t0 / NB, nt = (t1 - 1) / NB - m0 + 1;  // nt <= 2 (the plan)
  const int nsu = I / kSubK, ng = I / g, nv = I / 8, pstride = nv + 1;
  const SmemLayout lay = down_layout(I, k, nt > 1 ? kMaxRangeTokens : 1, g, kSubK, a.nbs, a.sxs, a.len_max);
  char* base = reinterpret_cast<char*>(smem_down);
  uint4* planes = reinterpret_cast<uint4*>(base + lay.planes);  // [nt·k][I/8 + 1]
  int* dp = reinterpret_cast<int*>(base + lay.dp);
  __half* scs = reinterpret_cast<__half*>(base + lay.sc);
  float* ys = reinterpret_cast<float*>(base + lay.ys);      // [k][8]
  float* sblk = reinterpret_cast<float*>(base + lay.sblk);  // [nt·k][nbs]
  int* sx = reinterpret_cast<int*>(base + lay.sx);          // [nt·k][sxs]
  float* s_res = reinterpret_cast<float*>(base + lay.res);  // [len][8]
  float* s_sh = s_res + a.len_max * kC;                     // [len][8]
  int4* tiles = reinterpret_cast<int4*>(base + lay.tiles);  // {token, first column, token - m0, 0}

  const int L = 2 * k, IT = down_items(I, k), ahead = tiles_ahead(IT), nsc = scale_buffers(ahead);
  // Item q of tile jq: i = q - jq·IT, lane i % L (rank lane / 2, quad lane % 2), chunk i / L.
  auto load_at = [&](Item<kSub>& it, int i, int n0, int e, int jq) {
    const int ch = int(__umulhi(unsigned(i), a.magic)), ln = i - ch * L, rl = ln >> 1, c = ln & 1;
    const int n = n0 + 4 * c;
    const Operand op{down.qweight + size_t(e) * nv * H + n, down.scales + size_t(e) * ng * H + n,
                     kSym ? nullptr : down.qzeros + size_t(e) * ng * (H / 8) + n / 8};
    load_item<kSym, kSub>(it, op, H, g, ch * 64, scs + scale_buffer(jq, nsc) * lay.sc_buf + rl * ng * kC + 4 * c, kC);
  };
  auto rank_of = [&](int i) { return (i - int(__umulhi(unsigned(i), a.magic)) * L) >> 1; };

  pdl_wait();
  // The range's tokens' act planes, block scales and ΣX (rows m0·k .. (m0 + nt)·k - 1: contiguous).
  {
    const int rows = nt * k;
    const uint4* gp = a.aplanes + size_t(m0) * k * nv;
    for (int v = tid; v < rows * nv; v += kThreads) {
      const int r = v / nv;
      cp_async16(planes + r * pstride + (v - r * nv), gp + v);
    }
    for (int v = tid; v < rows * a.nbs / 4; v += kThreads) cp_async16(sblk + 4 * v, a.asblk + size_t(m0) * k * a.nbs + 4 * v);
    for (int v = tid; v < rows * a.sxs / 4; v += kThreads) cp_async16(sx + 4 * v, a.asx + size_t(m0) * k * a.sxs + 4 * v);
    cp_async_commit();
  }
  // The first item's weights as soon as its rank's id is here (s_ids is not visible before the
  // barrier: the id straight from the workspace).
  Item<kSub> A, B;
  bool have = false;
  if (tid < min(len * IT, IT)) {
    const int e = __ldcg(a.ids + size_t(m0) * k + rank_of(tid));  // in range (clamped by gate/up)
    load_at(A, tid, (t0 - m0 * NB) * kC, e, 0);
    have = true;
  }
  if (tid < nt * k) {
    s_ids[tid / k][tid % k] = __ldcg(a.ids + size_t(m0) * k + tid);
    s_w[tid / k][tid % k] = __ldcg(a.weights + size_t(m0) * k + tid);
  }
  if (a.shared && tid >= kThreads - nt) {
    const int tm = tid - (kThreads - nt);
    s_sig[tm] = 1.0f / (1.0f + __expf(-__ldcg(a.gate_logit + m0 + tm)));  // combine_kernel's shared_scale
  }
  // The combine's inputs wait in shared memory (no registers held across the tiles).
  for (int t = tid; t < len * kC; t += kThreads) {
    const int tile = t0 + t / kC, m = tile / NB;
    const size_t o = size_t(m) * H + (tile - m * NB) * kC + t % kC;
    s_res[t] = __ldcg(a.residual + o);
    if (a.shared) s_sh[t] = __ldcg(a.shared + o);
  }
  for (int j = tid; j < len; j += kThreads) {
    const int tile = t0 + j, m = tile / NB;
    tiles[j] = make_int4(m, (tile - m * NB) * kC, m - m0, 0);
  }
  if (have)
    cp_async_wait<1>();  // the act rows; the first item's scales may still fly
  else
    cp_async_wait<0>();
  __syncthreads();
  pdl_launch_dependents();

  auto load = [&](Item<kSub>& it, int q, int jq) {
    const int i = q - jq * IT;
    const int4 ti = tiles[jq];
    load_at(it, i, ti.y, s_ids[ti.z][rank_of(i)], jq);
  };
  auto compute = [&](const Item<kSub>& it, int q, int jq) {
    const int i = q - jq * IT, ch = int(__umulhi(unsigned(i), a.magic)), ln = i - ch * L, rl = ln >> 1;
    const int c = ln & 1, k0 = ch * 64, row = tiles[jq].z * k + rl;
    compute_item<kSym, kSub>(it, planes + row * pstride + k0 / 8, sx + row * a.sxs + k0 / 32, 4 * ((4 * c) % 8),
                             dp + (jq & 1) * lay.dp_buf + (rl * nsu + k0 / kSubK) * kC + 4 * c, kC);
  };
  auto fold = [&](int j) {  // y of every (rank, column), then the combine of the tile's 8 columns
    const int4 ti = tiles[j];
    const int* d = dp + (j & 1) * lay.dp_buf;
    const __half* sc = scs + scale_buffer(j, nsc) * lay.sc_buf;
    const int outs = k * kC;
    for (int o = lane; o < outs; o += 64) {
      const int o2 = min(o + 32, outs - 1);  // a duplicate of a valid chain when o + 32 >= outs
      const int r1 = o / kC, c1 = o % kC, r2 = o2 / kC, c2 = o2 % kC;
      const float2 y = fold2(d + r1 * nsu * kC + c1, sc + r1 * ng * kC + c1, sblk + (ti.z * k + r1) * a.nbs,
                             d + r2 * nsu * kC + c2, sc + r2 * ng * kC + c2, sblk + (ti.z * k + r2) * a.nbs, I, kC,
                             a.U, g, kSubK);
      ys[o] = y.x;
      if (o + 32 < outs) ys[o + 32] = y.y;
    }
    __syncwarp();
    if (lane < kC) {
      float acc = 0.0f;
      for (int r = 0; r < k; ++r) acc = fmaf(s_w[ti.z][r], ys[r * kC + lane], acc);
      float o = s_res[j * kC + lane] + acc;
      if (a.shared) o = fmaf(s_sig[ti.z], s_sh[j * kC + lane], o);
      a.residual[size_t(ti.x) * H + ti.y + lane] = o;
    }
    __syncwarp();
  };
  run_tiles<kSub>(len, IT, ahead, A, B, tid, have, load, compute, fold);
}

// ---- host ------------------------------------------------------------------------------------

using UpKernel = void (*)(UpArgs, ExpertView, ExpertView);
using DownKernel = void (*)(DownArgs, ExpertView);

UpKernel up_kernel(bool sym, int sub) {
  if (sym) return sub == 4 ? int_gate_up_kernel<true, 4> : int_gate_up_kernel<true, 8>;
  return sub == 4 ? int_gate_up_kernel<false, 4> : int_gate_up_kernel<false, 8>;
}
DownKernel down_kernel(bool sym, int sub) {
  if (sym) return sub == 4 ? int_down_kernel<true, 4> : int_down_kernel<true, 8>;
  return sub == 4 ? int_down_kernel<false, 4> : int_down_kernel<false, 8>;
}

// Device limits, queried once per device; the first query also opts every kernel in to the
// device's largest dynamic shared memory per block and the largest shared-memory carveout (the
// launch's own size decides the occupancy; not a stream operation, so legal inside graph capture).
struct Caps {
  SmLimits sm;
  int static_up = 0, static_down = 0;  // static shared memory of the kernels
};

const Caps& device_caps() {
  return once_per_device([](int dev) {
    Caps c;
    c.sm = device_sm_limits(dev);
    for (bool sym : {true, false})
      for (int sub : {4, 8}) {
        c.static_up = std::max(c.static_up, opt_in_max_shared((const void*)up_kernel(sym, sub), c.sm.smem_optin).static_smem);
        c.static_down =
            std::max(c.static_down, opt_in_max_shared((const void*)down_kernel(sym, sub), c.sm.smem_optin).static_smem);
      }
    return c;
  });
}

// One kernel's grid: G CTAs over `tiles` tiles (contiguous ranges of len_max tiles at most), the
// tokens a range may cover (nt: 1 or 2) and its dynamic shared memory.
struct Launch {
  int grid = 0, len_max = 0, nt = 0;
  size_t smem = 0;
};

// The grid of at most per_sm CTAs per SM (but >= M CTAs, so that a range covers <= 2 tokens:
// len_max <= tiles / M, a token's tile count) whose CTA fits per_sm per SM (2, else 1) within the
// per-block limit; grid 0 when neither fits. None of it changes a bit.
template <class Bytes>
Launch plan_launch(int tiles, int M, const Caps& c, int static_bytes, Bytes bytes) {
  for (int per_sm : {2, 1}) {
    Launch l;
    l.grid = std::min(tiles, std::max(M, per_sm * c.sm.sms));
    l.len_max = (tiles + l.grid - 1) / l.grid;
    l.nt = M == 1 || l.len_max == 1 ? 1 : kMaxRangeTokens;
    l.smem = size_t(bytes(l.nt, l.len_max));
    const long budget = std::min<long>(c.sm.smem_optin, long(c.sm.smem_per_sm) / per_sm - c.sm.smem_reserved);
    if (long(l.smem) + static_bytes <= budget) return l;
  }
  return Launch{};
}

}  // namespace

size_t int_decode_workspace_bytes(const MoeShape& s, int M) { return int_decode_layout(s, M).bytes; }

void int_decode(const float* x, const float* router_logits, const MoeShape& s, const DeviceExperts& ex, int M,
                void* workspace, size_t workspace_bytes, float* residual, const float* shared_out,
                const float* shared_gate_logit, cudaStream_t stream, cudaEvent_t shared_ready) {
  if (M < 1 || M > kIntDecodeMaxTokens) throw Error("moe_int: int_decode called with " + std::to_string(M) + " tokens");
  const IntDecodeLayout lay = int_decode_layout(s, M);
  if (workspace_bytes < lay.bytes) throw Error("moe_int: int_decode workspace too small");
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) throw Error("moe_int: the workspace must be 16-byte aligned");
  if (int_stream_decode(x, router_logits, s, ex, M, workspace, workspace_bytes, residual, shared_out,
                        shared_gate_logit, stream, shared_ready))
    return;
  const int H = s.hidden, I = s.intermediate, k = s.top_k;
  const int u_up = mi::unit_length(int(ex.gate.group_size)), u_down = mi::unit_length(int(ex.down.group_size));
  const int sub_up = u_up == 32 ? 4 : 8, sub_down = u_down == 32 ? 4 : 8;  // packed rows per sub-unit
  const int g_up = int(ex.gate.group_size), g_down = int(ex.down.group_size);
  const Caps& c = device_caps();
  const int up_tiles = M * k * (I / kUpCols), down_tiles = M * (H / kDownCols);
  const Launch lu = plan_launch(up_tiles, M, c, c.static_up, [&](int nt, int len) {
    return up_layout(H, nt, g_up, 8 * sub_up, len).bytes;
  });
  const Launch ld = plan_launch(down_tiles, M, c, c.static_down, [&](int nt, int len) {
    return down_layout(I, k, nt, g_down, 8 * sub_down, lay.nbs, lay.sxs, len).bytes;
  });
  if (!lu.grid || !ld.grid || long(M) * k * blocks_of(I) > kArrivalSlots) {
    // A shape these kernels do not fit: the tensor-core kernels give the same bits.
    if (workspace_bytes < int_mma_workspace_bytes(s, M))
      throw Error("moe_int: the dp4a expert kernels do not fit the device (H " + std::to_string(H) + ", I " +
                  std::to_string(I) + ", k " + std::to_string(k) + ") and the workspace is too small for int_mma");
    int_mma(x, router_logits, s, ex, M, workspace, workspace_bytes, residual, shared_out, shared_gate_logit, stream,
            shared_ready);
    return;
  }
  char* ws = static_cast<char*>(workspace);
  UpArgs ua{};
  fill_up_io(ua, x, router_logits, s, lay, ws);
  ua.U = u_up;
  ua.tiles = up_tiles;
  ua.len_max = lu.len_max;
  launch_pdl(true, up_kernel(gate_up_symmetric(ex), sub_up), dim3(unsigned(lu.grid)), dim3(kThreads), lu.smem, stream, ua,
             view_of(ex.gate), view_of(ex.up));
  if (shared_ready) MOESERVE_CUDA_CHECK(cudaStreamWaitEvent(stream, shared_ready, 0));  // down adds it
  DownArgs da{};
  fill_down_io(da, ua, residual, shared_out, shared_gate_logit);
  da.U = u_down;
  da.tiles = down_tiles;
  da.len_max = ld.len_max;
  da.magic = unsigned(((uint64_t(1) << 32) + uint64_t(2 * k) - 1) / uint64_t(2 * k));
  launch_pdl(true, down_kernel(down_symmetric(ex), sub_down), dim3(unsigned(ld.grid)), dim3(kThreads), ld.smem, stream, da,
             view_of(ex.down));
}

}  // namespace moeserve::cuda::moe_int_detail
