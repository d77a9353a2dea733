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
// (the recurrence S <- e^g S, Δ = β(v − Sᵀk), S += k ⊗ Δ, o = Sᵀq, grouped by chunks). A
// partial chunk (a slice starting or ending inside a chunk) runs the same math on its L < 64
// tokens; rows t >= L are zero in shared memory and contribute exact zeros.
//
// Kernels (stream order, plain launches; one job each):
// 1. chunk_prep_kernel: conv + SiLU (the slot's conv state before a sequence's first new
//    token), l2norm(q)/sqrt(dk), l2norm(k), g and β, for the prompt rows. Grid (ceil(P/8),
//    nk + nv), block round32(max(dk, dv)): a key-head CTA does q and k of 8 tokens (thread =
//    channel, block reductions in a fixed warp order), a value-head CTA v and the gates.
//    Writes conv_out [P][conv_dim] (q̂ | k̂ | v), g and β [P][nv]. P = prompt rows.
//    Bytes: P·conv_dim·(4 + 4) + P·nv·16.
// 2. chunk_intra_kernel: everything inside a chunk, all chunks of all heads at once. Grid
//    (chunk bound, nk), 256 threads; a CTA finds its chunk by walking the sequences' chunk
//    counts (surplus CTAs exit). Per (chunk, k-head): K̂ and Q̂ in shared memory, K̂K̂ᵀ and Q̂K̂ᵀ
//    (thread = 4×4 interleaved outputs, dk order); Q̂K̂ᵀ (lower, diagonal included) goes to
//    global qk [P][nk][64]. Then per v-head of the group: γ (one thread, t order), A, and the
//    forward substitution (I + A) X = R for the dv columns of U and the dk columns of W at
//    once: thread = column, the 64 rows in registers, row t = R_t − Σ_{s<t} A_ts X_s in s
//    order. Writes gam [P][nv] (γ), U [P][nv][dv], W [P][nv][dk].
//    FMAs per (chunk, k-head): 2·64²·dk (K̂K̂ᵀ and Q̂K̂ᵀ, full squares) + per v-head
//    64²·(dk + dv)/2 (the substitution, Σ_t t per column). Bytes: reads conv_out, writes U,
//    W, qk, gam: P·(conv_dim + nv·(dk + dv + 1) + 64·nk)·4.
// 3. chunk_state_kernel: the inter-chunk pass, sequential in chunks, parallel over (sequence,
//    v-head, 32-column block of S): columns of S evolve independently given W, U, K̂, so one
//    sequence fills nv·dv/32 CTAs (256 at the 122B shape). The CTA keeps its S block [dk][32]
//    in shared memory (transposed) for the whole slice; per chunk it loads W, Q̂ and its U
//    columns (phase 1: X = W S and Y = Q̂ S, thread = 4 tokens × 2 columns, dk order; V' = U − X
//    in place), then K̂ and Q̂K̂ᵀ (phase 2: P_ts = Q̂K̂ᵀ_ts e^{γ_t−γ_s}, O = e^γ Y + P V' in s order,
//    written over U's columns in global memory (the U region doubles as the raw output), V'
//    rows scaled by e^{γ_{L−1}−γ_t}, S = e^{γ_{L−1}} S + K̂ᵀ V'', thread = 4 rows × 4 columns,
//    t order). It also writes the sequence's new conv state (the prep kernel that read the
//    old one has finished).
//    FMAs per (chunk, v-head): 3·64·dk·dv (W S, Q̂ S, K̂ᵀV'') + 64²·dv (P V').
//    Bytes per chunk and CTA (L2): 64·(3·dk + 32 + 64)·4 in, 64·32·4 out; the state once.
// 4. chunk_norm_kernel: gated RMSNorm (plain w, silu(z)) per (row, v-head), one warp each,
//    the lane-strided sum of squares then an xor tree. Bytes: P·nv·dv·12.
//
// Roofline per token and layer (executed FMAs; the triangular products run as full squares):
//   intra: nk·128·dk (K̂K̂ᵀ, Q̂K̂ᵀ) + nv·32·(dk + dv) (substitution)
//   state: nv·(3·dk·dv + 64·dv)                    (W S, Q̂ S, K̂ᵀV'', P V')
//   at the 122B shape (nk 16, nv 64, dk = dv = 128): 0.79 + 3.67 ≈ 4.5 MFMA ≈ 9 MFLOP, f32 CUDA
//   cores. DRAM bytes (f32), each tensor written once and read once:
//   qkv + conv_out (write, read) 3·conv_dim·4, U and W (write, read) 4·nv·dv·4 (dk = dv),
//   O (write, read) 2·nv·dv·4, z and out 2·nv·dv·4, qk 2·nk·64·4 ≈ 0.42 MB per token at the
//   122B shape: about 21 FLOP per byte, above the f32 CUDA-core ridge of an H200 (about 16
//   FLOP per byte of DRAM): compute bound, DRAM traffic not far behind (the W/Q̂/K̂ tiles that
//   the dv/32 column-block CTAs and the nv/nk v-heads of a k-head re-read come from L2).
//   Tensor cores (with an f32-accurate operand split) would be the next step. One sequence's floor is also the chunk chain:
//   T/64 dependent state-pass steps of 64·(3·dk·32 + 64·32) FMAs per CTA.
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
#include "backend/cuda/ops_gdn_chunked.h"

namespace moeserve::cuda {
namespace {

constexpr int kC = 64;             // chunk length (positions)
constexpr int kMaxD = 128;         // dk, dv limit
constexpr int kMaxConvK = 8;
constexpr int kPrepTT = 8;         // prep: tokens per CTA
constexpr int kThreads = 256;      // intra and state kernels
constexpr int kBN = 32;            // state pass: columns of S per CTA
constexpr int kLdV = kBN + 4;      // row stride of the V' tile (floats)
constexpr int kLdA = kC + 4;       // row stride of the KKᵀ and A tiles (16-B rows)
constexpr int kLdP = kC + 4;       // row stride of the P tile (16-B rows, ≡ 4 mod 32 banks)
constexpr int kNormWarps = 8;
constexpr unsigned kFull = 0xffffffffu;

// Workspace regions (f32), each rounded up to 64 floats (256-B aligned).
struct Work {
  float* conv_out;  // [P][conv_dim]: q̂ | k̂ | v
  float* g;         // [P][nv] log decay
  float* beta;      // [P][nv]
  float* gam;       // [P][nv] γ (cumulative g within the chunk)
  float* qk;        // [P][nk][64] Q̂K̂ᵀ row of the token within its chunk (lower, diagonal included)
  float* w;         // [P][nv][dk] W
  float* u;         // [P][nv][dv] U, overwritten by the raw output O in the state pass
};

size_t round_region(size_t n) { return (n + 63) / 64 * 64; }

size_t work_floats(const GdnShape& s, size_t P) {
  return round_region(P * size_t(s.conv_dim())) + 3 * round_region(P * size_t(s.num_v_heads)) +
         round_region(P * size_t(s.num_k_heads) * kC) + round_region(P * size_t(s.num_v_heads) * s.k_head_dim) +
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
  w.qk = p;
  p += round_region(P * size_t(s.num_k_heads) * kC);
  w.w = p;
  p += round_region(P * size_t(s.num_v_heads) * s.k_head_dim);
  w.u = p;
  return w;
}

__device__ __forceinline__ float silu(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// Number of 64-position chunks that the slice [p0, p0 + n) touches.
__device__ __forceinline__ int num_chunks(int p0, int n) { return n <= 0 ? 0 : (p0 + n - 1) / kC - p0 / kC + 1; }

// Chunk q of the slice [p0, p0 + n): its offset in the slice and its length.
__device__ __forceinline__ void chunk_range(int p0, int n, int q, int& off, int& len) {
  const int start = q == 0 ? p0 : (p0 / kC + q) * kC;
  const int end = min(p0 + n, (p0 / kC + q + 1) * kC);
  off = start - p0;
  len = end - start;
}

// ---- 1. prep ---------------------------------------------------------------------------

// Sums one value per (thread, token) over the CTA for each of TT tokens: xor tree in each
// warp, then the warps in order (the block size depends on the shape only). red: [nwarps][TT].
// Contains barriers: call from all threads.
template <int TT>
__device__ __forceinline__ void block_sums(float (&v)[TT], float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
  for (int t = 0; t < TT; ++t) v[t] = warp_sum(v[t]);
  if (lane == 0) {
#pragma unroll
    for (int t = 0; t < TT; ++t) red[warp * TT + t] = v[t];
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < TT; ++t) {
    float sum = red[t];
    for (int ww = 1; ww < nwarps; ++ww) sum = __fadd_rn(sum, red[ww * TT + t]);
    v[t] = sum;
  }
  __syncthreads();
}

// silu of the causal depthwise conv of channel c at global row m (sequence rows from t0; taps
// before t0 read the slot's conv state st [conv_dim][K−1], oldest first).
__device__ __forceinline__ float conv_silu(const float* __restrict__ qkv, const float* __restrict__ cw, int C, int K,
                                           int c, int m, int t0, const float* st) {
  float acc = 0.0f;
  for (int j = 0; j < K; ++j) {
    const int row = m - (K - 1) + j;
    const float u = row >= t0 ? qkv[size_t(row) * C + c] : st[size_t(c) * (K - 1) + (row - t0 + K - 1)];
    acc = __fmaf_rn(cw[size_t(c) * K + j], u, acc);
  }
  return silu(acc);
}

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
    float qv[kPrepTT], kv[kPrepTT], qq[kPrepTT], kk[kPrepTT];
#pragma unroll
    for (int t = 0; t < kPrepTT; ++t) {
      qv[t] = kv[t] = 0.0f;
      if (i < dk && t < nt) {
        qv[t] = conv_silu(qkv, p.conv_weight, C, K, unit * dk + i, first_row + r0 + t, t0[t], st[t]);
        kv[t] = conv_silu(qkv, p.conv_weight, C, K, key_dim + unit * dk + i, first_row + r0 + t, t0[t], st[t]);
      }
      qq[t] = __fmul_rn(qv[t], qv[t]);
      kk[t] = __fmul_rn(kv[t], kv[t]);
    }
    block_sums(qq, red);
    block_sums(kk, red);
    const float q_scale = __fdiv_rn(1.0f, __fsqrt_rn(float(dk)));
#pragma unroll
    for (int t = 0; t < kPrepTT; ++t) {
      if (i < dk && t < nt) {
        const float qn = __fmul_rn(__fmul_rn(qv[t], __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(qq[t], 1e-6f)))), q_scale);
        const float kn = __fmul_rn(kv[t], __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(kk[t], 1e-6f))));
        float* row = w.conv_out + size_t(r0 + t) * C;
        row[unit * dk + i] = qn;
        row[key_dim + unit * dk + i] = kn;
      }
    }
  } else {
    const int h = unit - nk;
    if (i < dv) {
#pragma unroll
      for (int t = 0; t < kPrepTT; ++t)
        if (t < nt) {
          const int c = 2 * key_dim + h * dv + i;
          w.conv_out[size_t(r0 + t) * C + c] = conv_silu(qkv, p.conv_weight, C, K, c, first_row + r0 + t, t0[t], st[t]);
        }
    }
    if (i < nt) {
      const size_t gi = size_t(first_row + r0 + i) * nv + h, wi = size_t(r0 + i) * nv + h;
      const float x = __fadd_rn(a[gi], p.dt_bias[h]);
      const float softplus = x > 20.0f ? x : log1pf(expf(x));  // torch threshold 20
      w.g[wi] = __fmul_rn(-expf(p.a_log[h]), softplus);
      w.beta[wi] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-b[gi])));
    }
  }
}

// Finds chunk `idx` of the step's prompt sequences (in sequence order, chunks in position
// order). Returns false when idx is past the last chunk.
__device__ __forceinline__ bool find_chunk(const StepMeta& meta, int first_seq, int idx, int& seq, int& row0,
                                           int& len) {
  for (int sq = first_seq; sq < meta.num_seqs; ++sq) {
    const int t0 = meta.seq_token_start[sq], n = meta.seq_token_start[sq + 1] - t0;
    const int p0 = meta.seq_start_pos[sq];
    const int nc = num_chunks(p0, n);
    if (idx < nc) {
      int off;
      chunk_range(p0, n, idx, off, len);
      seq = sq;
      row0 = t0 + off;
      return true;
    }
    idx -= nc;
  }
  return false;
}

// ---- 2. intra-chunk --------------------------------------------------------------------

// Shared memory of the intra kernel (floats): K̂ [64][ldk] | Q̂ [64][ldk], later A [64][kLdA] |
// K̂K̂ᵀ [64][kLdA] | γ, β, g [64] each. ldk = dk + 4 (16-B rows, ≡ 4 mod 32 banks); every
// region starts 16-B aligned.
__host__ __device__ inline int intra_q_floats(int dk) { return max(kC * (dk + 4), kC * kLdA); }
__host__ __device__ inline int intra_smem_floats(int dk) { return kC * (dk + 4) + intra_q_floats(dk) + kC * kLdA + 3 * kC; }

__global__ void __launch_bounds__(kThreads) chunk_intra_kernel(GdnShape s, StepMeta meta, int first_seq, int first_row,
                                                              Work w) {
  extern __shared__ __align__(16) float smem[];
  int seq, row0, L;
  if (!find_chunk(meta, first_seq, blockIdx.x, seq, row0, L)) return;  // the whole CTA, before any barrier
  const int nk = s.num_k_heads, nv = s.num_v_heads, dk = s.k_head_dim, dv = s.v_head_dim;
  const int C = s.conv_dim(), key_dim = s.key_dim(), grp = nv / nk;
  const int kh = blockIdx.y, tid = threadIdx.x;
  const int r0 = row0 - first_row;  // workspace row of the chunk's first token
  const int ldk = dk + 4;
  float* Ks = smem;
  float* Qs = Ks + kC * ldk;
  float* As = Qs;  // A reuses Q̂'s space once Q̂K̂ᵀ is done
  float* KK = Qs + intra_q_floats(dk);
  float* gs = KK + kC * kLdA;
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

  // K̂K̂ᵀ and Q̂K̂ᵀ: thread (ti, tj) owns rows ti + 16p and columns tj + 16q (p, q < 4).
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
#pragma unroll
    for (int pp = 0; pp < 4; ++pp)
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) {
        const int i = ti + 16 * pp, j = tj + 16 * qq;
        KK[i * kLdA + j] = kk[pp][qq];
        if (i < L) w.qk[(size_t(r0 + i) * nk + kh) * kC + j] = (j <= i) ? qk[pp][qq] : 0.0f;
      }
  }
  __syncthreads();  // K̂K̂ᵀ complete; Q̂ no longer read (its space becomes A)

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
    for (int idx = tid; idx < kC * kC; idx += kThreads) {
      const int i = idx / kC, j = idx % kC;
      As[i * kLdA + j] =
          (j < i && i < L) ? __fmul_rn(__fmul_rn(bs[i], KK[i * kLdA + j]), expf(__fsub_rn(gs[i], gs[j]))) : 0.0f;
    }
    __syncthreads();

    // Forward substitution (I + A) X = R, thread = column: columns [0, dv) are U (R = β v),
    // columns [dv, dv + dk) are W (R = β e^γ k̂).
    const int c = tid;
    if (c < dv + dk) {
      const bool is_u = c < dv;
      const float* vcol = w.conv_out + size_t(r0) * C + 2 * key_dim + h * dv + c;
      float x[kC];
#pragma unroll
      for (int t = 0; t < kC; ++t) {
        x[t] = 0.0f;
        if (t < L)
          x[t] = is_u ? __fmul_rn(bs[t], vcol[size_t(t) * C])
                      : __fmul_rn(__fmul_rn(bs[t], expf(gs[t])), Ks[t * ldk + (c - dv)]);
      }
      // Four entries of A's row per 16-B load; the entries s >= t of a group are zero (A is
      // strictly lower), so the group adds exact zeros past the diagonal.
#pragma unroll
      for (int t = 1; t < kC; ++t) {
        if (t < L) {
          float acc = x[t];
#pragma unroll
          for (int j = 0; j < t; j += 4) {
            const float4 a4 = *reinterpret_cast<const float4*>(As + t * kLdA + j);
            acc = __fmaf_rn(-a4.x, x[j], acc);
            acc = __fmaf_rn(-a4.y, x[j + 1], acc);
            acc = __fmaf_rn(-a4.z, x[j + 2], acc);
            acc = __fmaf_rn(-a4.w, x[j + 3], acc);
          }
          x[t] = acc;
        }
      }
      if (is_u) {
        float* dst = w.u + size_t(r0) * nv * dv + size_t(h) * dv + c;
#pragma unroll
        for (int t = 0; t < kC; ++t)
          if (t < L) dst[size_t(t) * nv * dv] = x[t];
      } else {
        float* dst = w.w + size_t(r0) * nv * dk + size_t(h) * dk + (c - dv);
#pragma unroll
        for (int t = 0; t < kC; ++t)
          if (t < L) dst[size_t(t) * nv * dk] = x[t];
      }
    }
    __syncthreads();  // γ, β, A are rewritten for the next v-head
  }
}

// ---- 3. inter-chunk state pass ---------------------------------------------------------

// Shared memory of the state kernel (floats): Sᵀ [32][ldk] | Wb [64][ldk] (W, then K̂) |
// Qb (Q̂ [64][ldk], then P [64][kLdP]) | V [64][kLdV] (U, then V') | γ [64].
__host__ __device__ inline int state_q_floats(int dk) { return max(kC * (dk + 4), kC * kLdP); }
__host__ __device__ inline int state_smem_floats(int dk) {
  return kBN * (dk + 4) + kC * (dk + 4) + state_q_floats(dk) + kC * kLdV + kC;
}

// Copies rows [0, L) of a [64][cols] tile (row t at src + t·stride, cols a multiple of 4) to
// shared memory with row stride ld; rows >= L become zero.
__device__ __forceinline__ void load_tile(float* dst, int ld, const float* src, size_t stride, int cols, int L) {
  const int n4 = cols / 4;
  for (int idx = threadIdx.x; idx < kC * n4; idx += kThreads) {
    const int t = idx / n4, e = (idx % n4) * 4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < L) v = *reinterpret_cast<const float4*>(src + size_t(t) * stride + e);
    *reinterpret_cast<float4*>(dst + t * ld + e) = v;
  }
}

__global__ void __launch_bounds__(kThreads) chunk_state_kernel(const float* __restrict__ qkv, GdnShape s,
                                                              GdnLayerParams p, StepMeta meta, int first_seq,
                                                              int first_row, Work w) {
  extern __shared__ __align__(16) float smem[];
  const int seq = first_seq + blockIdx.x, h = blockIdx.y, c0 = blockIdx.z * kBN;
  const int nk = s.num_k_heads, nv = s.num_v_heads, dk = s.k_head_dim, dv = s.v_head_dim;
  const int C = s.conv_dim(), K = s.conv_kernel, key_dim = s.key_dim();
  const int kh = h / (nv / nk), tid = threadIdx.x;
  const int t0 = meta.seq_token_start[seq], n = meta.seq_token_start[seq + 1] - t0;
  const int p0 = meta.seq_start_pos[seq], slot = meta.seq_state_slot[seq];
  const int ldk = dk + 4;
  float* ST = smem;  // ST[j][i] = S[i][c0 + j]
  float* Wb = ST + kBN * ldk;
  float* Qb = Wb + kC * ldk;
  float* Vs = Qb + state_q_floats(dk);
  float* gs = Vs + kC * kLdV;

  // New conv state of the sequence (its last K−1 pre-conv inputs), spread over its CTAs.
  {
    const int ctas = gridDim.y * gridDim.z, cta = blockIdx.y * gridDim.z + blockIdx.z;
    float* cs = p.conv_state + size_t(slot) * C * (K - 1);
    for (int c = cta * kThreads + tid; c < C; c += ctas * kThreads) {
      float* st_c = cs + size_t(c) * (K - 1);
      float nw[kMaxConvK - 1];
#pragma unroll
      for (int j = 0; j < kMaxConvK - 1; ++j)
        if (j < K - 1) {
          const int src = j + n;  // position in [old state (K−1) | new rows (n)]
          nw[j] = src < K - 1 ? st_c[src] : qkv[size_t(t0 + src - (K - 1)) * C + c];
        }
#pragma unroll
      for (int j = 0; j < kMaxConvK - 1; ++j)
        if (j < K - 1) st_c[j] = nw[j];
    }
  }

  float* S = p.recurrent_state + (size_t(slot) * nv + h) * size_t(dk) * dv;
  for (int idx = tid; idx < dk * kBN; idx += kThreads) {
    const int i = idx / kBN, j = idx % kBN;
    ST[j * ldk + i] = S[size_t(i) * dv + c0 + j];
  }

  const size_t vd = size_t(nv) * dv;
  const int tt = tid & 15, jj = tid >> 4;  // phase 1 / O: tokens tt + 16p, columns jj and jj + 16
  const int ii = tid & 31, jq = tid >> 5;  // S update: rows ii + 32p, columns jq + 8q
  const int nc = num_chunks(p0, n);
  for (int q = 0; q < nc; ++q) {
    int off, L;
    chunk_range(p0, n, q, off, L);
    const int r0 = t0 + off - first_row;  // workspace row of the chunk's first token

    // Phase 1: W, Q̂, U columns, γ.
    load_tile(Wb, ldk, w.w + size_t(r0) * nv * dk + size_t(h) * dk, size_t(nv) * dk, dk, L);
    load_tile(Qb, ldk, w.conv_out + size_t(r0) * C + kh * dk, size_t(C), dk, L);
    load_tile(Vs, kLdV, w.u + size_t(r0) * vd + size_t(h) * dv + c0, vd, kBN, L);
    if (tid < kC) gs[tid] = tid < L ? w.gam[size_t(r0 + tid) * nv + h] : 0.0f;
    __syncthreads();  // tiles and (first chunk) Sᵀ visible; (later chunks) the S update done

    float y[4][2];
    {
      float x[4][2];
#pragma unroll
      for (int pp = 0; pp < 4; ++pp) x[pp][0] = x[pp][1] = y[pp][0] = y[pp][1] = 0.0f;
      for (int i = 0; i < dk; i += 4) {
        const float4 s0 = *reinterpret_cast<const float4*>(ST + jj * ldk + i);
        const float4 s1 = *reinterpret_cast<const float4*>(ST + (jj + 16) * ldk + i);
#pragma unroll
        for (int pp = 0; pp < 4; ++pp) {
          const float4 wv = *reinterpret_cast<const float4*>(Wb + (tt + 16 * pp) * ldk + i);
          const float4 qv = *reinterpret_cast<const float4*>(Qb + (tt + 16 * pp) * ldk + i);
          x[pp][0] = __fmaf_rn(wv.w, s0.w, __fmaf_rn(wv.z, s0.z, __fmaf_rn(wv.y, s0.y, __fmaf_rn(wv.x, s0.x, x[pp][0]))));
          x[pp][1] = __fmaf_rn(wv.w, s1.w, __fmaf_rn(wv.z, s1.z, __fmaf_rn(wv.y, s1.y, __fmaf_rn(wv.x, s1.x, x[pp][1]))));
          y[pp][0] = __fmaf_rn(qv.w, s0.w, __fmaf_rn(qv.z, s0.z, __fmaf_rn(qv.y, s0.y, __fmaf_rn(qv.x, s0.x, y[pp][0]))));
          y[pp][1] = __fmaf_rn(qv.w, s1.w, __fmaf_rn(qv.z, s1.z, __fmaf_rn(qv.y, s1.y, __fmaf_rn(qv.x, s1.x, y[pp][1]))));
        }
      }
      // V' = U − W S (each element has one owner: in place).
#pragma unroll
      for (int pp = 0; pp < 4; ++pp) {
        float* vrow = Vs + (tt + 16 * pp) * kLdV;
        vrow[jj] = __fsub_rn(vrow[jj], x[pp][0]);
        vrow[jj + 16] = __fsub_rn(vrow[jj + 16], x[pp][1]);
      }
    }
    __syncthreads();  // V' complete; W and Q̂ no longer read

    // Phase 2: K̂ over W, Q̂K̂ᵀ over Q̂, then P_ts = Q̂K̂ᵀ_ts e^{γ_t−γ_s} (s <= t < L).
    load_tile(Wb, ldk, w.conv_out + size_t(r0) * C + key_dim + kh * dk, size_t(C), dk, L);
    load_tile(Qb, kLdP, w.qk + size_t(r0) * nk * kC + size_t(kh) * kC, size_t(nk) * kC, kC, L);
    __syncthreads();
    for (int idx = tid; idx < kC * kC; idx += kThreads) {
      const int t = idx / kC, sc = idx % kC;
      float* e = Qb + t * kLdP + sc;
      *e = (sc <= t && t < L) ? __fmul_rn(*e, expf(__fsub_rn(gs[t], gs[sc]))) : 0.0f;
    }
    __syncthreads();

    // O_t = e^{γ_t} Y_t + Σ_{s<=t} P_ts V'_s (s order; P is zero above the diagonal), written
    // over U's columns.
    {
      float o[4][2];
#pragma unroll
      for (int pp = 0; pp < 4; ++pp) o[pp][0] = o[pp][1] = 0.0f;
      for (int sc = 0; sc < kC; sc += 4) {
        float v0[4], v1[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          v0[x] = Vs[(sc + x) * kLdV + jj];
          v1[x] = Vs[(sc + x) * kLdV + jj + 16];
        }
#pragma unroll
        for (int pp = 0; pp < 4; ++pp) {
          const float4 pv = *reinterpret_cast<const float4*>(Qb + (tt + 16 * pp) * kLdP + sc);
          o[pp][0] = __fmaf_rn(pv.w, v0[3], __fmaf_rn(pv.z, v0[2], __fmaf_rn(pv.y, v0[1], __fmaf_rn(pv.x, v0[0], o[pp][0]))));
          o[pp][1] = __fmaf_rn(pv.w, v1[3], __fmaf_rn(pv.z, v1[2], __fmaf_rn(pv.y, v1[1], __fmaf_rn(pv.x, v1[0], o[pp][1]))));
        }
      }
#pragma unroll
      for (int pp = 0; pp < 4; ++pp) {
        const int t = tt + 16 * pp;
        if (t < L) {
          const float eg = expf(gs[t]);
          float* dst = w.u + size_t(r0 + t) * vd + size_t(h) * dv + c0;
          dst[jj] = __fmaf_rn(eg, y[pp][0], o[pp][0]);
          dst[jj + 16] = __fmaf_rn(eg, y[pp][1], o[pp][1]);
        }
      }
    }
    __syncthreads();  // every thread has read V'

    // V'' = e^{γ_{L−1}−γ_t} V'_t (the same owners as phase 1).
    const float gl = gs[L - 1];
#pragma unroll
    for (int pp = 0; pp < 4; ++pp) {
      const int t = tt + 16 * pp;
      const float f = expf(__fsub_rn(gl, gs[t]));
      float* vrow = Vs + t * kLdV;
      vrow[jj] = __fmul_rn(vrow[jj], f);
      vrow[jj + 16] = __fmul_rn(vrow[jj + 16], f);
    }
    __syncthreads();

    // S <- e^{γ_{L−1}} S + K̂ᵀ V'' (t order); each S element has one owner.
    {
      const float eL = expf(gl);
      float acc[4][4];
#pragma unroll
      for (int pp = 0; pp < 4; ++pp)
#pragma unroll
        for (int qq = 0; qq < 4; ++qq) acc[pp][qq] = 0.0f;
      for (int t = 0; t < L; ++t) {
        const float* krow = Wb + t * ldk;
        const float* vrow = Vs + t * kLdV;
        float kv[4], vv[4];
#pragma unroll
        for (int pp = 0; pp < 4; ++pp) kv[pp] = ii + 32 * pp < dk ? krow[ii + 32 * pp] : 0.0f;
#pragma unroll
        for (int qq = 0; qq < 4; ++qq) vv[qq] = vrow[jq + 8 * qq];
#pragma unroll
        for (int pp = 0; pp < 4; ++pp)
#pragma unroll
          for (int qq = 0; qq < 4; ++qq) acc[pp][qq] = __fmaf_rn(kv[pp], vv[qq], acc[pp][qq]);
      }
#pragma unroll
      for (int pp = 0; pp < 4; ++pp) {
        const int i = ii + 32 * pp;
        if (i < dk) {
#pragma unroll
          for (int qq = 0; qq < 4; ++qq) {
            float* e = ST + (jq + 8 * qq) * ldk + i;
            *e = __fmaf_rn(eL, *e, acc[pp][qq]);
          }
        }
      }
    }
    __syncthreads();  // Sᵀ updated before the next chunk reads it and Wb/Qb/Vs are refilled
  }

  for (int idx = tid; idx < dk * kBN; idx += kThreads) {
    const int i = idx / kBN, j = idx % kBN;
    S[size_t(i) * dv + c0 + j] = ST[j * ldk + i];
  }
}

// ---- 4. gated RMSNorm --------------------------------------------------------------------

// y_j = (w_j · (o_j · rsqrt(mean(o²) + eps))) · silu(z_j), one warp per (prompt row, v-head).
__global__ void __launch_bounds__(kNormWarps * 32) chunk_norm_kernel(const float* __restrict__ core,
                                                                    const float* __restrict__ z, GdnShape s,
                                                                    const float* __restrict__ norm_w, int P,
                                                                    int first_row, float* __restrict__ out) {
  const long long gw = (long long)blockIdx.x * kNormWarps + (threadIdx.x >> 5);
  if (gw >= (long long)P * s.num_v_heads) return;
  const int lane = threadIdx.x & 31, dv = s.v_head_dim;
  const float* o = core + size_t(gw) * dv;  // (row, v-head) rows are contiguous
  const size_t off = size_t(first_row) * s.value_dim() + size_t(gw) * dv;
  float ss = 0.0f;
  for (int j = lane; j < dv; j += 32) ss = __fmaf_rn(o[j], o[j], ss);
  ss = warp_sum(ss);
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(dv)), s.norm_eps)));
  for (int j = lane; j < dv; j += 32)
    out[off + j] = __fmul_rn(__fmul_rn(norm_w[j], __fmul_rn(o[j], inv)), silu(z[off + j]));
}

// ---- host --------------------------------------------------------------------------------

constexpr size_t kIntraSmemMax = size_t(kC * (kMaxD + 4) * 2 + kC * kLdA + 3 * kC) * sizeof(float);
constexpr size_t kStateSmemMax = size_t(kBN * (kMaxD + 4) + 2 * kC * (kMaxD + 4) + kC * kLdV + kC) * sizeof(float);

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
  done[dev].store(true, std::memory_order_release);
}

}  // namespace

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
                             void* workspace, size_t workspace_bytes, float* out, cudaStream_t stream) {
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

  const int prep_threads = (std::max(s.k_head_dim, s.v_head_dim) + 31) / 32 * 32;
  chunk_prep_kernel<<<dim3(unsigned((P + kPrepTT - 1) / kPrepTT), unsigned(s.num_k_heads + s.num_v_heads)),
                      prep_threads, 0, stream>>>(qkv, b, a, s, layer, meta, first_row, w);
  MOESERVE_CUDA_CHECK_LAUNCH();

  // Every sequence has at most ceil(n/64) + 1 chunks: P/64 + 2S bounds the total.
  const unsigned chunk_bound = unsigned((P + kC - 1) / kC + 2 * S);
  const size_t intra_smem = size_t(intra_smem_floats(s.k_head_dim)) * sizeof(float);
  chunk_intra_kernel<<<dim3(chunk_bound, unsigned(s.num_k_heads)), kThreads, intra_smem, stream>>>(s, meta, first_seq,
                                                                                                  first_row, w);
  MOESERVE_CUDA_CHECK_LAUNCH();

  const size_t state_smem = size_t(state_smem_floats(s.k_head_dim)) * sizeof(float);
  chunk_state_kernel<<<dim3(unsigned(S), unsigned(s.num_v_heads), unsigned(s.v_head_dim / kBN)), kThreads, state_smem,
                       stream>>>(qkv, s, layer, meta, first_seq, first_row, w);
  MOESERVE_CUDA_CHECK_LAUNCH();

  const long long norm_warps = (long long)P * s.num_v_heads;
  chunk_norm_kernel<<<unsigned((norm_warps + kNormWarps - 1) / kNormWarps), kNormWarps * 32, 0, stream>>>(
      w.u, z, s, layer.norm_weight, P, first_row, out);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
