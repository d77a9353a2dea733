// The kernel A/B switches shared by bench_decode and bench_kernels: each flag selects one of
// several kernel forms (the setters in ops_quant_gemv.h, ops_moe.h, ops_attention.h,
// ops_mma_gemm.h, ops_gdn_chunked.h), so one binary can compare them. Most forms of one op give
// the same bits; the exceptions (the expert MMA word form 5/7/8, the chunked DeltaNet's tensor-core
// forms) differ from the others in f32 rounding, each batch-invariant on its own. Defaults are
// the library's defaults.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "backend/cuda/ops_attention.h"
#include "backend/cuda/ops_gdn_chunked.h"
#include "backend/cuda/ops_mma_gemm.h"
#include "backend/cuda/ops_moe.h"
#include "backend/cuda/ops_quant_gemv.h"
#include "backend/cuda/ops_tc_gemv.h"

namespace moeserve::bench {

struct KernelVariantFlags {
  std::string gemv_feed = "lean";
  std::string gemv_rows = "wide";
  int gemv_tiled = 2;
  int moe_decode = 1;
  int moe_grouped_max = 64;
  int attention_decode = 1;
  int attention_decode_stages = 2;
  int gemm_variant = cuda::mma_gemm_variant();
  int wgmma_overlap = cuda::mma_gemm_wgmma_overlap();
  int moe_mma = cuda::moe_mma_variant();
  int moe_int_decode = cuda::moe_int_decode_variant();
  int moe_int_ring = -1;
  int gemv_early = 1;
  int attention_prefill = cuda::attention_prefill_variant();
  int gdn_chunked = cuda::gdn_chunked_variant();
  bool moe_int_wgmma = cuda::moe_int_wgmma();
  bool tc_gemv_wgmma = true;

  void add_to(CLI::App& app) {
    app.add_option("--gemv-feed", gemv_feed, "one/two-token row GEMV weight feed: lean, registers");
    app.add_option("--gemv-rows", gemv_rows,
                   "one/two-token row GEMV form for tall launches: wide (one token 4 rows per warp with a one-step "
                   "ring, two tokens 2 rows with a two-step ring, 3 CTAs per SM), shape (4 rows, two-step ring, 2 "
                   "CTAs per SM)");
    app.add_option("--gemv-tiled-variant", gemv_tiled,
                   "row GEMV token tiles (M >= 3): 2 x in shared memory, 8 warps; 1 the same with 6/8 warps by "
                   "shape; 0 x via L1");
    app.add_option("--moe-decode-variant", moe_decode, "expert kernels for <= 8 tokens: 1 streaming, 0 previous");
    app.add_option("--gemv-early-loads", gemv_early,
                   "one/two-token row GEMVs: first weight loads before the PDL wait (1) or after it (0)");
    app.add_option("--moe-int-ring", moe_int_ring,
                   "integer-form streaming expert kernels: at most this many ring steps in flight per thread (-1: "
                   "2 at 2-8 tokens, the largest that fits at one; 0: the largest that fits)");
    app.add_option("--moe-int-decode-variant", moe_int_decode,
                   "integer-form expert kernels for <= 8 tokens: 2 streaming with gate/up and down in one launch "
                   "at one token, 1 streaming, 0 persistent (same bits)");
    app.add_option("--moe-grouped-max", moe_grouped_max, "grouped expert kernels for 9..N tokens (<= 8: off)");
    app.add_option("--attention-decode-stages", attention_decode_stages,
                   "tile-parallel decode attention: K/V rounds in shared memory (2: the next round's copy in flight "
                   "where it fits, 1: one round)");
    app.add_option("--attention-decode-variant", attention_decode,
                   "decode attention: 1 tile-parallel kernel for <= 2 tokens, 2 for <= 8, 0 the work-item kernel");
    app.add_option("--moe-mma-variant", moe_mma,
                   "prompt-token expert kernels (0, 1, 5, 7, 8): 1 PRMT dequantisation + 1x8-warp 64-slot tiles, "
                   "0 previous (1's bits); 5 GPTQ whole-word dequantisation over k-permuted activations (other "
                   "bits), 7 5 with the tile size (32 / 64 slots) chosen per expert, 8 7 with swapAB GPTQ kernels "
                   "(weights as the MMA's A operand) at <= 4 slots per expert (5's bits)");
    app.add_option("--gemm-variant", gemm_variant,
                   "prompt-token dense GEMM (mma_gemm) large tiles: 4 wgmma on sm_90a GPUs (elsewhere 3); 3 pipelined "
                   "128x128 at 2 CTAs per SM; 2 pipelined 128x256 where it fills the SMs, else 128x128; 1 pipelined "
                   "128x128; 0 register-staged 128x128");
    app.add_option("--wgmma-overlap", wgmma_overlap,
                   "wgmma dense GEMM: keep one group of MMAs in flight per warpgroup (1) or wait for each (0); 2 "
                   "(default) by weight kind (bf16 1, FP8 / INT8 0)");
    app.add_option("--attention-prefill-variant", attention_prefill,
                   "prompt-token attention: 1 8-warp kernel with double-buffered K/V where it fits, 0 the 4-warp kernel");
    app.add_option("--moe-int-wgmma", moe_int_wgmma,
                   "integer-form experts' 32- / 64-slot tiles on wgmma (true, default; sm_90a builds on sm_90 "
                   "GPUs) or mma.sync (false)");
    app.add_option("--tc-gemv-wgmma", tc_gemv_wgmma,
                   "tc_gemv launches of 9-256 tokens on wgmma (true, default; sm_90a builds on sm_90 GPUs) or the "
                   "mma.sync forms (false); same bits");
    app.add_option("--gdn-chunked-variant", gdn_chunked,
                   "chunked DeltaNet: 2 tensor-core intra + state, 1 tensor-core intra only, 0 CUDA cores");
  }

  // Sets the process-wide switches (before any graph is captured); throws on a bad value.
  void apply() const {
    cuda::set_row_gemv_feed(cuda::parse_row_gemv_feed(gemv_feed));
    cuda::set_row_gemv_rows(cuda::parse_row_gemv_rows(gemv_rows));
    cuda::set_row_gemv_tiled_variant(gemv_tiled);
    cuda::set_moe_decode_variant(moe_decode);
    cuda::set_moe_int_decode_variant(moe_int_decode);
    cuda::set_moe_int_stream_ring_cap(moe_int_ring);
    cuda::set_row_gemv_early_loads(gemv_early != 0);
    cuda::set_moe_grouped_enabled(moe_grouped_max > 8);
    if (moe_grouped_max > 8) cuda::set_moe_grouped_max_tokens(moe_grouped_max);
    cuda::set_attention_decode_variant(attention_decode);
    cuda::set_attention_decode_stages(attention_decode_stages);
    cuda::set_mma_gemm_variant(gemm_variant);
    cuda::set_mma_gemm_wgmma_overlap(wgmma_overlap);
    cuda::set_moe_mma_variant(moe_mma);
    cuda::set_attention_prefill_variant(attention_prefill);
    cuda::set_gdn_chunked_variant(gdn_chunked);
    cuda::set_moe_int_wgmma(moe_int_wgmma);
    cuda::set_tc_gemv_wgmma(tc_gemv_wgmma);
  }
};

}  // namespace moeserve::bench
