// The integer-form dp4a expert kernels for steps of 1-8 tokens (ops_moe_int_stream.cu, the default,
// and the persistent ones of ops_moe_int_decode.cu), through cuda::moe_routed_experts_int with
// set_moe_int_decode_max_tokens(8) (every M <= 8 takes them):
//   - the routed block against the CPU reference int_form_moe (tests/gpu/moe_int_reference.h):
//     within 1e-4 of max |routed| (the reference uses std::exp for silu and the shared gate, the
//     kernels __expf), sym / asym zeros, groups 32 / 64 / 128, the 122B-A10B expert shape (E reduced
//     to 16), small and odd shapes, short last activation blocks (H 192, I 64 / 320: K % 128 = 64),
//     top-k 1 .. 32, M = 1, 3, 8, with and without the shared expert;
//   - bit for bit: with k = 1, one-hot router logits (weight exactly 1), zero residual and no shared
//     expert the residual is y = down·act exactly, so it must equal int_form_linear(down_e, act)
//     with act read back from the kernels' workspace (ops_moe_int_decode.cuh), and act must equal
//     silu(g)·u of int_form_linear(gate_e / up_e, x) within 1e-6 of max |act| (only __expf vs
//     std::exp differ); also with x not 16-byte aligned (the 4-byte staging loads);
//     the act rows' quantisation in the workspace (planes, block scales, ΣX: written once per
//     (slot, 128-column block) by the last gate/up CTA to finish the block) must equal
//     moe_int_arith.h step 1 of the act read back, bit for bit (short last blocks included);
//   - batch invariance (a token alone == the same token at positions 0 / 3 / 7 of 8, bit for bit,
//     k = 8 random routing), repeated calls on one workspace (same bits as on a fresh one), a call
//     captured in a CUDA graph and replayed on new inputs (same bits as eager calls; the act-block
//     arrival counters must be back at zero after every launch).
//   - the streaming kernels with the fused one-token kernel (set_moe_int_decode_variant 2, the
//     default), as two launches (1) and the persistent ones (0) give every output the same bits, on
//     every shape above, M = 1, 2, 5, 8;
//   - the shared expert added after the experts by the norm (ops_basic.h GatedAdd, as the model does)
//     gives the same bits as the experts' own combine, M = 1 (the fused kernel), 3, 8 and 24 (the
//     tensor-core kernels).
// The same bits as the tensor-core form and the refusal of unsupported experts are checked once for
// both kernel families in test_ops_moe_int.cpp; the shared helpers are in moe_int_test_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "backend/cuda/moe_int_arith.h"
#include "backend/cuda/ops_basic.h"
#include "backend/cuda/ops_moe.h"
#include "backend/cuda/ops_moe_int_decode.cuh"
#include "core/error.h"
#include "gpu_test_quant.h"
#include "moe_int_reference.h"
#include "moe_int_test_util.h"

using namespace moeserve;
using namespace moeserve::gputest;

namespace {

struct Inputs {
  std::vector<float> x, logits, residual;
  const std::vector<float>* shared = nullptr;  // [M, H] (with gate) or null
  const std::vector<float>* gate = nullptr;    // [M]
};

// run_int on in's x, logits, residual and shared expert; opt: the workspace and x offset.
std::vector<float> run(const cuda::DeviceExperts& d, const IntCase& c, const Inputs& in, int M, bool* ran,
                       IntRun opt = {}) {
  opt.shared = in.shared;
  opt.gate = in.gate;
  return run_int(d, c, M, in.x, in.logits, in.residual, ran, opt);
}

// The shapes of MatchesIntFormMoe and the variant comparison: the 122B-A10B expert shape (E reduced
// to 16), sym / asym zeros, groups 32 / 64 / 128, small and odd shapes, top-k 1 .. 32.
const std::vector<IntCase>& shape_cases() {
  static const std::vector<IntCase> cases{
      {16, 8, 3072, 1024, 128, true}, {16, 8, 1024, 512, 128, false}, {16, 8, 1024, 512, 32, false},
      {16, 8, 1024, 512, 64, true},   {8, 3, 256, 128, 32, false},    {6, 2, 384, 384, 64, false},
      {40, 32, 256, 128, 32, true},   {5, 1, 640, 256, 128, false},
      // short last activation blocks (K % 128 == 64: x and act rows)
      {8, 2, 128, 64, 32, true},      {5, 3, 192, 320, 64, false}};
  return cases;
}

Inputs random_inputs(Rng& rng, const IntCase& c, int M) {
  return {random_f32(rng, size_t(M) * c.H, 1.0f), random_f32(rng, size_t(M) * c.E, 2.0f),
          random_f32(rng, size_t(M) * c.H, 1.0f)};
}

// The act rows' quantisation the kernels left in the workspace (planes, block scales, ΣX of
// slots rows of I) against moe_int_arith.h step 1 of the act rows read back (act [slots, I]): the
// count of differing planes vectors, scales and sums (0 expected).
int check_act_quantisation(const DeviceBuffer<uint8_t>& ws, const cuda::moe_int_detail::IntDecodeLayout& lay,
                           const std::vector<float>& act, int slots, int I) {
  namespace mi = cuda::moe_int;
  std::vector<uint32_t> planes(size_t(slots) * (I / 8) * 4);
  std::vector<float> sblk(size_t(slots) * lay.nbs);
  std::vector<int32_t> sx(size_t(slots) * lay.sxs);
  if (cudaMemcpy(planes.data(), ws.data() + lay.planes, planes.size() * 4, cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(sblk.data(), ws.data() + lay.sblk, sblk.size() * 4, cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(sx.data(), ws.data() + lay.sx, sx.size() * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
    throw std::runtime_error("cudaMemcpy failed");
  int bad = 0;
  for (int r = 0; r < slots; ++r) {
    const float* a = act.data() + size_t(r) * I;
    std::vector<int> X(static_cast<size_t>(I));
    for (int b = 0; b * mi::kXBlock < I; ++b) {
      const int k0 = b * mi::kXBlock, k1 = std::min(I, k0 + mi::kXBlock);
      float amax = 0.0f;
      for (int kk = k0; kk < k1; ++kk) amax = std::max(amax, std::fabs(a[kk]));
      const mi::XScale sc = mi::x_scale(amax);
      for (int kk = k0; kk < k1; ++kk) X[size_t(kk)] = mi::quantize_x(a[kk], sc.inv);
      bad += !bits_equal(sblk[size_t(r) * lay.nbs + b], sc.s);
    }
    for (int q = 0; q < I / 32; ++q) {
      int sum = 0;
      for (int kk = 32 * q; kk < 32 * q + 32; ++kk) sum += X[size_t(kk)];
      bad += sx[size_t(r) * lay.sxs + q] != sum;
    }
    for (int p = 0; p < I / 8; ++p) {
      uint32_t want[4] = {0, 0, 0, 0};  // {hi of k 0,2,4,6 | hi of k 1,3,5,7 | lo of ... | lo of ...}
      for (int j = 0; j < 8; ++j) {
        const int Xk = X[size_t(8 * p + j)];
        const uint32_t hi = uint32_t(Xk >> 8) & 0xFFu, lo = uint32_t(Xk) & 0xFFu;
        want[j & 1] |= hi << (8 * (j >> 1));
        want[2 + (j & 1)] |= lo << (8 * (j >> 1));
      }
      for (int w = 0; w < 4; ++w) bad += planes[(size_t(r) * (I / 8) + p) * 4 + w] != want[w];
    }
  }
  return bad;
}

}  // namespace

// The routed block against int_form_moe: max |got − ref| / max |ref − residual| < 1e-4 (the
// kernels and the reference differ by __expf vs std::exp in silu and the shared gate, and rarely
// by the quantisation of an act row whose element sits on a rounding tie after that). A wrong
// nibble, plane byte, zero, scale, unit or rank moves outputs by O(max |routed|).
TEST(GpuOpsMoeIntDecode, MatchesIntFormMoe) {
  MOESERVE_REQUIRE_GPU();
  DecodeMaxGuard guard(8);
  Rng rng(91);
  const std::vector<IntCase>& cases = shape_cases();
  for (const auto& c : cases) {
    const std::string name = case_name(c);
    SCOPED_TRACE(name);
    const IntExperts ex = make_experts(rng, c);
    const IntFormExperts ref_ex = ref_of(ex);
    const cuda::DeviceExperts d = upload(ex);
    for (int M : {1, 3, 8}) {
      Inputs in = random_inputs(rng, c, M);
      const auto shared = random_f32(rng, size_t(M) * c.H, 0.5f);
      const auto gate = random_f32(rng, size_t(M), 1.0f);
      for (bool with_shared : {false, true}) {
        in.shared = with_shared ? &shared : nullptr;
        in.gate = with_shared ? &gate : nullptr;
        std::vector<float> ref = in.residual;
        int_form_moe(ref_ex, c.k, in.x.data(), in.logits.data(), M, ref.data(), in.shared ? in.shared->data() : nullptr,
                     in.gate ? in.gate->data() : nullptr);
        bool ran = false;
        const auto got = run(d, c, in, M, &ran);
        ASSERT_TRUE(ran) << "moe_routed_experts_int refused a supported shape";
        double max_err = 0, max_routed = 0;
        size_t worst = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          const double err = std::isfinite(got[i]) ? std::fabs(double(got[i]) - double(ref[i])) : INFINITY;
          if (err > max_err || !std::isfinite(err)) max_err = err, worst = i;
          max_routed = std::max(max_routed, std::fabs(double(ref[i]) - double(in.residual[i])));
        }
        const double rel = max_err / max_routed;
        std::printf("  int_decode %s M=%d shared=%d: max|err| %.3e, max|routed| %.3e, rel %.3e\n", name.c_str(), M,
                    int(with_shared), max_err, max_routed, rel);
        EXPECT_GT(max_routed, 0.0);
        EXPECT_LT(rel, 1e-4) << "M=" << M << " shared=" << with_shared << ": worst at token " << worst / size_t(c.H)
                             << " column " << worst % size_t(c.H) << ": " << got[worst] << " vs " << ref[worst];
      }
    }
  }
}

// k = 1, one-hot logits (the chosen expert's weight is p / p = 1.0f exactly), zero residual, no
// shared expert: residual_out = 0 + fmaf(1, y, 0) = y, the down projection of the slot's act row
// as the kernels computed it. So residual_out must equal int_form_linear(down_e, act) BIT FOR BIT
// (act read back from the workspace: ops_moe_int_decode.cuh), and act must match silu(g)·u of
// int_form_linear(gate_e / up_e, x) within 1e-6 of max |act| (__expf vs std::exp only; the gate and
// up sums themselves are exact-order). Tokens pick different experts; M = 1, 3, 8; x 16-byte
// aligned and not (offset by one float: the kernels' scalar staging path), same bits.
TEST(GpuOpsMoeIntDecode, ProjectionsMatchIntFormLinearBitForBit) {
  MOESERVE_REQUIRE_GPU();
  DecodeMaxGuard guard(8);
  Rng rng(92);
  const std::vector<IntCase> cases{{16, 1, 3072, 1024, 128, true}, {16, 1, 1024, 512, 128, false},
                                   {16, 1, 1024, 512, 32, false},  {16, 1, 1024, 512, 64, true},
                                   {8, 1, 256, 128, 32, false},    {6, 1, 384, 384, 32, true},
                                   {8, 1, 128, 64, 32, true},      {5, 1, 192, 320, 64, false}};
  for (const auto& c : cases) {
    SCOPED_TRACE(case_name(c));
    const IntExperts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = upload(ex);
    const cuda::MoeShape shape{c.E, c.k, c.H, c.I};
    for (int M : {1, 3, 8}) {
      Inputs in = random_inputs(rng, c, M);
      std::fill(in.residual.begin(), in.residual.end(), 0.0f);
      std::fill(in.logits.begin(), in.logits.end(), 0.0f);
      std::vector<int> expert(static_cast<size_t>(M));
      for (int m = 0; m < M; ++m) {
        expert[size_t(m)] = (5 * m + 3) % c.E;
        in.logits[size_t(m) * c.E + expert[size_t(m)]] = 30.0f;
      }
      for (int x_offset : {0, 1}) {
        SCOPED_TRACE("x offset " + std::to_string(x_offset));
        auto ws = fresh_workspace(c, M);
        bool ran = false;
        const auto got = run(d, c, in, M, &ran, {.ws = &ws, .x_offset = x_offset});
        ASSERT_TRUE(ran);
        // act [M·k, I] f32 from the workspace.
        const auto lay = cuda::moe_int_detail::int_decode_layout(shape, M);
        std::vector<float> act(size_t(M) * c.I);
        ASSERT_EQ(cudaMemcpy(act.data(), ws.data() + lay.act, act.size() * sizeof(float), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        std::vector<int32_t> ids(static_cast<size_t>(M));
        ASSERT_EQ(cudaMemcpy(ids.data(), ws.data() + lay.ids, ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        EXPECT_EQ(check_act_quantisation(ws, lay, act, M * c.k, c.I), 0) << "M=" << M;
        double max_act_err = 0, max_act = 0;
        int diffs = 0;
        size_t first = 0;
        for (int m = 0; m < M; ++m) {
          const int e = expert[size_t(m)];
          EXPECT_EQ(ids[size_t(m)], e) << "token " << m;
          const float* am = act.data() + size_t(m) * c.I;
          const auto y = int_form_linear(ex.down[size_t(e)].weight, am, 1);
          for (int h = 0; h < c.H; ++h)
            if (!bits_equal(got[size_t(m) * c.H + h], y[size_t(h)]) && diffs++ == 0) first = size_t(m) * c.H + h;
          const float* xm = in.x.data() + size_t(m) * c.H;
          const auto g = int_form_linear(ex.gate[size_t(e)].weight, xm, 1);
          const auto u = int_form_linear(ex.up[size_t(e)].weight, xm, 1);
          for (int i = 0; i < c.I; ++i) {
            const float r = g[size_t(i)] / (1.0f + std::exp(-g[size_t(i)])) * u[size_t(i)];
            const double err = std::isfinite(am[i]) ? std::fabs(double(am[i]) - double(r)) : INFINITY;
            max_act_err = std::max(max_act_err, err);
            max_act = std::max(max_act, std::fabs(double(r)));
          }
        }
        EXPECT_EQ(diffs, 0) << "M=" << M << ": " << diffs << " of " << got.size()
                            << " outputs differ from int_form_linear(down, act); first at token " << first / size_t(c.H)
                            << " column " << first % size_t(c.H);
        const double rel = max_act_err / max_act;
        std::printf("  int_decode act %s M=%d x+%d: max|err| %.3e, max|act| %.3e, rel %.3e\n", case_name(c).c_str(), M,
                    x_offset, max_act_err, max_act, rel);
        EXPECT_GT(max_act, 0.0);
        EXPECT_LT(rel, 1e-6) << "M=" << M << ": act differs from silu(g)·u of int_form_linear";
      }
    }
  }
}

// A token's residual row is bit-identical alone (M = 1) and at positions 0, 3 and 7 of 8 tokens
// (the others random; k = 8 random routing), with and without the shared expert.
TEST(GpuOpsMoeIntDecode, TokenOutputIndependentOfBatch) {
  MOESERVE_REQUIRE_GPU();
  DecodeMaxGuard guard(8);
  Rng rng(93);
  const std::vector<IntCase> cases{{16, 8, 3072, 1024, 128, true},
                                   {16, 8, 1024, 512, 32, false},
                                   {16, 8, 1024, 512, 64, true},
                                   {8, 3, 256, 128, 128, false},
                                   {5, 3, 192, 320, 64, false}};
  for (const auto& c : cases) {
    SCOPED_TRACE(case_name(c));
    const IntExperts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = upload(ex);
    Inputs alone = random_inputs(rng, c, 1);
    const auto shared_t = random_f32(rng, size_t(c.H), 0.5f);
    const std::vector<float> gate_t{0.3f};
    for (bool with_shared : {false, true}) {
      alone.shared = with_shared ? &shared_t : nullptr;
      alone.gate = with_shared ? &gate_t : nullptr;
      bool ran = false;
      const auto ref = run(d, c, alone, 1, &ran);
      ASSERT_TRUE(ran);
      int changed = 0;  // the experts did add something
      for (int h = 0; h < c.H; ++h) changed += !bits_equal(ref[size_t(h)], alone.residual[size_t(h)]);
      EXPECT_GT(changed, c.H / 2);
      for (int pos : {0, 3, 7}) {
        const int M = 8;
        Inputs in = random_inputs(rng, c, M);
        auto shared = random_f32(rng, size_t(M) * c.H, 0.5f);
        auto gate = random_f32(rng, size_t(M), 1.0f);
        std::copy(alone.x.begin(), alone.x.end(), in.x.begin() + long(pos) * c.H);
        std::copy(alone.logits.begin(), alone.logits.end(), in.logits.begin() + long(pos) * c.E);
        std::copy(alone.residual.begin(), alone.residual.end(), in.residual.begin() + long(pos) * c.H);
        std::copy(shared_t.begin(), shared_t.end(), shared.begin() + long(pos) * c.H);
        gate[size_t(pos)] = gate_t[0];
        in.shared = with_shared ? &shared : nullptr;
        in.gate = with_shared ? &gate : nullptr;
        const auto batch = run(d, c, in, M, &ran);
        ASSERT_TRUE(ran);
        int diffs = 0;
        for (int h = 0; h < c.H; ++h) diffs += !bits_equal(ref[size_t(h)], batch[size_t(pos) * c.H + size_t(h)]);
        EXPECT_EQ(diffs, 0) << "shared=" << with_shared << ", token at " << pos << " of " << M << ": " << diffs
                            << " of " << c.H << " outputs differ from the token alone";
      }
    }
  }
}

// Consecutive calls on ONE workspace (as the model's layers share one; filled with 0xFF once):
// M = 8, 8, 3, 1, 8, 3 with the shared expert must each give the bits of the same inputs on a
// fresh workspace.
TEST(GpuOpsMoeIntDecode, RepeatedCallsOnOneWorkspace) {
  MOESERVE_REQUIRE_GPU();
  DecodeMaxGuard guard(8);
  Rng rng(94);
  for (const IntCase& c : {IntCase{16, 8, 3072, 1024, 128, true}, IntCase{16, 8, 1024, 512, 64, false}}) {
    SCOPED_TRACE(case_name(c));
    const IntExperts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = upload(ex);
    struct Run {
      int M;
      Inputs in;
      std::vector<float> shared, gate, ref;
    };
    std::vector<Run> runs;
    for (int M : {8, 3, 1}) {
      Run r{M, random_inputs(rng, c, M), random_f32(rng, size_t(M) * c.H, 0.5f), random_f32(rng, size_t(M), 1.0f), {}};
      runs.push_back(std::move(r));
    }
    for (Run& r : runs) {
      r.in.shared = &r.shared;
      r.in.gate = &r.gate;
      bool ran = false;
      r.ref = run(d, c, r.in, r.M, &ran);
      ASSERT_TRUE(ran);
    }
    auto ws = fresh_workspace(c, 8);
    for (int seq : {0, 0, 1, 2, 0, 1}) {
      const Run& r = runs[size_t(seq)];
      bool ran = false;
      const auto got = run(d, c, r.in, r.M, &ran, {.ws = &ws});
      ASSERT_TRUE(ran);
      size_t first = 0;
      const int diffs = count_diffs(got, r.ref, &first);
      EXPECT_EQ(diffs, 0) << "M=" << r.M << ": " << diffs << " of " << got.size()
                          << " outputs differ from a fresh workspace; first at token " << first / size_t(c.H)
                          << " column " << first % size_t(c.H);
    }
  }
}

// One call captured in a CUDA graph (on its own stream) and replayed on new inputs written into
// the same device buffers: every replay gives the bits of an eager call on a fresh workspace, also
// with eager calls of another size on the same workspace between the replays. The act-block
// arrival counts (one per (slot, 128-column block), in device memory, not the workspace) must be
// back at zero after every launch for this: a stale count makes a block's quantisation run early
// (NaN or stale planes) or never. M = 1 (one tile per CTA) and 8 (ranges of several tiles and two
// tokens), with the shared expert.
TEST(GpuOpsMoeIntDecode, GraphReplaysMatchEagerCalls) {
  MOESERVE_REQUIRE_GPU();
  DecodeMaxGuard guard(8);
  Rng rng(97);
  for (const IntCase& c : {IntCase{16, 8, 3072, 1024, 128, true}, IntCase{8, 3, 192, 320, 64, false}}) {
    SCOPED_TRACE(case_name(c));
    const IntExperts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = upload(ex);
    const cuda::MoeShape shape{c.E, c.k, c.H, c.I};
    for (int M : {1, 8}) {
      SCOPED_TRACE("M=" + std::to_string(M));
      DeviceBuffer<float> d_x{size_t(M) * c.H}, d_logits{size_t(M) * c.E}, d_res{size_t(M) * c.H},
          d_shared{size_t(M) * c.H}, d_gate{size_t(M)};
      auto put = [](DeviceBuffer<float>& dst, const std::vector<float>& src) {
        ASSERT_EQ(cudaMemcpy(dst.data(), src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice),
                  cudaSuccess);
      };
      auto ws = fresh_workspace(c, 8);
      cudaStream_t st = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
      auto call = [&]() {
        return cuda::moe_routed_experts_int(d_x.data(), d_logits.data(), shape, d, M, ws.data(), ws.size(),
                                            d_res.data(), st, d_shared.data(), d_gate.data());
      };
      // An eager call first: the first call on a device sets the kernels' attributes.
      put(d_x, random_f32(rng, size_t(M) * c.H, 1.0f));
      put(d_logits, random_f32(rng, size_t(M) * c.E, 2.0f));
      put(d_res, random_f32(rng, size_t(M) * c.H, 1.0f));
      put(d_shared, random_f32(rng, size_t(M) * c.H, 0.5f));
      put(d_gate, random_f32(rng, size_t(M), 1.0f));
      ASSERT_TRUE(call());
      ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      const bool captured = call();
      ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
      ASSERT_TRUE(captured);
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      for (int rep = 0; rep < 3; ++rep) {
        Inputs in = random_inputs(rng, c, M);
        const auto shared = random_f32(rng, size_t(M) * c.H, 0.5f);
        const auto gate = random_f32(rng, size_t(M), 1.0f);
        in.shared = &shared;
        in.gate = &gate;
        put(d_x, in.x);
        put(d_logits, in.logits);
        put(d_res, in.residual);
        put(d_shared, shared);
        put(d_gate, gate);
        ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
        const auto got = to_host(d_res);
        bool ran = false;
        const auto ref = run(d, c, in, M, &ran);
        ASSERT_TRUE(ran);
        size_t first = 0;
        const int diffs = count_diffs(got, ref, &first);
        EXPECT_EQ(diffs, 0) << "replay " << rep << ": " << diffs << " of " << got.size()
                            << " outputs differ from an eager call; first at token " << first / size_t(c.H)
                            << " column " << first % size_t(c.H);
        // Another size on the same workspace between the replays.
        const Inputs other = random_inputs(rng, c, 3);
        (void)run(d, c, other, 3, &ran, {.ws = &ws});
        ASSERT_TRUE(ran);
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaStreamDestroy(st);
    }
  }
}

// The streaming kernels as two launches (variant 1), with the fused one-token kernel (variant 2, the
// default) and the persistent kernels (variant 0: ops_moe_int_decode.cu) give every output the same
// bits (all follow moe_int_arith.h exactly), on every shape of MatchesIntFormMoe, M = 1, 2, 5, 8,
// with and without the shared expert; moe_int_decode_streams / moe_int_decode_fuses say which
// kernels served each step (a silent fallback would make the comparison empty): the fused kernel
// serves M = 1 without the shared expert exactly where its grid has a CTA for each 16 columns of
// down (H / 16 <= (I / 32)·k; the 122B shape among them), never with the shared expert or M > 1.
// Bad variants are refused.
TEST(GpuOpsMoeIntDecode, StreamingKernelsMatchPersistentBitForBit) {
  MOESERVE_REQUIRE_GPU();
  DecodeMaxGuard guard(8);
  struct VariantGuard {
    int saved = cuda::moe_int_decode_variant();
    ~VariantGuard() { cuda::set_moe_int_decode_variant(saved); }
  } variant_guard;
  EXPECT_EQ(cuda::moe_int_decode_variant(), 2) << "the streaming kernels with the fused one are the default";
  for (int bad : {-1, 3, 4}) EXPECT_THROW(cuda::set_moe_int_decode_variant(bad), Error) << bad;
  EXPECT_EQ(cuda::moe_int_decode_variant(), 2) << "a rejected value leaves the variant as it was";
  EXPECT_THROW(cuda::set_moe_int_stream_ring_cap(-2), Error);
  Rng rng(97);
  const std::vector<IntCase>& cases = shape_cases();
  int fused_steps = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(case_name(c));
    const IntExperts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = upload(ex);
    for (int M : {1, 2, 5, 8}) {
      Inputs in = random_inputs(rng, c, M);
      const auto shared = random_f32(rng, size_t(M) * c.H, 0.5f);
      const auto gate = random_f32(rng, size_t(M), 1.0f);
      for (bool with_shared : {false, true}) {
        in.shared = with_shared ? &shared : nullptr;
        in.gate = with_shared ? &gate : nullptr;
        std::vector<float> out[3];
        for (int variant : {2, 1, 0}) {
          cuda::set_moe_int_decode_variant(variant);
          EXPECT_EQ(cuda::moe_int_decode_streams(shape_of(c), d, M), variant >= 1) << "M=" << M;
          const bool fits = M == 1 && c.H / 16 <= c.I / 32 * c.k;
          EXPECT_EQ(cuda::moe_int_decode_fuses(shape_of(c), d, M), variant == 2 && fits) << "M=" << M;
          fused_steps += variant == 2 && fits && !with_shared;
          bool ran = false;
          out[variant] = run(d, c, in, M, &ran);
          ASSERT_TRUE(ran);
        }
        cuda::set_moe_int_decode_variant(2);
        // The ring's cap (set_moe_int_stream_ring_cap: at most 2 steps at 2-8 tokens by default) only
        // groups loads: the streaming kernels give the same bits with every cap.
        for (int cap : {0, 1, 3}) {
          cuda::set_moe_int_stream_ring_cap(cap);
          bool ran = false;
          const auto capped = run(d, c, in, M, &ran);
          cuda::set_moe_int_stream_ring_cap(-1);
          ASSERT_TRUE(ran);
          int diffs = 0;
          for (size_t i = 0; i < out[2].size(); ++i) diffs += !bits_equal(out[2][i], capped[i]);
          EXPECT_EQ(diffs, 0) << "ring cap " << cap << ", M=" << M << " shared=" << with_shared;
        }
        for (int variant : {1, 0}) {
          int diffs = 0, changed = 0;
          for (size_t i = 0; i < out[2].size(); ++i) {
            diffs += !bits_equal(out[2][i], out[variant][i]);
            changed += !bits_equal(out[2][i], in.residual[i]);
          }
          EXPECT_GT(changed, int(out[2].size() / 2)) << "M=" << M << ": the experts added nothing";
          EXPECT_EQ(diffs, 0) << "M=" << M << " shared=" << with_shared << ": " << diffs << " of " << out[2].size()
                              << " outputs differ between variant 2 and variant " << variant;
        }
      }
    }
  }
  EXPECT_GE(fused_steps, 5) << "the fused kernel served too few of the comparisons";
}

// The model adds the shared expert in the norm after the routed experts (ops_basic.h GatedAdd), so
// that their kernels never wait for it: the experts without it, then add_rms_norm with the gated add,
// must leave the same residual BIT FOR BIT as the experts' own combine with it (its last step is the
// same fmaf of the same sigmoid). 122B-A10B expert shape (E 16), sym and asym; M = 1 (the fused
// kernel, asserted), 3, 8 (the streaming kernels) and 24 (the tensor-core kernels).
TEST(GpuOpsMoeIntDecode, SharedExpertAddedByTheNormMatchesTheCombine) {
  MOESERVE_REQUIRE_GPU();
  DecodeMaxGuard guard(8);
  Rng rng(98);
  for (const IntCase& c : {IntCase{16, 8, 3072, 1024, 128, true}, IntCase{16, 8, 1024, 512, 64, false}}) {
    SCOPED_TRACE(case_name(c));
    const IntExperts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = upload(ex);
    for (int M : {1, 3, 8, 24}) {
      Inputs in = random_inputs(rng, c, M);
      const auto shared = random_f32(rng, size_t(M) * c.H, 0.5f);
      const auto gate = random_f32(rng, size_t(M), 1.0f);
      if (M == 1) EXPECT_TRUE(cuda::moe_int_decode_fuses(shape_of(c), d, M));
      bool ran = false;
      const auto routed = run(d, c, in, M, &ran);  // no shared expert
      ASSERT_TRUE(ran);
      in.shared = &shared;
      in.gate = &gate;
      const auto combined = run(d, c, in, M, &ran);
      ASSERT_TRUE(ran);
      auto d_res = to_device_f32(routed);
      auto d_shared = to_device_f32(shared);
      auto d_gate = to_device_f32(gate);
      auto d_w = to_device_f32(random_f32(rng, size_t(c.H), 0.3f));
      DeviceBuffer<float> d_out(size_t(M) * c.H);
      cuda::add_rms_norm(d_res.data(), nullptr, {d_shared.data(), d_gate.data()}, d_w.data(), M, c.H, 1e-6f, nullptr,
                         nullptr, d_out.data());
      const auto normed = to_host(d_res);
      int diffs = 0, changed = 0;
      for (size_t i = 0; i < normed.size(); ++i) {
        diffs += !bits_equal(normed[i], combined[i]);
        changed += !bits_equal(combined[i], routed[i]);
      }
      EXPECT_GT(changed, int(normed.size() / 2)) << "M=" << M << ": the shared expert added nothing";
      EXPECT_EQ(diffs, 0) << "M=" << M << ": " << diffs << " of " << normed.size()
                          << " outputs differ between the norm's gated add and the combine";
    }
  }
}
