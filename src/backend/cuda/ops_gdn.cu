// Gated DeltaNet kernels (ops_gdn.h, spec 2.5). A step whose sequences all have one new token
// (decode, graph padding) runs ONE kernel, gdn_decode_kernel (4. below); any other step runs
// the two-pass path: 1, 2 and (split shape) 3. Every token gets the same bits on both paths.
//
// 1. gdn_prep_kernel: conv + SiLU, l2norm, gates. One CTA per (tile of 8 tokens, unit), a unit
//    being a key head (thread i: q channel i and k channel i) or a value head (thread i: v
//    channel i). A thread slides the causal depthwise conv of its channel over the tile's
//    tokens, loading each pre-conv input once (rows of qkv of the token's own sequence, or the
//    slot's conv state before the sequence's first new token), then silu. A key-head CTA then
//    l2-normalises q (and scales it by 1/sqrt(dk)) and k per token with block reductions and
//    stores q̂·k̂; a value-head CTA stores decay = exp(g) and beta. Tokens are independent (no
//    walk along a sequence), so a prefill is spread over ceil(M/8)·(nk+nv) CTAs.
//    Writes conv_out [M][conv_dim] (q̂ | k̂ | v, f32), decay/beta [M][nv], kq [M][nk].
//    Roofline: reads qkv once, writes conv_out once: M·conv_dim·(sizeof(T) + 4) B.
//
// 2. gdn_recurrent_kernel: the delta rule with the state S [dk][dv] of a (sequence, v-head)
//    in registers for all of the sequence's new tokens. Column j of S evolves on its own:
//      kv_j = Σ_i S_ij k_i,  sq_j = Σ_i S_ij q_i              (S before this token)
//      Δ_j  = β (v_j − e^g kv_j)
//      S_ij ← e^g S_ij + k_i Δ_j
//      o_j  = Σ_i S_ij(new) q_i = e^g sq_j + Δ_j (k·q)
//    (the same as spec 2.5 step 7, the decay folded into the two sums so that one reduction
//    per token gives both). Thread layout: a warp holds 32 rows x 32 columns; lane = 8·r + cg
//    owns rows (4·wr + r)·8 .. +7 and columns 4·cg .. +3 of its warp's 32 (8x4 = 32 state
//    registers); the W = ceil(dk/32) warps of a column strip split the rows, so the row sums
//    are: 8 rows in order in the thread, an xor butterfly over the 4 row lanes, then the W
//    warps' partials through shared memory summed in warp order. That order depends only on
//    dk: every output is bit-identical whatever shares the launch and however the columns are
//    spread over CTAs. Two launch shapes, chosen per step, give the same bits:
//      fused (small decode batches): one CTA per (sequence, v-head) with all ceil(dv/32)
//        column strips; after the last token it applies the gated RMSNorm to its head's
//        outputs (no third launch).
//      split (prefill, larger batches): one CTA per (sequence, v-head, 32-column strip):
//        more, smaller CTAs; gdn_norm_kernel applies the gated RMSNorm afterwards.
//    The raw outputs o go through the workspace (core [M][nv·dv], f32) in both shapes.
//    A token's inputs (q̂, k̂, the CTA's v columns, gates) come from shared memory: chunks of
//    8 tokens are copied asynchronously (cp.async) one chunk ahead, so the per-token chain
//    never waits on global memory. The CTAs of a sequence also store its new conv state (the
//    prep kernel, which read the old one, has finished). It is launched as a programmatic
//    dependent of the prep kernel: it loads the state, which the prep kernel does not touch,
//    while the prep kernel finishes, then waits for it (griddepcontrol).
//    Roofline: decode reads and writes the state once: 2·nv·dk·dv·4 B per sequence (8.4 MB
//    at the 122B shape); prefill adds only conv_out and core traffic per token, the state
//    stays in registers (the sequential token chain bounds a long prefill, not bytes).
//
// 3. gdn_norm_kernel (split shape only): one warp per (token, v-head), gated RMSNorm with plain
//    w and silu(z) over dv (spec 2.1.2), the same device function the fused shape uses.
//    Roofline: M·nv·dv·(4 + 2·sizeof(T)) B.
//
// 4. gdn_decode_kernel (one new token per sequence): 1 + 2 (+ the norm) in one launch, no
//    workspace. One CTA per (sequence, v-head, part of the head's columns): at the 122B shape
//    2 parts of 64 columns, 256 threads, so batch 1 runs 64·2 = 128 CTAs (one per SM) and
//    each CTA has its 32 KB of state in flight at once (8 16-B loads per thread). Each CTA
//    recomputes the prep it needs (conv + SiLU of its key head's q/k channels and of its own
//    v columns, l2norm, gates: the same per-channel operations and reduction trees as 1).
//    The CTAs of one (sequence, key head), i.e. the nv/nk v-heads sharing its q/k channels
//    with all their parts (8 at the 122B shape), form a thread-block cluster: after a
//    cluster barrier, each output warp reads its head's raw outputs from the parts' shared
//    memory (DSMEM) to form the norm's Σo² in gated_norm_warp's order, and the cluster's
//    conv-state channels are shifted in place (every CTA that read them is past the barrier).
//    Roofline: the state read and written once, 2·nv·dk·dv·4 B per sequence (8.4 MB at the
//    122B shape), plus per token qkv, z, b, a, out and the conv state (~0.3 MB).
//
// Arithmetic on the recurrence and the norm uses explicit _rn intrinsics (no contraction
// choices left to the compiler), so the launch shapes, the decode kernel, and the f32 and
// bf16 entry points, stay bit-identical; the gates, l2norm factors and norm steps are shared
// device functions.
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include <cuda_pipeline.h>

#include "backend/cuda/act_types.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/gdn_math.cuh"
#include "backend/cuda/l2_prefetch.cuh"
#include "backend/cuda/ops_gdn.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/stage_stamps.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kMaxConvK = 8;          // conv kernel width supported
constexpr int kMaxHeadDim = 256;      // dk and dv: one prep thread per channel of a head
constexpr int kPrepTokens = 8;        // prep: tokens per CTA in prefill (a sliding window per channel)
constexpr int kRowsPerThread = 8;     // recurrence: rows of S per thread
constexpr int kRowLanes = 4;          // lanes of a warp along rows (lane >> 3)
constexpr int kColGroups = 8;         // lanes of a warp along columns (lane & 7), 4 columns each
constexpr int kWarpRows = kRowsPerThread * kRowLanes;  // 32 rows of S per warp
constexpr int kWarpCols = kColGroups * 4;              // 32 columns of S per warp
constexpr int kMaxThreads = 512;      // recurrence CTA size limit (state registers)
constexpr int kChunk = 8;             // recurrence: tokens staged in shared memory at a time
constexpr int kWarpsPerBlock = 8;     // norm kernel: 256 threads
constexpr unsigned kFull = 0xffffffffu;

// Workspace regions (f32), each rounded up to 64 floats so that every region is 256-B aligned.
struct GdnWork {
  float* conv_out;  // [M][conv_dim]: q̂ (l2-normalised, /sqrt(dk)) | k̂ (l2-normalised) | v
  float* decay;     // [M][nv]: exp(g)
  float* beta;      // [M][nv]
  float* kq;        // [M][nk]: k̂·q̂ per key head
  float* core;      // [M][nv·dv]: delta-rule output before the gated norm
};

size_t round_region(size_t n) { return (n + 63) / 64 * 64; }

GdnWork carve(void* workspace, const GdnShape& s, int M) {
  float* p = static_cast<float*>(workspace);
  GdnWork w{};
  w.conv_out = p;
  p += round_region(size_t(M) * s.conv_dim());
  w.decay = p;
  p += round_region(size_t(M) * s.num_v_heads);
  w.beta = p;
  p += round_region(size_t(M) * s.num_v_heads);
  w.kq = p;
  p += round_region(size_t(M) * s.num_k_heads);
  w.core = p;
  return w;
}

using gdn_math::block_sums;
using gdn_math::l2norm_k;
using gdn_math::l2norm_q;
using gdn_math::silu;
using gdn_math::warp_sum;

// The gates of one (token, v-head): beta = sigmoid(b), decay = exp(g) with
// g = −exp(A_log)·softplus(a + dt_bias). Shared by the prep kernel and the decode kernel.
__device__ __forceinline__ void gdn_gates(float b, float a, float dt_bias, float a_log, float& decay, float& beta) {
  beta = gdn_math::gdn_beta(b);
  decay = expf(gdn_math::gdn_log_decay(a, dt_bias, a_log));
}

// Per-token view of a prep tile: the sequence's first new token and its slot's conv state.
template <int TT>
struct PrepTokens {
  int m0, nt;              // tokens m0 .. m0 + nt − 1 (nt <= TT)
  int t0[TT];
  const float* state[TT];  // [conv_dim][K−1] of the token's slot
};

// silu(Σ_j w[j] · u[m − (K−1) + j]) of channel c for the tile's tokens. The pre-conv inputs of
// rows m0 − (K−1) .. m0 + nt − 1 are loaded once; a tap before its token's sequence start
// reads the slot's conv state instead (oldest first).
template <typename T, int TT>
__device__ __forceinline__ void conv_tile(const T* __restrict__ qkv, const float* __restrict__ conv_w,
                                          const PrepTokens<TT>& tk, int C, int K, int c, float (&y)[TT]) {
  float wk[kMaxConvK];
#pragma unroll
  for (int j = 0; j < kMaxConvK; ++j) wk[j] = j < K ? conv_w[size_t(c) * K + j] : 0.0f;
  float x[TT + kMaxConvK - 1];  // x[i]: row m0 − (K−1) + i
#pragma unroll
  for (int i = 0; i < TT + kMaxConvK - 1; ++i) {
    const int row = tk.m0 - (K - 1) + i;
    x[i] = (i < tk.nt + K - 1 && row >= 0) ? to_f32(qkv[size_t(row) * C + c]) : 0.0f;
  }
#pragma unroll
  for (int t = 0; t < TT; ++t) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxConvK; ++j) {
      if (j < K) {
        const int row = tk.m0 + t - (K - 1) + j;
        const float u = row >= tk.t0[t] ? x[t + j] : tk.state[t][size_t(c) * (K - 1) + (row - tk.t0[t] + K - 1)];
        acc = __fmaf_rn(wk[j], u, acc);
      }
    }
    y[t] = silu(acc);
  }
}

// Grid (ceil(M / TT), nk + nv); block round32(max(dk, dv)) threads. CTA (tile, u):
// u < nk is key head u (thread i: q channel i and k channel i), else value head u − nk
// (thread i: v channel i; threads < nt: the gates of token m0 + i). TT, the tokens per CTA
// (1 for small steps, kPrepTokens for prefill), changes no token's arithmetic.
template <typename T, int TT>
__global__ void __launch_bounds__(kMaxHeadDim)
    gdn_prep_kernel(const T* __restrict__ qkv, const float* __restrict__ b, const float* __restrict__ a,
                    GdnShape s, GdnLayerParams p, StepMeta meta, GdnWork w) {
  __shared__ float red[(kMaxHeadDim / 32) * TT];
  pdl_launch_dependents();
  const int nk = s.num_k_heads, nv = s.num_v_heads, dk = s.k_head_dim, dv = s.v_head_dim;
  const int C = s.conv_dim(), K = s.conv_kernel, key_dim = s.key_dim();
  const int u = blockIdx.y, i = threadIdx.x;
  PrepTokens<TT> tk;
  tk.m0 = blockIdx.x * TT;
  tk.nt = min(TT, meta.num_tokens - tk.m0);
#pragma unroll
  for (int t = 0; t < TT; ++t) {
    tk.t0[t] = 0;
    tk.state[t] = p.conv_state;
    if (t < tk.nt) {
      const int seq = meta.token_seq[tk.m0 + t];
      tk.t0[t] = meta.seq_token_start[seq];
      tk.state[t] = p.conv_state + size_t(meta.seq_state_slot[seq]) * C * (K - 1);
    }
  }

  if (u < nk) {
    // Key head u: conv of q and k, then l2norm per token (q also scaled by 1/sqrt(dk)).
    float qv[TT], kv[TT], qq[TT], kk[TT];
#pragma unroll
    for (int t = 0; t < TT; ++t) qv[t] = kv[t] = 0.0f;
    if (i < dk) {
      conv_tile(qkv, p.conv_weight, tk, C, K, u * dk + i, qv);
      conv_tile(qkv, p.conv_weight, tk, C, K, key_dim + u * dk + i, kv);
    }
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      qq[t] = __fmul_rn(qv[t], qv[t]);
      kk[t] = __fmul_rn(kv[t], kv[t]);
    }
    block_sums(qq, red);
    block_sums(kk, red);
    // l2norm: x / sqrt(Σx² + 1e-6), eps hard-coded as in HF.
    float qk[TT];
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      const float qn = l2norm_q(qv[t], qq[t], dk);
      const float kn = l2norm_k(kv[t], kk[t]);
      qk[t] = __fmul_rn(qn, kn);
      if (i < dk && t < tk.nt) {
        float* row = w.conv_out + size_t(tk.m0 + t) * C;
        row[u * dk + i] = qn;
        row[key_dim + u * dk + i] = kn;
      }
    }
    block_sums(qk, red);
    if (i < tk.nt) {
      float mine = qk[0];  // qk[i] without dynamic register indexing
#pragma unroll
      for (int t = 1; t < TT; ++t)
        if (t == i) mine = qk[t];
      w.kq[size_t(tk.m0 + i) * nk + u] = mine;
    }
  } else {
    // Value head h: conv of v (no normalisation) and the gates.
    const int h = u - nk;
    if (i < dv) {
      float vv[TT];
      conv_tile(qkv, p.conv_weight, tk, C, K, 2 * key_dim + h * dv + i, vv);
#pragma unroll
      for (int t = 0; t < TT; ++t)
        if (t < tk.nt) w.conv_out[size_t(tk.m0 + t) * C + 2 * key_dim + h * dv + i] = vv[t];
    }
    if (i < tk.nt) {
      const size_t gi = size_t(tk.m0 + i) * nv + h;
      gdn_gates(b[gi], a[gi], p.dt_bias[h], p.a_log[h], w.decay[gi], w.beta[gi]);
    }
  }
}

// The gated RMSNorm's two steps (shared by gated_norm_warp and the decode kernel):
// inv = 1/sqrt(Σo²/dv + eps) from the sum of squares, then y_j = (w_j · (o_j · inv)) · silu(z_j).
__device__ __forceinline__ float gated_norm_inv(float ss, int dv, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(dv)), eps)));
}
__device__ __forceinline__ float gated_norm_out(float o, float inv, float w, float z) {
  return __fmul_rn(__fmul_rn(w, __fmul_rn(o, inv)), silu(z));
}

// y_j = (w_j · (o_j · rsqrt(mean(o²) + eps))) · silu(z_j) for one (token, v-head), by one warp.
// Used by both launch shapes: the sum of squares has one fixed order (lane-strided, then xor).
// `o` is a plain pointer: in the fused shape it was written by other threads of the CTA.
template <typename T>
__device__ __forceinline__ void gated_norm_warp(const float* o, const T* __restrict__ z,
                                                const float* __restrict__ w, int dv, float eps, T* out,
                                                int lane) {
  float ss = 0.0f;
  for (int j = lane; j < dv; j += 32) ss = __fmaf_rn(o[j], o[j], ss);
  const float inv = gated_norm_inv(warp_sum(ss), dv, eps);
  for (int j = lane; j < dv; j += 32) out[j] = from_f32<T>(gated_norm_out(o[j], inv, w[j], to_f32(z[j])));
}

// Shared-memory stage of kChunk tokens for one recurrence CTA (floats):
//   k [kChunk][dkp] | q [kChunk][dkp] | v [kChunk][ncols] | gates [kChunk][4] (decay, beta, kq)
// dkp = dk rounded up to 4, ncols = the CTA's columns (32·ncw). Two stages alternate.
struct Stage {
  int dkp, ncols;
  __host__ __device__ int floats() const { return kChunk * (2 * dkp + ncols + 4); }
  __device__ float* k(float* base, int t) const { return base + t * dkp; }
  __device__ float* q(float* base, int t) const { return base + (kChunk + t) * dkp; }
  __device__ float* v(float* base, int t) const { return base + 2 * kChunk * dkp + t * ncols; }
  __device__ float* gates(float* base, int t) const { return base + kChunk * (2 * dkp + ncols) + t * 4; }
};

__device__ __forceinline__ void copy_async(float* dst, const float* src, bool vec4) {
  if (vec4)
    __pipeline_memcpy_async(dst, src, 16);
  else
    __pipeline_memcpy_async(dst, src, 4);
}

// Starts copying tokens m0 .. m0 + nt − 1 (their q̂, k̂ of key head kh, v columns col0 ..
// col0 + ncols − 1 of v-head h and gates) into a stage; all threads take part.
__device__ __forceinline__ void stage_tokens(float* buf, const Stage& sg, const GdnWork& w, const GdnShape& s,
                                             int m0, int nt, int h, int kh, int col0, bool vec) {
  const int dk = s.k_head_dim, dv = s.v_head_dim, C = s.conv_dim(), key_dim = s.key_dim();
  const int g = vec ? 4 : 1;
  const int nkq = 2 * dk / g;                                      // copies per token for q̂ and k̂
  const int nvc = col0 < dv ? min(sg.ncols, dv - col0) / g : 0;   // copies per token for v
  for (int idx = threadIdx.x; idx < nt * nkq; idx += blockDim.x) {
    const int t = idx / nkq, e = (idx % nkq) * g;
    const bool is_q = e >= dk;
    const int i = is_q ? e - dk : e;
    const float* src = w.conv_out + size_t(m0 + t) * C + (is_q ? 0 : key_dim) + kh * dk + i;
    copy_async((is_q ? sg.q(buf, t) : sg.k(buf, t)) + i, src, vec);
  }
  for (int idx = threadIdx.x; idx < nt * nvc; idx += blockDim.x) {
    const int t = idx / nvc, j = (idx % nvc) * g;
    copy_async(sg.v(buf, t) + j, w.conv_out + size_t(m0 + t) * C + 2 * key_dim + h * dv + col0 + j, vec);
  }
  for (int idx = threadIdx.x; idx < nt * 3; idx += blockDim.x) {
    const int t = idx / 3, e = idx % 3;
    const size_t m = size_t(m0 + t);
    const float* src = e == 0 ? w.decay + m * s.num_v_heads + h
                       : e == 1 ? w.beta + m * s.num_v_heads + h
                                : w.kq + m * s.num_k_heads + kh;
    copy_async(sg.gates(buf, t) + e, src, false);
  }
  __pipeline_commit();
}

// ---- the delta rule's per-thread pieces, shared by gdn_recurrent_kernel and gdn_decode_kernel ----
// (one definition, so the two paths do the same operations in the same order, bit for bit).
// Thread layout: rows i0 .. i0 + R − 1 (R = kRowsPerThread) and columns j0 .. j0 + 3 of one
// head's state S [dk][dv]; the 4 row lanes of a column group are lanes cg, cg + 8, cg + 16, cg + 24.

// st = S[i0 .. i0+R−1][j0 .. j0+3], zero outside [dk) x [dv). vec: 16-B loads (dv % 4 == 0, S aligned).
template <bool vec, int R>
__device__ __forceinline__ void load_state_tile(const float* S, int i0, int j0, int dk, int dv, float (&st)[R][4]) {
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int i = i0 + rr;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (i < dk && j0 < dv) {
      const float* src = S + size_t(i) * dv + j0;
      if constexpr (vec) {
        x = *reinterpret_cast<const float4*>(src);
      } else {
        x.x = src[0];
        if (j0 + 1 < dv) x.y = src[1];
        if (j0 + 2 < dv) x.z = src[2];
        if (j0 + 3 < dv) x.w = src[3];
      }
    }
    st[rr][0] = x.x, st[rr][1] = x.y, st[rr][2] = x.z, st[rr][3] = x.w;
  }
}

// S[i][j0 .. j0+3] = row (the columns inside dv; nothing when i or j0 is outside the head).
template <bool vec>
__device__ __forceinline__ void store_state_row(float* S, int i, int j0, int dk, int dv, const float (&row)[4]) {
  if (i < dk && j0 < dv) {
    float* dst = S + size_t(i) * dv + j0;
    if constexpr (vec) {
      *reinterpret_cast<float4*>(dst) = make_float4(row[0], row[1], row[2], row[3]);
    } else {
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (j0 + c < dv) dst[c] = row[c];
    }
  }
}

// The token's k̂, q̂ at this thread's rows (kb, qb: [dk] in shared memory, 16-B aligned) and
// its v at this thread's columns (vj: the v of column j0, CTA-local), zero outside the head.
template <bool vec, int R>
__device__ __forceinline__ void load_token_kqv(const float* kb, const float* qb, const float* vj, int i0, int j0,
                                               int dk, int dv, float (&k)[R], float (&q)[R], float (&v)[4]) {
  if constexpr (vec) {
#pragma unroll
    for (int g4 = 0; g4 < R / 4; ++g4) {
      float4 k4 = make_float4(0.f, 0.f, 0.f, 0.f), q4 = k4;
      if (i0 + 4 * g4 < dk) {
        k4 = *reinterpret_cast<const float4*>(kb + i0 + 4 * g4);
        q4 = *reinterpret_cast<const float4*>(qb + i0 + 4 * g4);
      }
      k[4 * g4] = k4.x, k[4 * g4 + 1] = k4.y, k[4 * g4 + 2] = k4.z, k[4 * g4 + 3] = k4.w;
      q[4 * g4] = q4.x, q[4 * g4 + 1] = q4.y, q[4 * g4 + 2] = q4.z, q[4 * g4 + 3] = q4.w;
    }
    float4 v4 = make_float4(0.f, 0.f, 0.f, 0.f);
    if (j0 < dv) v4 = *reinterpret_cast<const float4*>(vj);
    v[0] = v4.x, v[1] = v4.y, v[2] = v4.z, v[3] = v4.w;
  } else {
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      k[rr] = i0 + rr < dk ? kb[i0 + rr] : 0.0f;
      q[rr] = i0 + rr < dk ? qb[i0 + rr] : 0.0f;
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) v[c] = j0 + c < dv ? vj[c] : 0.0f;
  }
}

// tk[c], tq[c] = Σ_i S[i][j0+c]·k[i], Σ_i S[i][j0+c]·q[i] over the strip's rows: this thread's
// R rows in order, then the 4 row lanes (xor 8, 16: every lane ends with the same bits,
// addition being commutative), then, when W > 1, the W row warps of the strip in warp order
// through rb ([ncw][W][kColGroups][8] floats of shared memory). W depends on dk only: uniform
// over the CTA, so the barrier inside is never divergent; the caller keeps rb from being
// rewritten before every thread has read it.
template <int R>
__device__ __forceinline__ void strip_sums(const float (&st)[R][4], const float (&k)[R], const float (&q)[R], int W,
                                           int wr, int wc, int r, int cg, float* rb, float (&tk)[4],
                                           float (&tq)[4]) {
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    float ak = 0.0f, aq = 0.0f;
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      ak = __fmaf_rn(st[rr][c], k[rr], ak);
      aq = __fmaf_rn(st[rr][c], q[rr], aq);
    }
    ak = __fadd_rn(ak, __shfl_xor_sync(kFull, ak, 8));
    aq = __fadd_rn(aq, __shfl_xor_sync(kFull, aq, 8));
    tk[c] = __fadd_rn(ak, __shfl_xor_sync(kFull, ak, 16));
    tq[c] = __fadd_rn(aq, __shfl_xor_sync(kFull, aq, 16));
  }
  if (W > 1) {
    if (r == 0) {
      float* dst = rb + ((wc * W + wr) * kColGroups + cg) * 8;
      *reinterpret_cast<float4*>(dst) = make_float4(tk[0], tk[1], tk[2], tk[3]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(tq[0], tq[1], tq[2], tq[3]);
    }
    __syncthreads();
    const float* src = rb + (size_t(wc * W) * kColGroups + cg) * 8;
    float4 k4 = *reinterpret_cast<const float4*>(src), q4 = *reinterpret_cast<const float4*>(src + 4);
    for (int ww = 1; ww < W; ++ww) {
      const float4 kn = *reinterpret_cast<const float4*>(src + ww * kColGroups * 8);
      const float4 qn = *reinterpret_cast<const float4*>(src + ww * kColGroups * 8 + 4);
      k4 = make_float4(__fadd_rn(k4.x, kn.x), __fadd_rn(k4.y, kn.y), __fadd_rn(k4.z, kn.z), __fadd_rn(k4.w, kn.w));
      q4 = make_float4(__fadd_rn(q4.x, qn.x), __fadd_rn(q4.y, qn.y), __fadd_rn(q4.z, qn.z), __fadd_rn(q4.w, qn.w));
    }
    tk[0] = k4.x, tk[1] = k4.y, tk[2] = k4.z, tk[3] = k4.w;
    tq[0] = q4.x, tq[1] = q4.y, tq[2] = q4.z, tq[3] = q4.w;
  }
}

// The delta rule's per-column terms: d = β·(v − g·S^T k̂), o = g·S^T q̂ + d·(q̂·k̂) (kq = q̂·k̂).
__device__ __forceinline__ void delta_terms(float decay, float beta, float kq, const float (&v)[4],
                                            const float (&tk)[4], const float (&tq)[4], float (&d)[4],
                                            float (&o)[4]) {
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float kv = __fmul_rn(decay, tk[c]);
    d[c] = __fmul_rn(beta, __fsub_rn(v[c], kv));
    o[c] = __fmaf_rn(d[c], kq, __fmul_rn(decay, tq[c]));
  }
}

// One state row: S[i][j] ← g·S[i][j] + k̂[i]·d[j].
__device__ __forceinline__ void update_state_row(float (&row)[4], float ki, float decay, const float (&d)[4]) {
#pragma unroll
  for (int c = 0; c < 4; ++c) row[c] = __fmaf_rn(ki, d[c], __fmul_rn(decay, row[c]));
}

// Grid (fused ? 1 : ceil(dv/32), nv, num_seqs); block 32·W·ncw threads, W = ceil(dk/32) warps
// per column strip, ncw = column strips per CTA (ceil(dv/32) fused, 1 split). Dynamic shared
// memory: 2 stages, then 2·ncw·W·64 floats (double-buffered cross-warp partials). vec: dk and
// dv are multiples of 4 and the state is 16-B aligned (16-B loads, stores and copies); the
// scalar variant serves odd head dims.
// Registers: the split shape (CTAs of 128 threads at dk 128) is bounded to 3 CTAs of 256 threads
// per SM (<= 85 registers): its state loads are the kernel's time at large decode batches, and
// 6 CTAs of 128 threads keep 96 KB of state in flight per SM where 171 registers allowed 2.
template <typename T, bool kFused, bool vec>
__global__ void __launch_bounds__(kFused ? kMaxThreads : kMaxThreads / 2, kFused ? 1 : 3)
    gdn_recurrent_kernel(const T* __restrict__ qkv, const T* __restrict__ z, GdnShape s, GdnLayerParams p,
                         StepMeta meta, GdnWork w, T* out) {
  extern __shared__ __align__(16) float smem[];
  // Strips fastest, then heads, then sequences: the CTAs that run together read whole 512-B
  // rows of neighbouring heads' states of one slot (DRAM page locality), not one 128-B strip of
  // each of many slots (docs/PERF.md run 26: 202 -> 178 us at 64 sequences, 122B shape).
  const int strip0 = blockIdx.x, h = blockIdx.y, seq = blockIdx.z;
  const int dk = s.k_head_dim, dv = s.v_head_dim, nv = s.num_v_heads;
  const int W = (dk + kWarpRows - 1) / kWarpRows;
  const int ncw = blockDim.x / (32 * W);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wr = warp % W, wc = warp / W;  // row warp within the strip, strip within the CTA
  const int r = lane >> 3, cg = lane & 7;
  const int i0 = (wr * kRowLanes + r) * kRowsPerThread;
  const int col0 = strip0 * ncw * kWarpCols;       // first column of the CTA
  const int jl = wc * kWarpCols + cg * 4;          // this thread's first column, CTA-local
  const int j0 = col0 + jl;
  const int kh = h / (nv / s.num_k_heads);
  const int t0 = meta.seq_token_start[seq], t1 = meta.seq_token_start[seq + 1];
  const int slot = meta.seq_state_slot[seq];
  const size_t vd = size_t(s.value_dim());
  const Stage sg{(dk + 3) / 4 * 4, ncw * kWarpCols};
  // Two stages, then the cross-warp partials [2][ncw][W][kColGroups][8] (4 kv, 4 sq each).
  float* red = smem + 2 * sg.floats();

  // The state first: the prep kernel does not touch it, so with programmatic dependent
  // launch these loads overlap the prep kernel's tail.
  float* S = p.recurrent_state + (size_t(slot) * nv + h) * size_t(dk) * dv;
  float st[kRowsPerThread][4];
  load_state_tile<vec>(S, i0, j0, dk, dv, st);
  // Everything below reads the prep kernel's outputs or rewrites the conv state it read.
  pdl_wait();
  if (t0 < t1) stage_tokens(smem, sg, w, s, t0, min(kChunk, t1 - t0), h, kh, col0, vec);

  // New conv state of the sequence: its last K−1 pre-conv inputs, from this step's rows or,
  // for short steps, shifted from the old state. The prep kernel, which read the old state,
  // has finished; the sequence's CTAs share the channels, each channel has one thread.
  {
    const int C = s.conv_dim(), K = s.conv_kernel, n = t1 - t0;
    const int ctas = gridDim.x * gridDim.y, cta = blockIdx.y * gridDim.x + blockIdx.x;
    float* cs = p.conv_state + size_t(slot) * C * (K - 1);
    for (int c = cta * blockDim.x + threadIdx.x; c < C; c += ctas * blockDim.x) {
      float* st_c = cs + size_t(c) * (K - 1);
      float nw[kMaxConvK - 1];
#pragma unroll
      for (int j = 0; j < kMaxConvK - 1; ++j) {
        if (j < K - 1) {
          const int src = j + n;  // position in [old state (K−1) | new rows (n)]
          nw[j] = src < K - 1 ? st_c[src] : to_f32(qkv[size_t(t0 + src - (K - 1)) * C + c]);
        }
      }
#pragma unroll
      for (int j = 0; j < kMaxConvK - 1; ++j)
        if (j < K - 1) st_c[j] = nw[j];
    }
  }

  for (int m0 = t0, chunk = 0; m0 < t1; m0 += kChunk, ++chunk) {
    const int nt = min(kChunk, t1 - m0);
    float* buf = smem + (chunk & 1) * sg.floats();
    if (m0 + kChunk < t1) {
      // The other stage was last read in the previous chunk, before its closing barrier.
      stage_tokens(smem + ((chunk + 1) & 1) * sg.floats(), sg, w, s, m0 + kChunk, min(kChunk, t1 - m0 - kChunk), h,
                   kh, col0, vec);
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();  // this chunk's stage is complete and visible

    for (int t = 0; t < nt; ++t) {
      const int m = m0 + t;
      float k[kRowsPerThread], q[kRowsPerThread], v[4];
      load_token_kqv<vec>(sg.k(buf, t), sg.q(buf, t), sg.v(buf, t) + jl, i0, j0, dk, dv, k, q, v);
      const float* gt = sg.gates(buf, t);
      const float decay = gt[0], beta = gt[1], kq = gt[2];

      // S^T k̂ and S^T q̂ at this thread's columns; the double-buffered partials let the next
      // token's writes wait only for its own barrier.
      float tk[4], tq[4];
      strip_sums(st, k, q, W, wr, wc, r, cg, red + size_t(m & 1) * ncw * W * kColGroups * 8, tk, tq);

      float d[4], o[4];
      delta_terms(decay, beta, kq, v, tk, tq, d, o);
#pragma unroll
      for (int rr = 0; rr < kRowsPerThread; ++rr) update_state_row(st[rr], k[rr], decay, d);

      if (r == 0 && wr == 0 && j0 < dv) {
        float* dst = w.core + size_t(m) * vd + size_t(h) * dv + j0;
        if constexpr (vec) {
          *reinterpret_cast<float4*>(dst) = make_float4(o[0], o[1], o[2], o[3]);
        } else {
#pragma unroll
          for (int c = 0; c < 4; ++c)
            if (j0 + c < dv) dst[c] = o[c];
        }
      }
    }
    __syncthreads();  // this stage is refilled two chunks on
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerThread; ++rr) store_state_row<vec>(S, i0 + rr, j0, dk, dv, st[rr]);

  if constexpr (kFused) {
    // The chunk loop's closing barrier made this head's core rows (written by the strips'
    // writer threads) visible to the whole CTA.
    const int nwarps = blockDim.x >> 5;
    for (int m = t0 + warp; m < t1; m += nwarps) {
      const size_t off = size_t(m) * vd + size_t(h) * dv;
      gated_norm_warp(w.core + off, z + off, p.norm_weight, dv, s.norm_eps, out + off, lane);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gdn_norm_kernel(const float* __restrict__ core, const T* __restrict__ z, GdnShape s,
                    const float* __restrict__ norm_w, int M, T* out) {
  const long long gw = (long long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (gw >= (long long)M * s.num_v_heads) return;
  const size_t off = size_t(gw) * s.v_head_dim;  // (token, v-head) rows are contiguous
  gated_norm_warp(core + off, z + off, norm_w, s.v_head_dim, s.norm_eps, out + off, threadIdx.x & 31);
}


// ---- one-launch decode step (every sequence of the launch has exactly one new token) ----

// Thread-block cluster primitives (sm_90+: the H200 and GB10 both have clusters). The
// barrier is arrive.release + wait.acquire at cluster scope: it orders every CTA's earlier
// shared and global accesses before every CTA's later ones, and it is a __syncthreads too.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
#else
  __syncthreads();
#endif
}
// The two halves of cluster_sync, for work between them.
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
#endif
}
// A float of CTA `rank`'s shared memory at the address of `local` in this CTA (distributed
// shared memory: every CTA of the cluster has the same static shared layout).
__device__ __forceinline__ float ld_cluster_f32(const float* local, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned a = unsigned(__cvta_generic_to_shared(local));
  unsigned remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
#else
  return *local;
#endif
}

// silu(Σ_j w[j]·u[j]) of channel c for a token m that is its sequence's only new token: taps
// 0 .. K−2 read the slot's conv state (oldest first), tap K−1 the token's own row. The same
// products in the same order as conv_tile for the first token of a sequence.
template <typename T>
__device__ __forceinline__ float conv_one(const T* __restrict__ qkv, const float* __restrict__ conv_w,
                                          const float* cs, int C, int K, int m, int c) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxConvK; ++j) {
    if (j < K) {
      const float u = j < K - 1 ? cs[size_t(c) * (K - 1) + j] : to_f32(qkv[size_t(m) * C + c]);
      acc = __fmaf_rn(conv_w[size_t(c) * K + j], u, acc);
    }
  }
  return silu(acc);
}

// One CTA per (sequence, v-head h, part of the head's columns); a cluster holds the CTAs of
// one (sequence, key head kh): the G = nv/nk v-heads that share kh, each cut into `parts`
// column ranges of cw = 32·ncw columns. Grid (G·parts, nk, num_seqs), cluster (G·parts, 1, 1)
// (<= 8 CTAs), CTA x = gi·parts + part: v-head h = kh·G + gi, columns part·cw .. +cw−1.
// Block 32·W·ncw threads (W = ceil(dk/32) row warps per 32-column strip, as the recurrence).
// A CTA, with no workspace round trip:
//   1. loads its state columns (all dk rows) into registers, the thread layout of
//      gdn_recurrent_kernel (8 rows x 4 columns per thread, 16-B loads);
//   2. prep, recomputed per CTA (cheap: 2·dk + cw channels): conv + SiLU of kh's q and k
//      channels and of its own v columns, the l2norm sums of q and k, then q̂·k̂, each as
//      one warp butterfly per 32 channels with the warps' sums added in order: the
//      arithmetic of gdn_prep_kernel, bit for bit (its block has ceil(max(dk, dv)/32) warps;
//      the warps past dk contribute +0, added here too); the gates of (token, h);
//   3. the delta rule for one token (the arithmetic of gdn_recurrent_kernel), writes its
//      state columns back and its raw outputs o to shared memory;
//   4. cluster barrier; the gated RMSNorm needs Σo² over the head's dv columns in
//      gated_norm_warp's order (lane l: columns l, l+32, ... then a butterfly): each output
//      warp reads the head's o from its parts' shared memory (DSMEM) and writes its columns.
//      The conv state of the cluster's channels (kh's q and k, the G heads' v) is shifted
//      in place after that barrier: every CTA that read it (only this cluster's CTAs do) is
//      past its reads. A second barrier (arrive after the DSMEM reads, wait before exit)
//      keeps each CTA's shared memory alive until the others have read it.
// So a token's output and new state are the bits of the prep + recurrence path, whatever
// shares the launch. Graph padding rows (sequences of one token sharing the padding slot)
// race only on the padding slot's garbage. Launched as a programmatic dependent: the state
// columns are loaded into registers and the conv lines prefetched into L2 before
// griddepcontrol.wait; the activations and the conv state are read after it.
// Roofline: the state read and written once, 2·nv·dk·dv·4 B per sequence (8.4 MB at the 122B
// shape), plus per token qkv, z, b, a in, out out and the conv state (about 0.3 MB); the
// shared key head's q/k inputs are read by the G·parts CTAs of a cluster (L2 hits).
template <typename T, bool vec>
__global__ void __launch_bounds__(kMaxThreads)
    gdn_decode_kernel(const T* __restrict__ qkv, const T* __restrict__ z, const float* __restrict__ b,
                      const float* __restrict__ a, GdnShape s, GdnLayerParams p, StepMeta meta, int parts,
                      T* __restrict__ out) {
  __shared__ __align__(16) float s_q[kMaxHeadDim];  // q, then q̂ (zero past dk)
  __shared__ __align__(16) float s_k[kMaxHeadDim];  // k, then k̂
  __shared__ __align__(16) float s_v[kMaxHeadDim];  // the CTA's v columns
  __shared__ __align__(16) float s_o[kMaxHeadDim];  // the CTA's raw outputs (read by the cluster)
  __shared__ __align__(16) float s_red[(kMaxThreads / 32) * kColGroups * 8];  // [ncw][W][cg][4 kv, 4 sq]
  __shared__ float s_part[3][kMaxHeadDim / 32];  // per 32 channels: Σq², Σk², Σq̂k̂
  __shared__ float s_gate[2];                    // decay, beta
  // Measurement builds only (stage_stamps.cuh): 0 entry, 1 the wait, 2 conv + SiLU and the gates,
  // 3 the l2norms and q·k, 4 the delta rule done and the state stored, 5 the cluster barrier, 6 the
  // output written, 7 exit.
  StageStamps<8> stamps;
  stamps.mark(0);

  const int nk = s.num_k_heads, nv = s.num_v_heads, dk = s.k_head_dim, dv = s.v_head_dim;
  const int G = nv / nk, C = s.conv_dim(), K = s.conv_kernel, key_dim = s.key_dim();
  const int W = (dk + kWarpRows - 1) / kWarpRows, dkr = W * kWarpRows;
  const int nthreads = blockDim.x, ncw = nthreads / (32 * W), cw = ncw * kWarpCols;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wr = warp % W, wc = warp / W;
  const int r = lane >> 3, cg = lane & 7;
  const int i0 = (wr * kRowLanes + r) * kRowsPerThread;
  const int gi = int(blockIdx.x) / parts, part = int(blockIdx.x) % parts;
  const int kh = blockIdx.y, seq = blockIdx.z, h = kh * G + gi;
  const int col0 = part * cw, jl = wc * kWarpCols + cg * 4, j0 = col0 + jl;
  const size_t vd = size_t(s.value_dim());

  pdl_launch_dependents();  // the next kernel may get resident early (it waits for this grid)
  // The step metadata was uploaded before the step (no kernel writes it).
  const int m = meta.seq_token_start[seq];
  if (meta.seq_token_start[seq + 1] - m != 1) return;  // the whole cluster (one sequence) leaves
  const int slot = meta.seq_state_slot[seq];
  float* S = p.recurrent_state + (size_t(slot) * nv + h) * size_t(dk) * dv;
  float* cs = p.conv_state + size_t(slot) * C * (K - 1);

  // 1. The state columns, in registers while the previous kernel runs. Only this layer's DeltaNet
  // kernels write S, the last of them a step ago: steps end in a host synchronisation (the sampled
  // tokens), and inside a step nothing else touches S (as gdn_recurrent_kernel's early load). The
  // norm weight is a weight. The conv lines (read below through conv_one) only into L2.
  float st[kRowsPerThread][4];
  load_state_tile<vec>(S, i0, j0, dk, dv, st);
  // The norm's inputs for this thread's output column (output warps: warp < ncw).
  const int jn = col0 + warp * 32 + lane;  // output column of threads of warps < ncw
  const bool writes_out = warp < ncw && jn < dv;
  const float wn = writes_out ? p.norm_weight[jn] : 0.0f;
  for (int idx = tid; idx < 2 * dk + cw; idx += nthreads) {  // the conv inputs of the prep below
    const int c = idx < 2 * dk ? (idx < dk ? 0 : key_dim - dk) + kh * dk + idx : 2 * key_dim + h * dv + col0 + idx - 2 * dk;
    if (idx < 2 * dk || col0 + idx - 2 * dk < dv) {
      prefetch_l2(cs + size_t(c) * (K - 1));
      prefetch_l2(p.conv_weight + size_t(c) * K);
    }
  }
  pdl_wait();
  stamps.mark(1);

  const size_t out_off = size_t(m) * vd + size_t(h) * dv + jn;
  const float zn = writes_out ? to_f32(z[out_off]) : 0.0f;

  // 2. Prep. q and k channels (2·dkr of them, warp-uniform halves): conv, then Σx² per warp.
  for (int idx = tid; idx < 2 * dkr; idx += nthreads) {
    const bool is_k = idx >= dkr;
    const int i = is_k ? idx - dkr : idx;
    const float y = i < dk ? conv_one(qkv, p.conv_weight, cs, C, K, m, (is_k ? key_dim : 0) + kh * dk + i) : 0.0f;
    (is_k ? s_k : s_q)[i] = y;
    const float sq = warp_sum(__fmul_rn(y, y));
    if (lane == 0) s_part[is_k ? 1 : 0][i >> 5] = sq;
  }
  for (int idx = tid; idx < cw; idx += nthreads) {
    const int j = col0 + idx;
    s_v[idx] = j < dv ? conv_one(qkv, p.conv_weight, cs, C, K, m, 2 * key_dim + h * dv + j) : 0.0f;
  }
  if (tid == nthreads - 1) {
    const size_t g = size_t(m) * nv + h;
    gdn_gates(b[g], a[g], p.dt_bias[h], p.a_log[h], s_gate[0], s_gate[1]);
  }
  __syncthreads();
  stamps.mark(2);
  // The prep kernel's block has ceil(max(dk, dv)/32) warps; those past dk add +0.
  const int prep_warps = (max(dk, dv) + 31) / 32;
  float qq = s_part[0][0], kk = s_part[1][0];
  for (int g = 1; g < prep_warps; ++g) {
    qq = __fadd_rn(qq, g < W ? s_part[0][g] : 0.0f);
    kk = __fadd_rn(kk, g < W ? s_part[1][g] : 0.0f);
  }
  for (int i = tid; i < dkr; i += nthreads) {  // one pass (nthreads >= dkr), whole warps
    const float qn = l2norm_q(s_q[i], qq, dk);
    const float kn = l2norm_k(s_k[i], kk);
    s_q[i] = qn;
    s_k[i] = kn;
    const float qk = warp_sum(__fmul_rn(qn, kn));
    if (lane == 0) s_part[2][i >> 5] = qk;
  }
  __syncthreads();
  stamps.mark(3);
  float kq = s_part[2][0];
  for (int g = 1; g < prep_warps; ++g) kq = __fadd_rn(kq, g < W ? s_part[2][g] : 0.0f);
  const float decay = s_gate[0], beta = s_gate[1];

  // 3. The delta rule for the token (gdn_recurrent_kernel's arithmetic).
  float k[kRowsPerThread], q[kRowsPerThread], v[4];
  load_token_kqv<vec>(s_k, s_q, s_v + jl, i0, j0, dk, dv, k, q, v);
  float tk[4], tq[4];
  strip_sums(st, k, q, W, wr, wc, r, cg, s_red, tk, tq);
  float d[4], o[4];
  delta_terms(decay, beta, kq, v, tk, tq, d, o);
#pragma unroll
  for (int rr = 0; rr < kRowsPerThread; ++rr) {
    update_state_row(st[rr], k[rr], decay, d);
    store_state_row<vec>(S, i0 + rr, j0, dk, dv, st[rr]);
  }
  if (r == 0 && wr == 0) {
#pragma unroll
    for (int c = 0; c < 4; ++c) s_o[jl + c] = o[c];
  }

  // New conv state (the old one shifted by the token's row) of the cluster's channels: kh's q
  // and k, then the v channels of its G heads (contiguous), spread over the cluster's threads.
  // The first channel's new values are loaded now (the loads overlap the barrier), every
  // store waits for the barrier below.
  const int csize = G * parts, nch = 2 * dk + G * dv, cstride = csize * nthreads;
  auto conv_channel = [&](int idx) {
    return idx < dk ? kh * dk + idx : idx < 2 * dk ? key_dim + kh * dk + (idx - dk) : 2 * key_dim + kh * G * dv + (idx - 2 * dk);
  };
  auto load_shift = [&](int c, float (&nw)[kMaxConvK - 1]) {
    const float* st_c = cs + size_t(c) * (K - 1);
#pragma unroll
    for (int j = 0; j < kMaxConvK - 1; ++j)
      if (j < K - 1) nw[j] = j + 1 < K - 1 ? st_c[j + 1] : to_f32(qkv[size_t(m) * C + c]);
  };
  auto store_shift = [&](int c, const float (&nw)[kMaxConvK - 1]) {
    float* st_c = cs + size_t(c) * (K - 1);
#pragma unroll
    for (int j = 0; j < kMaxConvK - 1; ++j)
      if (j < K - 1) st_c[j] = nw[j];
  };
  const int idx0 = int(blockIdx.x) * nthreads + tid;
  float nw0[kMaxConvK - 1];
  if (idx0 < nch) load_shift(conv_channel(idx0), nw0);

  stamps.mark(4);
  // 4. Every CTA of the cluster has its o in shared memory and is past its conv-state reads.
  cluster_sync();
  stamps.mark(5);
  float inv = 0.0f;
  if (warp < ncw) {  // warp-uniform: the output warps, 32 columns each
    float oj[kMaxHeadDim / 32];  // columns lane, lane + 32, ...: all loads in flight at once
#pragma unroll
    for (int t = 0; t < kMaxHeadDim / 32; ++t) {
      const int j = lane + 32 * t;
      oj[t] = j < dv ? ld_cluster_f32(s_o + j % cw, unsigned(gi * parts + j / cw)) : 0.0f;
    }
    float ss = 0.0f;  // gated_norm_warp's order
#pragma unroll
    for (int t = 0; t < kMaxHeadDim / 32; ++t)
      if (lane + 32 * t < dv) ss = __fmaf_rn(oj[t], oj[t], ss);
    inv = gated_norm_inv(warp_sum(ss), dv, s.norm_eps);
  }
  cluster_arrive();  // this CTA's reads of the cluster's shared memory are done
  if (writes_out) out[out_off] = from_f32<T>(gated_norm_out(s_o[warp * 32 + lane], inv, wn, zn));
  if (idx0 < nch) store_shift(conv_channel(idx0), nw0);
  for (int idx = idx0 + cstride; idx < nch; idx += cstride) {  // more channels (shapes with few threads)
    float nw[kMaxConvK - 1];
    load_shift(conv_channel(idx), nw);
    store_shift(conv_channel(idx), nw);
  }
  stamps.mark(6);
  cluster_wait();  // no CTA exits (freeing its shared memory) before the cluster's reads of it
  stamps.mark(7);
  stamps.print("gdn_decode", 1, int(blockIdx.x), int(blockIdx.y), int(blockIdx.z));
}

}  // namespace

size_t gdn_workspace_bytes(const GdnShape& s, int max_tokens) {
  const size_t M = size_t(std::max(max_tokens, 0));
  const size_t floats = round_region(M * s.conv_dim()) + 2 * round_region(M * s.num_v_heads) +
                        round_region(M * s.num_k_heads) + round_region(M * s.value_dim());
  return floats * sizeof(float);
}

namespace {

int sm_count() { return current_device_sm_count(); }

enum class LaunchShape { Auto, Fused, Split };

// The decode kernel's split of a head: `parts` CTAs of ncw 32-column strips each, so that a
// cluster (the G = nv/nk heads of a key head, `parts` CTAs each) has at most 8 CTAs (the
// portable cluster size). 0 parts: the shape does not fit (G > 8 or more than kMaxThreads
// threads per CTA); the two-pass path runs it.
struct DecodeSplit {
  int parts = 0, ncw = 0, threads = 0;
};
DecodeSplit decode_split(const GdnShape& s) {
  const int G = s.num_v_heads / s.num_k_heads;
  if (G < 1 || G > 8) return {};
  const int W = (s.k_head_dim + kWarpRows - 1) / kWarpRows;
  const int strips = (s.v_head_dim + kWarpCols - 1) / kWarpCols;
  const int ncw = (strips + std::min(strips, 8 / G) - 1) / std::min(strips, 8 / G);
  const int parts = (strips + ncw - 1) / ncw;
  const int threads = 32 * W * ncw;
  if (threads > kMaxThreads) return {};
  return {parts, ncw, threads};
}

// One launch for a step whose sequences have one new token each (gdn_decode_kernel).
template <typename T>
void launch_gdn_decode(const T* qkv, const T* z, const float* b, const float* a, const GdnShape& s,
                       const GdnLayerParams& layer, const StepMeta& meta, const DecodeSplit& split, T* out,
                       cudaStream_t stream) {
  const int G = s.num_v_heads / s.num_k_heads;
  const bool vec = s.k_head_dim % 4 == 0 && s.v_head_dim % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(layer.recurrent_state) % 16 == 0;
  auto kernel = vec ? gdn_decode_kernel<T, true> : gdn_decode_kernel<T, false>;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(G * split.parts), unsigned(s.num_k_heads), unsigned(meta.num_seqs));
  cfg.blockDim = dim3(unsigned(split.threads));
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(G * split.parts);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  // A programmatic dependent of the previous kernel (pdl.cuh) when the grid is about one wave
  // (two CTAs of <= 256 threads fit an SM at 128 registers): batch 1-2 at the 122B shape.
  const long long ctas = (long long)G * split.parts * s.num_k_heads * meta.num_seqs;
  cfg.numAttrs = pdl_enabled() && ctas <= 2LL * sm_count() ? 2 : 1;
  MOESERVE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, qkv, z, b, a, s, layer, meta, split.parts, out));
}

// Whether a cluster of the decode kernel fits the device (a cluster's CTAs must be resident
// together on one GPC: 8 CTAs of 512 threads need 8 free SMs there). Asked once per
// (device, activation type, CTA size, cluster size); no stream work, so capture-safe.
template <typename T>
bool decode_cluster_fits(const GdnShape& s, const DecodeSplit& split) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int, int>, bool> known;
  int dev = 0;
  MOESERVE_CUDA_CHECK(cudaGetDevice(&dev));
  const int csize = s.num_v_heads / s.num_k_heads * split.parts;
  const auto key = std::make_tuple(dev, int(sizeof(T)), split.threads, csize);
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(csize), 1, 1);
  cfg.blockDim = dim3(unsigned(split.threads));
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(csize);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;  // the two variants (vec or not) have the same bounds; ask for the scalar one
  const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, gdn_decode_kernel<T, false>, &cfg);
  if (err != cudaSuccess) (void)cudaGetLastError();  // a refused query means: fall back
  const bool ok = err == cudaSuccess && clusters > 0;
  known.emplace(key, ok);
  return ok;
}

template <typename T>
void launch_gdn(const T* qkv, const T* z, const float* b, const float* a, const GdnShape& s,
                const GdnLayerParams& layer, const StepMeta& meta, void* workspace, size_t workspace_bytes, T* out,
                cudaStream_t stream, LaunchShape pick = LaunchShape::Auto, GdnKernels kernels = GdnKernels::Auto) {
  if (meta.num_tokens == 0) return;
  if (s.conv_kernel < 2 || s.conv_kernel > kMaxConvK)
    throw Error("gated_delta_net: conv kernel must be in [2, 8], got " + std::to_string(s.conv_kernel));
  if (s.num_k_heads <= 0 || s.num_v_heads % s.num_k_heads != 0)
    throw Error("gated_delta_net: value heads must be a multiple of key heads");
  if (s.k_head_dim < 1 || s.k_head_dim > kMaxHeadDim || s.v_head_dim < 1 || s.v_head_dim > kMaxHeadDim)
    throw Error("gated_delta_net: head dims must be in [1, 256], got dk " + std::to_string(s.k_head_dim) +
                ", dv " + std::to_string(s.v_head_dim));
  if (workspace_bytes < gdn_workspace_bytes(s, meta.num_tokens)) throw Error("gated_delta_net: workspace too small");
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) throw Error("gated_delta_net: workspace not 16-B aligned");
  const GdnWork w = carve(workspace, s, meta.num_tokens);
  const int M = meta.num_tokens;

  // Decode-like steps (one new token per sequence: sequences are never empty, so M equal to
  // the number of sequences means exactly that) whose grid is about one wave: one launch, the
  // same bits as below. Larger decode batches take the two-pass path, which the H200 ran faster
  // there (122B shape, batch 8: 30.5 vs 48.6 us; batch 1: 10.9 vs 8.7 us; docs/PERF.md run N).
  if (kernels != GdnKernels::TwoPass && M == meta.num_seqs) {
    const DecodeSplit split = decode_split(s);
    const long long ctas = (long long)(s.num_v_heads / s.num_k_heads) * split.parts * s.num_k_heads * meta.num_seqs;
    const bool one_wave = ctas <= 2LL * sm_count();
    if (split.parts > 0 && (one_wave || kernels == GdnKernels::Decode) && decode_cluster_fits<T>(s, split)) {
      launch_gdn_decode(qkv, z, b, a, s, layer, meta, split, out, stream);
      return;
    }
  }

  // Prep: one token per CTA for small steps (parallelism), 8 for prefill (input reuse).
  const int prep_threads = (std::max(s.k_head_dim, s.v_head_dim) + 31) / 32 * 32;
  const unsigned units = unsigned(s.num_k_heads + s.num_v_heads);
  if (M <= 64) {
    gdn_prep_kernel<T, 1><<<dim3(unsigned(M), units), prep_threads, 0, stream>>>(qkv, b, a, s, layer, meta, w);
  } else {
    const dim3 prep_grid(unsigned((M + kPrepTokens - 1) / kPrepTokens), units);
    gdn_prep_kernel<T, kPrepTokens><<<prep_grid, prep_threads, 0, stream>>>(qkv, b, a, s, layer, meta, w);
  }
  MOESERVE_CUDA_CHECK_LAUNCH();

  const int W = (s.k_head_dim + kWarpRows - 1) / kWarpRows;     // row warps per column strip (<= 8)
  const int strips = (s.v_head_dim + kWarpCols - 1) / kWarpCols;  // 32-column strips per head (<= 8)
  // Fused (one CTA per head, no norm launch) when the step is decode-like, a whole head fits
  // one CTA and the (sequence, head) grid fills at most one wave of those large CTAs (small
  // decode batches); otherwise column strips: more, smaller CTAs that overlap their state
  // loads (larger batches) or spread one long prefill over the GPU. Both shapes compute the
  // same bits, so this choice only moves time.
  const bool fits = 32 * W * strips <= kMaxThreads;
  const bool fused = pick == LaunchShape::Fused  ? fits
                     : pick == LaunchShape::Split ? false
                                                  : fits && M <= 4 * meta.num_seqs &&
                                                        (long long)meta.num_seqs * s.num_v_heads <= sm_count();
  const int ncw = fused ? strips : 1;
  const int threads = 32 * W * ncw;
  const Stage sg{(s.k_head_dim + 3) / 4 * 4, ncw * kWarpCols};
  const size_t smem = (size_t(2) * sg.floats() + size_t(2) * ncw * W * kColGroups * 8) * sizeof(float);
  if (smem > 48 * 1024) throw Error("gated_delta_net: recurrence needs more than 48 KB of shared memory");
  const bool vec = s.k_head_dim % 4 == 0 && s.v_head_dim % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(layer.recurrent_state) % 16 == 0;
  const dim3 grid(unsigned(fused ? 1 : strips), unsigned(s.num_v_heads), unsigned(meta.num_seqs));
  auto kernel = fused ? (vec ? gdn_recurrent_kernel<T, true, true> : gdn_recurrent_kernel<T, true, false>)
                      : (vec ? gdn_recurrent_kernel<T, false, true> : gdn_recurrent_kernel<T, false, false>);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;  // a programmatic dependent of the prep kernel (pdl.cuh)
  MOESERVE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, qkv, z, s, layer, meta, w, out));
  if (!fused) {
    const long long norm_warps = (long long)M * s.num_v_heads;
    const unsigned norm_blocks = unsigned((norm_warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
    gdn_norm_kernel<T><<<norm_blocks, kWarpsPerBlock * 32, 0, stream>>>(w.core, z, s, layer.norm_weight, M, out);
    MOESERVE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void gated_delta_net(const bf16* qkv, const bf16* z, const float* b, const float* a, const GdnShape& s,
                     const GdnLayerParams& layer, const StepMeta& meta, void* workspace, size_t workspace_bytes,
                     bf16* out, cudaStream_t stream) {
  launch_gdn(qkv, z, b, a, s, layer, meta, workspace, workspace_bytes, out, stream);
}

void gated_delta_net(const float* qkv, const float* z, const float* b, const float* a, const GdnShape& s,
                     const GdnLayerParams& layer, const StepMeta& meta, void* workspace, size_t workspace_bytes,
                     float* out, cudaStream_t stream) {
  launch_gdn(qkv, z, b, a, s, layer, meta, workspace, workspace_bytes, out, stream);
}

void gated_delta_net(const bf16* qkv, const bf16* z, const float* b, const float* a, const GdnShape& s,
                     const GdnLayerParams& layer, const StepMeta& meta, void* workspace, size_t workspace_bytes,
                     bf16* out, cudaStream_t stream, GdnKernels kernels) {
  launch_gdn(qkv, z, b, a, s, layer, meta, workspace, workspace_bytes, out, stream, LaunchShape::Auto, kernels);
}

void gated_delta_net(const float* qkv, const float* z, const float* b, const float* a, const GdnShape& s,
                     const GdnLayerParams& layer, const StepMeta& meta, void* workspace, size_t workspace_bytes,
                     float* out, cudaStream_t stream, GdnKernels kernels) {
  launch_gdn(qkv, z, b, a, s, layer, meta, workspace, workspace_bytes, out, stream, LaunchShape::Auto, kernels);
}

bool gdn_decode_kernel_supported(const GdnShape& s) {
  return s.num_k_heads > 0 && s.num_v_heads % s.num_k_heads == 0 && s.k_head_dim >= 1 &&
         s.k_head_dim <= kMaxHeadDim && s.v_head_dim >= 1 && s.v_head_dim <= kMaxHeadDim &&
         s.conv_kernel >= 2 && s.conv_kernel <= kMaxConvK && decode_split(s).parts > 0 &&
         decode_cluster_fits<float>(s, decode_split(s));
}

}  // namespace moeserve::cuda
