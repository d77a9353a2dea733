// The split-KV chunking of a generated token's attention range (batch invariance, ops_attention.cu's
// file comment): a query at position p sees [0, p], cut into chunks of chunk_size(p + 1) positions
// (kChunk0, doubled while there would be more than kMaxChunks chunks), chunk c = [c·C, (c+1)·C).
// A function of the position alone, shared by the CUDA-core decode kernels, the tensor-core decode
// kernel (ops_attention_decode_tc.cu) and the merge kernel that folds their chunk partials, which
// therefore agree on the workspace slots. Device and host code; include from .cu files only.
#pragma once

namespace moeserve::cuda::attn_chunks {

constexpr int kChunk0 = 64;     // smallest chunk (a multiple of every kernel's tile: 16 and 32 positions)
constexpr int kMaxChunks = 64;  // chunks per query at most; the chunk size doubles beyond

// Chunk size of a query whose visible range has len = pos + 1 positions. Powers of two times
// kChunk0, so a smaller chunk size always divides a larger one.
__host__ __device__ __forceinline__ int chunk_size(int len) {
  int c = kChunk0;
  // (len - 1) / c + 1 > kMaxChunks, without a division
  while ((long long)(len - 1) >= (long long)kMaxChunks * c) c <<= 1;
  return c;
}

// Chunks of the range [0, pos] (on the device a shift: the chunk size is a power of two).
__host__ __device__ __forceinline__ int num_chunks(int pos) {
#if defined(__CUDA_ARCH__)
  return (pos >> (__ffs(chunk_size(pos + 1)) - 1)) + 1;
#else
  return pos / chunk_size(pos + 1) + 1;
#endif
}

}  // namespace moeserve::cuda::attn_chunks
