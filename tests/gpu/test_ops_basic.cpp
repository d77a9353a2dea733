// The small kernels of ops_basic.h against the CPU ops (src/backend/cpu) on random bf16
// inputs: embedding, residual add + (1+w) RMSNorm, SwiGLU (fused and split), row gather,
// shared-expert scaled add, argmax. Shapes: the 122B-A10B config (H 3072, I 1024,
// V 248320) and odd ones (not multiples of 8/32/128), M in {1, 3, 8, 17, 64, 300}.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/activations.h"
#include "backend/cpu/norms.h"
#include "backend/cuda/ops_basic.h"
#include "core/error.h"
#include "gpu_test_util.h"

using namespace moeserve;
using namespace moeserve::gputest;

namespace {

const int kRows[] = {1, 3, 8, 17, 64, 300};

// A bf16 output of an fp32 computation: half an ulp of bf16 (2^-8 relative, at the bottom
// of a binade) plus the fp32 arithmetic that differs between the two sides (summation
// order of the mean square, rsqrtf vs 1/sqrt, __expf vs exp: a few fp32 ulps, 1e-5 is
// ~170 of them). A wrong weight index or a missing (1 + w) changes values by O(1).
constexpr double kBf16OutRtol = kEpsBf16 * 1.001 + 1e-5;

}  // namespace

TEST(GpuOpsBasic, EmbeddingCopiesRowsExactly) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(1);
  struct Case { int V, H, M; };
  for (const Case c : {Case{248320, 72, 17}, Case{1000, 3072, 64}, Case{37, 3001, 3}}) {
    const auto table = random_bf16(rng, size_t(c.V) * c.H, 1.0f);
    std::vector<int32_t> ids(size_t(c.M));
    for (auto& id : ids) id = int32_t(rng.integer(0, c.V - 1));
    ids[0] = c.V - 1;  // the last row: a stride error would read past the table
    if (c.M > 1) ids[1] = 0;
    auto d_table = to_device_bf16(table);
    auto d_ids = to_device_i32(ids);
    DeviceBuffer<float> d_out(size_t(c.M) * c.H);
    cuda::embedding_lookup(d_ids.data(), c.M, d_table.data(), c.H, d_out.data(), nullptr);
    std::vector<float> ref(size_t(c.M) * c.H);
    for (int m = 0; m < c.M; ++m)
      std::copy_n(table.begin() + long(size_t(ids[size_t(m)]) * c.H), c.H, ref.begin() + long(size_t(m) * c.H));
    EXPECT_TRUE(all_close("embedding V=" + std::to_string(c.V), to_host(d_out), ref, {c.M, c.H}, {"M", "H"}, 0, 0));
  }
}

TEST(GpuOpsBasic, AddRmsNormMatchesCpu) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(2);
  for (int H : {3072, 3001, 72}) {
    for (int M : kRows) {
      for (bool with_delta : {false, true}) {
        SCOPED_TRACE("H=" + std::to_string(H) + " M=" + std::to_string(M) + " delta=" + std::to_string(with_delta));
        const auto residual = random_f32(rng, size_t(M) * H, 3.0f);
        const auto delta = random_f32(rng, size_t(M) * H, 1.0f);
        const auto w = random_f32(rng, size_t(H), 0.3f);  // (1 + w) form, weights near 0 as trained
        const float eps = 1e-6f;
        auto d_res = to_device_f32(residual);
        auto d_delta = to_device_f32(delta);
        auto d_w = to_device_f32(w);
        DeviceBuffer<bf16> d_out(size_t(M) * H);
        DeviceBuffer<float> d_out32(size_t(M) * H);
        cuda::add_rms_norm(d_res.data(), with_delta ? d_delta.data() : nullptr, d_w.data(), M, H, eps, d_out.data(),
                           nullptr, d_out32.data());
        std::vector<float> ref_res = residual, ref_out(size_t(M) * H);
        if (with_delta)
          for (size_t i = 0; i < ref_res.size(); ++i) ref_res[i] += delta[i];
        for (int m = 0; m < M; ++m)
          cpu::rms_norm_zero_centred(ref_res.data() + size_t(m) * H, ref_out.data() + size_t(m) * H, H, w.data(), eps);
        // The residual update is one fp32 addition on both sides: bit-exact.
        EXPECT_TRUE(all_close("add_rms_norm.residual", to_host(d_res), ref_res, {M, H}, {"M", "H"}, 0, 0));
        EXPECT_TRUE(all_close("add_rms_norm.out", to_host(d_out), ref_out, {M, H}, {"M", "H"}, 0, kBf16OutRtol));
        // The unrounded copy (input of the f32-activation projections): fp32 arithmetic only.
        EXPECT_TRUE(all_close("add_rms_norm.out_f32", to_host(d_out32), ref_out, {M, H}, {"M", "H"}, 0, 1e-5));
        // ... and the bf16 output is exactly its rounding.
        std::vector<float> rounded = to_host(d_out32);
        round_bf16_inplace(rounded);
        EXPECT_TRUE(all_close("add_rms_norm.out == bf16(out_f32)", to_host(d_out), rounded, {M, H}, {"M", "H"}, 0, 0));
      }
    }
  }
}

// The gated add before the norm (GatedAdd: the shared expert the model adds after the routed experts):
// residual = fmaf(sigmoid(g), v, residual + delta) against the same on the CPU with std::exp (the
// kernel's __expf differs by an ulp or two of the scale: 1e-6 relative), and the norm of that
// residual; the register kernel (H 3072), the scalar path (H 3001) and the wide kernel (H 20000).
// A gated add with values and no gate logits (or the reverse) is refused.
TEST(GpuOpsBasic, AddRmsNormGatedAddMatchesCpu) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(3);
  for (int H : {3072, 3001, 20000}) {
    for (int M : {1, 3, 17}) {
      for (bool with_delta : {false, true}) {
        SCOPED_TRACE("H=" + std::to_string(H) + " M=" + std::to_string(M) + " delta=" + std::to_string(with_delta));
        const auto residual = random_f32(rng, size_t(M) * H, 3.0f);
        const auto delta = random_f32(rng, size_t(M) * H, 1.0f);
        const auto values = random_f32(rng, size_t(M) * H, 2.0f);
        const auto gate = random_f32(rng, size_t(M), 4.0f);
        const auto w = random_f32(rng, size_t(H), 0.3f);
        const float eps = 1e-6f;
        auto d_res = to_device_f32(residual);
        auto d_delta = to_device_f32(delta);
        auto d_values = to_device_f32(values);
        auto d_gate = to_device_f32(gate);
        auto d_w = to_device_f32(w);
        DeviceBuffer<float> d_out32(size_t(M) * H);
        cuda::add_rms_norm(d_res.data(), with_delta ? d_delta.data() : nullptr, {d_values.data(), d_gate.data()},
                           d_w.data(), M, H, eps, nullptr, nullptr, d_out32.data());
        std::vector<float> ref_res = residual, ref_out(size_t(M) * H);
        for (int m = 0; m < M; ++m) {
          const float s = 1.0f / (1.0f + std::exp(-gate[size_t(m)]));
          for (int h = 0; h < H; ++h) {
            const size_t i = size_t(m) * H + h;
            ref_res[i] = std::fma(s, values[i], with_delta ? residual[i] + delta[i] : residual[i]);
          }
          cpu::rms_norm_zero_centred(ref_res.data() + size_t(m) * H, ref_out.data() + size_t(m) * H, H, w.data(), eps);
        }
        EXPECT_TRUE(all_close("gated add residual", to_host(d_res), ref_res, {M, H}, {"M", "H"}, 1e-6, 1e-6));
        EXPECT_TRUE(all_close("gated add out_f32", to_host(d_out32), ref_out, {M, H}, {"M", "H"}, 1e-6, 1e-5));
      }
    }
  }
  DeviceBuffer<float> res(3072), w(3072), gate(1);
  const cuda::GatedAdd values_only{res.data(), nullptr}, gate_only{nullptr, gate.data()};
  EXPECT_THROW(cuda::add_rms_norm(res.data(), nullptr, values_only, w.data(), 1, 3072, 1e-6f, nullptr, nullptr), Error);
  EXPECT_THROW(cuda::add_rms_norm(res.data(), nullptr, gate_only, w.data(), 1, 3072, 1e-6f, nullptr, nullptr), Error);
}

TEST(GpuOpsBasic, SiluMulMatchesCpu) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(3);
  for (int I : {1024, 1000, 37}) {
    for (int M : kRows) {
      SCOPED_TRACE("I=" + std::to_string(I) + " M=" + std::to_string(M));
      const auto gu = random_bf16(rng, size_t(M) * 2 * I, 2.0f);
      std::vector<float> g(size_t(M) * I), u(size_t(M) * I), ref(size_t(M) * I);
      for (int m = 0; m < M; ++m)
        for (int i = 0; i < I; ++i) {
          g[size_t(m) * I + i] = gu[size_t(m) * 2 * I + i];
          u[size_t(m) * I + i] = gu[size_t(m) * 2 * I + I + i];
        }
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = cpu::silu(g[i]) * u[i];
      auto d_gu = to_device_bf16(gu), d_g = to_device_bf16(g), d_u = to_device_bf16(u);
      DeviceBuffer<bf16> d_fused(size_t(M) * I), d_split(size_t(M) * I);
      cuda::silu_mul(d_gu.data(), M, I, d_fused.data(), nullptr);
      cuda::silu_mul_split(d_g.data(), d_u.data(), M, I, d_split.data(), nullptr);
      // __expf is within 2 ulp + |x|-proportional error for |x| < ~10: 1e-4 covers it.
      const double rtol = kEpsBf16 * 1.001 + 1e-4;
      EXPECT_TRUE(all_close("silu_mul", to_host(d_fused), ref, {M, I}, {"M", "I"}, 1e-30, rtol));
      EXPECT_TRUE(all_close("silu_mul_split", to_host(d_split), ref, {M, I}, {"M", "I"}, 1e-30, rtol));
    }
  }
}

TEST(GpuOpsBasic, GatherRowsIsExact) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(4);
  for (int H : {3072, 72, 3001}) {
    const int M = 300, R = 17;
    const auto src = random_bf16(rng, size_t(M) * H, 1.0f);
    std::vector<int32_t> rows(static_cast<size_t>(R));
    for (auto& r : rows) r = int32_t(rng.integer(0, M - 1));
    rows[0] = M - 1;
    auto d_src = to_device_bf16(src);
    auto d_rows = to_device_i32(rows);
    DeviceBuffer<bf16> d_dst(size_t(R) * H);
    cuda::gather_rows(d_src.data(), d_rows.data(), R, H, d_dst.data(), nullptr);
    std::vector<float> ref(size_t(R) * H);
    for (int r = 0; r < R; ++r)
      std::copy_n(src.begin() + long(size_t(rows[size_t(r)]) * H), H, ref.begin() + long(size_t(r) * H));
    EXPECT_TRUE(all_close("gather_rows", to_host(d_dst), ref, {R, H}, {"R", "H"}, 0, 0));
  }
}

TEST(GpuOpsBasic, AddScaledRowsMatchesCpu) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(5);
  for (int H : {3072, 3001}) {
    for (int M : kRows) {
      for (bool gated : {true, false}) {
        SCOPED_TRACE("H=" + std::to_string(H) + " M=" + std::to_string(M));
        const auto residual = random_f32(rng, size_t(M) * H, 2.0f);
        const auto x = random_f32(rng, size_t(M) * H, 1.0f);
        const auto gate = random_f32(rng, size_t(M), 3.0f);
        auto d_res = to_device_f32(residual), d_x = to_device_f32(x), d_gate = to_device_f32(gate);
        cuda::add_scaled_rows(d_res.data(), d_x.data(), gated ? d_gate.data() : nullptr, M, H, nullptr);
        std::vector<float> ref = residual, bound(ref.size());
        for (int m = 0; m < M; ++m) {
          const float s = gated ? cpu::sigmoid(gate[size_t(m)]) : 1.0f;
          for (int h = 0; h < H; ++h) {
            const size_t i = size_t(m) * H + h;
            ref[i] += s * x[i];
            // fp32 add of a term whose scale carries __expf's few-ulp error.
            bound[i] = float(4 * kEpsF32 * (std::abs(residual[i]) + std::abs(x[i])) + 1e-6 * std::abs(x[i]));
          }
        }
        EXPECT_TRUE(all_close(gated ? "add_scaled_rows.gated" : "add_scaled_rows.plain", to_host(d_res), ref, {M, H},
                              {"M", "H"}, 0, 0, &bound));
      }
    }
  }
}

TEST(GpuOpsBasic, ArgmaxTakesTheFirstMaximum) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(6);
  for (int V : {248320, 263, 1000}) {
    for (int R : {1, 3, 17}) {
      SCOPED_TRACE("V=" + std::to_string(V) + " R=" + std::to_string(R));
      auto logits = random_f32(rng, size_t(R) * V, 4.0f);
      std::vector<int32_t> ref(static_cast<size_t>(R));
      for (int r = 0; r < R; ++r) {
        float* row = logits.data() + size_t(r) * V;
        // Plant ties: the row maximum at several indices; the first must win (torch.argmax).
        const int a = int(rng.integer(0, V - 1)), b = int(rng.integer(0, V - 1)), c = V - 1;
        const float top = 100.0f + float(r);
        row[a] = row[b] = row[c] = top;
        if (r % 3 == 1) row[0] = top;  // the tie includes index 0
        ref[size_t(r)] = int32_t(std::max_element(row, row + V) - row);  // first maximum
      }
      auto d_logits = to_device_f32(logits);
      DeviceBuffer<int32_t> d_out(static_cast<size_t>(R));
      cuda::argmax_rows(d_logits.data(), R, V, d_out.data(), nullptr);
      EXPECT_EQ(to_host(d_out), ref);
    }
  }
}
