// Prefill attention: paged_attention_prefill (tensor cores, ops_attention_mma.cu) against
// paged_attention (CUDA cores, ops_attention.cu) on one prompt chunk of M tokens ending at
// position context − 1 (chunked prefill: the chunk attends to context − M earlier cached positions).
//
//   bench_attention_prefill                                  (122B shape, contexts 1024,8192)
//   bench_attention_prefill --nq 16 --nkv 2 --hd 256 --context 8192 --m 512,8192 --iters 20
//   bench_attention_prefill --variant 0,1          (the 4-warp and the wide tensor-core kernels)
//
// Built by bench/CMakeLists.txt (every bench/cuda/*.cpp is a program when MOESERVE_CUDA is on).
// q, gate are f32 [M, nq·hd] (the model's path), the cache bf16 with random contents, one
// contiguous block table. Timing: two warm-up launches, then --iters launches each between two
// CUDA events with a synchronisation after it; the median is reported.
// Columns: us per launch (one layer); useful TFLOP/s = 4·hd·nq·Σ_tokens (pos + 1) / t (q·K and
// P·V; the tensor-core kernel executes twice that: hi and lo MMAs); layers x us for --layers full
// attention layers (12 for Qwen3.5-122B-A10B); speedup = CUDA-core us / tensor-core us; diff =
// max |mma − cuda core| / max |cuda core| (both approximate the same f32 attention); var = the
// prefill variant (set_attention_prefill_variant: 0 the 4-warp kernel, 1 the wide kernel where it
// fits the device); same = whether its output is bit-identical to the first variant listed.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/dummy_fill.h"
#include "backend/cuda/ops_attention.h"
#include "backend/cuda/step_meta.h"
#include "bench_util.h"

using namespace moeserve;
using namespace moeserve::cuda;

namespace {


std::vector<float> to_host(const DeviceBuffer<float>& d) {
  std::vector<float> h(d.size());
  MOESERVE_CUDA_CHECK(cudaMemcpy(h.data(), d.data(), d.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"paged_attention_prefill (tensor cores) vs paged_attention (CUDA cores) on a prompt chunk"};
  int nq = 32, nkv = 2, hd = 256, iters = 10, layers = 12;
  std::string contexts_s = "1024,8192", ms_s = "", variants_s = "1";
  app.add_option("--nq", nq, "query heads");
  app.add_option("--nkv", nkv, "KV heads");
  app.add_option("--hd", hd, "head_dim (64, 128 or 256)");
  app.add_option("--context", contexts_s, "contexts (the chunk's last position + 1)");
  app.add_option("--m", ms_s, "chunk sizes M (default: 512 and the whole context)");
  app.add_option("--iters", iters, "timed launches per kernel");
  app.add_option("--layers", layers, "full-attention layers per model step (for the layers x us column)");
  app.add_option("--variant", variants_s,
                 "prefill kernel variants to time: 0 the 4-warp kernel, 1 the wide kernel (default; 4-warp where it "
                 "does not fit)");
  CLI11_PARSE(app, argc, argv);
  try {
    constexpr int kBlock = 16;
    const AttentionShape shape{nq, nkv, hd, hd / 4, 1e-6f};
    const float scale = 1.0f / std::sqrt(float(hd));
    cudaStream_t s = nullptr;
    const std::vector<int> variants = bench::parse_int_list(variants_s);
    std::printf("%-8s %-6s %-4s %10s %8s %10s %8s %10s %8s %9s %5s\n", "context", "M", "var", "mma_us", "TFLOP/s",
                "x layers_ms", "cc_us", "cc_TFLOP/s", "speedup", "diff", "same");
    for (int ctx : bench::parse_int_list(contexts_s)) {
      std::vector<int> ms = ms_s.empty() ? std::vector<int>{std::min(512, ctx), ctx} : bench::parse_int_list(ms_s);
      const int blocks = (ctx + kBlock - 1) / kBlock;
      DeviceBuffer<bf16> k(size_t(blocks) * nkv * kBlock * hd), v(k.size());
      fill_uniform_bf16(k.data(), k.size(), 11, 1.0f, s);
      fill_uniform_bf16(v.data(), v.size(), 12, 1.0f, s);
      const KvCacheView view{k.data(), v.data(), blocks, nkv, kBlock, hd};
      for (int M : ms) {
        if (M > ctx || M <= 0) continue;
        const int start = ctx - M;
        // Step metadata: one sequence, tokens at start .. ctx − 1, blocks 0 .. blocks − 1.
        const std::vector<int32_t> sts{0, M}, ssp{start}, slot{0};
        std::vector<int32_t> tseq(size_t(M), 0), tpos(size_t(M), 0), table(size_t(blocks), 0);
        for (int i = 0; i < M; ++i) tpos[size_t(i)] = start + i;
        for (int b = 0; b < blocks; ++b) table[size_t(b)] = b;
        DeviceBuffer<int32_t> d_tseq(tseq.size()), d_tpos(tpos.size()), d_sts(2), d_ssp(1), d_slot(1);
        DeviceBuffer<int32_t> d_table(table.size());
        d_tseq.upload(tseq.data(), tseq.size());
        d_tpos.upload(tpos.data(), tpos.size());
        d_sts.upload(sts.data(), 2);
        d_ssp.upload(ssp.data(), 1);
        d_slot.upload(slot.data(), 1);
        d_table.upload(table.data(), table.size());
        StepMeta meta;
        meta.num_tokens = M;
        meta.num_seqs = 1;
        meta.max_blocks_per_seq = blocks;
        meta.token_seq = d_tseq.data();
        meta.token_pos = d_tpos.data();
        meta.seq_token_start = d_sts.data();
        meta.seq_start_pos = d_ssp.data();
        meta.seq_state_slot = d_slot.data();
        meta.block_tables = d_table.data();

        const size_t n = size_t(M) * nq * hd;
        DeviceBuffer<float> q(n), gate(n), out_mma(n), out_cc(n);
        fill_uniform_f32(q.data(), n, 13, -2.0f, 2.0f, s);
        fill_uniform_f32(gate.data(), n, 14, -2.0f, 2.0f, s);
        const size_t ws_cc_bytes = paged_attention_workspace_bytes(shape, M, ctx);
        DeviceBuffer<uint8_t> ws_cc(std::max<size_t>(1, ws_cc_bytes));
        const size_t ws_mma_bytes = paged_attention_prefill_workspace_bytes(shape, M, ctx);
        DeviceBuffer<uint8_t> ws_mma(std::max<size_t>(1, ws_mma_bytes));

        const double t_cc = bench::median_event_us(s, iters, [&](int) {
          paged_attention(q.data(), gate.data(), shape, meta, view, scale, ws_cc.data(), ws_cc_bytes, out_cc.data(), s);
        });
        const auto b = to_host(out_cc);
        // Useful FLOPs: 4·hd per (token, q head, visible position).
        const double visible = double(M) * start + double(M) * (M + 1) / 2.0;
        const double flop = 4.0 * hd * nq * visible;
        std::vector<float> first_out;
        for (int variant : variants) {
          set_attention_prefill_variant(variant);
          const double t_mma = bench::median_event_us(s, iters, [&](int) {
            paged_attention_prefill(q.data(), gate.data(), shape, meta, view, scale, 0, 1, 0, M, ws_mma.data(),
                                    ws_mma_bytes, out_mma.data(), s);
          });
          const auto a = to_host(out_mma);
          double max_err = 0, max_ref = 0;
          for (size_t i = 0; i < n; ++i) {
            max_err = std::max(max_err, double(std::abs(a[i] - b[i])));
            max_ref = std::max(max_ref, double(std::abs(b[i])));
          }
          if (first_out.empty()) first_out = a;
          const bool same = std::memcmp(a.data(), first_out.data(), n * sizeof(float)) == 0;
          std::printf("%-8d %-6d %-4d %10.1f %8.1f %10.2f %8.1f %10.1f %8.2f %9.2e %5s\n", ctx, M, variant, t_mma,
                      flop / t_mma * 1e-6, t_mma * layers * 1e-3, t_cc, flop / t_cc * 1e-6, t_cc / t_mma,
                      max_err / std::max(max_ref, 1e-30), same ? "yes" : "NO");
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention_prefill: %s\n", e.what());
    return 1;
  }
  return 0;
}
