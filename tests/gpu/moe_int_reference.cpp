// CPU reference of the integer-form routed experts (moe_int_reference.h).
#include "moe_int_reference.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "backend/cpu/moe.h"
#include "backend/cuda/moe_int_arith.h"
#include "core/dtype.h"

namespace moeserve::gputest {

namespace mi = moeserve::cuda::moe_int;

namespace {

// Steps 1 of moe_int_arith.h for one row: X [K] and the block scales s [K / kXBlock].
void quantize_row(const float* x, int K, std::vector<int>& X, std::vector<float>& s) {
  const int blocks = (K + mi::kXBlock - 1) / mi::kXBlock;  // the last one may be short
  X.assign(size_t(K), 0);
  s.assign(size_t(blocks), 0.0f);
  for (int b = 0; b < blocks; ++b) {
    const int k0 = b * mi::kXBlock, k1 = std::min(K, k0 + mi::kXBlock);
    float amax = 0.0f;
    for (int k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(x[k]));
    const mi::XScale sc = mi::x_scale(amax);
    s[size_t(b)] = sc.s;
    for (int k = k0; k < k1; ++k) X[size_t(k)] = mi::quantize_x(x[k], sc.inv);
  }
}

}  // namespace

std::vector<float> int_form_linear(const quant::QuantWeight& w, const float* x, int M) {
  if (w.format != quant::WeightFormat::GptqInt4 || w.has_part("g_idx"))
    throw std::invalid_argument("int_form_linear: GPTQ INT4 without act-order only");
  const int N = int(w.out_features), K = int(w.in_features), g = int(w.group_size);
  const int U = mi::unit_length(g);
  if (U == 0 || K % mi::kKStep != 0 || K % U != 0) throw std::invalid_argument("int_form_linear: unsupported group or K");
  const int32_t* qw = w.part("qweight").data<int32_t>();    // [K/8][N]
  const uint16_t* sc = w.part("scales").data<uint16_t>();   // f16 [K/g][N]
  const int32_t* qz = w.has_part("qzeros") ? w.part("qzeros").data<int32_t>() : nullptr;  // [K/g][N/8]
  std::vector<float> y(size_t(M) * N);
  std::vector<int> X;
  std::vector<float> s;
  for (int m = 0; m < M; ++m) {
    quantize_row(x + size_t(m) * K, K, X, s);
    for (int n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int u = 0; u < K / U; ++u) {
        const int k0 = u * U, grp = k0 / g;
        const int z = w.sym || !qz ? 8 : int((uint32_t(qz[size_t(grp) * (N / 8) + n / 8]) >> (4 * (n % 8))) & 0xF) + 1;
        int64_t d = 0;
        for (int k = k0; k < k0 + U; ++k) {
          const int q = int((uint32_t(qw[size_t(k / 8) * N + n]) >> (4 * (k % 8))) & 0xF);
          d += int64_t(q - z) * X[size_t(k)];
        }
        if (d > INT32_MAX || d < INT32_MIN) throw std::logic_error("int_form_linear: unit sum out of int32");
        acc = mi::fold_unit(acc, int32_t(d), s[size_t(k0 / mi::kXBlock)], f16_to_f32(sc[size_t(grp) * N + n]));
      }
      y[size_t(m) * N + n] = acc;
    }
  }
  return y;
}

void int_form_moe(const IntFormExperts& ex, int top_k, const float* x, const float* logits, int M, float* residual,
                  const float* shared_out, const float* shared_gate_logit) {
  const int E = int(ex.gate.size());
  const int I = int(ex.gate[0]->out_features), H = int(ex.gate[0]->in_features);
  std::vector<int32_t> ids(static_cast<size_t>(top_k));
  std::vector<float> wts(static_cast<size_t>(top_k));
  for (int m = 0; m < M; ++m) {
    const float* xm = x + size_t(m) * H;
    cpu::route_top_k(logits + size_t(m) * E, E, top_k, ids.data(), wts.data());
    std::vector<float> acc(size_t(H), 0.0f);
    for (int r = 0; r < top_k; ++r) {
      const int e = ids[size_t(r)];
      const auto g = int_form_linear(*ex.gate[size_t(e)], xm, 1);
      const auto u = int_form_linear(*ex.up[size_t(e)], xm, 1);
      std::vector<float> act(static_cast<size_t>(I));
      for (int i = 0; i < I; ++i) act[size_t(i)] = g[size_t(i)] / (1.0f + std::exp(-g[size_t(i)])) * u[size_t(i)];
      const auto y = int_form_linear(*ex.down[size_t(e)], act.data(), 1);
      for (int h = 0; h < H; ++h) acc[size_t(h)] = std::fma(wts[size_t(r)], y[size_t(h)], acc[size_t(h)]);
    }
    for (int h = 0; h < H; ++h) {
      float o = residual[size_t(m) * H + h] + acc[size_t(h)];
      if (shared_out) {
        const float sig = 1.0f / (1.0f + std::exp(-shared_gate_logit[m]));
        o = std::fma(sig, shared_out[size_t(m) * H + h], o);
      }
      residual[size_t(m) * H + h] = o;
    }
  }
}

}  // namespace moeserve::gputest
