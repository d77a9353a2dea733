// Gated DeltaNet prefill, chunked (WY) vs sequential: one sequence of T prompt tokens through
// gated_delta_net_chunked (ops_gdn_chunked.h) and through gated_delta_net (ops_gdn.h) at a
// config's shapes; time per layer of each and the whole model's linear layers
// (x num_linear_attention_layers).
//
//   bench_gdn_chunked --config bench/configs/qwen3.5-122b-a10b.json --tokens 1024,8192 [--gdn-variant 0|1|2]
//
// --gdn-variant picks the kernels (set_gdn_chunked_variant): 2 (default) tensor-core intra-chunk
// kernel and state pass, 1 tensor-core intra-chunk kernel only, 0 both on CUDA cores.
//
// Roofline (see ops_gdn_chunked.cu): per token and layer nv·(3·dk·dv + 64·dv) FMAs in the
// state pass and nk·128·dk + nv·32·(dk + dv) in the intra-chunk pass (executed, triangular
// products as full squares), on f32 CUDA cores; `GFLOP/s` is 2 × that count over the
// measured time, to hold against the GPU's f32 FMA peak (for every --gdn-variant, though the
// tensor-core kernels execute other counts: see their headers). The sequential kernel's floor is the
// chain of T recurrence steps instead.
// Both ops start from the same carried states, which each run updates in place; the timed
// runs therefore start from different states (the time does not depend on the values).
// Timing: two warm-ups, then the median of --reps runs, each between CUDA events. The split
// line after each length times the chunked op's four kernels separately (events between the
// launches, GdnChunkedEvents; median of --reps runs each): prep (conv, norms, gates), intra
// (per-chunk WY products, parallel over chunks), state (the sequential inter-chunk pass) and
// norm (gated RMSNorm); "state chain" is the state pass per 64-token chunk of the sequence.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/dummy_fill.h"
#include "backend/cuda/ops_gdn.h"
#include "backend/cuda/ops_gdn_chunked.h"
#include "bench_util.h"
#include "io/qwen35_config.h"

using namespace moeserve;
using namespace moeserve::cuda;

namespace {

DeviceBuffer<float> random_f32(size_t n, uint64_t seed, float lo, float hi, cudaStream_t s) {
  DeviceBuffer<float> b(std::max<size_t>(n, 1));
  fill_uniform_f32(b.data(), n, seed, lo, hi, s);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moeserve Gated DeltaNet chunked prefill benchmark"};
  std::string config = std::string(MOESERVE_SOURCE_DIR) + "/bench/configs/qwen3.5-122b-a10b.json";
  std::string tokens_arg = "1024,8192";
  int reps = 5;
  bool skip_sequential = false;
  int gdn_variant = gdn_chunked_variant();
  app.add_option("--config", config);
  app.add_option("--tokens", tokens_arg, "prompt lengths (tokens of one sequence in one step)");
  app.add_option("--reps", reps, "timed runs per length (median reported)");
  app.add_flag("--skip-sequential", skip_sequential, "time the chunked op only");
  app.add_option("--gdn-variant", gdn_variant,
                 "2 tensor-core (3xTF32) intra + state kernels, 1 tensor-core intra only, 0 CUDA cores");
  CLI11_PARSE(app, argc, argv);
  try {
    const io::Qwen35Config c = io::parse_qwen35_config(nlohmann::json::parse(std::ifstream(config)), config);
    const GdnShape gs{int(c.linear_num_key_heads), int(c.linear_num_value_heads), int(c.linear_key_head_dim),
                      int(c.linear_value_head_dim), int(c.linear_conv_kernel_dim), float(c.rms_norm_eps)};
    if (!gated_delta_net_chunked_supported(gs)) throw Error("the config's GDN shape is not supported by the chunked op");
    const int layers = c.num_linear_attention_layers();
    cudaStream_t s;
    MOESERVE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    set_gdn_chunked_variant(gdn_variant);
    gated_delta_net_chunked_prepare();
    std::printf("config %s: nk %d, nv %d, dk %d, dv %d, %d linear-attention layers; kernel variant %d\n",
                config.c_str(), gs.num_k_heads, gs.num_v_heads, gs.k_head_dim, gs.v_head_dim, layers, gdn_variant);
    std::printf("%-8s %-14s %-14s %-10s %-12s %-16s %-16s\n", "tokens", "chunked ms", "sequential ms", "speedup",
                "GFLOP/s", "chunked ms (all)", "sequential (all)");
    const double nk = gs.num_k_heads, nv = gs.num_v_heads, dk = gs.k_head_dim, dv = gs.v_head_dim;
    const double fma_per_token = nv * (3 * dk * dv + 64 * dv) + nk * 128 * dk + nv * 32 * (dk + dv);
    for (int T : bench::parse_int_list(tokens_arg)) {
      const size_t rec = size_t(gs.num_v_heads) * gs.k_head_dim * gs.v_head_dim;
      const size_t conv = size_t(gs.conv_dim()) * size_t(gs.conv_kernel - 1);
      uint64_t seed = 1;
      auto conv_state = random_f32(conv, ++seed, -0.5f, 0.5f, s);
      auto rec_state = random_f32(rec, ++seed, -0.01f, 0.01f, s);
      auto conv_w = random_f32(size_t(gs.conv_dim()) * gs.conv_kernel, ++seed, -0.5f, 0.5f, s);
      auto dt_bias = random_f32(size_t(gs.num_v_heads), ++seed, -0.5f, 0.5f, s);
      auto a_log = random_f32(size_t(gs.num_v_heads), ++seed, -1.0f, 1.0f, s);
      auto norm_w = random_f32(size_t(gs.v_head_dim), ++seed, 0.8f, 1.2f, s);
      auto qkv = random_f32(size_t(T) * gs.conv_dim(), ++seed, -1, 1, s);
      auto z = random_f32(size_t(T) * gs.value_dim(), ++seed, -1, 1, s);
      auto bb = random_f32(size_t(T) * gs.num_v_heads, ++seed, -2, 2, s);
      auto aa = random_f32(size_t(T) * gs.num_v_heads, ++seed, -2, 2, s);
      DeviceBuffer<float> out(size_t(T) * gs.value_dim());
      const size_t ws_bytes =
          std::max(gated_delta_net_chunked_workspace_bytes(gs, T), skip_sequential ? 0 : gdn_workspace_bytes(gs, T));
      DeviceBuffer<uint8_t> ws(std::max<size_t>(1, ws_bytes));
      // One sequence, positions 0..T-1, state slot 0: token_seq [T], token_pos [T],
      // seq_token_start [2], seq_start_pos [1], seq_state_slot [1], block_tables [1] (unused).
      std::vector<int32_t> h(size_t(2 * T) + 5, 0);
      for (int t = 0; t < T; ++t) h[size_t(T + t)] = t;
      h[size_t(2 * T) + 1] = T;  // seq_token_start = {0, T}
      DeviceBuffer<int32_t> meta_buf(h.size());
      meta_buf.upload(h.data(), h.size());
      StepMeta meta;
      meta.num_tokens = T;
      meta.num_seqs = 1;
      meta.max_blocks_per_seq = 1;
      meta.token_seq = meta_buf.data();
      meta.token_pos = meta_buf.data() + T;
      meta.seq_token_start = meta_buf.data() + 2 * T;
      meta.seq_start_pos = meta_buf.data() + 2 * T + 2;
      meta.seq_state_slot = meta_buf.data() + 2 * T + 3;
      meta.block_tables = meta_buf.data() + 2 * T + 4;
      const GdnLayerParams p{conv_w.data(), dt_bias.data(), a_log.data(), norm_w.data(), conv_state.data(),
                             rec_state.data()};
      const double chunked_ms = bench::median_event_us(s, reps, [&](int) {
        gated_delta_net_chunked(qkv.data(), z.data(), bb.data(), aa.data(), gs, p, meta, 0, 0, ws.data(), ws.bytes(),
                                out.data(), s);
      }) * 1e-3;
      double seq_ms = 0.0;
      if (!skip_sequential)
        seq_ms = bench::median_event_us(s, reps, [&](int) {
          gated_delta_net(qkv.data(), z.data(), bb.data(), aa.data(), gs, p, meta, ws.data(), ws.bytes(), out.data(), s);
        }) * 1e-3;
      const double gflops = 2.0 * fma_per_token * T / (chunked_ms * 1e-3) * 1e-9;
      std::printf("%-8d %-14.3f %-14.3f %-10.2f %-12.0f %-16.1f %-16.1f\n", T, chunked_ms, seq_ms,
                  seq_ms > 0 ? seq_ms / chunked_ms : 0.0, gflops, chunked_ms * layers, seq_ms * layers);

      // Per-kernel split of the chunked op.
      GdnChunkedEvents ev;
      for (auto& e : ev.ev) MOESERVE_CUDA_CHECK(cudaEventCreate(&e));
      std::vector<std::vector<float>> split(4);
      for (int r = 0; r < std::max(1, reps) + 2; ++r) {
        gated_delta_net_chunked(qkv.data(), z.data(), bb.data(), aa.data(), gs, p, meta, 0, 0, ws.data(), ws.bytes(),
                                out.data(), s, nullptr, &ev);
        MOESERVE_CUDA_CHECK(cudaEventSynchronize(ev.ev[4]));
        if (r < 2) continue;  // warm-ups
        for (int k = 0; k < 4; ++k) {
          float ms = 0;
          MOESERVE_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.ev[k], ev.ev[k + 1]));
          split[size_t(k)].push_back(ms);
        }
      }
      double med[4];
      for (int k = 0; k < 4; ++k) {
        auto& v = split[size_t(k)];
        std::sort(v.begin(), v.end());
        med[k] = v[v.size() / 2];
      }
      const double chunks = (T + 63) / 64;
      std::printf("         split ms: prep %.3f, intra %.3f, state %.3f (state chain %.2f us per chunk), norm %.3f\n",
                  med[0], med[1], med[2], med[2] * 1e3 / chunks, med[3]);
      for (auto& e : ev.ev) cudaEventDestroy(e);
    }
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
