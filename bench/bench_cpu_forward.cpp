// CPU reference throughput: prefill and decode tokens/s of a small model, and the linear
// kernel's achieved GFLOP/s and weight GB/s (the decode roofline is weight bandwidth).
//
//   bench_cpu_forward [--model DIR] [--threads N] [google-benchmark flags]
// DIR defaults to the quant_base_bf16 transformers fixture (H=128, 5 layers, 8 experts).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "backend/cpu/linear.h"
#include "model/qwen35_cpu.h"
#include "model/sequence_runner.h"

namespace {

std::string g_model_dir = std::string(MOESERVE_SOURCE_DIR) + "/tests/fixtures/qwen35/quant_base_bf16";
int g_threads = 0;

moeserve::model::Qwen35CpuModel& model() {
  static auto m = moeserve::model::Qwen35CpuModel::load(g_model_dir, {g_threads, 16, false});
  return *m;
}

std::vector<int32_t> tokens(int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t((i * 7919) % model().config().vocab_size);
  return t;
}

void BM_Prefill(benchmark::State& state) {
  const int64_t T = state.range(0);
  const auto ids = tokens(T);
  for (auto _ : state) {
    moeserve::model::SequenceRunner runner(model(), T);
    benchmark::DoNotOptimize(runner.append(ids, T, false));
  }
  state.counters["tok/s"] = benchmark::Counter(double(T * state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Prefill)->Arg(64)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Decode(benchmark::State& state) {
  const int64_t context = state.range(0), room = context + 4096;
  const auto ids = tokens(room);
  auto runner = std::make_unique<moeserve::model::SequenceRunner>(model(), room);
  runner->append(std::span(ids.data(), size_t(context)), context, false);
  for (auto _ : state) {
    if (runner->length() == room) {  // out of room: start over (not timed)
      state.PauseTiming();
      runner = std::make_unique<moeserve::model::SequenceRunner>(model(), room);
      runner->append(std::span(ids.data(), size_t(context)), context, false);
      state.ResumeTiming();
    }
    benchmark::DoNotOptimize(runner->append(std::span(ids.data() + runner->length(), 1), 1, false));
  }
  state.counters["tok/s"] = benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Decode)->Arg(16)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

// Y[M, N] = X[M, K] Wᵀ with a BF16 W: FLOP/s, and W bytes/s (what bounds decode).
void BM_LinearBf16(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  std::mt19937 gen(1);
  std::normal_distribution<float> dist;
  moeserve::Tensor w = moeserve::Tensor::empty(moeserve::DType::BF16, {N, K});
  for (int64_t i = 0; i < N * K; ++i) w.data<uint16_t>()[i] = moeserve::f32_to_bf16(dist(gen));
  const auto qw = moeserve::quant::dense_weight(w, "bench");
  std::vector<float> x(size_t(M * K)), y(size_t(M * N));
  for (auto& v : x) v = dist(gen);
  moeserve::ThreadPool pool(g_threads);
  for (auto _ : state) {
    moeserve::cpu::linear(pool, x.data(), M, qw, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * double(M * N * K) * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
  state.counters["W_GB/s"] =
      benchmark::Counter(double(N * K * 2) * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_LinearBf16)->Args({1, 4096, 4096})->Args({64, 4096, 4096})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--model") && i + 1 < argc)
      g_model_dir = argv[++i];
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      g_threads = std::atoi(argv[++i]);
    else
      rest.push_back(argv[i]);
  }
  int n = int(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
