// End-to-end decode and prefill throughput of the CUDA model with random weights of any
// config (--load-format dummy), against the memory roofline.
//
//   bench_decode --config bench/configs/qwen3.5-122b-a10b.json --weights hybrid-int4-fp8 \
//                --int8-lm-head --batch 1,8,64 --context 512 --steps 32 --prefill 1024,8192
//
// --kernel-timeline FILE.csv records every kernel of the timed decode steps with its device
// timestamps, and each step's host call (kernel_timeline.h, CUPTI); bench/step_timeline.py
// shows where a step's time goes. In a measurement build (cmake -DMOESERVE_KERNEL_STAMPS=ON) the
// instrumented kernels print their stage stamps (stage_stamps.cuh; bench/stage_stamps.py reads them).
//
// Roofline of a decode step at batch b: the bytes every step must read (all non-expert
// weights except the embedding, the distinct experts the batch selects — expected
// E·(1 − (1 − k/E)^b) per layer —, the KV cache and the GDN states) over the copy
// bandwidth measured here (a large device-to-device copy, bytes read + written).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <sstream>

#include "backend/cuda/cuda_check.h"
#include "bench_util.h"
#ifdef MOESERVE_HAVE_CUPTI
#include "kernel_timeline.h"
#endif
#include "kernel_variant_flags.h"
#include "backend/cuda/qwen35_cuda.h"

using namespace moeserve;
using Clock = std::chrono::steady_clock;

namespace {

struct ByteCounts {
  double dense = 0;         // read by every step regardless of batch
  double experts = 0;       // all routed experts of all layers
  double lm_head = 0;
};

ByteCounts count_bytes(const cuda::CudaWeights& w) {
  ByteCounts c;
  c.lm_head = double(w.lm_head.bytes());
  c.dense = double(w.final_norm.bytes()) + c.lm_head;
  for (const auto& l : w.layers) {
    c.dense += double(l.input_norm.bytes() + l.post_attention_norm.bytes());
    if (l.attention)
      c.dense += double(l.attention->q_proj.bytes() + l.attention->k_proj.bytes() + l.attention->v_proj.bytes() +
                        l.attention->o_proj.bytes());
    if (l.gdn)
      c.dense += double(l.gdn->in_proj_qkv.bytes() + l.gdn->in_proj_z.bytes() + l.gdn->in_proj_b.bytes() +
                        l.gdn->in_proj_a.bytes() + l.gdn->out_proj.bytes() + l.gdn->conv1d.bytes());
    const auto& m = l.moe;
    c.dense += double(m.router.bytes() + m.shared_gate.bytes() + m.shared_up.bytes() + m.shared_down.bytes() +
                      m.shared_expert_gate.bytes());
    c.experts += double(m.experts.gate.bytes() + m.experts.up.bytes() + m.experts.down.bytes());
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moeserve CUDA decode/prefill benchmark (random weights)"};
  std::string config = std::string(MOESERVE_SOURCE_DIR) + "/bench/configs/qwen3.5-122b-a10b.json";
  std::string weights = "hybrid-int4-fp8", batches = "1,8,64", prefills = "1024,8192";
  bool int8_head = false, graphs = true, pdl = true, host_logits = false, chunked_deltanet = true;
  int context = 512, steps = 32, max_model_len = 0;
  app.add_option("--config", config);
  app.add_option("--weights", weights);
  app.add_flag("--int8-lm-head", int8_head);
  app.add_option("--batch", batches);
  app.add_option("--context", context, "prompt tokens per sequence before timing decode");
  app.add_option("--steps", steps, "timed decode steps");
  app.add_option("--prefill", prefills, "prompt lengths for the prefill / TTFT measurement");
  app.add_option("--max-model-len", max_model_len,
                 "the model's max_model_len, as serve's (the block tables' row length; default: what the run needs); "
                 "each sequence still gets only the KV blocks its tokens need, as the engine gives them");
  app.add_option("--graphs", graphs);
  app.add_flag("--host-logits", host_logits,
               "copy every decode step's logits to the host (default: greedy sampling on the device, as served)");
  app.add_option("--chunked-deltanet", chunked_deltanet, "prompt tokens of DeltaNet layers in the chunked form");
  app.add_option("--pdl", pdl, "programmatic dependent launch between the decode kernels (pdl.cuh)");
  std::string decode_kernels = "gemv";
  app.add_option("--decode-kernels", decode_kernels,
                 "generated tokens' kernels, as serve --decode-kernels: gemv (CUDA cores), tensor-cores (dense "
                 "projections through tc_gemv, experts through the prompt-token expert kernels) or mixed (tc_gemv, "
                 "CUDA-core experts)");
  std::string expert_activations = "auto";
  app.add_option("--expert-activations", expert_activations,
                 "GPTQ routed experts, as serve --expert-activations: auto (the integer form for prompt tokens), f32 or int16 (every token)");
  std::string decode_attention = "auto";
  app.add_option("--decode-attention", decode_attention,
                 "generated tokens' attention, as serve --decode-attention: auto (tensor cores with --decode-kernels "
                 "mixed / tensor-cores), tensor-cores or cuda-cores");
  double temperature = 0.0, top_p = 1.0;
  int top_k = 0;
  app.add_option("--temperature", temperature,
                 "sample the decode steps' tokens on the device at this temperature (default 0: greedy)");
  app.add_option("--top-k", top_k, "with --temperature: top_k (<= 0: off)");
  app.add_option("--top-p", top_p, "with --temperature: top_p");
  std::string shared_expert_decode = "side";
  app.add_option("--shared-expert-decode", shared_expert_decode,
                 "decode steps' shared expert: side (a second stream, beside the routed experts), before or after "
                 "(the routed experts, on the step's stream)");
  std::string attention_prepare = "fused";
  app.add_option("--attention-prepare", attention_prepare,
                 "decode steps of 1-2 tokens: fused (attention_prepare's work inside the tile-parallel decode "
                 "attention kernel) or separate (its own launch first)")
      ->check(CLI::IsMember({"fused", "separate"}));
  std::string timeline_csv;
#ifdef MOESERVE_HAVE_CUPTI
  app.add_option("--kernel-timeline", timeline_csv,
                 "write the timed decode steps' kernels (device timestamps) and host calls to this CSV "
                 "(bench/step_timeline.py reads it)");
#endif
  bench::KernelVariantFlags variants;
  variants.add_to(app);
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress survives a timeout in a pipe
  try {
    variants.apply();
#if defined(MOESERVE_KERNEL_STAMPS) && MOESERVE_KERNEL_STAMPS
    // Every CTA of an instrumented kernel prints a line: room for a graph's worth between syncs.
    MOESERVE_CUDA_CHECK(cudaDeviceSetLimit(cudaLimitPrintfFifoSize, size_t(64) << 20));
#endif
    const auto batch_list = bench::parse_int_list(batches);
    const auto prefill_list = bench::parse_int_list(prefills);
    const int max_batch = *std::max_element(batch_list.begin(), batch_list.end());
    const int max_prefill = prefill_list.empty() ? 0 : *std::max_element(prefill_list.begin(), prefill_list.end());
    const double bw = bench::measure_copy_bandwidth();
    std::printf("device-to-device copy bandwidth: %.2f TB/s (read + write)\n", bw / 1e12);

    cuda::CudaModelOptions o;
    o.dummy = true;
    o.dummy_weights = weights;
    o.int8_lm_head = int8_head;
    o.max_tokens_per_step = std::max({max_prefill, max_batch * 8, 2048});
    o.max_seqs = max_batch;
    o.max_graph_batch = max_batch;
    const int tokens_per_seq = std::max(max_prefill, context + steps) + 16;  // what a sequence reaches, with room
    if (max_model_len > 0 && max_model_len < tokens_per_seq)
      throw std::runtime_error("--max-model-len " + std::to_string(max_model_len) + " is below the " +
                               std::to_string(tokens_per_seq) + " tokens this run needs");
    o.max_model_len = max_model_len > 0 ? max_model_len : tokens_per_seq;
    o.cuda_graphs = graphs;
    cuda::set_decode_kernels(o, decode_kernels);
    cuda::set_expert_activations(o, expert_activations);
    cuda::set_decode_attention(o, decode_attention);
    o.pdl = pdl;
    cuda::set_shared_expert_decode(o, shared_expert_decode);
    o.fused_attention_prepare = attention_prepare == "fused";
    o.chunked_deltanet = chunked_deltanet;
    o.lm_head_chunk_rows = std::max(64, max_batch);
    const auto t0 = Clock::now();
    auto m = cuda::Qwen35CudaModel::load(config, o);
    MOESERVE_CUDA_CHECK(cudaDeviceSynchronize());
    const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const auto& c = m->config();
    const int bs = m->cache_geometry().kv_block_size;
    const int blocks_per_seq = (tokens_per_seq + bs - 1) / bs;
    m->allocate_caches(blocks_per_seq * max_batch, max_batch);
    size_t free_b, total_b;
    cudaMemGetInfo(&free_b, &total_b);
    const ByteCounts bytes = count_bytes(m->weights());
    std::printf("config %s, weights %s%s: %.2f GB weights (%.2f GB routed experts), load %.1f s, GPU memory used %.1f GB\n",
                config.c_str(), weights.c_str(), int8_head ? " + INT8 LM head" : "", m->weight_bytes() / 1e9,
                bytes.experts / 1e9, load_s, (total_b - free_b) / 1e9);

    std::mt19937 rng(1);
    std::uniform_int_distribution<int> tok(0, int(c.vocab_size) - 1);
    const double E = double(c.num_experts), k = double(c.num_experts_per_tok);
    const double kv_per_token = double(m->cache_geometry().bytes_per_kv_block) / bs;
    const double state_per_seq = double(m->cache_geometry().bytes_per_state_slot) * 2;  // read + write
#ifdef MOESERVE_HAVE_CUPTI
    std::unique_ptr<bench::KernelTimeline> timeline;
    if (!timeline_csv.empty()) timeline = std::make_unique<bench::KernelTimeline>();
#endif
    std::printf("\n%-6s %-10s %-12s %-12s %-14s %-10s\n", "batch", "ms/step", "tok/s", "GB/step", "roofline tok/s",
                "fraction");
    for (int b : batch_list) {
      std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(b)), tables(static_cast<size_t>(b));
      for (int i = 0; i < b; ++i) {
        for (int t = 0; t < context; ++t) prompts[size_t(i)].push_back(tok(rng));
        for (int j = 0; j < blocks_per_seq; ++j) tables[size_t(i)].push_back(i * blocks_per_seq + j);
        m->reset_state(i);
      }
      std::vector<model::SeqStep> batch(static_cast<size_t>(b));
      for (int i = 0; i < b; ++i) {
        batch[size_t(i)].tokens = prompts[size_t(i)];
        batch[size_t(i)].start_pos = 0;
        batch[size_t(i)].kv_blocks = tables[size_t(i)];
        batch[size_t(i)].state_slot = i;
        batch[size_t(i)].prompt_len = context;  // the decode steps' tokens are generated ones
      }
      model::StepOutput out;
      m->forward(batch, out);  // prefill the contexts
      if (!host_logits) {  // the server samples on the device: only the token comes back
        model::DeviceSampleParams sp;
        if (temperature > 0.0) {
          sp.greedy = false;
          sp.inv_temperature = float(1.0 / temperature);  // as runtime::inverse_temperature
          sp.top_k = top_k;
          sp.top_p = top_p;
        }
        for (auto& s : batch) s.device_sample = sp;
      }
      std::uniform_real_distribution<double> draw(0.0, 1.0);
      std::vector<std::vector<int32_t>> next(size_t(b), std::vector<int32_t>(1, 0));
      auto step = [&](int pos) {
        for (int i = 0; i < b; ++i) {
          next[size_t(i)][0] = tok(rng);
          batch[size_t(i)].tokens = next[size_t(i)];
          batch[size_t(i)].start_pos = pos;
          if (batch[size_t(i)].device_sample) batch[size_t(i)].device_sample->uniform = draw(rng);
        }
        m->forward(batch, out);
      };
      for (int w = 0; w < 3; ++w) step(context + w);  // warm-up (graph capture)
      // The timed steps are the profiler's range (`ncu --profile-from-start off` sees only them).
      MOESERVE_CUDA_CHECK(cudaProfilerStart());
      const auto s0 = Clock::now();
      for (int s = 0; s < steps; ++s) {
#ifdef MOESERVE_HAVE_CUPTI
        if (timeline) {
          timeline->step("batch " + std::to_string(b), [&] { step(context + 3 + s); });
          continue;
        }
#endif
        step(context + 3 + s);
      }
      const double sec = std::chrono::duration<double>(Clock::now() - s0).count() / steps;
      MOESERVE_CUDA_CHECK(cudaProfilerStop());
      const double distinct = E * (1.0 - std::pow(1.0 - k / E, b));
      const double step_bytes = bytes.dense + bytes.experts * distinct / E +
                                b * (kv_per_token * (context + steps) + state_per_seq);
      const double roof = b / (step_bytes / bw);
      std::printf("%-6d %-10.3f %-12.1f %-12.3f %-14.1f %-10.3f\n", b, sec * 1e3, b / sec, step_bytes / 1e9, roof,
                  (b / sec) / roof);
    }
#ifdef MOESERVE_HAVE_CUPTI
    if (timeline) {
      MOESERVE_CUDA_CHECK(cudaDeviceSynchronize());
      const size_t n = timeline->write_csv(timeline_csv);
      std::printf("kernel timeline: %zu kernels written to %s\n", n, timeline_csv.c_str());
      timeline.reset();
    }
#endif
    std::printf("\n%-10s %-12s %-12s\n", "prefill", "TTFT ms", "tok/s");
    for (int p : prefill_list) {
      std::vector<int32_t> prompt(static_cast<size_t>(p)), table;
      for (auto& t : prompt) t = tok(rng);
      for (int j = 0; j < blocks_per_seq; ++j) table.push_back(j);
      model::SeqStep s;
      s.tokens = prompt;
      s.kv_blocks = table;
      s.state_slot = 0;
      model::StepOutput out;
      m->reset_state(0);
      m->forward(std::span<const model::SeqStep>(&s, 1), out);  // warm-up
      m->reset_state(0);
      const auto s0 = Clock::now();
      m->forward(std::span<const model::SeqStep>(&s, 1), out);
      const double sec = std::chrono::duration<double>(Clock::now() - s0).count();
      std::printf("%-10d %-12.1f %-12.1f\n", p, sec * 1e3, p / sec);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
