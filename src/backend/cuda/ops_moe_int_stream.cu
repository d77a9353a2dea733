// The integer form of the GPTQ INT4 routed experts (moe_int_arith.h) for steps of 1 ..
// kIntDecodeMaxTokens tokens, streaming: two dp4a kernels whose every thread copies its own weight
// rows into its own shared-memory ring with cp.async, many rows ahead of its arithmetic (the f32
// streaming kernels' pipeline, ops_moe_decode.cu, with the integer form's 7 instructions per
// weight word instead of ~25). int_decode (ops_moe_int_decode.cu) sends a step here by default
// (set_moe_int_decode_variant 1) and takes its persistent kernels where these do not fit.
//
// Layout: the checkpoint's own: qweight [E][K/8][N] int32 (nibble j of word (kp, n) = q[8kp + j, n]),
// scales f16 [E][K/g][N], qzeros [E][K/g][N/8] (stored zero − 1); x f32 [M, H]; router logits f32
// [M, E]; residual f32 [M, H]. Workspace: ops_moe_int_decode.cuh's (ids, weights, act, the act rows'
// planes, block scales and ΣX), the same as the persistent kernels'.
//
// Arithmetic (moe_int_arith.h, exactly; the same bits as every kernel of the integer form, so a
// token's output does not depend on the batch or on the kernel family): an item is one unit (U k,
// U / 8 packed rows) of two 4-column vectors A and B that multiply the same activations: per
// column A_c = Σ q·hi and B_c = Σ q·lo by dp4a over the unit's words (even nibbles against the hi /
// lo bytes of the even k, odd nibbles against the odd k), then the exact D_u = 256·A + B − z·ΣX_u.
// The item's thread also forms the fold's factors float(D_u) and c_u = s_b·scale (moe_int_arith.h
// step 3 in parts); after a barrier one thread per output folds its units in ascending k, one FMA
// per unit (fold_unit's bits).
// gate/up: act = silu_mul_rn(g, u), then act_block_arrive (ops_moe_int_decode_common.cuh): the last
// of a 128-column block's 4 CTAs quantises it into the workspace planes. down: y per (rank,
// column), then combine_routed's order: acc = fmaf(w_r, y_r, acc) over r from 0, residual + acc,
// with the shared expert o = fmaf(1 / (1 + __expf(−logit)), shared, o).
//
// gate/up (int_stream_gate_up_kernel): grid (I / 32, M·k): a CTA per (slot, 32 columns of I), so
//   every 128-byte line of the slot's expert is requested by one CTA. Items it = 8·u + c: vector A
//   = gate, B = up, columns n0 + 4c .. + 3, unit u; 8·H/U items (192 threads at H 3072, U 128).
//   Prologue: warp 0 routes the token (route_rounds: rounds 0 .. r; the CTA of rank 0 and the
//   first columns all k and publishes ids / weights for down) while the other warps quantise the x
//   row into shared-memory planes (each 128-k block's 16 rows padded by one vector: the 4 units a
//   warp reads sit on different banks).
// down (int_stream_down_kernel): grid (H / 16, M): a CTA per (token, 16 columns of H), all k
//   ranks (192 CTAs at M = 1 on the H200's 132 SMs, where 32 columns left 36 SMs idle). Items
//   it = 2·(k·u + r) + c: rank r, vector A = columns n0 + 4c, B = n0 + 8 + 4c, unit u; 2·k·I/U
//   items (128 threads at k 8, I 1024). Prologue: the token's ids / weights (published by gate/up),
//   then the ring's first requests, then in one L2 round trip the k act rows' planes (rank rows RS
//   vectors apart with RS ≡ 1 mod 8, blocks padded by one vector: the 16 (rank, unit) vectors a
//   warp reads spread over all banks), s_b, ΣX, residual and shared values.
// The ring (stream_units): a thread requests its own rows with 16-byte cp.async.cg into its own
//   ring slot (R steps of 2 rows of A and B; one commit group per step, the item's scales and
//   zeros with its first step), R steps ahead of the step it computes, and waits with
//   cp.async.wait_group R − 1: no register holds an in-flight word and no barrier orders the ring.
// Occupancy (plan_for / plan_stream, per device): as many CTAs per SM as the grid spreads over an SM
//   (threads and registers permitting), each with the largest ring (<= 16 steps, <= the thread's
//   rows) that fits. H200, 122B-A10B at M = 1: gate/up 256 CTAs x 192 threads, 2 per SM, 14 of a
//   thread's 16 rows in flight (R = 7: 84 KB per CTA); down 192 CTAs x 128 threads, 2 per SM, all
//   16 rows (64 KB per CTA). DGX Spark (sm_121, 99 KB per block): the same code with
//   the rings that fit; cp.async and dp4a are sm_61-sm_80 instructions (no TMA, no wgmma).
// PDL: both kernels are programmatic dependent launches and wait (pdl_wait) before touching any
//   global memory (the experts to read depend on the routing, which needs the logits; down's on
//   the ids gate/up writes); gate/up lets down launch once its CTAs have routed. g_stream_arrivals
//   (one per (slot, 128-column block)) is zero between launches: the last arrival sets it back.
//   gate/up launches on one device must not overlap (stream order on the model's stream).
// Instructions per weight word: 1 LOP3, 1 SHF + 1 LOP3, 4 dp4a, plus per row of A and B two
//   16-byte shared loads of the ring, one of x, two cp.async and the ring's bookkeeping.
// Roofline (bytes per layer): M·k·(3·I·H/2 + 3·(H/g)·I·2) (+ zeros when asymmetric; a token's
//   repeated expert is read again): 122B-A10B at M = 1 37.7 MB of weights + 1.2 MB of scales,
//   9.2 us at the H200's 4.27 TB/s copy bandwidth.
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>

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
#include "backend/cuda/stage_stamps.cuh"
#include "core/error.h"

namespace moeserve::cuda::moe_int_detail {
namespace {

using moe_detail::ExpertView;
using moe_detail::kMaxTopK;
using moe_detail::silu_mul_rn;
using moe_detail::view_of;

constexpr int kUpCols = kActTileCols;  // gate/up CTA: 32 columns of I (4 per act block)
constexpr int kDownCols = 16;          // down CTA: columns of H
constexpr int kMaxThreads = 256;
constexpr int kMaxRing = 16;      // ring steps in flight per thread (cp.async groups; wait_group <= 15)
constexpr int kUpQuantBatch = 8;    // x blocks a gate/up warp loads at once (24 blocks over 5 warps at H 3072)
constexpr int kStepRows = 2;      // packed rows per ring step (a unit has 4, 8 or 16)
constexpr int kSlotBytes = 32;    // per thread and item: scales A, B (8 B each), zero words A, B (4 B each)
constexpr int kArrivalSlots = 1 << 15;
__device__ unsigned g_stream_arrivals[kArrivalSlots];

using async_copy::cp_async4;
using async_copy::cp_async8;
using async_copy::cp_async_wait_pending;

__host__ __device__ constexpr size_t round16(size_t b) { return (b + 15) / 16 * 16; }
// Activation planes in shared memory: each 128-k block's 16 vectors (one per packed row) padded to
// kPadBlock, so the rows of different blocks that one warp reads sit on different banks.
constexpr int kPadBlock = 17;
__host__ __device__ constexpr int plane_index(int kp) { return (kp >> 4) * kPadBlock + (kp & 15); }
// Ring bytes: [R][kStepRows][A, B][threads] x 16 B.
__host__ __device__ constexpr size_t ring_bytes(int R, int nthr) { return size_t(R) * kStepRows * 2 * nthr * 16; }
// Item slots a thread needs: the producer runs R steps ahead, so the item being consumed is
// rewritten no earlier than ceil(R / steps per item) + 1 items later; never more than its items.
__host__ __device__ constexpr int item_slots(int R, int rows, int per_thread) {
  return (R + rows / kStepRows - 1) / (rows / kStepRows) + 1 < per_thread ? (R + rows / kStepRows - 1) / (rows / kStepRows) + 1
                                                                           : per_thread;
}

// One item: one unit (rows packed rows from wa / wb) of two 4-column vectors A and B.
struct UnitItem {
  const int32_t* wa;  // packed row u·rows, the vector's first column (16-byte aligned)
  const int32_t* wb;
  const __half* sa;   // the unit's group scales at the vector's first column (8-byte aligned)
  const __half* sb;
  const int32_t* za;  // the group's zero words (asymmetric)
  const int32_t* zb;
  int zshift;         // 4·(n % 8): the vector's first nibble in its zero word (A and B alike)
  const uint4* xp;    // the activation planes of packed row u·rows (shared memory)
  int sxu;            // ΣX over the unit
  float xscale;       // the activation block scale s_b of the unit
  int oa, ob;         // dsm / scm index of the vector's first column
};

// One phase of a thread's stream: the items it = tid, tid + nthr, ... < items of src (Src::get), each
// `rows` packed rows of two vectors of a matrix with N columns; the fold's factors of each item go to
// dsm (float(D_u)) and scm (c_u = s_b · scale) at the item's oa / ob.
template <bool kSymZeros, class Src>
struct Phase {
  static constexpr bool kSym = kSymZeros;
  const Src& src;
  int items, rows, N;
  float* dsm;
  float* scm;
};
// No second phase (the two-kernel path): compiled away.
struct NoPhase {};
template <class P>
inline constexpr bool kHasPhase = !std::is_same_v<P, NoPhase>;

// A thread's producer: requests the steps of its items in order, phase A's then phase B's, R steps
// ahead of the consumer (one commit group per step; empty past the last step), each into the ring
// slot the consumer just read; an item's scales and zeros with its first step into its item slot.
template <class PA, class PB>
struct RingProducer {
  const PA& a;
  const PB& b;
  char* my_ring;     // this thread's 16 bytes of ring slot 0, row 0, vector A
  char* my_items;    // this thread's item slot 0
  size_t vstride, rowstride, rstride, istride;
  int R, IR;
  int phase = 0, it = 0, u = 0, slot = 0, islot = 0;  // the next step: phase, item, packed row, slots
  UnitItem p{};

  __device__ __forceinline__ RingProducer(const PA& pa, const PB& pb, char* ring, char* islots, int R_, int IR_)
      : a(pa), b(pb), R(R_), IR(IR_) {
    const int tid = threadIdx.x, nthr = blockDim.x;
    vstride = size_t(nthr) * 16;      // A plane -> B plane of a row
    rowstride = 2 * vstride;          // row -> next row of a step
    rstride = kStepRows * rowstride;  // ring slot -> next
    istride = size_t(nthr) * kSlotBytes;
    my_ring = ring + size_t(tid) * 16;
    my_items = islots + size_t(tid) * kSlotBytes;
    it = tid;
    if (it < a.items) {
      p = a.src.get(it);
    } else {
      next_phase();
    }
  }
  __device__ __forceinline__ void next_phase() {
    phase = 1;
    it = threadIdx.x;
    if constexpr (kHasPhase<PB>)
      if (it < b.items) p = b.src.get(it);
  }
  template <class P>
  __device__ __forceinline__ void step(const P& ph) {
    if (it >= ph.items) return;
    char* rs = my_ring + size_t(slot) * rstride;
    if (u == 0) {
      char* is = my_items + size_t(islot) * istride;
      cp_async8(is, p.sa);
      cp_async8(is + 8, p.sb);
      if constexpr (!P::kSym) {
        cp_async4(is + 16, p.za);
        cp_async4(is + 20, p.zb);
      }
    }
#pragma unroll
    for (int j = 0; j < kStepRows; ++j) {
      async_copy::cp_async16(rs + j * rowstride, p.wa + size_t(j) * ph.N);
      async_copy::cp_async16(rs + j * rowstride + vstride, p.wb + size_t(j) * ph.N);
    }
    p.wa += size_t(kStepRows) * ph.N;
    p.wb += size_t(kStepRows) * ph.N;
    if (++slot == R) slot = 0;
    u += kStepRows;
    if (u == ph.rows) {
      u = 0;
      if (++islot == IR) islot = 0;
      it += int(blockDim.x);
      if (it < ph.items) {
        p = ph.src.get(it);
      } else if (phase == 0) {
        next_phase();
      }
    }
  }
  __device__ __forceinline__ void issue() {
    if (phase == 0) {
      step(a);
    } else if constexpr (kHasPhase<PB>) {
      step(b);
    }
    async_copy::cp_async_commit();  // empty past the last step: every step commits one group
  }
};

// The consumer of one phase: for each of the thread's items, its steps from the ring (waiting for
// the oldest pending group), the dp4a sums, then the item's fold factors (see the header).
// c_slot / c_islot: the consumer's ring and item slots, carried from phase to phase.
template <class P, class Prod>
__device__ __forceinline__ void consume_phase(const P& ph, Prod& prod, int& c_slot, int& c_islot) {
  const int R = prod.R, IR = prod.IR, rows = ph.rows;
  for (int it = threadIdx.x; it < ph.items; it += int(blockDim.x)) {
    const UnitItem q = ph.src.get(it);
    const char* is = prod.my_items + size_t(c_islot) * prod.istride;
    if (++c_islot == IR) c_islot = 0;
    int ah[4] = {0, 0, 0, 0}, bh[4] = {0, 0, 0, 0};               // Σ q·hi (s8 hi x u8-valued q)
    unsigned al[4] = {0u, 0u, 0u, 0u}, bl[4] = {0u, 0u, 0u, 0u};  // Σ q·lo (u8 x u8)
    for (int u = 0; u < rows; u += kStepRows) {
      cp_async_wait_pending(R - 1);  // committed: R + steps consumed; this step's group is the oldest pending
      const char* rs = prod.my_ring + size_t(c_slot) * prod.rstride;
      if (++c_slot == R) c_slot = 0;
#pragma unroll
      for (int j = 0; j < kStepRows; ++j) {
        const uint4 wa = *reinterpret_cast<const uint4*>(rs + j * prod.rowstride);
        const uint4 wb = *reinterpret_cast<const uint4*>(rs + j * prod.rowstride + prod.vstride);
        const uint4 xv = q.xp[u + j];  // {hi even k, hi odd k, lo even k, lo odd k}
        const uint32_t wca[4] = {wa.x, wa.y, wa.z, wa.w}, wcb[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const uint32_t ea = wca[c] & 0x0F0F0F0Fu, oa = (wca[c] >> 4) & 0x0F0F0F0Fu;  // q of k 0,2,4,6 / 1,3,5,7
          const uint32_t eb = wcb[c] & 0x0F0F0F0Fu, ob = (wcb[c] >> 4) & 0x0F0F0F0Fu;
          ah[c] = __dp4a(int(ea), int(xv.x), ah[c]);
          ah[c] = __dp4a(int(oa), int(xv.y), ah[c]);
          al[c] = __dp4a(ea, xv.z, al[c]);
          al[c] = __dp4a(oa, xv.w, al[c]);
          bh[c] = __dp4a(int(eb), int(xv.x), bh[c]);
          bh[c] = __dp4a(int(ob), int(xv.y), bh[c]);
          bl[c] = __dp4a(eb, xv.z, bl[c]);
          bl[c] = __dp4a(ob, xv.w, bl[c]);
        }
      }
      prod.issue();  // the step R ahead, into the slot just read (this thread's own)
    }
    // The item's scales and zeros came with its first step (complete: its last step's wait).
    const uint2 sra = *reinterpret_cast<const uint2*>(is), srb = *reinterpret_cast<const uint2*>(is + 8);
    uint32_t zwa = 0, zwb = 0;
    if constexpr (!P::kSym) {
      zwa = *reinterpret_cast<const uint32_t*>(is + 16);
      zwb = *reinterpret_cast<const uint32_t*>(is + 20);
    }
    int da[4], db[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int za = P::kSym ? 8 : int((zwa >> (q.zshift + 4 * c)) & 0xFu) + 1;
      const int zb = P::kSym ? 8 : int((zwb >> (q.zshift + 4 * c)) & 0xFu) + 1;
      da[c] = ah[c] * 256 + int(al[c]) - za * q.sxu;  // exact: |D_u| < 2^26
      db[c] = bh[c] * 256 + int(bl[c]) - zb * q.sxu;
    }
    const __half2* sha = reinterpret_cast<const __half2*>(&sra);
    const __half2* shb = reinterpret_cast<const __half2*>(&srb);
    const float sa[4] = {__low2float(sha[0]), __high2float(sha[0]), __low2float(sha[1]), __high2float(sha[1])};
    const float sb[4] = {__low2float(shb[0]), __high2float(shb[0]), __low2float(shb[1]), __high2float(shb[1])};
    float va[4], vb[4], ca[4], cb[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      va[c] = mi::unit_value(da[c]);
      vb[c] = mi::unit_value(db[c]);
      ca[c] = mi::unit_coef(q.xscale, sa[c]);
      cb[c] = mi::unit_coef(q.xscale, sb[c]);
    }
    *reinterpret_cast<float4*>(ph.dsm + q.oa) = make_float4(va[0], va[1], va[2], va[3]);
    *reinterpret_cast<float4*>(ph.dsm + q.ob) = make_float4(vb[0], vb[1], vb[2], vb[3]);
    *reinterpret_cast<float4*>(ph.scm + q.oa) = make_float4(ca[0], ca[1], ca[2], ca[3]);
    *reinterpret_cast<float4*>(ph.scm + q.ob) = make_float4(cb[0], cb[1], cb[2], cb[3]);
  }
}

// Streams this thread's items of one phase (see the header and Phase). after_issue(): called by
// every thread once the first R ring steps are requested and before any is read: the activations
// are staged there (and published by a barrier in it), so their latency overlaps the weights'.
// Src::get's xp and sxu are read only after it.
template <class P, class AfterIssue>
__device__ __forceinline__ void stream_units(const P& ph, int R, int IR, char* ring, char* islots,
                                             AfterIssue&& after_issue) {
  const NoPhase none{};
  RingProducer<P, NoPhase> prod(ph, none, ring, islots, R, IR);
  for (int i = 0; i < R; ++i) prod.issue();
  after_issue();
  int c_slot = 0, c_islot = 0;
  consume_phase(ph, prod, c_slot, c_islot);
  async_copy::cp_async_wait<0>();  // nothing of this thread's lands later
}

// Two phases through one ring (the fused one-token kernel): phase B's first steps are requested
// while phase A's last ones are consumed, so they are in flight across between() (called by every
// thread after phase A: it stages phase B's activations, read by B's Src::get only after it).
template <class PA, class PB, class Between>
__device__ __forceinline__ void stream_two_phases(const PA& pa, const PB& pb, int R, int IR, char* ring,
                                                  char* islots, Between&& between) {
  RingProducer<PA, PB> prod(pa, pb, ring, islots, R, IR);
  for (int i = 0; i < R; ++i) prod.issue();
  int c_slot = 0, c_islot = 0;
  consume_phase(pa, prod, c_slot, c_islot);
  between();
  consume_phase(pb, prod, c_slot, c_islot);
  async_copy::cp_async_wait<0>();
}

// Step 3 of one output: acc = fold_step(acc, float(D_u), c_u) over its nu units from 0 (fold_unit's
// bits). v / c: the output's factors (stride `stride` per unit, stream_units' dsm / scm).
__device__ __forceinline__ float fold_units(const float* v, const float* c, int stride, int nu) {
  constexpr int kChunk = 8;  // factors loaded before their chained FMAs (the loads' latency once per chunk)
  float acc = 0.0f;
  for (int u0 = 0; u0 < nu; u0 += kChunk) {
    float fv[kChunk], fc[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      fv[j] = u0 + j < nu ? v[(u0 + j) * stride] : 0.0f;
      fc[j] = u0 + j < nu ? c[(u0 + j) * stride] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kChunk; ++j)
      if (u0 + j < nu) acc = mi::fold_step(acc, fv[j], fc[j]);
  }
  return acc;
}

// ---- gate/up ---------------------------------------------------------------------------------

struct UpArgs {
  const float* x;       // [M, H]
  bool x_vec;           // x is 16-byte aligned
  const float* logits;  // [M, E]
  int E, k, U, R, IR;   // experts, top-k, unit length, ring steps, item slots
  int32_t* ids;         // [M·k] (the publishing CTA)
  float* weights;       // [M·k]
  float* act;           // [M·k, I]
  uint4* aplanes;       // [M·k, I/8] (the last arrival of each 128-column block)
  float* asblk;         // [M·k, nbs]
  int* asx;             // [M·k, sxs]
  int nbs, sxs;
};

// Shared-memory layout of a gate/up CTA (bytes): ring | item slots | planes [blocks][kPadBlock] | sblk
// [nbH] | sx [H/32] | dsm, scm [2][nu][32].
struct UpSmem {
  size_t slots, planes, sblk, sx, dsm, scm, bytes;
};
__host__ __device__ constexpr UpSmem up_smem(int H, int U, int R, int IR, int nthr) {
  const int nu = H / U;
  UpSmem L{};
  L.slots = ring_bytes(R, nthr);
  L.planes = L.slots + size_t(IR) * nthr * kSlotBytes;
  L.sblk = L.planes + size_t(blocks_of(H)) * kPadBlock * 16;
  L.sx = L.sblk + round16(size_t(blocks_of(H)) * 4);
  L.dsm = L.sx + round16(size_t(H / 32) * 4);
  L.scm = L.dsm + size_t(2) * nu * kUpCols * 4;
  L.bytes = L.scm + size_t(2) * nu * kUpCols * 4;
  return L;
}

// gate/up items: it = 8·u + c; A = gate, B = up, columns n0 + 4c .. + 3.
struct UpSrc {
  const int32_t *gq, *uq;
  const __half *gs, *us;
  const int32_t *gz, *uz;
  const uint4* planes;  // [blocks][kPadBlock] (plane_index)
  const int* sx;        // ΣX per 32 k
  const float* sblk;    // s_b per 128 k
  int I, n0, U, rows, g, nu;
  __device__ __forceinline__ UnitItem get(int it) const {
    const int c = it & 7, u = it >> 3, n = n0 + 4 * c, kp = u * rows, grp = u * U / g;
    const size_t wo = size_t(kp) * I + n, so = size_t(grp) * I + n, zo = size_t(grp) * (I / 8) + n / 8;
    UnitItem s;
    s.wa = gq + wo;
    s.wb = uq + wo;
    s.sa = gs + so;
    s.sb = us + so;
    s.za = gz + zo;
    s.zb = uz + zo;
    s.zshift = 4 * (n % 8);
    s.xp = planes + plane_index(kp);
    int t = 0;
    for (int i = 0; i < U / 32; ++i) t += sx[u * (U / 32) + i];
    s.sxu = t;
    s.xscale = sblk[u * U / mi::kXBlock];
    s.oa = u * kUpCols + 4 * c;
    s.ob = (nu + u) * kUpCols + 4 * c;
    return s;
  }
};

template <bool kSym>
__global__ void __launch_bounds__(kMaxThreads) int_stream_gate_up_kernel(UpArgs a, ExpertView gate, ExpertView up) {
  extern __shared__ uint4 smem_su[];
  __shared__ int32_t s_ids[kMaxTopK];
  __shared__ float s_p[kMaxTopK];
  const int H = gate.K, I = gate.N, U = a.U, rows = U / 8, nu = H / U, k = a.k, E = a.E;
  const int tid = threadIdx.x, nthr = blockDim.x, lane = tid & 31;
  const UpSmem L = up_smem(H, U, a.R, a.IR, nthr);
  char* base = reinterpret_cast<char*>(smem_su);
  uint4* planes = reinterpret_cast<uint4*>(base + L.planes);
  float* sblk = reinterpret_cast<float*>(base + L.sblk);
  int* sx = reinterpret_cast<int*>(base + L.sx);
  float* dsm = reinterpret_cast<float*>(base + L.dsm);
  float* scm = reinterpret_cast<float*>(base + L.scm);
  const int slot = blockIdx.y, m = slot / k, r = slot - m * k, n0 = blockIdx.x * kUpCols;
  const bool publisher = blockIdx.x == 0 && r == 0;
  pdl_wait();
  if (tid < 32) {  // warp 0 routes the token: rank r's expert needs rounds 0..r, the publisher all k
    const float psum = route_rounds(a.logits + size_t(m) * E, E, publisher ? k : r + 1, s_ids, s_p);
    if (publisher) {
      __syncwarp();
      if (lane < k) {
        a.ids[size_t(m) * k + lane] = min(max(s_ids[lane], 0), E - 1);  // in range for any logits
        a.weights[size_t(m) * k + lane] = s_p[lane] / psum;
      }
    }
  } else {  // the other warps quantise the x row meanwhile (its loads go out before any weight's)
    quantize_rows<kUpQuantBatch>(a.x + size_t(m) * H, 1, H, a.x_vec, planes, 0, kPadBlock, sblk, sx, 1);
  }
  __syncthreads();
  pdl_launch_dependents();
  const int e = min(max(s_ids[r], 0), E - 1);
  const int ng = H / gate.group;
  const size_t qoff = size_t(e) * (H / 8) * I, soff = size_t(e) * ng * I, zoff = size_t(e) * ng * (I / 8);
  const UpSrc src{gate.qweight + qoff, up.qweight + qoff, gate.scales + soff, up.scales + soff,
                  kSym ? nullptr : gate.qzeros + zoff, kSym ? nullptr : up.qzeros + zoff,
                  planes, sx, sblk, I, n0, U, rows, gate.group, nu};
  const Phase<kSym, UpSrc> ph{src, 8 * nu, rows, I, dsm, scm};
  stream_units(ph, a.R, a.IR, base, base + L.slots, [] {});
  __syncthreads();
  if (tid < 32) {  // lane c: gate and up of column n0 + c, act, the block arrival
    const float gv = fold_units(dsm + lane, scm + lane, kUpCols, nu);
    const float uv = fold_units(dsm + nu * kUpCols + lane, scm + nu * kUpCols + lane, kUpCols, nu);
    a.act[size_t(slot) * I + n0 + lane] = silu_mul_rn(gv, uv);
    act_block_arrive(a, g_stream_arrivals, slot, n0 / kUpCols, I);
  }
}

// ---- down + combine --------------------------------------------------------------------------

struct DownArgs {
  const uint4* aplanes;  // [M·k, I/8] (gate/up)
  const float* asblk;    // [M·k, nbs]
  const int* asx;        // [M·k, sxs]
  int nbs, sxs;
  const int32_t* ids;    // [M·k] (gate/up's publisher)
  const float* weights;  // [M·k]
  int k, U, R, IR;       // top-k, unit length, ring steps, item slots
  float* residual;       // [M, H]
  const float* shared;   // [M, H] or null
  const float* gate_logit;  // [M]
};

// The rank-row stride of down's staged planes (vectors): its blocks of kPadBlock, made ≡ 1 mod 8
// so that 8 ranks' vectors of one packed row fall on 8 different 16-byte bank groups.
__host__ __device__ constexpr int down_row_stride(int I) {
  return blocks_of(I) * kPadBlock + (9 - (blocks_of(I) * kPadBlock) % 8) % 8;
}
// Shared-memory layout of a down CTA (bytes): ring | item slots | planes [k][RS] | sblk [k][nbs] |
// sx [k][sxs] | dsm, scm [k][nu][16] | ys [k][16].
struct DownSmem {
  size_t slots, planes, sblk, sx, dsm, scm, ys, bytes;
};
__host__ __device__ constexpr DownSmem down_smem(int I, int U, int k, int nbs, int sxs, int R, int IR, int nthr) {
  const int nu = I / U;
  DownSmem L{};
  L.slots = ring_bytes(R, nthr);
  L.planes = L.slots + size_t(IR) * nthr * kSlotBytes;
  L.sblk = L.planes + size_t(k) * down_row_stride(I) * 16;
  L.sx = L.sblk + size_t(k) * nbs * 4;
  L.dsm = L.sx + size_t(k) * sxs * 4;
  L.scm = L.dsm + size_t(k) * nu * kDownCols * 4;
  L.ys = L.scm + size_t(k) * nu * kDownCols * 4;
  L.bytes = L.ys + size_t(k) * kDownCols * 4;
  return L;
}

// down items: it = 2·(k·u + r) + c; rank r's expert; A = columns n0 + 4c .., B = n0 + 8 + 4c ..
struct DownSrc {
  const int32_t* q;
  const __half* s;
  const int32_t* z;
  const int32_t* ids;   // shared memory: the token's k expert ids
  const uint4* planes;  // [k][RS]
  const int* sx;        // [k][sxs]
  const float* sblk;    // [k][nbs]
  int H, I, k, n0, U, rows, g, nu, ng, RS, sxs, nbs;
  __device__ __forceinline__ UnitItem get(int it) const {
    const int c = it & 1, qq = it >> 1, u = qq / k, r = qq - u * k;
    const int e = ids[r], n = n0 + 4 * c, kp = u * rows, grp = u * U / g;
    UnitItem t;
    t.wa = q + (size_t(e) * (I / 8) + kp) * H + n;
    t.wb = t.wa + 8;
    t.sa = s + (size_t(e) * ng + grp) * H + n;
    t.sb = t.sa + 8;
    t.za = z + (size_t(e) * ng + grp) * (H / 8) + n / 8;
    t.zb = t.za + 1;
    t.zshift = 4 * (n % 8);
    t.xp = planes + r * RS + plane_index(kp);
    int v = 0;
    for (int i = 0; i < U / 32; ++i) v += sx[r * sxs + u * (U / 32) + i];
    t.sxu = v;
    t.xscale = sblk[r * nbs + u * U / mi::kXBlock];
    t.oa = (r * nu + u) * kDownCols + 4 * c;
    t.ob = t.oa + 8;
    return t;
  }
};

// down's inputs of token m into shared memory: its k act rows' planes (rank r's at planes + r·RS,
// blocks padded as plane_index), s_b [k][nbs] and ΣX [k][sxs]; and for the fin threads the residual,
// shared value and shared gate of column col. Every load of a thread is issued before its first store
// (one L2 round trip). Whole CTA; the caller publishes the stores with a barrier.
__device__ __forceinline__ void stage_down_acts(const DownArgs& a, int m, int k, int I, int H, int col, bool fin,
                                                uint4* planes, int RS, float* sblk, int* sx, float& res, float& sh,
                                                float& sig) {
  const int tid = threadIdx.x, nthr = blockDim.x, nv = I / 8;
  const uint4* gp = a.aplanes + size_t(m) * k * nv;
  constexpr int kBatch = 8;
  const int nplanes = k * nv, nsb = k * a.nbs, nsx = k * a.sxs;
  for (int b0 = 0; b0 < nplanes || b0 == 0; b0 += kBatch * nthr) {
    uint4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = b0 + j * nthr + tid;
      if (i < nplanes) v[j] = __ldcg(gp + i);
    }
    float sbv[2];
    int sxv[4];
    if (b0 == 0) {  // s_b and ΣX (k·nbs <= 2·nthr, k·sxs <= 4·nthr: plan_for) with the first batch
#pragma unroll
      for (int j = 0; j < 2; ++j)
        if (tid + j * nthr < nsb) sbv[j] = __ldcg(a.asblk + size_t(m) * nsb + tid + j * nthr);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (tid + j * nthr < nsx) sxv[j] = __ldcg(a.asx + size_t(m) * nsx + tid + j * nthr);
      if (fin) {
        res = __ldcg(a.residual + size_t(m) * H + col);
        if (a.shared) {
          sh = __ldcg(a.shared + size_t(m) * H + col);
          sig = 1.0f / (1.0f + __expf(-__ldcg(a.gate_logit + m)));  // combine_kernel's shared_scale
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = b0 + j * nthr + tid;
      if (i < nplanes) {
        const int r = i / nv;
        planes[r * RS + plane_index(i - r * nv)] = v[j];
      }
    }
    if (b0 == 0) {
#pragma unroll
      for (int j = 0; j < 2; ++j)
        if (tid + j * nthr < nsb) sblk[tid + j * nthr] = sbv[j];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (tid + j * nthr < nsx) sx[tid + j * nthr] = sxv[j];
    }
  }
}

// The end of a down CTA: y of each (rank, column) from its factors (fold_units), then combine_routed's
// order for the fin threads' column: acc = fmaf(w_r, y_r, acc) over r from 0, o = res + acc, with the
// shared expert o = fmaf(sig, sh, o); *out = o. Whole CTA (one barrier).
__device__ __forceinline__ void combine_down(const float* dsm, const float* scm, float* ys, const float* s_w, int k,
                                             int nu, bool fin, float res, bool shared, float sh, float sig,
                                             float* out) {
  for (int o = threadIdx.x; o < k * kDownCols; o += int(blockDim.x)) {  // y of (rank o / 16, column o % 16)
    const int rr = o / kDownCols, c = o - rr * kDownCols;
    ys[o] = fold_units(dsm + rr * nu * kDownCols + c, scm + rr * nu * kDownCols + c, kDownCols, nu);
  }
  __syncthreads();
  if (fin) {
    float acc = 0.0f;
    for (int rr = 0; rr < k; ++rr) acc = fmaf(s_w[rr], ys[rr * kDownCols + threadIdx.x], acc);
    float o = res + acc;
    if (shared) o = fmaf(sig, sh, o);
    *out = o;
  }
}

template <bool kSym>
__global__ void __launch_bounds__(kMaxThreads) int_stream_down_kernel(DownArgs a, ExpertView down) {
  extern __shared__ uint4 smem_sd[];
  __shared__ int32_t s_ids[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  const int H = down.N, I = down.K, U = a.U, rows = U / 8, nu = I / U, k = a.k;
  const int RS = down_row_stride(I);
  const int tid = threadIdx.x, nthr = blockDim.x;
  const DownSmem L = down_smem(I, U, k, a.nbs, a.sxs, a.R, a.IR, nthr);
  char* base = reinterpret_cast<char*>(smem_sd);
  uint4* planes = reinterpret_cast<uint4*>(base + L.planes);
  float* sblk = reinterpret_cast<float*>(base + L.sblk);
  int* sx = reinterpret_cast<int*>(base + L.sx);
  float* dsm = reinterpret_cast<float*>(base + L.dsm);
  float* scm = reinterpret_cast<float*>(base + L.scm);
  float* ys = reinterpret_cast<float*>(base + L.ys);
  const int m = blockIdx.y, n0 = blockIdx.x * kDownCols, col = n0 + tid;
  const bool fin = tid < kDownCols;  // the threads that write the residual (H % 16 == 0)
  pdl_wait();  // gate/up's ids, weights, act planes, s_b and ΣX; the residual and shared values
  if (tid < k) {
    s_ids[tid] = __ldcg(a.ids + size_t(m) * k + tid);  // in range (clamped by gate/up)
    s_w[tid] = __ldcg(a.weights + size_t(m) * k + tid);
  }
  __syncthreads();
  const DownSrc src{down.qweight, down.scales, kSym ? nullptr : down.qzeros, s_ids, planes, sx, sblk, H, I, k, n0,
                    U, rows, down.group, nu, I / down.group, RS, a.sxs, a.nbs};
  float res = 0.0f, sh = 0.0f, sig = 0.0f;
  const Phase<kSym, DownSrc> ph{src, 2 * k * nu, rows, H, dsm, scm};
  stream_units(ph, a.R, a.IR, base, base + L.slots, [&] {
    stage_down_acts(a, m, k, I, H, col, fin, planes, RS, sblk, sx, res, sh, sig);
    __syncthreads();
  });
  __syncthreads();
  pdl_launch_dependents();
  combine_down(dsm, scm, ys, s_w, k, nu, fin, res, a.shared != nullptr, sh, sig, a.residual + size_t(m) * H + col);
}

// ---- one token: gate/up and down in one launch -------------------------------------------------
// int_stream_fused_kernel: gate/up's grid (I / 32, k) and work; the first H / 16 of its CTAs
// (cta = blockIdx.y·gridDim.x + blockIdx.x) then do down's work for columns 16·cta .. + 15 in
// the same CTA, through the same ring (stream_two_phases): a thread requests its down rows right
// behind its gate/up rows, so down's weights are in flight while gate/up finishes, folds and
// quantises its act blocks. Every CTA routes all k ranks (warp 0; the ranks' experts and weights
// in shared memory). After its act tile's block arrival, a down CTA waits until all k·ceil(I/128)
// act blocks of the token are quantised (g_fused_ready, counted by each block's last arrival),
// stages them (stage_down_acts) and streams its down items; the last down CTA past the wait sets
// both counters back to zero. The same bits as the two kernels (the same items, folds and
// combine order). The wait needs every CTA of the grid resident at once: fused_plan takes this
// kernel only when the occupancy of its configuration holds the whole grid, the launch is
// cooperative (launch_pdl_cooperative: the runtime guarantees the co-residency whatever else
// shares the device, or fails), and each CTA lets the next kernel launch (pdl_launch_dependents)
// only after its wait, so no CTA of a later kernel can take the slot of one not yet started.
// Without the shared expert only (the caller adds it: residual = fmaf(sigmoid(gate), shared,
// residual) is the combine's last step either way).
struct FusedArgs {
  UpArgs up;        // the ring's R and IR
  DownArgs down;    // fill_down_io(up); the shared expert null; U = down's unit length
  int down_ctas;    // H / kDownCols
};
__device__ unsigned g_fused_ready;   // act blocks quantised in this launch
__device__ unsigned g_fused_passed;  // down CTAs past their wait

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

template <bool kSymUp, bool kSymDown>
__global__ void __launch_bounds__(kMaxThreads) int_stream_fused_kernel(FusedArgs f, ExpertView gate, ExpertView up,
                                                                       ExpertView down) {
  extern __shared__ uint4 smem_sf[];
  __shared__ int32_t s_ids[kMaxTopK];
  __shared__ float s_p[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  // Measurement builds only (stage_stamps.cuh): 0 entry, 1 the wait, 2 routed and x quantised, 3 gate/up's
  // units consumed, 4 act folded and the block's arrival counted, 5 past the grid-wide wait (down CTAs),
  // 6 down's activations staged, 7 down's units consumed, 8 the combine written.
  StageStamps<9> stamps;
  stamps.mark(0);
  const UpArgs& a = f.up;
  const int H = gate.K, I = gate.N, k = a.k, E = a.E;
  const int uu = a.U, rows_u = uu / 8, nu_u = H / uu, ud = f.down.U, rows_d = ud / 8, nu_d = I / ud;
  const int RS = down_row_stride(I);
  const int tid = threadIdx.x, nthr = blockDim.x, lane = tid & 31;
  const UpSmem LU = up_smem(H, uu, a.R, a.IR, nthr);
  const DownSmem LD = down_smem(I, ud, k, a.nbs, a.sxs, a.R, a.IR, nthr);  // the same ring, then down's regions
  char* base = reinterpret_cast<char*>(smem_sf);
  uint4* planes_u = reinterpret_cast<uint4*>(base + LU.planes);
  float* sblk_u = reinterpret_cast<float*>(base + LU.sblk);
  int* sx_u = reinterpret_cast<int*>(base + LU.sx);
  float* dsm_u = reinterpret_cast<float*>(base + LU.dsm);
  float* scm_u = reinterpret_cast<float*>(base + LU.scm);
  uint4* planes_d = reinterpret_cast<uint4*>(base + LD.planes);  // down's regions overlay gate/up's
  float* sblk_d = reinterpret_cast<float*>(base + LD.sblk);
  int* sx_d = reinterpret_cast<int*>(base + LD.sx);
  float* dsm_d = reinterpret_cast<float*>(base + LD.dsm);
  float* scm_d = reinterpret_cast<float*>(base + LD.scm);
  float* ys = reinterpret_cast<float*>(base + LD.ys);
  const int r = blockIdx.y, n0 = blockIdx.x * kUpCols;  // one token: slot = rank
  const int cta = int(blockIdx.y * gridDim.x + blockIdx.x), d0 = cta * kDownCols, col = d0 + tid;
  const bool has_down = cta < f.down_ctas, fin = has_down && tid < kDownCols;
  pdl_wait();
  stamps.mark(1);
  if (tid < 32) {  // warp 0 routes the token, all k ranks (down needs every one)
    const float psum = route_rounds(a.logits, E, k, s_ids, s_p);
    __syncwarp();
    if (lane < k) {
      const int e = min(max(s_ids[lane], 0), E - 1);  // in range for any logits
      const float w = s_p[lane] / psum;
      s_ids[lane] = e;
      s_w[lane] = w;
      if (blockIdx.x == 0 && r == 0) {  // published for the workspace's readers (tests)
        a.ids[lane] = e;
        a.weights[lane] = w;
      }
    }
  } else {  // the other warps quantise the x row meanwhile
    quantize_rows<kUpQuantBatch>(a.x, 1, H, a.x_vec, planes_u, 0, kPadBlock, sblk_u, sx_u, 1);
  }
  __syncthreads();
  stamps.mark(2);
  const int e = s_ids[r];
  const int ng = H / gate.group;
  const size_t qoff = size_t(e) * (H / 8) * I, soff = size_t(e) * ng * I, zoff = size_t(e) * ng * (I / 8);
  const UpSrc srcu{gate.qweight + qoff, up.qweight + qoff, gate.scales + soff, up.scales + soff,
                   kSymUp ? nullptr : gate.qzeros + zoff, kSymUp ? nullptr : up.qzeros + zoff,
                   planes_u, sx_u, sblk_u, I, n0, uu, rows_u, gate.group, nu_u};
  const DownSrc srcd{down.qweight, down.scales, kSymDown ? nullptr : down.qzeros, s_ids, planes_d, sx_d, sblk_d,
                     H, I, k, d0, ud, rows_d, down.group, nu_d, I / down.group, RS, a.sxs, a.nbs};
  const Phase<kSymUp, UpSrc> pa{srcu, 8 * nu_u, rows_u, I, dsm_u, scm_u};
  const Phase<kSymDown, DownSrc> pb{srcd, has_down ? 2 * k * nu_d : 0, rows_d, H, dsm_d, scm_d};
  float res = 0.0f, sh = 0.0f, sig = 0.0f;
  stream_two_phases(pa, pb, a.R, a.IR, base, base + LU.slots, [&] {
    __syncthreads();  // gate/up's factors
    stamps.mark(3);
    if (tid < 32) {   // lane c: gate and up of column n0 + c, act, the block arrival
      const float gv = fold_units(dsm_u + lane, scm_u + lane, kUpCols, nu_u);
      const float uv = fold_units(dsm_u + nu_u * kUpCols + lane, scm_u + nu_u * kUpCols + lane, kUpCols, nu_u);
      a.act[size_t(r) * I + n0 + lane] = silu_mul_rn(gv, uv);
      if (act_block_arrive(a, g_stream_arrivals, r, n0 / kUpCols, I)) {
        __threadfence();  // the block's planes, s_b and ΣX before the count
        __syncwarp();
        if (lane == 0) atomicAdd(&g_fused_ready, 1u);
      }
      stamps.mark(4);
    }
    if (has_down) {
      if (tid == 0) {
        const unsigned want = unsigned(k * blocks_of(I));
        while (ld_acquire_gpu(&g_fused_ready) < want) __nanosleep(32);
        __threadfence();
      }
      __syncthreads();  // past the wait; warp 0's fold has read gate/up's regions, which down's overlay
      stamps.mark(5);
      stage_down_acts(f.down, 0, k, I, H, col, fin, planes_d, RS, sblk_d, sx_d, res, sh, sig);
      __syncthreads();
      stamps.mark(6);
      if (tid == 0 && atomicAdd(&g_fused_passed, 1u) == unsigned(f.down_ctas - 1)) {  // every down CTA is past
        atomicExch(&g_fused_passed, 0u);
        atomicExch(&g_fused_ready, 0u);
      }
    }
    pdl_launch_dependents();  // only now: every CTA of this grid has started (see above)
  });
  stamps.mark(7);
  if (!has_down) {
    stamps.print("moe_int_fused", 1, 0, cta, 0);
    return;
  }
  __syncthreads();
  combine_down(dsm_d, scm_d, ys, s_w, k, nu_d, fin, res, false, sh, sig, f.down.residual + col);
  stamps.mark(8);
  stamps.print("moe_int_fused", 1, 1, cta, 0);
}

// ---- host ------------------------------------------------------------------------------------

using UpKernel = void (*)(UpArgs, ExpertView, ExpertView);
using DownKernel = void (*)(DownArgs, ExpertView);
UpKernel up_kernel(bool sym) { return sym ? int_stream_gate_up_kernel<true> : int_stream_gate_up_kernel<false>; }
DownKernel down_kernel(bool sym) { return sym ? int_stream_down_kernel<true> : int_stream_down_kernel<false>; }
using FusedKernel = void (*)(FusedArgs, ExpertView, ExpertView, ExpertView);
FusedKernel fused_kernel(bool sym_up, bool sym_down) {
  if (sym_up) return sym_down ? int_stream_fused_kernel<true, true> : int_stream_fused_kernel<true, false>;
  return sym_down ? int_stream_fused_kernel<false, true> : int_stream_fused_kernel<false, false>;
}

// Device limits and the kernels' registers, queried once per device; the first query also opts the
// kernels in to the device's largest dynamic shared memory per block and carveout (not a stream
// operation, so legal inside graph capture).
struct Caps {
  SmLimits sm;
  int regs_up = 0, regs_down = 0, regs_fused = 0, static_up = 0, static_down = 0, static_fused = 0;
  bool cooperative = false;  // cudaDevAttrCooperativeLaunch (the fused kernel's launch)
};

const Caps& device_caps() {
  return once_per_device([](int dev) {
    Caps c;
    c.sm = device_sm_limits(dev);
    int coop = 0;
    c.cooperative = cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) == cudaSuccess && coop != 0;
    for (bool sym : {true, false}) {
      const KernelResources u = opt_in_max_shared((const void*)up_kernel(sym), c.sm.smem_optin);
      const KernelResources d = opt_in_max_shared((const void*)down_kernel(sym), c.sm.smem_optin);
      c.regs_up = std::max(c.regs_up, u.regs);
      c.static_up = std::max(c.static_up, u.static_smem);
      c.regs_down = std::max(c.regs_down, d.regs);
      c.static_down = std::max(c.static_down, d.static_smem);
      for (bool sym_down : {true, false}) {
        const KernelResources fr = opt_in_max_shared((const void*)fused_kernel(sym, sym_down), c.sm.smem_optin);
        c.regs_fused = std::max(c.regs_fused, fr.regs);
        c.static_fused = std::max(c.static_fused, fr.static_smem);
      }
    }
    return c;
  });
}

struct StreamPlan {
  bool ok = false;
  int threads = 0, R = 0, IR = 0;
  size_t smem = 0;
};

// The largest ring (steps of 2 rows in flight per thread, <= kMaxRing and at most the thread's
// steps) whose CTA fits `want` CTAs per SM and the per-block limit. want starts at the CTAs the
// grid puts on an SM (ceil(ctas / SMs)), capped by the registers and threads of an SM, and drops
// while the rings of `want` CTAs would hold less than a quarter of the SM's shared memory or do
// not fit. bytes(R, IR, threads): the CTA's dynamic shared memory. The ring only groups loads,
// never a sum: choosing it by M or by device keeps every bit.
// A second phase through the same ring (the fused kernel): items2 more items of rows2 rows each.
// cap > 0: at most that many steps (ring_cap).
template <class Bytes>
StreamPlan plan_stream(int items, int rows, int ctas, int regs, int static_bytes, const Caps& c, int cap, Bytes bytes,
                       int items2 = 0, int rows2 = 0) {
  StreamPlan P;
  P.threads = std::min(kMaxThreads, std::max(64, (items + 31) / 32 * 32));  // >= 2 warps: gate/up's x staging
  const int per_thread = (items + P.threads - 1) / P.threads, per_thread2 = (items2 + P.threads - 1) / P.threads;
  const int min_rows = items2 > 0 ? std::min(rows, rows2) : rows;
  const int reg_max = c.sm.regs_per_sm / (P.threads * std::max(regs, 1)), thread_max = c.sm.threads_per_sm / P.threads;
  const int want_max = std::max(1, std::min({reg_max, thread_max, (ctas + c.sm.sms - 1) / c.sm.sms}));
  int max_ring = std::min(kMaxRing, (per_thread * rows + per_thread2 * rows2) / kStepRows);
  if (cap > 0) max_ring = std::min(max_ring, cap);
  for (int want = want_max; want >= 1; --want) {
    const long budget = std::min<long>(c.sm.smem_optin, long(c.sm.smem_per_sm) / want - c.sm.smem_reserved) - long(static_bytes);
    for (int R = max_ring; R >= 1; --R) {
      const int ir = item_slots(R, min_rows, per_thread + per_thread2);
      const size_t smem = bytes(R, ir, P.threads);
      if (long(smem) <= budget && (want == 1 || R == max_ring || want * ring_bytes(R, P.threads) >= size_t(c.sm.smem_per_sm) / 4)) {
        P.ok = true;
        P.R = R;
        P.IR = ir;
        P.smem = smem;
        return P;
      }
    }
  }
  return P;
}

std::atomic<int> g_variant{2};

// The ring's cap for a step of M tokens (set_moe_int_stream_ring_cap; < 0: by M). Steps of 2-8 tokens
// take at most 2 steps of 2 rows per thread: docs/PERF.md run S24-7, the 122B at batch 2 / 4 / 6 / 8
// 6.03 / 8.12 / 13.42 / 13.60 ms per step against 6.32 / 8.27 / 13.69 / 13.88 with the largest ring
// that fits (7 steps), 1 and 3 steps no better than 7; one token (the fused kernel) is the same
// either way (3.72-3.77 ms, run S24-6), so it keeps the largest.
std::atomic<int> g_ring_cap{-1};
int ring_cap(int M) {
  const int cap = g_ring_cap.load(std::memory_order_relaxed);
  return cap >= 0 ? cap : (M >= 2 ? 2 : 0);
}

// Both kernels' plans for a step of M tokens (ok false: the shape or the device does not fit them).
struct Plans {
  bool ok = false;
  int u_up = 0, u_down = 0;
  StreamPlan up, down;
  dim3 grid_up, grid_down;
};

Plans plan_for(const MoeShape& s, const DeviceExperts& ex, int M) {
  Plans P;
  const int H = s.hidden, I = s.intermediate, k = s.top_k, E = s.num_experts;
  P.u_up = mi::unit_length(int(ex.gate.group_size));
  P.u_down = mi::unit_length(int(ex.down.group_size));
  if (M < 1 || M > kIntDecodeMaxTokens || k < 1 || k > kMaxTopK || E < 1 || E > 256) return P;
  if (ex.gate.group_size != ex.up.group_size || P.u_up < 32 || P.u_down < 32) return P;
  if (H % P.u_up != 0 || I % P.u_down != 0 || I % kUpCols != 0 || H % kDownCols != 0 || H % 64 != 0) return P;
  if (long(M) * k * blocks_of(I) > kArrivalSlots || long(M) * k > 65535) return P;
  const IntDecodeLayout lay = int_decode_layout(s, M);
  const Caps& c = device_caps();
  P.grid_up = dim3(unsigned(I / kUpCols), unsigned(M * k));
  P.grid_down = dim3(unsigned(H / kDownCols), unsigned(M));
  const int uu = P.u_up, ud = P.u_down;
  P.down = plan_stream(2 * k * (I / ud), ud / 8, int(P.grid_down.x * P.grid_down.y), c.regs_down, c.static_down,
                       c, ring_cap(M),
                       [&](int R, int IR, int nt) { return down_smem(I, ud, k, lay.nbs, lay.sxs, R, IR, nt).bytes; });
  // down's staging loads s_b and ΣX with its first batch: at most 2 and 4 per thread.
  if (k * lay.nbs > 2 * P.down.threads || k * lay.sxs > 4 * P.down.threads) return P;
  P.up = plan_stream(8 * (H / uu), uu / 8, int(P.grid_up.x * P.grid_up.y), c.regs_up, c.static_up, c, ring_cap(M),
                     [&](int R, int IR, int nt) { return up_smem(H, uu, R, IR, nt).bytes; });
  P.ok = P.up.ok && P.down.ok;
  return P;
}

// The fused one-token kernel's plan (ok false: the two kernels serve): gate/up's grid and threads,
// one ring for both phases, shared memory for the larger of the two phases' regions, and the whole
// grid resident at once by the occupancy of that configuration (the kernel's wait needs it).
struct FusedPlan {
  bool ok = false;
  StreamPlan ring;
  dim3 grid;
  int down_ctas = 0;
};

FusedPlan fused_plan(const MoeShape& s, const DeviceExperts& ex, int M, bool sym_up, bool sym_down) {
  FusedPlan F;
  if (M != 1 || g_variant.load() != 2) return F;
  const Plans P = plan_for(s, ex, 1);
  if (!P.ok) return F;
  const int H = s.hidden, I = s.intermediate, k = s.top_k;
  const IntDecodeLayout lay = int_decode_layout(s, 1);
  const Caps& c = device_caps();
  if (!c.cooperative) return F;
  const int uu = P.u_up, ud = P.u_down;
  F.grid = P.grid_up;
  F.down_ctas = H / kDownCols;
  const int ctas = int(F.grid.x * F.grid.y);
  if (F.down_ctas > ctas) return F;
  F.ring = plan_stream(
      8 * (H / uu), uu / 8, ctas, c.regs_fused, c.static_fused, c, ring_cap(1),
      [&](int R, int IR, int nt) {
        return std::max(up_smem(H, uu, R, IR, nt).bytes, down_smem(I, ud, k, lay.nbs, lay.sxs, R, IR, nt).bytes);
      },
      2 * k * (I / ud), ud / 8);
  if (!F.ring.ok) return F;
  if (k * lay.nbs > 2 * F.ring.threads || k * lay.sxs > 4 * F.ring.threads) return F;  // stage_down_acts
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void*)fused_kernel(sym_up, sym_down),
                                                    F.ring.threads, F.ring.smem) != cudaSuccess) {
    cudaGetLastError();
    return F;
  }
  F.ok = long(per_sm) * c.sm.sms >= ctas;
  return F;
}

}  // namespace

bool int_stream_serves(const MoeShape& s, const DeviceExperts& ex, int M) {
  return g_variant.load() >= 1 && plan_for(s, ex, M).ok;
}

bool int_stream_fuses(const MoeShape& s, const DeviceExperts& ex, int M) {
  return fused_plan(s, ex, M, gate_up_symmetric(ex), down_symmetric(ex)).ok;
}

bool int_stream_decode(const float* x, const float* router_logits, const MoeShape& s, const DeviceExperts& ex, int M,
                       void* workspace, size_t workspace_bytes, float* residual, const float* shared_out,
                       const float* shared_gate_logit, cudaStream_t stream, cudaEvent_t shared_ready) {
  if (g_variant.load() < 1) return false;
  const Plans P = plan_for(s, ex, M);
  const IntDecodeLayout lay = int_decode_layout(s, M);
  if (!P.ok || workspace_bytes < lay.bytes || reinterpret_cast<uintptr_t>(workspace) % 16 != 0) return false;
  char* ws = static_cast<char*>(workspace);
  const bool sym_up = gate_up_symmetric(ex), sym_down = down_symmetric(ex);
  if (shared_out == nullptr) {  // one token without the shared expert: the fused kernel where it fits
    const FusedPlan F = fused_plan(s, ex, M, sym_up, sym_down);
    if (F.ok) {
      FusedArgs fa{};
      fill_up_io(fa.up, x, router_logits, s, lay, ws);
      fa.up.U = P.u_up;
      fa.up.R = F.ring.R;
      fa.up.IR = F.ring.IR;
      fill_down_io(fa.down, fa.up, residual, nullptr, nullptr);
      fa.down.U = P.u_down;
      fa.down_ctas = F.down_ctas;
      launch_pdl_cooperative(true, fused_kernel(sym_up, sym_down), F.grid, dim3(unsigned(F.ring.threads)), F.ring.smem,
                             stream, fa, view_of(ex.gate), view_of(ex.up), view_of(ex.down));
      return true;
    }
  }
  const StreamPlan& pu = P.up;
  const StreamPlan& pd = P.down;
  const int u_up = P.u_up, u_down = P.u_down;
  const dim3 grid_up = P.grid_up, grid_down = P.grid_down;
  UpArgs ua{};
  fill_up_io(ua, x, router_logits, s, lay, ws);
  ua.U = u_up;
  ua.R = pu.R;
  ua.IR = pu.IR;
  launch_pdl(true, up_kernel(sym_up), grid_up, dim3(unsigned(pu.threads)), pu.smem, stream, ua, view_of(ex.gate),
             view_of(ex.up));
  if (shared_ready) MOESERVE_CUDA_CHECK(cudaStreamWaitEvent(stream, shared_ready, 0));  // down adds it
  DownArgs da{};
  fill_down_io(da, ua, residual, shared_out, shared_gate_logit);
  da.U = u_down;
  da.R = pd.R;
  da.IR = pd.IR;
  launch_pdl(true, down_kernel(sym_down), grid_down, dim3(unsigned(pd.threads)), pd.smem, stream, da,
             view_of(ex.down));
  return true;
}

}  // namespace moeserve::cuda::moe_int_detail

namespace moeserve::cuda {

void set_moe_int_decode_variant(int variant) {
  if (variant < 0 || variant > 2)
    throw Error("set_moe_int_decode_variant: " + std::to_string(variant) +
                " (0: the persistent dp4a kernels, 1: the streaming ones, 2: streaming with the fused one-token "
                "kernel)");
  moe_int_detail::g_variant.store(variant);
}

int moe_int_decode_variant() { return moe_int_detail::g_variant.load(); }

void set_moe_int_stream_ring_cap(int steps) {
  if (steps < -1)
    throw Error("set_moe_int_stream_ring_cap: " + std::to_string(steps) + " (-1: by the step's tokens, 0: no cap)");
  moe_int_detail::g_ring_cap.store(steps);
}

bool moe_int_decode_streams(const MoeShape& shape, const DeviceExperts& experts, int M) {
  return moe_int_detail::int_form_supported(shape, experts) && M >= 1 && M <= moe_int_decode_max_tokens() &&
         moe_int_detail::int_stream_serves(shape, experts, M);
}

bool moe_int_decode_fuses(const MoeShape& shape, const DeviceExperts& experts, int M) {
  return moe_int_decode_streams(shape, experts, M) && moe_int_detail::int_stream_fuses(shape, experts, M);
}

}  // namespace moeserve::cuda
