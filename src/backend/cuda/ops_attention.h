// Gated full attention on the GPU (spec 2.3, 2.4) over the paged bf16 KV cache.
//   attention_prepare: splits q_proj's per-head [query | gate] output, applies the (1+w)
//     q/k RMSNorms and partial NeoX RoPE, and writes K and V of the new tokens into the cache.
//   paged_attention: causal softmax attention of every new token over its sequence's cache
//     (positions <= its own), GQA (q head h reads kv head h / (nq/nkv)), fp32 softmax, then
//     out = o * sigmoid(gate). Works for decode (1 token per sequence), prefill chunks and
//     verify batches in one launch; long contexts are split over the KV length. A token's
//     output bits depend only on its own position and data, never on the rest of the step.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/step_meta.h"

namespace moeserve::cuda {

using bf16 = __nv_bfloat16;

struct KvCacheView {
  bf16* k = nullptr;  // [num_blocks][nkv][block_size][head_dim]
  bf16* v = nullptr;  // same
  int num_blocks = 0;
  int num_kv_heads = 0;
  int block_size = 16;
  int head_dim = 0;
};

struct AttentionShape {
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int rotary_dim = 0;
  float rms_eps = 1e-6f;
};

// qg: bf16 [M, nq·2·hd] (q_proj output); k, v: bf16 [M, nkv·hd].
// q_out: bf16 [M, nq·hd] normalised + rotated queries; gate_out: bf16 [M, nq·hd].
// inv_freq: f32 [rotary_dim/2]; q_norm_w, k_norm_w: f32 [hd] ((1+w) form).
void attention_prepare(const bf16* qg, const bf16* k, const bf16* v, const float* q_norm_w, const float* k_norm_w,
                       const float* inv_freq, const AttentionShape& shape, const StepMeta& meta, KvCacheView cache,
                       bf16* q_out, bf16* gate_out, cudaStream_t stream);
// The same with f32 activations (the model's path; the cache stays bf16).
void attention_prepare(const float* qg, const float* k, const float* v, const float* q_norm_w, const float* k_norm_w,
                       const float* inv_freq, const AttentionShape& shape, const StepMeta& meta, KvCacheView cache,
                       float* q_out, float* gate_out, cudaStream_t stream);

// Scratch for split-KV partial results, sized once for the largest step: steps of at most
// 64 tokens spread each query's KV chunks over several CTAs and keep one partial per
// (token, q head, chunk) here: min(max_tokens, 64) · nq · min(64, ceil(max_context / 64)) ·
// (head_dim + 2) floats (0 when max_context <= 64). A smaller or null workspace only turns
// the split off (and decode steps then take the tile kernel); the results are the same bits
// either way.
// Also does the decode kernels' one-time set-up for the current device (a shared-memory opt-in):
// call it before the first step is captured into a CUDA graph, as the model does.
size_t paged_attention_workspace_bytes(const AttentionShape& shape, int max_tokens, int max_context);

// out: bf16 [M, nq·hd] = softmax(q·Kᵀ/sqrt(hd)) V ⊙ sigmoid(gate). Decode steps (one token
// per sequence) of at most 8 tokens run the tile-parallel decode kernel (a CTA per (token, KV
// chunk, kv head, 4 q heads), the chunk's tiles side by side; its last CTA per (token, kv head,
// head block) folds the chunk partials: one launch); those of 9 to 64 tokens the work-item
// decode kernel (a CTA per (token, KV chunk, kv head, head block)) and a merge kernel. All are
// programmatic dependent launches (the decode kernels read `meta` before they wait for the
// stream's previous kernel: the step metadata must come from a host copy, as the model's
// does, not from that kernel). The tile-parallel kernel's fold counts live in a per-device
// array: its launches on one device must not run concurrently (one stream per device, as the
// model runs). Other steps run the tile kernel and, when split, the merge kernel. Same bits
// for a token in every case.
void paged_attention(const bf16* q, const bf16* gate, const AttentionShape& shape, const StepMeta& meta,
                     KvCacheView cache, float scale, void* workspace, size_t workspace_bytes, bf16* out,
                     cudaStream_t stream);
void paged_attention(const float* q, const float* gate, const AttentionShape& shape, const StepMeta& meta,
                     KvCacheView cache, float scale, void* workspace, size_t workspace_bytes, float* out,
                     cudaStream_t stream);

// Generated tokens' attention (the model's entry point for every generated token: decode steps of
// any size and verify batches). tensor_cores = false: paged_attention. true: the tensor-core decode
// kernel (ops_attention_decode_tc.cu) where paged_attention_generated_tc_supported (head_dim 64, 128
// or 256), else paged_attention: the 16 q heads of a kv head as one m16 MMA tile, q and P split bf16
// hi + lo; steps whose (token, kv head, 16 q heads) triples fill half the SMs take a CTA per triple
// walking the whole range (one launch, no workspace), smaller ones a CTA per KV chunk and the merge
// kernel, in launches of at most 64 tokens (or what the workspace holds). Same math,
// other bits than paged_attention; a token's bits depend only on its position and data (alone, in
// any batch, in a verify batch, in any launch group). q, gate and out 16-byte aligned. Split queries
// (contexts past 64 positions) need paged_attention_workspace_bytes of workspace for at least one
// token (throws otherwise); that call also does the kernel's one-time set-up outside graph capture.
void paged_attention_generated(const float* q, const float* gate, const AttentionShape& shape, const StepMeta& meta,
                               KvCacheView cache, float scale, bool tensor_cores, void* workspace,
                               size_t workspace_bytes, float* out, cudaStream_t stream);
bool paged_attention_generated_tc_supported(const AttentionShape& shape);
// attention_prepare and paged_attention_generated (CUDA cores) in one launch, where the step's decode
// attention takes the tile-parallel kernel (decode steps of 1-2 tokens by default; head dims of 8·2^k,
// cache blocks of 2^k positions) and folds its chunks itself: that kernel normalises and rotates each
// item's q heads, and in each token's last chunk its own K row, with attention_prepare's device function
// (the same bits), writes the new K / V rows to the cache, and reads the gate from qg. Returns false,
// having done nothing, where it does not serve the step (the caller runs the two calls).
bool paged_attention_generated_prepared(const float* qg, const float* k, const float* v, const float* q_norm_w,
                                        const float* k_norm_w, const float* inv_freq, const AttentionShape& shape,
                                        const StepMeta& meta, KvCacheView cache, float scale, void* workspace,
                                        size_t workspace_bytes, float* out, cudaStream_t stream);

// Which kernel runs decode steps (one token per sequence) of at most 64 tokens; a process-wide
// switch for A/B measurements: every choice gives the same bits. 1 (the default): steps of at
// most 2 tokens take the tile-parallel kernel (a CTA per (token, KV chunk, kv head, block of 4
// q heads) computes a chunk's tiles side by side), larger ones the work-item kernel; 2: the
// tile-parallel kernel for steps of at most 8 tokens; 0: the work-item kernel for all of them.
// Throws on other values. The tile-parallel kernel folds chunk partials through per-device
// arrival counts: its launches on one device must not overlap (one decoding stream per GPU).
void set_attention_decode_variant(int variant);
int attention_decode_variant();
// Rounds of K/V the tile-parallel decode kernel keeps in shared memory, process-wide, for A/B
// measurements (the same bits either way): 2 (the default) copies the CTA's next round (of its
// item or of its next item) while it computes this one, where two rounds fit the device's shared
// memory (the H200; the DGX Spark's 99 KB per block holds one); 1 copies each round after the last
// one is used. Throws on other values. Read at launch time (a captured graph keeps its value).
void set_attention_decode_stages(int stages);
int attention_decode_stages();

// Prompt-class tokens on tensor cores (ops_attention_mma.cu): paged_attention for the tokens of
// sequences [seq_begin, seq_end) only, which are rows row_begin .. row_begin + row_count of q /
// gate / out (the host knows both ranges). Same math as paged_attention (causal over the cache
// including the step's own tokens, which attention_prepare has already written; GQA; softmax in
// fp32; out = o * sigmoid(gate)), different bits: q·Kᵀ and P·V on bf16 MMAs with f32 operands
// split hi + lo. A token's output bits depend only on its position and data (any M, any company,
// any chunking of the prompt). head_dim 64, 128 or 256; q, gate, out 16-byte aligned. The first
// call per device opts the kernel in to > 48 KB of shared memory: make it outside graph capture,
// or call paged_attention_prefill_prepare() first. q, gate and out point at the step's row 0.
// The workspace is not used (size 0); the parameters keep the door open for a KV split.
void paged_attention_prefill(const float* q, const float* gate, const AttentionShape& shape, const StepMeta& meta,
                             KvCacheView cache, float scale, int seq_begin, int seq_end, int row_begin, int row_count,
                             void* workspace, size_t workspace_bytes, float* out, cudaStream_t stream);
size_t paged_attention_prefill_workspace_bytes(const AttentionShape& shape, int max_tokens, int max_context);
// Whether paged_attention_prefill takes this shape (head_dim 64, 128 or 256; nq a multiple of
// nkv); callers fall back to paged_attention for the others.
bool paged_attention_prefill_supported(const AttentionShape& shape);
// Does the first-call set-up (the shared-memory opt-ins) for the current device now, so that a
// later first call may happen inside CUDA-graph capture.
void paged_attention_prefill_prepare();
// Which tensor-core kernel runs paged_attention_prefill; a process-wide switch for A/B
// measurements: both give the same bits. 1 (the default): the wide kernel (8 warps, 128 rows per
// CTA, double-buffered K / V; ops_attention_mma_wide.cu) where its shared memory fits the device
// (hd 256 needs 192 KB: not on the DGX Spark), else the 4-warp kernel; 0: the 4-warp kernel
// (ops_attention_mma.cu). Throws on other values. Set it before graphs are captured.
void set_attention_prefill_variant(int variant);
int attention_prefill_variant();

}  // namespace moeserve::cuda
