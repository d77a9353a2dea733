// The tensor-core attention kernel of generated tokens (ops_attention_decode_tc.cu), for
// paged_attention_generated's dispatch in ops_attention.cu, which owns the workspace layout and
// the merge kernel that folds the chunk partials this kernel leaves there.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/ops_attention.h"

namespace moeserve::cuda::detail {

// One launch: the tokens of `meta` (any mix of sequences, several tokens of one sequence included;
// at most kDecodeTcMaxTokens unless whole_range), q / gate / out pointing at the first of them.
constexpr int kDecodeTcMaxTokens = 64;

struct DecodeTcArgs {
  const float* q = nullptr;     // [M, nq·hd]
  const float* gate = nullptr;  // [M, nq·hd]
  float* out = nullptr;         // [M, nq·hd]: the tokens with one chunk (the others: the merge kernel)
  StepMeta meta;                // token_pos, token_seq, block_tables, max_blocks_per_seq, num_tokens
  KvCacheView cache;
  int nq = 0, nkv = 0, group = 0, head_blocks = 0;  // head blocks of 16 q heads per kv head
  float scale_log2 = 0.f;       // softmax scale · log2 e
  float* ws_acc = nullptr;      // [M][nq][chunk_stride][hd] unnormalised chunk outputs
  float* ws_ml = nullptr;       // [M][nq][chunk_stride][2] chunk (max, sum), exp2 domain
  int chunk_stride = 0;         // chunk slots per (token, q head); 1: no split (no workspace)
  // A CTA per (token, kv head, head block) walking all of the token's chunks and folding them in
  // order itself (no workspace, no merge, any number of tokens), instead of a CTA per chunk.
  bool whole_range = false;
};

// head_dim 64, 128 or 256 with a whole number of q heads per kv head.
bool attention_decode_tc_supported(const AttentionShape& shape);
// Upper bound of work items (token, chunk, kv head, head block) of a launch, for its grid.
void attention_decode_tc(const DecodeTcArgs& args, int head_dim, size_t max_items, cudaStream_t stream);
// Whether a launch of `tokens` tokens takes whole ranges: when its (token, kv head, head block)
// CTAs would fill at least half of the SMs (same bits either way).
bool attention_decode_tc_whole_ranges(int tokens, int kv_heads, int head_blocks);
// The shared-memory opt-in and the resident-CTA query for the current device (outside graph capture).
void attention_decode_tc_prepare();

}  // namespace moeserve::cuda::detail
