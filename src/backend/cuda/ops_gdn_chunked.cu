// Chunked (WY) Gated DeltaNet for prompt tokens (ops_gdn_chunked.h, spec 2.5 items 1-9).
//
// Notation, per v-head h (k-head kh = h / (nv/nk)) and chunk of L <= C = 64 tokens t = 0..L−1
// (positions [64c, 64c + 64) of one sequence, cut to the step's slice): q̂_t, k̂_t ∈ R^dk,
// v_t ∈ R^dv, g_t (log decay), β_t; S ∈ R^{dk×dv} the state before the chunk.
//   γ_t   = Σ_{m<=t} g_m                       (f32, summed in t order)
//   A_ts  = β_t (k̂_t·k̂_s) e^{γ_t−γ_s}, s < t   (strictly lower)
//   U     = (I + A)^{-1} diag(β) V,  W = (I + A)^{-1} diag(β e^γ) K   (forward substitution)
//   V'    = U − W S
//   O_t   = e^{γ_t} q̂_t S + Σ_{s<=t} (q̂_t·k̂_s) e^{γ_t−γ_s} V'_s
//   S    <- e^{γ_{L−1}} S + Σ_t k̂_t ⊗ (e^{γ_{L−1}−γ_t} V'_t)
// (the recurrence S <- e^g S, Δ = β(v − Sᵀk), S += k ⊗ Δ, o = Sᵀq, grouped by chunks). With
// P_ts = (q̂_t·k̂_s) e^{γ_t−γ_s} (s <= t) the output splits into a part without S and one with:
//   O     = Q̃ S + P U,   Q̃_t = e^{γ_t} q̂_t − Σ_{s<=t} P_ts W_s
// so everything except the three products with S (W S, Q̃ S, K̂ᵀV'') is computed in parallel
// over chunks, and the sequential pass does only those. A partial chunk (a slice starting or
// ending inside a chunk) runs the same math on its L < 64 tokens; rows t >= L are zero in
// shared memory and contribute exact zeros.
//
// Variants (set_gdn_chunked_variant, ops_gdn_chunked.h): kernels 2 and 3 below are the
// CUDA-core forms (variant 0); variant 1 replaces kernel 2 with the tensor-core kernel of
// ops_gdn_chunked_intra_tc.cu (one CTA per (chunk, v-head), T = (I + A)^{-1}, 3xTF32
// products), variant 2 (default) also kernel 3 with ops_gdn_chunked_state_tc.cu (the same
// pass with 3xTF32 products). Their headers give their layouts and work counts.
//
// Kernels (stream order, plain launches; one job each):
// 1. chunk_prep_kernel: conv + SiLU (the slot's conv state before a sequence's first new
//    token), l2norm(q)/sqrt(dk), l2norm(k), g and β, for the prompt rows. Grid (ceil(P/4),
//    nk + nv), block round32(max(dk, dv)): a key-head CTA does q and k of 4 tokens (thread =
//    channel, the 4 + K − 1 input rows of its channel loaded at once: ConvRows; block
//    reductions in a fixed warp order), a value-head CTA v and the gates.
//    Writes conv_out [P][conv_dim] (q̂ | k̂ | v), g and β [P][nv]. P = prompt rows.
//    Bytes: P·conv_dim·(4 + 4) + P·nv·16.
// 2. chunk_intra_kernel: everything inside a chunk that does not need S, all chunks of all
//    heads at once. Grid (chunk bound, nk), 256 threads; a CTA finds its chunk by walking the
//    sequences' chunk counts (surplus CTAs exit). Per (chunk, k-head): K̂ and Q̂ in shared
//    memory, K̂K̂ᵀ and Q̂K̂ᵀ (thread = 4×4 interleaved outputs, dk order). Then per v-head of
//    the group: γ (one thread, t order), A and P, and per column (thread = column, the 64
//    rows in registers) of U (dv columns) and W (dk columns): the forward substitution
//    (I + A) X = R (row t = R_t − Σ_{s<t} A_ts X_s in s order), then Y = P X (s order). Writes
//    gam [P][nv] (γ), U [P][nv][dv], W [P][nv][dk], Q̃ = e^γ q̂ − P W to qt [P][nv][dk], and
//    P U over the head's v columns of conv_out (read only by this thread before).
//    FMAs per (chunk, k-head): 2·64²·dk (K̂K̂ᵀ and Q̂K̂ᵀ, full squares) + per v-head
//    64²·(dk + dv) (substitution and P X, Σ_t t per column). Bytes: reads conv_out, writes U,
//    W, qt, gam, P U: P·(conv_dim + nv·(2·dk + 2·dv + 1))·4.
// 3. chunk_state_kernel: the inter-chunk pass, sequential in chunks, parallel over (sequence,
//    v-head, 32-column block of S): columns of S evolve independently given W, U, K̂, so one
//    sequence fills nv·dv/32 CTAs (256 at the 122B shape, two per SM: at most 128 registers, 95 KB
//    of shared memory). The CTA walks each chunk in stages (ceil(dk/64) product stages of 64
//    values of i: X = W S and Y = Q̃ S; one update stage: S = e^{γ_{L−1}} S + K̂ᵀ V''), each
//    stage's tiles copied by cp.async into one of two buffers while the previous stage
//    computes; one barrier per stage. Products: warps 0-3 X, warps 4-7 Y, thread = 4 tokens
//    × 4 columns, 16-B shared loads (8 per 64 FMAs), i order. At the last product stage
//    V'' = e^{γ_{L−1}−γ_t} (U − X) goes to shared memory and O = Y + P U to global memory
//    (over P U; U and P U were loaded to registers at the chunk's start). Update: thread = 4
//    rows × 4 columns of S, held in registers across chunks (and mirrored in shared memory
//    for the products), t order. It also writes the sequence's new conv state (the prep
//    kernel that read the old one has finished).
//    FMAs per (chunk, v-head): 3·64·dk·dv. Bytes per chunk and CTA (L2): 64·(3·dk + 2·32)·4
//    in, 64·32·4 out; the state once.
// 4. chunk_norm_kernel: gated RMSNorm (plain w, silu(z)) per (row, v-head), one warp each,
//    the lane-strided sum of squares then an xor tree; reads O from conv_out's v columns.
//    Bytes: P·nv·dv·12.
//
// Roofline per token and layer (executed FMAs; the triangular products run as full squares
// in K̂K̂ᵀ, Q̂K̂ᵀ and as triangles in the column passes):
//   intra: nk·128·dk (K̂K̂ᵀ, Q̂K̂ᵀ) + nv·64·(dk + dv) (substitution, P U, P W)
//   state: nv·3·dk·dv                               (W S, Q̃ S, K̂ᵀV'')
//   at the 122B shape (nk 16, nv 64, dk = dv = 128): 1.31 + 3.15 ≈ 4.5 MFMA ≈ 9 MFLOP, f32 CUDA
//   cores. DRAM bytes (f32), each tensor written once and read once: qkv + conv_out (write,
//   read) 3·conv_dim·4, U, W, Q̃ (write, read) 6·nv·dv·4 (dk = dv), P U / O (write, read)
//   4·nv·dv·4, z and out 2·nv·dv·4 ≈ 0.6 MB per token at the 122B shape: compute bound on
//   f32 CUDA cores, DRAM traffic not far behind (the tiles that the dv/32 column-block CTAs
//   re-read come from L2). Tensor cores (with an f32-accurate operand split) would be the
//   next step. One sequence's floor is also the chunk chain: T/64 dependent state-pass steps
//   of 3·64·dk·32 FMAs per CTA.
//
// Determinism: every sum has one order fixed by the shape (dk, dv, the chunk's token order),
// never by the grid, M or the other sequences; each chunk's arithmetic depends only on its own
// tokens and incoming state, so prefill cut at multiples of 64 positions equals one pass bit
// for bit. Arithmetic uses explicit _rn intrinsics (nothing left to contraction choices).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gdn_conv_state.cuh"
#include "backend/cuda/gdn_math.cuh"
#include "backend/cuda/ops_gdn_chunked.h"
#include "backend/cuda/ops_gdn_chunked_internal.cuh"

namespace moeserve::cuda {
namespace {

using gdn_chunked::chunk_range;
using gdn_chunked::find_chunk;
using gdn_chunked::kC;
using gdn_chunked::kMaxD;
using gdn_chunked::num_chunks;
using gdn_chunked::Work;

constexpr int kMaxConvK = 8;
constexpr int kPrepTT = 4;         // prep: tokens per CTA (8: 6% slower, 16: 1.7x; PERF.md runs X5-X7)
constexpr int kThreads = 256;      // intra and state kernels
constexpr int kBN = 32;            // state pass: columns of S per CTA
constexpr int kNormWarps = 8;

size_t round_region(size_t n) { return (n + 63) / 64 * 64; }

size_t work_floats(const GdnShape& s, size_t P) {
  return round_region(P * size_t(s.conv_dim())) + 3 * round_region(P * size_t(s.num_v_heads)) +
         2 * round_region(P * size_t(s.num_v_heads) * s.k_head_dim) +
         round_region(P * size_t(s.value_dim()));
}

Work carve(void* ws, const GdnShape& s, size_t P) {
  float* p = static_cast<float*>(ws);
  Work w{};
  w.conv_out = p;
  p += round_region(P * size_t(s.conv_dim()));
  w.g = p;
  p += round_region(P * size_t(s.num_v_heads));
  w.beta = p;
  p += round_region(P * size_t(s.num_v_heads));
  w.gam = p;
  p += round_region(P * size_t(s.num_v_heads));
  w.qt = p;
  p += round_region(P * size_t(s.num_v_heads) * s.k_head_dim);
  w.w = p;
  p += round_region(P * size_t(s.num_v_heads) * s.k_head_dim);
  w.u = p;
  return w;
}

using gdn_math::block_sums;
using gdn_math::silu;
using gdn_math::warp_sum;

// ---- 1. prep ---------------------------------------------------------------------------


// The causal depthwise conv of one channel c for kPrepTT consecutive global rows from m0, its
// inputs in registers: load() fetches rows m0−(K−1) .. m0+nt−1 of the channel at once (all loads
// independent, each value once instead of once per tap); conv(t) returns silu(Σ_j cw[j]·u_j) over
// the taps j = 0 .. K−1 in order (rows m0+t−(K−1)+j), a tap before the sequence's first row t0
// reading the slot's conv state st [conv_dim][K−1], oldest first, instead (the loaded value there
// belongs to another sequence or was not loaded).
struct ConvRows {
  float cw[kMaxConvK], x[kMaxConvK - 1 + kPrepTT];
  int c, K, m0;
  __device__ __forceinline__ void load(const float* __restrict__ qkv, const float* __restrict__ conv_weight, int ch,
                                       int C, int k, int rows_begin, int nt) {
    c = ch, K = k, m0 = rows_begin;
#pragma unroll
    for (int j = 0; j < kMaxConvK; ++j) cw[j] = j < K ? conv_weight[size_t(c) * K + j] : 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxConvK - 1 + kPrepTT; ++r) {
      const int row = m0 - (K - 1) + r;  // x[r] holds row m0 − (K−1) + r
      x[r] = r < K - 1 + nt && row >= 0 ? qkv[size_t(row) * C + c] : 0.0f;
    }
  }
  __device__ __forceinline__ float conv(int t, int t0, const float* st) const {
    const int m = m0 + t;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxConvK; ++j) {
      if (j >= K) break;
      const int row = m - (K - 1) + j;
      const float u = row >= t0 ? x[t + j] : st[size_t(c) * (K - 1) + (row - t0 + K - 1)];
      acc = __fmaf_rn(cw[j], u, acc);
    }
    return silu(acc);
  }
};

__global__ void __launch_bounds__(kMaxD) chunk_prep_kernel(const float* __restrict__ qkv, const float* __restrict__ b,
                                                           const float* __restrict__ a, GdnShape s, GdnLayerParams p,
                                                           StepMeta meta, int first_row, Work w) {
  __shared__ float red[(kMaxD / 32) * kPrepTT];
  const int nk = s.num_k_heads, nv = s.num_v_heads, dk = s.k_head_dim, dv = s.v_head_dim;
  const int C = s.conv_dim(), K = s.conv_kernel, key_dim = s.key_dim();
  const int unit = blockIdx.y, i = threadIdx.x;
  const int P = meta.num_tokens - first_row;
  const int r0 = blockIdx.x * kPrepTT, nt = min(kPrepTT, P - r0);
  int t0[kPrepTT];
  const float* st[kPrepTT];
#pragma unroll
  for (int t = 0; t < kPrepTT; ++t) {
    t0[t] = 0;
    st[t] = p.conv_state;
    if (t < nt) {
      const int seq = meta.token_seq[first_row + r0 + t];
      t0[t] = meta.seq_token_start[seq];
      st[t] = p.conv_state + size_t(meta.seq_state_slot[seq]) * C * (K - 1);
    }
  }
  if (unit < nk) {
    ConvRows q, k;
    if (i < dk) {
      q.load(qkv, p.conv_weight, unit * dk + i, C, K, first_row + r0, nt);
      k.load(qkv, p.conv_weight, key_dim + unit * dk + i, C, K, first_row + r0, nt);
    }
    float qv[kPrepTT], kv[kPrepTT], qq[kPrepTT], kk[kPrepTT];
#pragma unroll
    for (int t = 0; t < kPrepTT; ++t) {
      qv[t] = kv[t] = 0.0f;
      if (i < dk && t < nt) {
        qv[t] = q.conv(t, t0[t], st[t]);
        kv[t] = k.conv(t, t0[t], st[t]);
      }
      qq[t] = __fmul_rn(qv[t], qv[t]);
      kk[t] = __fmul_rn(kv[t], kv[t]);
    }
    block_sums(qq, red);
    block_sums(kk, red);
#pragma unroll
    for (int t = 0; t < kPrepTT; ++t) {
      if (i < dk && t < nt) {
        const float qn = gdn_math::l2norm_q(qv[t], qq[t], dk);
        const float kn = gdn_math::l2norm_k(kv[t], kk[t]);
        float* row = w.conv_out + size_t(r0 + t) * C;
        row[unit * dk + i] = qn;
        row[key_dim + unit * dk + i] = kn;
      }
    }
  } else {
    const int h = unit - nk;
    if (i < dv) {
      ConvRows v;
      v.load(qkv, p.conv_weight, 2 * key_dim + h * dv + i, C, K, first_row + r0, nt);
      float out[kPrepTT];
#pragma unroll
      for (int t = 0; t < kPrepTT; ++t) out[t] = t < nt ? v.conv(t, t0[t], st[t]) : 0.0f;
#pragma unroll
      for (int t = 0; t < kPrepTT; ++t)
        if (t < nt) w.conv_out[size_t(r0 + t) * C + v.c] = out[t];
    }
    if (i < nt) {
      const size_t gi = size_t(first_row + r0 + i) * nv + h, wi = size_t(r0 + i) * nv + h;
      w.g[wi] = gdn_math::gdn_log_decay(a[gi], p.dt_bias[h], p.a_log[h]);
      w.beta[wi] = gdn_math::gdn_beta(b[gi]);
    }
  }
}

// ---- 2. intra-chunk --------------------------------------------------------------------

// Shared memory of the intra kernel (floats): two regions of max(64·ldk, 2·64·64) floats:
// R1 holds K̂ [64][ldk], then K̂K̂ᵀ [64][64] | Q̂K̂ᵀ [64][64]; R2 holds Q̂ [64][ldk], then A [64][64] |
// P [64][64] (per v-head); then γ, β, g [64] each. ldk = dk + 4 (16-B rows, ≡ 4 mod 32 banks).
__host__ __device__ inline int intra_region_floats(int dk) { return max(kC * (dk + 4), 2 * kC * kC); }
__host__ __device__ inline int intra_smem_floats(int dk) { return 2 * intra_region_floats(dk) + 3 * kC; }

__global__ void __launch_bounds__(kThreads) chunk_intra_kernel(GdnShape s, StepMeta meta, int first_seq, int first_row,
                                                              Work w) {
  extern __shared__ __align__(16) float smem[];
  int seq, row0, L;
  if (!find_chunk(meta, first_seq, blockIdx.x, seq, row0, L)) return;  // the whole CTA, before any barrier
  const int nv = s.num_v_heads, dk = s.k_head_dim, dv = s.v_head_dim;
  const int C = s.conv_dim(), key_dim = s.key_dim(), grp = nv / s.num_k_heads;
  const int kh = blockIdx.y, tid = threadIdx.x;
  const int r0 = row0 - first_row;  // workspace row of the chunk's first token
  const int ldk = dk + 4;
  float* Ks = smem;
  float* Qs = smem + intra_region_floats(dk);
  float* KK = Ks;  // K̂K̂ᵀ and Q̂K̂ᵀ over K̂ once both products are in registers
  float* QK = Ks + kC * kC;
  float* As = Qs;  // A and P over Q̂
  float* Ps = Qs + kC * kC;
  float* gs = Qs + intra_region_floats(dk);
  float* bs = gs + kC;
  float* graw = bs + kC;

  // K̂ and Q̂ of the chunk's tokens; rows >= L are zero.
  const int nq4 = dk / 4;
  for (int idx = tid; idx < kC * nq4; idx += kThreads) {
    const int t = idx / nq4, e = (idx % nq4) * 4;
    float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), qv = kv;
    if (t < L) {
      const float* row = w.conv_out + size_t(r0 + t) * C;
      kv = *reinterpret_cast<const float4*>(row + key_dim + kh * dk + e);
      qv = *reinterpret_cast<const float4*>(row + kh * dk + e);
    }
    *reinterpret_cast<float4*>(Ks + t * ldk + e) = kv;
    *reinterpret_cast<float4*>(Qs + t * ldk + e) = qv;
  }
  __syncthreads();

  // K̂K̂ᵀ and Q̂K̂ᵀ: thread (ti, tj) owns rows ti + 16p and columns tj + 16q (p, q < 4), dk order.
  {
    const int ti = tid >> 4, tj = tid & 15;
    float kk[4][4], qk[4][4];
#pragma unroll
    for (int pp = 0; pp < 4; ++pp)
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) kk[pp][qq] = qk[pp][qq] = 0.0f;
    for (int d = 0; d < dk; d += 4) {
      float4 ki[4], qi[4], kj[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        ki[x] = *reinterpret_cast<const float4*>(Ks + (ti + 16 * x) * ldk + d);
        qi[x] = *reinterpret_cast<const float4*>(Qs + (ti + 16 * x) * ldk + d);
        kj[x] = *reinterpret_cast<const float4*>(Ks + (tj + 16 * x) * ldk + d);
      }
#pragma unroll
      for (int pp = 0; pp < 4; ++pp)
#pragma unroll
        for (int qq = 0; qq < 4; ++qq) {
          float acc = kk[pp][qq];
          acc = __fmaf_rn(ki[pp].x, kj[qq].x, acc);
          acc = __fmaf_rn(ki[pp].y, kj[qq].y, acc);
          acc = __fmaf_rn(ki[pp].z, kj[qq].z, acc);
          kk[pp][qq] = __fmaf_rn(ki[pp].w, kj[qq].w, acc);
          acc = qk[pp][qq];
          acc = __fmaf_rn(qi[pp].x, kj[qq].x, acc);
          acc = __fmaf_rn(qi[pp].y, kj[qq].y, acc);
          acc = __fmaf_rn(qi[pp].z, kj[qq].z, acc);
          qk[pp][qq] = __fmaf_rn(qi[pp].w, kj[qq].w, acc);
        }
    }
    __syncthreads();  // every thread is done with K̂ and Q̂ (their space is reused)
#pragma unroll
    for (int pp = 0; pp < 4; ++pp)
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) {
        const int i = ti + 16 * pp, j = tj + 16 * qq;
        KK[i * kC + j] = kk[pp][qq];
        QK[i * kC + j] = qk[pp][qq];
      }
  }
  __syncthreads();

  const size_t crow = size_t(r0) * C;  // conv_out offset of the chunk's first row
  for (int e = 0; e < grp; ++e) {
    const int h = kh * grp + e;
    if (tid < kC) {
      graw[tid] = tid < L ? w.g[size_t(r0 + tid) * nv + h] : 0.0f;
      bs[tid] = tid < L ? w.beta[size_t(r0 + tid) * nv + h] : 0.0f;
    }
    __syncthreads();
    if (tid == 0) {  // γ in token order (rows >= L add g = 0)
      float acc = 0.0f;
      for (int t = 0; t < kC; ++t) {
        acc = __fadd_rn(acc, graw[t]);
        gs[t] = acc;
      }
    }
    __syncthreads();
    if (tid < L) w.gam[size_t(r0 + tid) * nv + h] = gs[tid];
    // A_ts = β_t K̂K̂ᵀ_ts e^{γ_t−γ_s} (s < t), P_ts = Q̂K̂ᵀ_ts e^{γ_t−γ_s} (s <= t); rows >= L zero.
    for (int idx = tid; idx < kC * kC; idx += kThreads) {
      const int i = idx / kC, j = idx % kC;
      const float dec = (j <= i && i < L) ? expf(__fsub_rn(gs[i], gs[j])) : 0.0f;
      As[idx] = (j < i && i < L) ? __fmul_rn(__fmul_rn(bs[i], KK[idx]), dec) : 0.0f;
      Ps[idx] = (j <= i && i < L) ? __fmul_rn(QK[idx], dec) : 0.0f;
    }
    __syncthreads();

    // Forward substitution (I + A) X = R, thread = column: columns [0, dv) are U (R = β v),
    // columns [dv, dv + dk) are W (R = β e^γ k̂). Then, in place and t descending (row t
    // reads rows s <= t, not yet overwritten): U columns become P U (the output's part that
    // needs no state, written over v), W columns Q̃ = e^γ q̂ − P W (written to qt).
    const int c = tid;
    if (c < dv + dk) {
      const bool is_u = c < dv;
      const float* vcol = w.conv_out + crow + 2 * key_dim + h * dv + c;
      const float* kcol = w.conv_out + crow + key_dim + kh * dk + (c - dv);
      float x[kC];
#pragma unroll
      for (int t = 0; t < kC; ++t) {
        x[t] = 0.0f;
        if (t < L)
          x[t] = is_u ? __fmul_rn(bs[t], vcol[size_t(t) * C]) : __fmul_rn(__fmul_rn(bs[t], expf(gs[t])), kcol[size_t(t) * C]);
      }
      // Four entries of A's row per 16-B load; the entries s >= t of a group are zero (A is
      // strictly lower), so the group adds exact zeros past the diagonal.
#pragma unroll
      for (int t = 1; t < kC; ++t) {
        if (t < L) {
          float acc = x[t];
#pragma unroll
          for (int j = 0; j < t; j += 4) {
            const float4 a4 = *reinterpret_cast<const float4*>(As + t * kC + j);
            acc = __fmaf_rn(-a4.x, x[j], acc);
            acc = __fmaf_rn(-a4.y, x[j + 1], acc);
            acc = __fmaf_rn(-a4.z, x[j + 2], acc);
            acc = __fmaf_rn(-a4.w, x[j + 3], acc);
          }
          x[t] = acc;
        }
      }
      float* xdst = is_u ? w.u + size_t(r0) * nv * dv + size_t(h) * dv + c
                         : w.w + size_t(r0) * nv * dk + size_t(h) * dk + (c - dv);
      const size_t xstride = is_u ? size_t(nv) * dv : size_t(nv) * dk;
#pragma unroll
      for (int t = 0; t < kC; ++t)
        if (t < L) xdst[size_t(t) * xstride] = x[t];
      // Y_t = Σ_{s<=t} P_ts X_s in s order (compile-time masks: entries past the diagonal,
      // already overwritten, are never read).
#pragma unroll
      for (int t = kC - 1; t >= 0; --t) {
        if (t < L) {
          float acc = 0.0f;
#pragma unroll
          for (int j = 0; j <= t; j += 4) {
            const float4 p4 = *reinterpret_cast<const float4*>(Ps + t * kC + j);
            acc = __fmaf_rn(p4.x, x[j], acc);
            if (j + 1 <= t) acc = __fmaf_rn(p4.y, x[j + 1], acc);
            if (j + 2 <= t) acc = __fmaf_rn(p4.z, x[j + 2], acc);
            if (j + 3 <= t) acc = __fmaf_rn(p4.w, x[j + 3], acc);
          }
          x[t] = acc;
        }
      }
      if (is_u) {
        float* dst = w.conv_out + crow + 2 * key_dim + h * dv + c;  // v, read above by this thread only
#pragma unroll
        for (int t = 0; t < kC; ++t)
          if (t < L) dst[size_t(t) * C] = x[t];
      } else {
        const float* qcol = w.conv_out + crow + kh * dk + (c - dv);
        float* dst = w.qt + size_t(r0) * nv * dk + size_t(h) * dk + (c - dv);
#pragma unroll
        for (int t = 0; t < kC; ++t)
          if (t < L) dst[size_t(t) * nv * dk] = __fsub_rn(__fmul_rn(expf(gs[t]), qcol[size_t(t) * C]), x[t]);
      }
    }
    __syncthreads();  // γ, β, A, P are rewritten for the next v-head
  }
}

// ---- 3. inter-chunk state pass ---------------------------------------------------------

// The pass walks each chunk in nA + 1 stages (nA = ceil(dk/64)): stage k < nA multiplies
// columns [64k, 64k + 64) of W and Q̃ with rows [64k, 64k + 64) of S; stage nA updates S with
// K̂. Each stage's operands sit in one of two stage buffers (cp.async, issued one stage
// ahead). Shared memory (floats): 2 stage buffers of max(2·64·kLdT, 64·(dk + 4)) (W | Q̃
// [64][kLdT] each, or K̂ [64][dk + 4]) | S [dk][kLdS] | V'' [64][kLdS].
constexpr int kAW = 64;          // dk columns of W and Q̃ per stage
constexpr int kLdT = kAW + 4;    // row stride of the W and Q̃ stage tiles
constexpr int kLdS = kBN + 4;    // row stride of the S and V'' tiles
__host__ __device__ inline int state_stage_floats(int dk) { return max(2 * kC * kLdT, kC * (dk + 4)); }
__host__ __device__ inline int state_smem_floats(int dk) { return 2 * state_stage_floats(dk) + (dk + kC) * kLdS; }

// 16 B global -> shared, asynchronous; src_ok false writes zeros (src is not read).
__device__ __forceinline__ void cp_async16(float* dst, const float* src, bool src_ok) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__global__ void __launch_bounds__(kThreads, 2) chunk_state_kernel(const float* __restrict__ qkv, GdnShape s,
                                                              GdnLayerParams p, StepMeta meta, int first_seq,
                                                              int first_row, Work w) {
  extern __shared__ __align__(16) float smem[];
  const int seq = first_seq + blockIdx.x, h = blockIdx.y, c0 = blockIdx.z * kBN;
  const int nk = s.num_k_heads, nv = s.num_v_heads, dk = s.k_head_dim, dv = s.v_head_dim;
  const int C = s.conv_dim(), K = s.conv_kernel, key_dim = s.key_dim();
  const int kh = h / (nv / nk), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int t0 = meta.seq_token_start[seq], n = meta.seq_token_start[seq + 1] - t0;
  const int p0 = meta.seq_start_pos[seq], slot = meta.seq_state_slot[seq];
  const int stage_f = state_stage_floats(dk);
  float* Ssm = smem + 2 * stage_f;  // Ssm[i][j] = S[i][c0 + j]
  float* Vs = Ssm + dk * kLdS;      // V''[t][j]

  // New conv state of the sequence (its last K−1 pre-conv inputs), spread over its CTAs.
  {
    const int ctas = gridDim.y * gridDim.z, cta = blockIdx.y * gridDim.z + blockIdx.z;
    roll_conv_state<kMaxConvK>(p.conv_state + size_t(slot) * C * (K - 1), qkv, C, K, t0, n, cta * kThreads + tid,
                               ctas * kThreads);
  }

  // Roles. Product stages: warps 0-3 X = W S, warps 4-7 Y = Q̃ S; thread = tokens tb + 16p
  // (p < 4) × columns 4jb..4jb+3. Update stage: thread = rows 4ib..4ib+3 × columns
  // 4jb..4jb+3 of S (kept in registers across chunks; rows >= dk idle, warp-uniform).
  const int role = warp >> 2, jb = lane & 7;
  const int tb = (lane >> 3) + 4 * (warp & 3);
  const int ib = (lane >> 3) + 4 * warp;
  const bool upd = 4 * ib < dk;

  float* S = p.recurrent_state + (size_t(slot) * nv + h) * size_t(dk) * dv;
  float sreg[4][4];
  if (upd) {
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const float4 v = *reinterpret_cast<const float4*>(S + size_t(4 * ib + x) * dv + c0 + 4 * jb);
      sreg[x][0] = v.x;
      sreg[x][1] = v.y;
      sreg[x][2] = v.z;
      sreg[x][3] = v.w;
      *reinterpret_cast<float4*>(Ssm + (4 * ib + x) * kLdS + 4 * jb) = v;
    }
  }

  const size_t vd = size_t(nv) * dv, wd = size_t(nv) * dk;
  const int nA = (dk + kAW - 1) / kAW;
  const int nstage = num_chunks(p0, n) * (nA + 1);

  // Issues the copies of stage g into its buffer (rows >= L zero-filled) and commits them.
  auto issue = [&](int g) {
    const int q = g / (nA + 1), k = g % (nA + 1);
    int off, L;
    chunk_range(p0, n, q, off, L);
    const int r0 = t0 + off - first_row;
    float* dst = smem + (g & 1) * stage_f;
    if (k < nA) {
      const int i0 = k * kAW, n4 = min(kAW, dk - i0) / 4;
      for (int idx = tid; idx < 2 * kC * n4; idx += kThreads) {
        const int m = idx / (kC * n4), rem = idx % (kC * n4), t = rem / n4, e = (rem % n4) * 4;
        const float* src = (m == 0 ? w.w : w.qt) + size_t(r0 + min(t, L - 1)) * wd + size_t(h) * dk + i0 + e;
        cp_async16(dst + m * kC * kLdT + t * kLdT + e, src, t < L);
      }
    } else {
      const int n4 = dk / 4;
      for (int idx = tid; idx < kC * n4; idx += kThreads) {
        const int t = idx / n4, e = (idx % n4) * 4;
        const float* src = w.conv_out + size_t(r0 + min(t, L - 1)) * C + key_dim + kh * dk + e;
        cp_async16(dst + t * (dk + 4) + e, src, t < L);
      }
    }
    cp_async_commit();
  };

  if (nstage > 0) issue(0);
  float acc[4][4], pre[4][4];  // X or Y; U (role 0) or P U (role 1) of the chunk
  float gl = 0.0f, gt[4];      // γ_{L−1} and γ of the thread's tokens (role 0) of the chunk
  for (int g = 0; g < nstage; ++g) {
    const int q = g / (nA + 1), k = g % (nA + 1);
    int off, L;
    chunk_range(p0, n, q, off, L);
    const int r0 = t0 + off - first_row;  // workspace row of the chunk's first token
    if (k == 0) {  // the chunk's U / P U rows and γ, loaded while the stages run
      gl = w.gam[size_t(r0 + L - 1) * nv + h];
#pragma unroll
      for (int pp = 0; pp < 4; ++pp) {
        const int t = tb + 16 * pp;
        gt[pp] = role == 0 && t < L ? w.gam[size_t(r0 + t) * nv + h] : 0.0f;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < L) {
          const float* src = role == 0 ? w.u + size_t(r0 + t) * vd + size_t(h) * dv + c0 + 4 * jb
                                       : w.conv_out + size_t(r0 + t) * C + 2 * key_dim + h * dv + c0 + 4 * jb;
          v = *reinterpret_cast<const float4*>(src);
        }
        pre[pp][0] = v.x;
        pre[pp][1] = v.y;
        pre[pp][2] = v.z;
        pre[pp][3] = v.w;
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) acc[pp][cc] = 0.0f;
      }
    }
    cp_async_wait_all();
    __syncthreads();  // stage g landed for every thread; stage g−1 (the other buffer) fully read
    if (g + 1 < nstage) issue(g + 1);
    const float* buf = smem + (g & 1) * stage_f;
    if (k < nA) {
      // acc[p][c] += Σ_i T[t][i] S[i][j] over this stage's 64 values of i, in i order.
      const int i0 = k * kAW, wa = min(kAW, dk - i0);
      const float* T = buf + role * kC * kLdT;
      for (int i = 0; i < wa; i += 4) {
        float4 s4[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) s4[x] = *reinterpret_cast<const float4*>(Ssm + (i0 + i + x) * kLdS + 4 * jb);
#pragma unroll
        for (int pp = 0; pp < 4; ++pp) {
          const float4 a4 = *reinterpret_cast<const float4*>(T + (tb + 16 * pp) * kLdT + i);
          acc[pp][0] = __fmaf_rn(a4.w, s4[3].x, __fmaf_rn(a4.z, s4[2].x, __fmaf_rn(a4.y, s4[1].x, __fmaf_rn(a4.x, s4[0].x, acc[pp][0]))));
          acc[pp][1] = __fmaf_rn(a4.w, s4[3].y, __fmaf_rn(a4.z, s4[2].y, __fmaf_rn(a4.y, s4[1].y, __fmaf_rn(a4.x, s4[0].y, acc[pp][1]))));
          acc[pp][2] = __fmaf_rn(a4.w, s4[3].z, __fmaf_rn(a4.z, s4[2].z, __fmaf_rn(a4.y, s4[1].z, __fmaf_rn(a4.x, s4[0].z, acc[pp][2]))));
          acc[pp][3] = __fmaf_rn(a4.w, s4[3].w, __fmaf_rn(a4.z, s4[2].w, __fmaf_rn(a4.y, s4[1].w, __fmaf_rn(a4.x, s4[0].w, acc[pp][3]))));
        }
      }
      if (k == nA - 1) {
        if (role == 0) {
          // V'_t = U_t − X_t, stored scaled: V''_t = e^{γ_{L−1}−γ_t} V'_t (rows >= L zero).
#pragma unroll
          for (int pp = 0; pp < 4; ++pp) {
            const int t = tb + 16 * pp;
            const float f = t < L ? expf(__fsub_rn(gl, gt[pp])) : 0.0f;
            float4 v;
            v.x = __fmul_rn(__fsub_rn(pre[pp][0], acc[pp][0]), f);
            v.y = __fmul_rn(__fsub_rn(pre[pp][1], acc[pp][1]), f);
            v.z = __fmul_rn(__fsub_rn(pre[pp][2], acc[pp][2]), f);
            v.w = __fmul_rn(__fsub_rn(pre[pp][3], acc[pp][3]), f);
            *reinterpret_cast<float4*>(Vs + t * kLdS + 4 * jb) = v;
          }
        } else {
          // O_t = Q̃_t S + (P U)_t, written over P U (same thread).
#pragma unroll
          for (int pp = 0; pp < 4; ++pp) {
            const int t = tb + 16 * pp;
            if (t < L) {
              float4 o;
              o.x = __fadd_rn(acc[pp][0], pre[pp][0]);
              o.y = __fadd_rn(acc[pp][1], pre[pp][1]);
              o.z = __fadd_rn(acc[pp][2], pre[pp][2]);
              o.w = __fadd_rn(acc[pp][3], pre[pp][3]);
              *reinterpret_cast<float4*>(w.conv_out + size_t(r0 + t) * C + 2 * key_dim + h * dv + c0 + 4 * jb) = o;
            }
          }
        }
      }
    } else if (upd) {
      // S <- e^{γ_{L−1}} S + K̂ᵀ V'' (t order).
      const float eL = expf(gl);
      float u[4][4];
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int y = 0; y < 4; ++y) u[x][y] = 0.0f;
      const int ldk = dk + 4;
      for (int t = 0; t < L; ++t) {
        const float4 k4 = *reinterpret_cast<const float4*>(buf + t * ldk + 4 * ib);
        const float4 v4 = *reinterpret_cast<const float4*>(Vs + t * kLdS + 4 * jb);
        const float kv[4] = {k4.x, k4.y, k4.z, k4.w}, vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
        for (int x = 0; x < 4; ++x)
#pragma unroll
          for (int y = 0; y < 4; ++y) u[x][y] = __fmaf_rn(kv[x], vv[y], u[x][y]);
      }
#pragma unroll
      for (int x = 0; x < 4; ++x) {
#pragma unroll
        for (int y = 0; y < 4; ++y) sreg[x][y] = __fmaf_rn(eL, sreg[x][y], u[x][y]);
        *reinterpret_cast<float4*>(Ssm + (4 * ib + x) * kLdS + 4 * jb) =
            make_float4(sreg[x][0], sreg[x][1], sreg[x][2], sreg[x][3]);
      }
    }
  }

  if (upd) {
#pragma unroll
    for (int x = 0; x < 4; ++x)
      *reinterpret_cast<float4*>(S + size_t(4 * ib + x) * dv + c0 + 4 * jb) =
          make_float4(sreg[x][0], sreg[x][1], sreg[x][2], sreg[x][3]);
  }
}

// ---- 4. gated RMSNorm --------------------------------------------------------------------

// y_j = (w_j · (o_j · rsqrt(mean(o²) + eps))) · silu(z_j), one warp per (prompt row, v-head);
// o: core + row·core_stride + head·dv.
__global__ void __launch_bounds__(kNormWarps * 32) chunk_norm_kernel(const float* __restrict__ core, int core_stride,
                                                                    const float* __restrict__ z, GdnShape s,
                                                                    const float* __restrict__ norm_w, int P,
                                                                    int first_row, float* __restrict__ out) {
  const long long gw = (long long)blockIdx.x * kNormWarps + (threadIdx.x >> 5);
  if (gw >= (long long)P * s.num_v_heads) return;
  const int lane = threadIdx.x & 31, dv = s.v_head_dim;
  const long long row = gw / s.num_v_heads, head = gw % s.num_v_heads;
  const float* o = core + size_t(row) * core_stride + size_t(head) * dv;
  const size_t off = size_t(first_row) * s.value_dim() + size_t(gw) * dv;
  float ss = 0.0f;
  for (int j = lane; j < dv; j += 32) ss = __fmaf_rn(o[j], o[j], ss);
  ss = warp_sum(ss);
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(dv)), s.norm_eps)));
  for (int j = lane; j < dv; j += 32)
    out[off + j] = __fmul_rn(__fmul_rn(norm_w[j], __fmul_rn(o[j], inv)), silu(z[off + j]));
}

// ---- host --------------------------------------------------------------------------------

constexpr size_t kIntraSmemMax = size_t(2 * std::max(kC * (kMaxD + 4), 2 * kC * kC) + 3 * kC) * sizeof(float);
constexpr size_t kStateSmemMax =
    size_t(2 * std::max(2 * kC * kLdT, kC * (kMaxD + 4)) + (kMaxD + kC) * kLdS) * sizeof(float);
static_assert(kStateSmemMax <= 99 * 1024 && kIntraSmemMax <= 99 * 1024, "sm_121 allows 99 KB per block");

void prepare_device() {
  static std::atomic<bool> done[64];
  int dev = 0;
  MOESERVE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) dev = 63;
  if (done[dev].load(std::memory_order_acquire)) return;
  int optin = 0;
  MOESERVE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (size_t(optin) < std::max(kIntraSmemMax, kStateSmemMax))
    throw Error("gated_delta_net_chunked: needs " + std::to_string(std::max(kIntraSmemMax, kStateSmemMax)) +
                " B of shared memory per block, the device allows " + std::to_string(optin));
  MOESERVE_CUDA_CHECK(
      cudaFuncSetAttribute(chunk_intra_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kIntraSmemMax)));
  MOESERVE_CUDA_CHECK(
      cudaFuncSetAttribute(chunk_state_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kStateSmemMax)));
  const size_t tc_max = std::max(gdn_chunked::intra_tc_smem_bytes_max(), gdn_chunked::state_tc_smem_bytes_max());
  if (size_t(optin) < tc_max)
    throw Error("gated_delta_net_chunked: the tensor-core kernels need " + std::to_string(tc_max) +
                " B of shared memory per block, the device allows " + std::to_string(optin));
  gdn_chunked::intra_tc_prepare();
  gdn_chunked::state_tc_prepare();
  done[dev].store(true, std::memory_order_release);
}

// The kernel variant (set_gdn_chunked_variant).
std::atomic<int> g_variant{2};

}  // namespace

void set_gdn_chunked_variant(int variant) {
  if (variant < 0 || variant > 2)
    throw Error("gated_delta_net_chunked: variant must be 0, 1 or 2, got " + std::to_string(variant));
  g_variant.store(variant, std::memory_order_relaxed);
}

int gdn_chunked_variant() { return g_variant.load(std::memory_order_relaxed); }

bool gated_delta_net_chunked_supported(const GdnShape& s) {
  return s.num_k_heads > 0 && s.num_v_heads > 0 && s.num_v_heads % s.num_k_heads == 0 && s.k_head_dim > 0 &&
         s.k_head_dim % 32 == 0 && s.k_head_dim <= kMaxD && s.v_head_dim > 0 && s.v_head_dim % 32 == 0 &&
         s.v_head_dim <= kMaxD && s.conv_kernel >= 2 && s.conv_kernel <= kMaxConvK;
}

size_t gated_delta_net_chunked_workspace_bytes(const GdnShape& s, int max_tokens) {
  return work_floats(s, size_t(std::max(max_tokens, 0))) * sizeof(float);
}

void gated_delta_net_chunked_prepare() { prepare_device(); }

void gated_delta_net_chunked(const float* qkv, const float* z, const float* b, const float* a, const GdnShape& s,
                             const GdnLayerParams& layer, const StepMeta& meta, int first_seq, int first_row,
                             void* workspace, size_t workspace_bytes, float* out, cudaStream_t stream,
                             cudaEvent_t z_ready, const GdnChunkedEvents* events) {
  const int P = meta.num_tokens - first_row, S = meta.num_seqs - first_seq;
  if (P <= 0 || S <= 0) return;
  if (!gated_delta_net_chunked_supported(s))
    throw Error("gated_delta_net_chunked: unsupported shape (dk, dv multiples of 32 up to 128, nv a multiple of nk, "
                "conv kernel 2..8)");
  if (workspace_bytes < gated_delta_net_chunked_workspace_bytes(s, P))
    throw Error("gated_delta_net_chunked: workspace too small");
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0 || reinterpret_cast<uintptr_t>(layer.recurrent_state) % 16 != 0)
    throw Error("gated_delta_net_chunked: workspace and state must be 16-B aligned");
  prepare_device();
  const Work w = carve(workspace, s, size_t(P));
  auto mark = [&](int i) {
    if (events) MOESERVE_CUDA_CHECK(cudaEventRecord(events->ev[i], stream));
  };

  mark(0);
  const int prep_threads = (std::max(s.k_head_dim, s.v_head_dim) + 31) / 32 * 32;
  chunk_prep_kernel<<<dim3(unsigned((P + kPrepTT - 1) / kPrepTT), unsigned(s.num_k_heads + s.num_v_heads)),
                      prep_threads, 0, stream>>>(qkv, b, a, s, layer, meta, first_row, w);
  MOESERVE_CUDA_CHECK_LAUNCH();
  mark(1);

  // Every sequence has at most ceil(n/64) + 1 chunks: P/64 + 2S bounds the total.
  const unsigned chunk_bound = unsigned((P + kC - 1) / kC + 2 * S);
  const int variant = gdn_chunked_variant();
  if (variant >= 1) {
    gdn_chunked::launch_intra_tc(s, meta, first_seq, first_row, w, chunk_bound, stream);
  } else {
    const size_t intra_smem = size_t(intra_smem_floats(s.k_head_dim)) * sizeof(float);
    chunk_intra_kernel<<<dim3(chunk_bound, unsigned(s.num_k_heads)), kThreads, intra_smem, stream>>>(
        s, meta, first_seq, first_row, w);
    MOESERVE_CUDA_CHECK_LAUNCH();
  }
  mark(2);

  if (variant >= 2) {
    gdn_chunked::launch_state_tc(qkv, s, layer, meta, first_seq, first_row, w, stream);
  } else {
    const size_t state_smem = size_t(state_smem_floats(s.k_head_dim)) * sizeof(float);
    chunk_state_kernel<<<dim3(unsigned(S), unsigned(s.num_v_heads), unsigned(s.v_head_dim / kBN)), kThreads,
                         state_smem, stream>>>(qkv, s, layer, meta, first_seq, first_row, w);
    MOESERVE_CUDA_CHECK_LAUNCH();
  }
  mark(3);

  if (z_ready != nullptr) MOESERVE_CUDA_CHECK(cudaStreamWaitEvent(stream, z_ready, 0));
  const long long norm_warps = (long long)P * s.num_v_heads;
  chunk_norm_kernel<<<unsigned((norm_warps + kNormWarps - 1) / kNormWarps), kNormWarps * 32, 0, stream>>>(
      w.conv_out + 2 * s.key_dim(), s.conv_dim(), z, s, layer.norm_weight, P, first_row, out);
  MOESERVE_CUDA_CHECK_LAUNCH();
  mark(4);
}

}  // namespace moeserve::cuda
