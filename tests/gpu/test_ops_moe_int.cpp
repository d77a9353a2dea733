// The integer form of the GPTQ routed experts through its public entry (ops_moe.h
// moe_routed_experts_int, moe_int_arith.h): its two kernel families give a token the SAME BITS
// (the dp4a kernels at <= 8 tokens against the tensor-core kernels, on every shape the three
// integer-form suites use, and a token alone on the dp4a kernels against the same token among
// 63 / 299 others on the tensor-core kernels), its results stay within the activation quantisation
// of the f32 MoE (cpu::moe_forward on the exact dequantised weights), the experts and shapes it
// declines (on both kernel families), and set_moe_int_decode_max_tokens' range.
// The kernels' own suites (test_ops_moe_int_decode.cpp, test_ops_moe_int_mma.cpp) check each
// family against the CPU reference of the form bit for bit; the shared helpers are in
// moe_int_test_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "backend/cpu/linear.h"
#include "backend/cpu/moe.h"
#include "backend/cuda/ops_moe.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "gpu_test_quant.h"
#include "moe_int_test_util.h"

using namespace moeserve;
using namespace moeserve::gputest;

namespace {

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

const std::vector<IntCase>& cases() {
  static const std::vector<IntCase> c{{16, 8, 3072, 1024, 128, true},  // the 122B-A10B expert shape, E cut to 16
                                      {16, 8, 3072, 1024, 128, false}, {16, 8, 1024, 512, 32, false},
                                      {8, 3, 256, 128, 64, true},      {6, 2, 384, 256, 128, false},
                                      // short last activation blocks (the fixtures' I 64; H 192):
                                      {8, 2, 128, 64, 32, true},       {5, 2, 192, 64, 32, false}};
  return c;
}

// The cross-path test's shapes: cases() and those of the kernels' own suites that it lacks: the
// other zero mode / group at 1024 / 512, top-k 1 and 32, E 64 and 256, H / I 384 / 640 / 320 / 768
// (partial 128- and 256-column blocks; K % 128 == 64 on I 320 and H 192).
const std::vector<IntCase>& cross_path_cases() {
  static const std::vector<IntCase> c = [] {
    std::vector<IntCase> v = cases();
    v.insert(v.end(), {{16, 8, 1024, 512, 64, true},
                       {16, 8, 1024, 512, 128, false},
                       {8, 3, 256, 128, 128, false},
                       {8, 3, 256, 128, 64, false},
                       {40, 32, 256, 128, 32, true},
                       {5, 1, 640, 256, 128, false},
                       {4, 1, 640, 384, 128, true},
                       {6, 1, 384, 384, 32, true},
                       {6, 2, 384, 384, 64, false},
                       {6, 2, 384, 640, 64, false},
                       {64, 8, 512, 256, 64, true},
                       {256, 8, 512, 256, 64, false},
                       {8, 4, 1024, 768, 128, true},
                       {5, 3, 192, 320, 64, false},
                       {8, 2, 192, 320, 64, false},
                       {5, 2, 192, 64, 32, true}});
    return v;
  }();
  return c;
}

}  // namespace

// The dp4a kernels (decode_max 8) and the tensor-core kernels (decode_max 0) on the same 1, 2, 3, 5
// and 8 tokens, with and without the gated shared expert: every residual element bit for bit (exact
// integer unit sums and one f32 fold per output in both, moe_int_arith.h). The one cross-path check
// of the three integer-form suites.
TEST(GpuOpsMoeInt, DecodeAndTensorCoreKernelsGiveTheSameBits) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(91);
  for (const auto& c : cross_path_cases()) {
    SCOPED_TRACE(case_name(c));
    const IntExperts ex = make_experts(rng, c);
    const auto d = upload(ex);
    ASSERT_TRUE(cuda::moe_int_supported(shape_of(c), d));
    for (int M : {1, 2, 3, 5, 8}) {
      for (bool with_shared : {false, true}) {
        const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
        const auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
        const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
        const auto shared = random_f32(rng, size_t(M) * c.H, 0.5f);
        const auto gate = random_f32(rng, size_t(M), 2.0f);
        const auto* sp = with_shared ? &shared : nullptr;
        const auto* gp = with_shared ? &gate : nullptr;
        bool ran_a = false, ran_b = false;
        const auto a = run_int(d, c, M, x, logits, residual, &ran_a, {.shared = sp, .gate = gp, .decode_max = 8});
        const auto b = run_int(d, c, M, x, logits, residual, &ran_b, {.shared = sp, .gate = gp, .decode_max = 0});
        ASSERT_TRUE(ran_a && ran_b);
        size_t first = 0;
        const int diffs = count_diffs(a, b, &first);
        EXPECT_EQ(diffs, 0) << "M=" << M << " shared=" << with_shared << ": " << diffs << " of " << a.size()
                            << " differ; first at token " << first / size_t(c.H) << " column " << first % size_t(c.H)
                            << ": dp4a " << a[first] << " vs tensor cores " << b[first];
        int changed = 0;  // the call did something
        for (size_t i = 0; i < a.size(); ++i) changed += !bits_equal(a[i], residual[i]);
        EXPECT_GT(changed, int(a.size() / 2));
      }
    }
  }
}

// A token alone (1 token: the dp4a kernels) equals the same token at position p among 63 and 299
// others (the tensor-core kernels, tiles of every size), bit for bit.
TEST(GpuOpsMoeInt, TokenBitsDoNotDependOnTheBatchOrTheKernels) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(92);
  for (const auto& c : cases()) {
    SCOPED_TRACE(case_name(c));
    const IntExperts ex = make_experts(rng, c);
    const auto d = upload(ex);
    for (const auto& [M, p] : {std::pair{64, 17}, std::pair{300, 250}, std::pair{300, 0}}) {
      const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
      const auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
      const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
      bool ran = false;
      const auto batch = run_int(d, c, M, x, logits, residual, &ran, {.decode_max = 8});
      ASSERT_TRUE(ran);
      const std::vector<float> x1(x.begin() + long(p) * c.H, x.begin() + long(p + 1) * c.H);
      const std::vector<float> l1(logits.begin() + long(p) * c.E, logits.begin() + long(p + 1) * c.E);
      const std::vector<float> r1(residual.begin() + long(p) * c.H, residual.begin() + long(p + 1) * c.H);
      const auto alone = run_int(d, c, 1, x1, l1, r1, &ran, {.decode_max = 8});
      size_t first = 0;
      const int diffs = count_diffs(batch, size_t(p) * c.H, alone, 0, size_t(c.H), &first);
      EXPECT_EQ(diffs, 0) << "token " << p << " of " << M << ": first at " << first;
    }
  }
}

// Against the f32 MoE on the exact dequantised weights: the only difference is the activations'
// 16-bit quantisation per 128-k block (x and the act rows), so max |int - f32| / max |routed| stays
// far below the f32 tensor-core path's own 1e-3 bound (test_ops_moe_mma.cpp).
TEST(GpuOpsMoeInt, StaysWithinItsQuantisationOfTheF32Moe) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(93);
  for (const auto& c : cases()) {
    const std::string name = case_name(c);
    SCOPED_TRACE(name);
    const IntExperts ex = make_experts(rng, c);
    const auto d = upload(ex);
    std::vector<quant::QuantWeight> rg, ru, rd;
    for (int e = 0; e < c.E; ++e) {
      rg.push_back(dense_f32(ex.gate[size_t(e)].dequant, c.I, c.H, "ref.gate"));
      ru.push_back(dense_f32(ex.up[size_t(e)].dequant, c.I, c.H, "ref.up"));
      rd.push_back(dense_f32(ex.down[size_t(e)].dequant, c.H, c.I, "ref.down"));
    }
    std::vector<cpu::ExpertWeights> cpu_experts;
    for (int e = 0; e < c.E; ++e) cpu_experts.push_back({&rg[size_t(e)], &ru[size_t(e)], &rd[size_t(e)]});
    const TestWeight router = make_dense_bf16(rng, c.E, c.H, 0.05f);
    const int Is = 8;  // a zero shared expert: cpu::moe_forward returns the routed sum alone
    const auto zg = dense_f32(std::vector<float>(size_t(Is) * c.H, 0.0f), Is, c.H, "shared.gate");
    const auto zu = dense_f32(std::vector<float>(size_t(Is) * c.H, 0.0f), Is, c.H, "shared.up");
    const auto zd = dense_f32(std::vector<float>(size_t(c.H) * Is, 0.0f), c.H, Is, "shared.down");
    const auto zs = dense_f32(std::vector<float>(size_t(c.H), 0.0f), 1, c.H, "shared_expert_gate");
    const cpu::MoeParams params{&router.weight, cpu_experts, {&zg, &zu, &zd}, &zs, c.k};
    for (int M : {1, 40}) {
      const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
      std::vector<float> logits(size_t(M) * c.E);
      cpu::linear(pool(), x.data(), M, router.weight, logits.data());
      std::vector<float> routed(size_t(M) * c.H);
      cpu::moe_forward(pool(), params, x.data(), M, routed.data());
      const std::vector<float> zero(size_t(M) * c.H, 0.0f);
      bool ran = false;
      const auto got = run_int(d, c, M, x, logits, zero, &ran, {.decode_max = 8});
      ASSERT_TRUE(ran);
      double max_err = 0, max_ref = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        max_err = std::max(max_err, std::fabs(double(got[i]) - double(routed[i])));
        max_ref = std::max(max_ref, std::fabs(double(routed[i])));
      }
      std::printf("  moe_int %s M=%d: max|int - f32| %.3e, max|routed| %.3e, rel %.3e\n", name.c_str(), M, max_err,
                  max_ref, max_err / max_ref);
      EXPECT_LT(max_err / max_ref, 2e-4) << name << " M=" << M;
    }
  }
}

// Experts and shapes outside the form (FP8 block experts, GPTQ act-order with sym or asym zeros,
// group 96, H or I not a multiple of 64): moe_int_supported is false, and a call returns false and
// leaves the residual untouched, whichever kernel family the step would take (3 tokens on the dp4a
// kernels' side, 20 on the tensor-core kernels' side). The one refusal test of the three
// integer-form suites.
TEST(GpuOpsMoeInt, DeclinesShapesOutsideTheForm) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(94);
  struct Bad {
    const char* what;
    int E, k, H, I;
    int group;  // 0: FP8 block experts; -1: GPTQ act-order (group 32)
    bool sym;
  };
  for (const Bad& b : {Bad{"fp8 experts", 4, 2, 256, 128, 0, true}, Bad{"act-order sym", 4, 2, 256, 128, -1, true},
                       Bad{"act-order asym", 8, 3, 256, 128, -1, false}, Bad{"group 96", 4, 2, 384, 384, 96, true},
                       Bad{"H not a multiple of 64", 4, 2, 96, 64, 32, true},
                       Bad{"I not a multiple of 64", 4, 2, 128, 96, 32, false}}) {
    SCOPED_TRACE(b.what);
    std::vector<TestWeight> g, u, dn;
    for (int e = 0; e < b.E; ++e) {
      if (b.group == 0) {
        g.push_back(make_fp8_block(rng, b.I, b.H, 0.03f, false));
        u.push_back(make_fp8_block(rng, b.I, b.H, 0.03f, false));
        dn.push_back(make_fp8_block(rng, b.H, b.I, 0.03f, false));
      } else {
        const bool act_order = b.group < 0;
        const int group = act_order ? 32 : b.group;
        g.push_back(make_gptq(rng, b.I, b.H, group, b.sym, act_order, 0.005f));
        u.push_back(make_gptq(rng, b.I, b.H, group, b.sym, act_order, 0.005f));
        dn.push_back(make_gptq(rng, b.H, b.I, group, b.sym, act_order, 0.005f));
      }
    }
    const auto d = cuda::upload_experts(ptrs(g), ptrs(u), ptrs(dn), nullptr);
    const IntCase c{b.E, b.k, b.H, b.I, b.group, b.sym};
    EXPECT_FALSE(cuda::moe_int_supported(shape_of(c), d));
    for (const auto& [M, decode_max] : {std::pair{3, 8}, std::pair{20, 0}}) {
      const auto x = random_f32(rng, size_t(M) * b.H, 1.0f);
      const auto logits = random_f32(rng, size_t(M) * b.E, 2.0f);
      const auto residual = random_f32(rng, size_t(M) * b.H, 1.0f);
      bool ran = true;
      const auto got = run_int(d, c, M, x, logits, residual, &ran, {.decode_max = decode_max});
      EXPECT_FALSE(ran) << "M=" << M;
      size_t first = 0;
      EXPECT_EQ(count_diffs(got, residual, &first), 0) << "M=" << M << ": the residual changed although the call "
                                                          "returned false";
    }
  }
}

// set_moe_int_decode_max_tokens takes 0 .. 8 and keeps its value on a refusal (host-side check).
TEST(GpuOpsMoeInt, DecodeMaxTokensRange) {
  const int saved = cuda::moe_int_decode_max_tokens();
  EXPECT_EQ(saved, 8);
  for (int bad : {-1, 9, 64}) {
    EXPECT_THROW(cuda::set_moe_int_decode_max_tokens(bad), Error);
    EXPECT_EQ(cuda::moe_int_decode_max_tokens(), saved);
  }
  cuda::set_moe_int_decode_max_tokens(0);
  EXPECT_EQ(cuda::moe_int_decode_max_tokens(), 0);
  cuda::set_moe_int_decode_max_tokens(saved);
}
