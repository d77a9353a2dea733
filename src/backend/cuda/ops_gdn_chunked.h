// Gated DeltaNet for PROMPT tokens with the chunked (WY) form of the delta rule (spec 2.5 item
// 8, chunk C = 64): the same op as gated_delta_net (ops_gdn.h: conv + SiLU with the conv state,
// gates, l2norm, recurrence, gated RMSNorm, state updates in place), restricted to sequences
// [first_seq, meta.num_seqs) whose rows are [first_row, meta.num_tokens) of the step (rows
// before first_row belong to generated tokens and gated_delta_net; they are neither read nor
// written, nor are their sequences' states).
//
// Chunks sit at ABSOLUTE positions: chunk c of a sequence covers positions [64c, 64c + 64). A
// slice [p0, p1) of a sequence that starts or ends inside a chunk runs that partial chunk with
// the same chunk math on its L < 64 positions (the carried state already holds positions < p0).
// So when every cut between steps is a multiple of 64 positions, each chunk sees the same
// tokens and the same incoming state as in a one-pass prefill, and the outputs and the final
// states are bit-identical to it; nothing depends on the other sequences of the launch.
// The results differ from gated_delta_net's (sequential recurrence) by f32 rounding only.
//
// Supported (gated_delta_net_chunked_supported): dk and dv multiples of 32 up to 128, nv a
// multiple of nk, conv kernel 2..8. f32 activations (the model's path); qkv, z, out 16-B
// aligned, like the workspace.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "backend/cuda/ops_gdn.h"
#include "backend/cuda/step_meta.h"

namespace moeserve::cuda {

bool gated_delta_net_chunked_supported(const GdnShape& shape);

// The kernel variant (process-wide, for A/B benchmarks; set before any graph capture):
// 2 (default) tensor-core intra-chunk kernel and tensor-core state pass; 1 tensor-core
// intra-chunk kernel, CUDA-core state pass; 0 both on CUDA cores (the previous kernels). The
// tensor-core kernels (ops_gdn_chunked_intra_tc.cu, ops_gdn_chunked_state_tc.cu) use 3xTF32
// products (f32 operands split into tf32 hi + lo); the variants differ by f32-level rounding,
// not bit for bit; each is batch and chunk invariant. Throws on another value.
void set_gdn_chunked_variant(int variant);
int gdn_chunked_variant();

// Scratch for up to max_tokens prompt rows (f32, each region rounded up to 64 floats):
// max_tokens · (conv_dim + 3·nv + 2·nv·dk + nv·dv) floats.
size_t gated_delta_net_chunked_workspace_bytes(const GdnShape& shape, int max_tokens);

// Opts the kernels in to more than 48 KB of shared memory (at most 98 KB, under the 99 KB of
// sm_121) on the current device. The first call of gated_delta_net_chunked per device does it
// too; call this first when that call may happen inside CUDA-graph capture.
void gated_delta_net_chunked_prepare();

// qkv: f32 [M, conv_dim] (in_proj_qkv output, channels q | k | v); z: f32 [M, nv·dv];
// b, a: f32 [M, nv]; out: f32 [M, nv·dv]. All pointers are to the step's row 0; only rows
// [first_row, meta.num_tokens) are read or written. first_row must equal
// meta.seq_token_start[first_seq] (the host knows both). The workspace must hold
// gated_delta_net_chunked_workspace_bytes(shape, meta.num_tokens - first_row).
// z_ready: when given, the stream waits for this event before the gated norm, the only kernel
// that reads z (so that z can be computed on another stream while the scan runs).
// events (benchmarks only; null in the model): when given, ev[0] is recorded on the stream
// before the first kernel and ev[i] after kernel i (1 prep, 2 intra-chunk, 3 state pass,
// 4 gated norm), so that cudaEventElapsedTime(ev[i-1], ev[i]) times kernel i.
struct GdnChunkedEvents {
  cudaEvent_t ev[5];
};
void gated_delta_net_chunked(const float* qkv, const float* z, const float* b, const float* a, const GdnShape& shape,
                             const GdnLayerParams& layer, const StepMeta& meta, int first_seq, int first_row,
                             void* workspace, size_t workspace_bytes, float* out, cudaStream_t stream,
                             cudaEvent_t z_ready = nullptr, const GdnChunkedEvents* events = nullptr);

}  // namespace moeserve::cuda
