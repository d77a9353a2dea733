// moe_int_detail::int_mma (ops_moe_int_internal.cuh): the integer-form GPTQ routed experts
// (moe_int_arith.h) on tensor cores, any M >= 1 (prompt steps and decode steps of more than
// moe_int_decode_max_tokens() tokens). mma.sync.m16n8k32 with s8 / u8 operands + ldmatrix +
// cp.async (sm_80+: no wgmma / TMA, so the H200 and the DGX Spark run the same code; <= 99 KB of
// dynamic shared memory per CTA, opted in lazily at the first launch).
//
// Steps (one stream, no host synchronisation):
//   1. route_and_group (ops_moe.cu, the routing of every other path): ids / weights per slot (slot =
//      token·k + rank), slots grouped by expert into tiles: at <= 4 slots per expert on average
//      tiles of 16 slots, else route_and_group_mixed's per-expert 64-slot tiles with a remainder of
//      <= 32 slots on a 32-slot tile (two tile lists over one order array).
//   2. quant_rows_kernel on x [M, H]: moe_int_arith.h step 1 per (row, 128-k block): X = 256·hi + lo
//      as two byte planes (hi = X >> 8 s8, lo = X & 0xFF u8), the block scale s_b, and per unit u of
//      U = unit_length(group) k the exact sums (Σ hi, Σ lo) (the zero-point term, see below).
//   3. gate_up kernel: act[slot, I] = silu_mul_rn(gate y, up y) (f32, by slot).
//   4. quant_rows_kernel on act [M·k, I] (unit of the down projection's group).
//   5. down kernel: y[slot, H] (f32).
//   6. combine_routed (ops_moe.cu): residual[m] += Σ_r w·y (+ sigmoid(gate)·shared, after shared_ready).
//
// Data layout (ops_moe_int_mma_layout.h). Byte planes [rows][K], k permuted inside every 32-k
// block: logical byte 16·h + 4·t + i holds physical k 8·t + 2·i + h (h = 0, 1; t, i = 0..3). The
// m16n8k32 fragments (PTX ISA): A (16 x 32, row-major) register r of lane (g = lane / 4, t = lane % 4)
// holds row g + 8·(r & 1), k 4·t + 16·(r >> 1) .. + 3; B (32 x 8, "col") register r holds column g,
// k 4·t + 16·r .. + 3. So ldmatrix.x4 of a 16-row x 32-byte A block gives A's registers (the bf16
// kernels' addressing), and GPTQ word t of a column's 32-k block (k 8t .. 8t + 7, nibble j = k 8t + j)
// gives that thread's two B registers with two masks: w & 0x0F0F0F0F (nibbles 0, 2, 4, 6: physical
// 8t + 2i, logical 4t + i) and (w >> 4) & 0x0F0F0F0F (nibbles 1, 3, 5, 7: logical 16 + 4t + i).
// Weights: GPTQ qweight [E][K/8][N] i32, scales f16 [E][K/g][N], qzeros [E][K/g][N/8] as loaded.
//
// Arithmetic of one output (row m, column n), moe_int_arith.h steps 2-3 exactly. Per unit u (U = 32,
// 64 or 128 k, never straddling a group or an activation block):
//   H_u = Σ_k q_k·hi_k, L_u = Σ_k q_k·lo_k by s8 x u8 and u8 x u8 MMAs (int32, exact), q = the raw nibble;
//   the zero point through the C operand: the unit's first MMA adds C0 = 0x4B400000 − z·Σhi (hi) and
//   0x4B400000 − z·Σlo (lo), so the accumulators end as the float bit patterns of 12582912 + H'
//   and 12582912 + L' with H' = Σ (q − z)·hi, L' = Σ (q − z)·lo (|H'| < 2^19, |L'| < 2^20 < 2^22:
//   the integer lies in the mantissa of 1.5·2^23, whose ulp is 1);
//   hf = bits − 12582912, lf likewise (both exact), d = fma(hf, 256, lf) = RN(256·H' + L') = RN(D_u),
//   the same value as __int2float_rn(D_u) (one rounding of the exact integer), with no I2F;
//   acc = fma(d, s_b(m)·scale(g(u), n), acc), units ascending from k = 0 (fold_unit).
// D_u is an exact integer whatever the tiling, so every tile size, M and neighbour gives a token
// the same bits, and the same bits as the dp4a kernels and gputest::int_form_linear.
//
// Parallelisation. Grid (ceil(N / BN), tile capacity of the list); CTA (nb, t) computes tile t's
// <= BM slots x the BN columns nb·BN.. (gate_up: BN of gate AND of up, so the SwiGLU is local);
// CTAs at or past the list's tile count exit at once. The CTA walks K in k tiles of BK = 128 (64
// when K % 128 != 0, then U <= 64) through a ring of kStages cp.async stages (kStages − 1 in
// flight), one __syncthreads per k tile; a stage holds whole units. Every warp owns one m16
// fragment (16 rows) and n8 tiles; compute is unit-major: per unit, its 2·U/32 ldmatrix.x4 (hi and
// lo planes) once, then per n8 tile one LDS.32 + 1 SHF + 2 LOP3 per 32-k block, a chain of U/32 hi
// MMAs and one of U/32 lo MMAs (C0 at the head), and the fold at once: the integer accumulators
// live for one tile, so the registers are acc + the unit's A fragments (no spills). Tilings:
//   large (BM 64, 64-slot list): 8 warps 4 x 2, warp tile 16 x 32 per matrix (gate_up BN 64 + 64) /
//     16 x 64 (down BN 128), 3 stages of 30,720 B (92,160 B), <= 255 registers: 1 CTA per SM.
//   mid (BM 32, 32-slot list): gate_up 4 warps 2 x 2, BN 64 + 64, 4 stages of 20,352 B (81,408 B),
//     2 CTAs per SM on the H200 (1 on the DGX Spark); down 8 warps 2 x 4, BN 256, 3 stages of
//     29,824 B (89,472 B), 1 CTA per SM. <= 255 registers.
//   small (BM 16, 16-slot list): 8 warps 1 x 8, warp tile 16 x 16 per matrix (gate_up BN 128 + 128)
//     / 16 x 32 (down BN 256), 4 stages of 24,640 B (98,560 B; 64-k tiles: 12,608 B), <= 128
//     registers: 2 CTAs per SM on the H200; decode-sized steps (1-4 slots per expert: the weight
//     stream is the bound), and every step whose H or I is not a multiple of 128.
// On sm_90 GPUs (sm_90a builds, units of 128 k) the large and mid lists run int_wgmma_launch
// (ops_moe_int_wgmma.cu) instead: the same tiles and bits on wgmma, 1.2-1.3x faster (PERF.md
// session 12); the small tiling stays here everywhere (its wgmma form was slower).
// 122B shape: M 64 runs the small tiling (512 slots <= 4·E): grid (8, 288) for gate_up and (12, 288)
// for down, ~220 tiles live; M 1,024 and 8,192 the mixed lists: grids (16, slots / 33) + (16, 256)
// for gate_up, (24, ..) + (12, 256) for down (tiles past each list's count exit at once).
// ptxas (CUDA 13.0, sm_90 / sm_121): no spills in any tiling; large and mid 178-208 registers (gate_up
// 179-208, down 178-203), small 110-128.
//
// Roofline (122B-A10B: E 256, top-8, H 3072, I 1024, GPTQ sym g128). Useful work 3·H·I·slots
// integer multiply-adds, 2 OP each (M 1,024: 8,192 slots, 155 G-OP; M 8,192: 1.24 T-OP); the MMAs execute it
// twice (hi and lo planes) at the s8 rate (~2x bf16; the bf16 kernels also execute it twice), plus
// the empty rows of partial m16 fragments. Weights: each expert with slots is read once per tile
// (HBM ~1.2 GB per layer at prefill sizes; later tiles of one expert mostly from L2: adjacent in
// the grid). L2 -> SM per k and CTA: A 2 bytes per row (x: BM·2, act: BM·2) against 0.5 bytes per
// weight column (large: 128 columns, mid down 256): large tiles 128 + 64 bytes per k. Activation traffic besides: x f32 read once and written as 2 planes (3 B/elem),
// act f32 written once and read once by its quantiser (M·k·I·8 bytes), y f32 written and read once
// by the combine (M·k·H·8 bytes). Instructions per warp, unit and n8 tile (U = 128): 4 LDS.32 +
// 12 integer (the B registers), 8 MMAs, the fold 1 LDS + 2 HADD2.F32 + 4 FMUL + 8 FADD + 8 FFMA;
// per unit and warp besides 8 ldmatrix.x4 and 2 LDS.64 (sums). Small gate_up (4 tiles per warp, 512
// words per unit): ~205 warp instructions per unit, ~13 thread instructions per weight word, plus
// ~3 for the copies (hoisted sources: one cp.async + a constant offset per chunk).
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/moe_int_arith.h"
#include "backend/cuda/ops_mma_frag.cuh"
#include "backend/cuda/ops_moe_int_internal.cuh"
#include "backend/cuda/ops_moe_int_mma_layout.h"
#include "backend/cuda/ops_moe_internal.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace moeserve::cuda::moe_int_detail {
namespace {

using namespace moe_detail;
using mma_frag::cp_async16;
using mma_frag::cp_async4;
using mma_frag::cp_async_commit;
using mma_frag::cp_async_wait;
using mma_frag::ldmatrix_x4;

constexpr int kSmemBudget = 99 * 1024;  // the DGX Spark's per-block limit
constexpr int kSmallBM = 16;            // tiles of the small tiling (route_and_group)
constexpr int kQuantThreads = 256;      // quant_rows_kernel: 16 (row, block) items per CTA

constexpr int cmin(int a, int b) { return a < b ? a : b; }

// ---- quantisation of activation rows (moe_int_arith.h step 1) ---------------------------------

// One half-warp per (row, 128-k block): lane l (0..15) owns the physical k 8l .. 8l + 7 of the
// block, i.e. word t = l % 4 of 32-k block c = l / 4: its even k (X bytes in k order) form the
// 4-byte word at logical 32c + 4t, its odd k the word at 32c + 16 + 4t, in both planes. amax by a
// shuffle tree over the half (max is exact in any order); x_scale / quantize_x as the CPU
// reference; (Σ hi, Σ lo) per unit of U k (U / 8 lanes, exact integer sums). Reads 4 bytes and
// writes 2 bytes per element (+ 12 bytes per 128-k block and unit).
__global__ void __launch_bounds__(kQuantThreads)
    quant_rows_kernel(const float* __restrict__ in, int rows, int K, int U, bool vec_ok, uint32_t* __restrict__ hi,
                      uint32_t* __restrict__ lo, float* __restrict__ sb, int2* __restrict__ sums) {
  const int blocks = (K + moe_int::kXBlock - 1) / moe_int::kXBlock;  // a row's last block may be short
  const long long item = (static_cast<long long>(blockIdx.x) * kQuantThreads + threadIdx.x) >> 4;
  const int l = int(threadIdx.x & 15);
  const bool in_range = item < static_cast<long long>(rows) * blocks;  // whole half-warps; shuffles need all lanes
  const int row = in_range ? int(item / blocks) : 0, b = in_range ? int(item % blocks) : 0;
  // A short last block (K % 128 == 64): lanes past the row's end hold zeros and write nothing.
  const bool valid = in_range && b * moe_int::kXBlock + 8 * l < K;
  const size_t k0 = size_t(row) * K + size_t(b) * moe_int::kXBlock + size_t(8 * l);
  float v[8];
  if (valid && vec_ok) {
    const float4 p = __ldg(reinterpret_cast<const float4*>(in + k0));
    const float4 q = __ldg(reinterpret_cast<const float4*>(in + k0 + 4));
    v[0] = p.x, v[1] = p.y, v[2] = p.z, v[3] = p.w, v[4] = q.x, v[5] = q.y, v[6] = q.z, v[7] = q.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = valid ? __ldg(in + k0 + i) : 0.0f;
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const moe_int::XScale sc = moe_int::x_scale(amax);
  uint32_t eh = 0, oh = 0, el = 0, ol = 0;
  int shi = 0, slo = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int X = moe_int::quantize_x(v[i], sc.inv);
    const int h = X >> 8;      // arithmetic: [-128, 127]
    const int lb = X & 0xFF;   // [0, 255]; X = 256·h + lb
    shi += h;
    slo += lb;
    const int sh = 8 * (i >> 1);
    if (i & 1) {
      oh |= (uint32_t(h) & 0xFFu) << sh;
      ol |= uint32_t(lb) << sh;
    } else {
      eh |= (uint32_t(h) & 0xFFu) << sh;
      el |= uint32_t(lb) << sh;
    }
  }
  for (int o = 1; o < (U >> 3); o <<= 1) {  // the U / 8 lanes of a unit (uniform over the launch)
    shi += __shfl_xor_sync(0xffffffffu, shi, o);
    slo += __shfl_xor_sync(0xffffffffu, slo, o);
  }
  if (!valid) return;
  const size_t w = (size_t(row) * K + size_t(b) * moe_int::kXBlock + size_t(32 * (l >> 2) + 4 * (l & 3))) / 4;
  hi[w] = eh;
  hi[w + 4] = oh;
  lo[w] = el;
  lo[w + 4] = ol;
  if ((l & ((U >> 3) - 1)) == 0)
    sums[size_t(row) * (K / U) + size_t((b * moe_int::kXBlock + 8 * l) / U)] = make_int2(shi, slo);
  if (l == 0) sb[size_t(row) * blocks + b] = sc.s;
}

void quant_rows(const float* in, int rows, int K, int U, uint8_t* hi, uint8_t* lo, float* sb, int2* sums,
                cudaStream_t stream) {
  const long long items = static_cast<long long>(rows) * ((K + moe_int::kXBlock - 1) / moe_int::kXBlock);
  const long long grid = (items + kQuantThreads / 16 - 1) / (kQuantThreads / 16);
  if (grid <= 0) return;
  const bool vec_ok = reinterpret_cast<uintptr_t>(in) % 16 == 0;
  quant_rows_kernel<<<unsigned(grid), kQuantThreads, 0, stream>>>(in, rows, K, U, vec_ok,
                                                                   reinterpret_cast<uint32_t*>(hi),
                                                                   reinterpret_cast<uint32_t*>(lo), sb, sums);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

// ---- the expert GEMM ---------------------------------------------------------------------------

// d = a·b + c over one m16n8k32 step: A = X's high bytes (s8) or low bytes (u8), B = GPTQ nibbles (u8).
// Not volatile: the data dependence through c keeps each output's order (which is irrelevant here:
// integer sums are exact).
__device__ __forceinline__ void mma_hi(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int c0, int c1,
                                       int c2, int c3) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c0), "r"(c1), "r"(c2), "r"(c3));
}
__device__ __forceinline__ void mma_lo(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int c0, int c1,
                                       int c2, int c3) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c0), "r"(c1), "r"(c2), "r"(c3));
}

__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(__cvta_generic_to_global(src))
               : "memory");
}

// One CTA shape: kMats = 2 (gate_up: B columns [0, BN) gate, [BN, 2·BN) up) or 1 (down); BM slots x
// BN columns per matrix; WM x WN warps; k tile BK (128, or 64 for a K that is not a multiple of 128):
// a stage holds whole units (BK % U == 0, the launcher checks) and never straddles a 128-k
// activation block. Stage layout (bytes): A hi [BM][AS], A lo [BM][AS], weight words
// [BK/8][kWStride] u32, then per unit slot (the BK / U units of the stage): scales f16 [kSlots][BR],
// zero words [kSlots][BR/8], then the rows' block scales f32 [BM] and unit sums int2 [BM][kSlots].
template <int kMats_, int BM_, int BN_, int WM_, int WN_, int BK_, int kMaxStages, int kMinBlocks_>
struct Tiling {
  static constexpr int kMats = kMats_, BM = BM_, BN = BN_, WM = WM_, WN = WN_, BK = BK_, kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kWarpM = BM / WM, kWarpN = BN / WN;  // warp tile: rows, columns per matrix
  static constexpr int MI = kWarpM / 16, NI = kWarpN / 8;
  static constexpr int BR = kMats * BN;  // weight columns per CTA
  static constexpr int AS = BK + 16;     // bytes per A row: an odd number of 16-byte units (conflict-free ldmatrix)
  static constexpr int kAPlane = BM * AS;
  // Word rows padded by 8 words: the 4 threads of an MMA group (t = 0..3: word rows t of a 32-k
  // block, the same column) and its 8 groups (8 columns) hit 32 different banks.
  static constexpr int kWStride = BR + 8;
  static constexpr int kSlots = BK / 32;  // unit slots per stage (U >= 32)
  static constexpr int kBOff = 2 * kAPlane;
  static constexpr int kScaleOff = kBOff + (BK / 8) * kWStride * 4;
  static constexpr int kZeroOff = kScaleOff + kSlots * BR * 2;
  static constexpr int kSbOff = kZeroOff + kSlots * (BR / 8) * 4;
  static constexpr int kSumOff = kSbOff + BM * 4;
  static constexpr int kStageBytes = (kSumOff + BM * kSlots * 8 + 15) / 16 * 16;
  static constexpr int kStages = cmin(kMaxStages, kSmemBudget / kStageBytes);
  static constexpr int kSmemBytes = kStages * kStageBytes;
  // Copy chunks of 16 bytes: A rows (BK / 16 per row and plane), weight word rows (BR / 4 per k/8
  // row), scales (BR / 8 per unit slot).
  static constexpr int kACPR = BK / 16, kAChunks = 2 * BM * kACPR;
  static constexpr int kWCPR = BR / 4, kWChunks = (BK / 8) * kWCPR;
  static constexpr int kSCPR = BR / 8, kSChunks = kSlots * kSCPR;
  static_assert(kWarpM % 16 == 0 && kWarpN % 8 == 0, "warp tile");
  static_assert(BK == 64 || BK == 128, "k tiles inside one 128-k activation block");
  static_assert(BR % 32 == 0, "zero words and bank padding");
  static_assert(kAPlane % 16 == 0 && kScaleOff % 16 == 0 && kZeroOff % 16 == 0 && kSbOff % 16 == 0 &&
                    kSumOff % 16 == 0,
                "16-byte aligned stage regions");
  static_assert(kThreads >= BM && kThreads >= kSChunks, "one thread per row / scale chunk");
  static_assert(kWChunks % kThreads == 0 && kThreads % kWCPR == 0, "whole weight chunks per thread, one column");
  static_assert(kThreads % kACPR == 0, "one k offset per thread's A chunks");
  static_assert(kStages >= 2, "at least double buffering");
  static_assert(kSmemBytes <= 99 * 1024, "DGX Spark: <= 99 KB of shared memory per block");
};

// Warp tiles of one m16 fragment (the unit's A registers shared by all the warp's n8 tiles), 8 n8
// tiles per warp in large and mid (gate_up 16 x 32 per matrix, down 16 x 64), up to 255 registers
// per thread there (the ILP of 8 independent tiles per warp instead of more warps): large BM 64,
// 8 warps 4 x 2, gate_up BN 64 + 64, down BN 128; mid BM 32, gate_up BN 64 + 64 on 4 warps 2 x 2
// (2 CTAs per SM on the H200), down BN 256 on 8 warps 2 x 4. Small: 16 x 16 per matrix / 16 x 32,
// <= 128 registers, 2 CTAs per SM.
template <int kMats> using LargeT = Tiling<kMats, 64, (kMats == 2 ? 64 : 128), 4, 2, 128, 3, 1>;
template <int kMats>
using MidT = Tiling<kMats, 32, (kMats == 2 ? 64 : 256), 2, (kMats == 2 ? 2 : 4), 128, (kMats == 2 ? 4 : 3),
                    (kMats == 2 ? 2 : 1)>;
template <int kMats> using SmallT = Tiling<kMats, kSmallBM, (kMats == 2 ? 128 : 256), 1, 8, 128, 4, 2>;
// The small tiling with 64-k tiles, for a K that is not a multiple of 128 (moe_int_arith.h: K % 64 == 0;
// then U <= 64); the launcher sends every tile of such a step to it.
template <int kMats> using SmallT64 = Tiling<kMats, kSmallBM, (kMats == 2 ? 128 : 256), 1, 8, 64, 4, 2>;

// One CTA: tile blockIdx.y (slots order[start .. start + count) of expert e) x columns blockIdx.x·BN ..
// of w0 (and w1). A row of tile row r: slot / row_div (gate_up: the token, row_div = top_k; down:
// the slot, row_div = 1). Output row: the slot (gate_up: act = silu(gate)·up; down: y).
// kSym: every zero point is 8 (no zero words read).
//
// Compute order (unit-major): per stage, per m16 fragment mi and unit j of the stage, the unit's A
// fragments (UB = U / 32 blocks x 2 planes, 8·UB registers) are loaded once; then per n8 tile the
// unit's hi MMAs run as one chain and its lo MMAs as another (C0 = the bias and zero term at the
// chain's head), and the unit is folded into acc at once. So the integer accumulators live for one
// tile only: per thread acc (4·kMats·MI·NI f32) + 8·UB A registers + a few transients.
template <class T, bool kSym>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks)
    int_mma_kernel(APlanes a, int row_div, int U, TileList tiles, ExpertView w0, ExpertView w1,
                   float* __restrict__ out) {
  constexpr int kMats = T::kMats, BM = T::BM, BN = T::BN, BK = T::BK, BR = T::BR, AS = T::AS;
  constexpr int MI = T::MI, NI = T::NI, kThreads = T::kThreads, kStages = T::kStages, kSlots = T::kSlots;
  constexpr int kStageBytes = T::kStageBytes, kAPlane = T::kAPlane;

  const int t = int(blockIdx.y);
  if (t >= *tiles.num_tiles) return;  // uniform over the CTA, before any barrier
  const int e = tiles.expert[t], start = tiles.start[t], count = tiles.count[t];
  const int N = w0.N, K = w0.K, gsize = w0.group;
  const int n0 = int(blockIdx.x) * BN;
  const int ushift = 31 - __clz(U);  // U = 32, 64 or 128, U <= BK
  const int ub = U >> 5;             // 32-k blocks per unit
  const int unit_slots = BK >> ushift;
  const int units_per_row = K >> ushift, blocks_per_row = (K + moe_int::kXBlock - 1) / moe_int::kXBlock;

  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t sbase = uint32_t(__cvta_generic_to_shared(smem));

  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / T::WN, warp_n = warp % T::WN;
  const int gq = lane >> 2, t4 = lane & 3;  // fragment row group, thread in group

  // Rows no copy fills (past the slot count) and columns past N stay zero: every MMA input is defined.
  for (int i = tid; i < T::kSmemBytes / 16; i += kThreads) reinterpret_cast<uint4*>(smem)[i] = make_uint4(0u, 0u, 0u, 0u);

  // ---- this thread's copies, hoisted: sources at k0 = 0 (advanced by k0 per tile), stage offsets ----
  // A: chunks c = tid + i·kThreads (plane, row, 16-byte part); the part is the same for every i.
  constexpr int kAPer = (T::kAChunks + kThreads - 1) / kThreads, kAPlaneChunks = BM * T::kACPR;
  const int apart = tid % T::kACPR;
  const uint8_t* asrc[kAPer];  // null: no chunk, or a row past the tile's count
#pragma unroll
  for (int i = 0; i < kAPer; ++i) {
    const int c = tid + i * kThreads, plane = c / kAPlaneChunks, r = (c % kAPlaneChunks) / T::kACPR;
    asrc[i] = c < T::kAChunks && r < count
                  ? (plane ? a.lo : a.hi) + size_t(tiles.order[start + r] / row_div) * K + apart * 16
                  : nullptr;
  }
  // Weights: chunks c = tid + i·kThreads, word row kw0 + i·kThreads / kWCPR, the same 4 columns.
  constexpr int kWPer = T::kWChunks / kThreads, kWRowStep = kThreads / T::kWCPR;
  const int wcol = (tid % T::kWCPR) * 4, wkw0 = tid / T::kWCPR;
  const bool wm1 = kMats == 2 && wcol >= BN;
  const int wn = n0 + wcol - (wm1 ? BN : 0);
  const bool wvalid = wn < N;  // N % 4 == 0: a chunk is all in or all out
  const int32_t* wsrc = (wm1 ? w1.qweight : w0.qweight) + (size_t(e) * (K / 8) + wkw0) * N + wn;
  const uint32_t wdst = uint32_t(T::kBOff + (wkw0 * T::kWStride + wcol) * 4);
  // Scales (and zero words): one chunk of 8 columns of unit slot ss per thread (tid < kSChunks).
  const int ss = tid / T::kSCPR, scol = (tid % T::kSCPR) * 8;
  const bool sm1 = kMats == 2 && scol >= BN;
  const int sn = n0 + scol - (sm1 ? BN : 0);
  const bool svalid = tid < T::kSChunks && ss < unit_slots && sn < N;
  const __half* sscales = sm1 ? w1.scales : w0.scales;
  const int32_t* szeros = sm1 ? w1.qzeros : w0.qzeros;
  // Row metadata: thread tid < count copies row tid's block scale and unit sums.
  const int mrow = tid < BM && tid < count ? tiles.order[start + tid] / row_div : -1;

  auto load_tile = [&](int stage, int k0) {
    const uint32_t st = sbase + uint32_t(stage * kStageBytes);
#pragma unroll
    for (int i = 0; i < kAPer; ++i) {
      if (asrc[i] == nullptr) continue;
      const int c = tid + i * kThreads, plane = c / kAPlaneChunks, r = (c % kAPlaneChunks) / T::kACPR;
      cp_async16(st + uint32_t(plane * kAPlane + r * AS + apart * 16), asrc[i] + k0);
    }
    if (wvalid) {
      const int32_t* src = wsrc + size_t(k0 / 8) * N;
#pragma unroll
      for (int i = 0; i < kWPer; ++i)
        cp_async16(st + wdst + uint32_t(i * kWRowStep * T::kWStride * 4), src + size_t(i * kWRowStep) * N);
    }
    if (svalid) {
      const size_t grow = size_t(e) * (K / gsize) + size_t((k0 + (ss << ushift)) / gsize);  // the slot's group
      cp_async16(st + uint32_t(T::kScaleOff + (ss * BR + scol) * 2), sscales + grow * N + sn);
      if (!kSym)
        cp_async4(st + uint32_t(T::kZeroOff + (ss * (BR / 8) + scol / 8) * 4), szeros + grow * (N / 8) + sn / 8);
    }
    if (mrow >= 0) {
      cp_async4(st + uint32_t(T::kSbOff + tid * 4), a.sb + size_t(mrow) * blocks_per_row + k0 / moe_int::kXBlock);
      const int2* src = a.sums + size_t(mrow) * units_per_row + (k0 >> ushift);
      for (int s = 0; s < unit_slots; ++s) cp_async8(st + uint32_t(T::kSumOff + (tid * kSlots + s) * 8), src + s);
    }
  };

  // ---- fragments ----
  uint32_t a_off[MI];
  bool active[MI];  // the m16 fragment holds at least one of the tile's slots (warp-uniform)
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
    a_off[mi] = uint32_t((warp_m * T::kWarpM + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * AS + (lane >> 4) * 16);
    active[mi] = warp_m * T::kWarpM + mi * 16 < count;
  }
  const bool any_active = active[0];
  // This lane's word of a tile's first column (word row t4 of a 32-k block, column gq), and its two
  // output columns 2·t4, 2·t4 + 1 (scales); per (mat, ni, block) compile-time offsets on top.
  const int wcol0 = warp_n * T::kWarpN;
  const uint32_t b_off = uint32_t(T::kBOff + (t4 * T::kWStride + wcol0 + gq) * 4);
  const uint32_t s_off = uint32_t(T::kScaleOff + (wcol0 + 2 * t4) * 2);

  float acc[kMats][MI][NI][4];  // the fold over units
#pragma unroll
  for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[mat][mi][ni][q] = 0.0f;

  // One stage, units of UB 32-k blocks. Per output the units run in ascending k (j ascending, stages
  // ascending): fold_unit's order.
  auto compute_stage = [&](const unsigned char* stp, uint32_t st, auto ub_c) {
    constexpr int UB = decltype(ub_c)::value;
    constexpr int kUnits = BK / 32 / UB;
    const float* sbr = reinterpret_cast<const float*>(stp + T::kSbOff);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      if (mi > 0 && !active[mi]) continue;  // warp-uniform (fragment 0 is active here)
      const int r0 = warp_m * T::kWarpM + mi * 16 + gq;
      const float sb0 = sbr[r0], sb1 = sbr[r0 + 8];  // rows r0, r0 + 8: C elements q < 2, q >= 2
#pragma unroll 1  // units of one stage one after the other (no A fragments of the next unit hoisted)
      for (int j = 0; j < kUnits; ++j) {
        uint32_t ah[UB][4], al[UB][4];
#pragma unroll
        for (int kb = 0; kb < UB; ++kb) {
          ldmatrix_x4(st + a_off[mi] + uint32_t(32 * (j * UB + kb)), ah[kb]);
          ldmatrix_x4(st + uint32_t(kAPlane) + a_off[mi] + uint32_t(32 * (j * UB + kb)), al[kb]);
        }
        // The rows' (Σ hi, Σ lo) of unit j: the zero term at each chain's head.
        const int2 s0 = *reinterpret_cast<const int2*>(stp + T::kSumOff + (r0 * kSlots + j) * 8);
        const int2 s1 = *reinterpret_cast<const int2*>(stp + T::kSumOff + ((r0 + 8) * kSlots + j) * 8);
#pragma unroll
        for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            const int cb = mat * BN + ni * 8;  // the n8 tile's first column, relative to wcol0
            int z0 = 8, z1 = 8;                // zero points of this lane's columns 2·t4, 2·t4 + 1
            if constexpr (!kSym) {
              const uint32_t zw = *reinterpret_cast<const uint32_t*>(
                  stp + T::kZeroOff + (j * (BR / 8) + (wcol0 + cb) / 8) * 4);
              z0 = int((zw >> (8 * t4)) & 0xFu) + 1;
              z1 = int((zw >> (8 * t4 + 4)) & 0xFu) + 1;
            }
            uint32_t bl[UB], bh[UB];  // nibbles 0, 2, 4, 6 and 1, 3, 5, 7 of word t4 of each block
#pragma unroll
            for (int kb = 0; kb < UB; ++kb) {
              const uint32_t w = *reinterpret_cast<const uint32_t*>(
                  stp + b_off + ((j * UB + kb) * 4 * T::kWStride + cb) * 4);
              bl[kb] = w & 0x0F0F0F0Fu;
              bh[kb] = (w >> 4) & 0x0F0F0F0Fu;
            }
            int ch[4], cl[4];
            mma_hi(ch, ah[0], bl[0], bh[0], kMagicBits - z0 * s0.x, kMagicBits - z1 * s0.x, kMagicBits - z0 * s1.x,
                   kMagicBits - z1 * s1.x);
            mma_lo(cl, al[0], bl[0], bh[0], kMagicBits - z0 * s0.y, kMagicBits - z1 * s0.y, kMagicBits - z0 * s1.y,
                   kMagicBits - z1 * s1.y);
#pragma unroll
            for (int kb = 1; kb < UB; ++kb) {
              mma_hi(ch, ah[kb], bl[kb], bh[kb], ch[0], ch[1], ch[2], ch[3]);
              mma_lo(cl, al[kb], bl[kb], bh[kb], cl[0], cl[1], cl[2], cl[3]);
            }
            // fold_unit: acc = fma(RN(D_u), s_b·scale, acc); this lane's columns' adjacent f16 scales.
            const float2 sp =
                __half22float2(*reinterpret_cast<const __half2*>(stp + s_off + (j * BR + cb) * 2));
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const float hf = __fsub_rn(__int_as_float(ch[q]), kMagic);
              const float lf = __fsub_rn(__int_as_float(cl[q]), kMagic);
              const float d = __fmaf_rn(hf, 256.0f, lf);
              acc[mat][mi][ni][q] =
                  __fmaf_rn(d, __fmul_rn(q < 2 ? sb0 : sb1, (q & 1) ? sp.y : sp.x), acc[mat][mi][ni][q]);
            }
          }
      }
    }
  };

  // ---- the cp.async ring: kStages − 1 k tiles in flight while one is computed ----
  __syncthreads();  // the zeroing is done before any copy lands
  const int kt_count = K / BK;  // K % BK == 0 (the launcher picks BK 64 when K % 128 != 0)
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < kt_count) load_tile(s, s * BK);
    cp_async_commit();  // always commit (possibly empty): the group count stays uniform
  }
  for (int kt = 0; kt < kt_count; ++kt) {
    cp_async_wait<kStages - 2>();  // this thread's copies of tile kt have landed
    __syncthreads();               // everyone's have; everyone finished computing tile kt − 1
    const int next = kt + kStages - 1;
    if (next < kt_count) load_tile(next % kStages, next * BK);  // the stage of tile kt − 1
    cp_async_commit();
    if (any_active) {  // warp-uniform
      const int stage = kt % kStages;
      const unsigned char* stp = smem + stage * kStageBytes;
      const uint32_t st = sbase + uint32_t(stage * kStageBytes);
      if (BK == 128 && ub == 4)  // uniform over the launch
        compute_stage(stp, st, std::integral_constant<int, BK == 128 ? 4 : 2>{});
      else if (ub == 2)
        compute_stage(stp, st, std::integral_constant<int, 2>{});
      else
        compute_stage(stp, st, std::integral_constant<int, 1>{});
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: C element q of (mi, ni) is row gq (+8 for q >= 2), column 2·t4 + (q & 1) ----
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
    if (!active[mi]) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp_m * T::kWarpM + mi * 16 + gq + h * 8;
      if (r >= count) continue;
      float* orow = out + size_t(tiles.order[start + r]) * N;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int n = n0 + warp_n * T::kWarpN + ni * 8 + 2 * t4;  // N is even: n < N means n + 1 < N
        if (n >= N) continue;
        float2 v;
        if constexpr (kMats == 2) {
          v.x = silu_mul_rn(acc[0][mi][ni][2 * h], acc[1][mi][ni][2 * h]);
          v.y = silu_mul_rn(acc[0][mi][ni][2 * h + 1], acc[1][mi][ni][2 * h + 1]);
        } else {
          v = make_float2(acc[0][mi][ni][2 * h], acc[0][mi][ni][2 * h + 1]);
        }
        *reinterpret_cast<float2*>(orow + n) = v;
      }
    }
  }
}

// ---- host side ----------------------------------------------------------------------------------

template <class T, bool kSym>
void launch_one(const APlanes& a, int row_div, int U, const TileList& tiles, int grid_tiles, const ExpertView& w0,
                const ExpertView& w1, float* out, cudaStream_t stream) {
  if (grid_tiles <= 0) return;
  if (T::BK % U != 0) throw Error("moe_int_mma: a k tile must hold whole units");
  // Per device, before the first launch (a cudaFuncSetAttribute, not a stream operation); the
  // largest carve-out so that two 2-CTA tilings share an SM.
  opt_in_dynamic_smem<int_mma_kernel<T, kSym>>(T::kSmemBytes, true);
  const dim3 grid(unsigned((w0.N + T::BN - 1) / T::BN), unsigned(grid_tiles));
  int_mma_kernel<T, kSym><<<grid, T::kThreads, T::kSmemBytes, stream>>>(a, row_div, U, tiles, w0, w1, out);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_sym(bool sym, const APlanes& a, int row_div, int U, const TileList& tiles, int grid_tiles,
                const ExpertView& w0, const ExpertView& w1, float* out, cudaStream_t stream) {
  if (sym)
    launch_one<T, true>(a, row_div, U, tiles, grid_tiles, w0, w1, out, stream);
  else
    launch_one<T, false>(a, row_div, U, tiles, grid_tiles, w0, w1, out, stream);
}

// Symmetric GPTQ, or no zero points stored: z = 8 everywhere (as gputest::int_form_linear).
bool all_zero_eight(const DeviceLinear& d) { return d.sym || d.qzeros.size() == 0; }

}  // namespace

size_t int_mma_workspace_bytes(const MoeShape& s, int max_tokens) { return int_mma_layout(s, max_tokens).total; }

void int_mma(const float* x, const float* router_logits, const MoeShape& s, const DeviceExperts& ex, int M,
             void* workspace, size_t workspace_bytes, float* residual, const float* shared_out,
             const float* shared_gate_logit, cudaStream_t stream, cudaEvent_t shared_ready) {
  if ((shared_out == nullptr) != (shared_gate_logit == nullptr))
    throw Error("moe_int_mma: the shared expert output and its gate logit come together");
  if (M <= 0) return;
  const int Ugu = moe_int::unit_length(int(ex.gate.group_size)), Ud = moe_int::unit_length(int(ex.down.group_size));
  if (Ugu < 32 || Ud < 32) throw Error("moe_int_mma: GPTQ groups below 32 are not supported by the MMA kernels");
  const IntMmaLayout L = int_mma_layout(s, M);
  if (workspace_bytes < L.total) throw Error("moe_int_mma: workspace too small for " + std::to_string(M) + " tokens");
  auto* base = static_cast<uint8_t*>(workspace);
  auto* ids = reinterpret_cast<int32_t*>(base + L.ids);
  auto* weights = reinterpret_cast<float*>(base + L.weights);
  auto* order = reinterpret_cast<int32_t*>(base + L.order);
  auto* num_tiles = reinterpret_cast<int32_t*>(base + L.num_tiles);
  auto* tile_expert = reinterpret_cast<int32_t*>(base + L.tile_expert);
  auto* tile_start = reinterpret_cast<int32_t*>(base + L.tile_start);
  auto* tile_count = reinterpret_cast<int32_t*>(base + L.tile_count);
  auto* act = reinterpret_cast<float*>(base + L.act);
  auto* y = reinterpret_cast<float*>(base + L.y);
  const APlanes xa{base + L.x_hi, base + L.x_lo, reinterpret_cast<const float*>(base + L.x_sb),
                   reinterpret_cast<const int2*>(base + L.x_sum)};
  const APlanes aa{base + L.a_hi, base + L.a_lo, reinterpret_cast<const float*>(base + L.a_sb),
                   reinterpret_cast<const int2*>(base + L.a_sum)};

  const int H = s.hidden, I = s.intermediate, k = s.top_k;
  const long long slots = static_cast<long long>(M) * k;
  // Tile sizes by the average slots per expert (any choice gives the same bits): <= 4, the small
  // tiling (decode-sized steps: many CTAs stream the weights); above, per-expert 64-slot tiles and
  // a remainder of <= 32 slots on a 32-slot tile (route_and_group_mixed).
  // K % 128 != 0 (test shapes: the 64-k tiles serve them): the small tiling at any M.
  const bool short_k = H % 128 != 0 || I % 128 != 0;
  const bool small = short_k || slots <= 4LL * s.num_experts;
  const int mid_cap = mixed_mid_cap(int(slots), s.num_experts), large_cap = mixed_large_cap(int(slots));
  const int small_grid = max_tiles(int(slots), s.num_experts, kSmallBM);
  if (static_cast<long long>(small ? small_grid : std::max(mid_cap, large_cap)) > 65535)
    throw Error("moe_int_mma: too many tokens for one launch");
  if (small)
    route_and_group(router_logits, s, M, kSmallBM, ids, weights, num_tiles, tile_expert, tile_start, tile_count, order,
                    stream);
  else  // the 32-slot list at [0, mid_cap), the 64-slot list at [mid_cap, mid_cap + large_cap) (<= L.tiles)
    route_and_group_mixed(router_logits, s, M, ids, weights, num_tiles, tile_expert, tile_start, tile_count, mid_cap,
                          order, stream);

  quant_rows(x, M, H, Ugu, base + L.x_hi, base + L.x_lo, reinterpret_cast<float*>(base + L.x_sb),
             reinterpret_cast<int2*>(base + L.x_sum), stream);

  const ExpertView g = view_of(ex.gate), u = view_of(ex.up), d = view_of(ex.down);
  const bool gsym = all_zero_eight(ex.gate) && all_zero_eight(ex.up), dsym = all_zero_eight(ex.down);
  const TileList list{num_tiles, tile_expert, tile_start, tile_count, order};
  const TileList large{num_tiles + 1, tile_expert + mid_cap, tile_start + mid_cap, tile_count + mid_cap, order};
  if (small && H % 128 != 0) {
    launch_sym<SmallT64<2>>(gsym, xa, k, Ugu, list, small_grid, g, u, act, stream);
  } else if (small) {
    launch_sym<SmallT<2>>(gsym, xa, k, Ugu, list, small_grid, g, u, act, stream);
  } else if (int_wgmma_serves(Ugu, H, I, M)) {  // Hopper: the same tiles on wgmma (ops_moe_int_wgmma.cu)
    int_wgmma_launch(2, 64, gsym, xa, k, large, large_cap, g, u, act, stream);
    int_wgmma_launch(2, 32, gsym, xa, k, list, mid_cap, g, u, act, stream);
  } else {
    launch_sym<LargeT<2>>(gsym, xa, k, Ugu, large, large_cap, g, u, act, stream);
    launch_sym<MidT<2>>(gsym, xa, k, Ugu, list, mid_cap, g, u, act, stream);
  }

  quant_rows(act, int(slots), I, Ud, base + L.a_hi, base + L.a_lo, reinterpret_cast<float*>(base + L.a_sb),
             reinterpret_cast<int2*>(base + L.a_sum), stream);

  if (small && I % 128 != 0) {
    launch_sym<SmallT64<1>>(dsym, aa, 1, Ud, list, small_grid, d, d, y, stream);
  } else if (small) {
    launch_sym<SmallT<1>>(dsym, aa, 1, Ud, list, small_grid, d, d, y, stream);
  } else if (int_wgmma_serves(Ud, I, H, slots)) {
    int_wgmma_launch(1, 64, dsym, aa, 1, large, large_cap, d, d, y, stream);
    int_wgmma_launch(1, 32, dsym, aa, 1, list, mid_cap, d, d, y, stream);
  } else {
    launch_sym<LargeT<1>>(dsym, aa, 1, Ud, large, large_cap, d, d, y, stream);
    launch_sym<MidT<1>>(dsym, aa, 1, Ud, list, mid_cap, d, d, y, stream);
  }

  if (shared_ready) MOESERVE_CUDA_CHECK(cudaStreamWaitEvent(stream, shared_ready, 0));
  combine_routed(y, weights, s, M, residual, shared_out, shared_gate_logit, stream);
}

}  // namespace moeserve::cuda::moe_int_detail
