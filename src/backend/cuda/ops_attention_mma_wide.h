// The wide tensor-core prefill attention kernel (ops_attention_mma_wide.cu): internal interface
// for paged_attention_prefill's dispatch (ops_attention_mma.cu). Same arguments and the same bits
// as the 4-warp kernel there; see the .cu's header for the layout.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/ops_attention.h"

namespace moeserve::cuda::detail {

// Whether the wide kernel for this head_dim (64, 128, 256) fits the current device's per-block
// shared-memory opt-in limit (hd 256 needs 192 KB: the H200 yes, the DGX Spark no).
bool attention_prefill_wide_fits(int head_dim);
// The shared-memory opt-in of every head_dim that fits, for the current device.
void attention_prefill_wide_prepare();
// paged_attention_prefill on the wide kernel; the caller has validated the arguments and checked
// attention_prefill_wide_fits.
void attention_prefill_wide(const float* q, const float* gate, const AttentionShape& shape, const StepMeta& meta,
                            const KvCacheView& cache, float scale, int seq_begin, int seq_end, int row_begin,
                            int row_count, float* out, cudaStream_t stream);

}  // namespace moeserve::cuda::detail
