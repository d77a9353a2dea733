// Linear layers on the CPU: Y[M, N] = X[M, K] · Wᵀ, with W [N, K] in any QuantWeight format.
//
// W is read only through QuantWeight::dequantize_rows: a tile of W's rows is dequantised
// to fp32 once and then used for all M rows of X, so a quantised format costs one exact
// dequantisation per step, whatever the batch size. Work is split over tiles of output
// features; every output element is one dot product summed in a fixed order, so results
// do not depend on the thread count.
#pragma once
#include <cstdint>
#include <span>

#include "core/thread_pool.h"
#include "quant/quant_weight.h"

namespace moeserve::cpu {

// One matrix product of a grouped launch.
struct LinearProblem {
  const float* x = nullptr;              // [m, K], rows ldx floats apart
  int64_t m = 0;
  const quant::QuantWeight* w = nullptr; // [N, K]
  float* y = nullptr;                    // [m, N], rows ldy floats apart
  int64_t ldx = -1;                      // -1: K
  int64_t ldy = -1;                      // -1: N
};

// Y = X Wᵀ.
void linear(ThreadPool& pool, const float* x, int64_t m, const quant::QuantWeight& w, float* y);

// Several independent products in one parallel launch (q/k/v projections, the experts of
// a MoE layer). Tiles of all problems share the threads.
void linear_grouped(ThreadPool& pool, std::span<const LinearProblem> problems);

// Σ a[i]·b[i] in the fixed order used by every CPU kernel (8 partial sums, then a tree).
float dot(const float* a, const float* b, int64_t n);

}  // namespace moeserve::cpu
