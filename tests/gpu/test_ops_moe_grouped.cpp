// The grouped batch-decode expert kernels (ops_moe_grouped.cu: GPTQ INT4 experts, 9..64 tokens,
// tokens grouped by expert in tiles of 4 slots) against
//   - the tiled kernels they replace (ops_moe_gptq.cu, set_moe_grouped_enabled(false)), bit for
//     bit on every output, at M = 9, 16, 33 and 64, symmetric and asymmetric zeros, f32 x with the
//     shared expert fused into the combine and bf16 x without it;
//   - the same token alone (M = 1: the decode kernels, ops_moe_decode.cu, or the tiled kernels
//     where those refuse the shape), bit for bit;
//   - the CPU block (cpu::moe_forward) on odd shapes (1-row scale blocks, a partial column block);
//   - the tiled kernels again at M = 128 and 200 with the token limit raised (A/B runs).
// The x rows of the bit-for-bit tests span magnitudes 2^-20 .. 2^20, so an inexact
// dequantisation or a different summation order shows in the low bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/cpu/linear.h"
#include "backend/cpu/moe.h"
#include "backend/cuda/ops_moe.h"
#include "core/thread_pool.h"
#include "gpu_test_quant.h"

using namespace moeserve;
using namespace moeserve::gputest;

namespace {

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

struct Case {
  int E, k, H, I, group;
  bool sym;
  std::string name() const {
    return std::string(sym ? "sym" : "asym") + " g" + std::to_string(group) + " E=" + std::to_string(E) +
           " k=" + std::to_string(k) + " H=" + std::to_string(H) + " I=" + std::to_string(I);
  }
};

// The 122B-A10B expert shape (E = 16: at M = 64 every expert has ~32 slots, 8 tiles), asymmetric
// g32 (1-row blocks at H = 320: the 4-row chunks shrink to 1; H = 320 leaves the last 128-column
// down block half empty), asymmetric g64, 2 blocks per range, and E > 256 (routing outside the
// grouping CTA; decode kernels refuse it, so M = 1 is the tiled path).
const std::vector<Case>& cases() {
  static const std::vector<Case> c{{16, 8, 3072, 1024, 128, true}, {8, 3, 512, 128, 32, false},
                                   {8, 3, 320, 192, 32, false},    {10, 4, 1024, 256, 64, false},
                                   {12, 4, 2048, 512, 128, true},  {300, 4, 256, 128, 128, true}};
  return c;
}

struct Experts {
  std::vector<TestWeight> gate, up, down;
};

std::vector<const quant::QuantWeight*> ptrs(const std::vector<TestWeight>& v) {
  std::vector<const quant::QuantWeight*> p;
  for (const auto& t : v) p.push_back(&t.weight);
  return p;
}

Experts make_experts(Rng& rng, const Case& c) {
  Experts ex;
  for (int e = 0; e < c.E; ++e) {
    ex.gate.push_back(make_gptq(rng, c.I, c.H, c.group, c.sym, false, 0.005f));
    ex.up.push_back(make_gptq(rng, c.I, c.H, c.group, c.sym, false, 0.005f));
    ex.down.push_back(make_gptq(rng, c.H, c.I, c.group, c.sym, false, 0.005f));
  }
  return ex;
}

// One step's inputs for M tokens.
struct Inputs {
  std::vector<float> x, logits, residual, shared, shared_logit;
};

Inputs make_inputs(Rng& rng, const Case& c, int M, bool wide_x) {
  Inputs in;
  in.x = wide_x ? random_f32(rng, size_t(M) * c.H, 1.0f) : random_bf16(rng, size_t(M) * c.H, 1.0f);
  if (wide_x)
    for (size_t i = 0; i < in.x.size(); ++i) in.x[i] = std::ldexp(in.x[i], int(i % 41) - 20);
  in.logits = random_f32(rng, size_t(M) * c.E, 2.0f);
  in.residual = random_f32(rng, size_t(M) * c.H, 1.0f);
  in.shared = random_f32(rng, size_t(M) * c.H, 0.5f);
  in.shared_logit = random_f32(rng, size_t(M), 2.0f);
  return in;
}

Inputs rows(const Inputs& in, const Case& c, int first, int count) {
  auto cut = [&](const std::vector<float>& v, int width) {
    return std::vector<float>(v.begin() + long(first) * width, v.begin() + long(first + count) * width);
  };
  return {cut(in.x, c.H), cut(in.logits, c.E), cut(in.residual, c.H), cut(in.shared, c.H), cut(in.shared_logit, 1)};
}

// residual + MoE(x) for M tokens: f32 x with the shared expert fused (the model's call), or bf16 x
// without it.
std::vector<float> run(const cuda::DeviceExperts& d, const Case& c, int M, const Inputs& in, bool f32) {
  const cuda::MoeShape shape{c.E, c.k, c.H, c.I};
  const size_t ws_bytes = cuda::moe_workspace_bytes(shape, M);
  DeviceBuffer<uint8_t> ws(ws_bytes);
  auto d_logits = to_device_f32(in.logits);
  auto d_res = to_device_f32(in.residual);
  if (f32) {
    auto d_x = to_device_f32(in.x);
    auto d_sh = to_device_f32(in.shared);
    auto d_sl = to_device_f32(in.shared_logit);
    cuda::moe_routed_experts(d_x.data(), d_logits.data(), shape, d, M, ws.data(), ws_bytes, d_res.data(), nullptr,
                             d_sh.data(), d_sl.data());
  } else {
    auto d_x = to_device_bf16(in.x);
    cuda::moe_routed_experts(d_x.data(), d_logits.data(), shape, d, M, ws.data(), ws_bytes, d_res.data(), nullptr);
  }
  return to_host(d_res);
}

// Outputs whose bits differ; the first one is reported through `first`.
size_t bit_diffs(const std::vector<float>& a, const std::vector<float>& b, size_t offset_b, size_t n, size_t* first) {
  size_t diffs = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[offset_b + i], 4);
    if (x != y && diffs++ == 0 && first) *first = i;
  }
  return diffs;
}

// Restores the default dispatch when a test ends (also on a failed assertion).
struct DispatchGuard {
  ~DispatchGuard() {
    cuda::set_moe_grouped_enabled(true);
    cuda::set_moe_grouped_max_tokens(64);
  }
};

}  // namespace

TEST(GpuOpsMoeGrouped, ServesGptqBatchDecodeSteps) {
  MOESERVE_REQUIRE_GPU();
  DispatchGuard guard;
  Rng rng(61);
  const Case c{8, 3, 512, 128, 32, false};
  const Experts ex = make_experts(rng, c);
  const cuda::DeviceExperts d = cuda::upload_experts(ptrs(ex.gate), ptrs(ex.up), ptrs(ex.down), nullptr);
  const cuda::MoeShape shape{c.E, c.k, c.H, c.I};
  EXPECT_FALSE(cuda::moe_grouped_serves(shape, d, 8));  // the decode kernels' range
  for (int M : {9, 16, 33, 64}) EXPECT_TRUE(cuda::moe_grouped_serves(shape, d, M)) << "M = " << M;
  EXPECT_FALSE(cuda::moe_grouped_serves(shape, d, 65));
  cuda::set_moe_grouped_max_tokens(16);
  EXPECT_TRUE(cuda::moe_grouped_serves(shape, d, 16));
  EXPECT_FALSE(cuda::moe_grouped_serves(shape, d, 17));
  cuda::set_moe_grouped_max_tokens(64);
  cuda::set_moe_grouped_enabled(false);
  EXPECT_FALSE(cuda::moe_grouped_serves(shape, d, 16));
}

// Every output of every token, grouped vs tiled, bit for bit.
TEST(GpuOpsMoeGrouped, EqualsTiledKernelsBitForBit) {
  MOESERVE_REQUIRE_GPU();
  DispatchGuard guard;
  Rng rng(62);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name());
    const Experts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = cuda::upload_experts(ptrs(ex.gate), ptrs(ex.up), ptrs(ex.down), nullptr);
    const cuda::MoeShape shape{c.E, c.k, c.H, c.I};
    for (int M : {9, 16, 33, 64}) {
      ASSERT_TRUE(cuda::moe_grouped_serves(shape, d, M)) << "M = " << M << ": the grouped kernels refuse the shape";
      for (int f32 = 1; f32 >= 0; --f32) {
        const Inputs in = make_inputs(rng, c, M, f32 != 0);
        cuda::set_moe_grouped_enabled(true);
        const auto grouped = run(d, c, M, in, f32 != 0);
        cuda::set_moe_grouped_enabled(false);
        const auto tiled = run(d, c, M, in, f32 != 0);
        cuda::set_moe_grouped_enabled(true);
        size_t first = 0;
        const size_t diffs = bit_diffs(grouped, tiled, 0, grouped.size(), &first);
        EXPECT_EQ(diffs, 0u) << "M = " << M << (f32 ? " f32 x + shared" : " bf16 x") << ": " << diffs << " of "
                             << grouped.size() << " outputs differ; first at token " << first / size_t(c.H)
                             << " h " << first % size_t(c.H) << ": grouped " << grouped[first] << " tiled "
                             << tiled[first];
        // The experts did add something (a path that skipped them would also agree with itself).
        size_t changed = 0;
        for (size_t i = 0; i < grouped.size(); ++i) changed += grouped[i] != in.residual[i];
        EXPECT_GT(changed, grouped.size() / 2) << "M = " << M << ": the routed experts changed too few outputs";
      }
    }
  }
}

// A token in a 64-token step (grouped kernels) has the bits it has alone (M = 1).
TEST(GpuOpsMoeGrouped, TokenInBatchOf64EqualsAlone) {
  MOESERVE_REQUIRE_GPU();
  DispatchGuard guard;
  Rng rng(63);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name());
    const Experts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = cuda::upload_experts(ptrs(ex.gate), ptrs(ex.up), ptrs(ex.down), nullptr);
    const int M = 64;
    ASSERT_TRUE(cuda::moe_grouped_serves(cuda::MoeShape{c.E, c.k, c.H, c.I}, d, M));
    for (int f32 = 1; f32 >= 0; --f32) {
      const Inputs in = make_inputs(rng, c, M, f32 != 0);
      const auto batch = run(d, c, M, in, f32 != 0);
      for (int m : {0, 1, 17, 40, 63}) {
        const auto alone = run(d, c, 1, rows(in, c, m, 1), f32 != 0);
        size_t first = 0;
        const size_t diffs = bit_diffs(alone, batch, size_t(m) * c.H, size_t(c.H), &first);
        EXPECT_EQ(diffs, 0u) << "token " << m << (f32 ? " (f32 x + shared)" : " (bf16 x)") << ": " << diffs << " of "
                             << c.H << " outputs differ alone vs in the batch of 64; first at h " << first;
      }
    }
  }
}

// The grouped kernels against the CPU MoE block (exact dequantisation, fp32): a wrong expert,
// group, zero point or column is O(max|routed|); reduction-order noise is ~1e-6 of it.
TEST(GpuOpsMoeGrouped, MatchesCpuMoe) {
  MOESERVE_REQUIRE_GPU();
  DispatchGuard guard;
  Rng rng(64);
  for (const Case& c : std::vector<Case>{{8, 3, 320, 192, 32, false}, {10, 4, 1024, 256, 64, false},
                                         {12, 4, 2048, 512, 128, true}}) {
    SCOPED_TRACE(c.name());
    const Experts ex = make_experts(rng, c);
    std::vector<quant::QuantWeight> rg, ru, rd;
    for (int e = 0; e < c.E; ++e) {
      rg.push_back(dense_f32(ex.gate[size_t(e)].dequant, c.I, c.H, "ref.gate"));
      ru.push_back(dense_f32(ex.up[size_t(e)].dequant, c.I, c.H, "ref.up"));
      rd.push_back(dense_f32(ex.down[size_t(e)].dequant, c.H, c.I, "ref.down"));
    }
    std::vector<cpu::ExpertWeights> cpu_experts;
    for (int e = 0; e < c.E; ++e) cpu_experts.push_back({&rg[size_t(e)], &ru[size_t(e)], &rd[size_t(e)]});
    const TestWeight router = make_dense_bf16(rng, c.E, c.H, 0.05f);
    const int Is = 8;  // a zero shared expert: moe_forward then returns the routed sum alone
    const auto zero_gate = dense_f32(std::vector<float>(size_t(Is) * c.H, 0.0f), Is, c.H, "shared.gate");
    const auto zero_up = dense_f32(std::vector<float>(size_t(Is) * c.H, 0.0f), Is, c.H, "shared.up");
    const auto zero_down = dense_f32(std::vector<float>(size_t(c.H) * Is, 0.0f), c.H, Is, "shared.down");
    const auto zero_sg = dense_f32(std::vector<float>(size_t(c.H), 0.0f), 1, c.H, "shared_expert_gate");
    const cpu::MoeParams params{&router.weight, cpu_experts, {&zero_gate, &zero_up, &zero_down}, &zero_sg, c.k};
    const cuda::DeviceExperts d = cuda::upload_experts(ptrs(ex.gate), ptrs(ex.up), ptrs(ex.down), nullptr);
    for (int M : {9, 40}) {
      ASSERT_TRUE(cuda::moe_grouped_serves(cuda::MoeShape{c.E, c.k, c.H, c.I}, d, M));
      Inputs in = make_inputs(rng, c, M, false);
      in.logits.assign(size_t(M) * c.E, 0.0f);  // the router logits moe_forward computes
      cpu::linear(pool(), in.x.data(), M, router.weight, in.logits.data());
      std::vector<float> routed(size_t(M) * c.H);
      cpu::moe_forward(pool(), params, in.x.data(), M, routed.data());
      std::vector<float> ref = in.residual;
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += routed[i];
      const auto got = run(d, c, M, in, false);
      const double scale = error_stats(routed, routed).max_ref;
      EXPECT_TRUE(all_close("moe grouped " + c.name() + " M=" + std::to_string(M), got, ref, {M, c.H}, {"token", "h"},
                            1e-4 * scale, 1e-6));
    }
  }
}

// Above the default limit (set_moe_grouped_max_tokens raised for an A/B run): still the tiled
// kernels' bits, with experts of up to ~25 tiles and routing outside the grouping CTA (M > 64).
TEST(GpuOpsMoeGrouped, LargerStepsEqualTiledKernels) {
  MOESERVE_REQUIRE_GPU();
  DispatchGuard guard;
  Rng rng(65);
  for (const Case& c : std::vector<Case>{{16, 8, 3072, 1024, 128, true}, {8, 3, 320, 192, 32, false}}) {
    SCOPED_TRACE(c.name());
    const Experts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = cuda::upload_experts(ptrs(ex.gate), ptrs(ex.up), ptrs(ex.down), nullptr);
    cuda::set_moe_grouped_max_tokens(256);
    for (int M : {128, 200}) {
      ASSERT_TRUE(cuda::moe_grouped_serves(cuda::MoeShape{c.E, c.k, c.H, c.I}, d, M));
      const Inputs in = make_inputs(rng, c, M, true);
      cuda::set_moe_grouped_enabled(true);
      const auto grouped = run(d, c, M, in, true);
      cuda::set_moe_grouped_enabled(false);
      const auto tiled = run(d, c, M, in, true);
      cuda::set_moe_grouped_enabled(true);
      size_t first = 0;
      const size_t diffs = bit_diffs(grouped, tiled, 0, grouped.size(), &first);
      EXPECT_EQ(diffs, 0u) << "M = " << M << ": " << diffs << " of " << grouped.size()
                           << " outputs differ; first at token " << first / size_t(c.H) << " h "
                           << first % size_t(c.H);
    }
  }
}
