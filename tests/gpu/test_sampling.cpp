// The GPU sampler (src/backend/cuda/ops_sampling.h) against runtime::Sampler, the reference
// for the device-sampling contract (model::DeviceSampleParams): many random logits rows at
// the real vocabulary size and at odd sizes, every combination of temperature, top_k, top_p
// and min_p, ties, -inf and NaN logits, masked tokens. Tokens must be equal except where the
// draw or the top_p target lies within a hair of a cumulative-weight boundary (the sums are
// taken in a different order on the two sides); those cases are recognised by re-running the
// host sampler with the draw or top_p nudged, counted, and required to be rare.
// Run on a GPU machine: ctest -L gpu (skipped where no GPU is visible).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "../unit/model/fixture_util.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/device_sampler.h"
#include "backend/cuda/qwen35_cuda.h"
#include "runtime/sampler.h"

using namespace moeserve;

namespace {

bool have_gpu() { return !cuda::list_devices().empty(); }

constexpr float kInf = std::numeric_limits<float>::infinity();

// A logits row of one of several shapes.
std::vector<float> make_row(int64_t vocab, int kind, std::mt19937_64& gen) {
  std::vector<float> row(static_cast<size_t>(vocab));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  switch (kind % 6) {
    case 0:  // LLM-like: a few strong tokens over a broad tail
      for (auto& x : row) x = 2.5f * normal(gen);
      for (int i = 0; i < 5; ++i) row[size_t(gen() % uint64_t(vocab))] += 12.0f + 2.0f * normal(gen);
      break;
    case 1:  // flat
      for (auto& x : row) x = uniform(gen);
      break;
    case 2:  // coarse values: many exact ties
      for (auto& x : row) x = std::round(uniform(gen) * 2.0f) / 2.0f;
      break;
    case 3:  // -inf and NaN sprinkled over a peaked row
      for (auto& x : row) {
        const auto r = gen() % 10;
        x = r == 0 ? -kInf : r == 1 ? std::numeric_limits<float>::quiet_NaN() : 4.0f * normal(gen);
      }
      break;
    case 4:  // everything equal
      for (auto& x : row) x = 1.25f;
      break;
    default:  // almost everything masked: a handful of finite logits
      for (auto& x : row) x = -kInf;
      for (int i = 0; i < 7; ++i) row[size_t(gen() % uint64_t(vocab))] = normal(gen);
      break;
  }
  return row;
}

struct Case {
  model::DeviceSampleParams params;
  std::vector<int32_t> masked;
};

Case make_case(int64_t vocab, const std::vector<float>& row, std::mt19937_64& gen) {
  static const double kTemps[] = {0.0, 0.3, 0.7, 1.0, 1.6};
  static const int kTopK[] = {-1, -1, 1, 5, 20, 50, 1000, 5000};
  static const double kTopP[] = {1.0, 1.0, 0.95, 0.8, 0.5, 0.1};
  static const double kMinP[] = {0.0, 0.0, 0.0, 0.05, 0.2};
  static const int kLogprobs[] = {-1, -1, 0, 5, 20};
  Case c;
  const double temp = kTemps[gen() % 5];
  c.params.greedy = temp < 1e-5;
  c.params.inv_temperature = runtime::inverse_temperature(temp > 0 ? temp : 1.0);
  c.params.top_k = kTopK[gen() % 8];
  c.params.top_p = kTopP[gen() % 6];
  c.params.min_log_ratio = runtime::min_p_log_ratio(kMinP[gen() % 5]);
  c.params.num_logprobs = kLogprobs[gen() % 5];
  c.params.uniform = double(gen() >> 11) * 0x1.0p-53;
  if (gen() % 4 == 0) {  // hold back the best token and a few others (min_tokens)
    c.masked.push_back(int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
    for (int i = 0; i < 3; ++i) c.masked.push_back(int32_t(gen() % uint64_t(vocab)));
    std::sort(c.masked.begin(), c.masked.end());
    c.masked.erase(std::unique(c.masked.begin(), c.masked.end()), c.masked.end());
  }
  return c;
}

// Samples `rows` on the GPU through DeviceRowSampler (the model's path).
std::vector<model::DeviceSampleResult> device_sample(const std::vector<std::vector<float>>& rows,
                                                     const std::vector<Case>& cases, cudaStream_t stream) {
  const size_t n = rows.size();
  const int64_t vocab = int64_t(rows[0].size());
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  cuda::DeviceBuffer<float> logits(flat.size());
  logits.upload(flat.data(), flat.size(), stream);
  std::vector<model::SeqStep> batch(n);
  std::vector<cuda::LogitRowTarget> targets(n);
  for (size_t i = 0; i < n; ++i) {
    batch[i].device_sample = cases[i].params;
    batch[i].device_sample->masked_tokens = cases[i].masked;
    targets[i] = {i, -1};
  }
  cuda::DeviceRowSampler sampler(int(n), vocab);
  model::StepOutput out;
  out.samples.resize(n);
  sampler.finish(logits.data(), targets, batch, nullptr, out, stream);
  return out.samples;
}

// runtime::Sampler on the contract; token -1 where it finds nothing to choose.
runtime::SampleResult host_sample(runtime::Sampler& s, const std::vector<float>& row, const model::DeviceSampleParams& p) {
  try {
    return s.sample_row(row, p);
  } catch (const Error&) {
    runtime::SampleResult r;
    r.token = -1;
    return r;
  }
}

// Whether `token` is what the host picks with the draw or the top_p target moved by a hair:
// the device sums the same weights in another order (and its expf may differ from the host's
// by an ulp), so its cumulative boundaries may sit ~1e-7 (relative) away from the host's. With
// hundreds of thousands of kept tokens the boundaries are ~4e-6 apart, hence the fine steps.
bool near_boundary(runtime::Sampler& s, const std::vector<float>& row, model::DeviceSampleParams p, int32_t token) {
  for (double dp : {0.0, -1e-6, 1e-6, -1e-5, 1e-5}) {
    if (dp != 0.0 && p.top_p >= 1.0) break;
    for (int k = 0; k <= 10; ++k)
      for (int sign : {1, -1}) {
        model::DeviceSampleParams q = p;
        q.uniform = std::clamp(p.uniform + sign * k * 2e-7, 0.0, std::nextafter(1.0, 0.0));
        if (p.top_p < 1.0) q.top_p = std::min(1.0, p.top_p * (1.0 + dp));
        if (host_sample(s, row, q).token == token) return true;
      }
  }
  return false;
}

struct Tally {
  int rows = 0, exact = 0, boundary = 0;
};

void check_rows(int64_t vocab, int num_rows, uint64_t seed, Tally& tally, cudaStream_t stream) {
  std::mt19937_64 gen(seed);
  std::vector<std::vector<float>> rows;
  std::vector<Case> cases;
  for (int i = 0; i < num_rows; ++i) {
    rows.push_back(make_row(vocab, i, gen));
    cases.push_back(make_case(vocab, rows.back(), gen));
  }
  const auto got = device_sample(rows, cases, stream);
  runtime::Sampler sampler;
  for (int i = 0; i < num_rows; ++i) {
    model::DeviceSampleParams p = cases[size_t(i)].params;
    p.masked_tokens = cases[size_t(i)].masked;
    const auto want = host_sample(sampler, rows[size_t(i)], p);
    const auto& g = got[size_t(i)];
    const std::string where = "vocab " + std::to_string(vocab) + " row " + std::to_string(i) + " kind " +
                              std::to_string(i % 6) + (p.greedy ? " greedy" : "") + " top_k " +
                              std::to_string(p.top_k) + " top_p " + std::to_string(p.top_p) + " min_log_ratio " +
                              std::to_string(p.min_log_ratio) + " inv_t " + std::to_string(p.inv_temperature) +
                              " u " + std::to_string(p.uniform);
    ++tally.rows;
    if (g.token == want.token) {
      ++tally.exact;
    } else {
      ASSERT_FALSE(p.greedy) << where << ": greedy must agree exactly, device " << g.token << " host " << want.token;
      ASSERT_TRUE(g.token >= 0 && near_boundary(sampler, rows[size_t(i)], p, g.token))
          << where << ": device " << g.token << " host " << want.token;
      ++tally.boundary;
      continue;
    }
    if (p.num_logprobs < 0 || want.token < 0) continue;
    ASSERT_TRUE(want.logprob.has_value());
    const auto& lp = *want.logprob;
    auto close = [](float a, float b) {
      if (std::isinf(a) || std::isinf(b)) return a == b;
      return std::fabs(a - b) <= 2e-4f + 2e-5f * std::fabs(b);
    };
    EXPECT_TRUE(close(g.logprob, lp.logprob)) << where << ": logprob " << g.logprob << " vs " << lp.logprob;
    ASSERT_EQ(g.top.size(), lp.top.size()) << where;
    for (size_t j = 0; j < lp.top.size(); ++j) {
      EXPECT_EQ(g.top[j].first, lp.top[j].first) << where << " top " << j;
      EXPECT_TRUE(close(g.top[j].second, lp.top[j].second))
          << where << " top " << j << ": " << g.top[j].second << " vs " << lp.top[j].second;
    }
  }
}

class GpuSampling : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    MOESERVE_CUDA_CHECK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(GpuSampling, MatchesTheHostSamplerAtTheQwenVocabulary) {
  Tally t;
  for (uint64_t seed = 1; seed <= 6; ++seed) check_rows(248320, 96, seed, t, stream_);
  std::printf("vocab 248320: %d rows, %d exact, %d at a boundary\n", t.rows, t.exact, t.boundary);
  EXPECT_LE(t.boundary * 20, t.rows) << "more than 5% of the draws needed the boundary allowance";
}

TEST_F(GpuSampling, MatchesTheHostSamplerAtOddSizes) {
  Tally t;
  for (int64_t vocab : {1, 2, 3, 7, 31, 33, 100, 513, 2047, 2049, 4099, 65537, 151936})
    check_rows(vocab, 48, uint64_t(vocab) * 7 + 3, t, stream_);
  std::printf("odd sizes: %d rows, %d exact, %d at a boundary\n", t.rows, t.exact, t.boundary);
  EXPECT_LE(t.boundary * 20, t.rows);
}

// Sampled rows are decided from the slices' candidate lists when their cuts fall inside the lists'
// complete prefix, else by the one-block passes; both give the same token. Each row is sampled with
// the lists allowed and with the passes forced (set_sampling_from_slices(false)); which way decided
// it is reported per row (SampleRowResult::decided_by).
TEST_F(GpuSampling, SliceListsDecideTheUsualRowsWithThePassesTokens) {
  const int64_t vocab = 248320;
  struct Setting {
    int top_k;
    double top_p;
    double temperature;
  };
  // Qwen's defaults; top_p only; top_k only; no cut at all; a top_k past the lists; a top_p that
  // keeps half of a flat row.
  const Setting settings[] = {{20, 0.95, 0.7}, {-1, 0.8, 0.6}, {50, 1.0, 1.0}, {-1, 1.0, 1.0},
                              {1000, 1.0, 1.0}, {-1, 0.5, 1.0}};
  constexpr int kSettings = int(sizeof(settings) / sizeof(settings[0]));
  std::mt19937_64 gen(21);
  std::vector<float> flat;
  std::vector<cuda::SampleRowParams> params;
  std::vector<int> kinds;
  for (int kind = 0; kind < 6; ++kind)
    for (int rep = 0; rep < 4; ++rep) {
      const auto row = make_row(vocab, kind, gen);
      for (int si = 0; si < kSettings; ++si) {
        const Setting& st = settings[si];
        cuda::SampleRowParams q;
        q.row = int32_t(params.size());
        q.greedy = 0;
        q.inv_temperature = runtime::inverse_temperature(st.temperature);
        q.min_log_ratio = runtime::min_p_log_ratio(rep == 3 ? 0.05 : 0.0);
        q.top_k = st.top_k;
        q.top_p = st.top_p;
        q.uniform = double(gen() >> 11) * 0x1.0p-53;
        if (rep == 2) {  // the best token held back
          q.num_masked = 1;
          q.masked[0] = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
        }
        params.push_back(q);
        kinds.push_back(kind * 100 + si);
        flat.insert(flat.end(), row.begin(), row.end());
      }
    }
  const int n = int(params.size());
  cuda::DeviceBuffer<float> logits(flat.size());
  logits.upload(flat.data(), flat.size(), stream_);
  cuda::DeviceBuffer<cuda::SampleRowParams> dparams(static_cast<size_t>(n));
  dparams.upload(params.data(), params.size(), stream_);
  cuda::DeviceBuffer<cuda::SampleRowResult> results(static_cast<size_t>(n));
  cuda::DeviceBuffer<cuda::SampleRowScratch> scratch(static_cast<size_t>(n));
  // Rows [first, first + count) in one call: the slices per row depend on the rows of the call (64 for
  // one row, 2 for all 144).
  auto run = [&](bool slices, int first, int count, std::vector<cuda::SampleRowResult>& into) {
    cuda::set_sampling_from_slices(slices);
    cuda::sample_rows(logits.data(), vocab, dparams.data() + first, count, results.data() + first,
                      scratch.data() + first, true, false, stream_);
    cuda::set_sampling_from_slices(true);
    into.resize(static_cast<size_t>(n));
    MOESERVE_CUDA_CHECK(cudaMemcpyAsync(into.data() + first, results.data() + first, size_t(count) * sizeof(into[0]),
                                        cudaMemcpyDeviceToHost, stream_));
    MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  };
  std::vector<cuda::SampleRowResult> passes, together, alone;
  run(false, 0, n, passes);
  run(true, 0, n, together);
  for (int i = 0; i < n; ++i) run(true, i, 1, alone);
  int by_lists = 0, by_lists_together = 0;
  for (int i = 0; i < n; ++i) {
    const int kind = kinds[size_t(i)] / 100, si = kinds[size_t(i)] % 100;
    SCOPED_TRACE("row " + std::to_string(i) + " kind " + std::to_string(kind) + " setting " + std::to_string(si));
    EXPECT_EQ(alone[size_t(i)].token, passes[size_t(i)].token);
    EXPECT_EQ(together[size_t(i)].token, passes[size_t(i)].token);
    EXPECT_EQ(passes[size_t(i)].decided_by, 2);
    by_lists += alone[size_t(i)].decided_by == 1;
    by_lists_together += together[size_t(i)].decided_by == 1;
    // A row alone (64 slices): LLM-like rows with top_k 20 / 50 and with no cut are always decided by the
    // lists (the draw without a cut goes through the slices' weights); everything-equal rows with a top_k
    // cut never are (the tie group of the k-th token runs past every list).
    if (kind == 0 && (si == 0 || si == 2 || si == 3)) EXPECT_EQ(alone[size_t(i)].decided_by, 1);
    if (kind == 4 && (si == 0 || si == 2 || si == 4)) EXPECT_EQ(alone[size_t(i)].decided_by, 2);
  }
  std::printf("slice lists decided %d of %d sampled rows alone, %d in one call of all\n", by_lists, n,
              by_lists_together);
  EXPECT_GT(by_lists, n / 3);
  EXPECT_LT(by_lists, n);
}

TEST_F(GpuSampling, FailsLikeTheHostWhenNothingIsLeft) {
  const int64_t vocab = 1000;
  std::vector<std::vector<float>> rows;
  std::vector<Case> cases;
  // All NaN; all -inf; everything masked; +inf (no finite weights), greedy and sampled.
  for (int greedy = 0; greedy < 2; ++greedy) {
    Case c;
    c.params.greedy = greedy == 1;
    c.params.inv_temperature = 1.0f;
    rows.push_back(std::vector<float>(size_t(vocab), std::numeric_limits<float>::quiet_NaN()));
    cases.push_back(c);
    rows.push_back(std::vector<float>(size_t(vocab), -kInf));
    cases.push_back(c);
    std::vector<float> two(size_t(vocab), -kInf);
    two[3] = 1.0f;
    two[999] = 2.0f;
    rows.push_back(two);
    Case masked = c;
    masked.masked = {3, 999};
    cases.push_back(masked);
  }
  Case inf;
  inf.params.greedy = false;
  std::vector<float> with_inf(size_t(vocab), 0.5f);
  with_inf[10] = kInf;
  rows.push_back(with_inf);
  cases.push_back(inf);
  const auto got = device_sample(rows, cases, stream_);
  runtime::Sampler sampler;
  for (size_t i = 0; i < rows.size(); ++i) {
    model::DeviceSampleParams p = cases[i].params;
    p.masked_tokens = cases[i].masked;
    EXPECT_EQ(host_sample(sampler, rows[i], p).token, -1) << "row " << i;
    EXPECT_EQ(got[i].token, -1) << "row " << i;
  }
}

TEST_F(GpuSampling, IsDeterministic) {
  std::mt19937_64 gen(42);
  std::vector<std::vector<float>> rows;
  std::vector<Case> cases;
  for (int i = 0; i < 64; ++i) {
    rows.push_back(make_row(248320, i, gen));
    cases.push_back(make_case(248320, rows.back(), gen));
  }
  const auto a = device_sample(rows, cases, stream_);
  const auto b = device_sample(rows, cases, stream_);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(a[i].token, b[i].token);
    EXPECT_EQ(a[i].logprob, b[i].logprob);
    EXPECT_EQ(a[i].top, b[i].top);
  }
}

// The seeded path end to end: Sampler::sample with the request's RNG, against
// to_device_sample (which draws from a copy of that RNG) and the kernel. Same tokens (up to
// boundaries), and the two RNGs end in the same state.
TEST_F(GpuSampling, SeededRequestsGiveTheHostTokensAndKeepTheRngStream) {
  const int64_t vocab = 248320;
  std::mt19937_64 gen(7);
  runtime::SamplingParams sp;
  sp.temperature = 0.7;
  sp.top_k = 20;
  sp.top_p = 0.95;
  sp.logprobs = 3;
  runtime::Rng host_rng(1234), device_rng(1234);
  runtime::Sampler sampler;
  int boundary = 0;
  for (int step = 0; step < 64; ++step) {
    const auto row = make_row(vocab, 0, gen);
    runtime::SampleInput in;
    in.logits = row;
    in.params = &sp;
    in.rng = &host_rng;
    const auto want = sampler.sample(in);
    in.rng = &device_rng;
    std::vector<int32_t> masked;
    const auto p = runtime::to_device_sample(in, vocab, masked);
    ASSERT_TRUE(p.has_value());
    Case c{*p, masked};
    const auto got = device_sample({row}, {c}, stream_);
    if (got[0].token != want.token) {
      ASSERT_TRUE(near_boundary(sampler, row, *p, got[0].token)) << "step " << step;
      ++boundary;
    }
    EXPECT_EQ(host_rng.next_u64(), device_rng.next_u64()) << "step " << step;
  }
  EXPECT_LE(boundary, 2);
}

TEST_F(GpuSampling, HostRowsAreCopiedNextToDeviceRows) {
  const int64_t vocab = 4099;
  std::mt19937_64 gen(5);
  std::vector<float> flat;
  std::vector<std::vector<float>> rows;
  for (int i = 0; i < 5; ++i) {
    rows.push_back(make_row(vocab, 0, gen));
    flat.insert(flat.end(), rows.back().begin(), rows.back().end());
  }
  cuda::DeviceBuffer<float> logits(flat.size());
  logits.upload(flat.data(), flat.size(), stream_);
  // Rows 0, 2, 3 are host rows (out rows 1, 0, 2); rows 1 and 4 are sampled (greedy).
  std::vector<model::SeqStep> batch(5);
  batch[1].device_sample = model::DeviceSampleParams{};
  batch[4].device_sample = model::DeviceSampleParams{};
  const std::vector<cuda::LogitRowTarget> targets = {{0, 1}, {1, -1}, {2, 0}, {3, 2}, {4, -1}};
  float* staging = nullptr;
  MOESERVE_CUDA_CHECK(cudaMallocHost(&staging, flat.size() * sizeof(float)));
  model::StepOutput out;
  out.logits.assign(size_t(3 * vocab), 0.0f);
  out.samples.resize(5);
  cuda::DeviceRowSampler sampler(5, vocab);
  sampler.finish(logits.data(), targets, batch, staging, out, stream_);
  cudaFreeHost(staging);
  auto out_row = [&](int r) { return std::vector<float>(out.logits.begin() + r * vocab, out.logits.begin() + (r + 1) * vocab); };
  EXPECT_EQ(out_row(1), rows[0]);
  EXPECT_EQ(out_row(0), rows[2]);
  EXPECT_EQ(out_row(2), rows[3]);
  for (int r : {1, 4})
    EXPECT_EQ(out.samples[size_t(r)].token, std::max_element(rows[size_t(r)].begin(), rows[size_t(r)].end()) -
                                                rows[size_t(r)].begin());
}

// The model's hook: each step runs twice from the same caches (the GDN slots restored in
// between), once with device sampling for three of four sequences and once returning every
// row's logits. The device's tokens must be the host sampler's on those logits, the host
// row must be unchanged, on the prefill step and on decode steps (CUDA graphs).
TEST_F(GpuSampling, TheModelSamplesOnTheDeviceWhatTheHostSamplesFromItsLogits) {
  const auto names = model::testing::fixture_names();
  ASSERT_FALSE(names.empty());
  const std::string name = std::find(names.begin(), names.end(), "quant_base_bf16") != names.end() ? "quant_base_bf16" : names.front();
  cuda::CudaModelOptions o;
  o.max_tokens_per_step = 64;
  o.max_seqs = 8;
  o.max_graph_batch = 8;
  o.max_model_len = 256;
  o.lm_head_chunk_rows = 4;
  auto m = cuda::Qwen35CudaModel::load(model::testing::fixture_dir(name), o);
  const int64_t vocab = m->config().vocab_size;
  const int bs = m->cache_geometry().kv_block_size;
  const int S = 4, per_seq = 256 / bs;
  m->allocate_caches(S * per_seq, 2 * S);
  std::vector<std::vector<int32_t>> tables(S), seqs(S);
  std::vector<int64_t> pos(S, 0);
  for (int i = 0; i < S; ++i) {
    for (int b = 0; b < per_seq; ++b) tables[size_t(i)].push_back(i * per_seq + b);
    m->reset_state(i);
    for (int t = 0; t < 9 + 3 * i; ++t) seqs[size_t(i)].push_back(int32_t((t * 37 + i * 101 + 5) % vocab));
  }
  std::vector<model::DeviceSampleParams> params(3);
  params[1].greedy = false;
  params[1].inv_temperature = runtime::inverse_temperature(0.8);
  params[1].top_k = 20;
  params[1].top_p = 0.9;
  params[1].num_logprobs = 3;
  params[2].greedy = false;
  params[2].inv_temperature = runtime::inverse_temperature(1.1);
  params[2].min_log_ratio = runtime::min_p_log_ratio(0.05);
  const std::vector<int32_t> masked = {0, 1};
  params[2].masked_tokens = masked;
  runtime::Rng rng(77);
  runtime::Sampler sampler;
  int boundary = 0;
  for (int step = 0; step < 10; ++step) {
    params[1].uniform = rng.uniform();
    params[2].uniform = rng.uniform();
    std::vector<std::vector<int32_t>> fed(S);
    std::vector<model::SeqStep> batch(S);
    for (int i = 0; i < S; ++i) {
      fed[size_t(i)] = step == 0 ? seqs[size_t(i)] : std::vector<int32_t>{seqs[size_t(i)].back()};
      batch[size_t(i)].tokens = fed[size_t(i)];
      batch[size_t(i)].start_pos = pos[size_t(i)];
      batch[size_t(i)].kv_blocks = tables[size_t(i)];
      batch[size_t(i)].state_slot = i;
    }
    for (int i = 0; i < S; ++i) m->copy_state(i, S + i);
    for (int i = 0; i < 3; ++i) batch[size_t(i)].device_sample = params[size_t(i)];
    model::StepOutput dev;
    m->forward(batch, dev);
    for (int i = 0; i < S; ++i) m->copy_state(S + i, i);
    for (auto& b : batch) b.device_sample.reset();
    model::StepOutput host;
    m->forward(batch, host);

    ASSERT_EQ(dev.samples.size(), size_t(S));
    ASSERT_EQ(dev.logits.size(), size_t(vocab));  // only the host row came back
    EXPECT_EQ(dev.num_rows, (std::vector<int64_t>{0, 0, 0, 1}));
    auto host_row = [&](int i) {
      return std::vector<float>(host.logits.begin() + host.first_row[size_t(i)] * vocab,
                                host.logits.begin() + (host.first_row[size_t(i)] + 1) * vocab);
    };
    EXPECT_EQ(dev.logits, host_row(3)) << "step " << step;
    for (int i = 0; i < 3; ++i) {
      const auto row = host_row(i);
      const auto want = host_sample(sampler, row, params[size_t(i)]);
      const auto& got = dev.samples[size_t(i)];
      if (got.token != want.token) {
        ASSERT_TRUE(!params[size_t(i)].greedy && near_boundary(sampler, row, params[size_t(i)], got.token))
            << "step " << step << " sequence " << i << ": device " << got.token << " host " << want.token;
        ++boundary;
        continue;
      }
      if (want.logprob) {
        EXPECT_NEAR(got.logprob, want.logprob->logprob, 2e-4);
        ASSERT_EQ(got.top.size(), want.logprob->top.size());
        for (size_t j = 0; j < got.top.size(); ++j) EXPECT_EQ(got.top[j].first, want.logprob->top[j].first);
      }
    }
    for (int i = 0; i < S; ++i) {
      pos[size_t(i)] += int64_t(fed[size_t(i)].size());
      const auto row = host_row(i);
      seqs[size_t(i)].push_back(i < 3 ? dev.samples[size_t(i)].token
                                      : int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
    }
  }
  EXPECT_LE(boundary, 1);
}

// Not a check: what a step pays for sampling on the device, against copying the rows to the
// host (the old path) — printed for docs/PERF.md.
TEST_F(GpuSampling, Timing) {
  const int64_t vocab = 248320;
  std::mt19937_64 gen(9);
  for (int n : {1, 8, 64, 256}) {
    for (int mode = 0; mode < 3; ++mode) {  // greedy, sampled, sampled with 20 logprobs
      const bool greedy = mode == 0, logprobs = mode == 2;
      std::vector<float> flat;
      for (int i = 0; i < n; ++i) {
        const auto r = make_row(vocab, 0, gen);
        flat.insert(flat.end(), r.begin(), r.end());
      }
      cuda::DeviceBuffer<float> logits(flat.size());
      logits.upload(flat.data(), flat.size(), stream_);
      std::vector<cuda::SampleRowParams> params(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        params[size_t(i)].row = i;
        params[size_t(i)].greedy = greedy;
        params[size_t(i)].num_logprobs = logprobs ? 20 : -1;
        params[size_t(i)].inv_temperature = runtime::inverse_temperature(0.7);
        params[size_t(i)].top_k = 20;
        params[size_t(i)].top_p = 0.95;
        params[size_t(i)].uniform = double(i) / n;
      }
      cuda::DeviceBuffer<cuda::SampleRowParams> dparams(static_cast<size_t>(n));
      dparams.upload(params.data(), params.size(), stream_);
      cuda::DeviceBuffer<cuda::SampleRowResult> results(static_cast<size_t>(n));
      cuda::DeviceBuffer<cuda::SampleRowScratch> scratch(static_cast<size_t>(n));
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      cuda::sample_rows(logits.data(), vocab, dparams.data(), n, results.data(), scratch.data(), !greedy, logprobs,
                        stream_);  // warm-up
      const int reps = 20;
      cudaEventRecord(e0, stream_);
      for (int r = 0; r < reps; ++r)
        cuda::sample_rows(logits.data(), vocab, dparams.data(), n, results.data(), scratch.data(), !greedy, logprobs,
                        stream_);
      cudaEventRecord(e1, stream_);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      // The old path: copy the rows to pinned memory.
      float* pinned = nullptr;
      MOESERVE_CUDA_CHECK(cudaMallocHost(&pinned, flat.size() * sizeof(float)));
      cudaEventRecord(e0, stream_);
      for (int r = 0; r < reps; ++r)
        cudaMemcpyAsync(pinned, logits.data(), flat.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_);
      cudaEventRecord(e1, stream_);
      cudaEventSynchronize(e1);
      float copy_ms = 0;
      cudaEventElapsedTime(&copy_ms, e0, e1);
      cudaFreeHost(pinned);
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      std::printf("rows %3d %-18s device %8.1f us/step   D2H copy of the logits %8.1f us/step\n", n,
                  greedy ? "greedy" : logprobs ? "sampled+logprobs" : "sampled", 1000.0 * ms / reps,
                  1000.0 * copy_ms / reps);
    }
  }
}

}  // namespace
