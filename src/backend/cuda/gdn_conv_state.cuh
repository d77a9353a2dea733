// The causal-conv state update of a Gated DeltaNet prompt chunk, shared by the chunked state
// passes (ops_gdn_chunked.cu: CUDA cores; ops_gdn_chunked_state_tc.cu: tensor cores). Device code;
// include from .cu files only.
//
// Layout: conv state cs f32 [C][K−1] of one sequence (its last K−1 pre-conv inputs per channel),
// qkv f32 [M][C] (row t0 + i is the sequence's i-th new input). The new state of channel c is the
// last K−1 entries of [old state (K−1) | new rows (n)]; each channel's K−1 old values are read into
// registers before any is written, so the update is in place. Parallelisation: channels c = first,
// first + stride, ... (the caller spreads them over its threads and CTAs). Bytes: 2·(K−1)·4 B per
// channel read (state or qkv) and written, once.
#pragma once
#include <cstddef>

namespace moeserve::cuda {

template <int kMaxConvK>
__device__ __forceinline__ void roll_conv_state(float* cs, const float* __restrict__ qkv, int C, int K, int t0, int n,
                                                int first, int stride) {
  for (int c = first; c < C; c += stride) {
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

}  // namespace moeserve::cuda
