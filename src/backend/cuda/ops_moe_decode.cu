// Routed GPTQ INT4 experts for generated-token steps (M <= kDecodeMaxTokens rows): two launches
// per layer instead of four (grouping, gate/up, down, combine in ops_moe.cu / ops_moe_gptq.cu).
//
// Layout: the checkpoint's own (not reordered): qweight [E][K/8][N] int32 (nibble j of word
// (kp, n) = q[8kp + j, n]), scales f16 [E][K/g][N], qzeros [E][K/g][N/8]; x f32 or bf16 [M, H];
// router logits f32 [M, E]; workspace ids / weights [M·k], act f32 [M·k, I] (slot = m·k + rank);
// residual f32 [M, H]. A packed row of one expert is N·4 bytes; 32 consecutive columns of it
// are one 128-byte line.
//
// Two forms with the same bits, chosen at run time (set_moe_decode_variant, ops_moe.h; default
// 1): the streaming kernels (1) and the previous kernels (0).
//
// Streaming kernels (stream_gate_up_kernel, stream_down_kernel), variant 1:
//   Grid: gate/up one CTA per (slot, 32 columns of I): M·k·I/32 CTAs (256 at M = 1 for I 1024);
//   down one CTA per (token, 32 columns of H), all k ranks: M·H/32 (96 at M = 1 for H 3072).
//   A CTA covers whole 128-byte lines, so each line of an expert is requested by one CTA only.
//   Items (one per thread, more loop): a scale block (`block` packed rows) of two 16-byte column
//   vectors A and B that multiply the same x rows: gate/up (4 columns, gate and up); down
//   (columns c..c+3 and c+16..c+19 of one rank). Per packed row a thread reads 2 x 16 B of
//   weights and 2 x 16 B of x (shared memory) for 8 words: 8 independent fmaf chains.
//   Threads: 8·nblk (gate/up: 192 at H 3072, g128) and 4·k·nblk (down: 256 at k 8, I 1024).
//   Streaming (stream_items): a thread requests its own rows with 16-byte cp.async.cg into its
//   own shared-memory ring (R steps of S = 2 rows, or 1 for odd blocks; one commit group per
//   step), R steps ahead of the step it computes, and waits with cp.async.wait_group R - 1:
//   no register holds an in-flight word, no barrier orders the ring (only the issuing thread
//   reads a slot), and compute overlaps the loads of the next R steps. An item's scales and
//   zeros come with its first step (cp.async 8 / 4 B into an item slot). Block sums and scales
//   go to shared memory; after one barrier the range and output sums run as in the previous
//   kernels, the range partials reusing the ring.
//   gate/up routes exactly as the previous kernel (warp 0, route_token, rounds 0..r; the other
//   warps stage the x row as f32 with 4 floats of padding per scale block, so the 4 blocks a
//   warp reads hit different banks); down reads ids / weights written by gate_up, stages the k
//   act rows (stride I + 4), and combines into the residual as before.
//   Bytes in flight and occupancy (plan_stream_launch, per device): as many CTAs per SM as the
//   grid spreads over an SM (registers and threads permitting: gate/up <= 112 registers, 3 CTAs
//   of 192 threads; down <= 128, 2 of 256), each with the largest ring (<= 16 steps, <= the
//   thread's own rows) that fits, as long as the SM's rings hold a quarter of its shared
//   memory; else fewer CTAs. H200 (228 KB per SM), 122B-A10B shapes: gate/up at M = 1 (256
//   CTAs) 2 CTAs per SM (264 slots: one wave), R = 6 (12 of an item's 16 rows in flight: 72 KB
//   per CTA, 144 KB per SM), 102 KB of shared memory; at M >= 2 3 CTAs per SM, R = 3 (36 KB
//   per CTA), 66 KB. down at M = 1 (96 CTAs) one CTA per SM, R = 8 (all 16 rows: 128 KB in
//   flight), 184 KB; at M >= 2 2 CTAs per SM, R = 3 (48 KB per CTA), 104 KB. DGX Spark (sm_121,
//   99 KB per block): the same code with smaller rings; cp.async is sm_80 (no TMA, no wgmma).
//   Shared memory above 48 KB: the kernels are opted in to the device's per-block maximum on
//   the first call per device (cudaFuncSetAttribute: not a stream operation, so also legal when
//   that first call is inside CUDA-graph capture).
// Previous kernels (decode_gate_up_kernel, decode_down_kernel), variant 0:
// decode_gate_up_kernel: one CTA per (slot, 16 columns of I). Warp 0 routes the slot's token
//   (route_token, the grouping kernel's code; E <= 256; arg-max rounds 0..r only) while the
//   other warps stage the token's x row in shared memory as f32; rank r's expert then gives
//   the weights. Items are (4 columns, gate or up, scale block of `block` <= 16 packed rows):
//   a thread loads all of an item's words at once (up to 16 x 16-byte loads, 4 consecutive
//   columns each, one per packed row) and only then computes, so a CTA has its whole weight
//   slice (2 x K/8 x 64 B, 48 KB at H 3072) in flight after one dependent round. 4 lanes cover
//   a 64-byte row slice; the lanes of a quarter warp read the same x (gate and up of one
//   block): shared-memory broadcasts. Column blocks of one slot are adjacent CTAs, so the two
//   halves of a 128-byte line are fetched together.
// decode_down_kernel: one CTA per (token, 16 columns of H), all k ranks: it reads the token's
//   ids and weights (written by gate_up), stages the k act rows in shared memory (row stride
//   I + 4 floats: the two items of a quarter warp, ranks r and r+1, hit different banks), runs
//   items (4 columns, rank, scale block) like gate_up, then adds
//   Σ_r w_r·y_r in rank order, the residual and sigmoid(gate)·shared to the residual directly
//   (no y buffer, no combine launch).
//   Occupancy: gate/up 192 threads at <= 112 registers (3 CTAs per SM: 396 slots for 512 CTAs
//   at M = 1, a second partial wave), down 256 threads at <= 128 (2 per SM: 264 slots for 192
//   CTAs at M = 1).
// All four kernels are programmatic dependent launches (pdl.cuh, when PDL is enabled): they
// wait (pdl_wait) before touching global memory (the weights to read depend on the routing, so
// none is requested earlier); gate_up lets down launch once its CTAs have routed. Activations
// and routing written by earlier kernels are read with ld.global.cg (L2, never a stale L1 line
// of a kernel that overlapped this one); only the weights take the read-only / cp.async path.
//
// Arithmetic (the tiled kernels' exactly, ops_moe_gptq.cu, with the same dequantisation per
// zero mode, so M picks a path without changing a bit; the combine is combine_kernel's): per
// (token, column): K is cut into 8 ranges of K/64 packed rows, a range into scale blocks of
// block = gcd(K/64, g/8) rows; a block's sum is one fmaf chain over its k ascending (f32 x,
// exact q - z); a range is fmaf(block_sum, scale, acc) over its blocks from 0; the output is
// 0 + range 0 + ... + range 7. gate/up: act = silu(g)·u. down + combine: acc = fmaf(w_r, y_r,
// acc) over ranks from 0, residual + acc, then fmaf(sigmoid(gate logit), shared, ·). None of it
// depends on M, the other tokens, the variant, the ring size or the grid.
//
// Instructions per weight word (one 32-bit word = 8 nibbles, 8 FMAs), estimated from the code
// size of a fully unrolled 32-word loop on sm_90 and sm_121 (cubin .text bytes / 16 per
// instruction, the loop's fixed part measured separately; no SASS listing was available):
// symmetric weights take dequant8_const_zero: 8 LOP3 + 1 SHF + 8 FADD + 8 FFMA = 25 (+ 0.5
// shared-memory x loads), where dequant8 (asymmetric zeros) costs about 31: ptxas spends 23
// instructions on its shifts, mask-ors, HSUB2s and f16 -> f32 conversions. The exponent
// constants must live in registers (nibble_exponents) and the AND-OR be one explicit lop3
// (and_or): otherwise the new path measured 33. 25 is the floor of this arithmetic (an exact
// f32 (q - z) per nibble costs an OR and a subtract, then its FMA). The streaming kernels add
// per step of S rows: 2·S shared-memory weight loads, 2·S x loads, 2·S cp.async and the ring's
// bookkeeping (about 4 instructions per word at S = 2, not counted from SASS). The rest of a
// thread's instructions (staging, routing, range sums, item setup) is fixed per thread: with
// one item of 128 words per thread at the 122B shapes it is spread over few words. At 25 per word
// the SMs' issue rate is of the same order as the DRAM rate (a word is 4 bytes), so the
// kernels overlap compute with the loads instead of alternating them.
//
// Roofline (bytes, per layer): the slots' expert weights once per slot: M·k·(3·I·H/2 +
// 3·I·H/g·2) (122B-A10B at M = 1: 8 x 4.7 MB = 37.7 MB + 1.2 MB of scales, 39.3 MB in all with
// the activations); a token picking the same expert as another reads it again (tokens are not
// grouped: at M <= 8 few experts repeat, and CTAs of one expert that run at the same time may
// share its lines in L2). Activations: per gate/up CTA the x row (4·H bytes) and per down CTA
// k act rows (4·k·I bytes) come from L2.
// Preconditions (gptq_decode_supported; the tiled path serves the rest): the GPTQ fast path
// without act-order, E <= 256, gate and up with one group size, blocks of <= 16 packed rows and
// <= 47 KB of dynamic shared memory per CTA for the previous kernels (down: 4·k·(I + 4 + 32·nblk
// + 8·16 + 16) bytes with nblk = I / (8·block): 45.7 KB at k 8, I 1024); a shape whose streaming
// CTA does not fit the device takes the previous kernels. Items beyond 256 (gate/up, streaming
// down) or 512 (previous down) threads loop.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <numeric>
#include <type_traits>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/per_device.h"
#include "backend/cuda/ops_moe_internal.cuh"
#include "backend/cuda/pdl.cuh"

namespace moeserve::cuda::moe_detail {
namespace {

constexpr int kColLanes = 4;            // lanes per row slice; each lane 4 columns (one 16-byte load)
constexpr int kCols = 4 * kColLanes;    // columns per CTA
constexpr int kMaxBlockRows = 16;       // packed rows per item, all loaded before use
constexpr int kRanges = 8;              // the tiled kernels' K split (one range per warp of 8)
constexpr int kMaxThreads = 512;        // down
constexpr int kUpMaxThreads = 256;      // gate/up: 4 x (gate, up) x 24 blocks = 192 at H 3072, g128
constexpr int kUpRegisters = 112;       // 3 CTAs per SM (4, at <= 85 registers, would spill the 16 x 16-byte loads)
constexpr int kXPad = 4;                // floats between staged act rows (bank offset)
constexpr size_t kMaxSmem = 47 * 1024;  // dynamic, under the 48 KB default (no opt-in)

// One item: block sums of columns n..n+3 (n % 4 == 0, n + 3 < N) over scale block `blk` (packed
// rows [blk·block, blk·block + block)) of one expert's projection, and their scales.
// qw: the expert's [K/8][N] words; sc: its [K/g][N] scales; qz: its [K/g][N/8] zeros or null
// (symmetric: zero 8). xs: the activation row (f32, shared memory). kSym: qz is null and the
// words are dequantised with the constant zero 8 (dequant8_const_zero: the same f32 values as
// dequant8, fewer instructions).
template <bool kSym>
__device__ __forceinline__ void block_dot4(const int32_t* __restrict__ qw, const __half* __restrict__ sc,
                                           const int32_t* __restrict__ qz, int N, int group, int block, int blk, int n,
                                           const float* xs, float (&bs)[4], float (&s)[4]) {
  const int kp0 = blk * block;
  const int g = kp0 * 8 / group;
  uint4 w[kMaxBlockRows];
#pragma unroll
  for (int u = 0; u < kMaxBlockRows; ++u)
    if (u < block) w[u] = __ldg(reinterpret_cast<const uint4*>(qw + size_t(kp0 + u) * N + n));
  const uint2 sraw = __ldg(reinterpret_cast<const uint2*>(sc + size_t(g) * N + n));
  __half2 zz[4];
  if constexpr (kSym) {
#pragma unroll
    for (int c = 0; c < 4; ++c) zz[c] = __float2half2_rn(1024.0f + 8.0f);  // unused
  } else if (qz) {
    const uint32_t zw = uint32_t(__ldg(qz + size_t(g) * (N / 8) + n / 8));
#pragma unroll
    for (int c = 0; c < 4; ++c) zz[c] = __float2half2_rn(1024.0f + float(int((zw >> (4 * (n % 8 + c))) & 0xF) + 1));
  } else {
#pragma unroll
    for (int c = 0; c < 4; ++c) zz[c] = __float2half2_rn(1024.0f + 8.0f);
  }
  NibbleExp nexp;
  if constexpr (kSym) nexp = nibble_exponents();
  float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int u = 0; u < kMaxBlockRows; ++u) {
    if (u >= block) break;
    const float4 x0 = *reinterpret_cast<const float4*>(xs + (kp0 + u) * 8);
    const float4 x1 = *reinterpret_cast<const float4*>(xs + (kp0 + u) * 8 + 4);
    const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    const uint32_t wc[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float f[8];
      if constexpr (kSym)
        dequant8_const_zero<8>(wc[c], nexp, f);
      else
        dequant8(wc[c], zz[c], f);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[c] = fmaf(f[i], xv[i], a[c]);
    }
  }
  const __half2* sh = reinterpret_cast<const __half2*>(&sraw);
  s[0] = __low2float(sh[0]);
  s[1] = __high2float(sh[0]);
  s[2] = __low2float(sh[1]);
  s[3] = __high2float(sh[1]);
#pragma unroll
  for (int c = 0; c < 4; ++c) bs[c] = a[c];
}

// An activation vector of 4 (16 bytes of f32, 8 of bf16) through L2 as f32.
template <typename T>
__device__ __forceinline__ float4 load4_cg(const T* p) {
  if constexpr (std::is_same_v<T, float>)
    return __ldcg(reinterpret_cast<const float4*>(p));
  else
    return make_float4(to_f32(__ldcg(p)), to_f32(__ldcg(p + 1)), to_f32(__ldcg(p + 2)), to_f32(__ldcg(p + 3)));
}

// Copies rows x len activations (row-major, len % 4 == 0) into shared memory rows of `stride`
// floats as f32, thread t0 of nt: each thread issues up to kStageVecs 16-byte loads before its
// first store, so the copy is one L2 round trip, not one per vector.
constexpr int kStageVecs = 8;
template <typename T>
__device__ __forceinline__ void stage_rows(const T* __restrict__ src, int rows, int len, float* dst, int stride, int t0,
                                           int nt) {
  const int nvec = rows * len / 4;
  for (int base = 0; base < nvec; base += kStageVecs * nt) {
    float4 v[kStageVecs];
#pragma unroll
    for (int j = 0; j < kStageVecs; ++j) {
      const int vi = base + j * nt + t0;
      if (vi < nvec) v[j] = load4_cg(src + size_t(vi) * 4);
    }
#pragma unroll
    for (int j = 0; j < kStageVecs; ++j) {
      const int e = 4 * (base + j * nt + t0);
      if (e < 4 * nvec) *reinterpret_cast<float4*>(dst + (e / len) * stride + e % len) = v[j];
    }
  }
}

// Range sums of `series` series of nblk blocks each (gate and up, or the k ranks), all
// (series, range, column) in parallel: part[series·8 + range][col] = fmaf(block_sum, scale, acc)
// over the range's bpr = nblk / 8 blocks in order, from 0. bsm / scm: [series·nblk][kCols].
// Range q = series·8 + range starts at block q·bpr.
__device__ __forceinline__ void range_sums(const float* bsm, const float* scm, int series, int nblk, float* part) {
  const int bpr = nblk / kRanges;
  for (int it = threadIdx.x; it < series * kRanges * kCols; it += blockDim.x) {
    const int col = it % kCols, q = it / kCols;
    float acc = 0.0f;
    for (int b = 0; b < bpr; ++b) {
      const int i = (q * bpr + b) * kCols + col;
      acc = fmaf(bsm[i], scm[i], acc);
    }
    part[q * kCols + col] = acc;
  }
}

// A series' output at column col: 0 + range 0 + ... + range 7 (the tiled kernels' warp order).
__device__ __forceinline__ float series_sum(const float* part, int series, int col) {
  float v = 0.0f;
#pragma unroll
  for (int rg = 0; rg < kRanges; ++rg) v += part[(series * kRanges + rg) * kCols + col];
  return v;
}

// Dynamic shared memory (floats): xs [H], bsm and scm [2][nblk][kCols] (gate, up), part [2][8][kCols].
template <typename T, bool kSym>
__global__ void __maxnreg__(kUpRegisters)
    decode_gate_up_kernel(const T* __restrict__ x, const float* __restrict__ logits, int E, int k, ExpertView gate,
                          ExpertView up, int block, int32_t* __restrict__ ids_out, float* __restrict__ w_out,
                          float* __restrict__ act) {
  extern __shared__ float4 smem4[];
  __shared__ int32_t s_ids[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  const int H = gate.K, I = gate.N, nblk = H / 8 / block;
  float* xs = reinterpret_cast<float*>(smem4);
  float* bsm = xs + H;
  float* scm = bsm + 2 * nblk * kCols;
  float* part = scm + 2 * nblk * kCols;  // [2][kRanges][kCols]
  const int tid = threadIdx.x, nthr = blockDim.x;
  const int slot = blockIdx.y, m = slot / k, r = slot % k;
  const int n0 = blockIdx.x * kCols;
  pdl_wait();
  // Warp 0 routes the token; the other warps (all, if there is one warp) stage its x row. The
  // arg-max rounds do not depend on k, so a CTA of rank r stops after round r (its expert is
  // chosen[r], the same id as with all k rounds; its s_w are unused); the CTA that publishes the
  // token's routing for the down kernel runs all k.
  const bool publisher = blockIdx.x == 0 && r == 0;
  if (tid < 32) route_token<8>(logits + size_t(m) * E, E, publisher ? k : r + 1, s_ids, s_w);  // E <= 256
  if (nthr <= 32)
    stage_rows(x + size_t(m) * H, 1, H, xs, H, tid, nthr);
  else if (tid >= 32)
    stage_rows(x + size_t(m) * H, 1, H, xs, H, tid - 32, nthr - 32);
  __syncthreads();
  pdl_launch_dependents();
  const int e = min(max(s_ids[r], 0), E - 1);  // in range even for non-finite logits
  if (publisher && tid < k) {  // the down kernel reads the token's routing from here
    ids_out[size_t(m) * k + tid] = min(max(s_ids[tid], 0), E - 1);
    w_out[size_t(m) * k + tid] = s_w[tid];
  }
  const int groups = H / gate.group;
  const size_t qoff = size_t(e) * (H / 8) * I, soff = size_t(e) * groups * I, zoff = size_t(e) * groups * (I / 8);
  // Item it: column lane it % 4, then (projection, block) = (q % 2, q / 2): a quarter warp's two
  // items are gate and up of one block and read the same x.
  const int items = kColLanes * 2 * nblk;
  for (int it = tid; it < items; it += nthr) {
    const int c = it % kColLanes, q = it / kColLanes, p = q & 1, blk = q >> 1;
    const int n = n0 + 4 * c;
    if (n >= I) continue;  // I % 8 == 0: n < I means all 4 columns exist
    const int32_t* qw = (p ? up.qweight : gate.qweight) + qoff;
    const __half* sc = (p ? up.scales : gate.scales) + soff;
    const int32_t* qz = kSym ? nullptr : (p ? up.qzeros : gate.qzeros) + zoff;
    float bs[4], s[4];
    block_dot4<kSym>(qw, sc, qz, I, gate.group, block, blk, n, xs, bs, s);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      bsm[(p * nblk + blk) * kCols + 4 * c + j] = bs[j];
      scm[(p * nblk + blk) * kCols + 4 * c + j] = s[j];
    }
  }
  __syncthreads();
  range_sums(bsm, scm, 2, nblk, part);
  __syncthreads();
  if (tid < kCols && n0 + tid < I)
    act[size_t(slot) * I + n0 + tid] = silu_mul(series_sum(part, 0, tid), series_sum(part, 1, tid));
}

// Dynamic shared memory (floats): xs [k][I + kXPad], bsm and scm [k][nblk][kCols], part
// [k][8][kCols], yv [k][kCols].
template <bool kSym>
__global__ void __launch_bounds__(kMaxThreads)
    decode_down_kernel(const float* __restrict__ act, const int32_t* __restrict__ ids, const float* __restrict__ wts,
                       int k, ExpertView down, int block, float* __restrict__ residual,
                       const float* __restrict__ shared, const float* __restrict__ gate_logit) {
  extern __shared__ float4 smem4[];
  __shared__ int32_t s_ids[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  const int H = down.N, I = down.K, nblk = I / 8 / block, xstride = I + kXPad;
  float* xs = reinterpret_cast<float*>(smem4);
  float* bsm = xs + k * xstride;
  float* scm = bsm + k * nblk * kCols;
  float* part = scm + k * nblk * kCols;
  float* yv = part + k * kRanges * kCols;
  const int tid = threadIdx.x, nthr = blockDim.x;
  const int m = blockIdx.y, n0 = blockIdx.x * kCols;
  const int col = n0 + tid;
  const bool fin = tid < kCols && col < H;  // the threads that write the residual
  pdl_wait();
  if (tid < k) {
    s_ids[tid] = __ldcg(ids + size_t(m) * k + tid);
    s_w[tid] = __ldcg(wts + size_t(m) * k + tid);
  }
  // The token's k act rows (contiguous slots m·k .. m·k + k - 1; I % 4 == 0: no float4 spans rows).
  stage_rows(act + size_t(m) * k * I, k, I, xs, xstride, tid, nthr);
  float res = 0.0f, sh = 0.0f, sig = 0.0f;
  if (fin) {
    res = __ldcg(residual + size_t(m) * H + col);
    if (shared) {
      sh = __ldcg(shared + size_t(m) * H + col);
      sig = 1.0f / (1.0f + __expf(-__ldcg(gate_logit + m)));  // combine_kernel's shared_scale
    }
  }
  __syncthreads();
  const int groups = I / down.group;
  // Item it: column lane it % 4, then (rank, block) = (q % k, q / k).
  const int items = kColLanes * k * nblk;
  for (int it = tid; it < items; it += nthr) {
    const int c = it % kColLanes, q = it / kColLanes, r = q % k, blk = q / k;
    const int n = n0 + 4 * c;
    if (n >= H) continue;    // H % 8 == 0
    const int e = s_ids[r];  // in range (clamped by gate_up)
    const int32_t* qw = down.qweight + size_t(e) * (I / 8) * H;
    const __half* sc = down.scales + size_t(e) * groups * H;
    const int32_t* qz = kSym ? nullptr : down.qzeros + size_t(e) * groups * (H / 8);
    float bs[4], s[4];
    block_dot4<kSym>(qw, sc, qz, H, down.group, block, blk, n, xs + r * xstride, bs, s);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      bsm[(r * nblk + blk) * kCols + 4 * c + j] = bs[j];
      scm[(r * nblk + blk) * kCols + 4 * c + j] = s[j];
    }
  }
  __syncthreads();
  range_sums(bsm, scm, k, nblk, part);
  __syncthreads();
  // y[rank, column]: the tiled down kernel's output for the slot.
  for (int it = tid; it < k * kCols; it += nthr) yv[it] = series_sum(part, it / kCols, it % kCols);
  __syncthreads();
  if (fin) {
    float acc = 0.0f;
    for (int r = 0; r < k; ++r) acc = fmaf(s_w[r], yv[r * kCols + tid], acc);
    float o = res + acc;
    if (shared) o = fmaf(sig, sh, o);
    residual[size_t(m) * H + col] = o;
  }
}

// ---------------------------------------------------------------------------------------------
// The streaming kernels (variant 1, the default; see the header comment).

constexpr int kSCols = 32;           // columns per CTA: one 128-byte line of a packed row
constexpr int kSMaxThreads = 256;    // threads per CTA (items beyond loop)
constexpr int kSRegisters = 128;     // down: 2 CTAs of 256 threads per SM
constexpr int kSUpRegisters = 112;   // gate/up: 3 CTAs of 192 threads per SM (65536 registers)
constexpr int kMaxRing = 16;         // ring steps in flight per thread (cp.async groups; wait_group <= 15)
constexpr int kItemSlotBytes = 32;   // per thread and item: scales A, B (8 B each), zero words A, B (4 B each)

using async_copy::cp_async16;  // .cg: L2 only, the weights are streamed
using async_copy::cp_async4;
using async_copy::cp_async8;
using async_copy::cp_async_commit;
using async_copy::cp_async_wait;
using async_copy::cp_async_wait_pending;

// Packed rows per ring step (one cp.async group): 2 when the scale block has an even number of
// rows (halves the per-row loop and wait overhead), else 1. Never changes a sum.
__host__ __device__ constexpr int rows_per_step(int block) { return block % 2 == 0 ? 2 : 1; }

// Bytes of the per-thread ring ([R][S][2][threads] x 16 B: R steps of S rows of vectors A and
// B); after the main loop the same memory holds the range partials (part_floats floats), so it
// is at least that large.
__host__ __device__ constexpr size_t ring_bytes(int R, int S, int nthr, int part_floats) {
  return size_t(R) * S * 2 * size_t(nthr) * 16 > size_t(part_floats) * 4 ? size_t(R) * S * 2 * size_t(nthr) * 16
                                                                           : size_t(part_floats) * 4;
}

// Item slots a thread needs: the producer runs R steps ahead, so the item being consumed is
// rewritten no earlier than ceil(R / steps_per_item) + 1 items later; never more than the
// thread's items.
__host__ __device__ constexpr int item_slots(int R, int block, int items_per_thread) {
  return (R + block / rows_per_step(block) - 1) / (block / rows_per_step(block)) + 1 < items_per_thread
             ? (R + block / rows_per_step(block) - 1) / (block / rows_per_step(block)) + 1
             : items_per_thread;
}

// One item of a thread: the scale block (`block` packed rows from wa / wb) of two 16-byte
// column vectors A and B (4 consecutive columns each) that multiply the same x rows (gate/up:
// gate and up of one 4-column group; down: columns n..n+3 and n+16..n+19 of one rank).
struct StreamItem {
  const int32_t* wa;  // packed row blk·block, column n (16-byte aligned)
  const int32_t* wb;
  const __half* sa;  // the block's group scales at the vector's first column (8-byte aligned)
  const __half* sb;
  const int32_t* za;  // the group's zero words (asymmetric)
  const int32_t* zb;
  int zshift;         // 4·(n % 8): the vector's first nibble in its zero word (A and B alike)
  const float* xr;    // x of packed row blk·block in shared memory (8 floats per packed row)
  int oa, ob;         // bsm / scm index of the vector's first column
  bool va, vb;        // the vector's columns exist (always, with the fast path's H, I % 64 == 0)
};

// Streams this thread's items it = tid, tid + nthr, ... < items. A step is S packed rows of an
// item (16 bytes of A and of B per row, plus the item's scales and zeros with its first step),
// one cp.async group, into the thread's own ring slot, R steps ahead of the step being
// computed; only the issuing thread reads a slot, so cp.async.wait_group alone orders it (no
// barrier). Block sums (one fmaf chain per column over the block's rows, k ascending, from 0:
// block_dot4's order) and scales go to bsm / scm. IR item slots (item_slots).
template <bool kSym, int S, class Src>
__device__ __forceinline__ void stream_items(const Src& src, int items, int block, int N, int R, int IR, char* ring,
                                             char* islots, float* bsm, float* scm) {
  const int tid = threadIdx.x, nthr = blockDim.x;
  const size_t vstride = size_t(nthr) * 16;  // A plane -> B plane of a row
  const size_t rowstride = 2 * vstride;      // row -> next row of a step
  const size_t rstride = S * rowstride;      // ring slot -> next
  const size_t istride = size_t(nthr) * kItemSlotBytes;
  char* my_ring = ring + size_t(tid) * 16;
  char* my_items = islots + size_t(tid) * kItemSlotBytes;

  // Producer: the next step to request.
  int p_it = tid, p_u = 0, p_slot = 0, p_islot = 0;
  StreamItem p{};
  if (p_it < items) p = src.get(p_it);
  auto issue = [&]() {
    if (p_it < items) {
      char* rs = my_ring + size_t(p_slot) * rstride;
      if (p_u == 0) {
        char* is = my_items + size_t(p_islot) * istride;
        if (p.va) {
          cp_async8(is, p.sa);
          if constexpr (!kSym) cp_async4(is + 16, p.za);
        }
        if (p.vb) {
          cp_async8(is + 8, p.sb);
          if constexpr (!kSym) cp_async4(is + 20, p.zb);
        }
      }
#pragma unroll
      for (int j = 0; j < S; ++j) {
        if (p.va) cp_async16(rs + j * rowstride, p.wa + size_t(j) * N);
        if (p.vb) cp_async16(rs + j * rowstride + vstride, p.wb + size_t(j) * N);
      }
      p.wa += size_t(S) * N;
      p.wb += size_t(S) * N;
      if (++p_slot == R) p_slot = 0;
      p_u += S;
      if (p_u == block) {
        p_u = 0;
        if (++p_islot == IR) p_islot = 0;
        p_it += nthr;
        if (p_it < items) p = src.get(p_it);
      }
    }
    cp_async_commit();  // empty past the last step: every step commits one group
  };
  for (int i = 0; i < R; ++i) issue();

  NibbleExp nexp;
  if constexpr (kSym) nexp = nibble_exponents();
  int c_slot = 0, c_islot = 0;
  for (int it = tid; it < items; it += nthr) {
    const StreamItem q = src.get(it);
    const char* is = my_items + size_t(c_islot) * istride;
    if (++c_islot == IR) c_islot = 0;
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f}, b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint2 sra = make_uint2(0, 0), srb = make_uint2(0, 0);
    __half2 zza[4], zzb[4];
    for (int u = 0; u < block; u += S) {
      // Groups committed so far: R + (steps consumed); this step's is done when <= R - 1 pend.
      cp_async_wait_pending(R - 1);
      if (u == 0) {
        sra = *reinterpret_cast<const uint2*>(is);
        srb = *reinterpret_cast<const uint2*>(is + 8);
        if constexpr (!kSym) {
          const uint32_t zwa = *reinterpret_cast<const uint32_t*>(is + 16);
          const uint32_t zwb = *reinterpret_cast<const uint32_t*>(is + 20);
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            zza[c] = __float2half2_rn(1024.0f + float(int((zwa >> (q.zshift + 4 * c)) & 0xF) + 1));
            zzb[c] = __float2half2_rn(1024.0f + float(int((zwb >> (q.zshift + 4 * c)) & 0xF) + 1));
          }
        }
      }
      const char* rs = my_ring + size_t(c_slot) * rstride;
      if (++c_slot == R) c_slot = 0;
#pragma unroll
      for (int j = 0; j < S; ++j) {  // rows u + j, in k order
        const uint4 wa = *reinterpret_cast<const uint4*>(rs + j * rowstride);
        const uint4 wb = *reinterpret_cast<const uint4*>(rs + j * rowstride + vstride);
        const float4 x0 = *reinterpret_cast<const float4*>(q.xr + (u + j) * 8);
        const float4 x1 = *reinterpret_cast<const float4*>(q.xr + (u + j) * 8 + 4);
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        const uint32_t wca[4] = {wa.x, wa.y, wa.z, wa.w}, wcb[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float f[8], g[8];
          if constexpr (kSym) {
            dequant8_const_zero<8>(wca[c], nexp, f);
            dequant8_const_zero<8>(wcb[c], nexp, g);
          } else {
            dequant8(wca[c], zza[c], f);
            dequant8(wcb[c], zzb[c], g);
          }
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            a[c] = fmaf(f[i], xv[i], a[c]);
            b[c] = fmaf(g[i], xv[i], b[c]);
          }
        }
      }
      issue();  // the step R ahead, into the slot just read (this thread's own)
    }
    const __half2* sha = reinterpret_cast<const __half2*>(&sra);
    const __half2* shb = reinterpret_cast<const __half2*>(&srb);
    const float sa[4] = {__low2float(sha[0]), __high2float(sha[0]), __low2float(sha[1]), __high2float(sha[1])};
    const float sb[4] = {__low2float(shb[0]), __high2float(shb[0]), __low2float(shb[1]), __high2float(shb[1])};
    if (q.va)
#pragma unroll
      for (int j = 0; j < 4; ++j) bsm[q.oa + j] = a[j], scm[q.oa + j] = sa[j];
    if (q.vb)
#pragma unroll
      for (int j = 0; j < 4; ++j) bsm[q.ob + j] = b[j], scm[q.ob + j] = sb[j];
  }
  cp_async_wait<0>();  // nothing of this thread's still lands in the ring (reused for part)
}

// Both step sizes (block even: 2 rows per step).
template <bool kSym, class Src>
__device__ __forceinline__ void stream_items_any(const Src& src, int items, int block, int N, int R, int IR,
                                                 char* ring, char* islots, float* bsm, float* scm) {
  if (rows_per_step(block) == 2)
    stream_items<kSym, 2>(src, items, block, N, R, IR, ring, islots, bsm, scm);
  else
    stream_items<kSym, 1>(src, items, block, N, R, IR, ring, islots, bsm, scm);
}

// Copies rows x len activations (len % 4 == 0) into shared memory as f32: element (row, e) goes
// to dst[row·row_stride + (e / seg)·seg_stride + e % seg] (seg % 4 == 0: padding between
// segments moves the x of different scale blocks to different banks). One L2 round trip per
// kStageVecs vectors per thread, like stage_rows.
template <typename T>
__device__ __forceinline__ void stage_segments(const T* __restrict__ src, int rows, int len, float* dst,
                                               int row_stride, int seg, int seg_stride, int t0, int nt) {
  const int nvec = rows * len / 4;
  for (int base = 0; base < nvec; base += kStageVecs * nt) {
    float4 v[kStageVecs];
#pragma unroll
    for (int j = 0; j < kStageVecs; ++j) {
      const int vi = base + j * nt + t0;
      if (vi < nvec) v[j] = load4_cg(src + size_t(vi) * 4);
    }
#pragma unroll
    for (int j = 0; j < kStageVecs; ++j) {
      const int vi = base + j * nt + t0;
      if (vi < nvec) {
        const int row = 4 * vi / len, e = 4 * vi % len;
        *reinterpret_cast<float4*>(dst + row * row_stride + (e / seg) * seg_stride + e % seg) = v[j];
      }
    }
  }
}

// range_sums / series_sum over kSCols columns (the same order: fmaf(block_sum, scale, acc)
// over a range's blocks from 0, then 0 + range 0 + ... + range 7).
__device__ __forceinline__ void range_sums32(const float* bsm, const float* scm, int series, int nblk, float* part) {
  const int bpr = nblk / kRanges;
  for (int it = threadIdx.x; it < series * kRanges * kSCols; it += blockDim.x) {
    const int col = it % kSCols, q = it / kSCols;
    float acc = 0.0f;
    for (int b = 0; b < bpr; ++b) {
      const int i = (q * bpr + b) * kSCols + col;
      acc = fmaf(bsm[i], scm[i], acc);
    }
    part[q * kSCols + col] = acc;
  }
}
__device__ __forceinline__ float series_sum32(const float* part, int series, int col) {
  float v = 0.0f;
#pragma unroll
  for (int rg = 0; rg < kRanges; ++rg) v += part[(series * kRanges + rg) * kSCols + col];
  return v;
}

// gate/up items: it = 8·blk + c; vector A = gate, B = up, both columns n0 + 4c .. + 3.
struct GateUpSrc {
  const int32_t *gq, *uq;
  const __half *gs, *us;
  const int32_t *gz, *uz;
  const float* xs;
  int I, n0, block, nblk, group, xseg;
  __device__ __forceinline__ StreamItem get(int it) const {
    const int c = it % 8, blk = it / 8, n = n0 + 4 * c, kp = blk * block;
    const int g = kp * 8 / group;
    const size_t wo = size_t(kp) * I + n, so = size_t(g) * I + n, zo = size_t(g) * (I / 8) + n / 8;
    StreamItem s;
    s.wa = gq + wo;
    s.wb = uq + wo;
    s.sa = gs + so;
    s.sb = us + so;
    s.za = gz + zo;
    s.zb = uz + zo;
    s.zshift = 4 * (n % 8);
    s.xr = xs + blk * xseg;
    s.oa = blk * kSCols + 4 * c;
    s.ob = (nblk + blk) * kSCols + 4 * c;
    s.va = s.vb = n < I;
    return s;
  }
};

// down items: it = 4·(k·blk + r) + c; rank r's expert; A = columns n0 + 4c .., B = n0 + 16 + 4c ..
struct DownSrc {
  const int32_t* q;
  const __half* s;
  const int32_t* z;
  const int32_t* ids;  // shared memory: the token's k expert ids
  const float* xs;
  int H, I, k, n0, block, nblk, group, xstride;
  int groups;  // I / group
  __device__ __forceinline__ StreamItem get(int it) const {
    const int c = it % 4, qq = it / 4;
    const int blk = qq / k, r = qq - blk * k;
    const int e = ids[r], n = n0 + 4 * c, kp = blk * block;
    const int g = kp * 8 / group;
    StreamItem t;
    t.wa = q + (size_t(e) * (I / 8) + kp) * H + n;
    t.wb = t.wa + 16;
    t.sa = s + (size_t(e) * groups + g) * H + n;
    t.sb = t.sa + 16;
    t.za = z + (size_t(e) * groups + g) * (H / 8) + n / 8;
    t.zb = t.za + 2;
    t.zshift = 4 * (n % 8);
    t.xr = xs + r * xstride + kp * 8;
    t.oa = (r * nblk + blk) * kSCols + 4 * c;
    t.ob = t.oa + 16;
    t.va = n < H;
    t.vb = n + 16 < H;
    return t;
  }
};

// Dynamic shared memory: ring (part after the loop) | item slots [IR][threads] | xs (nblk
// segments of 8·block + 4 floats) | bsm, scm [2][nblk][32].
template <typename T, bool kSym>
__global__ void __maxnreg__(kSUpRegisters)
    stream_gate_up_kernel(const T* __restrict__ x, const float* __restrict__ logits, int E, int k, ExpertView gate,
                          ExpertView up, int block, int R, int IR, int32_t* __restrict__ ids_out,
                          float* __restrict__ w_out, float* __restrict__ act) {
  extern __shared__ float4 smem4[];
  __shared__ int32_t s_ids[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  const int H = gate.K, I = gate.N, nblk = H / 8 / block, xseg = 8 * block + 4;
  const int tid = threadIdx.x, nthr = blockDim.x;
  char* ring = reinterpret_cast<char*>(smem4);
  char* islots = ring + ring_bytes(R, rows_per_step(block), nthr, 2 * kRanges * kSCols);
  float* xs = reinterpret_cast<float*>(islots + size_t(IR) * nthr * kItemSlotBytes);
  float* bsm = xs + nblk * xseg;
  float* scm = bsm + 2 * nblk * kSCols;
  float* part = reinterpret_cast<float*>(ring);
  const int slot = blockIdx.y, m = slot / k, r = slot % k;
  const int n0 = blockIdx.x * kSCols;
  pdl_wait();
  // Routing as decode_gate_up_kernel: warp 0 routes (rounds 0..r; the publisher all k) while
  // the other warps stage the x row.
  const bool publisher = blockIdx.x == 0 && r == 0;
  if (tid < 32) route_token<8>(logits + size_t(m) * E, E, publisher ? k : r + 1, s_ids, s_w);  // E <= 256
  if (nthr <= 32)
    stage_segments(x + size_t(m) * H, 1, H, xs, 0, 8 * block, xseg, tid, nthr);
  else if (tid >= 32)
    stage_segments(x + size_t(m) * H, 1, H, xs, 0, 8 * block, xseg, tid - 32, nthr - 32);
  __syncthreads();
  pdl_launch_dependents();
  const int e = min(max(s_ids[r], 0), E - 1);
  if (publisher && tid < k) {
    ids_out[size_t(m) * k + tid] = min(max(s_ids[tid], 0), E - 1);
    w_out[size_t(m) * k + tid] = s_w[tid];
  }
  const int groups = H / gate.group;
  const size_t qoff = size_t(e) * (H / 8) * I, soff = size_t(e) * groups * I, zoff = size_t(e) * groups * (I / 8);
  GateUpSrc src{gate.qweight + qoff, up.qweight + qoff, gate.scales + soff, up.scales + soff,
                kSym ? nullptr : gate.qzeros + zoff, kSym ? nullptr : up.qzeros + zoff, xs, I, n0, block, nblk,
                gate.group, xseg};
  stream_items_any<kSym>(src, 8 * nblk, block, I, R, IR, ring, islots, bsm, scm);
  __syncthreads();
  range_sums32(bsm, scm, 2, nblk, part);
  __syncthreads();
  if (tid < kSCols && n0 + tid < I)
    act[size_t(slot) * I + n0 + tid] = silu_mul(series_sum32(part, 0, tid), series_sum32(part, 1, tid));
}

// Dynamic shared memory: ring (part after the loop) | item slots | xs [k][I + kXPad] | bsm, scm
// [k][nblk][32].
template <bool kSym>
__global__ void __maxnreg__(kSRegisters)
    stream_down_kernel(const float* __restrict__ act, const int32_t* __restrict__ ids, const float* __restrict__ wts,
                       int k, ExpertView down, int block, int R, int IR, float* __restrict__ residual,
                       const float* __restrict__ shared, const float* __restrict__ gate_logit) {
  extern __shared__ float4 smem4[];
  __shared__ int32_t s_ids[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  const int H = down.N, I = down.K, nblk = I / 8 / block, xstride = I + kXPad;
  const int tid = threadIdx.x, nthr = blockDim.x;
  char* ring = reinterpret_cast<char*>(smem4);
  char* islots = ring + ring_bytes(R, rows_per_step(block), nthr, k * kRanges * kSCols);
  float* xs = reinterpret_cast<float*>(islots + size_t(IR) * nthr * kItemSlotBytes);
  float* bsm = xs + k * xstride;
  float* scm = bsm + k * nblk * kSCols;
  float* part = reinterpret_cast<float*>(ring);
  const int m = blockIdx.y, n0 = blockIdx.x * kSCols;
  const int col = n0 + tid;
  const bool fin = tid < kSCols && col < H;
  pdl_wait();
  if (tid < k) {
    s_ids[tid] = __ldcg(ids + size_t(m) * k + tid);
    s_w[tid] = __ldcg(wts + size_t(m) * k + tid);
  }
  stage_segments(act + size_t(m) * k * I, k, I, xs, xstride, I, 0, tid, nthr);
  float res = 0.0f, sh = 0.0f, sig = 0.0f;
  if (fin) {
    res = __ldcg(residual + size_t(m) * H + col);
    if (shared) {
      sh = __ldcg(shared + size_t(m) * H + col);
      sig = 1.0f / (1.0f + __expf(-__ldcg(gate_logit + m)));  // combine_kernel's shared_scale
    }
  }
  __syncthreads();
  DownSrc src{down.qweight, down.scales, kSym ? nullptr : down.qzeros, s_ids, xs, H, I, k, n0, block, nblk,
              down.group, xstride, I / down.group};
  stream_items_any<kSym>(src, 4 * k * nblk, block, H, R, IR, ring, islots, bsm, scm);
  __syncthreads();
  range_sums32(bsm, scm, k, nblk, part);
  __syncthreads();
  if (fin) {
    float acc = 0.0f;
    for (int rr = 0; rr < k; ++rr) acc = fmaf(s_w[rr], series_sum32(part, rr, tid), acc);
    float o = res + acc;
    if (shared) o = fmaf(sig, sh, o);
    residual[size_t(m) * H + col] = o;
  }
}

struct DecodePlan {
  bool ok = false;
  int block_up = 0, block_down = 0;
  int threads_up = 0, threads_down = 0;
  size_t smem_up = 0, smem_down = 0;
};

int threads_for(int items, int max_threads) { return std::min(max_threads, (items + 31) / 32 * 32); }

DecodePlan plan_decode(const MoeShape& s, const DeviceExperts& ex) {
  DecodePlan p;
  if (!gptq_fast_path(ex) || ex.gate.group_size != ex.up.group_size || ex.gate.sym != ex.up.sym) return p;
  if (s.top_k < 1 || s.top_k > kMaxTopK || s.num_experts > 256) return p;
  const int H = s.hidden, I = s.intermediate, k = s.top_k;
  if (int(ex.gate.K) != H || int(ex.gate.N) != I || int(ex.down.K) != I || int(ex.down.N) != H) return p;
  // The tiled kernels' blocks (plan_for in ops_moe_gptq.cu): gcd(K/64, g/8) packed rows.
  p.block_up = std::gcd(H / 64, int(ex.gate.group_size) / 8);
  p.block_down = std::gcd(I / 64, int(ex.down.group_size) / 8);
  if (p.block_up > kMaxBlockRows || p.block_down > kMaxBlockRows) return p;
  const int nblk_up = H / 8 / p.block_up, nblk_down = I / 8 / p.block_down;
  p.threads_up = threads_for(kColLanes * 2 * nblk_up, kUpMaxThreads);
  p.threads_down = threads_for(kColLanes * k * nblk_down, kMaxThreads);
  p.smem_up = (size_t(H) + size_t(4) * nblk_up * kCols + size_t(2) * kRanges * kCols) * sizeof(float);
  p.smem_down =
      (size_t(k) * (I + kXPad) + size_t(2) * k * nblk_down * kCols + size_t(k) * kRanges * kCols + size_t(k) * kCols) *
      sizeof(float);
  p.ok = p.smem_up <= kMaxSmem && p.smem_down <= kMaxSmem;
  return p;
}

// Device limits for the streaming kernels' plan, queried once per device; the first query also
// opts the streaming kernels in to the device's largest dynamic shared memory per block and the
// largest shared-memory carveout (the launch's own size decides the occupancy; the kernels' global
// loads bypass L1: cp.async.cg, ld.global.cg).
const SmLimits& device_caps() {
  return once_per_device([](int dev) {
    const SmLimits l = device_sm_limits(dev);
    for (const void* k : {(const void*)stream_gate_up_kernel<float, true>, (const void*)stream_gate_up_kernel<float, false>,
                          (const void*)stream_gate_up_kernel<bf16, true>, (const void*)stream_gate_up_kernel<bf16, false>,
                          (const void*)stream_down_kernel<true>, (const void*)stream_down_kernel<false>})
      opt_in_max_shared(k, l.smem_optin);
    return l;
  });
}

struct StreamLaunch {
  bool ok = false;
  int threads = 0, ring = 0, islots = 0;
  size_t smem = 0;
};

// The largest ring (steps of S rows in flight per thread, <= kMaxRing and at most the thread's
// steps) whose CTA fits `want` CTAs per SM and the per-block limit. want starts at the CTAs the
// grid puts on an SM (ceil(ctas / SMs)), capped by the registers (regs per thread) and threads
// of an SM, and drops while the rings of `want` CTAs would hold less than a quarter of the
// SM's shared memory (57 KB on the H200) or do not fit; the last try is 1. The ring only groups
// loads, never a sum: choosing it by M or by device keeps every bit.
StreamLaunch plan_stream_launch(int items, int block, int part_floats, size_t fixed_bytes, int ctas, int regs,
                                const SmLimits& c) {
  StreamLaunch L;
  L.threads = std::min(kSMaxThreads, (items + 31) / 32 * 32);
  const int per_thread = (items + L.threads - 1) / L.threads;
  constexpr size_t kStatic = 2 * kMaxTopK * 4;  // s_ids, s_w
  const int reg_max = c.regs_per_sm / (L.threads * regs), thread_max = c.threads_per_sm / L.threads;
  const int want_max = std::max(1, std::min({reg_max, thread_max, (ctas + c.sms - 1) / c.sms}));
  const int S = rows_per_step(block);
  const int max_ring = std::min(kMaxRing, per_thread * block / S);  // more steps than a thread has: unused
  for (int want = want_max; want >= 1; --want) {
    const long budget = std::min<long>(c.smem_optin, long(c.smem_per_sm) / want - c.smem_reserved) - long(kStatic);
    for (int R = max_ring; R >= 1; --R) {
      const int ir = item_slots(R, block, per_thread);
      const size_t smem = ring_bytes(R, S, L.threads, part_floats) +
                          size_t(ir) * L.threads * kItemSlotBytes + fixed_bytes;
      const size_t ring = size_t(R) * S * 2 * L.threads * 16;
      if (long(smem) <= budget && (want == 1 || R == max_ring || want * ring >= size_t(c.smem_per_sm) / 4)) {
        L.ok = true;
        L.ring = R;
        L.islots = ir;
        L.smem = smem;
        return L;
      }
    }
  }
  return L;
}

}  // namespace

bool gptq_decode_supported(const MoeShape& s, const DeviceExperts& ex, int M) {
  return M >= 1 && M <= kDecodeMaxTokens && plan_decode(s, ex).ok;
}

template <typename T>
void gptq_decode(const T* x, const float* router_logits, const MoeShape& s, const DeviceExperts& ex, int M,
                 int32_t* ids, float* weights, float* act, float* residual, const float* shared_out,
                 const float* shared_gate_logit, cudaStream_t stream, cudaEvent_t shared_ready) {
  const DecodePlan p = plan_decode(s, ex);
  if (!p.ok || M < 1 || M > kDecodeMaxTokens) throw Error("moe: decode experts called outside their preconditions");
  const int H = s.hidden, I = s.intermediate, k = s.top_k;
  if (moe_decode_variant() != 0) {
    // The streaming kernels (same bits); shapes whose CTA would not fit take the old kernels.
    const SmLimits& c = device_caps();
    const int nblk_up = H / 8 / p.block_up, nblk_down = I / 8 / p.block_down;
    const dim3 grid_up(unsigned((I + kSCols - 1) / kSCols), unsigned(M * k));
    const dim3 grid_down(unsigned((H + kSCols - 1) / kSCols), unsigned(M));
    const size_t fixed_up = (size_t(nblk_up) * (8 * p.block_up + 4) + size_t(4) * nblk_up * kSCols) * sizeof(float);
    const size_t fixed_down =
        (size_t(k) * (I + kXPad) + size_t(2) * k * nblk_down * kSCols) * sizeof(float);
    const StreamLaunch up = plan_stream_launch(8 * nblk_up, p.block_up, 2 * kRanges * kSCols, fixed_up,
                                               int(grid_up.x * grid_up.y), kSUpRegisters, c);
    const StreamLaunch dn = plan_stream_launch(4 * k * nblk_down, p.block_down, k * kRanges * kSCols, fixed_down,
                                               int(grid_down.x * grid_down.y), kSRegisters, c);
    if (up.ok && dn.ok) {
      launch_pdl(true, ex.gate.sym ? stream_gate_up_kernel<T, true> : stream_gate_up_kernel<T, false>, grid_up,
                 dim3(unsigned(up.threads)), up.smem, stream, x, router_logits, s.num_experts, k, view_of(ex.gate),
                 view_of(ex.up), p.block_up, up.ring, up.islots, ids, weights, act);
      if (shared_ready) MOESERVE_CUDA_CHECK(cudaStreamWaitEvent(stream, shared_ready, 0));  // down adds it
      launch_pdl(true, ex.down.sym ? stream_down_kernel<true> : stream_down_kernel<false>, grid_down,
                 dim3(unsigned(dn.threads)), dn.smem, stream, static_cast<const float*>(act),
                 static_cast<const int32_t*>(ids), static_cast<const float*>(weights), k, view_of(ex.down),
                 p.block_down, dn.ring, dn.islots, residual, shared_out, shared_gate_logit);
      return;
    }
  }
  const dim3 grid_up(unsigned((I + kCols - 1) / kCols), unsigned(M * k));
  // PDL (pdl.cuh): gate_up's CTAs wait for the preceding kernel; down's become resident once
  // every gate_up CTA has routed (all of them started) and wait for gate_up to complete.
  // gate and up share sym (plan_decode); down picks its own.
  launch_pdl(true, ex.gate.sym ? decode_gate_up_kernel<T, true> : decode_gate_up_kernel<T, false>, grid_up,
             dim3(unsigned(p.threads_up)), p.smem_up, stream, x, router_logits, s.num_experts, k, view_of(ex.gate),
             view_of(ex.up), p.block_up, ids, weights, act);
  const dim3 grid_down(unsigned((H + kCols - 1) / kCols), unsigned(M));
  if (shared_ready) MOESERVE_CUDA_CHECK(cudaStreamWaitEvent(stream, shared_ready, 0));  // down adds it
  launch_pdl(true, ex.down.sym ? decode_down_kernel<true> : decode_down_kernel<false>, grid_down,
             dim3(unsigned(p.threads_down)), p.smem_down, stream, static_cast<const float*>(act),
             static_cast<const int32_t*>(ids), static_cast<const float*>(weights), k, view_of(ex.down), p.block_down,
             residual, shared_out, shared_gate_logit);
}

template void gptq_decode<float>(const float*, const float*, const MoeShape&, const DeviceExperts&, int, int32_t*,
                                 float*, float*, float*, const float*, const float*, cudaStream_t, cudaEvent_t);
template void gptq_decode<bf16>(const bf16*, const float*, const MoeShape&, const DeviceExperts&, int, int32_t*, float*,
                                float*, float*, const float*, const float*, cudaStream_t, cudaEvent_t);

}  // namespace moeserve::cuda::moe_detail

namespace moeserve::cuda {

namespace {
// 1 (default): the streaming kernels; 0: the previous ones.
std::atomic<int> g_decode_variant{1};
}  // namespace

void set_moe_decode_variant(int variant) {
  if (variant != 0 && variant != 1)
    throw Error("set_moe_decode_variant: " + std::to_string(variant) +
                " (0: the previous kernels, 1: the streaming kernels)");
  g_decode_variant.store(variant);
}

int moe_decode_variant() { return g_decode_variant.load(); }

}  // namespace moeserve::cuda

