// Device pieces every integer-form decode kernel of the GPTQ experts shares (ops_moe_int_decode.cu,
// the persistent dp4a kernels; ops_moe_int_stream.cu, the streaming ones): the routing of one
// token by one warp, the activation quantisation of moe_int_arith.h step 1 into dp4a's byte
// planes, and the act-block arrival that quantises gate/up's output once per (slot, 128 columns).
// The plane layout (per packed row of 8 k, one 16-byte vector {hi of k 0,2,4,6 | hi of k 1,3,5,7 |
// lo of k 0,2,4,6 | lo of k 1,3,5,7}, X = 256·hi + lo) is ops_moe_int_decode.cuh's.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/moe_int_arith.h"
#include "backend/cuda/ops_moe.h"
#include "backend/cuda/ops_moe_int_decode.cuh"
#include "backend/cuda/ops_moe_internal.cuh"

namespace moeserve::cuda::moe_int_detail {

namespace mi = moe_int;

constexpr int kQuantBatch = 4;   // 128-k blocks a warp loads before it quantises them (default)
constexpr int kActTileCols = 32; // gate/up tiles of act_block_arrive: 4 per 128-column act block
static_assert(4 * kActTileCols == mi::kXBlock, "an act block is 4 gate/up tiles");

__host__ __device__ constexpr int blocks_of(int K) { return (K + mi::kXBlock - 1) / mi::kXBlock; }

// ---- routing ---------------------------------------------------------------------------------

// route_token (ops_moe_internal.cuh) bit for bit, for E <= 256, `rounds` arg-max rounds: its softmax
// (route_softmax: lane L holds logits L, L + 32, ...; max, accurate expf, the denominator per lane
// then by warp_sum; p = e / denom), the same choice per round (largest p, equal p: lower id; a
// p that never compares > -1 (NaN, taken, e >= E) is never chosen, and a round without any gives
// id 0x7fffffff, p = -1, as route_token). Each round takes two warp reductions: the largest key
// (p >= 0 as its bits + 1: unsigned order = float order; 0 = not choosable), then the lowest id
// with that key. Lane 0 writes ids[r] and p[r] (shared memory); returns Σ p in round order from
// 0.0f (route_token's psum when rounds = k; the weights are p[r] / psum). Call from a whole warp.
__device__ __forceinline__ float route_rounds(const float* __restrict__ row, int E, int rounds, int32_t* ids,
                                              float* p_out) {
  constexpr int kPerLane = 8;
  const int lane = threadIdx.x & 31;
  float p[kPerLane];
  moe_detail::route_softmax<kPerLane, true>(row, E, p);
  unsigned key[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) key[i] = p[i] >= 0.0f ? (__float_as_uint(p[i]) & 0x7fffffffu) + 1u : 0u;
  float psum = 0.0f;
  for (int r = 0; r < rounds; ++r) {
    unsigned best = key[0];
#pragma unroll
    for (int i = 1; i < kPerLane; ++i) best = max(best, key[i]);
    const unsigned top = __reduce_max_sync(0xffffffffu, best);  // warp-uniform
    unsigned win = 0x7fffffffu;
    float bp = -1.0f;
    if (top != 0u) {
      unsigned cand = 0xffffffffu;
#pragma unroll
      for (int i = kPerLane - 1; i >= 0; --i)
        if (key[i] == top) cand = unsigned(lane + 32 * i);  // the lane's lowest id at the top key
      win = __reduce_min_sync(0xffffffffu, cand);
      bp = __uint_as_float(top - 1u);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (unsigned(lane + 32 * i) == win) key[i] = 0u;  // taken
    }
    if (lane == 0) {
      ids[r] = int(win);
      p_out[r] = bp;
    }
    psum += bp;
  }
  return psum;
}

// ---- activation quantisation (moe_int_arith.h step 1) ----------------------------------------

// One 128-k block by one warp: lane L holds x[4L .. 4L + 3] of the block (v; zeros past the row's
// end). Writes the block's plane vectors (planes[0..16)), its scale s_b (*sblk) and ΣX of its 32-k
// quarters (sx[0..4)); a row's short last block (moe_int_arith.h 1.: K % 128 != 0) writes only its
// len / 8 vectors and len / 32 quarters (len = its k count, a multiple of 32). Shared or global.
__device__ __forceinline__ void quantize_block(float4 v, int len, uint4* planes, float* sblk, int* sx) {
  const int lane = threadIdx.x & 31;
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const mi::XScale sc = mi::x_scale(amax);
  const int X0 = mi::quantize_x(v.x, sc.inv), X1 = mi::quantize_x(v.y, sc.inv);
  const int X2 = mi::quantize_x(v.z, sc.inv), X3 = mi::quantize_x(v.w, sc.inv);
  // Even lanes hold k 0..3 of a packed row (bytes 0, 1 of the k-parity words), odd lanes k 4..7
  // (bytes 2, 3); one shuffle per word joins them.
  const int sh = (lane & 1) * 16;
  auto hi = [](int X) { return uint32_t(X >> 8) & 0xFFu; };  // arithmetic shift: X = 256·hi + lo
  auto lo = [](int X) { return uint32_t(X) & 0xFFu; };
  uint32_t hiE = (hi(X0) | (hi(X2) << 8)) << sh;
  uint32_t hiO = (hi(X1) | (hi(X3) << 8)) << sh;
  uint32_t loE = (lo(X0) | (lo(X2) << 8)) << sh;
  uint32_t loO = (lo(X1) | (lo(X3) << 8)) << sh;
  hiE |= __shfl_xor_sync(0xffffffffu, hiE, 1);
  hiO |= __shfl_xor_sync(0xffffffffu, hiO, 1);
  loE |= __shfl_xor_sync(0xffffffffu, loE, 1);
  loO |= __shfl_xor_sync(0xffffffffu, loO, 1);
  if ((lane & 1) == 0 && 8 * (lane >> 1) < len) planes[lane >> 1] = make_uint4(hiE, hiO, loE, loO);
  int s = X0 + X1 + X2 + X3;  // exact
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  s += __shfl_xor_sync(0xffffffffu, s, 2);
  s += __shfl_xor_sync(0xffffffffu, s, 4);
  if ((lane & 7) == 0 && 32 * (lane >> 3) < len) sx[lane >> 3] = s;
  if (lane == 0) *sblk = sc.s;
}

// rows contiguous activation rows of K (src, f32, written by an earlier kernel: read through L2)
// into planes (row r's block b at planes + r·row_stride + b·blk_stride vectors: blk_stride 16 is
// the packed layout, more pads the blocks onto other banks), sblk [rows][ceil(K/128)], sx
// [rows][K/32], by warps warp0 .. blockDim.x / 32 - 1: warp w takes the blocks w - warp0, +
// (warps - warp0), ...; each warp loads kBatch blocks before it quantises them. vec: src is
// 16-byte aligned (else 4-byte loads).
template <int kBatch = kQuantBatch>
__device__ __forceinline__ void quantize_rows(const float* __restrict__ src, int rows, int K, bool vec, uint4* planes,
                                              int row_stride, int blk_stride, float* sblk, int* sx, int warp0) {
  const int nb = blocks_of(K), tasks = rows * nb, nw = int(blockDim.x >> 5) - warp0;
  const int w = (threadIdx.x >> 5) - warp0, lane = threadIdx.x & 31;
  for (int t0 = w; t0 < tasks; t0 += kBatch * nw) {
    float4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int t = t0 + j * nw;
      v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const int r = t / nb, kk = (t - r * nb) * mi::kXBlock + 4 * lane;  // row t / nb, block t % nb
      if (t < tasks && kk < K) {  // K % 4 == 0: a lane's 4 k are all in the row or all past it
        const float* p = src + size_t(r) * K + kk;
        v[j] = vec ? __ldcg(reinterpret_cast<const float4*>(p))
                   : make_float4(__ldcg(p), __ldcg(p + 1), __ldcg(p + 2), __ldcg(p + 3));
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int t = t0 + j * nw;  // warp-uniform
      if (t < tasks) {
        const int r = t / nb, b = t - r * nb;
        quantize_block(v[j], min(mi::kXBlock, K - b * mi::kXBlock), planes + size_t(r) * row_stride + b * blk_stride,
                       sblk + r * nb + b, sx + r * (K / 32) + b * 4);
      }
    }
  }
}

// The act block of (slot, tile cb) after this warp wrote its 32 values (tiles of 32 columns: 4
// per 128-column block): the last of the block's tiles to arrive quantises the block's 128 (or,
// short last block, fewer) values into the workspace and sets the block's count back to zero.
// a: act [M·k, I], aplanes [M·k, I/8], asblk [M·k, nbs], asx [M·k, sxs] (ops_moe_int_decode.cuh);
// counters: one per (slot, block), zero between launches. Whole warp; returns (warp-uniform) whether
// this warp was the last arrival and quantised the block.
template <class Out>
__device__ __forceinline__ bool act_block_arrive(const Out& a, unsigned* counters, int slot, int cb, int I) {
  const int lane = threadIdx.x & 31, NB = I / kActTileCols, blk = cb / 4, arrivals = min(4, NB - 4 * blk);
  unsigned* count = counters + size_t(slot) * blocks_of(I) + blk;
  __threadfence();  // this lane's act value is visible device-wide before the count below
  __syncwarp();
  unsigned old = 0;
  if (lane == 0) old = atomicAdd(count, 1u);
  old = __shfl_sync(0xffffffffu, old, 0);
  if (old != unsigned(arrivals - 1)) return false;  // warp-uniform
  if (lane == 0) atomicExch(count, 0u);       // zero again for the next launch
  __threadfence();                            // the other tiles' act values are visible to the reads below
  const int kk = mi::kXBlock * blk + 4 * lane;
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (kk < I) v = __ldcg(reinterpret_cast<const float4*>(a.act + size_t(slot) * I + kk));
  quantize_block(v, min(mi::kXBlock, I - mi::kXBlock * blk), a.aplanes + size_t(slot) * (I / 8) + 16 * blk,
                 a.asblk + size_t(slot) * a.nbs + blk, a.asx + size_t(slot) * a.sxs + 4 * blk);
  return true;
}

// ---- host: the launch arguments both kernel families fill the same way -----------------------

// Symmetric zeros (zero 8): also an asymmetric weight stored without zeros, as int_form_linear.
inline bool gate_up_symmetric(const DeviceExperts& ex) {
  return ex.gate.sym || ex.gate.qzeros.size() == 0 || ex.up.qzeros.size() == 0;
}
inline bool down_symmetric(const DeviceExperts& ex) { return ex.down.sym || ex.down.qzeros.size() == 0; }

// A gate/up kernel's inputs and its workspace outputs (ops_moe_int_decode.cuh's layout lay at ws):
// the fields every family's UpArgs has.
template <class UpArgs>
void fill_up_io(UpArgs& a, const float* x, const float* router_logits, const MoeShape& s, const IntDecodeLayout& lay,
                char* ws) {
  a.x = x;
  a.x_vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  a.logits = router_logits;
  a.E = s.num_experts;
  a.k = s.top_k;
  a.ids = reinterpret_cast<int32_t*>(ws + lay.ids);
  a.weights = reinterpret_cast<float*>(ws + lay.weights);
  a.act = reinterpret_cast<float*>(ws + lay.act);
  a.aplanes = reinterpret_cast<uint4*>(ws + lay.planes);
  a.asblk = reinterpret_cast<float*>(ws + lay.sblk);
  a.asx = reinterpret_cast<int*>(ws + lay.sx);
  a.nbs = lay.nbs;
  a.sxs = lay.sxs;
}

// A down kernel's inputs from gate/up's workspace outputs (up: fill_up_io's) and the combine's.
template <class DownArgs, class UpArgs>
void fill_down_io(DownArgs& a, const UpArgs& up, float* residual, const float* shared_out,
                  const float* shared_gate_logit) {
  a.aplanes = up.aplanes;
  a.asblk = up.asblk;
  a.asx = up.asx;
  a.nbs = up.nbs;
  a.sxs = up.sxs;
  a.ids = up.ids;
  a.weights = up.weights;
  a.k = up.k;
  a.residual = residual;
  a.shared = shared_out;
  a.gate_logit = shared_gate_logit;
}

}  // namespace moeserve::cuda::moe_int_detail
