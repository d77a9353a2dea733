// Internals shared by the chunked Gated DeltaNet kernels (ops_gdn_chunked.cu: prep, the
// CUDA-core intra-chunk kernel and state pass, norm; ops_gdn_chunked_intra_tc.cu and
// ops_gdn_chunked_state_tc.cu: their tensor-core forms): the workspace regions, the chunk
// geometry (chunks at absolute positions), the 3xTF32 MMA helpers and the launches of the
// tensor-core kernels. Include from .cu files only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/ops_gdn.h"
#include "backend/cuda/step_meta.h"

namespace moeserve::cuda::gdn_chunked {

constexpr int kC = 64;      // chunk length (positions)
constexpr int kMaxD = 128;  // dk, dv limit

// Workspace regions (f32), each rounded up to 64 floats (256-B aligned). P = prompt rows.
struct Work {
  float* conv_out;  // [P][conv_dim]: q̂ | k̂ | v (v later overwritten by P U, then by O)
  float* g;         // [P][nv] log decay
  float* beta;      // [P][nv]
  float* gam;       // [P][nv] γ (cumulative g within the chunk)
  float* qt;        // [P][nv][dk] Q̃ = e^γ q̂ − P W
  float* w;         // [P][nv][dk] W
  float* u;         // [P][nv][dv] U
};

// Number of 64-position chunks that the slice [p0, p0 + n) touches.
__device__ __forceinline__ int num_chunks(int p0, int n) { return n <= 0 ? 0 : (p0 + n - 1) / kC - p0 / kC + 1; }

// Chunk q of the slice [p0, p0 + n): its offset in the slice and its length.
__device__ __forceinline__ void chunk_range(int p0, int n, int q, int& off, int& len) {
  const int start = q == 0 ? p0 : (p0 / kC + q) * kC;
  const int end = min(p0 + n, (p0 / kC + q + 1) * kC);
  off = start - p0;
  len = end - start;
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

// ---- 3xTF32 tensor-core products (mma.sync.m16n8k8 .tf32, sm_80+) ----------------------
// An f32 operand x is split into hi = tf32(x), lo = tf32(x − hi); three MMAs per k8 step
// (lo·hi, hi·lo, hi·hi) leave |error| <~ 3·2^-22 of Σ|a||b| (the lo·lo term and the residues
// x − hi − lo are dropped), close to f32 (a bf16 hi/lo split would leave ~2^-16).

// f32 -> tf32 (round to nearest, ties away), as the bit pattern of an f32 with 13 zero low bits.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
// hi = tf32(x), lo = tf32(x − hi) (x − hi is exact in f32).
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32(x);
  lo = to_tf32(__fsub_rn(x, __uint_as_float(hi)));
}

// c += a · b over one 16x8x8 TF32 step, f32 accumulate.
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A fragment of the 16x8 tile at (row m0, column k0) of a row-major f32 matrix X [.][ld], split:
// registers 0..3 = (m0+g, k0+q), (m0+g+8, k0+q), (m0+g, k0+q+4), (m0+g+8, k0+q+4), g = lane/4,
// q = lane%4 (PTX m16n8k8 .tf32 A layout).
struct FragA {
  uint32_t hi[4], lo[4];
};
__device__ __forceinline__ void load_a(FragA& f, const float* X, int ld, int m0, int k0, int lane) {
  const int g = lane >> 2, q = lane & 3;
  const float* p = X + (m0 + g) * ld + k0 + q;
  split_tf32(p[0], f.hi[0], f.lo[0]);
  split_tf32(p[8 * ld], f.hi[1], f.lo[1]);
  split_tf32(p[4], f.hi[2], f.lo[2]);
  split_tf32(p[8 * ld + 4], f.hi[3], f.lo[3]);
}
// B fragment (k 8 × n 8) at (k0, n0): registers 0, 1 = B(k0+q, n0+g), B(k0+q+4, n0+g).
// From an [n][k] matrix (B = Xᵀ, e.g. K̂ for K̂ᵀ) or from a [k][n] matrix.
struct FragB {
  uint32_t hi[2], lo[2];
};
__device__ __forceinline__ void load_b_nk(FragB& f, const float* X, int ld, int k0, int n0, int lane) {
  const float* p = X + (n0 + (lane >> 2)) * ld + k0 + (lane & 3);
  split_tf32(p[0], f.hi[0], f.lo[0]);
  split_tf32(p[4], f.hi[1], f.lo[1]);
}
__device__ __forceinline__ void load_b_kn(FragB& f, const float* X, int ld, int k0, int n0, int lane) {
  const float* p = X + (k0 + (lane & 3)) * ld + n0 + (lane >> 2);
  split_tf32(p[0], f.hi[0], f.lo[0]);
  split_tf32(p[4 * ld], f.hi[1], f.lo[1]);
}
// c += a · b with the split operands: lo·hi, hi·lo, then hi·hi (small terms first).
__device__ __forceinline__ void mma3(float (&c)[4], const FragA& a, const FragB& b) {
  mma_tf32(c, a.lo, b.hi[0], b.hi[1]);
  mma_tf32(c, a.hi, b.lo[0], b.lo[1]);
  mma_tf32(c, a.hi, b.hi[0], b.hi[1]);
}

// A fragment of the transpose: the 16x8 tile at (m0, k0) of Xᵀ, X row-major [k][m] (e.g.
// K̂ᵀ from K̂ [t][i]): registers X[k0+q][m0+g], X[k0+q][m0+g+8], X[k0+q+4][m0+g], X[k0+q+4][m0+g+8].
__device__ __forceinline__ void load_a_t(FragA& f, const float* X, int ld, int m0, int k0, int lane) {
  const float* p = X + (k0 + (lane & 3)) * ld + m0 + (lane >> 2);
  split_tf32(p[0], f.hi[0], f.lo[0]);
  split_tf32(p[8], f.hi[1], f.lo[1]);
  split_tf32(p[4 * ld], f.hi[2], f.lo[2]);
  split_tf32(p[4 * ld + 8], f.hi[3], f.lo[3]);
}

// The tensor-core intra-chunk kernel (ops_gdn_chunked_intra_tc.cu): shared memory bytes at the
// largest supported shape (for the opt-in), the opt-in itself, and the launch over
// (chunk_bound, nv) CTAs (surplus chunk indices exit).
size_t intra_tc_smem_bytes_max();
void intra_tc_prepare();
void launch_intra_tc(const GdnShape& s, const StepMeta& meta, int first_seq, int first_row, const Work& w,
                     unsigned chunk_bound, cudaStream_t stream);

// The tensor-core state pass (ops_gdn_chunked_state_tc.cu), likewise; grid (sequences, nv,
// dv/32) as the CUDA-core pass.
size_t state_tc_smem_bytes_max();
void state_tc_prepare();
void launch_state_tc(const float* qkv, const GdnShape& s, const GdnLayerParams& layer, const StepMeta& meta,
                     int first_seq, int first_row, const Work& w, cudaStream_t stream);

}  // namespace moeserve::cuda::gdn_chunked
