// The routed-expert block (ops_moe.h): routing, grouping by expert, the expert launches
// (ops_moe_gptq.cu for GPTQ INT4, ops_moe_rows.cu for FP8 / bf16 and the element-wise
// fallback) and the routing-weighted combine.
//
// Steps of <= kDecodeMaxTokens (8) tokens with GPTQ INT4 experts (no act-order, E <= 256, see
// gptq_decode_supported) skip all of this: ops_moe_decode.cu routes inside its gate/up kernel
// and combines inside its down kernel (two launches instead of four), with the same bits per
// token as the path below (same route_token, same sums, same combine arithmetic).
// Steps of 9 .. 64 tokens (set_moe_grouped_max_tokens) with GPTQ INT4 experts keep the routing,
// grouping and combine below but run the grouped gate/up and down kernels of ops_moe_grouped.cu
// on tiles of 4 slots (each expert slice read once per tile, every word dequantised once for
// all its slots), again with the same bits per token.
//
// moe_route_kernel: one warp per token (route_token, ops_moe_internal.cuh). Lane L holds logits
//   L, L+32, ...; fp32 softmax (max, accurate expf, the denominator summed per lane then by a
//   fixed shuffle tree), then k rounds of a warp arg-max on the probabilities (equal p: lower
//   expert id, as torch.topk), weights renormalised over the k in rank order. Mirrors the CPU
//   route_top_k up to the order of the softmax denominator (1e-7 relative). Reads E floats per
//   token.
// group_by_expert_kernel: one CTA builds the step's expert tiles (moe_detail::TileList) with
//   shared-memory counters and a block scan: count per expert, offsets, slots in order, and
//   tiles of up to 8 slots of one expert. Which slots share a tile never changes a slot's sums.
//   For steps of <= 64 tokens and E <= 256 the same CTA routes first (one launch, not two).
//   Its mixed form (route_and_group_mixed, the tensor-core path's variant 7) writes two tile lists
//   with per-expert tile sizes: 64-slot tiles and a remainder of <= 32 slots on a 32-slot tile.
// combine_kernel: residual[m] += Σ_r w[m,r]·y[m,r] in rank order (deterministic), float4, then
//   (optionally) + sigmoid(gate[m])·shared[m], the shared expert, in the same pass. Explicit
//   fmaf: acc = fmaf(w, y, acc) from 0, residual + acc, fmaf(sigmoid, shared, ·) — the decode
//   down kernel repeats exactly these steps.
// route_and_group / combine_routed (moe_detail) launch these for moe_routed_experts and for the
// tensor-core path (ops_moe_mma.cu), so both route and combine with the same kernels.
#include <atomic>
#include <cfloat>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_moe_internal.cuh"

namespace moeserve::cuda {
namespace {

using namespace moe_detail;

constexpr int kRouteWarps = 4;

__global__ void moe_route_kernel(const float* __restrict__ logits, int M, int E, int k, int32_t* ids,
                                 float* weights) {
  const int m = blockIdx.x * kRouteWarps + (threadIdx.x >> 5);
  if (m >= M) return;
  route_any(logits + size_t(m) * E, E, k, ids + size_t(m) * k, weights + size_t(m) * k);
}

constexpr int kGroupThreads = 1024;
constexpr int kFusedRouteTokens = 64;  // up to this many tokens, routing runs inside the grouping CTA

// Inclusive scans of two ints per thread over the block (kGroupThreads = 32 warps): shuffle
// scans within warps, then warp 0 scans the warp totals. 3 barriers.
__device__ int2 block_inclusive_scan2(int2 v, int2* warp_tot) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int a = __shfl_up_sync(0xffffffffu, v.x, o), b = __shfl_up_sync(0xffffffffu, v.y, o);
    if (lane >= o) v.x += a, v.y += b;
  }
  if (lane == 31) warp_tot[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int2 t = warp_tot[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int a = __shfl_up_sync(0xffffffffu, t.x, o), b = __shfl_up_sync(0xffffffffu, t.y, o);
      if (lane >= o) t.x += a, t.y += b;
    }
    warp_tot[lane] = t;
  }
  __syncthreads();
  if (warp > 0) v.x += warp_tot[warp - 1].x, v.y += warp_tot[warp - 1].y;
  return v;
}

// route_logits != null (decode-sized steps): the CTA's 32 warps first route the M tokens
// (route_token, the same code as moe_route_kernel), saving a launch.
// kMixed (route_and_group_mixed): two tile lists with per-expert tile sizes (ops_moe_internal.cuh:
// 64-slot tiles, the remainder of <= 32 slots on a 32-slot tile); `tile` is unused then, the
// 64-slot list starts at large_offset and num_tiles holds the two counts.
template <bool kMixed>
__global__ void __launch_bounds__(kGroupThreads)
    group_by_expert_kernel(const float* __restrict__ route_logits, int M, int k, int32_t* ids, float* weights,
                           int slots, int E, int tile, int large_offset, int32_t* num_tiles, int32_t* tile_expert,
                           int32_t* tile_start, int32_t* tile_count, int32_t* order) {
  if (route_logits) {
    for (int m = threadIdx.x >> 5; m < M; m += kGroupThreads / 32)
      route_token<8>(route_logits + size_t(m) * E, E, k, ids + size_t(m) * k, weights + size_t(m) * k);
    __threadfence_block();
    __syncthreads();
  }
  __shared__ int count[kMaxExperts];
  __shared__ int cursor[kMaxExperts];
  __shared__ int2 scan[32];
  const int e = threadIdx.x;
  if (e < E) count[e] = 0;
  __syncthreads();
  for (int sl = threadIdx.x; sl < slots; sl += kGroupThreads) atomicAdd(&count[ids[sl]], 1);
  __syncthreads();
  const int c = e < E ? count[e] : 0;
  if constexpr (!kMixed) {
    const int nt = (c + tile - 1) / tile;
    const int2 ends = block_inclusive_scan2(make_int2(c, nt), scan);
    const int slot_end = ends.x, tile_end = ends.y;
    const int slot_begin = slot_end - c, tile_begin = tile_end - nt;
    if (e < E) cursor[e] = slot_begin;
    for (int i = 0; i < nt; ++i) {
      tile_expert[tile_begin + i] = e;
      tile_start[tile_begin + i] = slot_begin + i * tile;
      tile_count[tile_begin + i] = min(tile, c - i * tile);
    }
    if (threadIdx.x == kGroupThreads - 1) *num_tiles = tile_end;
  } else {
    // Expert e: nl 64-slot tiles (the full 64s, plus the remainder when it exceeds 32) at order
    // positions slot_begin + 64·i, then nm (0 or 1) 32-slot tile for a remainder of 1..32.
    __shared__ int2 scan_mid[32];  // the second scan's own warp totals (the first may still be read)
    const int rem = c % kMixLarge;
    const int nl = c / kMixLarge + (rem > kMixMid ? 1 : 0);
    const int nm = rem > 0 && rem <= kMixMid ? 1 : 0;
    const int2 ends = block_inclusive_scan2(make_int2(c, nl), scan);
    const int2 mid_ends = block_inclusive_scan2(make_int2(nm, 0), scan_mid);
    const int slot_begin = ends.x - c, large_begin = large_offset + ends.y - nl, mid_begin = mid_ends.x - nm;
    if (e < E) cursor[e] = slot_begin;
    for (int i = 0; i < nl; ++i) {
      tile_expert[large_begin + i] = e;
      tile_start[large_begin + i] = slot_begin + i * kMixLarge;
      tile_count[large_begin + i] = min(kMixLarge, c - i * kMixLarge);
    }
    if (nm) {  // nl = c / 64 here: the 32-slot tile takes the last rem slots
      tile_expert[mid_begin] = e;
      tile_start[mid_begin] = slot_begin + nl * kMixLarge;
      tile_count[mid_begin] = rem;
    }
    if (threadIdx.x == kGroupThreads - 1) {
      num_tiles[0] = mid_ends.x;
      num_tiles[1] = ends.y;
    }
  }
  __syncthreads();
  for (int sl = threadIdx.x; sl < slots; sl += kGroupThreads) order[atomicAdd(&cursor[ids[sl]], 1)] = sl;
}

__device__ __forceinline__ float shared_scale(const float* gate_logit, int m) {
  return 1.0f / (1.0f + __expf(-gate_logit[m]));
}

__global__ void combine_kernel(const float* __restrict__ y, const float* __restrict__ w, int k, int H,
                               float* residual, const float* __restrict__ shared, const float* __restrict__ gate) {
  const int m = blockIdx.y;
  const int h = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (h >= H) return;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int r = 0; r < k; ++r) {
    const float wr = w[size_t(m) * k + r];
    const float4 v = *reinterpret_cast<const float4*>(y + (size_t(m) * k + r) * H + h);
    acc.x = fmaf(wr, v.x, acc.x);
    acc.y = fmaf(wr, v.y, acc.y);
    acc.z = fmaf(wr, v.z, acc.z);
    acc.w = fmaf(wr, v.w, acc.w);
  }
  float4* out = reinterpret_cast<float4*>(residual + size_t(m) * H + h);
  float4 o = *out;
  o.x += acc.x;
  o.y += acc.y;
  o.z += acc.z;
  o.w += acc.w;
  if (shared) {
    const float s = shared_scale(gate, m);
    const float4 v = *reinterpret_cast<const float4*>(shared + size_t(m) * H + h);
    o.x = fmaf(s, v.x, o.x);
    o.y = fmaf(s, v.y, o.y);
    o.z = fmaf(s, v.z, o.z);
    o.w = fmaf(s, v.w, o.w);
  }
  *out = o;
}

__global__ void combine_scalar_kernel(const float* __restrict__ y, const float* __restrict__ w, int k, int H,
                                      float* residual, const float* __restrict__ shared,
                                      const float* __restrict__ gate) {
  const int m = blockIdx.y;
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= H) return;
  float acc = 0.0f;
  for (int r = 0; r < k; ++r) acc = fmaf(w[size_t(m) * k + r], y[(size_t(m) * k + r) * H + h], acc);
  float o = residual[size_t(m) * H + h] + acc;
  if (shared) o = fmaf(shared_scale(gate, m), shared[size_t(m) * H + h], o);
  residual[size_t(m) * H + h] = o;
}

struct Workspace {
  int32_t* ids;
  float* weights;
  float* act;
  float* y;
  int32_t* num_tiles;
  int32_t* tile_expert;
  int32_t* tile_start;
  int32_t* tile_count;
  int32_t* order;
};

size_t round256(size_t b) { return (b + 255) / 256 * 256; }

Workspace carve(void* base, const MoeShape& s, int max_tokens) {
  auto* p = static_cast<uint8_t*>(base);
  const size_t slots = size_t(max_tokens) * s.top_k;
  const size_t tiles = size_t(max_tiles(int(slots), s.num_experts));
  auto take = [&](size_t bytes) {
    uint8_t* r = p;
    p += round256(bytes);
    return r;
  };
  Workspace w;
  w.ids = reinterpret_cast<int32_t*>(take(slots * 4));
  w.weights = reinterpret_cast<float*>(take(slots * 4));
  w.act = reinterpret_cast<float*>(take(slots * size_t(s.intermediate) * 4));
  w.y = reinterpret_cast<float*>(take(slots * size_t(s.hidden) * 4));
  w.num_tiles = reinterpret_cast<int32_t*>(take(4));
  w.tile_expert = reinterpret_cast<int32_t*>(take(tiles * 4));
  w.tile_start = reinterpret_cast<int32_t*>(take(tiles * 4));
  w.tile_count = reinterpret_cast<int32_t*>(take(tiles * 4));
  w.order = reinterpret_cast<int32_t*>(take(slots * 4));
  return w;
}

}  // namespace

size_t moe_workspace_bytes(const MoeShape& s, int max_tokens) {
  const size_t slots = size_t(max_tokens) * s.top_k;
  const size_t tiles = size_t(max_tiles(int(slots), s.num_experts));
  return round256(slots * 4) * 3 + round256(slots * size_t(s.intermediate) * 4) +
         round256(slots * size_t(s.hidden) * 4) + round256(4) + 3 * round256(tiles * 4);
}

namespace moe_detail {

namespace {

void route_and_group_impl(bool mixed, const float* router_logits, const MoeShape& s, int M, int tile, int32_t* ids,
                          float* weights, int32_t* num_tiles, int32_t* tile_expert, int32_t* tile_start,
                          int32_t* tile_count, int large_offset, int32_t* order, cudaStream_t stream) {
  const bool fused_route = M <= kFusedRouteTokens && s.num_experts <= 256;
  if (!fused_route) {
    moe_route_kernel<<<(M + kRouteWarps - 1) / kRouteWarps, kRouteWarps * 32, 0, stream>>>(
        router_logits, M, s.num_experts, s.top_k, ids, weights);
    MOESERVE_CUDA_CHECK_LAUNCH();
  }
  auto* kernel = mixed ? group_by_expert_kernel<true> : group_by_expert_kernel<false>;
  kernel<<<1, kGroupThreads, 0, stream>>>(fused_route ? router_logits : nullptr, M, s.top_k, ids, weights,
                                          M * s.top_k, s.num_experts, tile, large_offset, num_tiles, tile_expert,
                                          tile_start, tile_count, order);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void route_and_group(const float* router_logits, const MoeShape& s, int M, int tile, int32_t* ids, float* weights,
                     int32_t* num_tiles, int32_t* tile_expert, int32_t* tile_start, int32_t* tile_count,
                     int32_t* order, cudaStream_t stream) {
  route_and_group_impl(false, router_logits, s, M, tile, ids, weights, num_tiles, tile_expert, tile_start, tile_count,
                       0, order, stream);
}

void route_and_group_mixed(const float* router_logits, const MoeShape& s, int M, int32_t* ids, float* weights,
                           int32_t* num_tiles, int32_t* tile_expert, int32_t* tile_start, int32_t* tile_count,
                           int large_offset, int32_t* order, cudaStream_t stream) {
  route_and_group_impl(true, router_logits, s, M, kMixLarge, ids, weights, num_tiles, tile_expert, tile_start,
                       tile_count, large_offset, order, stream);
}

void combine_routed(const float* y, const float* weights, const MoeShape& s, int M, float* residual,
                    const float* shared_out, const float* shared_gate_logit, cudaStream_t stream) {
  if (s.hidden % 4 == 0) {
    const dim3 grid(unsigned((s.hidden / 4 + 63) / 64), unsigned(M));  // many small CTAs: latency-bound at M = 1
    combine_kernel<<<grid, 64, 0, stream>>>(y, weights, s.top_k, s.hidden, residual, shared_out, shared_gate_logit);
  } else {
    const dim3 grid(unsigned((s.hidden + 255) / 256), unsigned(M));
    combine_scalar_kernel<<<grid, 256, 0, stream>>>(y, weights, s.top_k, s.hidden, residual, shared_out,
                                                    shared_gate_logit);
  }
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace moe_detail

namespace {

std::atomic<bool> g_grouped_enabled{true};
std::atomic<int> g_grouped_max_tokens{64};

bool grouped_serves(const MoeShape& s, const DeviceExperts& ex, int M) {
  return M > kDecodeMaxTokens && M <= g_grouped_max_tokens.load() && g_grouped_enabled.load() &&
         gptq_grouped_supported(s, ex);
}

template <typename T>
void launch_moe(const T* x, const float* router_logits, const MoeShape& s, const DeviceExperts& experts, int M,
                void* workspace, size_t workspace_bytes, float* residual, cudaStream_t stream,
                const float* shared_out = nullptr, const float* shared_gate_logit = nullptr,
                cudaEvent_t shared_ready = nullptr) {
  if ((shared_out == nullptr) != (shared_gate_logit == nullptr))
    throw Error("moe: the shared expert output and its gate logit come together");
  if (M == 0) return;
  if (s.top_k > kMaxTopK) throw Error("moe: top_k above 32 is not supported");
  if (s.num_experts > kMaxExperts) throw Error("moe: more than 1024 experts are not supported");
  if (workspace_bytes < moe_workspace_bytes(s, M)) throw Error("moe: workspace too small");
  Workspace w = carve(workspace, s, M);
  // Generated-token steps of GPTQ experts: two launches (ops_moe_decode.cu), the same bits as
  // the tiled kernels below.
  if (M <= kDecodeMaxTokens && gptq_decode_supported(s, experts, M)) {
    gptq_decode(x, router_logits, s, experts, M, w.ids, w.weights, w.act, residual, shared_out, shared_gate_logit,
                stream, shared_ready);
    return;
  }
  const int slots = M * s.top_k;
  // Batch-decode steps of GPTQ experts: the grouped kernels (ops_moe_grouped.cu) on tiles of
  // kGroupedTile slots, the same bits as the tiled kernels below.
  if (grouped_serves(s, experts, M) && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    route_and_group(router_logits, s, M, kGroupedTile, w.ids, w.weights, w.num_tiles, w.tile_expert, w.tile_start,
                    w.tile_count, w.order, stream);
    const TileList tiles{w.num_tiles, w.tile_expert, w.tile_start, w.tile_count, w.order};
    gptq_grouped(x, s, experts, tiles, max_tiles(slots, s.num_experts, kGroupedTile), w.act, w.y, stream);
    if (shared_ready) MOESERVE_CUDA_CHECK(cudaStreamWaitEvent(stream, shared_ready, 0));
    combine_routed(w.y, w.weights, s, M, residual, shared_out, shared_gate_logit, stream);
    return;
  }
  // Decode-sized steps: tiles of 2 (an expert rarely has more tokens; the 2-token kernels
  // use fewer registers, so more warps hide the weight loads). A token's sums are the same
  // in either tile size.
  const int tile = M <= 8 ? kSmallTile : kTokenTile;
  route_and_group(router_logits, s, M, tile, w.ids, w.weights, w.num_tiles, w.tile_expert, w.tile_start, w.tile_count,
                  w.order, stream);
  const TileList tiles{w.num_tiles, w.tile_expert, w.tile_start, w.tile_count, w.order};
  const int grid_tiles = max_tiles(slots, s.num_experts, tile);
  if (gptq_fast_path(experts)) {
    gptq_gate_up(x, s, experts, tiles, grid_tiles, tile, w.act, stream);
    gptq_down(w.act, s, experts, tiles, grid_tiles, tile, w.y, stream);
  } else {
    rows_gate_up(x, s, experts, tiles, grid_tiles, w.act, stream);
    rows_down(w.act, s, experts, tiles, grid_tiles, w.y, stream);
  }
  if (shared_ready) MOESERVE_CUDA_CHECK(cudaStreamWaitEvent(stream, shared_ready, 0));
  combine_routed(w.y, w.weights, s, M, residual, shared_out, shared_gate_logit, stream);
}

}  // namespace

void set_moe_grouped_enabled(bool on) { g_grouped_enabled.store(on); }
void set_moe_grouped_max_tokens(int max_tokens) { g_grouped_max_tokens.store(max_tokens); }
bool moe_grouped_serves(const MoeShape& s, const DeviceExperts& experts, int M) {
  return grouped_serves(s, experts, M);
}

void moe_routed_experts(const bf16* x, const float* router_logits, const MoeShape& s, const DeviceExperts& experts,
                        int M, void* workspace, size_t workspace_bytes, float* residual, cudaStream_t stream) {
  launch_moe(x, router_logits, s, experts, M, workspace, workspace_bytes, residual, stream);
}

void moe_routed_experts(const float* x, const float* router_logits, const MoeShape& s, const DeviceExperts& experts,
                        int M, void* workspace, size_t workspace_bytes, float* residual, cudaStream_t stream,
                        const float* shared_out, const float* shared_gate_logit, cudaEvent_t shared_ready) {
  launch_moe(x, router_logits, s, experts, M, workspace, workspace_bytes, residual, stream, shared_out,
             shared_gate_logit, shared_ready);
}

}  // namespace moeserve::cuda
