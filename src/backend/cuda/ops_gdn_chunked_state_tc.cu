// Tensor-core inter-chunk state pass of the chunked Gated DeltaNet (ops_gdn_chunked.h; notation
// and the CUDA-core chunk_state_kernel in ops_gdn_chunked.cu). Selected by
// set_gdn_chunked_variant(2) (default). The same pass and outputs (O over P U in conv_out's v
// columns, the new state, the new conv state) with its three products on tensor cores, 3xTF32
// (ops_gdn_chunked_internal.cuh: f32 operands split into tf32 hi + lo, three MMAs per k8 step):
//   X = W S, Y = Q̃ S           ([W ; Q̃] (128 × dk) · S (dk × 32) per chunk and CTA)
//   V'' = e^{γ_{L−1}−γ_t} (U − X),  O = Y + P U
//   S <- e^{γ_{L−1}} S + K̂ᵀ V''  (dk × 64 · 64 × 32)
// Results differ from the CUDA-core pass by f32-level rounding (other sum orders, ~2^-21
// relative product error); every order is fixed by the shape, so batch and chunk invariance
// hold as before.
//
// Grid (sequence, v-head, dv/32 column blocks of S) as the CUDA-core pass, 256 threads (8
// warps), two CTAs per SM on the H200 (<= 128 registers, 98 KB of shared memory; one on sm_121).
// Each chunk runs in nA + 1 stages (nA = ceil(dk/64)): stage k < nA multiplies columns
// [64k, 64k + 64) of W and Q̃ by rows [64k, 64k + 64) of S; stage nA updates S with K̂. Each
// stage's tiles are copied by cp.async into one of two buffers while the previous stage
// computes; one barrier per stage.
//   Products: warp w = rows 16(w%4).. of X (w < 4) or Y (w >= 4) × the 32 columns (4 n-tiles),
//   fragments in registers across the nA stages; U (X warps) or P U (Y warps) of the same
//   elements loaded at the chunk's start. At stage nA−1 the X warps write V'' (rows >= L zero)
//   to shared memory and the Y warps O to global memory.
//   Update: warp w = rows 16w.. of S (dk/16 warps; the others idle, warp-uniform) × 32
//   columns, S kept in f32 accumulator fragments across chunks and mirrored in shared memory
//   (the B operand of the products); u = K̂ᵀ V'' (k = t up to the chunk's length, rounded up
//   to 8; rows past L are zero), then S = e^{γ_{L−1}} S + u (one fma per element, as the
//   CUDA-core pass).
// Shared memory (floats): 2 stage buffers of max(2·64·68, 64·(dk + 8)) (W | Q̃ [64][68] each,
// row stride ≡ 4 mod 32 for the A fragment loads; or K̂ [64][dk + 8], ≡ 8 mod 32 for the
// transposed A loads) | S [dk][40] | V'' [64][40] (B operands [k][n], ≡ 8 mod 32): at dk = 128,
// 2·8704 + 128·40 + 64·40 = 25,088 floats = 98 KB.
// Work per (chunk, v-head, column block): 3·64·dk·32 MACs (786 K at dk = 128), ×3 on tensor
// cores; bytes per chunk and CTA (L2): 64·(3·dk + 2·32)·4 in, 64·32·4 out; the state once.
// The sequence's chain is T/64 dependent chunks per CTA, as before: the tensor cores shorten
// each link (fewer issue slots per MAC than f32 FMAs with their shared-memory loads).
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gdn_conv_state.cuh"
#include "backend/cuda/ops_gdn_chunked_internal.cuh"

namespace moeserve::cuda::gdn_chunked {
namespace {

constexpr int kSThreads = 256;
constexpr int kSBN = 32;        // columns of S per CTA
constexpr int kSAW = 64;        // dk columns of W and Q̃ per stage
constexpr int kSLdT = kSAW + 4;  // W, Q̃ stage tiles' row stride (≡ 4 mod 32)
constexpr int kSLdS = kSBN + 8;  // S and V'' row stride (≡ 8 mod 32)
constexpr int kMaxConvK = 8;

__host__ __device__ constexpr int stc_stage_floats(int dk) {
  const int a = 2 * kC * kSLdT, b = kC * (dk + 8);
  return a > b ? a : b;
}
__host__ __device__ constexpr int stc_smem_floats(int dk) { return 2 * stc_stage_floats(dk) + (dk + kC) * kSLdS; }
static_assert(stc_smem_floats(kMaxD) * sizeof(float) <= 99 * 1024, "sm_121 allows 99 KB per block");

__device__ __forceinline__ void cp_async16(float* dst, const float* src, bool src_ok) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__global__ void __launch_bounds__(kSThreads, 2) chunk_state_tc_kernel(const float* __restrict__ qkv, GdnShape s,
                                                                     GdnLayerParams p, StepMeta meta, int first_seq,
                                                                     int first_row, Work w) {
  extern __shared__ __align__(16) float smem[];
  const int seq = first_seq + blockIdx.x, h = blockIdx.y, c0 = blockIdx.z * kSBN;
  const int nk = s.num_k_heads, nv = s.num_v_heads, dk = s.k_head_dim, dv = s.v_head_dim;
  const int C = s.conv_dim(), K = s.conv_kernel, key_dim = s.key_dim();
  const int kh = h / (nv / nk), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int t0 = meta.seq_token_start[seq], n = meta.seq_token_start[seq + 1] - t0;
  const int p0 = meta.seq_start_pos[seq], slot = meta.seq_state_slot[seq];
  const int stage_f = stc_stage_floats(dk);
  float* Ssm = smem + 2 * stage_f;  // Ssm[i][j] = S[i][c0 + j]
  float* Vs = Ssm + dk * kSLdS;     // V''[t][j]

  // New conv state of the sequence (its last K−1 pre-conv inputs), spread over its CTAs (as
  // the CUDA-core pass; the prep kernel that read the old one has finished).
  {
    const int ctas = gridDim.y * gridDim.z, cta = blockIdx.y * gridDim.z + blockIdx.z;
    roll_conv_state<kMaxConvK>(p.conv_state + size_t(slot) * C * (K - 1), qkv, C, K, t0, n, cta * kSThreads + tid,
                               ctas * kSThreads);
  }

  // Roles. Products: role 0 (warps 0-3) X, role 1 (warps 4-7) Y, rows m0 + g (+8), columns
  // 8j + 2q (+1) of the 4 n-tiles. Update: rows 16·warp + g (+8) of S, same columns.
  const int role = warp >> 2, m0 = 16 * (warp & 3);
  const bool upd = 16 * warp < dk;
  float* S = p.recurrent_state + (size_t(slot) * nv + h) * size_t(dk) * dv;
  float sreg[4][4];  // S at (16·warp + g + 8(e/2), 8j + 2q + e%2)
  if (upd) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = 16 * warp + g + 8 * hh, c = 8 * j + 2 * q;
        const float2 v = *reinterpret_cast<const float2*>(S + size_t(i) * dv + c0 + c);
        sreg[j][2 * hh] = v.x;
        sreg[j][2 * hh + 1] = v.y;
        *reinterpret_cast<float2*>(Ssm + i * kSLdS + c) = v;
      }
  }

  const size_t vd = size_t(nv) * dv, wd = size_t(nv) * dk;
  const int nA = (dk + kSAW - 1) / kSAW;
  const int nstage = num_chunks(p0, n) * (nA + 1);
  const int ldk = dk + 8;

  // Issues the copies of stage gi into its buffer (rows >= L zero-filled) and commits them.
  auto issue = [&](int gi) {
    const int qc = gi / (nA + 1), k = gi % (nA + 1);
    int off, L;
    chunk_range(p0, n, qc, off, L);
    const int r0 = t0 + off - first_row;
    float* dst = smem + (gi & 1) * stage_f;
    if (k < nA) {
      const int i0 = k * kSAW, n4 = min(kSAW, dk - i0) / 4;
      for (int idx = tid; idx < 2 * kC * n4; idx += kSThreads) {
        const int m = idx / (kC * n4), rem = idx % (kC * n4), t = rem / n4, e = (rem % n4) * 4;
        const float* src = (m == 0 ? w.w : w.qt) + size_t(r0 + min(t, L - 1)) * wd + size_t(h) * dk + i0 + e;
        cp_async16(dst + m * kC * kSLdT + t * kSLdT + e, src, t < L);
      }
    } else {
      const int n4 = dk / 4;
      for (int idx = tid; idx < kC * n4; idx += kSThreads) {
        const int t = idx / n4, e = (idx % n4) * 4;
        const float* src = w.conv_out + size_t(r0 + min(t, L - 1)) * C + key_dim + kh * dk + e;
        cp_async16(dst + t * ldk + e, src, t < L);
      }
    }
    cp_async_commit();
  };

  if (nstage > 0) issue(0);
  float acc[4][4], pre[4][4];  // X or Y; U (role 0) or P U (role 1) at the same elements
  float gl = 0.0f, gt[2];      // γ_{L−1}; γ of rows m0 + g, m0 + g + 8 (role 0)
  for (int gi = 0; gi < nstage; ++gi) {
    const int qc = gi / (nA + 1), k = gi % (nA + 1);
    int off, L;
    chunk_range(p0, n, qc, off, L);
    const int r0 = t0 + off - first_row;  // workspace row of the chunk's first token
    if (k == 0) {  // the chunk's U / P U elements and γ, loaded while the stages run
      gl = w.gam[size_t(r0 + L - 1) * nv + h];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int t = m0 + g + 8 * hh;
        gt[hh] = role == 0 && t < L ? w.gam[size_t(r0 + t) * nv + h] : 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int c = c0 + 8 * j + 2 * q;
          float2 v = make_float2(0.f, 0.f);
          if (t < L) {
            const float* src = role == 0 ? w.u + size_t(r0 + t) * vd + size_t(h) * dv + c
                                         : w.conv_out + size_t(r0 + t) * C + 2 * key_dim + h * dv + c;
            v = *reinterpret_cast<const float2*>(src);
          }
          pre[j][2 * hh] = v.x;
          pre[j][2 * hh + 1] = v.y;
          acc[j][2 * hh] = acc[j][2 * hh + 1] = 0.0f;
        }
      }
    }
    cp_async_wait_all();
    __syncthreads();  // stage gi landed for every thread; stage gi−1 (the other buffer) fully read
    if (gi + 1 < nstage) issue(gi + 1);
    const float* buf = smem + (gi & 1) * stage_f;
    if (k < nA) {
      // acc += T[rows][i0 .. i0 + wa) · S[i0 .. i0 + wa)[cols], k8 steps in i order.
      const int i0 = k * kSAW, wa = min(kSAW, dk - i0);
      const float* T = buf + role * kC * kSLdT;
      for (int i = 0; i < wa; i += 8) {
        FragA a;
        load_a(a, T, kSLdT, m0, i, lane);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          FragB b;
          load_b_kn(b, Ssm, kSLdS, i0 + i, 8 * j, lane);
          mma3(acc[j], a, b);
        }
      }
      if (k == nA - 1) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int t = m0 + g + 8 * hh;
          if (role == 0) {
            // V'_t = U_t − X_t, stored scaled: V''_t = e^{γ_{L−1}−γ_t} V'_t (rows >= L zero).
            const float f = t < L ? expf(__fsub_rn(gl, gt[hh])) : 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j)
              *reinterpret_cast<float2*>(Vs + t * kSLdS + 8 * j + 2 * q) =
                  make_float2(__fmul_rn(__fsub_rn(pre[j][2 * hh], acc[j][2 * hh]), f),
                              __fmul_rn(__fsub_rn(pre[j][2 * hh + 1], acc[j][2 * hh + 1]), f));
          } else if (t < L) {
            // O_t = Q̃_t S + (P U)_t, written over P U (same thread).
#pragma unroll
            for (int j = 0; j < 4; ++j)
              *reinterpret_cast<float2*>(w.conv_out + size_t(r0 + t) * C + 2 * key_dim + h * dv + c0 + 8 * j +
                                         2 * q) = make_float2(__fadd_rn(acc[j][2 * hh], pre[j][2 * hh]),
                              __fadd_rn(acc[j][2 * hh + 1], pre[j][2 * hh + 1]));
          }
        }
      }
    } else if (upd) {
      // u = K̂ᵀ V'' (t order, k8 steps up to L rounded up; rows >= L are zero in both), then
      // S <- e^{γ_{L−1}} S + u.
      const float eL = expf(gl);
      float u[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) u[j][e] = 0.0f;
      for (int tt = 0; tt < L; tt += 8) {
        FragA a;
        load_a_t(a, buf, ldk, 16 * warp, tt, lane);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          FragB b;
          load_b_kn(b, Vs, kSLdS, tt, 8 * j, lane);
          mma3(u[j], a, b);
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sreg[j][e] = __fmaf_rn(eL, sreg[j][e], u[j][e]);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
          *reinterpret_cast<float2*>(Ssm + (16 * warp + g + 8 * hh) * kSLdS + 8 * j + 2 * q) =
              make_float2(sreg[j][2 * hh], sreg[j][2 * hh + 1]);
      }
    }
  }

  if (upd) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        *reinterpret_cast<float2*>(S + size_t(16 * warp + g + 8 * hh) * dv + c0 + 8 * j + 2 * q) =
            make_float2(sreg[j][2 * hh], sreg[j][2 * hh + 1]);
  }
}

}  // namespace

size_t state_tc_smem_bytes_max() { return size_t(stc_smem_floats(kMaxD)) * sizeof(float); }

void state_tc_prepare() {
  MOESERVE_CUDA_CHECK(cudaFuncSetAttribute(chunk_state_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(state_tc_smem_bytes_max())));
}

void launch_state_tc(const float* qkv, const GdnShape& s, const GdnLayerParams& layer, const StepMeta& meta,
                     int first_seq, int first_row, const Work& w, cudaStream_t stream) {
  const int S = meta.num_seqs - first_seq;
  const size_t smem = size_t(stc_smem_floats(s.k_head_dim)) * sizeof(float);
  chunk_state_tc_kernel<<<dim3(unsigned(S), unsigned(s.num_v_heads), unsigned(s.v_head_dim / kSBN)), kSThreads, smem,
                          stream>>>(qkv, s, layer, meta, first_seq, first_row, w);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda::gdn_chunked
