// Internals shared by the chunked Gated DeltaNet kernels (ops_gdn_chunked.cu: prep, the
// CUDA-core intra-chunk kernel, state pass, norm; ops_gdn_chunked_intra_tc.cu: the tensor-core
// intra-chunk kernel): the workspace regions, the chunk geometry (chunks at absolute positions)
// and the launch of the tensor-core intra kernel. Include from .cu files only.
#pragma once
#include <cuda_runtime.h>

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

// The tensor-core intra-chunk kernel (ops_gdn_chunked_intra_tc.cu): shared memory bytes at the
// largest supported shape (for the opt-in), the opt-in itself, and the launch over
// (chunk_bound, nv) CTAs (surplus chunk indices exit).
size_t intra_tc_smem_bytes_max();
void intra_tc_prepare();
void launch_intra_tc(const GdnShape& s, const StepMeta& meta, int first_seq, int first_row, const Work& w,
                     unsigned chunk_bound, cudaStream_t stream);

}  // namespace moeserve::cuda::gdn_chunked
