// mma_gemm (tensor cores, ops_mma_gemm.h) against quant_gemv (CUDA cores, ops_quant_gemv.h) on
// the same inputs, at the Qwen3.5-122B dense projection shapes.
//
//   bench_mma_gemm                                   (M = 1,16,64,1024,8192; bf16, fp8, int8)
//   bench_mma_gemm --m 64,1024 --formats fp8 --tiling large --csv
//   bench_mma_gemm --m 1024,8192 --formats fp8 --gemv-max-m 0 --gemm-variant 0   (register-staged Large)
//   bench_mma_gemm --m 1024,8192 --formats fp8 --gemv-max-m 0 --tiling wide      (128x256, 64x64 warps)
//   bench_mma_gemm --m 1024,8192 --formats fp8 --gemv-max-m 0 --tiling wgmma256  (sm_90a: wgmma)
//
// Built by bench/CMakeLists.txt (every bench/cuda/*.cpp is a program when MOESERVE_CUDA is on).
// Both kernels get f32 x [M, K] and write f32 y [M, N] (no accumulate), as the model calls them.
//
// Timing: after two warm-up launches, --iters launches of each kernel, each between two CUDA
// events on one stream with a synchronisation after it; the median is reported. The weight
// rotates over enough copies that one rotation is >= --rotate-mb (256 MB by default, several
// times the H200's L2), so every launch reads its weight from HBM as in the model; x and y
// stay the same buffers (they may be L2-resident at small M, as in the model).
//
// Columns: us (median), TFLOP/s = 2·M·N·K / t (useful FLOPs; mma_gemm's tensor cores execute
// twice that: hi and lo MMAs), W GB/s = N·K·(bytes per weight) / t, the same for quant_gemv,
// speedup = gemv us / mma us, and diff = max|y_mma − y_gemv| / max|y_gemv| (both approximate the
// same f32 product; a sanity check, computed for M <= --diff-max-m). Roofline references: dense
// bf16 tensor-core peak (H200 ~990 TFLOP/s for wgmma; mma.sync reaches part of it, and the hi/lo
// split halves the useful ceiling) and the HBM bandwidth (H200 ~4.8 TB/s) for W GB/s.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_linear.h"
#include "backend/cuda/dummy_fill.h"
#include "backend/cuda/ops_mma_gemm.h"
#include "backend/cuda/ops_quant_gemv.h"
#include "bench_util.h"

using namespace moeserve;
using namespace moeserve::cuda;
using quant::WeightFormat;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) v.push_back(item);
  return v;
}

WeightFormat parse_format(const std::string& f) {
  if (f == "bf16") return WeightFormat::Dense;
  if (f == "fp8") return WeightFormat::Fp8Block;
  if (f == "int8") return WeightFormat::Int8Rowwise;
  throw Error("unknown format '" + f + "' (bf16, fp8, int8)");
}

MmaTiling parse_tiling(const std::string& t) {
  if (t == "auto") return MmaTiling::Auto;
  if (t == "small") return MmaTiling::Small;
  if (t == "medium") return MmaTiling::Medium;
  if (t == "large") return MmaTiling::Large;
  if (t == "large-pipelined") return MmaTiling::LargePipelined;
  if (t == "wide") return MmaTiling::Wide;
  if (t == "large-pipelined-2cta") return MmaTiling::LargePipelined2Cta;
  if (t == "wgmma128") return MmaTiling::Wgmma128;
  if (t == "wgmma256") return MmaTiling::Wgmma256;
  throw Error("unknown tiling '" + t +
              "' (auto, small, medium, large, large-pipelined, wide, large-pipelined-2cta, wgmma128, wgmma256)");
}

size_t elem_bytes(WeightFormat f) { return f == WeightFormat::Dense ? 2 : 1; }

// A random [N, K] weight (uniform values of variance ~1/K, as bench_kernels makes them).
DeviceLinear make_weight(int64_t N, int64_t K, WeightFormat fmt, uint64_t seed, cudaStream_t s) {
  DeviceLinear d;
  d.format = fmt;
  d.N = N;
  d.K = K;
  const size_t nk = size_t(N) * size_t(K);
  const float amp = std::sqrt(3.0f / float(K));
  switch (fmt) {
    case WeightFormat::Dense:
      d.dense.resize(nk);
      fill_uniform_bf16(d.dense.data(), nk, seed, amp, s);
      break;
    case WeightFormat::Fp8Block:
      d.fp8.resize(nk);
      fill_uniform_fp8(d.fp8.data(), nk, seed, 2.0f, s);
      d.scale.resize(size_t((N + 127) / 128) * size_t((K + 127) / 128));
      fill_uniform_f32(d.scale.data(), d.scale.size(), seed + 1, 0.3f * amp, 0.9f * amp, s);
      break;
    default:
      d.int8.resize(nk);
      fill_uniform_int8(d.int8.data(), nk, seed, s);
      d.scale.resize(size_t(N));
      fill_uniform_f32(d.scale.data(), d.scale.size(), seed + 1, 0.5f * amp / 127, 1.5f * amp / 127, s);
      break;
  }
  return d;
}

double max_rel_diff(const DeviceBuffer<float>& a, const DeviceBuffer<float>& b, size_t n) {
  std::vector<float> ha(n), hb(n);
  MOESERVE_CUDA_CHECK(cudaMemcpy(ha.data(), a.data(), n * sizeof(float), cudaMemcpyDeviceToHost));
  MOESERVE_CUDA_CHECK(cudaMemcpy(hb.data(), b.data(), n * sizeof(float), cudaMemcpyDeviceToHost));
  double d = 0, r = 0;
  for (size_t i = 0; i < n; ++i) {
    d = std::max(d, std::abs(double(ha[i]) - double(hb[i])));
    r = std::max(r, std::abs(double(hb[i])));
  }
  return r > 0 ? d / r : d;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mma_gemm (tensor cores) vs quant_gemv (CUDA cores) at the 122B dense projection shapes"};
  std::string ms_arg = "1,16,64,1024,8192", formats_arg = "bf16,fp8,int8", shapes_arg, tiling_arg = "auto";
  int iters = 20, gemv_max_m = 8192, diff_max_m = 1024, gemm_variant = mma_gemm_variant();
  double rotate_mb = 256;
  bool csv = false;
  app.add_option("--m", ms_arg, "rows of x (tokens), comma-separated");
  app.add_option("--formats", formats_arg, "weight formats: bf16, fp8, int8");
  app.add_option("--shapes", shapes_arg, "NxK list, e.g. 16384x3072,3072x8192 (default: the 122B projections)");
  app.add_option("--tiling", tiling_arg,
                 "mma_gemm tiling: auto, small, medium, large, large-pipelined, wide, large-pipelined-2cta, wgmma128, "
                 "wgmma256");
  app.add_option("--gemm-variant", gemm_variant,
                 "the kernel of auto's large tiling: 4 wgmma on sm_90a GPUs (default; elsewhere 3), 3 pipelined "
                 "128x128 at 2 CTAs per SM, 2 pipelined 128x256 where it fills the SMs, else 128x128, 1 pipelined "
                 "128x128, 0 register-staged 128x128");
  int wgmma_overlap = mma_gemm_wgmma_overlap();
  app.add_option("--wgmma-overlap", wgmma_overlap,
                 "wgmma tilings: keep one group of MMAs in flight per warpgroup (1) or wait for each (0); 2 (default) "
                 "by weight kind (bf16 1, FP8 / INT8 0)");
  app.add_option("--iters", iters, "timed launches per kernel and shape (median reported)");
  app.add_option("--gemv-max-m", gemv_max_m, "time quant_gemv only up to this M (it is slow at large M)");
  app.add_option("--diff-max-m", diff_max_m, "compare the two outputs only up to this M");
  app.add_option("--rotate-mb", rotate_mb, "distinct weight data each shape rotates over (MB), to defeat the L2");
  app.add_flag("--csv", csv, "CSV output");
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    std::vector<int> ms;
    for (const auto& m : split(ms_arg)) ms.push_back(std::stoi(m));
    std::vector<WeightFormat> formats;
    for (const auto& f : split(formats_arg)) formats.push_back(parse_format(f));
    std::vector<std::pair<int64_t, int64_t>> shapes = {{16384, 3072}, {3072, 8192}, {12288, 3072}, {1024, 3072}};
    if (!shapes_arg.empty()) {
      shapes.clear();
      for (const auto& s : split(shapes_arg)) {
        const size_t x = s.find('x');
        if (x == std::string::npos) throw Error("--shapes: expected NxK, got '" + s + "'");
        shapes.emplace_back(std::stoll(s.substr(0, x)), std::stoll(s.substr(x + 1)));
      }
    }
    const MmaTiling tiling = parse_tiling(tiling_arg);
    set_mma_gemm_variant(gemm_variant);
    set_mma_gemm_wgmma_overlap(wgmma_overlap);
    iters = std::max(iters, 1);
    if (ms.empty() || formats.empty()) throw Error("nothing to run");

    MOESERVE_CUDA_CHECK(cudaSetDevice(0));
    cudaDeviceProp prop{};
    MOESERVE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf(
        "%s%s, %d SMs, L2 %.0f MB; mma_gemm tiling %s, variant %d; median of %d launches; weights rotated over >= "
        "%.0f MB\n",
        csv ? "# " : "", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6, tiling_arg.c_str(), gemm_variant,
        iters, rotate_mb);
    if (csv)
      std::printf("format,N,K,M,mma_us,mma_tflops,mma_w_gbs,gemv_us,gemv_tflops,gemv_w_gbs,speedup,diff\n");
    else
      std::printf("%-5s %6s %6s %6s | %10s %9s %9s | %10s %9s %9s | %8s %9s\n", "fmt", "N", "K", "M", "mma us",
                  "TFLOP/s", "W GB/s", "gemv us", "TFLOP/s", "W GB/s", "speedup", "diff");

    cudaStream_t s;
    MOESERVE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int max_m = *std::max_element(ms.begin(), ms.end());
    int64_t max_k = 0, max_n = 0;
    for (auto [N, K] : shapes) max_k = std::max(max_k, K), max_n = std::max(max_n, N);
    DeviceBuffer<float> x(size_t(max_m) * size_t(max_k));
    fill_uniform_f32(x.data(), x.size(), 7, -1.0f, 1.0f, s);
    DeviceBuffer<float> y_mma(size_t(max_m) * size_t(max_n)), y_gemv(size_t(max_m) * size_t(max_n));

    uint64_t seed = 100;
    for (WeightFormat fmt : formats) {
      const char* fname = fmt == WeightFormat::Dense ? "bf16" : fmt == WeightFormat::Fp8Block ? "fp8" : "int8";
      for (auto [N, K] : shapes) {
        const double wbytes = double(N) * double(K) * double(elem_bytes(fmt));
        const int copies = int(std::clamp(std::ceil(rotate_mb * 1e6 / wbytes), 1.0, 64.0));
        std::vector<DeviceLinear> ws;
        for (int c = 0; c < copies; ++c) ws.push_back(make_weight(N, K, fmt, seed += 2, s));
        MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s));
        if (!mma_gemm_supported(ws[0])) {
          std::printf("%s N=%lld K=%lld: not supported by mma_gemm\n", fname, (long long)N, (long long)K);
          continue;
        }
        for (int M : ms) {
          const double flops = 2.0 * double(M) * double(N) * double(K);
          const double t_mma = bench::median_event_us(s, iters, [&](int i) {
            mma_gemm(x.data(), M, ws[size_t(i) % ws.size()], y_mma.data(), false, s, tiling);
          });
          double t_gemv = std::nan(""), diff = std::nan("");
          if (M <= gemv_max_m) {
            t_gemv = bench::median_event_us(s, iters, [&](int i) {
              quant_gemv(x.data(), M, ws[size_t(i) % ws.size()], y_gemv.data(), /*y_f32=*/true, false, s);
            });
            if (M <= diff_max_m) {  // both kernels on the first weight copy
              const DeviceLinear& w = ws[0];
              mma_gemm(x.data(), M, w, y_mma.data(), false, s, tiling);
              quant_gemv(x.data(), M, w, y_gemv.data(), true, false, s);
              MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s));
              diff = max_rel_diff(y_mma, y_gemv, size_t(M) * size_t(N));
            }
          }
          const double tf_mma = flops / (t_mma * 1e-6) / 1e12, gb_mma = wbytes / (t_mma * 1e-6) / 1e9;
          const double tf_gemv = flops / (t_gemv * 1e-6) / 1e12, gb_gemv = wbytes / (t_gemv * 1e-6) / 1e9;
          if (csv)
            std::printf("%s,%lld,%lld,%d,%.2f,%.2f,%.1f,%.2f,%.2f,%.1f,%.3f,%.3e\n", fname, (long long)N, (long long)K,
                        M, t_mma, tf_mma, gb_mma, t_gemv, tf_gemv, gb_gemv, t_gemv / t_mma, diff);
          else
            std::printf("%-5s %6lld %6lld %6d | %10.2f %9.2f %9.1f | %10.2f %9.2f %9.1f | %8.3f %9.2e\n", fname,
                        (long long)N, (long long)K, M, t_mma, tf_mma, gb_mma, t_gemv, tf_gemv, gb_gemv, t_gemv / t_mma,
                        diff);
        }
      }
    }
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
