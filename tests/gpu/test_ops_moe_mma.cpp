// The tensor-core routed-expert block (ops_moe.h moe_routed_experts_mma, ops_moe_mma.cu) against
// the CPU MoE (cpu::moe_forward with a zero shared expert, as tests/gpu/test_ops_moe.cpp), its
// batch invariance (a token's bits alone, among 63 and among 299 other tokens, at different
// positions), its kernel forms (set_moe_mma_variant) against the previous kernels bit for bit
// (variant 1) or within a rounding tolerance (variant 5, the GPTQ word form: other products
// per MMA), variant 7 (per-expert tile sizes) against variant 5 bit for bit, variant 8 (the swapAB
// decode kernels, ops_moe_mma_swap.cu) against variant 7 bit for bit, alone vs in a batch, against
// the CPU MoE and at every forced number of column blocks per CTA, its refusal of GPTQ
// act-order experts and set_moe_mma_variant's refusal of removed or unknown variants.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "backend/cpu/linear.h"
#include "backend/cpu/moe.h"
#include "backend/cuda/ops_moe.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "gpu_test_quant.h"

using namespace moeserve;
using namespace moeserve::gputest;

namespace {

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

struct Experts {
  std::vector<TestWeight> gate, up, down;
  std::vector<quant::QuantWeight> ref_gate, ref_up, ref_down;  // dense f32 of the exact dequantisation
};

struct ExpertCase {
  int E, k, H, I;
  std::string format;  // "bf16", "fp8", "gptq-{sym,asym}-g{32,64,128}", "gptq-actorder"
};

std::string case_name(const ExpertCase& c) {
  return c.format + " E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) + " H=" + std::to_string(c.H) +
         " I=" + std::to_string(c.I);
}

TestWeight make_weight(Rng& rng, const ExpertCase& c, int64_t N, int64_t K) {
  if (c.format == "bf16") return make_dense_bf16(rng, N, K, 0.03f);
  if (c.format == "fp8") return make_fp8_block(rng, N, K, 0.03f, false);
  if (c.format == "gptq-actorder") return make_gptq(rng, N, K, 32, true, true, 0.005f);
  // gptq-<sym|asym>-g<group>
  const bool sym = c.format.rfind("gptq-sym", 0) == 0;
  const int64_t group = std::stoll(c.format.substr(c.format.rfind('g') + 1));
  return make_gptq(rng, N, K, group, sym, false, 0.005f);
}

Experts make_experts(Rng& rng, const ExpertCase& c, bool with_ref) {
  Experts ex;
  for (int e = 0; e < c.E; ++e) {
    ex.gate.push_back(make_weight(rng, c, c.I, c.H));
    ex.up.push_back(make_weight(rng, c, c.I, c.H));
    ex.down.push_back(make_weight(rng, c, c.H, c.I));
    if (!with_ref) continue;
    ex.ref_gate.push_back(dense_f32(ex.gate.back().dequant, c.I, c.H, "ref.gate." + std::to_string(e)));
    ex.ref_up.push_back(dense_f32(ex.up.back().dequant, c.I, c.H, "ref.up." + std::to_string(e)));
    ex.ref_down.push_back(dense_f32(ex.down.back().dequant, c.H, c.I, "ref.down." + std::to_string(e)));
  }
  return ex;
}

std::vector<const quant::QuantWeight*> ptrs(const std::vector<TestWeight>& v) {
  std::vector<const quant::QuantWeight*> p;
  for (const auto& t : v) p.push_back(&t.weight);
  return p;
}

cuda::DeviceExperts upload(const Experts& ex) {
  return cuda::upload_experts(ptrs(ex.gate), ptrs(ex.up), ptrs(ex.down), nullptr);
}

// residual (f32 [M, H]) after moe_routed_experts_mma; *ran = its return value. The workspace is
// filled with 0xFF bytes first (NaN as f32): a slot whose expert output no tile computed reads a
// NaN, not a stale value of an earlier call that happened to get the same allocation.
// shared_out [M, H] / shared_gate [M] (both or neither): the gated shared expert, added by the combine.
std::vector<float> run_mma(const cuda::DeviceExperts& d, const std::vector<float>& x, const std::vector<float>& logits,
                           const std::vector<float>& residual, int M, const ExpertCase& c, bool* ran,
                           const std::vector<float>* shared_out = nullptr,
                           const std::vector<float>* shared_gate = nullptr) {
  const cuda::MoeShape shape{c.E, c.k, c.H, c.I};
  const size_t ws_bytes = cuda::moe_mma_workspace_bytes(shape, M);
  DeviceBuffer<uint8_t> ws(ws_bytes);
  if (cudaMemset(ws.data(), 0xFF, ws_bytes) != cudaSuccess) throw std::runtime_error("cudaMemset failed");
  auto d_x = to_device_f32(x);
  auto d_logits = to_device_f32(logits);
  auto d_res = to_device_f32(residual);
  DeviceBuffer<float> d_shared, d_gate;
  if (shared_out) {
    d_shared = to_device_f32(*shared_out);
    d_gate = to_device_f32(*shared_gate);
  }
  *ran = cuda::moe_routed_experts_mma(d_x.data(), d_logits.data(), shape, d, M, ws.data(), ws_bytes, d_res.data(),
                                      nullptr, shared_out ? d_shared.data() : nullptr,
                                      shared_out ? d_gate.data() : nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("moe_routed_experts_mma failed on the device");
  return to_host(d_res);
}

// As run_mma, on a caller-owned workspace (not refilled: consecutive calls share its state, as the
// model's layers do).
std::vector<float> run_mma_on(DeviceBuffer<uint8_t>& ws, const cuda::DeviceExperts& d, const std::vector<float>& x,
                              const std::vector<float>& logits, const std::vector<float>& residual, int M,
                              const ExpertCase& c, bool* ran, const std::vector<float>* shared_out = nullptr,
                              const std::vector<float>* shared_gate = nullptr) {
  const cuda::MoeShape shape{c.E, c.k, c.H, c.I};
  auto d_x = to_device_f32(x);
  auto d_logits = to_device_f32(logits);
  auto d_res = to_device_f32(residual);
  DeviceBuffer<float> d_shared, d_gate;
  if (shared_out) {
    d_shared = to_device_f32(*shared_out);
    d_gate = to_device_f32(*shared_gate);
  }
  *ran = cuda::moe_routed_experts_mma(d_x.data(), d_logits.data(), shape, d, M, ws.data(), ws.size(), d_res.data(),
                                      nullptr, shared_out ? d_shared.data() : nullptr,
                                      shared_out ? d_gate.data() : nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("moe_routed_experts_mma failed on the device");
  return to_host(d_res);
}

bool bits_equal(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// "" when got equals ref in every bit; else how many outputs differ and the first one: its token and
// column (rows of H values) and both values with their bits.
std::string bit_diff_report(const std::vector<float>& got, const std::vector<float>& ref, int H) {
  if (got.size() != ref.size())
    return "sizes differ: " + std::to_string(got.size()) + " vs " + std::to_string(ref.size());
  size_t diffs = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!bits_equal(got[i], ref[i]) && diffs++ == 0) first = i;
  if (diffs == 0) return "";
  uint32_t gb = 0, rb = 0;
  std::memcpy(&gb, &got[first], 4);
  std::memcpy(&rb, &ref[first], 4);
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%zu of %zu outputs differ; first at token %zu column %zu: %.9g (0x%08x) vs %.9g (0x%08x)", diffs,
                got.size(), first / size_t(H), first % size_t(H), double(got[first]), gb, double(ref[first]), rb);
  return buf;
}

// Restores the default kernel form when a test ends (also on a failed ASSERT).
struct VariantGuard {
  int saved = cuda::moe_mma_variant();
  ~VariantGuard() { cuda::set_moe_mma_variant(saved); }
};

}  // namespace

// Every supported format at the 122B-A10B expert shape (E reduced to 16, top-8: at M = 300 each
// expert has ~150 slots, so several 64-slot tiles; at M = 64 ~32, the 32-slot tiling; M = 1 / 7
// the 16-slot one) and at small odd shapes (partial column blocks, FP8 edge blocks, GPTQ groups
// 32 / 64 / 128; M = 64 takes the 32-slot tiling there too). Error: max |got − ref| / max |routed|.
TEST(GpuOpsMoeMma, MatchesCpuMoe) {
  MOESERVE_REQUIRE_GPU();
  VariantGuard guard;
  Rng rng(71);
  const std::vector<ExpertCase> cases{
      {16, 8, 3072, 1024, "gptq-sym-g128"}, {16, 8, 3072, 1024, "gptq-asym-g128"}, {16, 8, 3072, 1024, "gptq-asym-g32"},
      {16, 8, 3072, 1024, "fp8"},           {16, 8, 3072, 1024, "bf16"},           {8, 3, 256, 96, "gptq-asym-g32"},
      {8, 3, 256, 128, "gptq-asym-g128"},   {6, 2, 384, 64, "gptq-sym-g64"},       {10, 4, 208, 48, "fp8"},
      {8, 3, 80, 32, "bf16"}};
  for (const auto& c : cases) {
    const std::string name = case_name(c);
    SCOPED_TRACE(name);
    const Experts ex = make_experts(rng, c, true);
    const TestWeight router = make_dense_bf16(rng, c.E, c.H, 0.05f);
    const int Is = 8;  // a zero shared expert: cpu::moe_forward then returns the routed sum alone
    const auto zero_gate = dense_f32(std::vector<float>(size_t(Is) * c.H, 0.0f), Is, c.H, "shared.gate");
    const auto zero_up = dense_f32(std::vector<float>(size_t(Is) * c.H, 0.0f), Is, c.H, "shared.up");
    const auto zero_down = dense_f32(std::vector<float>(size_t(c.H) * Is, 0.0f), c.H, Is, "shared.down");
    const auto zero_sg = dense_f32(std::vector<float>(size_t(c.H), 0.0f), 1, c.H, "shared_expert_gate");
    std::vector<cpu::ExpertWeights> cpu_experts;
    for (int e = 0; e < c.E; ++e)
      cpu_experts.push_back({&ex.ref_gate[size_t(e)], &ex.ref_up[size_t(e)], &ex.ref_down[size_t(e)]});
    const cpu::MoeParams params{&router.weight, cpu_experts, {&zero_gate, &zero_up, &zero_down}, &zero_sg, c.k};
    const cuda::DeviceExperts d = upload(ex);

    for (int M : {1, 7, 64, 300}) {
      const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);  // f32 activations: the hi/lo split matters
      std::vector<float> logits(size_t(M) * c.E);
      cpu::linear(pool(), x.data(), M, router.weight, logits.data());
      std::vector<float> routed(size_t(M) * c.H);
      cpu::moe_forward(pool(), params, x.data(), M, routed.data());
      const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
      for (int v : {guard.saved, 5}) {  // the default form and the GPTQ word form (its own k order)
        cuda::set_moe_mma_variant(v);
        bool ran = false;
        const auto got = run_mma(d, x, logits, residual, M, c, &ran);
        ASSERT_TRUE(ran) << "moe_routed_experts_mma refused a supported format";
        double max_err = 0, max_ref = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          max_err = std::max(max_err, std::fabs(double(got[i]) - (double(residual[i]) + double(routed[i]))));
          max_ref = std::max(max_ref, std::fabs(double(routed[i])));
        }
        const double rel = max_err / max_ref;
        std::printf("  moe_mma %s M=%d form %d: max|err| %.3e, max|routed| %.3e, rel %.3e\n", name.c_str(), M, v,
                    max_err, max_ref, rel);
        EXPECT_LT(rel, 1e-3) << name << " M=" << M << " form " << v;
      }
      cuda::set_moe_mma_variant(guard.saved);
    }
  }
}

// A token's residual row is bit-identical alone (M = 1), at position 5 of 32 tokens, at position 17
// of 64 tokens and at position 250 / 0 of 300 tokens (the others random), for every supported format.
// ops_moe_mma.cu picks its tiling by the average slots per expert M·k / E (tiles of 16 slots up
// to 4, of 32 up to 40, of 64 above): E = 16, k = 8 runs M = 1 on 16-slot tiles, M = 32 / 64 on
// 32-slot tiles (16 / 32 slots per expert: partial, full and several tiles per expert, tiles of
// <= 16 slots whose second m16 fragment is skipped) and M = 300 on 64-slot tiles; E = 8, k = 3
// the same; E = 64 runs M = 1 and M = 32 (256 slots) on 16-slot tiles and M = 64 / 300 on
// 32-slot tiles. So all three tilings, partial and full tiles must give the token's bits. M = 100
// (E = 16, k = 8: ~50 slots per expert, counts on both sides of 32 and 64) and M = 1024 (~512:
// several full 64-slot tiles and a remainder) run variant 7's two tile lists with both tilings
// in one call. The batches run with the kernel forms 0, 1, 5 and 7 (set_moe_mma_variant), the
// token alone with form 1 (the reference of forms 0 and 1, which give the same bits) and with
// form 5 (the reference of 5 and 7: the GPTQ word form has its own k order, so its own bits; FP8 /
// bf16 run form 1 there).
TEST(GpuOpsMoeMma, TokenOutputIndependentOfBatch) {
  MOESERVE_REQUIRE_GPU();
  VariantGuard guard;
  cuda::moe_mma_prepare();  // the model's construction-time opt-ins (MatchesCpuMoe relies on the first call's)
  Rng rng(72);
  const std::vector<ExpertCase> cases{{16, 8, 3072, 1024, "gptq-sym-g128"},
                                      {16, 8, 1024, 512, "gptq-asym-g32"},
                                      {16, 8, 1024, 512, "gptq-sym-g64"},
                                      {16, 8, 1024, 512, "fp8"},
                                      {16, 8, 1024, 256, "bf16"},
                                      {8, 3, 256, 96, "gptq-asym-g32"},
                                      {64, 8, 512, 256, "gptq-asym-g64"},
                                      {64, 8, 512, 256, "fp8"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(case_name(c));
    const Experts ex = make_experts(rng, c, false);
    const cuda::DeviceExperts d = upload(ex);
    const auto xt = random_f32(rng, size_t(c.H), 1.0f);
    const auto lt = random_f32(rng, size_t(c.E), 2.0f);
    const auto rt = random_f32(rng, size_t(c.H), 1.0f);
    bool ran = false;
    cuda::set_moe_mma_variant(1);
    const auto alone = run_mma(d, xt, lt, rt, 1, c, &ran);
    ASSERT_TRUE(ran);
    cuda::set_moe_mma_variant(5);
    const auto alone5 = run_mma(d, xt, lt, rt, 1, c, &ran);
    ASSERT_TRUE(ran);
    cuda::set_moe_mma_variant(guard.saved);
    for (auto [M, pos] :
         std::vector<std::pair<int, int>>{{32, 5}, {64, 17}, {100, 42}, {300, 250}, {300, 0}, {1024, 700}}) {
      auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
      auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
      auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
      std::copy(xt.begin(), xt.end(), x.begin() + long(pos) * c.H);
      std::copy(lt.begin(), lt.end(), logits.begin() + long(pos) * c.E);
      std::copy(rt.begin(), rt.end(), residual.begin() + long(pos) * c.H);
      for (int v : {0, 1, 5, 7}) {
        cuda::set_moe_mma_variant(v);
        const auto batch = run_mma(d, x, logits, residual, M, c, &ran);
        ASSERT_TRUE(ran);
        const auto& ref = v >= 5 ? alone5 : alone;
        int diffs = 0;
        for (int h = 0; h < c.H; ++h) diffs += !bits_equal(ref[size_t(h)], batch[size_t(pos) * c.H + size_t(h)]);
        EXPECT_EQ(diffs, 0) << "form " << v << ", token at " << pos << " of " << M << ": " << diffs << " of " << c.H
                            << " outputs differ from the token alone";
      }
      cuda::set_moe_mma_variant(guard.saved);
    }
  }
}

// The cases the kernel-form comparisons below run: the 122B-A10B expert shape (E reduced to 16),
// every GPTQ zero mode and group size, FP8, bf16, and small odd shapes (partial column blocks,
// partial tiles, FP8 edge blocks).
const std::vector<ExpertCase> kFormCases{
    {16, 8, 3072, 1024, "gptq-sym-g128"}, {16, 8, 1024, 512, "gptq-asym-g128"}, {16, 8, 1024, 512, "gptq-sym-g64"},
    {16, 8, 1024, 512, "gptq-asym-g64"},  {16, 8, 1024, 512, "gptq-sym-g32"},   {16, 8, 1024, 512, "gptq-asym-g32"},
    {16, 8, 1024, 512, "fp8"},            {16, 8, 1024, 256, "bf16"},           {8, 3, 256, 96, "gptq-asym-g32"},
    {6, 2, 384, 64, "gptq-sym-g64"},      {8, 3, 256, 128, "gptq-asym-g128"},   {10, 4, 208, 48, "fp8"}};

// The kernel form 1 of set_moe_mma_variant (PRMT GPTQ dequantisation and the 1 x 8 64-slot
// tiling) against the previous kernels (0), bit for bit, for every format (GPTQ sym / asym with
// groups 32 / 64 / 128, FP8, bf16) and M = 1, 5 (16-slot tiles), 64 (32-slot tiles), 300 and 1024
// (64-slot tiles), at the 122B-A10B expert shape (E reduced to 16) and at small odd shapes (partial
// column blocks, partial tiles, FP8 edge blocks). Any wrong B value, row, column or group scale
// changes bits.
TEST(GpuOpsMoeMma, KernelFormsMatchPreviousKernels) {
  MOESERVE_REQUIRE_GPU();
  VariantGuard guard;
  Rng rng(74);
  for (const auto& c : kFormCases) {
    SCOPED_TRACE(case_name(c));
    const Experts ex = make_experts(rng, c, false);
    const cuda::DeviceExperts d = upload(ex);
    for (int M : {1, 5, 64, 300, 1024}) {
      const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
      const auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
      const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
      bool ran = false;
      cuda::set_moe_mma_variant(0);
      const auto ref = run_mma(d, x, logits, residual, M, c, &ran);
      ASSERT_TRUE(ran);
      int changed = 0;  // the experts did add something (a guard against comparing two no-ops)
      for (size_t i = 0; i < ref.size(); ++i) changed += !bits_equal(ref[i], residual[i]);
      EXPECT_GT(changed, int(ref.size() / 2)) << "M=" << M;
      cuda::set_moe_mma_variant(1);
      const auto got = run_mma(d, x, logits, residual, M, c, &ran);
      ASSERT_TRUE(ran);
      EXPECT_EQ(bit_diff_report(got, ref, c.H), "") << "form 1 M=" << M << " against the previous kernels";
    }
  }
}

// Variant 5 (the GPTQ word form: the activations' k permuted inside each 32-k block, each thread's
// B registers of two k16 steps from one weight word) against the previous kernels (0): the same
// exact products (hi / lo bf16 activations x exact q − zero) summed per group in f32, but other
// products share an MMA, so the bits differ by rounding only. Bound: the CPU comparison
// (MatchesCpuMoe) allows 1e-3 of max |routed| for either form; the two forms' difference is a
// difference of two such rounding errors, so 1e-4 of max |routed| here (a wrong nibble, k order,
// column, zero point or group scale moves outputs by O(max |routed|)). FP8 / bf16 cases must be
// bit-identical to form 1 (they run form 1 under variant 5). Variant 7 (per-expert tile sizes:
// 64-slot tiles and 32-slot remainders in one call) must give variant 5's bits, for every format. GPTQ at every tiling (M 1,
// 5: 16-slot; 64: 32-slot; 100, 300, 1024: 64-slot; variant 7 above 4 slots per expert: both, M 100
// at E = 16, k = 8 with ~50 slots per expert on both sides of 32 and 64), sym and asym, groups
// 32 / 64 / 128, partial column blocks and tiles.
TEST(GpuOpsMoeMma, WordFormMatchesPreviousKernels) {
  MOESERVE_REQUIRE_GPU();
  VariantGuard guard;
  Rng rng(75);
  for (const auto& c : kFormCases) {
    SCOPED_TRACE(case_name(c));
    const bool gptq = c.format.rfind("gptq", 0) == 0;
    const Experts ex = make_experts(rng, c, false);
    const cuda::DeviceExperts d = upload(ex);
    for (int M : {1, 5, 64, 100, 300, 1024}) {
      const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
      const auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
      const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
      bool ran = false;
      cuda::set_moe_mma_variant(gptq ? 0 : 1);
      const auto ref = run_mma(d, x, logits, residual, M, c, &ran);
      ASSERT_TRUE(ran);
      cuda::set_moe_mma_variant(5);
      const auto got = run_mma(d, x, logits, residual, M, c, &ran);
      ASSERT_TRUE(ran);
      cuda::set_moe_mma_variant(7);
      const auto got7 = run_mma(d, x, logits, residual, M, c, &ran);
      ASSERT_TRUE(ran);
      int diffs7 = 0;
      for (size_t i = 0; i < got.size(); ++i) diffs7 += !bits_equal(got7[i], got[i]);
      EXPECT_EQ(diffs7, 0) << "M=" << M << ": variant 7 differs from variant 5";
      double max_diff = 0, max_routed = 0;
      int diffs = 0;
      size_t worst = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double dlt = std::fabs(double(got[i]) - double(ref[i]));
        if (dlt > max_diff) {
          max_diff = dlt;
          worst = i;
        }
        max_routed = std::max(max_routed, std::fabs(double(ref[i]) - double(residual[i])));
        diffs += !bits_equal(got[i], ref[i]);
      }
      const double rel = max_routed > 0 ? max_diff / max_routed : 1.0;
      std::printf("  moe_mma form 5 vs %d, %s M=%d: %d of %zu outputs differ, max|diff| %.3e, max|routed| %.3e, "
                  "rel %.3e\n",
                  gptq ? 0 : 1, case_name(c).c_str(), M, diffs, got.size(), max_diff, max_routed, rel);
      EXPECT_GT(max_routed, 0.0) << "M=" << M;
      if (gptq)
        EXPECT_LT(rel, 1e-4) << "M=" << M << ": worst at token " << worst / size_t(c.H) << " column "
                             << worst % size_t(c.H) << ": " << got[worst] << " vs " << ref[worst];
      else
        EXPECT_EQ(diffs, 0) << "M=" << M << ": FP8 / bf16 experts run form 1 under variant 5";
    }
  }
}

// Variant 7's per-expert tiles at chosen expert slot counts: top-2 routing forced (each token's two
// largest logits name two different experts) so that the experts get exactly `counts` slots: 0, 1,
// the edges 31 / 32 / 33 (one 32-slot tile / one 64-slot tile), 63 / 64 / 65 (one 64-slot tile /
// a 64-slot tile plus a 1-slot 32-slot tile), 95 / 96 / 97 (64 + 31 / 32 on a 32-slot tile, 64 + 33
// on a second 64-slot tile), 128 / 129 ... at 56 slots per expert on average (variant 5: 64-slot
// tiles for all), and a case of 7.8 on average (variant 5: 32-slot tiles, two for the experts of
// 33-65 slots), and 26 slots on 6 experts (4.3 per expert: variant 7 launches only its 32-slot
// kernels). Variant 7 must give variant 5's bits for every token, and every routed output must
// have been computed (the workspace starts as NaN: run_mma).
TEST(GpuOpsMoeMma, PerExpertTilesMatchWordForm) {
  MOESERVE_REQUIRE_GPU();
  VariantGuard guard;
  Rng rng(76);
  struct CountCase {
    int E, k, H, I;
    const char* format;
    const std::vector<int>* counts;  // slots per expert (sum = 2·M, each <= M)
  };
  std::vector<int> wide(64, 5);  // 60 experts of 5 slots, then 33, 64, 65, 40
  wide[60] = 33, wide[61] = 64, wide[62] = 65, wide[63] = 40;
  const std::vector<int> edges{0, 1, 31, 32, 33, 63, 64, 65, 95, 96, 97, 128, 129, 2, 17, 47};
  const std::vector<int> tiny{0, 1, 5, 9, 11, 0};  // 26 slots: no 64-slot tile can exist (no 64-slot launch)
  const CountCase cases[] = {{16, 2, 3072, 1024, "gptq-sym-g128", &edges},
                             {16, 2, 1024, 512, "gptq-asym-g32", &edges},
                             {16, 2, 1024, 256, "fp8", &edges},
                             {64, 2, 512, 256, "gptq-asym-g64", &wide},
                             {64, 2, 1024, 512, "gptq-sym-g128", &wide},
                             {6, 2, 384, 64, "gptq-sym-g64", &tiny}};
  for (const auto& cc : cases) {
    const ExpertCase c{cc.E, cc.k, cc.H, cc.I, cc.format};
    const std::vector<int>& counts = *cc.counts;
    SCOPED_TRACE(case_name(c));
    int slots = 0;
    for (int n : counts) slots += n;
    ASSERT_EQ(int(counts.size()), c.E);
    ASSERT_EQ(slots % 2, 0);
    const int M = slots / 2;
    // The slots' experts in ascending order; token m takes list[m] and list[m + M], different
    // experts as no expert has more than M slots (a run of equal ids is shorter than M + 1).
    std::vector<int> list;
    for (int e = 0; e < c.E; ++e) {
      ASSERT_LE(counts[size_t(e)], M);
      list.insert(list.end(), size_t(counts[size_t(e)]), e);
    }
    auto logits = random_f32(rng, size_t(M) * c.E, 0.5f);  // |l| < 1.8 (Rng::normal is bounded by 3.47)
    for (int m = 0; m < M; ++m) {
      ASSERT_NE(list[size_t(m)], list[size_t(m + M)]);
      logits[size_t(m) * c.E + size_t(list[size_t(m)])] = 5.0f;
      logits[size_t(m) * c.E + size_t(list[size_t(m + M)])] = 4.0f;
    }
    const Experts ex = make_experts(rng, c, false);
    const cuda::DeviceExperts d = upload(ex);
    const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
    const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
    bool ran = false;
    cuda::set_moe_mma_variant(5);
    const auto ref = run_mma(d, x, logits, residual, M, c, &ran);
    ASSERT_TRUE(ran);
    int unchanged = 0, nans = 0;  // every token's row must have changed (two experts each) and be finite
    for (int m = 0; m < M; ++m) {
      int changed = 0;
      for (int h = 0; h < c.H; ++h) {
        const size_t i = size_t(m) * c.H + size_t(h);
        changed += !bits_equal(ref[i], residual[i]);
        nans += !std::isfinite(ref[i]);
      }
      unchanged += changed < c.H / 2;
    }
    EXPECT_EQ(unchanged, 0) << "tokens whose routed output looks missing under variant 5";
    EXPECT_EQ(nans, 0);
    cuda::set_moe_mma_variant(7);
    const auto got = run_mma(d, x, logits, residual, M, c, &ran);
    ASSERT_TRUE(ran);
    EXPECT_EQ(bit_diff_report(got, ref, c.H), "") << "M=" << M << ": variant 7 against variant 5";
  }
}

// set_moe_mma_variant takes 0, 1, 5, 7 and 8 only: the removed variants (2, 3, 4, 6) and values
// outside 0 .. 8 throw Error naming the valid values and leave the previous variant in place (a
// host-side check: no GPU needed).
TEST(GpuOpsMoeMma, RejectsRemovedAndUnknownVariants) {
  VariantGuard guard;
  for (int prev : {0, 1, 5, 7, 8}) {
    cuda::set_moe_mma_variant(prev);
    ASSERT_EQ(cuda::moe_mma_variant(), prev);
    for (int bad : {2, 3, 4, 6, 9, -1}) {
      try {
        cuda::set_moe_mma_variant(bad);
        ADD_FAILURE() << "variant " << bad << " was accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("0, 1, 5, 7, 8"), std::string::npos) << e.what();
      }
      EXPECT_EQ(cuda::moe_mma_variant(), prev) << "variant " << bad << " changed the variant";
    }
  }
}

// GPTQ act-order experts (g_idx) are not supported: false, and the residual is untouched.
TEST(GpuOpsMoeMma, FallsBackOnActOrder) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(73);
  const ExpertCase c{8, 3, 256, 128, "gptq-actorder"};
  const Experts ex = make_experts(rng, c, false);
  const cuda::DeviceExperts d = upload(ex);
  const int M = 5;
  const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
  const auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
  const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
  bool ran = true;
  const auto got = run_mma(d, x, logits, residual, M, c, &ran);
  EXPECT_FALSE(ran);
  int diffs = 0;
  for (size_t i = 0; i < got.size(); ++i) diffs += !bits_equal(got[i], residual[i]);
  EXPECT_EQ(diffs, 0) << "the residual changed although the call returned false";
}

// Variant 8 (the swapAB decode kernels, ops_moe_mma_swap.cu: the weights as the MMA's A operand, the
// slots as B, used for GPTQ at <= 4 slots per expert on average) against variant 7 (the word form,
// kernel form 3, on 16-slot tiles there), BIT FOR BIT: the two compute every output with the same
// MMAs (the same 16 exact products per MMA at the same k positions, the same C) and the same f32
// operations, only with A and B swapped. A mismatch here means the hardware's MMA is not symmetric
// in its operands, or a wrong fragment / nibble / column / slot / group / zero / scale in the swap
// kernels (those move outputs far more). The first mismatch is reported. Cases: E 32 at the
// 122B-A10B expert shape (M 1 .. 16: <= 4 slots per expert), E 256 with smaller H / I (M 1 .. 64:
// decode batches up to 64 at top-8), small E (M 1 .. 4), odd multiples of the group (partial rounds
// of 4 groups, a single partial round), sym and asym zeros, groups 32 / 64 / 128, with and without
// the gated shared expert.
TEST(GpuOpsMoeMma, SwapTilingMatchesWordFormBitForBit) {
  MOESERVE_REQUIRE_GPU();
  VariantGuard guard;
  Rng rng(77);
  struct SwapCase {
    ExpertCase c;
    std::vector<int> Ms;
  };
  const std::vector<int> kDecode{1, 2, 3, 5, 8, 16, 33, 64};
  const std::vector<SwapCase> cases{{{32, 8, 3072, 1024, "gptq-sym-g128"}, {1, 2, 3, 5, 8, 16}},
                                    {{32, 8, 3072, 1024, "gptq-asym-g128"}, {1, 2, 3, 5, 8, 16}},
                                    {{32, 8, 3072, 1024, "gptq-asym-g32"}, {1, 5, 16}},
                                    {{256, 8, 256, 128, "gptq-asym-g64"}, kDecode},
                                    {{256, 8, 256, 128, "gptq-sym-g32"}, kDecode},
                                    {{256, 8, 384, 128, "gptq-asym-g128"}, kDecode},
                                    {{8, 2, 352, 96, "gptq-asym-g32"}, {1, 2, 3, 4}},
                                    {{8, 2, 320, 192, "gptq-sym-g64"}, {1, 2, 3, 4}},
                                    {{6, 3, 640, 384, "gptq-asym-g128"}, {1, 2, 3, 4}}};
  for (const auto& sc : cases) {
    const ExpertCase& c = sc.c;
    SCOPED_TRACE(case_name(c));
    const Experts ex = make_experts(rng, c, false);
    const cuda::DeviceExperts d = upload(ex);
    for (int M : sc.Ms) {
      ASSERT_LE(M * c.k, 4 * c.E) << "the case must be in the swap kernels' regime";
      const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
      const auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
      const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
      const auto shared = random_f32(rng, size_t(M) * c.H, 0.5f);
      const auto gate = random_f32(rng, size_t(M), 1.0f);
      for (bool with_shared : {false, true}) {
        const auto* so = with_shared ? &shared : nullptr;
        const auto* sg = with_shared ? &gate : nullptr;
        bool ran = false;
        cuda::set_moe_mma_variant(7);
        const auto ref = run_mma(d, x, logits, residual, M, c, &ran, so, sg);
        ASSERT_TRUE(ran);
        int changed = 0;  // the experts did add something (a guard against comparing two no-ops)
        for (size_t i = 0; i < ref.size(); ++i) changed += !bits_equal(ref[i], residual[i]);
        EXPECT_GT(changed, int(ref.size() / 2)) << "M=" << M;
        cuda::set_moe_mma_variant(8);
        const auto got = run_mma(d, x, logits, residual, M, c, &ran, so, sg);
        ASSERT_TRUE(ran);
        int nans = 0;
        for (float v : got) nans += !std::isfinite(v);
        EXPECT_EQ(nans, 0) << "M=" << M;
        EXPECT_EQ(bit_diff_report(got, ref, c.H), "")
            << "M=" << M << (with_shared ? " (shared expert)" : "") << ": variant 8 against variant 7";
      }
    }
  }
  cuda::set_moe_mma_variant(guard.saved);
}

// Variant 8's batch invariance: a token's residual row is bit-identical alone (M = 1) and at
// positions inside batches of 2 .. 64 tokens (the others random; all in the swap kernels' regime
// at E 256 / top-8 and at E 32 with the 122B-A10B expert shape), and equal to variant 7's token alone.
TEST(GpuOpsMoeMma, SwapTilingTokenOutputIndependentOfBatch) {
  MOESERVE_REQUIRE_GPU();
  VariantGuard guard;
  cuda::moe_mma_prepare();
  Rng rng(78);
  const std::vector<ExpertCase> cases{{256, 8, 256, 128, "gptq-asym-g64"},
                                      {256, 8, 384, 256, "gptq-sym-g128"},
                                      {32, 8, 3072, 1024, "gptq-sym-g128"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(case_name(c));
    const Experts ex = make_experts(rng, c, false);
    const cuda::DeviceExperts d = upload(ex);
    const auto xt = random_f32(rng, size_t(c.H), 1.0f);
    const auto lt = random_f32(rng, size_t(c.E), 2.0f);
    const auto rt = random_f32(rng, size_t(c.H), 1.0f);
    bool ran = false;
    cuda::set_moe_mma_variant(8);
    const auto alone = run_mma(d, xt, lt, rt, 1, c, &ran);
    ASSERT_TRUE(ran);
    cuda::set_moe_mma_variant(7);
    const auto alone7 = run_mma(d, xt, lt, rt, 1, c, &ran);
    ASSERT_TRUE(ran);
    int diffs7 = 0;
    for (int h = 0; h < c.H; ++h) diffs7 += !bits_equal(alone[size_t(h)], alone7[size_t(h)]);
    EXPECT_EQ(diffs7, 0) << "the token alone: variant 8 differs from variant 7";
    cuda::set_moe_mma_variant(8);
    const int max_m = 4 * c.E / c.k;
    for (auto [M, pos] : std::vector<std::pair<int, int>>{{2, 1}, {7, 3}, {16, 0}, {33, 20}, {64, 63}, {64, 17}}) {
      if (M > max_m) continue;
      auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
      auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
      auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
      std::copy(xt.begin(), xt.end(), x.begin() + long(pos) * c.H);
      std::copy(lt.begin(), lt.end(), logits.begin() + long(pos) * c.E);
      std::copy(rt.begin(), rt.end(), residual.begin() + long(pos) * c.H);
      const auto batch = run_mma(d, x, logits, residual, M, c, &ran);
      ASSERT_TRUE(ran);
      int diffs = 0;
      for (int h = 0; h < c.H; ++h) diffs += !bits_equal(alone[size_t(h)], batch[size_t(pos) * c.H + size_t(h)]);
      EXPECT_EQ(diffs, 0) << "token at " << pos << " of " << M << ": " << diffs << " of " << c.H
                          << " outputs differ from the token alone";
    }
  }
  cuda::set_moe_mma_variant(guard.saved);
}

// Variant 8 against the CPU MoE (as MatchesCpuMoe) at M 1 and 8 (E 16, top-8: 0.5 and 4 slots per
// expert, the swap kernels), GPTQ sym / asym at the 122B-A10B expert shape and a small odd shape.
// Error: max |got − ref| / max |routed| < 1e-3.
TEST(GpuOpsMoeMma, SwapTilingMatchesCpuMoe) {
  MOESERVE_REQUIRE_GPU();
  VariantGuard guard;
  Rng rng(79);
  const std::vector<ExpertCase> cases{{16, 8, 3072, 1024, "gptq-sym-g128"},
                                      {16, 8, 3072, 1024, "gptq-asym-g128"},
                                      {16, 8, 352, 96, "gptq-asym-g32"},
                                      {16, 8, 320, 192, "gptq-sym-g64"}};
  for (const auto& c : cases) {
    const std::string name = case_name(c);
    SCOPED_TRACE(name);
    const Experts ex = make_experts(rng, c, true);
    const TestWeight router = make_dense_bf16(rng, c.E, c.H, 0.05f);
    const int Is = 8;  // a zero shared expert: cpu::moe_forward then returns the routed sum alone
    const auto zero_gate = dense_f32(std::vector<float>(size_t(Is) * c.H, 0.0f), Is, c.H, "shared.gate");
    const auto zero_up = dense_f32(std::vector<float>(size_t(Is) * c.H, 0.0f), Is, c.H, "shared.up");
    const auto zero_down = dense_f32(std::vector<float>(size_t(c.H) * Is, 0.0f), c.H, Is, "shared.down");
    const auto zero_sg = dense_f32(std::vector<float>(size_t(c.H), 0.0f), 1, c.H, "shared_expert_gate");
    std::vector<cpu::ExpertWeights> cpu_experts;
    for (int e = 0; e < c.E; ++e)
      cpu_experts.push_back({&ex.ref_gate[size_t(e)], &ex.ref_up[size_t(e)], &ex.ref_down[size_t(e)]});
    const cpu::MoeParams params{&router.weight, cpu_experts, {&zero_gate, &zero_up, &zero_down}, &zero_sg, c.k};
    const cuda::DeviceExperts d = upload(ex);
    for (int M : {1, 8}) {
      const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
      std::vector<float> logits(size_t(M) * c.E);
      cpu::linear(pool(), x.data(), M, router.weight, logits.data());
      std::vector<float> routed(size_t(M) * c.H);
      cpu::moe_forward(pool(), params, x.data(), M, routed.data());
      const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
      cuda::set_moe_mma_variant(8);
      bool ran = false;
      const auto got = run_mma(d, x, logits, residual, M, c, &ran);
      ASSERT_TRUE(ran) << "moe_routed_experts_mma refused a supported format";
      double max_err = 0, max_ref = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        max_err = std::max(max_err, std::fabs(double(got[i]) - (double(residual[i]) + double(routed[i]))));
        max_ref = std::max(max_ref, std::fabs(double(routed[i])));
      }
      const double rel = max_err / max_ref;
      std::printf("  moe_mma swap %s M=%d: max|err| %.3e, max|routed| %.3e, rel %.3e\n", name.c_str(), M, max_err,
                  max_ref, rel);
      EXPECT_LT(rel, 1e-3) << name << " M=" << M;
    }
  }
  cuda::set_moe_mma_variant(guard.saved);
}

// Variant 8 against variant 7, bit for bit, at every swap tile size: top-2 routing forced so that
// experts get exactly 1 .. 8 slots (one tile each), 9, 12 and 17 (two and three tiles: 8 + 1, 8 + 4,
// 8 + 8 + 1) at the 122B-A10B expert shape, so gate_up runs both of its B paths (the tile's x split
// once into shared-memory planes: up to 4 slots at g 128, 2 at g 32; x split in registers per round
// above), and with the gated shared expert. 74 slots on 32 experts: 2.3 per expert, the swap regime.
TEST(GpuOpsMoeMma, SwapTilingMatchesWordFormAtEveryTileCount) {
  MOESERVE_REQUIRE_GPU();
  VariantGuard guard;
  Rng rng(80);
  std::vector<int> counts(32, 0);
  const int filled[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 17};
  for (int i = 0; i < 11; ++i) counts[size_t(3 * i % 32)] = filled[i];  // spread over the expert ids
  for (const char* format : {"gptq-asym-g128", "gptq-sym-g32"}) {
    const ExpertCase c{32, 2, 3072, 1024, format};
    SCOPED_TRACE(case_name(c));
    int slots = 0;
    for (int n : counts) slots += n;
    ASSERT_EQ(slots % 2, 0);
    const int M = slots / 2;
    ASSERT_LE(slots, 4 * c.E);
    std::vector<int> list;  // the slots' experts in ascending order; token m takes list[m], list[m + M]
    for (int e = 0; e < c.E; ++e) list.insert(list.end(), size_t(counts[size_t(e)]), e);
    auto logits = random_f32(rng, size_t(M) * c.E, 0.5f);
    for (int m = 0; m < M; ++m) {
      ASSERT_NE(list[size_t(m)], list[size_t(m + M)]);
      logits[size_t(m) * c.E + size_t(list[size_t(m)])] = 5.0f;
      logits[size_t(m) * c.E + size_t(list[size_t(m + M)])] = 4.0f;
    }
    const Experts ex = make_experts(rng, c, false);
    const cuda::DeviceExperts d = upload(ex);
    const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
    const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
    const auto shared = random_f32(rng, size_t(M) * c.H, 0.5f);
    const auto gate = random_f32(rng, size_t(M), 1.0f);
    bool ran = false;
    cuda::set_moe_mma_variant(7);
    const auto ref = run_mma(d, x, logits, residual, M, c, &ran, &shared, &gate);
    ASSERT_TRUE(ran);
    cuda::set_moe_mma_variant(8);
    const auto got = run_mma(d, x, logits, residual, M, c, &ran, &shared, &gate);
    ASSERT_TRUE(ran);
    EXPECT_EQ(bit_diff_report(got, ref, c.H), "") << "M=" << M << ": variant 8 against variant 7";
  }
  cuda::set_moe_mma_variant(guard.saved);
}

// Variant 8's fused-routing form (M <= 8, E <= 256: gate_up routes each slot itself, down combines
// through the arrival counters; two launches) against variant 7 bit for bit at every M 1 .. 8, with
// and without the gated shared expert, at shapes other than the 122B-A10B one: top-6 of E 64 (H of
// 2 rounds of groups in gate_up: 2304 at g 128 / 64; 2176 at g 32, where the two C buffers do not fit
// 99 KB and one buffer with a barrier per round runs), top-8 of E 256 (8 logits per routing lane);
// then M 9, 12, 16 of the same shapes on the tiled form (route_and_group with 4-slot tiles, down
// with the combine). Every routed output must differ from the residual (the experts ran).
TEST(GpuOpsMoeMma, SwapFusedRoutingMatchesWordForm) {
  MOESERVE_REQUIRE_GPU();
  VariantGuard guard;
  Rng rng(81);
  const std::vector<ExpertCase> cases{{64, 6, 2304, 256, "gptq-sym-g128"},
                                      {64, 6, 2304, 320, "gptq-asym-g64"},
                                      {64, 6, 2176, 192, "gptq-asym-g32"},
                                      {256, 8, 256, 128, "gptq-sym-g128"},
                                      {256, 8, 384, 256, "gptq-asym-g128"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(case_name(c));
    const Experts ex = make_experts(rng, c, false);
    const cuda::DeviceExperts d = upload(ex);
    for (int M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16}) {
      ASSERT_LE(M * c.k, 4 * c.E) << "the case must be in the swap kernels' regime";
      const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
      const auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
      const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
      const auto shared = random_f32(rng, size_t(M) * c.H, 0.5f);
      const auto gate = random_f32(rng, size_t(M), 1.0f);
      for (bool with_shared : {false, true}) {
        const auto* so = with_shared ? &shared : nullptr;
        const auto* sg = with_shared ? &gate : nullptr;
        bool ran = false;
        cuda::set_moe_mma_variant(7);
        const auto ref = run_mma(d, x, logits, residual, M, c, &ran, so, sg);
        ASSERT_TRUE(ran);
        int changed = 0;
        for (size_t i = 0; i < ref.size(); ++i) changed += !bits_equal(ref[i], residual[i]);
        EXPECT_GT(changed, int(ref.size() / 2)) << "M=" << M;
        cuda::set_moe_mma_variant(8);
        const auto got = run_mma(d, x, logits, residual, M, c, &ran, so, sg);
        ASSERT_TRUE(ran);
        EXPECT_EQ(bit_diff_report(got, ref, c.H), "")
            << "M=" << M << (with_shared ? " (shared expert)" : "") << ": variant 8 against variant 7";
      }
    }
  }
  cuda::set_moe_mma_variant(guard.saved);
}

// Variant 8 on ONE workspace over consecutive calls (as the model's layers share one): its arrival
// counters (down's combine: the last slot of a (token, 32 columns) combines) must be back at zero for
// the next call, whatever M the previous call had (the workspace's layout follows M). The workspace
// is filled with 0xFF bytes once, before the first call. Each call must give the bits of the same
// inputs on a fresh workspace under variant 7: fused form (M 5, 8) and tiled form (M 16, 12), each
// twice in a row and interleaved, with the gated shared expert.
TEST(GpuOpsMoeMma, SwapRepeatedCallsOnOneWorkspace) {
  MOESERVE_REQUIRE_GPU();
  VariantGuard guard;
  Rng rng(82);
  for (const ExpertCase& c : {ExpertCase{64, 6, 2304, 256, "gptq-asym-g128"}, ExpertCase{32, 8, 512, 256, "gptq-sym-g64"}}) {
    SCOPED_TRACE(case_name(c));
    const Experts ex = make_experts(rng, c, false);
    const cuda::DeviceExperts d = upload(ex);
    struct Inputs {
      int M;
      std::vector<float> x, logits, residual, shared, gate, ref;
    };
    std::vector<Inputs> in;
    for (int M : {5, 16, 8, 12}) {
      Inputs i{M,
               random_f32(rng, size_t(M) * c.H, 1.0f),
               random_f32(rng, size_t(M) * c.E, 2.0f),
               random_f32(rng, size_t(M) * c.H, 1.0f),
               random_f32(rng, size_t(M) * c.H, 0.5f),
               random_f32(rng, size_t(M), 1.0f),
               {}};
      ASSERT_LE(M * c.k, 4 * c.E);
      bool ran = false;
      cuda::set_moe_mma_variant(7);
      i.ref = run_mma(d, i.x, i.logits, i.residual, M, c, &ran, &i.shared, &i.gate);
      ASSERT_TRUE(ran);
      in.push_back(std::move(i));
    }
    const cuda::MoeShape shape{c.E, c.k, c.H, c.I};
    DeviceBuffer<uint8_t> ws(cuda::moe_mma_workspace_bytes(shape, 16));
    ASSERT_EQ(cudaMemset(ws.data(), 0xFF, ws.size()), cudaSuccess);
    cuda::set_moe_mma_variant(8);
    for (int seq : {0, 0, 1, 1, 0, 2, 3, 3, 2, 1, 0}) {
      const Inputs& i = in[size_t(seq)];
      bool ran = false;
      const auto got = run_mma_on(ws, d, i.x, i.logits, i.residual, i.M, c, &ran, &i.shared, &i.gate);
      ASSERT_TRUE(ran);
      EXPECT_EQ(bit_diff_report(got, i.ref, c.H), "")
          << "M=" << i.M << ": against variant 7 on a fresh workspace";
    }
  }
  cuda::set_moe_mma_variant(guard.saved);
}

// Variant 8's column blocks per CTA (ops_moe_mma.cu; ops_moe_mma_swap.cuh): 0 = chosen per launch,
// 1 .. 8 forced. Declared here, where the test forces it (not part of ops_moe.h).
namespace moeserve::cuda {
void set_moe_swap_columns_per_cta(int nc);
int moe_swap_columns_per_cta();
}  // namespace moeserve::cuda

namespace {

struct ColumnsGuard {
  int saved = cuda::moe_swap_columns_per_cta();
  ~ColumnsGuard() { cuda::set_moe_swap_columns_per_cta(saved); }
};

}  // namespace

// Variant 8 with each forced number of column blocks per CTA (1, 2, 3, 5, 8 and the per-launch
// choice) against variant 7, bit for bit: a CTA streams its column blocks as one sequence of
// (column block, group) units, so ring slots, rounds, scale rows and zero words cross column
// blocks, and the fold runs each block's epilogue (gate_up: act; down: y, arrival, combine) at its
// last group. The shapes give rounds that end inside a column block (18 / 68 groups of gate_up),
// several column blocks per round (down: 2, 6, 5 and 1 group per block: K = g), a CTA row's last
// CTA with fewer blocks (12, 20, 68, 72 blocks are not all multiples of the forced counts), the
// single C buffer (g 32 at H 2176) and asymmetric zero words; fused (M 1, 3, 8) and tiled (M 12, 16)
// forms, with the gated shared expert.
TEST(GpuOpsMoeMma, SwapColumnBlocksPerCtaGiveSameBits) {
  MOESERVE_REQUIRE_GPU();
  VariantGuard guard;
  ColumnsGuard columns;
  Rng rng(83);
  const std::vector<ExpertCase> cases{{64, 6, 2304, 256, "gptq-sym-g128"},
                                      {64, 6, 2176, 192, "gptq-asym-g32"},
                                      {256, 8, 384, 128, "gptq-asym-g128"},
                                      {32, 8, 512, 320, "gptq-asym-g64"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(case_name(c));
    const Experts ex = make_experts(rng, c, false);
    const cuda::DeviceExperts d = upload(ex);
    for (int M : {1, 3, 8, 12, 16}) {
      ASSERT_LE(M * c.k, 4 * c.E) << "the case must be in the swap kernels' regime";
      const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
      const auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
      const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
      const auto shared = random_f32(rng, size_t(M) * c.H, 0.5f);
      const auto gate = random_f32(rng, size_t(M), 1.0f);
      bool ran = false;
      cuda::set_moe_mma_variant(7);
      const auto ref = run_mma(d, x, logits, residual, M, c, &ran, &shared, &gate);
      ASSERT_TRUE(ran);
      int changed = 0;
      for (size_t i = 0; i < ref.size(); ++i) changed += !bits_equal(ref[i], residual[i]);
      EXPECT_GT(changed, int(ref.size() / 2)) << "M=" << M;
      cuda::set_moe_mma_variant(8);
      for (int nc : {1, 2, 3, 5, 8, 0}) {
        cuda::set_moe_swap_columns_per_cta(nc);
        const auto got = run_mma(d, x, logits, residual, M, c, &ran, &shared, &gate);
        ASSERT_TRUE(ran);
        EXPECT_EQ(bit_diff_report(got, ref, c.H), "")
            << "M=" << M << " nc=" << nc << ": variant 8 against variant 7";
      }
    }
  }
}
