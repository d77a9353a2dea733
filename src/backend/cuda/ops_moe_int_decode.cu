// The integer form of the GPTQ INT4 routed experts (moe_int_arith.h) for steps of 1 ..
// kIntDecodeMaxTokens tokens: two dp4a kernels on CUDA cores, routing fused into gate/up and the
// combine into down (int_decode, declared in ops_moe_int_internal.cuh).
//
// Layout: the checkpoint's own: qweight [E][K/8][N] int32 (nibble j of word (kp, n) = q[8kp + j, n]),
// scales f16 [E][K/g][N], qzeros [E][K/g][N/8] (stored zero - 1); x f32 [M, H]; router logits f32
// [M, E]; residual f32 [M, H]. Workspace (ops_moe_int_decode.cuh): ids [M·k] i32, weights [M·k] f32,
// act [M·k, I] f32 by slot = m·k + rank, 256-byte aligned regions.
//
// Arithmetic (moe_int_arith.h, exactly): each CTA quantises its activation rows in shared memory
// (step 1: one warp per 128-k block: amax by a shuffle max, x_scale, quantize_x), keeping X = 256·hi
// + lo as two byte planes in the order dp4a wants: per packed row (8 k) one 16-byte vector {hi of
// k 0,2,4,6 | hi of k 1,3,5,7 | lo of k 0,2,4,6 | lo of k 1,3,5,7} (hi = X >> 8 signed, lo = X & 0xFF
// unsigned), the block scale s_b, and ΣX per 32 k. A GPTQ word w gives lo_w = w & 0x0F0F0F0F (q of
// k 0,2,4,6) and hi_w = (w >> 4) & 0x0F0F0F0F (k 1,3,5,7); per column A = Σ q·hi and B = Σ q·lo by
// four dp4a per word, and per sub-unit (min(U, 64) k: 64, or 32 when U = 32) the exact integer
// P = 256·A + B − z·ΣX goes to shared memory. After a barrier one thread per output adds the
// sub-units of a unit (exact: D_u) and folds the units in ascending k with fold_unit (step 3).
// No sum depends on M, the grid, the column block or the thread split: a token gets the same bits
// in any batch, and the same as int_form_linear and the tensor-core form.
//
// Items: a thread's unit of work is (series, 4 columns, chunk of 8 packed rows = 64 k): 8 16-byte
// weight loads (ld.global.nc.L1::no_allocate.v4), plus per sub-unit that starts a GPTQ group the
// group's 4 scales (8 bytes) and, asymmetric, its zero word. Item i of a CTA: lane i % L (L =
// series x column quads, quads fastest: a warp's loads cover whole 64/128-byte row segments),
// chunk i / L; thread t runs items t, t + 256, ... with the next item's loads issued before the
// current one is computed (a two-item register ring: 8-16 rows, 128-256 bytes in flight per thread
// all the time).
//
// gate/up (int_gate_up_kernel): grid (I / C_up, M·k), C_up = 32 columns (one 128-byte line of a
//   packed row) when it fits; series gate and up of the slot's expert, so L = 16, H/64 chunks.
//   Every warp routes the slot's token itself (route_token, the decode kernels' code, r + 1 arg-max
//   rounds; the publishing warp, warp 0 of the token's (rank 0, column block 0) CTA, all k rounds
//   and writes ids / weights for down), issues its first item's loads, then the warps quantise the
//   x row (__ldcg: written by the previous kernel); barrier; items; barrier; 2·C threads fold gate
//   and up, C threads write act = silu_mul_rn(g, u).
// down (int_down_kernel): grid (H / C_down, M), C_down = 16; all k ranks of the token (series =
//   ranks, L = 4·k, I/64 chunks). Reads ids / weights (written by gate/up), issues its first item's
//   loads, quantises the k act rows (row stride I/8 + 1 vectors: the ranks' rows on different banks),
//   items, fold per (rank, column) into y, then combine_kernel's steps (ops_moe.cu) per column:
//   acc = fmaf(w_r, y_r, acc) over r from 0, o = residual + acc, with the shared expert
//   o = fmaf(1 / (1 + __expf(-logit)), shared, o). A shape whose k act rows do not fit the device
//   runs the ranks in passes of kr (the fold's y of every rank stays in shared memory).
// Threads 256, __launch_bounds__(256, 2) (<= 128 registers: 2 CTAs per SM). Shared memory (bytes,
//   per CTA, smem_layout): planes rows·(K/8 [+1])·16, sub-unit sums series·(K/sub)·C·4, scales
//   series·(K/g)·C·2 (filled by 8-byte cp.async with the weights), y, s_b and ΣX. 122B-A10B (H 3072,
//   I 1024, k 8, g 128 sym): gate/up 22,240 B (+ 2,048 static: the per-warp routing), down 28,544 B
//   (+ 528 static): 2 CTAs per SM on the H200 and on the DGX Spark (99 KB per block and per SM);
//   C (and the down passes) are chosen per device so that 2 CTAs fit, else 1 (plan_int_decode).
//   Shared memory above 48 KB is opted in once per device (the device's per-block maximum).
// Grids at the 122B shape: M = 1 gate/up 32 x 8 = 256 CTAs, down 192 x 1 = 192 (264 CTA slots:
//   one wave each); M = 8 gate/up 2048, down 1536. Bytes in flight: 8-16 rows x 16 B per thread,
//   256 threads, 2 CTAs per SM: 64-128 KB per SM (at M = 1 gate/up requests 2/3 of a CTA's 96 KB
//   slice before its first item is computed; down all of its 64 KB).
// PDL: both kernels are programmatic dependent launches and wait (pdl_wait) before touching any
//   global memory (the experts to read depend on the routing, which needs the logits); they let
//   their dependents launch after their prologue. shared_ready: the stream waits for it before the
//   down launch (the only kernel that reads shared_out).
// Roofline (bytes per layer): M·k·(2·I·H/2 + 2·(H/g)·I·2) for gate/up and M·k·(H·I/2 + (I/g)·H·2)
//   for down (+ zeros when asymmetric; a token's repeated expert is read again; tokens are not
//   grouped at M <= 8): 122B at M = 1 25.2 MB + 12.6 MB = 37.7 MB of weights + 1.2 MB of scales.
//   Activations from L2: x (4·H) per gate/up CTA, k act rows (4·k·I) per down CTA.
// Instructions per weight word: 1 LOP3, 1 SHF + 1 LOP3, 4 dp4a (+ 1/4 of a 16-byte shared load of
//   X), against ~25 for the f32 form (ops_moe_decode.cu).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/moe_int_arith.h"
#include "backend/cuda/ops_moe_int_decode.cuh"
#include "backend/cuda/ops_moe_int_internal.cuh"
#include "backend/cuda/ops_moe_internal.cuh"
#include "backend/cuda/pdl.cuh"
#include "core/error.h"

namespace moeserve::cuda::moe_int_detail {
namespace {

using moe_detail::ExpertView;
using moe_detail::kMaxTopK;
using moe_detail::route_token;
using moe_detail::silu_mul_rn;
using moe_detail::view_of;
namespace mi = moe_int;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunkRows = 8;   // packed rows per item (64 k)
constexpr int kQuantBatch = 4;  // 128-k blocks a warp loads before it quantises them
constexpr int kMaxCols = 32;    // columns per CTA (C: 32, 16, 8 or 4)

// ---- shared memory ---------------------------------------------------------------------------

__host__ __device__ constexpr int round16(int b) { return (b + 15) / 16 * 16; }

// Byte offsets of a CTA's dynamic shared memory. rows activation rows of K (planes: pstride
// 16-byte vectors per row), series outputs per column, C columns, group g, sub_k k per sub-unit,
// ys_floats floats of fold results.
struct SmemLayout {
  int planes, dp, sc, ys, sblk, sx, bytes;
};
__host__ __device__ constexpr SmemLayout smem_layout(int rows, int pstride, int series, int K, int C, int g, int sub_k,
                                                     int ys_floats) {
  SmemLayout L{};
  L.planes = 0;
  L.dp = L.planes + rows * pstride * 16;                          // int   [series][K/sub_k][C]
  L.sc = L.dp + round16(series * (K / sub_k) * C * 4);            // half  [series][K/g][C]
  L.ys = L.sc + round16(series * (K / g) * C * 2);                // float [ys_floats]
  L.sblk = L.ys + round16(ys_floats * 4);                         // float [rows][ceil(K/128)]
  L.sx = L.sblk + round16(rows * ((K + mi::kXBlock - 1) / mi::kXBlock) * 4);  // int [rows][K/32]
  L.bytes = L.sx + round16(rows * (K / 32) * 4);
  return L;
}
__host__ __device__ constexpr SmemLayout up_layout(int H, int C, int g, int sub_k) {
  return smem_layout(1, H / 8, 2, H, C, g, sub_k, 2 * C);
}
__host__ __device__ constexpr SmemLayout down_layout(int I, int k, int kr, int C, int g, int sub_k) {
  return smem_layout(kr, I / 8 + 1, kr, I, C, g, sub_k, k * C);
}

// ---- activation quantisation (moe_int_arith.h step 1) ----------------------------------------

// One 128-k block by one warp: lane L holds x[4L .. 4L + 3] of the block (v; zeros past the row's
// end). Writes the block's plane vectors (planes[0..16)), its scale s_b (*sblk) and ΣX of its 32-k
// quarters (sx[0..4)); a row's short last block (moe_int_arith.h 1.: K % 128 != 0) writes only its
// len / 8 vectors and len / 32 quarters (len = its k count, a multiple of 32).
__device__ __forceinline__ void quantize_block(float4 v, int len, uint4* planes, float* sblk, int* sx) {
  const int lane = threadIdx.x & 31;
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const mi::XScale sc = mi::x_scale(amax);
  const int X0 = mi::quantize_x(v.x, sc.inv), X1 = mi::quantize_x(v.y, sc.inv);
  const int X2 = mi::quantize_x(v.z, sc.inv), X3 = mi::quantize_x(v.w, sc.inv);
  // Even lanes hold k 0..3 of a packed row (bytes 0, 1 of the k-parity words), odd lanes k 4..7
  // (bytes 2, 3); one shuffle per word joins them.
  const int sh = (lane & 1) * 16;
  auto hi = [](int X) { return uint32_t(X >> 8) & 0xFFu; };  // arithmetic shift: X = 256·hi + lo
  auto lo = [](int X) { return uint32_t(X) & 0xFFu; };
  uint32_t hiE = (hi(X0) | (hi(X2) << 8)) << sh;
  uint32_t hiO = (hi(X1) | (hi(X3) << 8)) << sh;
  uint32_t loE = (lo(X0) | (lo(X2) << 8)) << sh;
  uint32_t loO = (lo(X1) | (lo(X3) << 8)) << sh;
  hiE |= __shfl_xor_sync(0xffffffffu, hiE, 1);
  hiO |= __shfl_xor_sync(0xffffffffu, hiO, 1);
  loE |= __shfl_xor_sync(0xffffffffu, loE, 1);
  loO |= __shfl_xor_sync(0xffffffffu, loO, 1);
  if ((lane & 1) == 0 && 8 * (lane >> 1) < len) planes[lane >> 1] = make_uint4(hiE, hiO, loE, loO);
  int s = X0 + X1 + X2 + X3;  // exact
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  s += __shfl_xor_sync(0xffffffffu, s, 2);
  s += __shfl_xor_sync(0xffffffffu, s, 4);
  if ((lane & 7) == 0 && 32 * (lane >> 3) < len) sx[lane >> 3] = s;
  if (lane == 0) *sblk = sc.s;
}

// rows contiguous activation rows of K (src, f32, written by an earlier kernel: read through L2)
// into planes (row stride pstride vectors), sblk [rows][ceil(K/128)], sx [rows][K/32]. Warp w takes the
// blocks w, w + 8, ...; each warp loads kQuantBatch blocks before it quantises them. vec: src is
// 16-byte aligned (else 4-byte loads).
__device__ __forceinline__ void quantize_rows(const float* __restrict__ src, int rows, int K, bool vec, uint4* planes,
                                              int pstride, float* sblk, int* sx) {
  const int nb = (K + mi::kXBlock - 1) / mi::kXBlock, tasks = rows * nb;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int t0 = warp; t0 < tasks; t0 += kQuantBatch * kWarps) {
    float4 v[kQuantBatch];
#pragma unroll
    for (int j = 0; j < kQuantBatch; ++j) {
      const int t = t0 + j * kWarps;
      v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const int r = t / nb, kk = (t - r * nb) * mi::kXBlock + 4 * lane;  // row t / nb, block t % nb
      if (t < tasks && kk < K) {  // K % 4 == 0: a lane's 4 k are all in the row or all past it
        const float* p = src + size_t(r) * K + kk;
        v[j] = vec ? __ldcg(reinterpret_cast<const float4*>(p))
                   : make_float4(__ldcg(p), __ldcg(p + 1), __ldcg(p + 2), __ldcg(p + 3));
      }
    }
#pragma unroll
    for (int j = 0; j < kQuantBatch; ++j) {
      const int t = t0 + j * kWarps;  // warp-uniform
      if (t < tasks) {
        const int r = t / nb, b = t - r * nb;
        quantize_block(v[j], min(mi::kXBlock, K - b * mi::kXBlock), planes + size_t(r) * pstride + b * 16,
                       sblk + r * nb + b, sx + r * (K / 32) + b * 4);
      }
    }
  }
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

// The 4 group scales (8 bytes) straight into shared memory: no register holds them in flight;
// cp_async_wait_all before the barrier that precedes the fold.
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(uint32_t(__cvta_generic_to_shared(dst))), "l"(src)
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// kSub packed rows per sub-unit (4: U = 32; 8: U >= 64); kNs sub-units per item.
template <int kSub>
struct Item {
  static constexpr int kNs = kChunkRows / kSub;
  uint4 w[kChunkRows];  // packed rows k0/8 .. k0/8 + 7, columns n..n+3
  uint32_t z[kNs];      // the zero word of a sub-unit's group (asymmetric)
};

// Requests an item: its 8 rows into registers, its sub-units' zero words (asymmetric) into
// registers, and the scales of the groups its sub-units start into sc[grp·C + 0..3] (shared
// memory, the item's series and column quad).
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

// Step 3 for one output: D_u = the unit's sub-unit sums (exact), acc = fold_unit(acc, D_u, s_b,
// scale) over the units in ascending k from 0. dp / sc / sblk: the output's series (dp and sc at
// its column; stride C per sub-unit / group).
__device__ __forceinline__ float fold_output(const int* dp, const __half* sc, const float* sblk, int K, int C, int U,
                                             int g, int sub_k) {
  const int nu = K / U, spu = U / sub_k;
  float acc = 0.0f;
  for (int u = 0; u < nu; ++u) {
    int d = 0;
    for (int j = 0; j < spu; ++j) d += dp[(u * spu + j) * C];
    acc = mi::fold_unit(acc, d, sblk[u * U / mi::kXBlock], __half2float(sc[(u * U / g) * C]));
  }
  return acc;
}

// Runs this thread's items tid, tid + 256, ... < items with a two-item register ring: the next
// item's loads are issued before the current item is computed. `first` was loaded by the caller
// (item tid, when tid < items). load(Item&, i) / compute(const Item&, i).
template <int kSub, class Load, class Compute>
__device__ __forceinline__ void run_items(Item<kSub>& a, int items, Load load, Compute compute) {
  Item<kSub> b;
  for (int i = threadIdx.x; i < items; i += 2 * kThreads) {
    const int i2 = i + kThreads;
    if (i2 < items) load(b, i2);
    compute(a, i);
    if (i2 >= items) break;
    if (i2 + kThreads < items) load(a, i2 + kThreads);
    compute(b, i2);
  }
}

// ---- gate/up ---------------------------------------------------------------------------------

// Grid (I / C, M·k): CTA (column block, slot). See the header comment.
template <bool kSym, int kSub>
__global__ void __launch_bounds__(kThreads, 2)
    int_gate_up_kernel(const float* __restrict__ x, bool x_vec, const float* __restrict__ logits, int E, int k,
                       ExpertView gate, ExpertView up, int C, int U, int32_t* __restrict__ ids_out,
                       float* __restrict__ w_out, float* __restrict__ act) {
  extern __shared__ uint4 smem_up[];
  __shared__ int32_t s_ids[kWarps][kMaxTopK];
  __shared__ float s_w[kWarps][kMaxTopK];
  constexpr int kSubK = 8 * kSub;
  const int H = gate.K, I = gate.N, g = gate.group;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int slot = blockIdx.y, m = slot / k, r = slot - m * k;
  const int n0 = blockIdx.x * C, Q = C / 4, L = 2 * Q, nsu = H / kSubK, ng = H / g;
  const SmemLayout lay = up_layout(H, C, g, kSubK);
  char* base = reinterpret_cast<char*>(smem_up);
  uint4* planes = reinterpret_cast<uint4*>(base + lay.planes);
  int* dp = reinterpret_cast<int*>(base + lay.dp);
  __half* scs = reinterpret_cast<__half*>(base + lay.sc);
  float* ys = reinterpret_cast<float*>(base + lay.ys);
  float* sblk = reinterpret_cast<float*>(base + lay.sblk);
  int* sx = reinterpret_cast<int*>(base + lay.sx);

  pdl_wait();
  // Every warp routes the token (r + 1 arg-max rounds give chosen[r]; the publisher all k), so it
  // can request its first weights without a barrier.
  const bool publisher = blockIdx.x == 0 && r == 0 && warp == 0;
  route_token<8>(logits + size_t(m) * E, E, publisher ? k : r + 1, s_ids[warp], s_w[warp]);  // E <= 256
  __syncwarp();
  const int e = min(max(s_ids[warp][r], 0), E - 1);  // in range even for non-finite logits
  if (publisher && lane < k) {  // the down kernel reads the token's routing from here
    ids_out[size_t(m) * k + lane] = min(max(s_ids[0][lane], 0), E - 1);
    w_out[size_t(m) * k + lane] = s_w[0][lane];
  }
  const size_t qoff = size_t(e) * (H / 8) * I, soff = size_t(e) * ng * I, zoff = size_t(e) * ng * (I / 8);
  const int items = L * (H / 64);
  // Item i: lane = i % L (series s = lane / Q: 0 gate, 1 up; quad c = lane % Q), chunk i / L.
  auto load = [&](Item<kSub>& it, int i) {
    const int ln = i % L, ch = i / L, s = ln / Q, n = n0 + 4 * (ln - s * Q);
    const ExpertView& v = s ? up : gate;
    const Operand op{v.qweight + qoff + n, v.scales + soff + n, kSym ? nullptr : v.qzeros + zoff + n / 8};
    load_item<kSym, kSub>(it, op, I, g, ch * 64, scs + size_t(s) * ng * C + (n - n0), C);
  };
  auto compute = [&](const Item<kSub>& it, int i) {
    const int ln = i % L, ch = i / L, s = ln / Q, c = ln - s * Q, n = n0 + 4 * c, k0 = ch * 64;
    compute_item<kSym, kSub>(it, planes + k0 / 8, sx + k0 / 32, 4 * (n % 8), dp + (s * nsu + k0 / kSubK) * C + 4 * c,
                             C);
  };
  Item<kSub> a;
  if (tid < items) load(a, tid);
  quantize_rows(x + size_t(m) * H, 1, H, x_vec, planes, H / 8, sblk, sx);
  __syncthreads();
  pdl_launch_dependents();
  run_items<kSub>(a, items, load, compute);
  cp_async_wait_all();  // this thread's scales are in shared memory
  __syncthreads();
  if (tid < 2 * C) {
    const int s = tid / C, col = tid - s * C;
    ys[tid] = fold_output(dp + s * nsu * C + col, scs + size_t(s) * ng * C + col, sblk, H, C, U, g, kSubK);
  }
  __syncthreads();
  if (tid < C) act[size_t(slot) * I + n0 + tid] = silu_mul_rn(ys[tid], ys[C + tid]);
}

// ---- down + combine --------------------------------------------------------------------------

// Grid (H / C, M): CTA (column block, token), all k ranks in passes of kr. See the header comment.
template <bool kSym, int kSub>
__global__ void __launch_bounds__(kThreads, 2)
    int_down_kernel(const float* __restrict__ act, const int32_t* __restrict__ ids, const float* __restrict__ wts,
                    int k, int kr, ExpertView down, int C, int U, float* __restrict__ residual,
                    const float* __restrict__ shared, const float* __restrict__ gate_logit) {
  extern __shared__ uint4 smem_down[];
  __shared__ int32_t s_ids[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  __shared__ float s_res[kMaxCols], s_sh[kMaxCols], s_sig;
  constexpr int kSubK = 8 * kSub;
  const int H = down.N, I = down.K, g = down.group;
  const int tid = threadIdx.x;
  const int m = blockIdx.y, n0 = blockIdx.x * C, Q = C / 4, nsu = I / kSubK, ng = I / g, pstride = I / 8 + 1;
  const SmemLayout lay = down_layout(I, k, kr, C, g, kSubK);
  char* base = reinterpret_cast<char*>(smem_down);
  uint4* planes = reinterpret_cast<uint4*>(base + lay.planes);
  int* dp = reinterpret_cast<int*>(base + lay.dp);
  __half* scs = reinterpret_cast<__half*>(base + lay.sc);
  float* ys = reinterpret_cast<float*>(base + lay.ys);  // [k][C]
  float* sblk = reinterpret_cast<float*>(base + lay.sblk);
  int* sx = reinterpret_cast<int*>(base + lay.sx);

  pdl_wait();
  if (tid < k) {
    s_ids[tid] = __ldcg(ids + size_t(m) * k + tid);  // in range (clamped by gate/up)
    s_w[tid] = __ldcg(wts + size_t(m) * k + tid);
  }
  // The combine's inputs wait in shared memory (no registers held across the passes).
  if (tid < C) {
    s_res[tid] = __ldcg(residual + size_t(m) * H + n0 + tid);
    if (shared) s_sh[tid] = __ldcg(shared + size_t(m) * H + n0 + tid);
  } else if (tid == C && shared) {
    s_sig = 1.0f / (1.0f + __expf(-__ldcg(gate_logit + m)));  // combine_kernel's shared_scale
  }
  for (int r0 = 0; r0 < k; r0 += kr) {
    const int nr = min(kr, k - r0), L = nr * Q, items = L * (I / 64);
    // Item i: lane = i % L (rank r0 + rl, rl = lane / Q; quad c = lane % Q), chunk i / L.
    auto load_e = [&](Item<kSub>& it, int i, int e) {
      const int ln = i % L, ch = i / L, rl = ln / Q, n = n0 + 4 * (ln - rl * Q);
      const Operand op{down.qweight + size_t(e) * (I / 8) * H + n, down.scales + size_t(e) * ng * H + n,
                       kSym ? nullptr : down.qzeros + size_t(e) * ng * (H / 8) + n / 8};
      load_item<kSym, kSub>(it, op, H, g, ch * 64, scs + size_t(rl) * ng * C + (n - n0), C);
    };
    auto load = [&](Item<kSub>& it, int i) { load_e(it, i, s_ids[r0 + (i % L) / Q]); };
    auto compute = [&](const Item<kSub>& it, int i) {
      const int ln = i % L, ch = i / L, rl = ln / Q, c = ln - rl * Q, n = n0 + 4 * c, k0 = ch * 64;
      compute_item<kSym, kSub>(it, planes + size_t(rl) * pstride + k0 / 8, sx + rl * (I / 32) + k0 / 32, 4 * (n % 8),
                               dp + (rl * nsu + k0 / kSubK) * C + 4 * c, C);
    };
    Item<kSub> a;
    if (tid < items) {
      // s_ids is not visible before the barrier in the first pass: the expert straight from ids.
      const int rr = r0 + (tid % L) / Q;
      load_e(a, tid, r0 == 0 ? __ldcg(ids + size_t(m) * k + rr) : s_ids[rr]);
    }
    quantize_rows(act + (size_t(m) * k + r0) * I, nr, I, true, planes, pstride, sblk, sx);
    __syncthreads();
    if (r0 == 0) pdl_launch_dependents();
    run_items<kSub>(a, items, load, compute);
    cp_async_wait_all();  // this thread's scales are in shared memory
    __syncthreads();
    for (int t = tid; t < nr * C; t += kThreads) {
      const int rl = t / C, col = t - rl * C;
      ys[(r0 + rl) * C + col] = fold_output(dp + rl * nsu * C + col, scs + size_t(rl) * ng * C + col,
                                            sblk + rl * ((I + mi::kXBlock - 1) / mi::kXBlock), I, C, U, g, kSubK);
    }
    __syncthreads();  // ys complete; planes / dp / scs free for the next pass
  }
  if (tid < C) {
    float acc = 0.0f;
    for (int r = 0; r < k; ++r) acc = fmaf(s_w[r], ys[r * C + tid], acc);
    float o = s_res[tid] + acc;
    if (shared) o = fmaf(s_sig, s_sh[tid], o);
    residual[size_t(m) * H + n0 + tid] = o;
  }
}

// ---- host ------------------------------------------------------------------------------------

using UpKernel = void (*)(const float*, bool, const float*, int, int, ExpertView, ExpertView, int, int, int32_t*,
                          float*, float*);
using DownKernel = void (*)(const float*, const int32_t*, const float*, int, int, ExpertView, int, int, float*,
                            const float*, const float*);

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
  int smem_sm = 0, optin = 0, reserved = 0;
  int static_up = 0, static_down = 0;  // static shared memory of the kernels
};

const Caps& device_caps() {
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static Caps caps[kMaxDevices];
  static bool have[kMaxDevices] = {};
  int dev = 0;
  MOESERVE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) throw Error("moe_int: device index out of range");
  std::lock_guard<std::mutex> lock(mu);
  if (!have[dev]) {
    Caps c;
    MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&c.smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&c.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&c.reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
    auto opt_in = [&](auto kernel, int& static_bytes) {
      cudaFuncAttributes fa{};
      MOESERVE_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
      static_bytes = std::max(static_bytes, int(fa.sharedSizeBytes));
      MOESERVE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               c.optin - int(fa.sharedSizeBytes)));
      MOESERVE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                               int(cudaSharedmemCarveoutMaxShared)));
    };
    for (bool sym : {true, false})
      for (int sub : {4, 8}) {
        opt_in(up_kernel(sym, sub), c.static_up);
        opt_in(down_kernel(sym, sub), c.static_down);
      }
    caps[dev] = c;
    have[dev] = true;
  }
  return caps[dev];
}

struct Plan {
  int c_up = 0, c_down = 0, kr = 0;
  size_t smem_up = 0, smem_down = 0;
};

// Columns per CTA (and, for down, ranks per pass) whose CTA fits two per SM (else one) within
// the per-block limit: gate/up prefers 32 columns (a whole 128-byte line), down 16 (twice the
// CTAs of 32: 192 at M = 1 for H 3072) and all k ranks in one pass. None of it changes a bit.
Plan plan_int_decode(const MoeShape& s, int g_up, int sub_up, int g_down, int sub_down, const Caps& c) {
  Plan p;
  const int H = s.hidden, I = s.intermediate, k = s.top_k;
  for (int per_sm : {2, 1}) {
    const long budget = std::min<long>(c.optin, long(c.smem_sm) / per_sm - c.reserved);
    if (!p.c_up)
      for (int C : {32, 16, 8, 4})
        if (I % C == 0 && long(up_layout(H, C, g_up, sub_up).bytes) + c.static_up <= budget) {
          p.c_up = C;
          p.smem_up = size_t(up_layout(H, C, g_up, sub_up).bytes);
          break;
        }
    for (int kr = k; !p.c_down && kr >= 1; kr = kr == 1 ? 0 : (kr + 1) / 2)
      for (int C : {16, 8, 4})
        if (H % C == 0 && long(down_layout(I, k, kr, C, g_down, sub_down).bytes) + c.static_down <= budget) {
          p.c_down = C;
          p.kr = kr;
          p.smem_down = size_t(down_layout(I, k, kr, C, g_down, sub_down).bytes);
          break;
        }
  }
  if (!p.c_up || !p.c_down)
    throw Error("moe_int: the dp4a expert kernels' shared memory does not fit the device (H " + std::to_string(H) +
                ", I " + std::to_string(I) + ", k " + std::to_string(k) + ")");
  return p;
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
  char* ws = static_cast<char*>(workspace);
  int32_t* ids = reinterpret_cast<int32_t*>(ws + lay.ids);
  float* weights = reinterpret_cast<float*>(ws + lay.weights);
  float* act = reinterpret_cast<float*>(ws + lay.act);
  const int H = s.hidden, I = s.intermediate, k = s.top_k;
  const int u_up = mi::unit_length(int(ex.gate.group_size)), u_down = mi::unit_length(int(ex.down.group_size));
  const int sub_up = u_up == 32 ? 4 : 8, sub_down = u_down == 32 ? 4 : 8;  // packed rows per sub-unit
  // Symmetric: zero 8 (also an asymmetric weight stored without zeros, as int_form_linear).
  const bool sym_up = ex.gate.sym || ex.gate.qzeros.size() == 0 || ex.up.qzeros.size() == 0;
  const bool sym_down = ex.down.sym || ex.down.qzeros.size() == 0;
  const Caps& c = device_caps();
  const Plan p = plan_int_decode(s, int(ex.gate.group_size), 8 * sub_up, int(ex.down.group_size), 8 * sub_down, c);
  const bool x_vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  const dim3 grid_up(unsigned(I / p.c_up), unsigned(M * k));
  launch_pdl(true, up_kernel(sym_up, sub_up), grid_up, dim3(kThreads), p.smem_up, stream, x, x_vec, router_logits,
             s.num_experts, k, view_of(ex.gate), view_of(ex.up), p.c_up, u_up, ids, weights, act);
  if (shared_ready) MOESERVE_CUDA_CHECK(cudaStreamWaitEvent(stream, shared_ready, 0));  // down adds it
  const dim3 grid_down(unsigned(H / p.c_down), unsigned(M));
  launch_pdl(true, down_kernel(sym_down, sub_down), grid_down, dim3(kThreads), p.smem_down, stream,
             static_cast<const float*>(act), static_cast<const int32_t*>(ids), static_cast<const float*>(weights), k,
             p.kr, view_of(ex.down), p.c_down, u_down, residual, shared_out, shared_gate_logit);
}

}  // namespace moeserve::cuda::moe_int_detail
