#include "backend/cpu/linear.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace moeserve::cpu {

float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

namespace {

// Four dot products of x with the rows w, w + k, w + 2k, w + 3k, each summed exactly as dot()
// sums it (so results do not depend on how outputs are grouped); x is loaded once for four.
void dot4(const float* x, const float* w, int64_t k, float* out) {
  float acc[4][8] = {};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8)
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < 8; ++j) acc[r][j] += x[i + j] * w[r * k + i + j];
  for (int r = 0; r < 4; ++r) {
    float tail = 0.0f;
    for (int64_t t = i; t < k; ++t) tail += x[t] * w[r * k + t];
    const float* a = acc[r];
    out[r] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])) + tail;
  }
}

// Rows of W per tile: about 128 KiB of dequantised fp32, so a tile stays in L2 while every
// row of X passes over it.
int64_t tile_rows(int64_t k) { return std::clamp<int64_t>(32768 / std::max<int64_t>(k, 1), 4, 64); }

void check_problem(const LinearProblem& p) {
  MOESERVE_CHECK(p.w != nullptr && p.m >= 0, "linear: missing weight or negative row count");
  MOESERVE_CHECK(p.m == 0 || (p.x != nullptr && p.y != nullptr), "linear '{}': null input or output",
                 p.w->name);
}

// Computes output features [n0, n1) of one problem, dequantising W rows into `tile`.
void run_tile(const LinearProblem& p, int64_t n0, int64_t n1, std::vector<float>& tile) {
  const quant::QuantWeight& w = *p.w;
  const int64_t k = w.in_features;
  const int64_t ldx = p.ldx < 0 ? k : p.ldx;
  const int64_t ldy = p.ldy < 0 ? w.out_features : p.ldy;
  // Dense fp32 weights are read in place; every other format is dequantised into the tile.
  const float* rows = nullptr;
  if (w.format == quant::WeightFormat::Dense && w.part("weight").dtype() == DType::F32) {
    rows = w.part("weight").data<float>() + n0 * k;
  } else {
    tile.resize(size_t((n1 - n0) * k));
    w.dequantize_rows(n0, n1, tile.data());
    rows = tile.data();
  }
  for (int64_t r = 0; r < p.m; ++r) {
    const float* xr = p.x + r * ldx;
    float* yr = p.y + r * ldy;
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) dot4(xr, rows + (n - n0) * k, k, yr + n);
    for (; n < n1; ++n) yr[n] = dot(xr, rows + (n - n0) * k, k);
  }
}

}  // namespace

void linear_grouped(ThreadPool& pool, std::span<const LinearProblem> problems) {
  // Flatten (problem, tile) pairs so that one parallel_for balances all problems.
  std::vector<int64_t> first_tile(problems.size() + 1, 0);
  for (size_t i = 0; i < problems.size(); ++i) {
    check_problem(problems[i]);
    const auto& w = *problems[i].w;
    const int64_t tiles = problems[i].m == 0 ? 0 : (w.out_features + tile_rows(w.in_features) - 1) /
                                                       tile_rows(w.in_features);
    first_tile[i + 1] = first_tile[i] + tiles;
  }
  pool.parallel_for(first_tile.back(), [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> tile;
    size_t p = size_t(std::upper_bound(first_tile.begin(), first_tile.end(), t0) - first_tile.begin()) - 1;
    for (int64_t t = t0; t < t1; ++t) {
      while (t >= first_tile[p + 1]) ++p;
      const LinearProblem& prob = problems[p];
      const int64_t rows = tile_rows(prob.w->in_features);
      const int64_t n0 = (t - first_tile[p]) * rows;
      run_tile(prob, n0, std::min(n0 + rows, prob.w->out_features), tile);
    }
  });
}

void linear(ThreadPool& pool, const float* x, int64_t m, const quant::QuantWeight& w, float* y) {
  const LinearProblem p{x, m, &w, y};
  linear_grouped(pool, std::span<const LinearProblem>(&p, 1));
}

}  // namespace moeserve::cpu
