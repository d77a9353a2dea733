// The hardware property the swapAB decode kernels rely on (ops_moe_mma_swap.cu, ops_tc_gemv.cu):
// an mma.sync element D[i][j] = Σ_k A[i][k]·B[k][j] + C[i][j] is a function of A's row i, B's
// column j and C[i][j] alone, and it does not change when the two operands trade places. With
// weights as A (rows = output columns) and tokens as B (columns = tokens) a decode kernel then gives
// an output exactly the bits the prompt kernels give with tokens as A and weights as B.
//
// The test computes D = A·B + C with mma.sync.m16n8k16 (bf16 and f16 inputs, f32 accumulate) and
// the swapped product D2 = A2·B2 + C2 with A2 rows 0..7 = Bᵀ, B2 columns = the first 8 rows of A
// (as columns), C2 = the transposed C block, then requires D[j][i] == D2[i][j] bit for bit for all
// i, j < 8, over many random trials whose inputs span wide exponent ranges (so the accumulation's
// alignment and rounding are exercised), with zeros and both signs. Rows 8..15 of A2 hold other
// data: they must not affect rows 0..7.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "mma_swap_probe.h"

namespace {

constexpr int kTrials = 4096;

// A random 16-bit float (bf16 or f16 bits) with an exponent spread of +-spread around 0, a random
// mantissa and sign; ~6% zeros.
uint16_t random_value(std::mt19937& rng, bool f16, int spread) {
  std::uniform_int_distribution<int> e(-spread, spread), m(0, f16 ? 1023 : 127), s(0, 1), z(0, 15);
  if (z(rng) == 0) return uint16_t(s(rng) << 15);
  const int sign = s(rng);
  if (f16) {
    const int ex = std::clamp(15 + e(rng), 1, 30);
    return uint16_t((sign << 15) | (ex << 10) | m(rng));
  }
  const int ex = 127 + e(rng);
  return uint16_t((sign << 15) | (ex << 7) | m(rng));
}

template <bool kF16>
void check_swap_symmetry(int spread, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> a(size_t(kTrials) * 256), b(size_t(kTrials) * 128), a2(a.size()), b2(b.size());
  std::vector<float> c(size_t(kTrials) * 128), c2(c.size());
  std::normal_distribution<float> nc(0.0f, 1.0f);
  std::uniform_int_distribution<int> ce(-12, 12);
  for (auto& v : a) v = random_value(rng, kF16, spread);
  for (auto& v : b) v = random_value(rng, kF16, spread);
  for (auto& v : c) v = std::ldexp(nc(rng), ce(rng));
  for (int tr = 0; tr < kTrials; ++tr) {
    const uint16_t* A = a.data() + size_t(tr) * 256;
    const uint16_t* B = b.data() + size_t(tr) * 128;
    const float* C = c.data() + size_t(tr) * 128;
    uint16_t* A2 = a2.data() + size_t(tr) * 256;
    uint16_t* B2 = b2.data() + size_t(tr) * 128;
    float* C2 = c2.data() + size_t(tr) * 128;
    for (int i = 0; i < 16; ++i)
      for (int k = 0; k < 16; ++k)  // rows 0..7: Bᵀ; rows 8..15: A's rows 8..15 (unrelated data)
        A2[i * 16 + k] = i < 8 ? B[i * 16 + k] : A[i * 16 + k];
    for (int j = 0; j < 8; ++j)
      for (int k = 0; k < 16; ++k) B2[j * 16 + k] = A[j * 16 + k];  // column j of B2 = row j of A
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) C2[i * 8 + j] = i < 8 ? C[j * 8 + i] : C[i * 8 + j];
  }
  auto run = [&](const std::vector<uint16_t>& ha, const std::vector<uint16_t>& hb, const std::vector<float>& hc) {
    uint16_t *da, *db;
    float *dc, *dd;
    MOESERVE_CUDA_CHECK(cudaMalloc(&da, ha.size() * 2));
    MOESERVE_CUDA_CHECK(cudaMalloc(&db, hb.size() * 2));
    MOESERVE_CUDA_CHECK(cudaMalloc(&dc, hc.size() * 4));
    MOESERVE_CUDA_CHECK(cudaMalloc(&dd, hc.size() * 4));
    MOESERVE_CUDA_CHECK(cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
    MOESERVE_CUDA_CHECK(cudaMemcpy(db, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
    MOESERVE_CUDA_CHECK(cudaMemcpy(dc, hc.data(), hc.size() * 4, cudaMemcpyHostToDevice));
    moeserve::gputest::mma_probe_run(kF16, kTrials, da, db, dc, dd);
    MOESERVE_CUDA_CHECK(cudaGetLastError());
    std::vector<float> out(hc.size());
    MOESERVE_CUDA_CHECK(cudaMemcpy(out.data(), dd, out.size() * 4, cudaMemcpyDeviceToHost));
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaFree(dd);
    return out;
  };
  const std::vector<float> d = run(a, b, c), d2 = run(a2, b2, c2);
  int mismatches = 0;
  for (int tr = 0; tr < kTrials; ++tr)
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 8; ++j) {
        const float x = d[size_t(tr) * 128 + size_t(j) * 8 + size_t(i)];  // D[j][i]
        const float y = d2[size_t(tr) * 128 + size_t(i) * 8 + size_t(j)];  // D2[i][j]
        uint32_t xb, yb;
        std::memcpy(&xb, &x, 4);
        std::memcpy(&yb, &y, 4);
        if (xb != yb && mismatches++ < 5)
          ADD_FAILURE() << "trial " << tr << " D[" << j << "][" << i << "] = " << x << " (0x" << std::hex << xb
                        << "), swapped 0x" << yb << std::dec << " = " << y;
      }
  EXPECT_EQ(mismatches, 0) << "of " << kTrials * 64 << " elements";
}

}  // namespace

TEST(GpuMmaSwap, Bf16SwappedOperandsGiveTheSameBits) {
  check_swap_symmetry<false>(8, 1);    // moderate spread: most products overlap in the sum
  check_swap_symmetry<false>(30, 2);   // wide spread: alignment shifts and cancellations
}

TEST(GpuMmaSwap, F16SwappedOperandsGiveTheSameBits) {
  check_swap_symmetry<true>(6, 3);
  check_swap_symmetry<true>(14, 4);
}
