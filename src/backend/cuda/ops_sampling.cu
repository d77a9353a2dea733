// Kernels of ops_sampling.h: one block per logits row, after row_best_kernel's kSampleBestParts
// blocks per row.
//
// row_best_kernel: the best (value desc, id asc) masked logit of each slice of the row (slices
// of ceil(V / parts) rounded up to a multiple of 4), into the row's SampleRowScratch.
// row_slice_kernel (rows that sample): per slice, the candidates' count and weight (exact integer
// sums) and the slice's first kSampleSliceKeep candidates in candidate order: each thread keeps
// its best kThreadKeep, the block sorts them and keeps the first 32. A truncation (a thread with
// more than kThreadKeep candidates, a block with more than 32 kept) leaves a boundary: every
// candidate of the slice that ranks at or before it is in the list. sample_kernel merges the
// lists (<= 2048 keys, sorted in shared memory); the merged prefix up to the earliest boundary is
// exactly the row's first candidates. When top_k's cut (with its ties), top_p's crossing and the
// draw fall inside that prefix (or, with no cut, the draw goes through the slices' weights in id
// order), the row is decided there, with the same integer weights and the same decisions as the
// passes below; otherwise the passes below run (flat rows, huge tie groups).
// sample_kernel, for a row of V fp32 logits (d = scaled - max(scaled), see causal_lm.h):
//   P1  argmax of the masked logits from the slices' bests (the order is total, so the best of
//       the bests is the row's best, whatever the slicing): the greedy token, and max(scaled).
//   P2  a histogram of the candidates (d >= min_log_ratio) over 2048 buckets of d, holding
//       counts and fixed-point weights round(expf(d) * 2^S) (S: the vocabulary's sum of
//       weights stays below 2^63). Integer sums are exact, so the result does not depend on
//       the order of the atomics: the kernel is deterministic.
//   top_k / top_p are "crossing" searches in the candidates' order (scaled desc, id asc):
//       the element where the running count (top_k) or weight (top_p) passes a target. The
//       histogram names the bucket; when the buckets up to it (or it alone) hold at most
//       2048 elements they are compacted into shared memory, sorted and resolved there
//       (and kept: the top_p search usually finds its crossing in what top_k compacted).
//       A bucket that is still larger is refined on the exact 32-bit key of the scaled
//       logit (11 + 11 + 10 bits); what is left after that are ties, resolved by id.
//   draw: the kept tokens in id order (like runtime::Sampler), the first whose running
//       weight passes uniform * total. When they all sit in the cache (top_k or top_p cut
//       inside a prefix compaction: the usual case) they are re-sorted by id there; else a
//       coalesced pass per warp-sized slice, then a per-thread pass inside the slice that
//       holds the crossing.
// logprobs_slice_kernel (rows that ask, kSampleBestParts blocks per row): per slice, the online
//   log-sum-exp of the raw logits and the 20 best (value desc, id asc) per thread in registers,
//   merged in shared memory; logprobs_merge_kernel (a thread per row) merges the slices' pairs in
//   slice order and their lists, and writes the token's logprob and the alternatives.
//
// Roofline: greedy reads the row once (4V bytes: 1 MB at V = 248320, ~0.2 us of H200 HBM
// bandwidth if spread over the GPU; one block per row reaches a few hundred GB/s per SM, which
// is why P1 is spread over row_best_kernel's blocks: at one row the single block took 26 us,
// docs/PERF.md session 20).
// Sampling reads it in P1, P2 and usually one compaction, the draw staying in shared memory:
// ~3 passes, all but the first from L2 (4 without a top_k/top_p cut, more for rows with
// thousands of tied logits). Logprobs add one pass. Compute is a few operations per element.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/ops_sampling.h"
#include "backend/cuda/ops_sampling_block.cuh"

namespace moeserve::cuda {
namespace sampling {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBuckets = 2048;    // level 0 (d) and the 11-bit key digits
constexpr int kCacheCap = 2048;   // elements sorted in shared memory
using Block = BlockOps<kThreads>;
static_assert(kBuckets % kThreads == 0 && kCacheCap % kThreads == 0);

// Dynamic shared memory (80 KiB).
struct Tables {
  uint64_t hist0_w[kBuckets];
  uint64_t hist1_w[kBuckets];
  uint64_t cache_keys[kCacheCap];  // (~key(scaled) << 32) | id: ascending = candidate order
  uint64_t cache_cum[kCacheCap];   // inclusive running weight within the cache
  uint32_t hist0_n[kBuckets];
  uint32_t hist1_n[kBuckets];
};

struct Found {  // a crossing element
  float x;                // its scaled logit
  int32_t id;
  uint64_t cum_w;         // weight of the candidates up to and including it
  uint64_t through_w;     // weight of the candidates with scaled >= x (its ties included)
  // Where it sits in the cache (-1: not there): its index, and the last index of its ties.
  int32_t cache_index, cache_last;
};

struct State {
  Block::Scratch scratch;
  int32_t masked[kSampleMaxMasked];
  int32_t bucket;                   // find_crossing's answer
  uint64_t before_n, before_w;
  int32_t compact_n;
  int32_t cache_valid, cache_n;
  uint64_t cache_base_n, cache_base_w;
  uint64_t warp_q[kWarps];
  int32_t sel_warp;
  uint64_t sel_before;
  int32_t sel_id;
  Found found;
};

struct RowView {
  const float* logits;
  int32_t vocab;
  const int32_t* masked;
  int32_t num_masked;
  float inv_t, max_x, thr, inv_width, wscale;

  __device__ float processed(int32_t v, float s) const {
    if (isnan(s)) s = kNegInf;
    for (int i = 0; i < num_masked; ++i)
      if (masked[i] == v) s = kNegInf;
    return s;
  }
  // The rounding steps are explicit (no fused multiply-add): the host makes them too.
  __device__ float scaled(int32_t v) const { return scaled(v, logits[v]); }
  __device__ float scaled(int32_t v, float raw) const { return canonical(__fmul_rn(processed(v, raw), inv_t)); }
  __device__ float offset(float x) const { return __fsub_rn(x, max_x); }
  __device__ bool candidate(float d) const { return d >= thr; }  // NaN: no
  __device__ int bucket(float d) const {
    const float f = __fmul_rn(-d, inv_width);
    return f >= float(kBuckets - 1) ? kBuckets - 1 : int(f);
  }
  __device__ uint64_t weight(float d) const { return __float2ull_rn(__fmul_rn(expf(d), wscale)); }
};

// f(v, logits[v]) for this thread's share of the row: 16-byte loads, kDepth in flight per
// thread, when the row is aligned (vocab % 4 == 0), else one float at a time. One block per row
// streams from L2 at about (bytes in flight) / (L2 latency): sample_kernel's 512 threads keep 8
// loads each in flight (64 KB per SM), 4x the 2 of the logprobs kernel's ordered pass.
template <int kBlock, int kDepth = 2, class F>
__device__ __forceinline__ void for_each_logit(const float* row, int32_t vocab, F&& f) {
  int32_t done = 0;
  if ((reinterpret_cast<uintptr_t>(row) & 15) == 0) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
    const int32_t n4 = vocab / 4;
    int32_t i = threadIdx.x;
    for (; i + (kDepth - 1) * kBlock < n4; i += kDepth * kBlock) {
      float4 a[kDepth];
#pragma unroll
      for (int d = 0; d < kDepth; ++d) a[d] = __ldg(r4 + i + d * kBlock);
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        const int32_t v = 4 * (i + d * kBlock);
        f(v, a[d].x), f(v + 1, a[d].y), f(v + 2, a[d].z), f(v + 3, a[d].w);
      }
    }
    for (; i < n4; i += kBlock) {
      const float4 a = __ldg(r4 + i);
      f(4 * i, a.x), f(4 * i + 1, a.y), f(4 * i + 2, a.z), f(4 * i + 3, a.w);
    }
    done = 4 * n4;
  }
  for (int32_t v = done + int32_t(threadIdx.x); v < vocab; v += kBlock) f(v, __ldg(row + v));
}

// sample_kernel's passes over a row (their f is order-free: integer atomics, slots sorted later).
constexpr int kSampleDepth = 8;

// Which candidates a refinement or compaction pass looks at.
struct Filter {
  int bucket_lo, bucket_hi;
  int key_shift;        // 32: any key
  uint32_t key_prefix;  // else key >> key_shift must equal this
  __device__ bool match(int b, uint32_t key) const {
    return b >= bucket_lo && b <= bucket_hi && (key_shift >= 32 || (key >> key_shift) == key_prefix);
  }
};

// The bucket of hist where the running count (or weight) passes c: before_q <= c < before_q + q.
// Sets st.bucket (-1 if c is beyond the total) and the totals before it.
__device__ void find_crossing(const uint32_t* hn, const uint64_t* hw, int nb, bool by_weight, uint64_t c, State& st) {
  const int per = nb / kThreads;
  const int first = threadIdx.x * per;
  uint64_t ln = 0, lw = 0;
  for (int j = 0; j < per; ++j) {
    ln += hn[first + j];
    lw += hw[first + j];
  }
  if (threadIdx.x == 0) st.bucket = -1;
  uint64_t tn, tw;
  uint64_t bn = Block::exclusive_scan(ln, st.scratch, &tn);
  uint64_t bw = Block::exclusive_scan(lw, st.scratch, &tw);
  for (int j = 0; j < per; ++j) {
    const uint64_t qn = hn[first + j], qw = hw[first + j];
    const uint64_t bq = by_weight ? bw : bn, q = by_weight ? qw : qn;
    if (bq <= c && c < bq + q) {
      st.bucket = first + j;
      st.before_n = bn;
      st.before_w = bw;
    }
    bn += qn;
    bw += qw;
  }
  __syncthreads();
}

// cache_cum[i] = the weights of cache entries 0..i (the first n entries, sorted): one weight per
// entry from its key's scaled logit, the running sum by a block scan.
__device__ void cache_running_weights(const RowView& row, int n, Tables& t, State& st) {
  constexpr int per = kCacheCap / kThreads;
  uint64_t w[per];
  uint64_t local = 0;
  for (int j = 0; j < per; ++j) {
    const int i = threadIdx.x * per + j;
    w[j] = 0;
    if (i < n) w[j] = row.weight(row.offset(key_float(~uint32_t(t.cache_keys[i] >> 32))));
    local += w[j];
  }
  uint64_t total;
  uint64_t run = Block::exclusive_scan(local, st.scratch, &total);
  for (int j = 0; j < per; ++j) {
    const int i = threadIdx.x * per + j;
    run += w[j];
    if (i < n) t.cache_cum[i] = run;
  }
}

// Gathers the candidates that pass `f` into the cache, sorted, with running weights; base_n
// and base_w are the count and weight of the candidates before them in candidate order.
__device__ void compact(const RowView& row, const Filter& f, uint64_t base_n, uint64_t base_w, Tables& t,
                        State& st) {
  if (threadIdx.x == 0) st.compact_n = 0;
  __syncthreads();
  for_each_logit<kThreads, kSampleDepth>(row.logits, row.vocab, [&](int32_t v, float raw) {
    const float x = row.scaled(v, raw), d = row.offset(x);
    if (!row.candidate(d)) return;
    const uint32_t key = float_key(x);
    if (!f.match(row.bucket(d), key)) return;
    const int slot = atomicAdd(&st.compact_n, 1);
    if (slot < kCacheCap) t.cache_keys[slot] = (uint64_t(~key) << 32) | uint32_t(v);
  });
  __syncthreads();
  const int n = min(st.compact_n, kCacheCap);  // the counts guarantee n <= kCacheCap
  int npad = 1;
  while (npad < n) npad <<= 1;
  for (int i = n + threadIdx.x; i < npad; i += kThreads) t.cache_keys[i] = ~uint64_t(0);
  __syncthreads();
  Block::bitonic_sort(t.cache_keys, npad);

  cache_running_weights(row, n, t, st);
  if (threadIdx.x == 0) {
    st.cache_valid = 1;
    st.cache_n = n;
    st.cache_base_n = base_n;
    st.cache_base_w = base_w;
  }
  __syncthreads();
}

__device__ bool cache_covers(bool by_weight, uint64_t c, const Tables& t, const State& st) {
  if (!st.cache_valid || st.cache_n == 0) return false;
  const uint64_t base = by_weight ? st.cache_base_w : st.cache_base_n;
  const uint64_t size = by_weight ? t.cache_cum[st.cache_n - 1] : uint64_t(st.cache_n);
  return base <= c && c < base + size;
}

// The crossing element inside the cache (cache_covers(by_weight, c) holds).
__device__ void resolve_in_cache(bool by_weight, uint64_t c, const Tables& t, State& st) {
  if (threadIdx.x == 0) {
    const int n = st.cache_n;
    int i;
    if (!by_weight) {
      i = int(c - st.cache_base_n);
    } else {  // smallest i with base + cum[i] > c
      int lo = 0, hi = n - 1;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (st.cache_base_w + t.cache_cum[mid] > c) hi = mid;
        else lo = mid + 1;
      }
      i = lo;
    }
    const uint32_t hi_bits = uint32_t(t.cache_keys[i] >> 32);
    int last = i;
    while (last + 1 < n && uint32_t(t.cache_keys[last + 1] >> 32) == hi_bits) ++last;
    st.found.x = key_float(~hi_bits);
    st.found.id = int32_t(uint32_t(t.cache_keys[i]));
    st.found.cum_w = st.cache_base_w + t.cache_cum[i];
    st.found.through_w = st.cache_base_w + t.cache_cum[last];
    st.found.cache_index = i;
    st.found.cache_last = last;
  }
  __syncthreads();
}

// The first token in id order whose running q(v) passes c (q summed over the vocabulary
// must exceed c). Two levels: per-warp slices, then per-thread pieces of the chosen slice.
template <class Q>
__device__ int32_t find_in_id_order(int32_t vocab, Q q, uint64_t c, State& st) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t slice = (vocab + kWarps - 1) / kWarps;
  {
    const int32_t lo = warp * slice, hi = min(vocab, lo + slice);
    uint64_t s = 0;
    for (int32_t v = lo + lane; v < hi; v += 32) s += q(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) st.warp_q[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t run = 0;
    st.sel_warp = kWarps - 1;
    st.sel_before = 0;
    st.sel_id = -1;
    for (int w = 0; w < kWarps; ++w) {
      if (run <= c && c < run + st.warp_q[w]) {
        st.sel_warp = w;
        st.sel_before = run;
        break;
      }
      run += st.warp_q[w];
    }
  }
  __syncthreads();
  const int32_t lo = st.sel_warp * slice, hi = min(vocab, lo + slice);
  const uint64_t rel = c - st.sel_before;
  const int32_t per = (max(hi - lo, 0) + kThreads - 1) / kThreads;
  const int32_t a = lo + int32_t(threadIdx.x) * per, e = min(hi, a + per);
  uint64_t mine = 0;
  for (int32_t v = a; v < e; ++v) mine += q(v);
  uint64_t total;
  const uint64_t before = Block::exclusive_scan(mine, st.scratch, &total);
  if (before <= rel && rel < before + mine) {
    uint64_t run = before;
    for (int32_t v = a; v < e; ++v) {
      run += q(v);
      if (run > rel) {
        st.sel_id = v;
        break;
      }
    }
  }
  __syncthreads();
  return st.sel_id;
}

// The draw when the kept tokens are the cache's first m entries (a prefix cache): they are
// re-sorted by id in the spare histogram and walked there, with the cache's exact weights,
// so the result is the one the pass over the row would give.
__device__ int32_t draw_in_cache(int m, uint64_t c, Tables& t, State& st) {
  uint64_t* by_id = t.hist1_w;  // kCacheCap entries: (id << 32) | cache index
  int npad = 1;
  while (npad < m) npad <<= 1;
  for (int i = threadIdx.x; i < npad; i += kThreads)
    by_id[i] = i < m ? (uint64_t(uint32_t(t.cache_keys[i])) << 32) | uint32_t(i) : ~uint64_t(0);
  if (threadIdx.x == 0) st.sel_id = -1;
  __syncthreads();
  Block::bitonic_sort(by_id, npad);
  constexpr int per = kCacheCap / kThreads;
  uint64_t w[per];
  uint64_t local = 0;
  for (int j = 0; j < per; ++j) {
    const int i = threadIdx.x * per + j;
    w[j] = 0;
    if (i < m) {
      const uint32_t k = uint32_t(by_id[i]);
      w[j] = t.cache_cum[k] - (k > 0 ? t.cache_cum[k - 1] : 0);
    }
    local += w[j];
  }
  uint64_t total;
  uint64_t run = Block::exclusive_scan(local, st.scratch, &total);
  if (run <= c && c < run + local) {
    for (int j = 0; j < per; ++j) {
      run += w[j];
      if (run > c) {
        st.sel_id = int32_t(by_id[threadIdx.x * per + j] >> 32);
        break;
      }
    }
  }
  __syncthreads();
  return st.sel_id;
}

// The candidate where the running count (by_weight false: c = rank) or weight passes c,
// in candidate order. Leaves it in st.found.
__device__ void search(const RowView& row, bool by_weight, uint64_t c, Tables& t, State& st) {
  if (cache_covers(by_weight, c, t, st)) {
    resolve_in_cache(by_weight, c, t, st);
    return;
  }
  find_crossing(t.hist0_n, t.hist0_w, kBuckets, by_weight, c, st);
  const int b = max(st.bucket, 0);  // c is below the total by construction; never out of bounds
  uint64_t before_n = st.before_n, before_w = st.before_w;
  __syncthreads();  // st is rewritten below
  if (before_n + t.hist0_n[b] <= kCacheCap) {
    compact(row, Filter{0, b, 32, 0}, 0, 0, t, st);
    resolve_in_cache(by_weight, c, t, st);
    return;
  }
  if (t.hist0_n[b] <= kCacheCap) {
    compact(row, Filter{b, b, 32, 0}, before_n, before_w, t, st);
    resolve_in_cache(by_weight, c, t, st);
    return;
  }
  // Refine on the exact key: digits of 11, 11 and 10 bits.
  constexpr int kShift[3] = {21, 10, 0};
  constexpr int kBits[3] = {11, 11, 10};
  Filter f{b, b, 32, 0};
  int sub = 0;
  for (int level = 0; level < 3; ++level) {
    const int nb = 1 << kBits[level];
    for (int i = threadIdx.x; i < nb; i += kThreads) {
      t.hist1_n[i] = 0;
      t.hist1_w[i] = 0;
    }
    __syncthreads();
    for_each_logit<kThreads, kSampleDepth>(row.logits, row.vocab, [&](int32_t v, float raw) {
      const float x = row.scaled(v, raw), d = row.offset(x);
      if (!row.candidate(d)) return;
      const uint32_t key = float_key(x);
      if (!f.match(row.bucket(d), key)) return;
      // Index 0 holds the largest digit: the histogram runs in candidate order, like hist0.
      const int idx = nb - 1 - int((key >> kShift[level]) & uint32_t(nb - 1));
      atomicAdd(&t.hist1_n[idx], 1u);
      const uint64_t w = row.weight(d);
      if (w) atomicAdd(reinterpret_cast<unsigned long long*>(&t.hist1_w[idx]), static_cast<unsigned long long>(w));
    });
    __syncthreads();
    const uint64_t rel = c - (by_weight ? before_w : before_n);
    find_crossing(t.hist1_n, t.hist1_w, nb, by_weight, rel, st);
    sub = max(st.bucket, 0);
    before_n += st.before_n;
    before_w += st.before_w;
    const uint32_t digit = uint32_t(nb - 1 - sub);
    f.key_prefix = f.key_shift >= 32 ? digit : (f.key_prefix << kBits[level]) | digit;
    f.key_shift = kShift[level];
    const uint32_t sub_count = t.hist1_n[sub];
    __syncthreads();  // every thread has read st and hist1 before the next level rewrites them
    if (sub_count <= kCacheCap) {
      compact(row, f, before_n, before_w, t, st);
      resolve_in_cache(by_weight, c, t, st);
      return;
    }
  }
  // More than kCacheCap candidates share one scaled logit: equal weights, order by id.
  const uint32_t key = f.key_prefix;
  const uint64_t count = t.hist1_n[sub], group_w = t.hist1_w[sub];
  const uint64_t each_w = group_w / count;
  const uint64_t j = by_weight ? (c - before_w) / each_w : c - before_n;
  const int32_t id = find_in_id_order(
      row.vocab,
      [&](int32_t v) -> uint64_t {
        const float x = row.scaled(v), d = row.offset(x);
        return row.candidate(d) && row.bucket(d) == b && float_key(x) == key ? 1 : 0;
      },
      j, st);
  if (threadIdx.x == 0) {
    st.found.x = key_float(key);
    st.found.id = id;
    st.found.cum_w = before_w + (j + 1) * each_w;
    st.found.through_w = before_w + group_w;
    st.found.cache_index = st.found.cache_last = -1;
    st.cache_valid = 0;
  }
  __syncthreads();
}

// Slice length of row_best_kernel: a multiple of 4 (16-byte loads stay aligned in aligned rows).
__host__ __device__ inline int32_t best_slice(int32_t vocab, int parts) {
  const int32_t per = (vocab + parts - 1) / parts;
  return (per + 3) / 4 * 4;
}

constexpr int kBestThreads = 256;

// f(v, row[v]) for this thread's share of the slice [lo, hi) of a row: 16-byte loads when the
// slice starts 16-byte aligned (aligned rows: slices are multiples of 4), else one float at a time.
template <int kBlock, class F>
__device__ __forceinline__ void for_each_in_slice(const float* row, int32_t lo, int32_t hi, F&& f) {
  int32_t v0 = lo;
  if ((reinterpret_cast<uintptr_t>(row + lo) & 15) == 0) {
    const float4* r4 = reinterpret_cast<const float4*>(row + lo);
    const int32_t n4 = (hi - lo) / 4;
    for (int32_t i = threadIdx.x; i < n4; i += kBlock) {
      const float4 a = __ldg(r4 + i);
      const int32_t v = lo + 4 * i;
      f(v, a.x), f(v + 1, a.y), f(v + 2, a.z), f(v + 3, a.w);
    }
    v0 = lo + 4 * n4;
  }
  for (int32_t v = v0 + int32_t(threadIdx.x); v < hi; v += kBlock) f(v, __ldg(row + v));
}

// grid (kSampleBestParts, rows): block (p, i) finds the best masked logit of slice p of row i.
__global__ void __launch_bounds__(kBestThreads) row_best_kernel(const float* logits, int64_t vocab,
                                                                const SampleRowParams* params,
                                                                SampleRowScratch* scratch) {
  using BestBlock = BlockOps<kBestThreads>;
  __shared__ BestBlock::Scratch red;
  __shared__ int32_t masked[kSampleMaxMasked];
  const SampleRowParams& p = params[blockIdx.y];
  const int nm = min(max(p.num_masked, 0), kSampleMaxMasked);
  if (threadIdx.x < nm) masked[threadIdx.x] = p.masked[threadIdx.x];
  __syncthreads();
  const int32_t V = int32_t(vocab), per = best_slice(V, int(gridDim.x));
  const int32_t lo = min(V, int32_t(blockIdx.x) * per), hi = min(V, lo + per);
  const float* row = logits + int64_t(p.row) * vocab;
  float best = kNegInf;
  int32_t best_id = INT_MAX;
  auto consider = [&](int32_t v, float s) {
    if (isnan(s)) s = kNegInf;
    for (int i = 0; i < nm; ++i)
      if (masked[i] == v) s = kNegInf;
    if (ranks_before(s, v, best, best_id)) {
      best = s;
      best_id = v;
    }
  };
  for_each_in_slice<kBestThreads>(row, lo, hi, consider);
  BestBlock::best(best, best_id, red);
  if (threadIdx.x == 0) {
    scratch[blockIdx.y].best[blockIdx.x] = best;
    scratch[blockIdx.y].best_id[blockIdx.x] = best_id;
  }
}

constexpr int kSliceThreads = 256;
constexpr int kThreadKeep = 4;  // candidates a thread of row_slice_kernel keeps
static_assert(kSampleBestParts * kSampleSliceKeep == kCacheCap, "the merged lists fill the cache");
static_assert(kSliceThreads * kThreadKeep >= kSampleSliceKeep);

// The sort key of a candidate: ascending = candidate order (scaled desc, id asc), as cache_keys.
__device__ __forceinline__ uint64_t candidate_key(float x, int32_t v) {
  return (uint64_t(~float_key(x)) << 32) | uint32_t(v);
}

// The best of the slices' bests (every block of a row forms the same value from the same
// partials), into v / id.
template <class B>
__device__ __forceinline__ void best_of_slices(const SampleRowScratch& sc, int parts, float& v, int32_t& id,
                                               typename B::Scratch& red) {
  v = kNegInf;
  id = INT_MAX;
  if (int(threadIdx.x) < parts) {
    v = sc.best[threadIdx.x];
    id = sc.best_id[threadIdx.x];
  }
  B::best(v, id, red);
}

// grid (kSampleBestParts, rows), after row_best_kernel: block (p, i) lists slice p's candidates of
// row i (sampled rows only; see the top of the file).
__global__ void __launch_bounds__(kSliceThreads) row_slice_kernel(const float* logits, int64_t vocab,
                                                                  const SampleRowParams* params,
                                                                  SampleRowScratch* scratch, float wscale) {
  using SB = BlockOps<kSliceThreads>;
  __shared__ SB::Scratch red;
  __shared__ int32_t masked[kSampleMaxMasked];
  __shared__ uint64_t keys[kSliceThreads * kThreadKeep];
  const SampleRowParams& p = params[blockIdx.y];
  if (p.greedy) return;  // the row's sampling block needs only the bests
  SampleRowScratch& sc = scratch[blockIdx.y];
  const int nm = min(max(p.num_masked, 0), kSampleMaxMasked);
  if (threadIdx.x < nm) masked[threadIdx.x] = p.masked[threadIdx.x];
  __syncthreads();
  float best;
  int32_t best_id;
  best_of_slices<SB>(sc, int(gridDim.x), best, best_id, red);
  RowView row{logits + int64_t(p.row) * vocab, int32_t(vocab), masked, nm, p.inv_temperature, 0.0f,
              p.min_log_ratio, 0.0f, wscale};
  row.max_x = canonical(__fmul_rn(best, row.inv_t));
  if (best == kNegInf || !isfinite(row.max_x)) return;  // sample_kernel decides without the lists

  const int32_t V = int32_t(vocab), per = best_slice(V, int(gridDim.x));
  const int32_t lo = min(V, int32_t(blockIdx.x) * per), hi = min(V, lo + per);
  uint64_t top[kThreadKeep];  // this thread's best candidates, ascending keys
#pragma unroll
  for (int j = 0; j < kThreadKeep; ++j) top[j] = ~uint64_t(0);
  uint64_t n = 0, w = 0;
  auto consider = [&](int32_t v, float raw) {
    const float x = row.scaled(v, raw), d = row.offset(x);
    if (!row.candidate(d)) return;
    ++n;
    w += row.weight(d);
    uint64_t k = candidate_key(x, v);
#pragma unroll
    for (int j = 0; j < kThreadKeep; ++j) {  // insertion into the sorted list (the largest drops out)
      const uint64_t lo_k = k < top[j] ? k : top[j], hi_k = k < top[j] ? top[j] : k;
      top[j] = lo_k;
      k = hi_k;
    }
  };
  for_each_in_slice<kSliceThreads>(row.logits, lo, hi, consider);

  // A thread that dropped candidates: everything of its ranking at or before its last kept one is kept.
  const uint64_t thread_bound = n > uint64_t(kThreadKeep) ? top[kThreadKeep - 1] : ~uint64_t(0);
#pragma unroll
  for (int j = 0; j < kThreadKeep; ++j) keys[threadIdx.x * kThreadKeep + j] = top[j];
  const uint64_t slice_n = SB::sum(n, red), slice_w = SB::sum(w, red);
  const uint64_t kept = SB::sum(n < uint64_t(kThreadKeep) ? n : uint64_t(kThreadKeep), red);
  uint64_t bound = SB::min(thread_bound, red);  // synchronises: keys are written
  SB::bitonic_sort(keys, kSliceThreads * kThreadKeep);
  if (kept > uint64_t(kSampleSliceKeep) && keys[kSampleSliceKeep - 1] < bound) bound = keys[kSampleSliceKeep - 1];
  const int len = int(kept < uint64_t(kSampleSliceKeep) ? kept : uint64_t(kSampleSliceKeep));
  if (threadIdx.x < kSampleSliceKeep) sc.slice_keys[blockIdx.x][threadIdx.x] = keys[threadIdx.x];
  if (threadIdx.x == 0) {
    sc.slice_n[blockIdx.x] = slice_n;
    sc.slice_w[blockIdx.x] = slice_w;
    sc.slice_bound[blockIdx.x] = bound;
    sc.slice_len[blockIdx.x] = len;
  }
}

// A sampled row decided from the slices' lists (row_slice_kernel), or false: the caller runs the
// passes over the row. `row` has max_x set; every thread calls this and gets the same answer.
__device__ bool sample_from_slices(const RowView& row, const SampleRowParams& p, const SampleRowScratch& sc,
                                   int parts, Tables& t, State& st, int32_t& token) {
  uint64_t n_loc = 0, w_loc = 0, len_loc = 0, b_loc = ~uint64_t(0);
  if (int(threadIdx.x) < parts) {
    n_loc = sc.slice_n[threadIdx.x];
    w_loc = sc.slice_w[threadIdx.x];
    len_loc = uint64_t(sc.slice_len[threadIdx.x]);
    b_loc = sc.slice_bound[threadIdx.x];
  }
  const uint64_t num_candidates = Block::sum(n_loc, st.scratch), total_w = Block::sum(w_loc, st.scratch);
  const int n = int(Block::sum(len_loc, st.scratch));
  const uint64_t bound = Block::min(b_loc, st.scratch);
  if (num_candidates == 0 || total_w == 0) {  // as the passes find
    token = -1;
    return true;
  }
  // The merged lists, sorted: candidate order.
  for (int i = threadIdx.x; i < kCacheCap; i += kThreads) {
    const int sl = i / kSampleSliceKeep, j = i % kSampleSliceKeep;
    t.cache_keys[i] = sl < parts && j < sc.slice_len[sl] ? sc.slice_keys[sl][j] : ~uint64_t(0);
  }
  __syncthreads();
  Block::bitonic_sort(t.cache_keys, kCacheCap);
  // Running weights, and P: the complete prefix (keys at or before the earliest boundary).
  cache_running_weights(row, n, t, st);
  uint64_t in_prefix = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) in_prefix += t.cache_keys[i] <= bound ? 1 : 0;
  const int P = int(Block::sum(in_prefix, st.scratch));  // synchronises: cache_cum is written
  const bool everything = bound == ~uint64_t(0);          // no list dropped a candidate: P == n

  // top_k: the first top_k candidates and the ties of the last; they must lie in the prefix.
  uint64_t kept_w = total_w;
  int kept_m = 0;  // > 0: the kept tokens are the first kept_m of the cache
  if (p.top_k > 0 && uint64_t(p.top_k) < num_candidates) {
    const int i = p.top_k - 1;
    if (i >= P) return false;
    const uint32_t hi_bits = uint32_t(t.cache_keys[i] >> 32);
    int last = i;
    while (last + 1 < n && uint32_t(t.cache_keys[last + 1] >> 32) == hi_bits) ++last;  // every thread alike
    if (!everything && last >= P - 1) return false;  // the tie group may go on past the prefix
    kept_w = t.cache_cum[last];
    kept_m = last + 1;
  }
  // top_p: the candidate whose running weight passes ceil(top_p · kept) − 1, inside the kept ones.
  if (p.top_p < 1.0) {
    const double target = ceil(p.top_p * double(kept_w));
    const uint64_t need = target < 1.0 ? 1 : (target >= double(kept_w) ? kept_w : uint64_t(target));
    const uint64_t c = need - 1;
    const int limit = kept_m > 0 ? kept_m : P;
    if (limit == 0 || t.cache_cum[limit - 1] <= c) return false;
    int lo = 0, hi = limit - 1;  // smallest i with cum[i] > c
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (t.cache_cum[mid] > c) hi = mid;
      else lo = mid + 1;
    }
    kept_w = t.cache_cum[lo];
    kept_m = lo + 1;
  }
  // The draw over the kept tokens in id order.
  uint64_t c = uint64_t(p.uniform * double(kept_w));
  if (c >= kept_w) c = kept_w - 1;
  if (kept_m > 0) {
    token = draw_in_cache(kept_m, c, t, st);
    return true;
  }
  // No cut: every candidate is kept. The slices are consecutive ids: the slice holding the
  // crossing by their weights, then the token inside it.
  const int32_t V = row.vocab, per_slice = best_slice(V, parts);
  int s = 0;
  uint64_t before = 0;
  while (s + 1 < parts && before + sc.slice_w[s] <= c) before += sc.slice_w[s++];
  const int32_t lo = min(V, s * per_slice), hi = min(V, lo + per_slice);
  const int32_t at = find_in_id_order(
      hi - lo,
      [&](int32_t i) -> uint64_t {
        const float d = row.offset(row.scaled(lo + i));
        return row.candidate(d) ? row.weight(d) : 0;
      },
      c - before, st);
  token = at < 0 ? -1 : lo + at;
  return true;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int64_t vocab,
                                                          const SampleRowParams* params, SampleRowResult* results,
                                                          const SampleRowScratch* scratch, int parts,
                                                          bool from_slices, float wscale) {
  extern __shared__ __align__(16) unsigned char smem[];
  Tables& t = *reinterpret_cast<Tables*>(smem);
  __shared__ State st;
  const SampleRowParams& p = params[blockIdx.x];
  SampleRowResult& out = results[blockIdx.x];
  const int nm = min(max(p.num_masked, 0), kSampleMaxMasked);
  if (threadIdx.x < nm) st.masked[threadIdx.x] = p.masked[threadIdx.x];
  if (threadIdx.x == 0) st.cache_valid = 0;
  __syncthreads();
  RowView row{logits + int64_t(p.row) * vocab, int32_t(vocab), st.masked, nm, p.inv_temperature, 0.0f,
              p.min_log_ratio, 0.0f, wscale};

  // P1: the greedy token and the maximum, the best of the slices' bests.
  static_assert(kSampleBestParts <= kThreads);
  float best;
  int32_t best_id;
  best_of_slices<Block>(scratch[blockIdx.x], parts, best, best_id, st.scratch);
  if (best == kNegInf || p.greedy) {
    if (threadIdx.x == 0) {
      out.token = best == kNegInf ? -1 : best_id;
      out.decided_by = 0;
    }
    return;
  }
  row.max_x = canonical(__fmul_rn(best, row.inv_t));
  row.inv_width = row.thr < 0.0f ? __fdiv_rn(float(kBuckets), -row.thr) : 0.0f;
  if (from_slices && isfinite(row.max_x)) {  // row_slice_kernel wrote the lists
    int32_t token;
    if (sample_from_slices(row, p, scratch[blockIdx.x], parts, t, st, token)) {
      if (threadIdx.x == 0) {
        out.token = token;
        out.decided_by = 1;
      }
      return;
    }
  }
  if (threadIdx.x == 0) out.decided_by = 2;

  // P2: the candidates' histogram.
  for (int i = threadIdx.x; i < kBuckets; i += kThreads) {
    t.hist0_n[i] = 0;
    t.hist0_w[i] = 0;
  }
  __syncthreads();
  for_each_logit<kThreads, kSampleDepth>(row.logits, row.vocab, [&](int32_t v, float raw) {
    const float d = row.offset(row.scaled(v, raw));
    if (!row.candidate(d)) return;
    const int b = row.bucket(d);
    atomicAdd(&t.hist0_n[b], 1u);
    const uint64_t w = row.weight(d);
    if (w) atomicAdd(reinterpret_cast<unsigned long long*>(&t.hist0_w[b]), static_cast<unsigned long long>(w));
  });
  __syncthreads();
  uint64_t ln = 0, lw = 0;
  for (int i = threadIdx.x; i < kBuckets; i += kThreads) {
    ln += t.hist0_n[i];
    lw += t.hist0_w[i];
  }
  const uint64_t num_candidates = Block::sum(ln, st.scratch);
  uint64_t kept_w = Block::sum(lw, st.scratch);
  if (num_candidates == 0 || kept_w == 0) {  // max(scaled) is +inf or not finite
    if (threadIdx.x == 0) out.token = -1;
    return;
  }

  // top_k, then top_p over what it kept: both leave a cut (cut_x, cut_id) in candidate order.
  bool have_cut = false;
  float cut_x = 0.0f;
  int32_t cut_id = INT_MAX;
  int kept_in_cache = 0;  // > 0: the kept tokens are the first kept_in_cache entries of a prefix cache
  if (p.top_k > 0 && uint64_t(p.top_k) < num_candidates) {
    search(row, false, uint64_t(p.top_k - 1), t, st);
    have_cut = true;
    cut_x = st.found.x;
    kept_w = st.found.through_w;
    kept_in_cache = st.found.cache_last + 1;
    __syncthreads();  // st.found is rewritten by the next search
  }
  if (p.top_p < 1.0) {
    // The shortest prefix whose weight is >= top_p * total: the element passing ceil(.) - 1.
    double target = ceil(p.top_p * double(kept_w));
    uint64_t need = target < 1.0 ? 1 : (target >= double(kept_w) ? kept_w : uint64_t(target));
    search(row, true, need - 1, t, st);
    have_cut = true;
    cut_x = st.found.x;
    cut_id = st.found.id;
    kept_w = st.found.cum_w;
    kept_in_cache = st.found.cache_index + 1;
    __syncthreads();
  }
  if (!(st.cache_valid && st.cache_base_n == 0)) kept_in_cache = 0;

  // The draw over the kept tokens in id order.
  uint64_t c = uint64_t(p.uniform * double(kept_w));
  if (c >= kept_w) c = kept_w - 1;
  const int32_t token =
      kept_in_cache > 0 ? draw_in_cache(kept_in_cache, c, t, st)
                        : find_in_id_order(
                              row.vocab,
                              [&](int32_t v) -> uint64_t {
                                const float x = row.scaled(v), d = row.offset(x);
                                if (!row.candidate(d)) return 0;
                                if (have_cut && !(x > cut_x || (x == cut_x && v <= cut_id))) return 0;
                                return row.weight(d);
                              },
                              c, st);
  if (threadIdx.x == 0) out.token = token;
}

constexpr int kLpThreads = 256;
constexpr int kTop = kSampleMaxLogprobs;

// The log-sum-exp pair (m, s): Σ exp(x − m) = s over the values taken so far.
__device__ __forceinline__ void merge_ms(float& m1, float& s1, float m2, float s2) {
  const float mm = fmaxf(m1, m2);
  if (mm == kNegInf) return;
  s1 = (m1 == kNegInf ? 0.0f : s1 * expf(m1 - mm)) + (m2 == kNegInf ? 0.0f : s2 * expf(m2 - mm));
  m1 = mm;
}

// grid (kSampleBestParts, rows), after sample_kernel, for rows that ask for logprobs: block (p, i)
// forms slice p's log-sum-exp of the raw logits (online, per thread, then merged in a fixed order)
// and its 20 best (value desc, id asc; NaN as -inf), into the row's scratch.
__global__ void __launch_bounds__(kLpThreads) logprobs_slice_kernel(const float* logits, int64_t vocab,
                                                                    const SampleRowParams* params,
                                                                    const SampleRowResult* results,
                                                                    SampleRowScratch* scratch) {
  __shared__ float top_v[kLpThreads][kTop];
  __shared__ int32_t top_i[kLpThreads][kTop];
  __shared__ float red_m[kLpThreads / 32], red_s[kLpThreads / 32];
  const SampleRowParams& p = params[blockIdx.y];
  if (p.num_logprobs < 0 || results[blockIdx.y].token < 0) return;
  const float* row = logits + int64_t(p.row) * vocab;
  const int32_t V = int32_t(vocab), per = best_slice(V, int(gridDim.x));
  const int32_t lo = min(V, int32_t(blockIdx.x) * per), hi = min(V, lo + per);

  float m = kNegInf, s = 0.0f;
  float tv[kTop];
  int32_t ti[kTop];
#pragma unroll
  for (int j = 0; j < kTop; ++j) {
    tv[j] = kNegInf;
    ti[j] = INT_MAX;
  }
  auto take = [&](int32_t v, float x) {
    if (isnan(x)) x = kNegInf;
    if (x != kNegInf) {
      if (x > m) {
        s = s * expf(m - x) + 1.0f;
        m = x;
      } else {
        s += expf(x - m);
      }
    }
    if (ranks_before(x, v, tv[kTop - 1], ti[kTop - 1])) {
      tv[kTop - 1] = x;
      ti[kTop - 1] = v;
#pragma unroll
      for (int j = kTop - 1; j > 0; --j) {
        if (ranks_before(tv[j], ti[j], tv[j - 1], ti[j - 1])) {
          const float fv = tv[j];
          tv[j] = tv[j - 1];
          tv[j - 1] = fv;
          const int32_t fi = ti[j];
          ti[j] = ti[j - 1];
          ti[j - 1] = fi;
        }
      }
    }
  };
  for_each_in_slice<kLpThreads>(row, lo, hi, take);

  // log-sum-exp across the block: xor tree in each warp, then the warps in order.
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, s, o);
    merge_ms(m, s, om, os);
  }
  if ((threadIdx.x & 31) == 0) {
    red_m[threadIdx.x >> 5] = m;
    red_s[threadIdx.x >> 5] = s;
  }
#pragma unroll
  for (int j = 0; j < kTop; ++j) {
    top_v[threadIdx.x][j] = tv[j];
    top_i[threadIdx.x][j] = ti[j];
  }
  __syncthreads();
  // Pairwise merges of the sorted lists.
  for (int stride = 1; stride < kLpThreads; stride <<= 1) {
    if (threadIdx.x % (2 * stride) == 0) {
      const int a = threadIdx.x, b = threadIdx.x + stride;
      float mv[kTop];
      int32_t mi[kTop];
      int ia = 0, ib = 0;
      for (int j = 0; j < kTop; ++j) {
        if (ranks_before(top_v[a][ia], top_i[a][ia], top_v[b][ib], top_i[b][ib])) {
          mv[j] = top_v[a][ia];
          mi[j] = top_i[a][ia++];
        } else {
          mv[j] = top_v[b][ib];
          mi[j] = top_i[b][ib++];
        }
      }
      for (int j = 0; j < kTop; ++j) {
        top_v[a][j] = mv[j];
        top_i[a][j] = mi[j];
      }
    }
    __syncthreads();
  }
  SampleRowScratch& sc = scratch[blockIdx.y];
  if (threadIdx.x < kTop) {
    sc.lp_top_v[blockIdx.x][threadIdx.x] = top_v[0][threadIdx.x];
    sc.lp_top_i[blockIdx.x][threadIdx.x] = top_i[0][threadIdx.x];
  }
  if (threadIdx.x != 0) return;
  float bm = red_m[0], bs = red_s[0];
  for (int w = 1; w < kLpThreads / 32; ++w) merge_ms(bm, bs, red_m[w], red_s[w]);
  sc.lp_m[blockIdx.x] = bm;
  sc.lp_s[blockIdx.x] = bs;
}

// One thread per row that asks: the slices' log-sum-exp pairs merged in slice order, their 20-best
// lists merged (the row's 20 best: each is among its slice's 20 best), and the token's logprob.
__global__ void logprobs_merge_kernel(const float* logits, int64_t vocab, const SampleRowParams* params,
                                      SampleRowResult* results, const SampleRowScratch* scratch, int parts, int n) {
  const int r = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (r >= n) return;
  const SampleRowParams& p = params[r];
  SampleRowResult& out = results[r];
  const int32_t token = out.token;
  if (p.num_logprobs < 0 || token < 0) return;
  const SampleRowScratch& sc = scratch[r];
  float bm = sc.lp_m[0], bs = sc.lp_s[0];
  for (int k = 1; k < parts; ++k) merge_ms(bm, bs, sc.lp_m[k], sc.lp_s[k]);
  const double lse = bm == kNegInf ? __longlong_as_double(0x7ff0000000000000ll) : double(bm) + log(double(bs));
  auto logprob_of = [&](float x) { return x == kNegInf ? kNegInf : float(double(x) - lse); };
  float tx = logits[int64_t(p.row) * vocab + token];
  if (isnan(tx)) tx = kNegInf;
  out.logprob = logprob_of(tx);
  int nt = p.num_logprobs < kTop ? p.num_logprobs : kTop;
  if (vocab < nt) nt = int(vocab);
  out.num_top = nt;
  int head[kSampleBestParts];  // each slice's next entry
  for (int k = 0; k < parts; ++k) head[k] = 0;
  for (int j = 0; j < nt; ++j) {
    int bk = 0;
    for (int k = 1; k < parts; ++k)
      if (head[k] < kTop && (head[bk] >= kTop || ranks_before(sc.lp_top_v[k][head[k]], sc.lp_top_i[k][head[k]],
                                                              sc.lp_top_v[bk][head[bk]], sc.lp_top_i[bk][head[bk]])))
        bk = k;
    out.top_ids[j] = sc.lp_top_i[bk][head[bk]];
    out.top_logprobs[j] = logprob_of(sc.lp_top_v[bk][head[bk]]);
    ++head[bk];
  }
}

}  // namespace
}  // namespace sampling

namespace {
std::atomic<bool> g_from_slices{true};
}  // namespace

void set_sampling_from_slices(bool on) { g_from_slices.store(on, std::memory_order_relaxed); }

void sample_rows(const float* logits, int64_t vocab, const SampleRowParams* params, int n, SampleRowResult* results,
                 SampleRowScratch* scratch, bool any_sampled, bool any_logprobs, cudaStream_t stream) {
  if (n <= 0) return;
  if (vocab <= 0 || vocab >= (int64_t(1) << 24))
    throw Error("sample_rows: vocabulary of " + std::to_string(vocab) + " is outside [1, 2^24)");
  // Fixed-point weights: vocab * 2^S < 2^63.
  int log2v = 0;
  while ((int64_t(1) << (log2v + 1)) <= vocab) ++log2v;
  const float wscale = ldexpf(1.0f, 62 - log2v);
  static const bool configured = [] {
    MOESERVE_CUDA_CHECK(cudaFuncSetAttribute(sampling::sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             int(sizeof(sampling::Tables))));
    return true;
  }();
  (void)configured;
  // Slices per row: all kSampleBestParts for a few rows, fewer as rows add blocks of their own (about
  // two blocks per SM in all; at 256 rows 64 slices each ran 2x slower than one block per row).
  const int parts = std::clamp((2 * current_device_sm_count() + n - 1) / n, 1, kSampleBestParts);
  sampling::row_best_kernel<<<dim3(unsigned(parts), unsigned(n)), sampling::kBestThreads, 0, stream>>>(
      logits, vocab, params, scratch);
  MOESERVE_CUDA_CHECK_LAUNCH();
  const bool from_slices = any_sampled && g_from_slices.load(std::memory_order_relaxed);
  if (from_slices) {
    sampling::row_slice_kernel<<<dim3(unsigned(parts), unsigned(n)), sampling::kSliceThreads, 0, stream>>>(
        logits, vocab, params, scratch, wscale);
    MOESERVE_CUDA_CHECK_LAUNCH();
  }
  sampling::sample_kernel<<<n, sampling::kThreads, sizeof(sampling::Tables), stream>>>(
      logits, vocab, params, results, scratch, parts, from_slices, wscale);
  MOESERVE_CUDA_CHECK_LAUNCH();
  if (!any_logprobs) return;
  sampling::logprobs_slice_kernel<<<dim3(unsigned(parts), unsigned(n)), sampling::kLpThreads, 0, stream>>>(
      logits, vocab, params, results, scratch);
  MOESERVE_CUDA_CHECK_LAUNCH();
  sampling::logprobs_merge_kernel<<<(n + 63) / 64, 64, 0, stream>>>(logits, vocab, params, results, scratch, parts,
                                                                   n);
  MOESERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
