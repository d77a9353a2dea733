// The routed-expert block on the GPU (ops_moe.h: routing, expert SwiGLU MLPs, weighted
// combine into the residual) against the CPU ops:
//   routing: cpu::route_top_k (softmax in fp32, top-k, ties to the lower expert id,
//     renormalised) on designed router logits — random rows, exact ties at the k-th place,
//     all-equal rows, and (separately) near ties one fp32 ulp apart — read back through
//     experts built so that expert e adds its routing weight into residual column e;
//   experts: cpu::moe_forward (with a zero shared expert, so it returns the routed sum) at
//     the 122B-A10B expert shape (H 3072, I 1024, top-8) with Dense BF16, GPTQ INT4 and FP8
//     block experts, and at odd shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/activations.h"
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

struct Experts {
  std::vector<TestWeight> gate, up, down;
  std::vector<quant::QuantWeight> ref_gate, ref_up, ref_down;  // dense f32 of the exact dequantisation
};

std::vector<const quant::QuantWeight*> ptrs(const std::vector<TestWeight>& v) {
  std::vector<const quant::QuantWeight*> p;
  for (const auto& t : v) p.push_back(&t.weight);
  return p;
}

cuda::DeviceExperts upload(const Experts& ex) {
  return cuda::upload_experts(ptrs(ex.gate), ptrs(ex.up), ptrs(ex.down), nullptr);
}

// Runs moe_routed_experts on residual += MoE(x) with the given router logits.
std::vector<float> run_gpu(const cuda::DeviceExperts& d, const std::vector<float>& x, const std::vector<float>& logits,
                           const std::vector<float>& residual, int M, int E, int top_k, int H, int I) {
  const cuda::MoeShape shape{E, top_k, H, I};
  const size_t ws_bytes = cuda::moe_workspace_bytes(shape, M);
  DeviceBuffer<uint8_t> ws(ws_bytes);
  auto d_x = to_device_bf16(x);
  auto d_logits = to_device_f32(logits);
  auto d_res = to_device_f32(residual);
  cuda::moe_routed_experts(d_x.data(), d_logits.data(), shape, d, M, ws.data(), ws_bytes, d_res.data(), nullptr);
  return to_host(d_res);
}

// The model's entry point: f32 x, and optionally the shared expert's output and gate logit
// (residual = (residual + routed) + sigmoid(logit)·shared).
std::vector<float> run_gpu_f32(const cuda::DeviceExperts& d, const std::vector<float>& x,
                               const std::vector<float>& logits, const std::vector<float>& residual, int M, int E,
                               int top_k, int H, int I, const std::vector<float>* shared = nullptr,
                               const std::vector<float>* shared_logit = nullptr) {
  const cuda::MoeShape shape{E, top_k, H, I};
  const size_t ws_bytes = cuda::moe_workspace_bytes(shape, M);
  DeviceBuffer<uint8_t> ws(ws_bytes);
  auto d_x = to_device_f32(x);
  auto d_logits = to_device_f32(logits);
  auto d_res = to_device_f32(residual);
  DeviceBuffer<float> d_sh, d_sl;
  if (shared) {
    d_sh = to_device_f32(*shared);
    d_sl = to_device_f32(*shared_logit);
  }
  cuda::moe_routed_experts(d_x.data(), d_logits.data(), shape, d, M, ws.data(), ws_bytes, d_res.data(), nullptr,
                           shared ? d_sh.data() : nullptr, shared ? d_sl.data() : nullptr);
  return to_host(d_res);
}

// Routing probe experts (Dense BF16, I = 1, H a power of two >= E): gate and up rows are
// 1/H, so with x = 1 every expert computes g = u = 1 exactly and act = silu(1); down of
// expert e is the unit column e_e. The block then adds w(m, e)·silu(1) to residual[m, e]
// for each selected expert e.
Experts probe_experts(int E, int H) {
  Experts ex;
  for (int e = 0; e < E; ++e) {
    auto dense = [](std::vector<float> w, int64_t N, int64_t K) {
      TestWeight t;
      t.label = "probe";
      t.dequant = w;
      Tensor bt = Tensor::empty(DType::BF16, {N, K});
      for (size_t i = 0; i < w.size(); ++i) bt.data<uint16_t>()[i] = f32_to_bf16(w[i]);
      t.weight = quant::dense_weight(std::move(bt), "probe");
      return t;
    };
    ex.gate.push_back(dense(std::vector<float>(size_t(H), 1.0f / float(H)), 1, H));
    ex.up.push_back(dense(std::vector<float>(size_t(H), 1.0f / float(H)), 1, H));
    std::vector<float> down(size_t(H), 0.0f);
    down[size_t(e)] = 1.0f;
    ex.down.push_back(dense(down, H, 1));
  }
  return ex;
}

// Expected residual after the probe experts: residual[m, id] += weight · silu(1), with ids
// and weights from the CPU's route_top_k.
std::vector<float> probe_reference(const std::vector<float>& logits, const std::vector<float>& residual, int M, int E,
                                   int k, int H) {
  std::vector<float> ref = residual;
  std::vector<int32_t> ids(static_cast<size_t>(k));
  std::vector<float> w(static_cast<size_t>(k));
  for (int m = 0; m < M; ++m) {
    cpu::route_top_k(logits.data() + size_t(m) * E, E, k, ids.data(), w.data());
    for (int r = 0; r < k; ++r) ref[size_t(m) * H + size_t(ids[size_t(r)])] += w[size_t(r)] * cpu::silu(1.0f);
  }
  return ref;
}

// Lists, per token row, the experts whose column changed, for failure messages.
std::string selected_columns(const std::vector<float>& out, const std::vector<float>& residual, int m, int H) {
  std::string s;
  for (int h = 0; h < H; ++h)
    if (out[size_t(m) * H + h] != residual[size_t(m) * H + h]) s += std::to_string(h) + " ";
  return s;
}

// alt_logits: a second acceptable routing input (near-ties, see below): each token row may
// match the reference of either.
void check_routing(const std::vector<float>& logits, int M, int E, int k, const std::string& what,
                   const std::vector<float>* alt_logits = nullptr) {
  int H = 16;  // a power of two >= E, so that 1/H and the sum of H terms 1/H are exact
  while (H < E) H *= 2;
  const Experts ex = probe_experts(E, H);
  const std::vector<float> x(size_t(M) * H, 1.0f);
  const std::vector<float> residual(size_t(M) * H, 0.0f);
  const auto got = run_gpu(upload(ex), x, logits, residual, M, E, k, H, 1);
  auto ref = probe_reference(logits, residual, M, E, k, H);
  if (alt_logits) {
    const auto alt = probe_reference(*alt_logits, residual, M, E, k, H);
    auto row_close = [&](const std::vector<float>& r, int m) {
      for (int h = 0; h < H; ++h) {
        const size_t i = size_t(m) * H + size_t(h);
        if (std::fabs(got[i] - r[i]) > 1e-7 + 1e-5 * std::fabs(r[i])) return false;
      }
      return true;
    };
    for (int m = 0; m < M; ++m)
      if (!row_close(ref, m) && row_close(alt, m))
        std::copy_n(alt.begin() + long(m) * H, H, ref.begin() + long(m) * H);
  }
  // Weights: fp32 softmax (__expf vs exp) and silu: 1e-5 relative; a different expert
  // moves a whole weight (>= 1/E of the mass) between columns.
  const auto res = all_close(what, got, ref, {M, H}, {"token", "expert"}, 1e-7, 1e-5);
  EXPECT_TRUE(res);
  if (!res)
    for (int m = 0; m < M; ++m)
      std::printf("  token %d: GPU selected %s| CPU selected %s\n", m, selected_columns(got, residual, m, H).c_str(),
                  selected_columns(ref, residual, m, H).c_str());
}

// Random logits with designed rows appended: an exact tie at the k-th place (both id
// orders), all equal, and more than k equal maxima.
std::vector<float> routing_logits(Rng& rng, int E, int k, int& M) {
  std::vector<float> logits;
  auto add_row = [&](std::vector<float> row) { logits.insert(logits.end(), row.begin(), row.end()); };
  for (int i = 0; i < 5; ++i) add_row(random_f32(rng, size_t(E), 2.0f));
  for (int order = 0; order < 2; ++order) {  // exact tie between the k-th and the (k+1)-th
    std::vector<float> row = random_f32(rng, size_t(E), 2.0f);
    std::vector<int> idx(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) idx[size_t(e)] = e;
    std::sort(idx.begin(), idx.end(), [&](int a, int b) { return row[size_t(a)] > row[size_t(b)]; });
    int a = idx[size_t(k - 1)], b = idx[size_t(k)];
    if ((order == 0) != (a < b)) std::swap(a, b);
    row[size_t(b)] = row[size_t(a)];
    add_row(row);
  }
  add_row(std::vector<float>(size_t(E), 0.0f));  // all equal: experts 0..k-1, weights 1/k
  {
    std::vector<float> row = random_f32(rng, size_t(E), 1.0f);
    for (int i = 0; i < k + 4; ++i) row[size_t(rng.integer(0, E - 1))] = 5.0f;  // >= k+1 equal maxima (likely)
    add_row(row);
  }
  M = int(logits.size() / size_t(E));
  return logits;
}

}  // namespace

TEST(GpuOpsMoe, RoutingMatchesCpuTopKWithExactTies) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(41);
  for (auto [E, k] : std::vector<std::pair<int, int>>{{256, 8}, {8, 3}, {10, 4}}) {
    int M = 0;
    const auto logits = routing_logits(rng, E, k, M);
    check_routing(logits, M, E, k, "moe routing E=" + std::to_string(E) + " k=" + std::to_string(k));
  }
}

// Router logits one fp32 ulp apart at the k-th place. The CPU ranks by fp32 softmax
// probabilities (as transformers: softmax then topk), where two such logits can give equal
// probabilities and the lower id wins; a GPU that ranks by logits picks the higher logit.
// Both kernels document "ties: lower expert id first"; each row must match the CPU's choice
// on these logits or on logits where the one-ulp gap is widened (see alt below).
TEST(GpuOpsMoe, RoutingMatchesCpuTopKWithNearTies) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(42);
  for (auto [E, k] : std::vector<std::pair<int, int>>{{256, 8}, {8, 3}}) {
    std::vector<float> logits, alt;
    int M = 0;
    for (int i = 0; i < 16; ++i, ++M) {
      std::vector<float> row = random_f32(rng, size_t(E), 2.0f);
      std::vector<int> idx(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) idx[size_t(e)] = e;
      std::sort(idx.begin(), idx.end(), [&](int a, int b) { return row[size_t(a)] > row[size_t(b)]; });
      int lo = std::min(idx[size_t(k - 1)], idx[size_t(k)]), hi = std::max(idx[size_t(k - 1)], idx[size_t(k)]);
      // Even rows: the higher id gets the larger logit by one ulp; odd rows: the lower id.
      const float v = row[size_t(idx[size_t(k - 1)])];
      row[size_t(lo)] = v;
      row[size_t(hi)] = v;
      if (i % 2 == 0)
        row[size_t(hi)] = std::nextafter(v, INFINITY);
      else
        row[size_t(lo)] = std::nextafter(v, INFINITY);
      logits.insert(logits.end(), row.begin(), row.end());
      // The other legitimate outcome: the one-ulp-larger logit gets the strictly larger
      // probability (CUDA's expf and glibc's exp may differ by an ulp, so whether the two
      // probabilities round to equal is not portable); modelled by widening the gap.
      std::vector<float> wide = row;
      if (i % 2 == 0) wide[size_t(lo)] = std::nextafter(v, -INFINITY);
      alt.insert(alt.end(), wide.begin(), wide.end());
    }
    check_routing(logits, M, E, k, "moe routing near-ties E=" + std::to_string(E) + " k=" + std::to_string(k), &alt);
  }
}

namespace {

struct ExpertCase {
  int E, k, H, I;
  std::string format;  // "bf16", "gptq-sym-g128", "gptq-asym-g32", "fp8"
};

Experts make_experts(Rng& rng, const ExpertCase& c) {
  Experts ex;
  auto make = [&](int64_t N, int64_t K) {
    if (c.format == "bf16") return make_dense_bf16(rng, N, K, 0.03f);
    if (c.format == "gptq-sym-g128") return make_gptq(rng, N, K, 128, true, false, 0.005f);
    if (c.format == "gptq-asym-g32") return make_gptq(rng, N, K, 32, false, false, 0.005f);
    return make_fp8_block(rng, N, K, 0.03f, false);
  };
  for (int e = 0; e < c.E; ++e) {
    ex.gate.push_back(make(c.I, c.H));
    ex.up.push_back(make(c.I, c.H));
    ex.down.push_back(make(c.H, c.I));
    ex.ref_gate.push_back(dense_f32(ex.gate.back().dequant, c.I, c.H, "ref.gate." + std::to_string(e)));
    ex.ref_up.push_back(dense_f32(ex.up.back().dequant, c.I, c.H, "ref.up." + std::to_string(e)));
    ex.ref_down.push_back(dense_f32(ex.down.back().dequant, c.H, c.I, "ref.down." + std::to_string(e)));
  }
  return ex;
}

}  // namespace

TEST(GpuOpsMoe, ExpertsMatchCpuMoe) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(43);
  const std::vector<ExpertCase> cases{{16, 8, 3072, 1024, "bf16"},          {16, 8, 3072, 1024, "gptq-sym-g128"},
                                      {16, 8, 3072, 1024, "fp8"},           {8, 3, 256, 96, "gptq-asym-g32"},
                                      {8, 3, 72, 36, "bf16"},               {10, 4, 200, 40, "fp8"},
                                      {8, 3, 512, 128, "gptq-asym-g32"},    {12, 4, 2048, 512, "gptq-sym-g128"},
                                      {300, 4, 256, 128, "gptq-sym-g128"}};  // E > 256: tiled kernels at M <= 8
  for (const auto& c : cases) {
    const std::string name = c.format + " E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) +
                             " H=" + std::to_string(c.H) + " I=" + std::to_string(c.I);
    SCOPED_TRACE(name);
    const Experts ex = make_experts(rng, c);
    const TestWeight router = make_dense_bf16(rng, c.E, c.H, 0.05f);
    // A zero shared expert (and gate): cpu::moe_forward then returns the routed sum alone.
    const int Is = 8;
    const auto zero_gate = dense_f32(std::vector<float>(size_t(Is) * c.H, 0.0f), Is, c.H, "shared.gate");
    const auto zero_up = dense_f32(std::vector<float>(size_t(Is) * c.H, 0.0f), Is, c.H, "shared.up");
    const auto zero_down = dense_f32(std::vector<float>(size_t(c.H) * Is, 0.0f), c.H, Is, "shared.down");
    const auto zero_sg = dense_f32(std::vector<float>(size_t(c.H), 0.0f), 1, c.H, "shared_expert_gate");
    std::vector<cpu::ExpertWeights> cpu_experts;
    for (int e = 0; e < c.E; ++e)
      cpu_experts.push_back({&ex.ref_gate[size_t(e)], &ex.ref_up[size_t(e)], &ex.ref_down[size_t(e)]});
    const cpu::MoeParams params{&router.weight, cpu_experts, {&zero_gate, &zero_up, &zero_down}, &zero_sg, c.k};
    const cuda::DeviceExperts d = upload(ex);

    for (int M : {1, 3, 8, 17, 64}) {  // <= 8: the two-launch decode kernels (GPTQ), else the tiled ones
      const auto x = random_bf16(rng, size_t(M) * c.H, 1.0f);
      // The router logits the CPU computes inside moe_forward (same op, same order).
      std::vector<float> logits(size_t(M) * c.E);
      cpu::linear(pool(), x.data(), M, router.weight, logits.data());
      std::vector<float> routed(size_t(M) * c.H);
      cpu::moe_forward(pool(), params, x.data(), M, routed.data());
      const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
      std::vector<float> ref = residual;
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += routed[i];
      const auto got = run_gpu(d, x, logits, residual, M, c.E, c.k, c.H, c.I);
      // fp32 everywhere after the bf16 inputs (exact in-register dequantisation, f32
      // activations): reduction-order noise of two chained dots (~1e-6 of the output scale)
      // and __expf in SiLU and softmax. 1e-4 of max|routed| leaves a wide margin; a wrong
      // expert, group or zero point is O(max|routed|).
      const double scale = error_stats(routed, routed).max_ref;
      EXPECT_TRUE(all_close("moe experts " + name + " M=" + std::to_string(M), got, ref, {M, c.H}, {"token", "h"},
                            1e-4 * scale, 1e-6));
    }
  }
}

// A token's routed output is bit-identical whether it runs alone or among other tokens that
// share its experts: batch invariance of the grouped kernels for every expert kernel family
// (GPTQ: the two-launch decode kernels at M <= 8 and the tiled kernels at M = 16 and 64, which
// must give the same bits; FP8/bf16 rows; element-wise). Batches are the first Mb tokens of a
// 64-token set; each probed token m < Mb is compared with its run alone (M = 1).
TEST(GpuOpsMoe, TokenOutputIndependentOfBatch) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(47);
  const std::vector<ExpertCase> cases{{16, 8, 3072, 1024, "gptq-sym-g128"}, {16, 8, 1024, 512, "fp8"},
                                      {16, 8, 1024, 256, "bf16"},           {8, 3, 256, 96, "gptq-asym-g32"},
                                      {8, 3, 512, 128, "gptq-asym-g32"},    {12, 4, 2048, 512, "gptq-sym-g128"},
                                      {300, 4, 256, 128, "gptq-sym-g128"}};  // E > 256: 2-token tiles at M <= 8
  for (const auto& c : cases) {
    SCOPED_TRACE(c.format + " H=" + std::to_string(c.H) + " I=" + std::to_string(c.I));
    const Experts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = upload(ex);
    const int M = 64;
    const auto x = random_bf16(rng, size_t(M) * c.H, 1.0f);
    const auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
    const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
    auto rows = [](const std::vector<float>& v, int first, int count, int width) {
      return std::vector<float>(v.begin() + long(first) * width, v.begin() + long(first + count) * width);
    };
    const std::vector<int> probes{0, 1, 5, 7, 15, 63};
    std::vector<std::vector<float>> alone;
    for (int m : probes)
      alone.push_back(run_gpu(d, rows(x, m, 1, c.H), rows(logits, m, 1, c.E), rows(residual, m, 1, c.H), 1, c.E, c.k,
                              c.H, c.I));
    for (int Mb : {2, 8, 16, 64}) {
      const auto batch = run_gpu(d, rows(x, 0, Mb, c.H), rows(logits, 0, Mb, c.E), rows(residual, 0, Mb, c.H), Mb,
                                 c.E, c.k, c.H, c.I);
      for (size_t i = 0; i < probes.size(); ++i) {
        const int m = probes[i];
        if (m >= Mb) continue;
        int diffs = 0;
        for (int h = 0; h < c.H; ++h) diffs += alone[i][size_t(h)] != batch[size_t(m) * c.H + size_t(h)];
        EXPECT_EQ(diffs, 0) << "token " << m << ": " << diffs << " of " << c.H
                            << " outputs differ alone vs in a batch of " << Mb;
      }
    }
  }
}

// The model's call (f32 x, shared expert fused into the combine): the fused result equals the
// routed block followed by residual += sigmoid(logit)·shared (to rounding: the fused pass adds
// in one step), and a token's bits are the same alone, in a decode batch (M = 8, decode
// kernels) and in a 64-token batch (tiled kernels + combine_kernel).
TEST(GpuOpsMoe, SharedExpertFusedAndBatchInvariant) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(48);
  const std::vector<ExpertCase> cases{{16, 8, 3072, 1024, "gptq-sym-g128"}, {8, 3, 512, 128, "gptq-asym-g32"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.format + " H=" + std::to_string(c.H));
    const Experts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = upload(ex);
    const int M = 64;
    const auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
    const auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
    const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
    const auto shared = random_f32(rng, size_t(M) * c.H, 0.5f);
    const auto shared_logit = random_f32(rng, size_t(M), 2.0f);
    auto rows = [](const std::vector<float>& v, int first, int count, int width) {
      return std::vector<float>(v.begin() + long(first) * width, v.begin() + long(first + count) * width);
    };
    for (int Mb : {1, 8, 64}) {
      const auto xs = rows(x, 0, Mb, c.H), ls = rows(logits, 0, Mb, c.E), rs = rows(residual, 0, Mb, c.H);
      const auto ss = rows(shared, 0, Mb, c.H), gs = rows(shared_logit, 0, Mb, 1);
      const auto fused = run_gpu_f32(d, xs, ls, rs, Mb, c.E, c.k, c.H, c.I, &ss, &gs);
      const auto plain = run_gpu_f32(d, xs, ls, rs, Mb, c.E, c.k, c.H, c.I);
      std::vector<float> ref = plain;
      for (int m = 0; m < Mb; ++m) {
        const float sig = 1.0f / (1.0f + std::exp(-gs[size_t(m)]));
        for (int h = 0; h < c.H; ++h) ref[size_t(m) * c.H + h] += sig * ss[size_t(m) * c.H + h];
      }
      EXPECT_TRUE(all_close("moe fused shared M=" + std::to_string(Mb), fused, ref, {Mb, c.H}, {"token", "h"}, 1e-5,
                            1e-5));
      const auto s1 = rows(shared, Mb - 1, 1, c.H), g1 = rows(shared_logit, Mb - 1, 1, 1);
      const auto one = run_gpu_f32(d, rows(x, Mb - 1, 1, c.H), rows(logits, Mb - 1, 1, c.E),
                                   rows(residual, Mb - 1, 1, c.H), 1, c.E, c.k, c.H, c.I, &s1, &g1);
      int diffs = 0;
      for (int h = 0; h < c.H; ++h) diffs += one[size_t(h)] != fused[size_t(Mb - 1) * c.H + size_t(h)];
      EXPECT_EQ(diffs, 0) << "token " << Mb - 1 << " alone vs in a batch of " << Mb;
    }
  }
}

// The decode kernels (M <= 8, ops_moe_decode.cu) and the tiled kernels (M > 8,
// ops_moe_gptq.cu) must give every token the same bits: both dequantise the words to the same
// exact f32 (q - zero) (symmetric weights: dequant8_const_zero, the exponent-field OR + FADD;
// asymmetric: dequant8) and sum in the same order. Tokens 0..7 run as one decode batch (M = 8)
// and inside a 9-token tiled batch; all 8 tokens, all H outputs, bf16 and f32 x, the 122B
// expert shape (H 3072, I 1024, g128 symmetric) and asymmetric g32 zeros. The x rows span
// magnitudes 2^-20 .. 2^20 so that an inexact dequantisation would show in the products.
TEST(GpuOpsMoe, DecodeAndTiledKernelsAgreeOnEveryToken) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(49);
  const std::vector<ExpertCase> cases{{16, 8, 3072, 1024, "gptq-sym-g128"},
                                      {8, 3, 512, 128, "gptq-asym-g32"},
                                      {12, 4, 2048, 512, "gptq-sym-g128"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.format + " H=" + std::to_string(c.H) + " I=" + std::to_string(c.I));
    const Experts ex = make_experts(rng, c);
    const cuda::DeviceExperts d = upload(ex);
    const int M = 9;
    auto x = random_f32(rng, size_t(M) * c.H, 1.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(x[i], int(i % 41) - 20);
    const auto logits = random_f32(rng, size_t(M) * c.E, 2.0f);
    const auto residual = random_f32(rng, size_t(M) * c.H, 1.0f);
    const auto shared = random_f32(rng, size_t(M) * c.H, 0.5f);
    const auto shared_logit = random_f32(rng, size_t(M), 2.0f);
    auto rows = [](const std::vector<float>& v, int first, int count, int width) {
      return std::vector<float>(v.begin() + long(first) * width, v.begin() + long(first + count) * width);
    };
    for (int f32 = 0; f32 < 2; ++f32) {
      auto run = [&](int Mb) {
        const auto xs = rows(x, 0, Mb, c.H), ls = rows(logits, 0, Mb, c.E), rs = rows(residual, 0, Mb, c.H);
        if (!f32) return run_gpu(d, xs, ls, rs, Mb, c.E, c.k, c.H, c.I);
        const auto ss = rows(shared, 0, Mb, c.H), gs = rows(shared_logit, 0, Mb, 1);
        return run_gpu_f32(d, xs, ls, rs, Mb, c.E, c.k, c.H, c.I, &ss, &gs);
      };
      const auto decode = run(8), tiled = run(9);
      int diffs = 0;
      for (size_t i = 0; i < decode.size(); ++i) diffs += decode[i] != tiled[i];
      EXPECT_EQ(diffs, 0) << (f32 ? "f32 x + shared" : "bf16 x") << ": " << diffs << " of " << decode.size()
                          << " outputs differ between the decode (M = 8) and tiled (M = 9) kernels";
    }
  }
}

// The streaming decode kernels (variant 1, the default) against the previous decode kernels
// (variant 0, set_moe_decode_variant): every output bit for bit, at M = 1, 2, 3, 5, 8, with
// symmetric and asymmetric zeros, groups 32 / 64 / 128 (scale blocks of 1..16 packed rows, one
// to many items per thread; H 3072, I 1024, k 6, g64: 384 gate/up and 384 down items, so a
// thread's ring runs on from its first item into its second), bf16 x, and f32 x with the
// shared expert and the residual. The x rows span 2^-20 .. 2^20 (as in
// DecodeAndTiledKernelsAgreeOnEveryToken) so that a different summation order or an inexact
// dequantisation would show. Values other than 0 and 1 are rejected.
TEST(GpuOpsMoe, StreamingDecodeKernelsMatchPreviousBitForBit) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(50);
  struct Case {
    int E, k, H, I, group;
    bool sym;
  };
  const std::vector<Case> cases{{16, 8, 3072, 1024, 128, true},  // 122B-A10B's experts
                                {12, 8, 3072, 1024, 128, false}, {8, 6, 3072, 1024, 64, false},
                                {8, 6, 3072, 1024, 64, true},    {8, 4, 1024, 256, 64, true},
                                {12, 4, 2048, 512, 64, false},   {8, 3, 512, 128, 32, false},
                                {8, 3, 512, 128, 32, true},      {10, 4, 768, 192, 64, false}};
  struct VariantGuard {  // restores the variant found (the default) even when an assertion throws
    int saved = cuda::moe_decode_variant();
    ~VariantGuard() { cuda::set_moe_decode_variant(saved); }
  } guard;
  EXPECT_EQ(cuda::moe_decode_variant(), 1) << "the streaming kernels are the default";
  for (int bad : {-1, 2, 3}) EXPECT_THROW(cuda::set_moe_decode_variant(bad), Error) << bad;
  EXPECT_EQ(cuda::moe_decode_variant(), 1) << "a rejected value leaves the variant as it was";
  for (const auto& c : cases) {
    const std::string name = std::string(c.sym ? "sym" : "asym") + " g" + std::to_string(c.group) +
                             " E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) + " H=" + std::to_string(c.H) +
                             " I=" + std::to_string(c.I);
    SCOPED_TRACE(name);
    Experts ex;
    for (int e = 0; e < c.E; ++e) {
      ex.gate.push_back(make_gptq(rng, c.I, c.H, c.group, c.sym, false, 0.005f));
      ex.up.push_back(make_gptq(rng, c.I, c.H, c.group, c.sym, false, 0.005f));
      ex.down.push_back(make_gptq(rng, c.H, c.I, c.group, c.sym, false, 0.005f));
    }
    const cuda::DeviceExperts d = upload(ex);
    const int Mmax = 8;
    auto x = random_f32(rng, size_t(Mmax) * c.H, 1.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(x[i], int(i % 41) - 20);
    const auto logits = random_f32(rng, size_t(Mmax) * c.E, 2.0f);
    const auto residual = random_f32(rng, size_t(Mmax) * c.H, 1.0f);
    const auto shared = random_f32(rng, size_t(Mmax) * c.H, 0.5f);
    const auto shared_logit = random_f32(rng, size_t(Mmax), 2.0f);
    auto rows = [](const std::vector<float>& v, int count, int width) {
      return std::vector<float>(v.begin(), v.begin() + long(count) * width);
    };
    for (int M : {1, 2, 3, 5, 8}) {
      for (int f32 = 0; f32 < 2; ++f32) {
        auto run = [&](int variant) {
          cuda::set_moe_decode_variant(variant);
          EXPECT_EQ(cuda::moe_decode_variant(), variant);
          const auto xs = rows(x, M, c.H), ls = rows(logits, M, c.E), rs = rows(residual, M, c.H);
          if (!f32) return run_gpu(d, xs, ls, rs, M, c.E, c.k, c.H, c.I);
          const auto ss = rows(shared, M, c.H), gs = rows(shared_logit, M, 1);
          return run_gpu_f32(d, xs, ls, rs, M, c.E, c.k, c.H, c.I, &ss, &gs);
        };
        const auto before = run(0), now = run(1);
        ASSERT_EQ(before.size(), now.size());
        int diffs = 0, changed = 0;
        for (size_t i = 0; i < now.size(); ++i) {
          diffs += std::memcmp(&before[i], &now[i], sizeof(float)) != 0;
          changed += now[i] != residual[i];
        }
        EXPECT_EQ(diffs, 0) << (f32 ? "f32 x + shared" : "bf16 x") << " M=" << M << ": " << diffs << " of "
                            << now.size() << " outputs differ between the previous and the streaming kernels";
        // The experts did run: nearly every output moved away from the residual.
        EXPECT_GT(changed, int(now.size() * 9 / 10)) << (f32 ? "f32 x + shared" : "bf16 x") << " M=" << M;
      }
    }
  }
}
