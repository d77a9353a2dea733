// Tensor-core intra-chunk kernel of the chunked Gated DeltaNet (ops_gdn_chunked.h; notation and
// the other kernels in ops_gdn_chunked.cu). Selected by set_gdn_chunked_variant(1) (default);
// variant 0 runs the CUDA-core chunk_intra_kernel. Same outputs (γ, U, W, Q̃, P U), computed as
//   T = (I + A)^{-1}        (unit lower triangular, f32 CUDA cores, 16-row blocks)
//   M = P T                 (lower triangular)
//   [U ; P U] = [T ; M] · diag(β) V,   [W ; P W] = [T ; M] · diag(β e^γ) K̂
//   Q̃ = e^γ q̂ − P W
// instead of a forward substitution per column. The products (K̂K̂ᵀ, Q̂K̂ᵀ, P T and the two
// stacked products) run on tensor cores as mma.sync.m16n8k8 TF32 with f32 operands split into
// hi = tf32(x), lo = tf32(x − hi) and three MMAs per k8 step (lo·hi, hi·lo, hi·hi; "3xTF32"):
// |x − hi − lo| <= 2^-22 |x|, so each product carries ~2^-21 relative error against Σ|a||b|,
// close to f32 (bf16 hi/lo would leave 2^-16). The results differ from variant 0 by f32-level
// rounding (other sum orders), not bit for bit; every order is fixed by the shape, so batch and
// chunk invariance hold as before.
//
// Grid (chunk bound, nv), 256 threads (8 warps), one CTA per (chunk, v-head): 4x the CTAs of
// variant 0 (which loops over the nv/nk v-heads of a k-head); K̂K̂ᵀ and Q̂K̂ᵀ are recomputed per
// v-head (cheap on tensor cores; K̂ and Q̂ come from L2 for the group's other CTAs).
// Shared memory (floats): R1, R2 of max(64·(dk+4), 2·64·68, 64·(max(dk,dv)+8)) each, then γ,
// β, e^γ, g [64]. Phases (barriers between):
//   1. K̂ -> R1 [64][dk+4], Q̂ -> R2 [64][dk+4] (rows >= L zero), g and β; thread 0 sums γ in t
//      order (the same fold as variant 0, so γ has the same bits) and e^γ.
//   2. K̂K̂ᵀ, Q̂K̂ᵀ: warp = 16 rows × 32 columns (4 n-tiles; tiles wholly above the diagonal
//      skipped), f32 fragments in registers; then A, P (decay, β, masks) -> R1 [64][68] each.
//   3. T in R2 [64][68]: block rows of 16 in order: (a) all 256 threads: R_tj = Σ_{s<16I}
//      A_ts T_sj (s order); (b) thread = column j: T_tj = δ_tj − R_tj − Σ_{16I<=s<t} A_ts T_sj
//      (s order, a chain of at most 15 FMAs per row).
//   4. M = P T -> R2 [64][68] after T (warp = 16 rows × 32 columns, k up to the diagonal).
//   5. B = diag(β) V -> R1 [64][dv+8]; [U ; P U] = [T ; M] B: warp w = rows 16w..16w+15 of
//      the stacked 128-row operand, 32 columns at a time, k up to the diagonal; U -> u,
//      P U -> conv_out's v columns of head h (read only by this CTA, in this phase's load).
//   6. B = diag(β e^γ) K̂ -> R1 [64][dk+8]; [W ; P W] the same way; W -> w, Q̃ -> qt.
// Row strides: A-operand tiles ≡ 4 (mod 32) floats (K̂, Q̂, A, P, T, M: the 8 × 4 fragment
// loads hit 32 banks), B tiles [k][n] ≡ 8 (mod 32) (B's 4 × 8 loads hit 32 banks); T and M are
// also read as [k][n] B operands in phase 4 (2-way conflicts there).
// Work per (chunk, v-head) at dk = dv = 128 (MACs; tensor MACs executed 3 times):
//   K̂K̂ᵀ + Q̂K̂ᵀ 2·64²·128 (20 of 32 tiles run: 0.66 M), P T ≤ 64³ (0.16 M run), stacked
//   products 2·128·64·128 (k up to the diagonal: 1.3 M run); T on CUDA cores ≈ 64³/6 = 44 K FMA.
//   ≈ 2.1 M tensor MACs × 3 ≈ 6.4 M MAC-equivalents per CTA.
// Bytes per CTA (f32): reads K̂, Q̂ (2·64·dk·4, L2 after the group's first CTA), V, K̂ again
// and q̂ (64·(dv + 2·dk)·4), g, β; writes U, P U, W, Q̃ (64·(2·dv + 2·dk)·4) and γ: per token
// and layer nv·(2·dv + 2·dk)·4 written, the same as variant 0.
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_gdn_chunked_internal.cuh"

namespace moeserve::cuda::gdn_chunked {
namespace {

constexpr int kTcThreads = 256;
constexpr int kLdM = kC + 4;  // row stride of A, P, T, M (≡ 4 mod 32)

__host__ __device__ constexpr int tc_region_floats(int dk, int dv) {
  const int a = kC * (dk + 4), b = 2 * kC * kLdM, c = kC * ((dk > dv ? dk : dv) + 8);
  return a > b ? (a > c ? a : c) : (b > c ? b : c);
}
__host__ __device__ constexpr int tc_smem_floats(int dk, int dv) { return 2 * tc_region_floats(dk, dv) + 4 * kC; }
static_assert(tc_smem_floats(kMaxD, kMaxD) * sizeof(float) <= 99 * 1024, "sm_121 allows 99 KB per block");

// [X ; Y] · B for the 8 warps: warp w owns rows 16(w%4).. of X (w < 4) or Y (w >= 4), both
// [64][kLdM] and lower triangular (k runs to the tile's diagonal only: entries past it are
// zero), times B [64][ldb] ([k][n]), ncols columns in groups of 32. store(is_y, row, col, v0,
// v1) receives the pairs (row, col), (row, col + 1).
template <class Store>
__device__ __forceinline__ void stacked_product(const float* X, const float* Y, const float* B, int ldb, int ncols,
                                                int warp, int lane, Store store) {
  const bool is_y = warp >= 4;
  const float* src = is_y ? Y : X;
  const int m0 = 16 * (warp & 3), kend = m0 + 16;
  const int g = lane >> 2, q = lane & 3;
  for (int n0 = 0; n0 < ncols; n0 += 32) {
    float acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    for (int k0 = 0; k0 < kend; k0 += 8) {
      FragA a;
      load_a(a, src, kLdM, m0, k0, lane);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        FragB b;
        load_b_kn(b, B, ldb, k0, n0 + 8 * j, lane);
        mma3(acc[j], a, b);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = n0 + 8 * j + 2 * q;
      store(is_y, m0 + g, col, acc[j][0], acc[j][1]);
      store(is_y, m0 + g + 8, col, acc[j][2], acc[j][3]);
    }
  }
}

__global__ void __launch_bounds__(kTcThreads) chunk_intra_tc_kernel(GdnShape s, StepMeta meta, int first_seq,
                                                                   int first_row, Work w) {
  extern __shared__ __align__(16) float smem[];
  int seq, row0, L;
  if (!find_chunk(meta, first_seq, blockIdx.x, seq, row0, L)) return;  // the whole CTA, before any barrier
  const int nv = s.num_v_heads, dk = s.k_head_dim, dv = s.v_head_dim;
  const int C = s.conv_dim(), key_dim = s.key_dim(), grp = nv / s.num_k_heads;
  const int h = blockIdx.y, kh = h / grp;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
  const int r0 = row0 - first_row;  // workspace row of the chunk's first token
  const int region = tc_region_floats(dk, dv), ldk = dk + 4;
  float* R1 = smem;
  float* R2 = smem + region;
  float* gs = R2 + region;  // γ
  float* bs = gs + kC;      // β
  float* eg = bs + kC;      // e^γ
  float* graw = eg + kC;    // g
  const size_t crow = size_t(r0) * C;  // conv_out offset of the chunk's first row

  // 1. K̂ -> R1, Q̂ -> R2 (rows >= L zero), g and β.
  {
    const int nq4 = dk / 4;
    for (int idx = tid; idx < kC * nq4; idx += kTcThreads) {
      const int t = idx / nq4, e = (idx % nq4) * 4;
      float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), qv = kv;
      if (t < L) {
        const float* row = w.conv_out + crow + size_t(t) * C;
        kv = *reinterpret_cast<const float4*>(row + key_dim + kh * dk + e);
        qv = *reinterpret_cast<const float4*>(row + kh * dk + e);
      }
      *reinterpret_cast<float4*>(R1 + t * ldk + e) = kv;
      *reinterpret_cast<float4*>(R2 + t * ldk + e) = qv;
    }
    if (tid < kC) {
      graw[tid] = tid < L ? w.g[size_t(r0 + tid) * nv + h] : 0.0f;
      bs[tid] = tid < L ? w.beta[size_t(r0 + tid) * nv + h] : 0.0f;
    }
  }
  __syncthreads();
  if (tid == 0) {  // γ in token order (rows >= L add g = 0), as variant 0
    float acc = 0.0f;
    for (int t = 0; t < kC; ++t) {
      acc = __fadd_rn(acc, graw[t]);
      gs[t] = acc;
      eg[t] = expf(acc);
    }
  }

  // 2. K̂K̂ᵀ and Q̂K̂ᵀ: warp = rows 16·(warp%4).., columns 32·(warp/4).. (4 n-tiles of 8).
  const int gm0 = 16 * (warp & 3), gn0 = 32 * (warp >> 2);
  float kk[4][4], qk[4][4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) kk[j][e] = qk[j][e] = 0.0f;
  for (int k0 = 0; k0 < dk; k0 += 8) {
    FragA ak, aq;
    load_a(ak, R1, ldk, gm0, k0, lane);
    load_a(aq, R2, ldk, gm0, k0, lane);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n0 = gn0 + 8 * j;
      if (n0 > gm0 + 15) continue;  // the tile lies above the diagonal (s > t): masked to zero below
      FragB b;
      load_b_nk(b, R1, ldk, k0, n0, lane);
      mma3(kk[j], ak, b);
      mma3(qk[j], aq, b);
    }
  }
  __syncthreads();  // K̂, Q̂ fully read (R1, R2 are reused); γ, e^γ visible

  // A_ts = β_t K̂K̂ᵀ_ts e^{γ_t−γ_s} (s < t), P_ts = Q̂K̂ᵀ_ts e^{γ_t−γ_s} (s <= t); rows >= L zero.
  float* As = R1;
  float* Ps = R1 + kC * kLdM;
  float* Ts = R2;
  float* Ms = R2 + kC * kLdM;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int t = gm0 + g + 8 * (e >> 1), sc = gn0 + 8 * j + 2 * q + (e & 1);
      const float dec = (sc <= t && t < L) ? expf(__fsub_rn(gs[t], gs[sc])) : 0.0f;
      As[t * kLdM + sc] = (sc < t && t < L) ? __fmul_rn(__fmul_rn(bs[t], kk[j][e]), dec) : 0.0f;
      Ps[t * kLdM + sc] = (sc <= t && t < L) ? __fmul_rn(qk[j][e], dec) : 0.0f;
    }
  __syncthreads();

  // 3. T = (I + A)^{-1}, block rows of 16: T_t = e_t − Σ_{s<t} A_ts T_s.
  for (int I = 0; I < 4; ++I) {
    {  // (a) R_tj = Σ_{s<16I} A_ts T_sj (s order) for the block's rows, into T (exact zeros at I = 0)
      const int t = 16 * I + (tid >> 4), jj = tid & 15;
      float r[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int s0 = 0; s0 < 16 * I; ++s0) {
        const float a = As[t * kLdM + s0];
#pragma unroll
        for (int x = 0; x < 4; ++x) r[x] = __fmaf_rn(a, Ts[s0 * kLdM + jj + 16 * x], r[x]);
      }
#pragma unroll
      for (int x = 0; x < 4; ++x) Ts[t * kLdM + jj + 16 * x] = r[x];
    }
    __syncthreads();
    if (tid < kC) {  // (b) thread = column j; reads only its own column of T
      const int j = tid;
      for (int t = 16 * I; t < 16 * I + 16; ++t) {
        float acc = __fsub_rn(t == j ? 1.0f : 0.0f, Ts[t * kLdM + j]);
        for (int s0 = 16 * I; s0 < t; ++s0) acc = __fmaf_rn(-As[t * kLdM + s0], Ts[s0 * kLdM + j], acc);
        Ts[t * kLdM + j] = acc;
      }
    }
    __syncthreads();
  }

  // 4. M = P T (lower triangular: tiles above the diagonal are zero, k runs to the diagonal).
  {
    float acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    for (int k0 = 0; k0 < gm0 + 16; k0 += 8) {
      FragA a;
      load_a(a, Ps, kLdM, gm0, k0, lane);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n0 = gn0 + 8 * j;
        if (n0 > gm0 + 15 || n0 > k0 + 7) continue;  // T_sj = 0 for j > s: the step adds zeros
        FragB b;
        load_b_kn(b, Ts, kLdM, k0, n0, lane);
        mma3(acc[j], a, b);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = gn0 + 8 * j + 2 * q;
      *reinterpret_cast<float2*>(Ms + (gm0 + g) * kLdM + col) = make_float2(acc[j][0], acc[j][1]);
      *reinterpret_cast<float2*>(Ms + (gm0 + g + 8) * kLdM + col) = make_float2(acc[j][2], acc[j][3]);
    }
  }
  __syncthreads();  // M complete; A and P (R1) no longer read

  // 5. B = diag(β) V -> R1; [U ; P U] = [T ; M] B.
  const size_t vd = size_t(nv) * dv, wd = size_t(nv) * dk;
  {
    const int ldb = dv + 8, n4 = dv / 4;
    for (int idx = tid; idx < kC * n4; idx += kTcThreads) {
      const int t = idx / n4, e = (idx % n4) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (t < L) {
        v = *reinterpret_cast<const float4*>(w.conv_out + crow + size_t(t) * C + 2 * key_dim + h * dv + e);
        const float b = bs[t];
        v = make_float4(__fmul_rn(b, v.x), __fmul_rn(b, v.y), __fmul_rn(b, v.z), __fmul_rn(b, v.w));
      }
      *reinterpret_cast<float4*>(R1 + t * ldb + e) = v;
    }
    if (tid < L) w.gam[size_t(r0 + tid) * nv + h] = gs[tid];
    __syncthreads();  // B complete; every read of this head's v columns is done (P U goes over them)
    stacked_product(Ts, Ms, R1, ldb, dv, warp, lane, [&](bool is_pu, int t, int c, float v0, float v1) {
      if (t >= L) return;
      float* dst = is_pu ? w.conv_out + crow + size_t(t) * C + 2 * key_dim + h * dv + c
                         : w.u + size_t(r0 + t) * vd + size_t(h) * dv + c;
      *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
    });
  }
  __syncthreads();  // R1 (B) fully read

  // 6. B = diag(β e^γ) K̂ -> R1; [W ; P W] = [T ; M] B; Q̃ = e^γ q̂ − P W.
  {
    const int ldb = dk + 8, n4 = dk / 4;
    for (int idx = tid; idx < kC * n4; idx += kTcThreads) {
      const int t = idx / n4, e = (idx % n4) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (t < L) {
        v = *reinterpret_cast<const float4*>(w.conv_out + crow + size_t(t) * C + key_dim + kh * dk + e);
        const float f = __fmul_rn(bs[t], eg[t]);
        v = make_float4(__fmul_rn(f, v.x), __fmul_rn(f, v.y), __fmul_rn(f, v.z), __fmul_rn(f, v.w));
      }
      *reinterpret_cast<float4*>(R1 + t * ldb + e) = v;
    }
    __syncthreads();
    stacked_product(Ts, Ms, R1, ldb, dk, warp, lane, [&](bool is_pw, int t, int c, float v0, float v1) {
      if (t >= L) return;
      if (is_pw) {
        const float2 qv = *reinterpret_cast<const float2*>(w.conv_out + crow + size_t(t) * C + kh * dk + c);
        const float e = eg[t];
        *reinterpret_cast<float2*>(w.qt + size_t(r0 + t) * wd + size_t(h) * dk + c) =
            make_float2(__fsub_rn(__fmul_rn(e, qv.x), v0), __fsub_rn(__fmul_rn(e, qv.y), v1));
      } else {
        *reinterpret_cast<float2*>(w.w + size_t(r0 + t) * wd + size_t(h) * dk + c) = make_float2(v0, v1);
      }
    });
  }
}

}  // namespace

size_t intra_tc_smem_bytes_max() { return size_t(tc_smem_floats(kMaxD, kMaxD)) * sizeof(float); }

void intra_tc_prepare() {
  MOESERVE_CUDA_CHECK(cudaFuncSetAttribute(chunk_intra_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(intra_tc_smem_bytes_max())));
}

void launch_intra_tc(const GdnShape& s, const StepMeta& meta, int first_seq, int first_row, const Work& w,
                     unsigned chunk_bound, cudaStream_t stream) {
  const size_t smem = size_t(tc_smem_floats(s.k_head_dim, s.v_head_dim)) * sizeof(float);
  chunk_intra_tc_kernel<<<dim3(chunk_bound, unsigned(s.num_v_heads)), kTcThreads, smem, stream>>>(s, meta, first_seq,
                                                                                                 first_row, w);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda::gdn_chunked
