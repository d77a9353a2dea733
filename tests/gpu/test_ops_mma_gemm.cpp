// mma_gemm (ops_mma_gemm.h: tensor-core GEMM, f32 activations split into bf16 hi + lo) for bf16,
// FP8 block-128 and INT8 row-wise weights at the 122B projection shapes and odd shapes.
//
// Accuracy: against a CPU product in double with the exact dequantised weight (the quantised
// values the device holds times their f32 scales, multiplied in double), per element
//   |y − ref| <= 1e-5 · Σ_k |x_k·w_k| + 1e-6.
// The hi/lo split leaves at most 2^-16·|x| per element (typically far less, with random signs);
// FP8 first rounds x·s once (2^-24, ops_mma_gemm.h: the same error order as the per-block scaling
// it replaced); the MMA accumulation adds f32-level rounding. Dropping the lo half (bf16
// activations) would miss this bound by orders of magnitude. x is f32 (not bf16-representable),
// rows scaled by 2^-4 .. 2^4. The reference covers rows 0..99 and a spread of rows up to 1023
// (CPU time).
//
// Batch invariance (exact, bit for bit): every row of the M = 7, 16, 100 and 1024 results equals
// the same x row run alone (M = 1) and in chunks of 7 rows; every forced tiling (Small, Medium,
// Large, LargePipelined, Wide, LargePipelined2Cta, and on sm_90 Wgmma128 and Wgmma256: wgmma and
// mma.sync give the same bits) equals the automatic one, and so does Auto under every
// set_mma_gemm_variant (0..4); y += X·Wᵀ equals fl(y_old + y) of the plain run (Auto, and the
// pipelined and wgmma kernels with a partial last row tile). The shapes include N = 37
// and 200 (the 128x256 kernel's warps beyond N, whose FP8 scale row is clamped) and K = 144 (a
// partial last k tile) and K = 64 (fewer k tiles than pipeline stages).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_linear.h"
#include "backend/cuda/ops_mma_gemm.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "gpu_test_quant.h"

using namespace moeserve;
using namespace moeserve::gputest;
using cuda::MmaTiling;

namespace {

constexpr int kRows = 1024;  // rows of x; the runs take the first M

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

// W as the device holds it, in double: bf16 values, or e4m3 / int8 values times their f32 scales.
class ExactWeight {
 public:
  explicit ExactWeight(const cuda::DeviceLinear& d) : format_(d.format), N_(d.N), K_(d.K) {
    sync_device();
    switch (format_) {
      case quant::WeightFormat::Fp8Block: {
        q_ = d.fp8.download();
        scale_ = d.scale.download();
        for (int b = 0; b < 256; ++b) fp8_[b] = double(fp8_e4m3_to_f32(uint8_t(b)));
        break;
      }
      case quant::WeightFormat::Int8Rowwise: {
        const auto q = d.int8.download();
        q_.resize(q.size());
        std::memcpy(q_.data(), q.data(), q.size());
        scale_ = d.scale.download();
        break;
      }
      default: {
        const auto v = d.dense.download();
        bf16_.resize(v.size());
        std::memcpy(bf16_.data(), v.data(), v.size() * 2);
        break;
      }
    }
  }
  void row(int64_t n, double* out) const {
    const size_t base = size_t(n) * size_t(K_);
    const int64_t kb = (K_ + 127) / 128;
    for (int64_t k = 0; k < K_; ++k) {
      switch (format_) {
        case quant::WeightFormat::Fp8Block:
          out[k] = fp8_[q_[base + size_t(k)]] * double(scale_[size_t((n / 128) * kb + k / 128)]);
          break;
        case quant::WeightFormat::Int8Rowwise:
          out[k] = double(int8_t(q_[base + size_t(k)])) * double(scale_[size_t(n)]);
          break;
        default:
          out[k] = double(bf16_to_f32(bf16_[base + size_t(k)]));
          break;
      }
    }
  }

 private:
  quant::WeightFormat format_;
  int64_t N_, K_;
  std::vector<uint8_t> q_;
  std::vector<uint16_t> bf16_;
  std::vector<float> scale_;
  double fp8_[256] = {};
};

// ref[i][n] = Σ_k x[rows[i], k]·W[n, k] and absdot[i][n] = Σ_k |x·w|, in double.
struct Reference {
  std::vector<int> rows;
  std::vector<double> ref, absdot;  // [rows.size(), N]
};

Reference reference(const std::vector<float>& x, int64_t K, const ExactWeight& w, int64_t N) {
  Reference r;
  for (int i = 0; i < kRows; ++i)
    if (i < 100 || (i < kRows - 16 && (i - 100) % 29 == 0) || i >= kRows - 16) r.rows.push_back(i);
  const size_t R = r.rows.size();
  r.ref.assign(R * size_t(N), 0.0);
  r.absdot.assign(R * size_t(N), 0.0);
  std::vector<double> xd(R * size_t(K));
  for (size_t i = 0; i < R; ++i)
    for (int64_t k = 0; k < K; ++k)
      xd[i * size_t(K) + size_t(k)] = double(x[size_t(r.rows[i]) * size_t(K) + size_t(k)]);
  pool().parallel_for(N, [&](int64_t n0, int64_t n1) {
    std::vector<double> wr(static_cast<size_t>(K));
    for (int64_t n = n0; n < n1; ++n) {
      w.row(n, wr.data());
      for (size_t i = 0; i < R; ++i) {
        const double* xr = xd.data() + i * size_t(K);
        double s[4] = {0, 0, 0, 0}, a[4] = {0, 0, 0, 0};  // 4 partial sums (K % 16 == 0)
        for (int64_t k = 0; k < K; k += 4)
          for (int j = 0; j < 4; ++j) {
            const double p = xr[k + j] * wr[size_t(k + j)];
            s[j] += p;
            a[j] += std::abs(p);
          }
        r.ref[i * size_t(N) + size_t(n)] = (s[0] + s[1]) + (s[2] + s[3]);
        r.absdot[i * size_t(N) + size_t(n)] = (a[0] + a[1]) + (a[2] + a[3]);
      }
    }
  });
  return r;
}

// |y − ref| <= 1e-5·Σ|x·w| + 1e-6 for the reference rows below M (y holds rows 0..M-1).
::testing::AssertionResult check_accuracy(const std::string& what, const std::vector<float>& y, int M, int64_t N,
                                          const Reference& r) {
  size_t checked = 0, bad = 0;
  double worst_ratio = 0, max_abs = 0, max_ref = 0;
  int worst_m = -1;
  int64_t worst_n = -1;
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const int m = r.rows[i];
    if (m >= M) break;
    for (int64_t n = 0; n < N; ++n) {
      const double ref = r.ref[i * size_t(N) + size_t(n)];
      const double bound = 1e-5 * r.absdot[i * size_t(N) + size_t(n)] + 1e-6;
      const double err = std::abs(double(y[size_t(m) * size_t(N) + size_t(n)]) - ref);
      ++checked;
      max_abs = std::max(max_abs, std::isnan(err) ? INFINITY : err);
      max_ref = std::max(max_ref, std::abs(ref));
      const double ratio = std::isnan(err) ? INFINITY : err / bound;
      if (ratio > 1) ++bad;
      if (ratio > worst_ratio) worst_ratio = ratio, worst_m = m, worst_n = n;
    }
  }
  std::printf("[%s] %zu elements checked, max |err| %.3e (max |ref| %.3e), worst err/bound %.3f\n", what.c_str(),
              checked, max_abs, max_ref, worst_ratio);
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << checked
                                       << " elements exceed 1e-5*sum|x*w| + 1e-6; worst at [m=" << worst_m
                                       << ", n=" << worst_n << "]: got "
                                       << y[size_t(worst_m) * size_t(N) + size_t(worst_n)] << ", err/bound "
                                       << worst_ratio;
}

// Bit-for-bit equality of rows [0, M) of two [*, N] results.
::testing::AssertionResult same_bits(const std::string& what, const std::vector<float>& a, const std::vector<float>& b,
                                     int M, int64_t N) {
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < size_t(M) * size_t(N); ++i) {
    uint32_t ua, ub;
    std::memcpy(&ua, &a[i], 4);
    std::memcpy(&ub, &b[i], 4);
    if (ua != ub && diff++ == 0) first = i;
  }
  if (diff == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << diff << " of " << size_t(M) * size_t(N)
                                       << " elements differ; first at [m=" << first / size_t(N)
                                       << ", n=" << first % size_t(N) << "]: " << a[first] << " vs " << b[first];
}

std::vector<float> download(const DeviceBuffer<float>& d, size_t count) {
  sync_device();
  std::vector<float> h(count);
  MOESERVE_CUDA_CHECK(cudaMemcpy(h.data(), d.data(), count * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

const char* tiling_name(MmaTiling t) {
  switch (t) {
    case MmaTiling::Small:
      return "small";
    case MmaTiling::Medium:
      return "medium";
    case MmaTiling::Large:
      return "large";
    case MmaTiling::LargePipelined:
      return "large-pipelined";
    case MmaTiling::Wide:
      return "wide";
    case MmaTiling::LargePipelined2Cta:
      return "large-pipelined-2cta";
    case MmaTiling::Wgmma128:
      return "wgmma128";
    case MmaTiling::Wgmma256:
      return "wgmma256";
    default:
      return "auto";
  }
}

// The forced tilings of this device: the wgmma ones only where they can run (sm_90 and a build
// with sm_90a code); elsewhere they must refuse (RefusesUnsupportedAndEmpty).
std::vector<MmaTiling> forced_tilings() {
  std::vector<MmaTiling> t = {MmaTiling::Small,          MmaTiling::Medium, MmaTiling::Large,
                              MmaTiling::LargePipelined, MmaTiling::Wide,   MmaTiling::LargePipelined2Cta};
  if (cuda::mma_gemm_wgmma_available()) {
    t.push_back(MmaTiling::Wgmma128);
    t.push_back(MmaTiling::Wgmma256);
  }
  return t;
}

void check_weight(const TestWeight& t, Rng& rng) {
  const int64_t N = t.weight.out_features, K = t.weight.in_features;
  const std::string label = t.label + " N=" + std::to_string(N) + " K=" + std::to_string(K);
  SCOPED_TRACE(label);

  std::vector<float> x = random_f32(rng, size_t(kRows) * size_t(K), 1.0f);
  for (int m = 0; m < kRows; ++m)  // rows at 2^-4 .. 2^4
    for (int64_t k = 0; k < K; ++k) x[size_t(m) * size_t(K) + size_t(k)] *= std::ldexp(1.0f, m % 9 - 4);
  const auto d_x = to_device_f32(x);
  const cuda::DeviceLinear w = cuda::upload_linear(t.weight, nullptr);
  ASSERT_TRUE(cuda::mma_gemm_supported(w));

  const ExactWeight exact(w);
  {  // the test's own premise: the device weight is the test weight (f32 dequant within 2^-24)
    std::vector<double> row(static_cast<size_t>(K));
    size_t bad = 0;
    for (int64_t n = 0; n < N; ++n) {
      exact.row(n, row.data());
      for (int64_t k = 0; k < K; ++k) {
        const double d = t.dequant[size_t(n) * size_t(K) + size_t(k)];
        if (std::abs(row[size_t(k)] - d) > 1e-7 * std::abs(d)) ++bad;
      }
    }
    ASSERT_EQ(bad, 0u) << "uploaded weight differs from the test weight";
  }
  const Reference ref = reference(x, K, exact, N);

  DeviceBuffer<float> d_y(size_t(kRows) * size_t(N));
  auto run = [&](int M, int row0, float* y, MmaTiling tiling, bool accumulate = false) {
    cuda::mma_gemm(d_x.data() + size_t(row0) * size_t(K), M, w, y, accumulate, nullptr, tiling);
  };

  // Accuracy at each M (automatic tiling).
  std::map<int, std::vector<float>> out;
  for (int M : {1, 7, 16, 100, kRows}) {
    run(M, 0, d_y.data(), MmaTiling::Auto);
    out[M] = download(d_y, size_t(M) * size_t(N));
    EXPECT_TRUE(check_accuracy("mma_gemm " + label + " M=" + std::to_string(M), out[M], M, N, ref));
  }

  // Every row alone (M = 1) and in chunks of 7 rows.
  for (int r = 0; r < kRows; ++r) run(1, r, d_y.data() + size_t(r) * size_t(N), MmaTiling::Auto);
  const std::vector<float> alone = download(d_y, size_t(kRows) * size_t(N));
  for (int r = 0; r < kRows; r += 7)
    run(std::min(7, kRows - r), r, d_y.data() + size_t(r) * size_t(N), MmaTiling::Auto);
  const std::vector<float> by7 = download(d_y, size_t(kRows) * size_t(N));
  for (int M : {7, 16, 100, kRows}) {
    EXPECT_TRUE(
        same_bits("batch invariance: M=" + std::to_string(M) + " vs each row alone (M=1)", out[M], alone, M, N));
    EXPECT_TRUE(same_bits("batch invariance: M=" + std::to_string(M) + " vs chunks of 7 rows", out[M], by7, M, N));
  }

  // Every tiling gives the same bits.
  for (int M : {1, 100, kRows})
    for (MmaTiling tiling : forced_tilings()) {
      run(M, 0, d_y.data(), tiling);
      EXPECT_TRUE(same_bits(std::string("tiling ") + tiling_name(tiling) + " vs auto, M=" + std::to_string(M),
                            download(d_y, size_t(M) * size_t(N)), out[M], M, N));
    }

  // The wgmma kernels' step schedules (overlapped or not, whatever the weight kind) give the same
  // bits too.
  if (cuda::mma_gemm_wgmma_available()) {
    const int default_overlap = cuda::mma_gemm_wgmma_overlap();
    for (int mode : {0, 1}) {
      cuda::set_mma_gemm_wgmma_overlap(mode);
      for (int M : {100, kRows})
        for (MmaTiling tiling : {MmaTiling::Wgmma128, MmaTiling::Wgmma256}) {
          run(M, 0, d_y.data(), tiling);
          EXPECT_TRUE(same_bits(std::string("tiling ") + tiling_name(tiling) + " overlap mode " +
                                    std::to_string(mode) + " vs auto, M=" + std::to_string(M),
                                download(d_y, size_t(M) * size_t(N)), out[M], M, N));
        }
    }
    cuda::set_mma_gemm_wgmma_overlap(default_overlap);
  }

  // Auto under each kernel variant (the large choice: register-staged, pipelined 128x128, or
  // pipelined 128x256 where it fills the SMs).
  const int default_variant = cuda::mma_gemm_variant();
  for (int variant : {0, 1, 2, 3, 4}) {
    cuda::set_mma_gemm_variant(variant);
    for (int M : {100, kRows}) {
      run(M, 0, d_y.data(), MmaTiling::Auto);
      EXPECT_TRUE(same_bits("auto under variant " + std::to_string(variant) + " vs default, M=" + std::to_string(M),
                            download(d_y, size_t(M) * size_t(N)), out[M], M, N));
    }
  }
  cuda::set_mma_gemm_variant(default_variant);

  // The pipelined and wgmma kernels with y += X·Wᵀ and a partial last row tile.
  for (MmaTiling tiling : forced_tilings()) {
    if (tiling == MmaTiling::Small || tiling == MmaTiling::Medium || tiling == MmaTiling::Large) continue;
    const int M = kRows - 5;
    const std::vector<float> init = random_f32(rng, size_t(M) * size_t(N), 1.0f);
    d_y.upload(init.data(), init.size());
    run(M, 0, d_y.data(), tiling, /*accumulate=*/true);
    std::vector<float> expect(init.size());
    for (size_t i = 0; i < init.size(); ++i) expect[i] = init[i] + out[kRows][i];
    EXPECT_TRUE(same_bits(std::string("accumulate, ") + tiling_name(tiling) + ", M=" + std::to_string(M),
                          download(d_y, init.size()), expect, M, N));
  }

  // y += X·Wᵀ: exactly fl(y_old + y).
  for (int M : {7, 100}) {
    const std::vector<float> init = random_f32(rng, size_t(M) * size_t(N), 1.0f);
    d_y.upload(init.data(), init.size());
    run(M, 0, d_y.data(), MmaTiling::Auto, /*accumulate=*/true);
    std::vector<float> expect(init.size());
    for (size_t i = 0; i < init.size(); ++i) expect[i] = init[i] + out[M][i];
    EXPECT_TRUE(same_bits("accumulate M=" + std::to_string(M), download(d_y, init.size()), expect, M, N));
  }
}

// (N, K): 122B projections, then odd shapes (partial tiles and FP8 blocks, K not a multiple of 32).
const std::vector<std::pair<int64_t, int64_t>> kShapes = {{16384, 3072}, {3072, 8192}, {12288, 3072},
                                                          {1024, 3072},  {200, 144},   {37, 64}};

}  // namespace

TEST(GpuOpsMmaGemm, DenseBf16) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(71);
  for (auto [N, K] : kShapes) check_weight(make_dense_bf16(rng, N, K, 0.05f), rng);
}

TEST(GpuOpsMmaGemm, Fp8Block) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(72);
  for (auto [N, K] : kShapes) check_weight(make_fp8_block(rng, N, K, 0.05f, /*bf16_scales=*/N == 200), rng);
}

TEST(GpuOpsMmaGemm, Int8Rowwise) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(73);
  for (auto [N, K] : kShapes) check_weight(make_int8_rowwise(rng, N, K, 0.05f), rng);
}

// K % 16 != 0 and GPTQ are refused with an error; M = 0 writes nothing.
TEST(GpuOpsMmaGemm, RefusesUnsupportedAndEmpty) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(74);
  const cuda::DeviceLinear odd_k = cuda::upload_linear(make_dense_bf16(rng, 8, 72, 0.05f).weight, nullptr);
  const cuda::DeviceLinear gptq =
      cuda::upload_linear(make_gptq(rng, 64, 128, 128, /*sym=*/true, /*act_order=*/false, 0.01f).weight, nullptr);
  EXPECT_FALSE(cuda::mma_gemm_supported(odd_k));
  EXPECT_FALSE(cuda::mma_gemm_supported(gptq));
  DeviceBuffer<float> x(size_t(4) * 128), y(size_t(4) * 64);
  EXPECT_THROW(cuda::mma_gemm(x.data(), 4, odd_k, y.data(), false, nullptr), Error);
  EXPECT_THROW(cuda::mma_gemm(x.data(), 4, gptq, y.data(), false, nullptr), Error);
  EXPECT_THROW(cuda::set_mma_gemm_variant(5), Error);
  EXPECT_THROW(cuda::set_mma_gemm_variant(-1), Error);
  EXPECT_THROW(cuda::set_mma_gemm_wgmma_overlap(3), Error);
  EXPECT_EQ(cuda::mma_gemm_wgmma_overlap(), int(cuda::WgmmaOverlap::ByWeightKind));
  EXPECT_EQ(cuda::mma_gemm_variant(), 4);
  if (!cuda::mma_gemm_wgmma_available()) {  // not sm_90, or a build without sm_90a code
    const cuda::DeviceLinear d = cuda::upload_linear(make_dense_bf16(rng, 64, 128, 0.05f).weight, nullptr);
    EXPECT_THROW(cuda::mma_gemm(x.data(), 4, d, y.data(), false, nullptr, MmaTiling::Wgmma128), Error);
    EXPECT_THROW(cuda::mma_gemm(x.data(), 4, d, y.data(), false, nullptr, MmaTiling::Wgmma256), Error);
  }

  const cuda::DeviceLinear dense = cuda::upload_linear(make_dense_bf16(rng, 64, 128, 0.05f).weight, nullptr);
  const std::vector<float> sentinel(y.size(), 3.0f);
  y.upload(sentinel.data(), sentinel.size());
  cuda::mma_gemm(x.data(), 0, dense, y.data(), false, nullptr);
  EXPECT_TRUE(same_bits("M=0 leaves y untouched", download(y, y.size()), sentinel, 4, 64));
}
