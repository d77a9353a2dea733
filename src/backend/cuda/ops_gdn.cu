// Gated DeltaNet kernels (ops_gdn.h), a correct baseline for decode and prefill.
//
// gdn_conv_kernel: one thread per (sequence, channel); walks the sequence's new tokens in
//   order with the K-1 previous pre-conv inputs (the conv state), writes silu(conv) as f32
//   into the workspace [M, conv_dim] and stores the last K-1 inputs back. Reads qkv once.
// gdn_recurrent_kernel: one CTA per (sequence, v-head), thread j owns column j of the fp32
//   state S [dk, dv] (kept in the state buffer; L1/L2 resident within a step). Per token:
//   l2norm(q)/sqrt(dk), l2norm(k) (block reductions), beta, g, then
//     S <- e^g S;  kv = Sᵀk;  Δ = β(v - kv);  S <- S + k⊗Δ;  o = Sᵀq
//   and the gated RMSNorm of o over dv with silu(z). Roofline for decode: the state is read
//   and written once per token: 2·nv·dk·dv·4 B per sequence and layer.
#include "backend/cuda/act_types.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_gdn.h"

namespace moeserve::cuda {
namespace {

__device__ float block_reduce_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  const int nwarps = (blockDim.x + 31) >> 5;
  for (int w = 0; w < nwarps; ++w) total += scratch[w];
  return total;
}

template <typename T>
__global__ void gdn_conv_kernel(const T* __restrict__ qkv, GdnShape s, const float* __restrict__ conv_w,
                                float* conv_state, StepMeta meta, float* conv_out) {
  const int seq = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int C = s.conv_dim(), K = s.conv_kernel;
  if (c >= C || seq >= meta.num_seqs) return;
  const int t0 = meta.seq_token_start[seq], t1 = meta.seq_token_start[seq + 1];
  float* st = conv_state + (size_t(meta.seq_state_slot[seq]) * C + c) * (K - 1);
  float window[8];  // K <= 8
  for (int j = 0; j < K - 1; ++j) window[j] = st[j];
  const float* w = conv_w + size_t(c) * K;
  for (int m = t0; m < t1; ++m) {
    window[K - 1] = to_f32(qkv[size_t(m) * C + c]);
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) acc += w[j] * window[j];
    conv_out[size_t(m) * C + c] = acc / (1.0f + __expf(-acc));
    for (int j = 0; j < K - 1; ++j) window[j] = window[j + 1];
  }
  for (int j = 0; j < K - 1; ++j) st[j] = window[j];
}

template <typename T>
__global__ void gdn_recurrent_kernel(const float* __restrict__ conv_out, const T* __restrict__ z,
                                     const float* __restrict__ b, const float* __restrict__ a, GdnShape s,
                                     GdnLayerParams p, StepMeta meta, T* out) {
  extern __shared__ float smem[];
  const int seq = blockIdx.x, h = blockIdx.y;
  if (seq >= meta.num_seqs) return;
  const int dk = s.k_head_dim, dv = s.v_head_dim, nv = s.num_v_heads;
  const int kh = h / (nv / s.num_k_heads);
  float* qs = smem;          // [dk]
  float* ks = smem + dk;     // [dk]
  float* red = smem + 2 * dk;  // [32]
  const int C = s.conv_dim();
  const int j = threadIdx.x;
  float* S = p.recurrent_state + (size_t(meta.seq_state_slot[seq]) * nv + h) * size_t(dk) * dv;
  const float A = -__expf(p.a_log[h]);
  const float q_scale = rsqrtf(float(dk));
  const int t0 = meta.seq_token_start[seq], t1 = meta.seq_token_start[seq + 1];
  for (int m = t0; m < t1; ++m) {
    const float* row = conv_out + size_t(m) * C;
    float qq = 0.0f, kk = 0.0f;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
      const float qi = row[kh * dk + i], ki = row[s.key_dim() + kh * dk + i];
      qs[i] = qi;
      ks[i] = ki;
      qq += qi * qi;
      kk += ki * ki;
    }
    const float qn = rsqrtf(block_reduce_sum(qq, red) + 1e-6f) * q_scale;
    const float kn = rsqrtf(block_reduce_sum(kk, red) + 1e-6f);
    __syncthreads();
    const float beta = 1.0f / (1.0f + __expf(-b[size_t(m) * nv + h]));
    const float x = a[size_t(m) * nv + h] + p.dt_bias[h];
    const float softplus = x > 20.0f ? x : log1pf(__expf(x));
    const float decay = __expf(A * softplus);
    float o = 0.0f;
    if (j < dv) {
      const float vj = row[2 * s.key_dim() + h * dv + j];
      float kv = 0.0f;
      for (int i = 0; i < dk; ++i) {
        const float v = S[size_t(i) * dv + j] * decay;
        S[size_t(i) * dv + j] = v;
        kv += v * ks[i] * kn;
      }
      const float delta = beta * (vj - kv);
      for (int i = 0; i < dk; ++i) {
        const float v = S[size_t(i) * dv + j] + ks[i] * kn * delta;
        S[size_t(i) * dv + j] = v;
        o += v * qs[i] * qn;
      }
    }
    // Gated RMSNorm over this head's dv outputs (plain w, silu(z)), spec 2.1.2.
    const float ss = block_reduce_sum(j < dv ? o * o : 0.0f, red);
    if (j < dv) {
      const float inv = rsqrtf(ss / float(dv) + s.norm_eps);
      const float zj = to_f32(z[size_t(m) * s.value_dim() + h * dv + j]);
      out[size_t(m) * s.value_dim() + h * dv + j] =
          from_f32<T>(p.norm_weight[j] * (o * inv) * (zj / (1.0f + __expf(-zj))));
    }
    __syncthreads();  // qs/ks reused by the next token
  }
}

}  // namespace

size_t gdn_workspace_bytes(const GdnShape& shape, int max_tokens) {
  return size_t(max_tokens) * size_t(shape.conv_dim()) * sizeof(float);
}

namespace {

template <typename T>
void launch_gdn(const T* qkv, const T* z, const float* b, const float* a, const GdnShape& s,
                     const GdnLayerParams& layer, const StepMeta& meta, void* workspace, size_t workspace_bytes,
                     T* out, cudaStream_t stream) {
  if (meta.num_tokens == 0) return;
  if (s.conv_kernel > 8) throw Error("gated_delta_net: conv kernel above 8 is not supported");
  if (workspace_bytes < gdn_workspace_bytes(s, meta.num_tokens)) throw Error("gated_delta_net: workspace too small");
  float* conv_out = static_cast<float*>(workspace);
  dim3 cgrid((s.conv_dim() + 255) / 256, meta.num_seqs);
  gdn_conv_kernel<T><<<cgrid, 256, 0, stream>>>(qkv, s, layer.conv_weight, layer.conv_state, meta, conv_out);
  MOESERVE_CUDA_CHECK_LAUNCH();
  const int threads = std::min(1024, std::max(32, (s.v_head_dim + 31) / 32 * 32));
  const size_t smem = size_t(2 * s.k_head_dim + 32) * sizeof(float);
  dim3 rgrid(meta.num_seqs, s.num_v_heads);
  gdn_recurrent_kernel<T><<<rgrid, threads, smem, stream>>>(conv_out, z, b, a, s, layer, meta, out);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gated_delta_net(const bf16* qkv, const bf16* z, const float* b, const float* a, const GdnShape& s,
                     const GdnLayerParams& layer, const StepMeta& meta, void* workspace, size_t workspace_bytes,
                     bf16* out, cudaStream_t stream) {
  launch_gdn(qkv, z, b, a, s, layer, meta, workspace, workspace_bytes, out, stream);
}

void gated_delta_net(const float* qkv, const float* z, const float* b, const float* a, const GdnShape& s,
                     const GdnLayerParams& layer, const StepMeta& meta, void* workspace, size_t workspace_bytes,
                     float* out, cudaStream_t stream) {
  launch_gdn(qkv, z, b, a, s, layer, meta, workspace, workspace_bytes, out, stream);
}

}  // namespace moeserve::cuda
