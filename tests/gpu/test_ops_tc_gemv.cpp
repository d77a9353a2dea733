// tc_gemv_f32 / tc_gemv_f32_gated (ops_tc_gemv.h): the tensor-core GEMVs of generated tokens.
//
// 1. Against a CPU reference in double (the exact dequantised weight times the f32 x) for every
//    format, N in {1, 37, 256, 3072}, K in {128, 3072, 8192, 1040 (a partial block)} and M in {1,
//    2, 3, 8, 17, 64, 100}; FP8 weights cycle through every finite e4m3 byte (subnormals, zeros,
//    both signs), INT8 through every int8 value (-128 included); x spans a wide dynamic range
//    (1e-6 .. 1e3, zeros, -0, whole zero blocks). Per output the error must stay within the
//    bound derived from the arithmetic (ops_tc_gemv.h):
//      FP8 / INT8: x'' = x·2^P is split into f16 hi + lo with |x'' − hi − lo| <= 2^-8 while
//        |x''| >= 2^14 at the block max, so each x is kept to 2^-22 · (its block's max |x|);
//        the MMA's f32 accumulation over a block, the block fma chain and the slice fold add
//        a few f32 roundings of Σ|w·x|:
//          bound = 2^-21 · Σ_k |w_k| · blockmax_k + 2^-16 · Σ_k |w_k · x_k|
//        (w_k the dequantised weight, INT8 scale included; the second term allows 16 chained
//        MMAs per block with one f32 rounding (or truncation) each, plus the fma chain);
//      bf16: x = hi + lo in bf16 keeps 16 bits of each x (error <= 2^-18·|x|), plus the MMAs:
//          bound = 2^-14 · Σ_k |w_k · x_k|.
//    Both + 2^-140 absolute (f32 subnormal outputs and scale factors of blocks below 2^-112).
//    max|d| / max|ref| is printed (expected ~1e-7 for FP8 / INT8, ~1e-5 for bf16).
// 2. Batch invariance, bit for bit: a token's row at M = 1 equals the same token placed among 2,
//    7, 63 and 99 others; every forced split of K over warps (set_tc_gemv_split) and every
//    forced kernel form (set_tc_gemv_form: stepped, lean, pre-converted planes, wgmma with K split
//    over CTAs where the launch is short) gives the same bits; a captured CUDA graph replays the
//    eager bits (workspace reserved before the capture); a multi-job launch (mixed formats, 9 jobs =
//    two launches) equals each job alone;
//    accumulate equals y0 + the plain result; gated equals silu_mul_split + tc_gemv_f32.
// 3. Scaling edges: block maxima that are powers of two, maxima that round up to 2^15 after
//    scaling, 65504 and 1e20-sized values, subnormal and all-zero / all-(-0) blocks (an all-(-0)
//    token gives +0 outputs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "backend/cuda/device_linear.h"
#include "backend/cuda/ops_basic.h"
#include "backend/cuda/ops_tc_gemv.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "gpu_test_quant.h"

using namespace moeserve;
using namespace moeserve::gputest;

namespace {

// A weight with its exact dequantisation in double-friendly form: w = q_f[n][k] · scale(n, k).
struct TcWeight {
  quant::QuantWeight weight;
  std::vector<float> deq;  // the dequantised weight rounded to f32
  std::vector<double> deq_d;  // the same in double, exact
  std::string label;
  int64_t N = 0, K = 0;
};

// FP8 block-128 with bytes cycling through every finite e4m3 code (0x7F / 0xFF are NaN in e4m3fn),
// shuffled, and random f32 block scales.
TcWeight make_fp8_all_codes(Rng& rng, int64_t N, int64_t K) {
  TcWeight t;
  t.label = "fp8-all-codes";
  t.N = N, t.K = K;
  t.weight.format = quant::WeightFormat::Fp8Block;
  t.weight.out_features = N;
  t.weight.in_features = K;
  t.weight.group_size = 128;
  t.weight.name = "test.tc.fp8";
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7F) != 0x7F) codes.push_back(uint8_t(c));
  const int64_t nb = (N + 127) / 128, kb = (K + 127) / 128;
  Tensor scale = Tensor::empty(DType::F32, {nb, kb});
  for (int64_t i = 0; i < nb * kb; ++i) scale.data<float>()[i] = rng.uniform(0.5f, 2.0f) * 1e-3f;
  Tensor q = Tensor::empty(DType::F8_E4M3, {N, K});
  t.deq.resize(size_t(N * K));
  t.deq_d.resize(size_t(N * K));
  for (int64_t i = 0; i < N * K; ++i) {
    // i -> 97·i mod 254 is a bijection on every run of 254 consecutive elements (97 and 254
    // are coprime): every code appears in every such run.
    const uint8_t b = codes[size_t((i * 97) % int64_t(codes.size()))];
    q.data<uint8_t>()[i] = b;
    const int64_t n = i / K, k = i % K;
    const double s = scale.data<float>()[(n / 128) * kb + k / 128];
    t.deq_d[size_t(i)] = double(fp8_e4m3_to_f32(b)) * s;
    t.deq[size_t(i)] = float(t.deq_d[size_t(i)]);
  }
  t.weight.parts["weight"] = std::move(q);
  t.weight.parts["weight_scale_inv"] = std::move(scale);
  return t;
}

// INT8 row-wise over every int8 value, -128 included.
TcWeight make_int8_all_values(Rng& rng, int64_t N, int64_t K) {
  TcWeight t;
  t.label = "int8-all-values";
  t.N = N, t.K = K;
  t.weight.format = quant::WeightFormat::Int8Rowwise;
  t.weight.out_features = N;
  t.weight.in_features = K;
  t.weight.name = "test.tc.int8";
  Tensor q = Tensor::empty(DType::I8, {N, K});
  Tensor s = Tensor::empty(DType::F32, {N});
  t.deq.resize(size_t(N * K));
  t.deq_d.resize(size_t(N * K));
  for (int64_t n = 0; n < N; ++n) s.data<float>()[n] = rng.uniform(0.5f, 1.5f) * 1e-3f;
  for (int64_t i = 0; i < N * K; ++i) {
    const int8_t v = int8_t(int((i * 37) % 256) - 128);  // every value in every run of 256
    q.data<int8_t>()[i] = v;
    t.deq_d[size_t(i)] = double(v) * double(s.data<float>()[i / K]);
    t.deq[size_t(i)] = float(t.deq_d[size_t(i)]);
  }
  t.weight.parts["weight"] = std::move(q);
  t.weight.parts["row_scales"] = std::move(s);
  return t;
}

TcWeight make_bf16(Rng& rng, int64_t N, int64_t K) {
  TestWeight w = make_dense_bf16(rng, N, K, 0.05f);
  TcWeight t;
  t.label = "bf16";
  t.N = N, t.K = K;
  t.weight = std::move(w.weight);
  t.deq = std::move(w.dequant);
  t.deq_d.assign(t.deq.begin(), t.deq.end());
  return t;
}

TcWeight make_weight(int fmt, Rng& rng, int64_t N, int64_t K) {
  return fmt == 0 ? make_fp8_all_codes(rng, N, K) : fmt == 1 ? make_int8_all_values(rng, N, K) : make_bf16(rng, N, K);
}

// x [M, K] with a wide dynamic range: each value ~ N(0, 1) · 10^U(-6, 3); ~3% zeros, ~1% -0;
// block 1 of every third token entirely zero.
std::vector<float> wide_x(Rng& rng, int M, int64_t K) {
  std::vector<float> x(size_t(M) * size_t(K));
  for (int m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      float v = rng.normal() * std::pow(10.0f, rng.uniform(-6.0f, 3.0f));
      const float r = rng.uniform();
      if (r < 0.03f) v = 0.0f;
      else if (r < 0.04f) v = -0.0f;
      if (m % 3 == 0 && k >= 128 && k < 256) v = 0.0f;
      x[size_t(m) * size_t(K) + size_t(k)] = v;
    }
  return x;
}

// The double reference and the per-output bound of the file header, for the first M rows of x.
struct Ref {
  std::vector<double> y;
  std::vector<double> bound;
};
Ref reference(const TcWeight& t, int fmt, const std::vector<float>& x, int M) {
  const int64_t N = t.N, K = t.K, B = (K + 127) / 128;
  Ref r;
  r.y.assign(size_t(M) * size_t(N), 0.0);
  r.bound.assign(r.y.size(), 0.0);
  auto work = [&](int m) {
    const float* xm = x.data() + size_t(m) * size_t(K);
    std::vector<double> bmax(size_t(B), 0.0);
    for (int64_t k = 0; k < K; ++k) bmax[size_t(k / 128)] = std::max(bmax[size_t(k / 128)], std::fabs(double(xm[k])));
    for (int64_t n = 0; n < N; ++n) {
      const double* w = t.deq_d.data() + size_t(n) * size_t(K);
      double s = 0, sabs = 0, sblk = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += w[k] * double(xm[k]);
        sabs += std::fabs(w[k] * double(xm[k]));
        sblk += std::fabs(w[k]) * bmax[size_t(k / 128)];
      }
      r.y[size_t(m) * size_t(N) + size_t(n)] = s;
      r.bound[size_t(m) * size_t(N) + size_t(n)] =
          (fmt == 2 ? std::ldexp(sabs, -14) : std::ldexp(sblk, -21) + std::ldexp(sabs, -16)) + std::ldexp(1.0, -140);
    }
  };
  const int threads = int(std::max(1u, std::min(32u, std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (int t0 = 0; t0 < threads; ++t0)
    pool.emplace_back([&, t0] {
      for (int m = t0; m < M; m += threads) work(m);
    });
  for (auto& th : pool) th.join();
  return r;
}

// One tc_gemv_f32 launch of `ws` over the first M rows of d_x; y_i starts as init_i (or zeros).
std::vector<std::vector<float>> tc(const std::vector<const cuda::DeviceLinear*>& ws, const float* d_x, int M,
                                   const std::vector<bool>& acc = {},
                                   const std::vector<std::vector<float>>* init = nullptr) {
  std::vector<DeviceBuffer<float>> ys;
  std::vector<cuda::RowGemvJob> jobs;
  for (size_t i = 0; i < ws.size(); ++i) {
    const size_t n = size_t(M) * size_t(ws[i]->N);
    ys.push_back(init ? to_device_f32((*init)[i]) : to_device_f32(std::vector<float>(n, 0.0f)));
  }
  for (size_t i = 0; i < ws.size(); ++i) jobs.push_back({ws[i], ys[i].data(), !acc.empty() && acc[i]});
  cuda::tc_gemv_f32(d_x, M, jobs, nullptr);
  std::vector<std::vector<float>> out;
  for (const auto& y : ys) out.push_back(to_host(y));
  return out;
}
std::vector<float> tc1(const cuda::DeviceLinear& w, const float* d_x, int M) { return tc({&w}, d_x, M)[0]; }

size_t count_diffs(const std::vector<float>& a, const std::vector<float>& b) {
  size_t d = a.size() != b.size() ? std::max(a.size(), b.size()) : 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return d;
}

std::vector<float> row_of(const std::vector<float>& v, int row, int64_t n) {
  return std::vector<float>(v.begin() + long(size_t(row) * size_t(n)), v.begin() + long(size_t(row + 1) * size_t(n)));
}

// Checks got (first M rows) against the reference within its bound; returns max|d| / max|ref|.
double check_ref(const std::string& tag, const std::vector<float>& got, const Ref& ref, int M, int64_t N) {
  double max_d = 0, max_ref = 0;
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < size_t(M) * size_t(N); ++i) {
    const double d = std::fabs(double(got[i]) - ref.y[i]);
    max_d = std::max(max_d, d);
    max_ref = std::max(max_ref, std::fabs(ref.y[i]));
    const double ratio = d / std::max(ref.bound[i], 1e-300);
    if (!(d <= ref.bound[i])) {  // NaN fails too
      ++bad;
      if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
    }
  }
  const double rel = max_ref > 0 ? max_d / max_ref : max_d;
  std::printf("[%s] max|d| %.3e max|ref| %.3e rel %.3e\n", tag.c_str(), max_d, max_ref, rel);
  EXPECT_EQ(bad, 0u) << tag << ": " << bad << " outputs outside the bound; worst m=" << worst / size_t(N)
                     << " n=" << worst % size_t(N) << " got " << got[worst] << " ref " << ref.y[worst] << " bound "
                     << ref.bound[worst];
  return rel;
}

struct SplitGuard {
  ~SplitGuard() {
    cuda::set_tc_gemv_split(0);
    cuda::set_tc_gemv_form(0);
  }
};
// The kernel forms a test forces (set_tc_gemv_form): by shape, stepped (in-CTA staging), lean
// where it applies, stepped over pre-converted planes, wgmma (sm_90 GPUs; elsewhere 3).
constexpr int kForms[] = {0, 1, 2, 3, 4};

}  // namespace

// The k permutation of the header is a bijection of each 64-k chunk, for both operand widths.
TEST(TcGemv, PermutationIsABijection) {
  for (bool bf16 : {false, true}) {
    std::vector<int> seen(64, 0);
    for (int p = 0; p < 64; ++p) {
      const int l = cuda::tc_gemv_logical_k(bf16, p);
      ASSERT_GE(l, 0);
      ASSERT_LT(l, 64);
      ++seen[size_t(l)];
    }
    for (int l = 0; l < 64; ++l) EXPECT_EQ(seen[size_t(l)], 1) << "logical k " << l << (bf16 ? " (bf16)" : " (fp8)");
  }
  // Slices: S(B) and non-empty contiguous ranges covering every block.
  for (int B = 1; B <= 70; ++B) {
    const int S = cuda::tc_gemv_slices(B);
    EXPECT_LE(S, std::min(8, B));
    EXPECT_EQ(cuda::tc_gemv_slice_begin(B, S, 0), 0);
    EXPECT_EQ(cuda::tc_gemv_slice_begin(B, S, S), B);
    for (int j = 0; j < S; ++j) EXPECT_LT(cuda::tc_gemv_slice_begin(B, S, j), cuda::tc_gemv_slice_begin(B, S, j + 1));
  }
}

// 1. Every format and shape against the double reference; rows at every M equal the same rows
// at M = 100 bit for bit.
TEST(TcGemv, MatchesCpuReference) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(801);
  constexpr int kRows = 100;
  for (int fmt : {0, 1, 2}) {
    for (int64_t K : {128, 3072, 8192, 1040}) {
      const auto x = wide_x(rng, kRows, K);
      const auto d_x = to_device_f32(x);
      for (int64_t N : {1, 37, 256, 3072}) {
        const TcWeight t = make_weight(fmt, rng, N, K);
        const std::string base = t.label + " N=" + std::to_string(N) + " K=" + std::to_string(K);
        SCOPED_TRACE(base);
        const cuda::DeviceLinear d = cuda::upload_linear(t.weight, nullptr);
        ASSERT_TRUE(cuda::tc_gemv_supported(d));
        const Ref ref = reference(t, fmt, x, kRows);
        const auto full = tc1(d, d_x.data(), kRows);
        for (int M : {kRows, 1, 2, 3, 8, 17, 64}) {
          const std::string tag = "tc_gemv " + base + " M=" + std::to_string(M);
          const auto y = M == kRows ? full : tc1(d, d_x.data(), M);
          check_ref(tag, y, ref, M, N);
          EXPECT_EQ(count_diffs(y, std::vector<float>(full.begin(), full.begin() + long(size_t(M) * size_t(N)))), 0u)
              << tag << ": rows at M differ from the same rows at M=100";
        }
      }
    }
  }
}

// 2a. A token's row alone equals the same token among others at any position, for every forced
// split of K over warps, and y += x·Wᵀ is y0 + the plain result.
TEST(TcGemv, BatchInvariantAndSplitInvariant) {
  MOESERVE_REQUIRE_GPU();
  SplitGuard guard;
  Rng rng(802);
  std::vector<TcWeight> ws;
  ws.push_back(make_fp8_all_codes(rng, 3072, 8192));  // o_proj: short, long K (split over warps)
  ws.push_back(make_fp8_all_codes(rng, 300, 1024));   // shared down
  ws.push_back(make_int8_all_values(rng, 1000, 3072));
  ws.push_back(make_bf16(rng, 64, 3072));
  ws.push_back(make_fp8_all_codes(rng, 130, 1040));   // partial block, 8 blocks + 1
  ws.push_back(make_bf16(rng, 37, 400));              // partial block, 4 blocks -> S = 2
  for (const auto& t : ws) {
    SCOPED_TRACE(t.label + " N=" + std::to_string(t.N) + " K=" + std::to_string(t.K));
    const cuda::DeviceLinear d = cuda::upload_linear(t.weight, nullptr);
    ASSERT_TRUE(cuda::tc_gemv_supported(d));
    const auto x1 = wide_x(rng, 1, t.K);
    const auto d_x1 = to_device_f32(x1);
    cuda::set_tc_gemv_split(0);
    const auto alone = tc1(d, d_x1.data(), 1);
    for (auto [M, pos] : {std::pair{3, 2}, std::pair{8, 5}, std::pair{64, 37}, std::pair{100, 99}, std::pair{100, 0}}) {
      auto xm = wide_x(rng, M, t.K);
      std::copy(x1.begin(), x1.end(), xm.begin() + long(size_t(pos) * size_t(t.K)));
      const auto d_xm = to_device_f32(xm);
      for (int form : kForms)
        for (int split : {0, 1, 2, 4, 8}) {
          if (form == 2 && M > 8) continue;               // the same launches as form 1
          if (form == 4 && split != 0) continue;           // the wgmma form has no warp split
          cuda::set_tc_gemv_form(form);
          cuda::set_tc_gemv_split(split);
          const auto y = tc1(d, d_xm.data(), M);
          cuda::set_tc_gemv_form(0);
          EXPECT_EQ(count_diffs(row_of(y, pos, t.N), alone), 0u) << "token at row " << pos << " of " << M << " (form "
                                                                  << form << ", split " << split << ") differs from M=1";
          if (form == 0 && split == 0 && (M == 8 || M == 64)) {
            const std::vector<std::vector<float>> init{wide_x(rng, M, t.N)};
            const auto acc = tc({&d}, d_xm.data(), M, {true}, &init)[0];
            std::vector<float> want(init[0].size());
            for (size_t i = 0; i < want.size(); ++i) want[i] = init[0][i] + y[i];
            EXPECT_EQ(count_diffs(acc, want), 0u) << "accumulate is not y0 + x·Wᵀ at M=" << M;
          }
        }
      cuda::set_tc_gemv_split(0);
    }
    for (int form : kForms)
      for (int split : {0, 1, 2, 4, 8}) {
        cuda::set_tc_gemv_form(form);
        cuda::set_tc_gemv_split(split);
        EXPECT_EQ(count_diffs(tc1(d, d_x1.data(), 1), alone), 0u) << "M=1 with form " << form << ", split " << split;
      }
    cuda::set_tc_gemv_split(0);
    cuda::set_tc_gemv_form(0);
  }
}

// 2a'. Tall launches (more 128-row CTAs than SMs: the wgmma form's two-CTAs-per-SM shape at <= 16
// tokens, several waves at 64): a token among others equals it alone, by shape and every form.
TEST(TcGemv, TallLaunchesBatchInvariant) {
  MOESERVE_REQUIRE_GPU();
  SplitGuard guard;
  Rng rng(806);
  std::vector<TcWeight> ws;
  ws.push_back(make_fp8_all_codes(rng, 20000, 256));
  ws.push_back(make_int8_all_values(rng, 17000, 384));
  for (const auto& t : ws) {
    SCOPED_TRACE(t.label + " N=" + std::to_string(t.N) + " K=" + std::to_string(t.K));
    const cuda::DeviceLinear d = cuda::upload_linear(t.weight, nullptr);
    const auto x1 = wide_x(rng, 1, t.K);
    const auto alone = tc1(d, to_device_f32(x1).data(), 1);
    for (auto [M, pos] : {std::pair{5, 4}, std::pair{16, 9}, std::pair{64, 63}}) {
      auto xm = wide_x(rng, M, t.K);
      std::copy(x1.begin(), x1.end(), xm.begin() + long(size_t(pos) * size_t(t.K)));
      const auto d_xm = to_device_f32(xm);
      for (int form : {0, 3, 4}) {
        cuda::set_tc_gemv_form(form);
        const auto y = tc1(d, d_xm.data(), M);
        cuda::set_tc_gemv_form(0);
        EXPECT_EQ(count_diffs(row_of(y, pos, t.N), alone), 0u)
            << "token at row " << pos << " of " << M << " (form " << form << ") differs from M=1";
      }
    }
  }
}

// 2b. One launch of mixed formats (the model's in_proj qkv + z + b + a and router set shapes,
// scaled down, an INT8 job, 9 jobs = two launches) equals each job alone, with and without
// accumulation, at M = 1, 3, 8, 17, 64.
TEST(TcGemv, MixedJobsEqualSeparate) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(803);
  const int64_t K = 3072;
  std::vector<TcWeight> ts;
  ts.push_back(make_fp8_all_codes(rng, 1536, K));
  ts.push_back(make_fp8_all_codes(rng, 512, K));
  ts.push_back(make_bf16(rng, 32, K));
  ts.push_back(make_bf16(rng, 32, K));
  ts.push_back(make_bf16(rng, 256, K));
  ts.push_back(make_bf16(rng, 1, K));
  ts.push_back(make_fp8_all_codes(rng, 1024, K));
  ts.push_back(make_int8_all_values(rng, 300, K));
  ts.push_back(make_fp8_all_codes(rng, 77, K));
  std::vector<cuda::DeviceLinear> d;
  for (const auto& t : ts) d.push_back(cuda::upload_linear(t.weight, nullptr));
  std::vector<const cuda::DeviceLinear*> ptrs;
  for (const auto& w : d) ptrs.push_back(&w);
  const auto x = wide_x(rng, 64, K);
  const auto d_x = to_device_f32(x);
  for (int M : {1, 3, 8, 17, 64}) {
    SCOPED_TRACE("M=" + std::to_string(M));
    const auto fused = tc(ptrs, d_x.data(), M);
    std::vector<bool> acc;
    std::vector<std::vector<float>> init;
    for (size_t i = 0; i < ptrs.size(); ++i) {
      EXPECT_EQ(count_diffs(fused[i], tc1(*ptrs[i], d_x.data(), M)), 0u) << "job " << i << " differs from alone";
      acc.push_back(i % 2 == 1);
      init.push_back(wide_x(rng, M, ptrs[i]->N));
    }
    const auto mixed = tc(ptrs, d_x.data(), M, acc, &init);
    for (size_t i = 0; i < ptrs.size(); ++i) {
      std::vector<float> want = fused[i];
      if (acc[i])
        for (size_t e = 0; e < want.size(); ++e) want[e] = init[i][e] + fused[i][e];
      EXPECT_EQ(count_diffs(mixed[i], want), 0u) << "job " << i << (acc[i] ? " (accumulate)" : "");
    }
  }
}

// 2c. Gated: bit-identical to silu_mul_split + tc_gemv_f32 in every forced form, and a token's
// row at M = 1 equals the same token among others.
TEST(TcGemv, GatedEqualsSiluMulThenGemv) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(804);
  std::vector<TcWeight> ws;
  ws.push_back(make_fp8_all_codes(rng, 3072, 1024));  // shared down
  ws.push_back(make_int8_all_values(rng, 263, 1040));
  ws.push_back(make_bf16(rng, 520, 3072));
  for (const auto& t : ws) {
    SCOPED_TRACE(t.label + " N=" + std::to_string(t.N) + " K=" + std::to_string(t.K));
    const cuda::DeviceLinear d = cuda::upload_linear(t.weight, nullptr);
    ASSERT_TRUE(cuda::tc_gemv_gated_supported(d));
    constexpr int kRows = 64;
    const auto g = random_f32(rng, size_t(kRows) * size_t(t.K), 3.0f);
    const auto u = random_f32(rng, size_t(kRows) * size_t(t.K), 1.0f);
    const auto d_g = to_device_f32(g), d_u = to_device_f32(u);
    std::vector<float> gated_one;
    for (int M : {1, 3, 8, 17, 64}) {
      DeviceBuffer<float> d_act(size_t(M) * size_t(t.K));
      cuda::silu_mul_split(d_g.data(), d_u.data(), M, int(t.K), d_act.data(), nullptr);
      const auto plain = tc1(d, d_act.data(), M);
      DeviceBuffer<float> d_y(size_t(M) * size_t(t.N));
      cuda::tc_gemv_f32_gated(d_g.data(), d_u.data(), M, d, d_y.data(), false, nullptr);
      const auto y = to_host(d_y);
      EXPECT_EQ(count_diffs(y, plain), 0u) << "M=" << M << ": gated != silu_mul_split + tc_gemv_f32";
      for (int form : {1, 3}) {  // the in-CTA staged and the pre-converted gated forms give the same bits
        SplitGuard guard;
        cuda::set_tc_gemv_form(form);
        DeviceBuffer<float> d_yf(size_t(M) * size_t(t.N));
        cuda::tc_gemv_f32_gated(d_g.data(), d_u.data(), M, d, d_yf.data(), false, nullptr);
        EXPECT_EQ(count_diffs(to_host(d_yf), y), 0u) << "M=" << M << ": gated form " << form << " differs";
      }
      if (M == 1) gated_one = y;
      else EXPECT_EQ(count_diffs(row_of(y, 0, t.N), gated_one), 0u) << "M=" << M << ": token 0 differs from M=1";
      if (M == 8) {
        const auto y0 = random_f32(rng, size_t(M) * size_t(t.N), 1.0f);
        auto d_acc = to_device_f32(y0);
        cuda::tc_gemv_f32_gated(d_g.data(), d_u.data(), M, d, d_acc.data(), true, nullptr);
        std::vector<float> want(y0.size());
        for (size_t i = 0; i < want.size(); ++i) want[i] = y0[i] + y[i];
        EXPECT_EQ(count_diffs(to_host(d_acc), want), 0u) << "gated accumulate is not y0 + W·act";
      }
    }
  }
}

// 3. Scaling edge cases: per-block maxima that are powers of two, that round up to 2^15 after
// scaling (2^e · (2 − 2^-24)), 65504, 1e20 and 1e-30 / subnormal blocks; an all-(-0) token gives
// exactly +0 (and accumulate keeps y0 + 0).
TEST(TcGemv, ScalingEdgeCases) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(805);
  const int64_t K = 1024;
  constexpr int M = 9;
  std::vector<float> x(size_t(M) * size_t(K));
  for (int m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const int b = int(k / 128);
      float v = rng.uniform(-1.0f, 1.0f);
      switch ((b + m) % 8) {
        case 0: v = (k % 128 == 5) ? 4.0f : v; break;                                   // max exactly 2^2
        case 1: v = (k % 128 == 7) ? -std::ldexp(2.0f - std::ldexp(1.0f, -23), 3) : v; break;  // rounds up to 2^15
        case 2: v *= 65504.0f; break;
        case 3: v *= 1e20f; break;
        case 4: v *= 1e-30f; break;
        case 5: v *= 1e-41f; break;  // f32 subnormals
        case 6: v = (k % 3 == 0) ? 0.0f : -0.0f; break;
        default: break;
      }
      x[size_t(m) * size_t(K) + size_t(k)] = v;
    }
  // Token 8: all -0.
  for (int64_t k = 0; k < K; ++k) x[size_t(8) * size_t(K) + size_t(k)] = -0.0f;
  const auto d_x = to_device_f32(x);
  for (int fmt : {0, 1, 2}) {
    const TcWeight t = make_weight(fmt, rng, 200, K);
    SCOPED_TRACE(t.label);
    const cuda::DeviceLinear d = cuda::upload_linear(t.weight, nullptr);
    const Ref ref = reference(t, fmt, x, M);
    const auto y = tc1(d, d_x.data(), M);
    check_ref("tc_gemv edges " + t.label, y, ref, M, t.N);
    for (int64_t n = 0; n < t.N; ++n) {
      const float v = y[size_t(8) * size_t(t.N) + size_t(n)];
      EXPECT_TRUE(v == 0.0f && !std::signbit(v)) << "an all-(-0) token gives " << v << " at n=" << n;
    }
    for (int m = 0; m < M; ++m) {
      const auto alone = tc1(d, d_x.data() + size_t(m) * size_t(K), 1);
      EXPECT_EQ(count_diffs(alone, row_of(y, m, t.N)), 0u) << "token " << m << " alone differs from M=9";
    }
  }
}

// 2d. Graph safety of the planes workspace: after tc_gemv_reserve, a launch captured in a CUDA
// graph (M = 64, the pre-converted form, and M = 1, the lean form) replays the eager bits, also
// after the workspace was rewritten by other launches in between.
TEST(TcGemv, GraphReplayEqualsEager) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(806);
  const TcWeight t = make_fp8_all_codes(rng, 1000, 3072);
  const TcWeight tb = make_bf16(rng, 64, 3072);
  const cuda::DeviceLinear d = cuda::upload_linear(t.weight, nullptr);
  const cuda::DeviceLinear db = cuda::upload_linear(tb.weight, nullptr);
  cuda::tc_gemv_reserve(64, 3072);
  for (int M : {64, 17, 1}) {
    SCOPED_TRACE("M=" + std::to_string(M));
    const auto x = wide_x(rng, M, 3072);
    const auto d_x = to_device_f32(x);
    const auto want = tc({&d, &db}, d_x.data(), M);
    DeviceBuffer<float> y(size_t(M) * 1000), yb(size_t(M) * 64);
    const cuda::RowGemvJob jobs[2] = {{&d, y.data(), false}, {&db, yb.data(), false}};
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cuda::tc_gemv_f32(d_x.data(), M, jobs, s);
    ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    // Other launches rewrite the planes between the capture and the replay.
    const auto other = wide_x(rng, 64, 3072);
    const auto d_other = to_device_f32(other);
    (void)tc({&d, &db}, d_other.data(), 64);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(count_diffs(to_host(y), want[0]), 0u) << "graph replay differs from eager (fp8 job)";
    EXPECT_EQ(count_diffs(to_host(yb), want[1]), 0u) << "graph replay differs from eager (bf16 job)";
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
  }
}
