// Routed-expert kernels (ops_moe.h), a correct baseline.
//
// moe_route_kernel: one CTA per token: fp32 softmax over E router logits, top-k by repeated
//   argmax (ties: lower expert id first, as torch.topk), renormalised weights.
// expert_gate_up_kernel: one warp per (token-slot, intermediate row i): lanes stride over H,
//   computing gate_i·x and up_i·x together (one pass over x), act = silu(g)·u.
// expert_down_kernel: one warp per (token-slot, hidden row h): down_h·act.
// combine_kernel: residual[m] += Σ_r w[m,r]·y[m,r] in rank order (deterministic).
// Every format is dequantised element by element in registers (expert_weight_at).
// Reads each selected expert's weights once per (token, slot); the grouped kernels that read
// an expert once per step for all its tokens replace these (issue 7).
#include <cfloat>
#include <cuda_fp8.h>

#include "backend/cuda/act_types.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_moe.h"

namespace moeserve::cuda {
namespace {

constexpr int kMaxTopK = 32;

struct ExpertView {  // one stacked projection, device pointers only (kernel argument)
  int format;        // quant::WeightFormat
  int N, K, group;
  bool sym;
  const bf16* dense;
  const int32_t* qweight;
  const __half* scales;
  const int32_t* qzeros;
  const int32_t* g_idx;  // GPTQ act-order: [E][K] group of each k (null: k / group)
  const uint8_t* fp8;
  const float* scale;
};

ExpertView view_of(const DeviceLinear& d) {
  return {int(d.format), int(d.N), int(d.K), int(d.group_size), d.sym, d.dense.data(), d.qweight.data(),
          d.scales.data(), d.qzeros.data(), d.g_idx.size() ? d.g_idx.data() : nullptr, d.fp8.data(), d.scale.data()};
}

// W_e[n, k] as fp32.
__device__ __forceinline__ float expert_weight_at(const ExpertView& w, int e, int n, int k) {
  switch (w.format) {
    case int(quant::WeightFormat::GptqInt4): {
      const int groups = w.K / w.group;
      const uint32_t word = uint32_t(w.qweight[(size_t(e) * (w.K / 8) + k / 8) * w.N + n]);
      const int g = w.g_idx ? w.g_idx[size_t(e) * w.K + k] : k / w.group;
      const float s = __half2float(w.scales[(size_t(e) * groups + g) * w.N + n]);
      const int zero =
          w.sym ? 8 : int((uint32_t(w.qzeros[(size_t(e) * groups + g) * (w.N / 8) + n / 8]) >> (4 * (n % 8))) & 0xF) + 1;
      return float(int((word >> (4 * (k % 8))) & 0xF) - zero) * s;
    }
    case int(quant::WeightFormat::Fp8Block): {
      __nv_fp8_e4m3 f;
      f.__x = w.fp8[(size_t(e) * w.N + n) * w.K + k];
      const int nb = (w.N + 127) / 128, kb = (w.K + 127) / 128;
      return float(f) * w.scale[(size_t(e) * nb + n / 128) * kb + k / 128];
    }
    default:
      return __bfloat162float(w.dense[(size_t(e) * w.N + n) * w.K + k]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Mirrors the CPU reference route_top_k (src/backend/cpu/moe.cpp) and torch: p = softmax(logits)
// in fp32 (accurate expf, sequential sum), the k largest p (lower expert index on equal p,
// as torch.topk), renormalised over the k. One thread per token (E <= 512).
__global__ void moe_route_kernel(const float* __restrict__ logits, int E, int k, int32_t* ids, float* weights) {
  const int m = blockIdx.x;
  if (threadIdx.x != 0) return;
  const float* row = logits + size_t(m) * E;
  float mx = -FLT_MAX;
  for (int e = 0; e < E; ++e) mx = fmaxf(mx, row[e]);
  float denom = 0.0f;
  for (int e = 0; e < E; ++e) denom += expf(row[e] - mx);
  int chosen[kMaxTopK];
  float p[kMaxTopK], psum = 0.0f;
  for (int r = 0; r < k; ++r) {
    int best = -1;
    float bp = -1.0f;
    for (int e = 0; e < E; ++e) {
      bool used = false;
      for (int q = 0; q < r; ++q) used = used || chosen[q] == e;
      const float pe = expf(row[e] - mx) / denom;
      if (!used && pe > bp) {  // strict: the lower index keeps equal probabilities
        best = e;
        bp = pe;
      }
    }
    chosen[r] = best;
    p[r] = bp;
  }
  for (int r = 0; r < k; ++r) psum += p[r];
  for (int r = 0; r < k; ++r) {
    ids[size_t(m) * k + r] = chosen[r];
    weights[size_t(m) * k + r] = p[r] / psum;
  }
}

template <typename T>
__global__ void expert_gate_up_kernel(const T* __restrict__ x, int H, int I, const int32_t* __restrict__ ids,
                                      int k, ExpertView gate, ExpertView up, float* act) {
  const int slot = blockIdx.x;  // token m = slot / k
  const int i = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (i >= I) return;
  const int e = ids[slot];
  const T* xr = x + size_t(slot / k) * H;
  float g = 0.0f, u = 0.0f;
  for (int h = lane; h < H; h += 32) {
    const float xv = to_f32(xr[h]);
    g += expert_weight_at(gate, e, i, h) * xv;
    u += expert_weight_at(up, e, i, h) * xv;
  }
  g = warp_sum(g);
  u = warp_sum(u);
  if (lane == 0) act[size_t(slot) * I + i] = g / (1.0f + __expf(-g)) * u;
}

__global__ void expert_down_kernel(const float* __restrict__ act, int H, int I, const int32_t* __restrict__ ids,
                                   ExpertView down, float* y) {
  const int slot = blockIdx.x;
  const int h = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (h >= H) return;
  const int e = ids[slot];
  const float* a = act + size_t(slot) * I;
  float acc = 0.0f;
  for (int i = lane; i < I; i += 32) acc += expert_weight_at(down, e, h, i) * a[i];
  acc = warp_sum(acc);
  if (lane == 0) y[size_t(slot) * H + h] = acc;
}

__global__ void combine_kernel(const float* __restrict__ y, const float* __restrict__ w, int k, int H,
                               float* residual) {
  const int m = blockIdx.x;
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = 0.0f;
    for (int r = 0; r < k; ++r) acc += w[size_t(m) * k + r] * y[(size_t(m) * k + r) * H + h];
    residual[size_t(m) * H + h] += acc;
  }
}

struct Workspace {
  int32_t* ids;
  float* weights;
  float* act;
  float* y;
};

Workspace carve(void* base, const MoeShape& s, int max_tokens) {
  auto* p = static_cast<uint8_t*>(base);
  const size_t slots = size_t(max_tokens) * s.top_k;
  Workspace w;
  w.ids = reinterpret_cast<int32_t*>(p);
  p += (slots * sizeof(int32_t) + 255) / 256 * 256;
  w.weights = reinterpret_cast<float*>(p);
  p += (slots * sizeof(float) + 255) / 256 * 256;
  w.act = reinterpret_cast<float*>(p);
  p += (slots * s.intermediate * sizeof(float) + 255) / 256 * 256;
  w.y = reinterpret_cast<float*>(p);
  return w;
}

}  // namespace

size_t moe_workspace_bytes(const MoeShape& s, int max_tokens) {
  const size_t slots = size_t(max_tokens) * s.top_k;
  auto r = [](size_t b) { return (b + 255) / 256 * 256; };
  return r(slots * 4) + r(slots * 4) + r(slots * size_t(s.intermediate) * 4) + r(slots * size_t(s.hidden) * 4);
}

namespace {

template <typename T>
void launch_moe(const T* x, const float* router_logits, const MoeShape& s, const DeviceExperts& experts, int M,
                void* workspace, size_t workspace_bytes, float* residual, cudaStream_t stream) {
  if (M == 0) return;
  if (s.top_k > kMaxTopK) throw Error("moe: top_k above 32 is not supported");
  if (workspace_bytes < moe_workspace_bytes(s, M)) throw Error("moe: workspace too small");
  Workspace w = carve(workspace, s, M);
  moe_route_kernel<<<M, 32, 0, stream>>>(router_logits, s.num_experts, s.top_k, w.ids, w.weights);
  MOESERVE_CUDA_CHECK_LAUNCH();
  const int slots = M * s.top_k;
  dim3 g1(slots, (s.intermediate + 7) / 8);
  expert_gate_up_kernel<T><<<g1, 256, 0, stream>>>(x, s.hidden, s.intermediate, w.ids, s.top_k, view_of(experts.gate),
                                                view_of(experts.up), w.act);
  MOESERVE_CUDA_CHECK_LAUNCH();
  dim3 g2(slots, (s.hidden + 7) / 8);
  expert_down_kernel<<<g2, 256, 0, stream>>>(w.act, s.hidden, s.intermediate, w.ids, view_of(experts.down), w.y);
  MOESERVE_CUDA_CHECK_LAUNCH();
  combine_kernel<<<M, 256, 0, stream>>>(w.y, w.weights, s.top_k, s.hidden, residual);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void moe_routed_experts(const bf16* x, const float* router_logits, const MoeShape& s, const DeviceExperts& experts,
                        int M, void* workspace, size_t workspace_bytes, float* residual, cudaStream_t stream) {
  launch_moe(x, router_logits, s, experts, M, workspace, workspace_bytes, residual, stream);
}

void moe_routed_experts(const float* x, const float* router_logits, const MoeShape& s, const DeviceExperts& experts,
                        int M, void* workspace, size_t workspace_bytes, float* residual, cudaStream_t stream) {
  launch_moe(x, router_logits, s, experts, M, workspace, workspace_bytes, residual, stream);
}

}  // namespace moeserve::cuda
