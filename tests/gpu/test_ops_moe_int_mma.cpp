// The integer-form tensor-core expert kernels (ops_moe_int_mma.cu) through cuda::moe_routed_experts_int
// with set_moe_int_decode_max_tokens(0), so that every M takes them: against the CPU reference of the
// integer form (gputest::int_form_moe, within 1e-4 of max |routed|: only __expf vs std::exp and the
// softmax denominator's order differ), bit for bit per projection (act and y read back from the
// workspace, ops_moe_int_mma_layout.h, against gputest::int_form_linear) and per token (the combine
// recomputed from the workspace's weights and y), batch invariance (a token alone == the same token
// among 63 / 299 / 1,024 others: 16-, 32- and 64-slot tiles) and repeated calls on one workspace.
// Equality with the dp4a decode kernels at M <= 8 and the refusal of unsupported experts are checked
// once for both kernel families in test_ops_moe_int.cpp; the shared helpers are in moe_int_test_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/ops_moe.h"
#include "backend/cuda/ops_moe_int_mma_layout.h"
#include "gpu_test_quant.h"
#include "moe_int_reference.h"
#include "moe_int_test_util.h"

using namespace moeserve;
using namespace moeserve::gputest;

namespace {

// fn(i) for i in [0, n) on all host threads (the CPU reference is slow at the 122B expert shape).
void parallel_for(int n, const std::function<void(int)>& fn) {
  const int T = std::max(1, std::min(n, int(std::thread::hardware_concurrency())));
  std::atomic<int> next{0};
  std::vector<std::thread> th;
  for (int t = 0; t < T; ++t)
    th.emplace_back([&] {
      for (int i = next++; i < n; i = next++) fn(i);
    });
  for (auto& t : th) t.join();
}

// The CPU reference of the routed block, token by token in parallel (int_form_moe is per token).
std::vector<float> reference(const IntExperts& ex, const IntCase& c, const std::vector<float>& x,
                             const std::vector<float>& logits, const std::vector<float>& residual, int M) {
  const IntFormExperts r = ref_of(ex);
  std::vector<float> out = residual;
  parallel_for(M, [&](int m) {
    int_form_moe(r, c.k, x.data() + size_t(m) * c.H, logits.data() + size_t(m) * c.E, 1, out.data() + size_t(m) * c.H);
  });
  return out;
}

// The combine's shared-expert step on a reference without it (int_form_moe's arithmetic).
std::vector<float> add_shared(const std::vector<float>& ref, const std::vector<float>& shared,
                              const std::vector<float>& gate, int M, int H) {
  std::vector<float> out = ref;
  for (int m = 0; m < M; ++m) {
    const float sig = 1.0f / (1.0f + std::exp(-gate[size_t(m)]));
    for (int h = 0; h < H; ++h) out[size_t(m) * H + h] = std::fma(sig, shared[size_t(m) * H + h], ref[size_t(m) * H + h]);
  }
  return out;
}

template <typename T>
std::vector<T> region(const std::vector<uint8_t>& ws, size_t offset, size_t n) {
  std::vector<T> v(n);
  std::memcpy(v.data(), ws.data() + offset, n * sizeof(T));
  return v;
}

// Shapes: the 122B-A10B expert shape with E reduced to 16 (sym g128), the other zero modes and groups at
// a smaller H / I, small shapes with odd multiples of 128 (partial 128- and 256-column blocks), top-1,
// and H, I not multiples of 128 (short last activation blocks: the 64-k small tiling at every M).
const std::vector<IntCase> kCases{{16, 8, 3072, 1024, 128, true}, {16, 8, 1024, 512, 128, false},
                                  {16, 8, 1024, 512, 32, false},  {16, 8, 1024, 512, 64, true},
                                  {8, 3, 256, 128, 32, false},    {6, 2, 384, 640, 64, false},
                                  {4, 1, 640, 384, 128, true},    {8, 2, 192, 320, 64, false},
                                  {5, 2, 192, 64, 32, true}};

}  // namespace

// The whole block against the CPU reference of the integer form, M = 1, 7 (16-slot tiles), 64 and
// 300 (mostly 32- / 64-slot tiles), with and without the gated shared expert. Error: max |got − ref| /
// max |routed| < 1e-4 (the GPU's silu uses __expf; an act value a few ulps off can move its X by one).
TEST(GpuOpsMoeIntMma, MatchesIntFormReference) {
  MOESERVE_REQUIRE_GPU();
  DecodeMaxGuard guard(0);
  Rng rng(91);
  for (const auto& c : kCases) {
    const std::string name = case_name(c);
    SCOPED_TRACE(name);
    const IntExperts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = upload(ex);
    for (int M : {1, 7, 64, 300}) {
      const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
      const auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
      const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
      const auto shared = random_f32(rng, size_t(M) * c.H, 0.5f);
      const auto gate = random_f32(rng, size_t(M), 1.0f);
      const auto ref0 = reference(ex, c, x, logits, residual, M);
      const auto ref1 = add_shared(ref0, shared, gate, M, c.H);
      double max_routed = 0;
      for (size_t i = 0; i < ref0.size(); ++i) max_routed = std::max(max_routed, std::fabs(double(ref0[i]) - residual[i]));
      ASSERT_GT(max_routed, 0.0);
      for (bool with_shared : {false, true}) {
        bool ran = false;
        const auto got = run_int(d, c, M, x, logits, residual, &ran,
                                 {.shared = with_shared ? &shared : nullptr, .gate = with_shared ? &gate : nullptr});
        ASSERT_TRUE(ran) << "moe_routed_experts_int refused a supported case";
        const auto& ref = with_shared ? ref1 : ref0;
        double max_err = 0;
        int nans = 0;
        size_t worst = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          nans += !std::isfinite(got[i]);
          const double e = std::fabs(double(got[i]) - double(ref[i]));
          if (e > max_err) max_err = e, worst = i;
        }
        const double rel = max_err / max_routed;
        std::printf("  int_mma %s M=%d%s: max|err| %.3e, max|routed| %.3e, rel %.3e\n", name.c_str(), M,
                    with_shared ? " +shared" : "", max_err, max_routed, rel);
        EXPECT_EQ(nans, 0) << "M=" << M;
        EXPECT_LT(rel, 1e-4) << "M=" << M << (with_shared ? " (shared)" : "") << ": worst at token "
                             << worst / size_t(c.H) << " column " << worst % size_t(c.H) << ": " << got[worst]
                             << " vs " << ref[worst];
      }
    }
  }
}

// Bit for bit per projection, from the workspace after a call: for every slot (token m = slot / k,
// expert ids[slot]) y[slot] == int_form_linear(down_e, act[slot]) exactly (the act quantiser and the
// down kernel), act[slot] == silu(g)·u with g, u = int_form_linear(gate_e / up_e, x_m) within 1e-6
// relative (+1e-6 of max |act|: only __expf vs std::exp differ), and the residual == the combine
// recomputed on the host from the workspace's weights and y (fmaf in rank order from 0, then + the
// residual), exactly (no shared expert here: its sigmoid uses __expf; MatchesIntFormReference covers
// it). Tilings: M 7 (16-slot tiles), E 16 / M 64, E 8 / M 64 and E 6 / M 300 (32- and 64-slot tiles,
// partial column blocks; units of 32, 64, 128 k: 1, 2, 4 units per 128-k stage), E 8 / M 100 (sym
// g128 on 32- and 64-slot tiles), E 64 / M 20 (16-slot tiles at 2.5 slots per expert), H 192 / I 320
// at M 300 (K % 128 == 64: the 64-k small tiling on 16-slot tiles although the step is prompt-sized).
TEST(GpuOpsMoeIntMma, ProjectionsBitForBit) {
  MOESERVE_REQUIRE_GPU();
  DecodeMaxGuard guard(0);
  Rng rng(92);
  const std::vector<std::pair<IntCase, int>> cases{{{16, 8, 3072, 1024, 128, true}, 7},
                                                   {{16, 8, 1024, 512, 32, false}, 64},
                                                   {{6, 2, 384, 640, 128, false}, 300},
                                                   {{64, 8, 512, 256, 64, true}, 20},
                                                   {{8, 3, 256, 128, 64, false}, 64},
                                                   {{8, 4, 1024, 768, 128, true}, 100},
                                                   {{8, 2, 192, 320, 64, false}, 300}};
  for (const auto& [c, M] : cases) {
    SCOPED_TRACE(case_name(c) + " M=" + std::to_string(M));
    const IntExperts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = upload(ex);
    const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
    const auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
    const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
    bool ran = false;
    auto d_ws = fresh_workspace(c, M);
    const auto got = run_int(d, c, M, x, logits, residual, &ran, {.ws = &d_ws});
    ASSERT_TRUE(ran);
    const std::vector<uint8_t> ws = d_ws.download();
    const auto L = cuda::moe_int_detail::int_mma_layout(shape_of(c), M);
    const int slots = M * c.k;
    const auto ids = region<int32_t>(ws, L.ids, size_t(slots));
    const auto wts = region<float>(ws, L.weights, size_t(slots));
    const auto act = region<float>(ws, L.act, size_t(slots) * c.I);
    const auto y = region<float>(ws, L.y, size_t(slots) * c.H);
    for (int s = 0; s < slots; ++s) ASSERT_TRUE(ids[size_t(s)] >= 0 && ids[size_t(s)] < c.E) << "slot " << s;
    double act_max = 0;
    for (float v : act) act_max = std::max(act_max, double(std::fabs(v)));
    ASSERT_GT(act_max, 0.0);
    std::vector<int> act_bad(size_t(slots), 0), y_bad(size_t(slots), 0);
    std::vector<double> act_worst(size_t(slots), 0.0);
    parallel_for(slots, [&](int s) {
      const int m = s / c.k, e = ids[size_t(s)];
      const float* xm = x.data() + size_t(m) * c.H;
      const auto g = int_form_linear(ex.gate[size_t(e)].weight, xm, 1);
      const auto u = int_form_linear(ex.up[size_t(e)].weight, xm, 1);
      for (int i = 0; i < c.I; ++i) {
        const float gi = g[size_t(i)], ref = gi / (1.0f + std::exp(-gi)) * u[size_t(i)];
        const double err = std::fabs(double(act[size_t(s) * c.I + i]) - double(ref));
        act_worst[size_t(s)] = std::max(act_worst[size_t(s)], err / (std::fabs(double(ref)) + act_max));
        act_bad[size_t(s)] += !(err <= 1e-6 * std::fabs(double(ref)) + 1e-6 * act_max);
      }
      const auto yr = int_form_linear(ex.down[size_t(e)].weight, act.data() + size_t(s) * c.I, 1);
      for (int h = 0; h < c.H; ++h) y_bad[size_t(s)] += !bits_equal(y[size_t(s) * c.H + h], yr[size_t(h)]);
    });
    int act_fail = 0, y_fail = 0;
    for (int s = 0; s < slots; ++s) {
      if (act_bad[size_t(s)] && act_fail++ < 3)
        ADD_FAILURE() << "slot " << s << " (expert " << ids[size_t(s)] << "): " << act_bad[size_t(s)] << " of " << c.I
                      << " act values off by more than 1e-6 (worst relative " << act_worst[size_t(s)] << ")";
      if (y_bad[size_t(s)] && y_fail++ < 3)
        ADD_FAILURE() << "slot " << s << " (expert " << ids[size_t(s)] << "): " << y_bad[size_t(s)] << " of " << c.H
                      << " y values differ from int_form_linear(down, act) in some bit";
    }
    EXPECT_EQ(act_fail, 0);
    EXPECT_EQ(y_fail, 0);
    // The combine (combine_kernel's arithmetic) on the workspace's weights and y, bit for bit.
    int res_diffs = 0;
    for (int m = 0; m < M; ++m)
      for (int h = 0; h < c.H; ++h) {
        float a = 0.0f;
        for (int r = 0; r < c.k; ++r) a = std::fma(wts[size_t(m) * c.k + r], y[(size_t(m) * c.k + r) * c.H + h], a);
        res_diffs += !bits_equal(got[size_t(m) * c.H + h], residual[size_t(m) * c.H + h] + a);
      }
    EXPECT_EQ(res_diffs, 0) << "residual != residual + Σ_r w_r·y_r (the workspace's weights and y)";
  }
}

// A token's residual row is bit-identical alone (M = 1) and at position p among others: M 64 (E 16:
// 32 slots per expert, 32-slot tiles; E 256: 2 per expert, 16-slot tiles), 300 and 1,025 (64-slot
// tiles with 32-slot remainders). Any tiling, tile, row in a tile and neighbour must give the same
// bits: the unit sums are exact integers and the fold order is fixed.
TEST(GpuOpsMoeIntMma, TokenOutputIndependentOfBatch) {
  MOESERVE_REQUIRE_GPU();
  DecodeMaxGuard guard(0);
  Rng rng(93);
  const std::vector<IntCase> cases{{16, 8, 3072, 1024, 128, true},
                                   {256, 8, 512, 256, 64, false},
                                   {8, 3, 256, 128, 32, false},
                                   {6, 2, 384, 640, 128, true},
                                   {8, 2, 192, 320, 64, true}};
  for (const auto& c : cases) {
    SCOPED_TRACE(case_name(c));
    const IntExperts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = upload(ex);
    const auto xt = random_f32(rng, size_t(c.H), 1.0f);
    const auto lt = random_f32(rng, size_t(c.E), 2.0f);
    const auto rt = random_f32(rng, size_t(c.H), 1.0f);
    bool ran = false;
    const auto alone = run_int(d, c, 1, xt, lt, rt, &ran);
    ASSERT_TRUE(ran);
    int changed = 0;
    for (int h = 0; h < c.H; ++h) changed += !bits_equal(alone[size_t(h)], rt[size_t(h)]);
    EXPECT_GT(changed, c.H / 2) << "the experts added nothing";
    for (auto [M, pos] : std::vector<std::pair<int, int>>{{64, 17}, {300, 250}, {300, 0}, {1025, 700}, {1025, 1024}}) {
      auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
      auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
      auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
      std::copy(xt.begin(), xt.end(), x.begin() + long(pos) * c.H);
      std::copy(lt.begin(), lt.end(), logits.begin() + long(pos) * c.E);
      std::copy(rt.begin(), rt.end(), residual.begin() + long(pos) * c.H);
      const auto batch = run_int(d, c, M, x, logits, residual, &ran);
      ASSERT_TRUE(ran);
      int diffs = 0, nans = 0;
      for (int h = 0; h < c.H; ++h) diffs += !bits_equal(alone[size_t(h)], batch[size_t(pos) * c.H + size_t(h)]);
      for (float v : batch) nans += !std::isfinite(v);
      EXPECT_EQ(diffs, 0) << "token at " << pos << " of " << M << ": " << diffs << " of " << c.H
                          << " outputs differ from the token alone";
      EXPECT_EQ(nans, 0) << "M=" << M;
    }
  }
}

// Consecutive calls of different sizes on one workspace (sized for the largest, not refilled between
// calls, as the model's layers share it) give the bits of calls on fresh NaN-filled workspaces.
TEST(GpuOpsMoeIntMma, RepeatedCallsOnOneWorkspace) {
  MOESERVE_REQUIRE_GPU();
  DecodeMaxGuard guard(0);
  Rng rng(95);
  const IntCase c{16, 8, 1024, 512, 64, false};
  const IntExperts ex = make_experts(rng, c);
  const cuda::DeviceExperts d = upload(ex);
  DeviceBuffer<uint8_t> ws(cuda::moe_int_workspace_bytes(shape_of(c), 300));
  ASSERT_EQ(cudaMemset(ws.data(), 0xFF, ws.bytes()), cudaSuccess);
  struct Step {
    int M;
    std::vector<float> x, logits, residual;
  };
  std::vector<Step> steps;
  for (int M : {300, 7, 64}) {
    steps.push_back({M, random_f32(rng, size_t(M) * c.H, 1.0f), random_f32(rng, size_t(M) * c.E, 2.0f),
                     random_f32(rng, size_t(M) * c.H, 1.0f)});
  }
  steps.push_back(steps[0]);  // the first step again after the others
  steps.push_back(steps[1]);
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& st = steps[i];
    bool ran = false;
    const auto fresh = run_int(d, c, st.M, st.x, st.logits, st.residual, &ran);
    ASSERT_TRUE(ran);
    const auto reused = run_int(d, c, st.M, st.x, st.logits, st.residual, &ran, {.ws = &ws});
    ASSERT_TRUE(ran);
    int diffs = 0;
    for (size_t j = 0; j < fresh.size(); ++j) diffs += !bits_equal(fresh[j], reused[j]);
    EXPECT_EQ(diffs, 0) << "call " << i << " (M=" << st.M << ") on the shared workspace";
  }
}

// The Hopper form (ops_moe_int_wgmma.cu, set_moe_int_wgmma(true)) against the mma.sync kernels, bit for
// bit, on the steps whose tiles it takes (32- and 64-slot tiles, units of 128 k): the 122B expert shape
// at E 16 (M 64: 32-slot tiles; 300 and 1,025: both lists) with symmetric and asymmetric zeros, and top-1
// with H 640, I 384 (5 / 3 units per row). On a GPU or build without the form both runs take mma.sync
// (the test then checks nothing new; it says so).
TEST(GpuOpsMoeIntMma, WgmmaEqualsMmaSync) {
  MOESERVE_REQUIRE_GPU();
  DecodeMaxGuard guard(0);
  struct Restore {
    bool on;
    ~Restore() { cuda::set_moe_int_wgmma(on); }
  } restore{cuda::moe_int_wgmma()};
  int major = 0, minor = 0, dev = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), cudaSuccess);
  if (major * 10 + minor != 90) std::printf("  (not an sm_90 GPU: both runs take mma.sync)\n");
  Rng rng(97);
  const std::vector<IntCase> cases{{16, 8, 3072, 1024, 128, true}, {16, 8, 1024, 512, 128, false},
                                   {4, 1, 640, 384, 128, false}};
  for (const auto& c : cases) {
    SCOPED_TRACE(case_name(c));
    const IntExperts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = upload(ex);
    for (int M : {64, 300, 1025}) {
      const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
      const auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
      const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
      std::vector<float> out[2];
      for (int on = 0; on < 2; ++on) {
        cuda::set_moe_int_wgmma(on == 1);
        bool ran = false;
        out[on] = run_int(d, c, M, x, logits, residual, &ran);
        ASSERT_TRUE(ran);
      }
      int changed = 0, diffs = 0, nans = 0;
      size_t first = 0;
      for (size_t i = 0; i < residual.size(); ++i) {
        changed += !bits_equal(out[0][i], residual[i]);
        nans += !std::isfinite(out[1][i]);
        if (!bits_equal(out[0][i], out[1][i]) && diffs++ == 0) first = i;
      }
      EXPECT_GT(changed, int(residual.size() / 2)) << "the experts added nothing at M=" << M;
      EXPECT_EQ(nans, 0) << "M=" << M;
      EXPECT_EQ(diffs, 0) << "M=" << M << ": " << diffs << " outputs differ, first at token " << first / size_t(c.H)
                          << " column " << first % size_t(c.H) << ": " << out[1][first] << " vs " << out[0][first];
    }
  }
}
