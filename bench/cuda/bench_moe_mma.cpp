// moe_routed_experts (CUDA cores) against moe_routed_experts_mma (tensor cores, ops_moe_mma.cu)
// and moe_routed_experts_int (the integer form: dp4a kernels up to 8 tokens, int8 tensor cores above;
// ops_moe_int*.cu) on the same inputs, at the Qwen3.5-122B-A10B routed-expert shape: 256 experts, top-8,
// hidden 3072, moe_intermediate 1024, INT4 GPTQ sym group 128 (random weights on the GPU).
//
//   bench_moe_mma                          (M = 1,8,64,512,1024,2048)
//   bench_moe_mma --m 1024 --iters 50
//   bench_moe_mma --m 1024,8192 --moe-mma-variant 0     (the previous tensor-core kernels, A/B)
//   bench_moe_mma --m 1024,8192 --moe-mma-variant 5     (the GPTQ word form, A/B against 1)
//   bench_moe_mma --m 1024,8192 --moe-mma-variant 7     (the word form, tile size per expert)
//   bench_moe_mma --m 1,8,64 --moe-mma-variant 8        (7 + swapAB tiles at decode sizes: default)
//   bench_moe_mma --m 8192 --paths mma,int               (skip the slow CUDA-core path)
//   bench_moe_mma --m 1,8 --int-decode-max 0             (the integer form's tensor-core kernels at 1-8)
//   bench_moe_mma --m 1024,8192 --paths int --moe-int-wgmma false   (the integer form on mma.sync, A/B)
//
// Timing: two warm-up launches, then --iters launches of each entry point, each between two CUDA
// events with a synchronisation after it; the median is reported. The router logits rotate over
// 8 random sets, so the selected experts change from launch to launch. The weights (1.2 GB) are
// far larger than the L2, so the experts come from HBM as in the model.
//
// Columns: us (median); GB/s = the expected bytes of the distinct selected experts
// (E·(1 − (1 − k/E)^M) experts, each 3·H·I/2 bytes + scales) / t; TFLOP/s = 2·3·H·I·M·k / t (useful
// FLOPs; the tensor-core path executes twice that: hi and lo MMAs); speedup = cores us / mma us; the
// int columns likewise, "int gain" = min(cores, mma) us / int us.
// Roofline references: HBM bandwidth (H200 ~4.8 TB/s) for GB/s, dense bf16 tensor-core peak
// (H200 ~990 TFLOP/s for wgmma, mma.sync reaches part of it, halved by hi/lo) for TFLOP/s.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_linear.h"
#include "backend/cuda/dummy_fill.h"
#include "backend/cuda/ops_moe.h"
#include "bench_util.h"

using namespace moeserve;
using namespace moeserve::cuda;

namespace {

// E stacked GPTQ INT4 sym experts of N x K, group g (random words, scales in [0.001, 0.002)).
DeviceLinear gptq_experts(int E, int N, int K, int g, uint64_t seed, cudaStream_t s) {
  DeviceLinear d;
  d.format = quant::WeightFormat::GptqInt4;
  d.N = N;
  d.K = K;
  d.group_size = g;
  d.sym = true;
  d.qweight = DeviceBuffer<int32_t>(size_t(E) * (K / 8) * N);
  d.scales = DeviceBuffer<__half>(size_t(E) * (K / g) * N);
  d.qzeros = DeviceBuffer<int32_t>(size_t(E) * (K / g) * (N / 8));
  fill_random_words(d.qweight.data(), d.qweight.size(), seed, s);
  fill_uniform_f16(d.scales.data(), d.scales.size(), seed + 1, 0.001f, 0.002f, s);
  fill_constant_words(d.qzeros.data(), d.qzeros.size(), 0x77777777, s);  // stored zero − 1 = 7
  return d;
}


}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moe_routed_experts vs moe_routed_experts_mma vs moe_routed_experts_int (122B-A10B experts, INT4 GPTQ sym g128)"};
  std::string m_list = "1,8,64,512,1024,2048";
  int iters = 20;
  int variant = moe_mma_variant();
  app.add_option("--m", m_list, "token counts, comma-separated");
  app.add_option("--moe-mma-variant", variant,
                 "tensor-core kernel form (0, 1, 5, 7, 8): 1 PRMT dequantisation + 1x8-warp 64-slot tiles, 0 "
                 "previous (same bits); 5 the GPTQ word form (activations k-permuted per 32 k, one weight word per "
                 "thread per two k16 steps; other bits), 7 = 5 with the tile size per expert (64-slot tiles, a "
                 "remainder of <= 32 slots on a 32-slot tile; 5's bits), 8 = 7 with the swapAB GPTQ kernels at "
                 "<= 4 slots per expert (default; 5's bits)");
  app.add_option("--iters", iters, "timed launches per entry point");
  std::string paths = "cores,mma,int";
  app.add_option("--paths", paths, "entry points to time: cores, mma, int (comma-separated)");
  int int_decode_max = moe_int_decode_max_tokens();
  app.add_option("--int-decode-max", int_decode_max,
                 "set_moe_int_decode_max_tokens: the largest step on the integer form's dp4a kernels (0-8)");
  bool int_wgmma = moe_int_wgmma();
  app.add_option("--moe-int-wgmma", int_wgmma,
                 "set_moe_int_wgmma: the integer form's 32- / 64-slot tiles on wgmma (true, default where "
                 "available) or mma.sync (false)");
  CLI11_PARSE(app, argc, argv);
  set_moe_mma_variant(variant);
  set_moe_int_decode_max_tokens(int_decode_max);
  set_moe_int_wgmma(int_wgmma);
  const bool run_cores = paths.find("cores") != std::string::npos, run_mma = paths.find("mma") != std::string::npos,
             run_int = paths.find("int") != std::string::npos;

  const int E = 256, k = 8, H = 3072, I = 1024, g = 128;
  constexpr int kSets = 8;
  cudaStream_t s;
  MOESERVE_CUDA_CHECK(cudaStreamCreate(&s));
  DeviceExperts ex;
  ex.format = quant::WeightFormat::GptqInt4;
  ex.num_experts = E;
  ex.hidden = H;
  ex.intermediate = I;
  ex.group_size = g;
  ex.sym = true;
  ex.gate = gptq_experts(E, I, H, g, 11, s);
  ex.up = gptq_experts(E, I, H, g, 22, s);
  ex.down = gptq_experts(E, H, I, g, 33, s);
  const double per_expert = double(ex.gate.bytes() + ex.up.bytes() + ex.down.bytes()) / E;
  const MoeShape shape{E, k, H, I};
  moe_mma_prepare();  // the shared-memory opt-ins, as the model does at construction

  std::printf("%6s %10s %10s %10s %10s %10s %10s %9s %9s %9s %8s %8s\n", "M", "cores us", "mma us", "int us",
              "cores GB/s", "mma GB/s", "int GB/s", "cores TF/s", "mma TF/s", "int TF/s", "speedup", "int gain");
  for (int M : bench::parse_int_list(m_list)) {
    DeviceBuffer<float> x(size_t(M) * H), logits(size_t(kSets) * M * E), residual(size_t(M) * H);
    fill_uniform_f32(x.data(), x.size(), 100 + M, -1.f, 1.f, s);
    fill_uniform_f32(logits.data(), logits.size(), 200 + M, -2.f, 2.f, s);
    fill_uniform_f32(residual.data(), residual.size(), 300 + M, -1.f, 1.f, s);
    DeviceBuffer<uint8_t> ws(std::max({moe_workspace_bytes(shape, M), moe_mma_workspace_bytes(shape, M),
                                       run_int ? moe_int_workspace_bytes(shape, M) : size_t(0)}));
    const float* lg = logits.data();
    const double nan = std::nan("");
    const double t_cores = !run_cores ? nan : bench::median_event_us(s, iters, [&](int i) {
          moe_routed_experts(x.data(), lg + size_t(i % kSets) * M * E, shape, ex, M, ws.data(), ws.bytes(),
                             residual.data(), s);
        });
    const double t_mma = !run_mma ? nan : bench::median_event_us(s, iters, [&](int i) {
          if (!moe_routed_experts_mma(x.data(), lg + size_t(i % kSets) * M * E, shape, ex, M, ws.data(), ws.bytes(),
                                      residual.data(), s))
            throw Error("moe_routed_experts_mma refused the experts");
        });
    const double t_int = !run_int ? nan : bench::median_event_us(s, iters, [&](int i) {
          if (!moe_routed_experts_int(x.data(), lg + size_t(i % kSets) * M * E, shape, ex, M, ws.data(), ws.bytes(),
                                      residual.data(), s))
            throw Error("moe_routed_experts_int refused the experts");
        });
    const double distinct = E * (1.0 - std::pow(1.0 - double(k) / E, M));
    const double bytes = distinct * per_expert;
    const double flops = 2.0 * 3.0 * H * I * double(M) * k;
    const double best = std::fmin(t_cores, t_mma);  // fmin ignores a NaN (a path not run)
    std::printf("%6d %10.1f %10.1f %10.1f %10.0f %10.0f %10.0f %9.1f %9.1f %9.1f %8.2f %8.2f\n", M, t_cores, t_mma,
                t_int, bytes / (t_cores * 1e3), bytes / (t_mma * 1e3), bytes / (t_int * 1e3), flops / (t_cores * 1e6),
                flops / (t_mma * 1e6), flops / (t_int * 1e6), t_cores / t_mma, best / t_int);
  }
  MOESERVE_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
