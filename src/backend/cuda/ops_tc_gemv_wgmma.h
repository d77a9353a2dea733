// tc_gemv's wgmma form (ops_tc_gemv_wgmma.cu), internal to the tc_gemv family (ops_tc_gemv.cu picks
// it): the arithmetic of ops_tc_gemv.h on Hopper warpgroup MMAs, for launches of many tokens. The
// same bits as the mma.sync forms (tests/gpu/test_ops_tc_gemv.cpp runs every form against M = 1).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace moeserve::cuda::tc_wg {

constexpr int kMaxJobs = 8;  // = kMaxRowJobs (ops_quant_gemv.h); checked in the .cu

// One weight of a launch (row_format codes: FP8 block-128, INT8 row-wise, bf16).
struct Job {
  const uint8_t* w;
  const float* scale;  // FP8 block scales [ceil(N/128)][B], INT8 row scales [N], bf16: unused
  float* y;            // [M, N]
  int N;
  int fmt;
  int block_begin;  // first 128-row block of this job in the launch (set by plan)
  int accumulate;
};
struct Jobs {
  Job job[kMaxJobs];
  int count;
};

// A launch's shape and its workspace carve-up (bytes from the workspace start).
struct Plan {
  int M = 0, K = 0, B = 0, S = 0;
  int ntok = 0;    // tokens per tile (the wgmma N): 16, 32 or 64
  int tiles = 0;   // token tiles: ceil(M / ntok)
  int ksplit = 1;  // CTAs that split K along the arithmetic's slices (1, 2, 4 or 8; S % ksplit == 0)
  long long blocks = 0;  // 128-row blocks over all jobs
  bool f16 = false, bf16 = false;  // plane kinds the jobs need
  size_t img_f16 = 0, img_bf16 = 0, pinv = 0, partial = 0, bytes = 0;
};

// Whether this process can run the form: an sm_90 device and a build with sm_90a code.
bool available();

// The launch's plan for M tokens of K over jobs (block_begin set); allow_split: K may be split
// over CTAs (needs the partial sums' workspace).
Plan plan(int M, int K, Jobs& jobs, bool allow_split);
// Workspace bytes that cover every plan of up to max_M tokens of K (any jobs).
size_t reserve_bytes(int max_M, int K);
// The planes kernel, then the GEMV kernel, on stream. x (and u, gated: x = silu(x)·u) f32 [M, K];
// ws: plan.bytes of device memory (16-byte aligned), no other launch using it meanwhile.
void launch(const Plan& p, const Jobs& jobs, const float* x, const float* u, bool gated, uint8_t* ws,
            cudaStream_t stream);

}  // namespace moeserve::cuda::tc_wg
