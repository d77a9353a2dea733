// Gated attention kernels (ops_attention.h).
//
// attention_prepare: one CTA per token, one warp per head (q heads then kv heads); each lane
//   holds head_dim/32 values (head_dim <= 256, multiple of 32 for the warp path... any hd
//   handled by a strided loop). Roofline: reads qg + k + v once, writes q, gate and the cache
//   slots: ~ (2·nq + 4·nkv)·hd·2 B per token.
// paged_attention: one CTA of 8 warps per (token, q head); the visible positions [0, pos] are
//   split into 8 contiguous ranges, one online softmax per warp, merged in warp order (split-KV
//   inside the CTA; the split depends only on pos, so results are batch invariant); each lane
//   owns head_dim/32 dims. Reads each visible K/V row once per q head (GQA sharing through
//   L1/L2). The head-grouped decode kernel and the tensor-core prefill kernel come in issue 7.
#include <cfloat>

#include "backend/cuda/act_types.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_attention.h"

namespace moeserve::cuda {
namespace {

constexpr int kMaxDimsPerLane = 8;  // head_dim <= 256

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ size_t cache_offset(const KvCacheView& c, int block, int head, int slot) {
  return ((size_t(block) * c.num_kv_heads + head) * c.block_size + slot) * size_t(c.head_dim);
}

// RMSNorm (1+w) over hd values held by a warp (lane i holds dims i, i+32, ...), then NeoX
// RoPE on the first rotary_dim dims. vals: this lane's values.
__device__ void norm_rope(float* vals, int hd, const float* w, float eps, const float* inv_freq, int rot, int pos) {
  const int lane = threadIdx.x & 31;
  float ss = 0.0f;
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) ss += vals[i] * vals[i];
  }
  const float inv = rsqrtf(warp_sum(ss) / float(hd) + eps);
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) vals[i] = vals[i] * inv * (1.0f + w[d]);
  }
  // Rotation pairs (d, d + rot/2) for d < rot/2: exchange through shared memory per warp.
  __shared__ float buf[32][256];
  float* row = buf[threadIdx.x >> 5];
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) row[d] = vals[i];
  }
  __syncwarp();
  const int half = rot / 2;
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < rot) {
      const int j = d < half ? d : d - half;
      float sn, cs;
      sincosf(float(pos) * inv_freq[j], &sn, &cs);
      const float x = row[d];
      const float partner = d < half ? -row[d + half] : row[d - half];
      vals[i] = x * cs + partner * sn;
    }
  }
  __syncwarp();
}

template <typename T>
__global__ void attention_prepare_kernel(const T* __restrict__ qg, const T* __restrict__ k,
                                         const T* __restrict__ v, const float* q_norm_w, const float* k_norm_w,
                                         const float* inv_freq, AttentionShape s, StepMeta meta, KvCacheView cache,
                                         T* q_out, T* gate_out) {
  const int m = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nwarps = blockDim.x >> 5;
  const int hd = s.head_dim;
  const int pos = meta.token_pos[m];
  const int seq = meta.token_seq[m];
  const int block = meta.block_tables[size_t(seq) * meta.max_blocks_per_seq + pos / cache.block_size];
  const int slot = pos % cache.block_size;
  for (int h = warp; h < s.num_q_heads + s.num_kv_heads; h += nwarps) {
    float vals[kMaxDimsPerLane];
    if (h < s.num_q_heads) {
      const T* src = qg + size_t(m) * s.num_q_heads * 2 * hd + size_t(h) * 2 * hd;
      for (int i = 0; i < kMaxDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        vals[i] = d < hd ? to_f32(src[d]) : 0.0f;
        if (d < hd) gate_out[size_t(m) * s.num_q_heads * hd + size_t(h) * hd + d] = src[hd + d];
      }
      norm_rope(vals, hd, q_norm_w, s.rms_eps, inv_freq, s.rotary_dim, pos);
      for (int i = 0; i < kMaxDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) q_out[size_t(m) * s.num_q_heads * hd + size_t(h) * hd + d] = from_f32<T>(vals[i]);
      }
    } else {
      const int kh = h - s.num_q_heads;
      const T* src = k + size_t(m) * s.num_kv_heads * hd + size_t(kh) * hd;
      for (int i = 0; i < kMaxDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        vals[i] = d < hd ? to_f32(src[d]) : 0.0f;
      }
      norm_rope(vals, hd, k_norm_w, s.rms_eps, inv_freq, s.rotary_dim, pos);
      const size_t off = cache_offset(cache, block, kh, slot);
      const T* vsrc = v + size_t(m) * s.num_kv_heads * hd + size_t(kh) * hd;
      for (int i = 0; i < kMaxDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) {
          cache.k[off + d] = __float2bfloat16(vals[i]);
          cache.v[off + d] = __float2bfloat16(to_f32(vsrc[d]));
        }
      }
    }
  }
}

// One CTA (kWarps warps) per (token, q head). The token's visible positions [0, pos] are split
// into kWarps contiguous ranges, one per warp (split-KV inside the CTA, so long contexts use
// kWarps times the warps); each warp runs an online softmax over its range, then the ranges
// are merged in warp order through shared memory. The split depends only on pos, never on
// the batch: a token's output is the same whatever else is in the step.
constexpr int kWarps = 8;

template <typename T>
__global__ void paged_attention_kernel(const T* __restrict__ q, const T* __restrict__ gate, AttentionShape s,
                                       StepMeta meta, KvCacheView cache, float scale, T* out) {
  const int m = blockIdx.x, h = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int hd = s.head_dim;
  const int kvh = h / (s.num_q_heads / s.num_kv_heads);
  const int pos = meta.token_pos[m];
  const int seq = meta.token_seq[m];
  const int32_t* table = meta.block_tables + size_t(seq) * meta.max_blocks_per_seq;
  float qv[kMaxDimsPerLane], acc[kMaxDimsPerLane];
  const T* qrow = q + size_t(m) * s.num_q_heads * hd + size_t(h) * hd;
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    qv[i] = d < hd ? to_f32(qrow[d]) * scale : 0.0f;
    acc[i] = 0.0f;
  }
  const int len = pos + 1;
  const int per = (len + kWarps - 1) / kWarps;
  const int p0 = min(len, warp * per), p1 = min(len, p0 + per);
  float mx = -FLT_MAX, sum = 0.0f;
  for (int p = p0; p < p1; ++p) {
    const size_t off = cache_offset(cache, table[p / cache.block_size], kvh, p % cache.block_size);
    float dot = 0.0f;
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) dot += qv[i] * __bfloat162float(cache.k[off + d]);
    }
    dot = warp_sum(dot);
    const float nmx = fmaxf(mx, dot);
    const float corr = __expf(mx - nmx);
    const float e = __expf(dot - nmx);
    sum = sum * corr + e;
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) acc[i] = acc[i] * corr + e * __bfloat162float(cache.v[off + d]);
    }
    mx = nmx;
  }
  // Merge the warps' (max, sum, acc) in warp order.
  __shared__ float s_max[kWarps], s_sum[kWarps];
  __shared__ float s_acc[kWarps][32 * kMaxDimsPerLane];
  if (lane == 0) {
    s_max[warp] = mx;
    s_sum[warp] = sum;
  }
  for (int i = 0; i < kMaxDimsPerLane; ++i) s_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  if (warp != 0) return;
  float gmx = -FLT_MAX;
  for (int w = 0; w < kWarps; ++w)
    if (s_sum[w] > 0.0f) gmx = fmaxf(gmx, s_max[w]);
  float total = 0.0f;
  float res[kMaxDimsPerLane];
  for (int i = 0; i < kMaxDimsPerLane; ++i) res[i] = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    if (s_sum[w] <= 0.0f) continue;  // an empty range (short contexts)
    const float c = __expf(s_max[w] - gmx);
    total += s_sum[w] * c;
    for (int i = 0; i < kMaxDimsPerLane; ++i) res[i] += s_acc[w][lane + 32 * i] * c;
  }
  const size_t o = size_t(m) * s.num_q_heads * hd + size_t(h) * hd;
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) {
      const float g = to_f32(gate[o + d]);
      out[o + d] = from_f32<T>(res[i] / total / (1.0f + __expf(-g)));
    }
  }
}

}  // namespace

namespace {

template <typename T>
void launch_prepare(const T* qg, const T* k, const T* v, const float* q_norm_w, const float* k_norm_w,
                    const float* inv_freq, const AttentionShape& shape, const StepMeta& meta, KvCacheView cache,
                    T* q_out, T* gate_out, cudaStream_t stream) {
  if (meta.num_tokens == 0) return;
  if (shape.head_dim > 32 * kMaxDimsPerLane) throw Error("attention: head_dim above 256 is not supported");
  attention_prepare_kernel<T><<<meta.num_tokens, 256, 0, stream>>>(qg, k, v, q_norm_w, k_norm_w, inv_freq, shape,
                                                                    meta, cache, q_out, gate_out);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_attention(const T* q, const T* gate, const AttentionShape& shape, const StepMeta& meta,
                      KvCacheView cache, float scale, T* out, cudaStream_t stream) {
  if (meta.num_tokens == 0) return;
  if (shape.head_dim > 32 * kMaxDimsPerLane) throw Error("attention: head_dim above 256 is not supported");
  const dim3 grid(unsigned(meta.num_tokens), unsigned(shape.num_q_heads));
  paged_attention_kernel<T><<<grid, kWarps * 32, 0, stream>>>(q, gate, shape, meta, cache, scale, out);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_prepare(const bf16* qg, const bf16* k, const bf16* v, const float* q_norm_w, const float* k_norm_w,
                       const float* inv_freq, const AttentionShape& shape, const StepMeta& meta, KvCacheView cache,
                       bf16* q_out, bf16* gate_out, cudaStream_t stream) {
  launch_prepare(qg, k, v, q_norm_w, k_norm_w, inv_freq, shape, meta, cache, q_out, gate_out, stream);
}

void attention_prepare(const float* qg, const float* k, const float* v, const float* q_norm_w, const float* k_norm_w,
                       const float* inv_freq, const AttentionShape& shape, const StepMeta& meta, KvCacheView cache,
                       float* q_out, float* gate_out, cudaStream_t stream) {
  launch_prepare(qg, k, v, q_norm_w, k_norm_w, inv_freq, shape, meta, cache, q_out, gate_out, stream);
}

size_t paged_attention_workspace_bytes(const AttentionShape&, int, int) { return 0; }

void paged_attention(const bf16* q, const bf16* gate, const AttentionShape& shape, const StepMeta& meta,
                     KvCacheView cache, float scale, void*, size_t, bf16* out, cudaStream_t stream) {
  launch_attention(q, gate, shape, meta, cache, scale, out, stream);
}

void paged_attention(const float* q, const float* gate, const AttentionShape& shape, const StepMeta& meta,
                     KvCacheView cache, float scale, void*, size_t, float* out, cudaStream_t stream) {
  launch_attention(q, gate, shape, meta, cache, scale, out, stream);
}

}  // namespace moeserve::cuda
