// Per-step metadata on the device: which sequence each token belongs to, positions, block
// tables and state slots. Built on the host (run_substep) and uploaded before the step to
// buffers at fixed addresses, so a captured CUDA graph can be replayed after an update.
#pragma once
#include <cstdint>

namespace moeserve::cuda {

struct StepMeta {
  int num_tokens = 0;                 // M: new tokens in the step, all sequences
  int num_seqs = 0;                   // S
  int max_blocks_per_seq = 0;         // row stride of block_tables
  const int32_t* token_seq = nullptr;        // [M] sequence index of each token
  const int32_t* token_pos = nullptr;        // [M] absolute position of each token
  const int32_t* seq_token_start = nullptr;  // [S+1] first token of each sequence (cu_seqlens)
  const int32_t* seq_start_pos = nullptr;    // [S] tokens already cached before this step
  const int32_t* seq_state_slot = nullptr;   // [S] GDN state slot
  // [S][max_blocks_per_seq] physical KV block ids. A kernel reads row s only at the blocks of
  // positions <= the sequence's last position in the step (blocks past it may not exist); the
  // host writes and uploads only those columns (qwen35_cuda.cpp, run_substep).
  const int32_t* block_tables = nullptr;
};

}  // namespace moeserve::cuda
