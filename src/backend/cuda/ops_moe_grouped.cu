// Routed GPTQ INT4 experts for generated-token steps of more than 8 tokens (batch decode, 9..64
// tokens by default; moe_routed_experts picks this path, ops_moe.cu): tokens grouped by expert,
// every CTA reads its slice of one expert's weights ONCE and applies it to all (up to kTile = 4)
// slots of that expert, dequantising each weight word once for all of them.
//
// Layout: the checkpoint's own (not reordered): qweight [E][K/8][N] int32 (nibble j of word
// (kp, n) = q[8kp + j, n]), scales f16 [E][K/g][N], qzeros [E][K/g][N/8] (stored zero - 1);
// x f32 or bf16 [M, H]; act f32 [M·k, I] and y f32 [M·k, H] by slot (slot = token·k + rank).
// The grouping is route_and_group's (ops_moe.cu) with tiles of kTile slots: tile t is expert
// expert[t] with the slots order[start[t] .. start[t] + count[t]); an expert with more than
// kTile slots has several tiles, adjacent in blockIdx.x, so their CTAs run together and share
// the expert's lines in L2. The routed sum, residual and gated shared expert are added by
// combine_routed (ops_moe.cu), as on the tiled path.
//
// grouped_gate_up_kernel: CTA (tile, 64 columns of I), 8 warps. Warp w sums K range w (the
//   tiled kernels' split: K/64 packed rows), lanes 0..15 the gate columns and lanes 16..31 the
//   up columns, 4 consecutive columns per lane (one 16-byte load per packed row: a warp reads
//   two 256-byte row slices per row). The tile's x rows are staged in shared memory as f32
//   ([kTile][H], 48 KB at H 3072); every lane of a warp reads the same x (a broadcast). A
//   thread walks its range in chunks of up to kChunk = 2 packed rows, the next chunk's words
//   (with its group's scales and zeros) loaded into registers while the current one is
//   computed, and keeps the rows up to kAhead = 12 packed rows further on requested into L2
//   (prefetch.global.L2, no registers): about (2 + 2 + 12) x 512 B = 8 KB per warp, 128 KB per
//   SM, of the slice in flight. (4-row register chunks spill at the 128 registers that 2 CTAs
//   per SM allow.) Each word is dequantised once (symmetric: dequant8_const_zero<8>;
//   asymmetric: dequant8_const_zero<0> then one FADD of the zero: both exact, the values of
//   dequant8) and multiplied into the block sums of all the tile's tokens (a tile of tn slots
//   runs the loop compiled for exactly tn). The 8 range partials meet in shared memory (over
//   the staged x, no longer read) and a thread per (slot, column) writes
//   act = silu(0 + g_0 + .. + g_7)·(0 + u_0 + .. + u_7).
// grouped_down_kernel: CTA (tile, 128 columns of H), 8 warps = the 8 K ranges of I, 32 lanes x
//   4 columns (512 contiguous bytes per packed row); the tile's act rows staged in shared
//   memory ([kTile][I]); y[slot, n] = 0 + range 0 + .. + range 7.
//
// Arithmetic (EXACTLY the tiled kernels', ops_moe_gptq.cu, and so the decode kernels',
// ops_moe_decode.cu): per (slot, column), K is cut into 8 ranges of K/64 packed rows, a range
// into scale blocks of block = gcd(K/64, g/8) rows; a block's sum is one fmaf(q - z, x, sum)
// chain over its k ascending from 0 (exact f32 q - z, f32 x); a range is fmaf(block_sum, scale,
// acc) over its blocks in order from 0; the output is ((0 + range 0) + range 1) + .. + range 7.
// The chunking, the tile, the grid and M only decide when and where these operations run, never
// their operands or order, so a token has the same bits through every path and every M.
//
// Bytes (per layer and step): each expert that any slot selects is read once per tile (once
// when it has <= kTile slots; further tiles of one expert mostly hit L2): distinct·(3·I·H/2 +
// 3·I·H/g·2) plus per CTA its tile's x rows from L2 (gate/up: 4·tn·H per 64 columns, i.e. 4·tn/64
// of the weight bytes; down: 4·tn·I per 128 columns). 122B-A10B at 64 tokens (top-8 of 256,
// ~222 distinct experts): 1.04 GB of INT4 experts + 33 MB of scales, 0.25 ms at 4.28 TB/s: the
// roofline. Arithmetic per weight word: 8 FFMA per slot plus the dequantisation (17
// instructions symmetric, 25 asymmetric) shared by the slots, plus 0.5 shared-memory x loads per
// slot (a row's x serves the lane's 4 words) and ~2.5 of loop, loads and prefetches: with ~2.3
// slots per expert about 39 instructions per word, 10 G thread-instructions per layer, of the
// same order as the byte time at the H200's issue rate (an estimate, not a measurement), so the
// loads and the FMAs both have to stay busy: 2 CTAs of 256 threads per SM, 128 registers, no
// spills on sm_121 (sm_90: 20 bytes in the asymmetric gate/up kernel).
// Preconditions (gptq_grouped_supported; otherwise the tiled path serves the step): the GPTQ fast
// path (K % 64 == 0, no act-order, g % 8 == 0, N % 8 == 0), gate and up with one group size and
// zero mode, x 16-byte aligned, the shared memory (gate/up max(16·H bytes, 16 KB)) within
// kMaxSmem and the device's opt-in limit. sm_90 and sm_121: plain loads, prefetch.global.L2 and
// FMAs only; at most 96 KB of shared memory per block (48 KB at the 122B shape, no opt-in).
#include <algorithm>
#include <atomic>
#include <numeric>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/l2_prefetch.cuh"
#include "backend/cuda/ops_moe_internal.cuh"

namespace moeserve::cuda::moe_detail {
namespace {

constexpr int kTile = kGroupedTile;  // slots per tile (route_and_group's tile size on this path)
constexpr int kRanges = 8;           // the tiled kernels' K split; warp w sums range w
constexpr int kThreads = 32 * kRanges;
constexpr int kUpCols = 64;     // gate/up: columns of I per CTA (16 lanes x 4, gate and up)
constexpr int kDownCols = 128;  // down: columns of H per CTA (32 lanes x 4)
constexpr int kChunk = 2;       // packed rows per register chunk (two chunks in flight)
constexpr int kAhead = 12;      // L2 prefetch distance beyond the chunk being loaded (packed rows)
constexpr int kStageUp = 12;   // 16-byte loads in flight per thread staging x (4 x 3072 floats: one round)
constexpr int kStageDown = 4;  // staging act (4 x 1024 floats: one round; 8 made the sm_90 down kernel spill)
constexpr size_t kMaxSmem = 96 * 1024;  // <= 99 KB per block (sm_121)

static_assert(kTile == 4, "the tn switch in the kernels covers tiles of up to 4 slots");

// One thread's weight stream: 4 consecutive columns n..n+3 of one projection of one expert.
struct Stream4 {
  const int32_t* qw;  // &qweight[e][0][n]; packed row kp at qw + kp·N
  const __half* sc;   // &scales[e][0][n]; group g at sc + g·N
  const int32_t* qz;  // &qzeros[e][0][n/8]; group g at qz + g·N/8 (asymmetric only)
  int N;
  int zshift;  // 4·(n % 8): the first of the 4 columns' nibbles in a zero word
};

// A chunk of up to kChunk packed rows, with the scales (4 x f16) and zero word of its group.
struct Chunk {
  uint4 w[kChunk];
  uint2 s;
  uint32_t z;
};

template <bool kSym>
__device__ __forceinline__ void load_chunk(const Stream4& st, int kq, int step, int group, Chunk& c) {
#pragma unroll
  for (int u = 0; u < kChunk; ++u)
    if (u < step) c.w[u] = __ldg(reinterpret_cast<const uint4*>(st.qw + size_t(kq + u) * st.N));
  const int g = kq * 8 / group;  // a chunk lies inside one scale block, a block inside one group
  c.s = __ldg(reinterpret_cast<const uint2*>(st.sc + size_t(g) * st.N));
  if constexpr (!kSym) c.z = uint32_t(__ldg(st.qz + size_t(g) * (st.N / 8)));
}

// L2 prefetch of this thread's 16 bytes of packed rows [r0, r1) (even lanes: one per 32-byte sector).
__device__ __forceinline__ void prefetch_rows(const Stream4& st, int r0, int r1, int lane) {
  if (lane & 1) return;
  for (int r = r0; r < r1; ++r) prefetch_l2(st.qw + size_t(r) * st.N);
}

// acc[c][j] = range sum of column n + c for token j < TN over packed rows [kp0, kp0 + rows):
// blocks of `block` rows, each one fmaf chain in ascending k from 0, scaled into acc with
// fmaf(block_sum, scale, acc) (acc must hold 0 on entry). The range is walked in chunks of
// `step` rows (a power of two <= kChunk dividing block). xs: token j's f32 row at xs + j·xstride.
template <int TN, bool kSym>
__device__ __forceinline__ void range_dot(const Stream4& st, int kp0, int rows, int block, int step, int group,
                                          const float* xs, int xstride, int lane, float (&acc)[4][kTile]) {
  const int end = kp0 + rows;
  Chunk cur, nxt;
  load_chunk<kSym>(st, kp0, step, group, cur);
  float bs[4][TN], s[4], zf[4];
  const NibbleExp nexp = nibble_exponents();
  int inblk = 0;  // rows of the current scale block already summed
  for (int kq = kp0; kq < end; kq += step) {
    const bool more = kq + step < end;
    if (more) load_chunk<kSym>(st, kq + step, step, group, nxt);
    {  // keep the L2 window kAhead rows past the chunk just requested (kq + step)
      const int p0 = kq + step + kAhead;
      if (p0 < end) prefetch_rows(st, p0, min(end, p0 + step), lane);
    }
    if (inblk == 0) {  // a new scale block: its scales (and zeros) came with this chunk
      const __half2 s01 = *reinterpret_cast<const __half2*>(&cur.s.x);
      const __half2 s23 = *reinterpret_cast<const __half2*>(&cur.s.y);
      s[0] = __low2float(s01);
      s[1] = __high2float(s01);
      s[2] = __low2float(s23);
      s[3] = __high2float(s23);
      if constexpr (!kSym) {
#pragma unroll
        for (int c = 0; c < 4; ++c)  // zero = stored nibble + 1, as the tiled kernels' zero_pair
          zf[c] = float(int((cur.z >> (st.zshift + 4 * c)) & 0xFu) + 1);
      }
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int j = 0; j < TN; ++j) bs[c][j] = 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      if (u >= step) break;
      const int kp = kq + u;
      float xv[TN][8];
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const float4* xp = reinterpret_cast<const float4*>(xs + j * xstride + kp * 8);
        const float4 a = xp[0], b = xp[1];
        xv[j][0] = a.x, xv[j][1] = a.y, xv[j][2] = a.z, xv[j][3] = a.w;
        xv[j][4] = b.x, xv[j][5] = b.y, xv[j][6] = b.z, xv[j][7] = b.w;
      }
      const uint32_t wc[4] = {cur.w[u].x, cur.w[u].y, cur.w[u].z, cur.w[u].w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float f[8];
        if constexpr (kSym) {
          dequant8_const_zero<8>(wc[c], nexp, f);
        } else {  // q exactly, then q - zero exactly: the same f32 values as dequant8
          dequant8_const_zero<0>(wc[c], nexp, f);
#pragma unroll
          for (int i = 0; i < 8; ++i) f[i] -= zf[c];
        }
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          float a = bs[c][j];
#pragma unroll
          for (int i = 0; i < 8; ++i) a = fmaf(f[i], xv[j][i], a);
          bs[c][j] = a;
        }
      }
    }
    inblk += step;
    if (inblk == block) {  // the block ends: scale its sums once
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[c][j] = fmaf(bs[c][j], s[c], acc[c][j]);
      inblk = 0;
    }
    if (more) cur = nxt;
  }
}

template <bool kSym>
__device__ __forceinline__ void range_dot_tn(int tn, const Stream4& st, int kp0, int rows, int block, int step,
                                             int group, const float* xs, int xstride, int lane,
                                             float (&acc)[4][kTile]) {
  switch (tn) {  // compiled per slot count: no FMAs on absent slots
    case 1: range_dot<1, kSym>(st, kp0, rows, block, step, group, xs, xstride, lane, acc); break;
    case 2: range_dot<2, kSym>(st, kp0, rows, block, step, group, xs, xstride, lane, acc); break;
    case 3: range_dot<3, kSym>(st, kp0, rows, block, step, group, xs, xstride, lane, acc); break;
    default: range_dot<4, kSym>(st, kp0, rows, block, step, group, xs, xstride, lane, acc); break;
  }
}

// The range walk of one projection (RangePlan of ops_moe_gptq.cu, recomputed here).
struct RangeShape {
  int rows;   // packed rows per range: K / 64
  int block;  // packed rows per scale block: gcd(rows, g / 8)
  int step;   // packed rows per chunk: the largest power of two <= kChunk dividing block
  int group;
};

RangeShape range_shape(int K, int group) {
  RangeShape r;
  r.rows = K / 8 / kRanges;
  r.block = std::gcd(r.rows, group / 8);
  r.step = kChunk;
  while (r.block % r.step) r.step /= 2;
  r.group = group;
  return r;
}

struct TileMeta {
  bool live;
  int e, first, tn;
};
// The grid is sized for the most tiles a step can have; CTAs past *num_tiles exit. The tile
// arrays hold that many entries, so the loads are in bounds either way.
__device__ __forceinline__ TileMeta tile_meta(const TileList& tiles, int t) {
  const int num = __ldg(tiles.num_tiles);
  const int e = __ldg(tiles.expert + t), first = __ldg(tiles.start + t), tn = __ldg(tiles.count + t);
  return {t < num, e, first, min(tn, kTile)};
}

__device__ __forceinline__ int pick(const int (&v)[kTile], int j) {  // v[j] without local memory
  int r = v[0];
#pragma unroll
  for (int q = 1; q < kTile; ++q)
    if (j == q) r = v[q];
  return r;
}

// Four consecutive activations as f32 (bf16 widened exactly, as to_f32).
template <typename Tx>
__device__ __forceinline__ float4 load4(const Tx* p) {
  if constexpr (std::is_same_v<Tx, float>) {
    return __ldg(reinterpret_cast<const float4*>(p));
  } else {
    const uint2 r = __ldg(reinterpret_cast<const uint2*>(p));
    return make_float4(__uint_as_float(r.x << 16), __uint_as_float(r.x & 0xFFFF0000u), __uint_as_float(r.y << 16),
                       __uint_as_float(r.y & 0xFFFF0000u));
  }
}

// Copies tn rows of len activations (row j at src + row[j]·len; len % 4 == 0) into xs[j·len ..]
// as f32, V 16-byte loads in flight per thread before the first store; then a barrier.
template <int V, typename Tx>
__device__ __forceinline__ void stage_tile(const Tx* __restrict__ src, const int (&row)[kTile], int tn, int len,
                                           float* xs) {
  const int vpr = len / 4, nvec = tn * vpr;
  for (int base = threadIdx.x; base < nvec; base += V * kThreads) {
    float4 v[V];
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const int vi = base + q * kThreads;
      if (vi < nvec) {
        const int j = vi / vpr, i = vi - j * vpr;
        v[q] = load4(src + size_t(pick(row, j)) * len + 4 * i);
      }
    }
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const int vi = base + q * kThreads;
      if (vi < nvec) reinterpret_cast<float4*>(xs)[vi] = v[q];  // xs[j·len + 4i] = 4·vi
    }
  }
  __syncthreads();
}

// Dynamic shared memory: x rows [kTile][H] f32, then (reused) part [2][8][kTile][kUpCols].
template <typename Tx, bool kSym>
__global__ void __launch_bounds__(kThreads, 2)
    grouped_gate_up_kernel(const Tx* __restrict__ x, int k_top, TileList tiles, ExpertView gate, ExpertView up,
                           RangeShape rs, float* __restrict__ act) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  const TileMeta meta = tile_meta(tiles, blockIdx.x);
  if (!meta.live) return;  // uniform per CTA, before any barrier
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int H = gate.K, I = gate.N, e = meta.e, tn = meta.tn;
  const int p = lane >> 4, cq = lane & 15;  // projection (0 gate, 1 up), column quad
  const int n0 = blockIdx.y * kUpCols, n = n0 + 4 * cq;
  const bool ok = n < I;  // I % 8 == 0: all 4 columns exist
  const int groups = H / gate.group;
  Stream4 st;
  st.qw = (p ? up.qweight : gate.qweight) + size_t(e) * (H / 8) * I + n;
  st.sc = (p ? up.scales : gate.scales) + size_t(e) * groups * I + n;
  st.qz = kSym ? nullptr : (p ? up.qzeros : gate.qzeros) + size_t(e) * groups * (I / 8) + n / 8;
  st.N = I;
  st.zshift = 4 * (n % 8);
  const int kp0 = warp * rs.rows;
  // The first rows into L2 while x is staged.
  if (ok) prefetch_rows(st, kp0, min(kp0 + rs.rows, kp0 + rs.step + kAhead), lane);
  int slot[kTile], token[kTile];
#pragma unroll
  for (int j = 0; j < kTile; ++j) {
    slot[j] = j < tn ? __ldg(tiles.order + meta.first + j) : 0;
    token[j] = slot[j] / k_top;
  }
  stage_tile<kStageUp, Tx>(x, token, tn, H, xs);
  float acc[4][kTile];
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int j = 0; j < kTile; ++j) acc[c][j] = 0.0f;
  if (ok) range_dot_tn<kSym>(tn, st, kp0, rs.rows, rs.block, rs.step, rs.group, xs, H, lane, acc);
  __syncthreads();  // x is no longer read: part reuses it
  float* part = xs;
  if (ok) {
#pragma unroll
    for (int j = 0; j < kTile; ++j)
      if (j < tn)
        *reinterpret_cast<float4*>(part + ((p * kRanges + warp) * kTile + j) * kUpCols + 4 * cq) =
            make_float4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]);
  }
  __syncthreads();
  for (int it = threadIdx.x; it < tn * kUpCols; it += kThreads) {
    const int j = it / kUpCols, col = it % kUpCols;
    if (n0 + col >= I) continue;
    float g = 0.0f, u = 0.0f;  // the tiled kernels' warp order
#pragma unroll
    for (int r = 0; r < kRanges; ++r) {
      g += part[(r * kTile + j) * kUpCols + col];
      u += part[((kRanges + r) * kTile + j) * kUpCols + col];
    }
    act[size_t(pick(slot, j)) * I + n0 + col] = silu_mul(g, u);
  }
}

// Dynamic shared memory: act rows [kTile][I] f32, then (reused) part [8][kTile][kDownCols].
template <bool kSym>
__global__ void __launch_bounds__(kThreads, 2)
    grouped_down_kernel(const float* __restrict__ act, TileList tiles, ExpertView down, RangeShape rs,
                        float* __restrict__ y) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  const TileMeta meta = tile_meta(tiles, blockIdx.x);
  if (!meta.live) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int H = down.N, I = down.K, e = meta.e, tn = meta.tn;
  const int n0 = blockIdx.y * kDownCols, n = n0 + 4 * lane;
  const bool ok = n < H;  // H % 8 == 0
  const int groups = I / down.group;
  Stream4 st;
  st.qw = down.qweight + size_t(e) * (I / 8) * H + n;
  st.sc = down.scales + size_t(e) * groups * H + n;
  st.qz = kSym ? nullptr : down.qzeros + size_t(e) * groups * (H / 8) + n / 8;
  st.N = H;
  st.zshift = 4 * (n % 8);
  const int kp0 = warp * rs.rows;
  if (ok) prefetch_rows(st, kp0, min(kp0 + rs.rows, kp0 + rs.step + kAhead), lane);
  int slot[kTile];
#pragma unroll
  for (int j = 0; j < kTile; ++j) slot[j] = j < tn ? __ldg(tiles.order + meta.first + j) : 0;
  stage_tile<kStageDown, float>(act, slot, tn, I, xs);
  float acc[4][kTile];
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int j = 0; j < kTile; ++j) acc[c][j] = 0.0f;
  if (ok) range_dot_tn<kSym>(tn, st, kp0, rs.rows, rs.block, rs.step, rs.group, xs, I, lane, acc);
  __syncthreads();
  float* part = xs;
  if (ok) {
#pragma unroll
    for (int j = 0; j < kTile; ++j)
      if (j < tn)
        *reinterpret_cast<float4*>(part + (warp * kTile + j) * kDownCols + 4 * lane) =
            make_float4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]);
  }
  __syncthreads();
  for (int it = threadIdx.x; it < tn * kDownCols; it += kThreads) {
    const int j = it / kDownCols, col = it % kDownCols;
    if (n0 + col >= H) continue;
    float v = 0.0f;
#pragma unroll
    for (int r = 0; r < kRanges; ++r) v += part[(r * kTile + j) * kDownCols + col];
    y[size_t(pick(slot, j)) * H + n0 + col] = v;
  }
}

size_t smem_up(int H) {
  return std::max(size_t(kTile) * size_t(H), size_t(2) * kRanges * kTile * kUpCols) * sizeof(float);
}
size_t smem_down(int I) {
  return std::max(size_t(kTile) * size_t(I), size_t(kRanges) * kTile * kDownCols) * sizeof(float);
}

int current_device() {
  int dev = 0;
  MOESERVE_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

size_t device_smem_optin() {
  static std::atomic<int64_t> cache[64];  // 0: not read yet
  const int dev = current_device();
  if (dev < 64) {
    const int64_t v = cache[dev].load();
    if (v > 0) return size_t(v);
  }
  int bytes = 0;
  MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (dev < 64) cache[dev].store(bytes);
  return size_t(bytes);
}

// Opts a kernel in to kMaxSmem of dynamic shared memory, once per device (only shapes that
// need more than the default 48 KB get here; the 122B shape does not).
template <typename Kernel>
void ensure_opt_in(Kernel kernel, std::atomic<uint64_t>& done) {
  const int dev = current_device();
  const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
  if (bit && (done.load() & bit)) return;
  const int bytes = int(std::min(kMaxSmem, device_smem_optin()));  // >= the launch's (gptq_grouped_supported)
  MOESERVE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.fetch_or(bit);
}

template <typename Tx, bool kSym>
void launch_gate_up(const Tx* x, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
                    float* act, cudaStream_t stream) {
  static std::atomic<uint64_t> opted{0};
  const size_t smem = smem_up(s.hidden);
  if (smem > 48 * 1024) ensure_opt_in(grouped_gate_up_kernel<Tx, kSym>, opted);
  const dim3 grid(unsigned(grid_tiles), unsigned((s.intermediate + kUpCols - 1) / kUpCols));
  grouped_gate_up_kernel<Tx, kSym><<<grid, kThreads, smem, stream>>>(
      x, s.top_k, tiles, view_of(ex.gate), view_of(ex.up), range_shape(s.hidden, int(ex.gate.group_size)), act);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

template <bool kSym>
void launch_down(const float* act, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
                 float* y, cudaStream_t stream) {
  static std::atomic<uint64_t> opted{0};
  const size_t smem = smem_down(s.intermediate);
  if (smem > 48 * 1024) ensure_opt_in(grouped_down_kernel<kSym>, opted);
  const dim3 grid(unsigned(grid_tiles), unsigned((s.hidden + kDownCols - 1) / kDownCols));
  grouped_down_kernel<kSym><<<grid, kThreads, smem, stream>>>(
      act, tiles, view_of(ex.down), range_shape(s.intermediate, int(ex.down.group_size)), y);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool gptq_grouped_supported(const MoeShape& s, const DeviceExperts& ex) {
  if (!gptq_fast_path(ex) || ex.gate.group_size != ex.up.group_size || ex.gate.sym != ex.up.sym) return false;
  if (s.top_k < 1 || s.top_k > kMaxTopK || s.num_experts < 1 || s.num_experts > kMaxExperts) return false;
  const int H = s.hidden, I = s.intermediate;
  if (int(ex.gate.K) != H || int(ex.gate.N) != I || int(ex.up.K) != H || int(ex.up.N) != I || int(ex.down.K) != I ||
      int(ex.down.N) != H)
    return false;
  const size_t limit = std::min(kMaxSmem, device_smem_optin());
  return smem_up(H) <= limit && smem_down(I) <= limit;
}

template <typename T>
void gptq_grouped(const T* x, const MoeShape& s, const DeviceExperts& ex, const TileList& tiles, int grid_tiles,
                  float* act, float* y, cudaStream_t stream) {
  if (grid_tiles <= 0) return;
  if (ex.gate.sym)
    launch_gate_up<T, true>(x, s, ex, tiles, grid_tiles, act, stream);
  else
    launch_gate_up<T, false>(x, s, ex, tiles, grid_tiles, act, stream);
  if (ex.down.sym)
    launch_down<true>(act, s, ex, tiles, grid_tiles, y, stream);
  else
    launch_down<false>(act, s, ex, tiles, grid_tiles, y, stream);
}

template void gptq_grouped<float>(const float*, const MoeShape&, const DeviceExperts&, const TileList&, int, float*,
                                  float*, cudaStream_t);
template void gptq_grouped<bf16>(const bf16*, const MoeShape&, const DeviceExperts&, const TileList&, int, float*,
                                 float*, cudaStream_t);

}  // namespace moeserve::cuda::moe_detail
