// Gated full attention on the GPU (ops_attention.h) against the CPU ops:
//   attention_prepare: query/gate split, (1+w) q/k RMSNorm, partial NeoX RoPE, K/V written
//     into the paged bf16 cache at the token's (block, slot);
//   paged_attention: causal softmax over the paged cache with GQA and the sigmoid output gate,
//     for a mixed step (decode tokens, prefill chunks, a verify batch) over shuffled block
//     tables, and contexts long enough for a split-KV kernel (up to 16k positions);
//   batch invariance: a query's output is bit-identical whether it runs as a lone decode
//     (split-KV + merge), inside a prefill chunk, a verify batch or next to other sequences,
//     across the chunk-size change at 16384 positions (the alone outputs also against the CPU);
//   the decode kernels (decode steps of <= 64 tokens): batch 1 vs batch 64 vs the tile kernel,
//     bit for bit, at contexts of 1, 17, 512 and 4100 positions, and against the CPU; right
//     after attention_prepare (programmatic dependent launch) vs with a synchronisation;
//   the tile-parallel decode kernel (steps of <= 2 tokens, <= 8 under variant 2; its last CTA
//   folds the chunks)
//     against the work-item decode kernel and the tile kernel, bit for bit, at contexts 1, 63,
//     64, 65, 512, 4096, 4097 and 8200 in batches of 1, 3, 8 and 64, and after attention_prepare.
// Shapes: the 122B-A10B attention (32 q heads, 2 KV heads, head_dim 256, rotary 64), the
// 35B-A3B one (16 q heads), the fixtures' (6/2 heads of 24, rotary 6) and an odd one
// (head_dim 72, 4 KV heads).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "backend/cpu/activations.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/norms.h"
#include "backend/cpu/paged_kv_cache.h"
#include "backend/cpu/rope.h"
#include "backend/cuda/ops_attention.h"
#include "core/thread_pool.h"
#include "gpu_test_util.h"

using namespace moeserve;
using namespace moeserve::gputest;

namespace {

constexpr int kBlock = 16;

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

struct AttnCase {
  int nq, nkv, hd, rot;
  std::string name() const {
    return "nq=" + std::to_string(nq) + " nkv=" + std::to_string(nkv) + " hd=" + std::to_string(hd) +
           " rot=" + std::to_string(rot);
  }
};

const AttnCase kCases[] = {{32, 2, 256, 64}, {16, 2, 256, 64}, {6, 2, 24, 6}, {12, 4, 72, 18}};

// A bf16 KV pool on the GPU, filled with large garbage so that reading a wrong block or
// slot shows up as a huge error, and the same pool in fp32 on the CPU.
struct Pools {
  int num_blocks;
  std::vector<float> k_host, v_host;  // [num_blocks][nkv][bs][hd], what the GPU pool holds
  cpu::PagedKvCache cpu;
  Pools(Rng& rng, const AttnCase& c, int blocks)
      : num_blocks(blocks),
        k_host(random_bf16(rng, size_t(blocks) * c.nkv * kBlock * c.hd, 1000.0f)),
        v_host(random_bf16(rng, size_t(blocks) * c.nkv * kBlock * c.hd, 1000.0f)),
        cpu(cpu::KvGeometry{c.nkv, c.hd, kBlock}, blocks) {}
  size_t offset(const AttnCase& c, int block, int head, int slot) const {
    return ((size_t(block) * c.nkv + head) * kBlock + slot) * size_t(c.hd);
  }
};

}  // namespace

TEST(GpuOpsAttention, PrepareNormRopeAndCacheWrite) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(21);
  for (const AttnCase& c : kCases) {
    SCOPED_TRACE(c.name());
    // A decode token, a prefill chunk from 0, a chunk in the middle, a decode at a far position.
    std::vector<SeqSpec> seqs{{37, 1, 0, {}}, {0, 17, 0, {}}, {100, 5, 0, {}}, {40000, 1, 0, {}}};
    const int blocks = assign_shuffled_blocks(rng, seqs, kBlock);
    int max_blocks = 0;
    for (const auto& s : seqs) max_blocks = std::max(max_blocks, int(s.blocks.size()));
    DeviceStepMeta meta(seqs, max_blocks);
    const int M = meta.num_tokens();
    const cpu::RotaryEmbedding rope(c.rot, 1e7);
    const float eps = 1e-6f;

    const auto qg = random_bf16(rng, size_t(M) * c.nq * 2 * c.hd, 2.0f);
    const auto k = random_bf16(rng, size_t(M) * c.nkv * c.hd, 2.0f);
    const auto v = random_bf16(rng, size_t(M) * c.nkv * c.hd, 2.0f);
    const auto qn = random_f32(rng, size_t(c.hd), 0.3f), kn = random_f32(rng, size_t(c.hd), 0.3f);
    Pools pools(rng, c, blocks);
    auto d_k_pool = to_device_bf16(pools.k_host), d_v_pool = to_device_bf16(pools.v_host);
    auto d_qg = to_device_bf16(qg), d_k = to_device_bf16(k), d_v = to_device_bf16(v);
    auto d_qn = to_device_f32(qn), d_kn = to_device_f32(kn), d_freq = to_device_f32(rope.inv_freq());
    DeviceBuffer<bf16> d_q(size_t(M) * c.nq * c.hd), d_gate(size_t(M) * c.nq * c.hd);
    const cuda::AttentionShape shape{c.nq, c.nkv, c.hd, c.rot, eps};
    const cuda::KvCacheView view{d_k_pool.data(), d_v_pool.data(), blocks, c.nkv, kBlock, c.hd};
    cuda::attention_prepare(d_qg.data(), d_k.data(), d_v.data(), d_qn.data(), d_kn.data(), d_freq.data(), shape,
                            meta.meta(), view, d_q.data(), d_gate.data(), nullptr);

    // CPU reference (full_attention_block's steps 1, 3, 4) and the per-element bound of the
    // rotation: a + b·sin/cos cancels, so its fp32 error scales with |x1| + |x2|, not with
    // the result (1e-5 is ~170 fp32 ulps of that; a wrong pair or angle is O(1)).
    std::vector<float> q_ref(size_t(M) * c.nq * c.hd), gate_ref(q_ref.size()), q_bound(q_ref.size());
    std::vector<float> k_ref(size_t(M) * c.nkv * c.hd), k_bound(k_ref.size());
    auto rotate_ref = [&](const float* src, const float* w, float* dst, float* bound, int64_t pos) {
      cpu::rms_norm_zero_centred(src, dst, c.hd, w, eps);
      for (int d = 0; d < c.hd; ++d) {
        const int half = c.rot / 2;
        const float pair = d < c.rot ? dst[d < half ? d + half : d - half] : 0.0f;
        bound[d] = float(1e-5 * (std::abs(dst[d]) + std::abs(pair)));
      }
      rope.apply(dst, pos);
    };
    for (int m = 0; m < M; ++m) {
      const int64_t pos = meta.token_pos[size_t(m)];
      for (int h = 0; h < c.nq; ++h) {
        const float* src = qg.data() + (size_t(m) * c.nq + h) * 2 * c.hd;
        const size_t o = (size_t(m) * c.nq + h) * c.hd;
        std::copy(src + c.hd, src + 2 * c.hd, gate_ref.begin() + long(o));
        rotate_ref(src, qn.data(), q_ref.data() + o, q_bound.data() + o, pos);
      }
      for (int h = 0; h < c.nkv; ++h) {
        const size_t o = (size_t(m) * c.nkv + h) * c.hd;
        rotate_ref(k.data() + o, kn.data(), k_ref.data() + o, k_bound.data() + o, pos);
      }
    }
    EXPECT_TRUE(all_close("attention_prepare.q " + c.name(), to_host(d_q), q_ref, {M, c.nq, c.hd},
                          {"M", "head", "d"}, 0, kEpsBf16 * 1.001, &q_bound));
    EXPECT_TRUE(all_close("attention_prepare.gate " + c.name(), to_host(d_gate), gate_ref, {M, c.nq, c.hd},
                          {"M", "head", "d"}, 0, 0));

    // The cache: the new tokens' slots hold bf16(k_ref) and v exactly; every other slot is
    // untouched garbage.
    const auto k_pool = to_host(d_k_pool), v_pool = to_host(d_v_pool);
    std::vector<float> k_exp = pools.k_host, v_exp = pools.v_host, cache_bound(k_exp.size(), 0.0f);
    for (int m = 0; m < M; ++m) {
      const auto& s = seqs[size_t(meta.token_seq[size_t(m)])];
      const int pos = meta.token_pos[size_t(m)];
      for (int h = 0; h < c.nkv; ++h) {
        const size_t dst = pools.offset(c, s.blocks[size_t(pos / kBlock)], h, pos % kBlock);
        const size_t src = (size_t(m) * c.nkv + h) * c.hd;
        std::copy_n(k_ref.begin() + long(src), c.hd, k_exp.begin() + long(dst));
        std::copy_n(k_bound.begin() + long(src), c.hd, cache_bound.begin() + long(dst));
        std::copy_n(v.begin() + long(src), c.hd, v_exp.begin() + long(dst));
      }
    }
    const std::vector<int64_t> pool_dims{blocks, c.nkv, kBlock, c.hd};
    const std::vector<std::string> pool_names{"block", "kv_head", "slot", "d"};
    EXPECT_TRUE(all_close("attention_prepare.k_cache " + c.name(), k_pool, k_exp, pool_dims, pool_names, 0,
                          kEpsBf16 * 1.001, &cache_bound));
    EXPECT_TRUE(all_close("attention_prepare.v_cache " + c.name(), v_pool, v_exp, pool_dims, pool_names, 0, 0));
  }
}

TEST(GpuOpsAttention, PagedAttentionMixedStepMatchesCpu) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(22);
  for (const AttnCase& c : kCases) {
    SCOPED_TRACE(c.name());
    // Decode tokens over contexts of 1, 16, 17 and 1000 positions and of 5000 and 16384 (long:
    // the split-KV range), a prefill chunk from 0, a chunk continuing at 300, a 4-token verify
    // batch, and a 64-token chunk at 8000.
    std::vector<SeqSpec> seqs{{0, 1, 0, {}},     {15, 1, 0, {}},   {16, 1, 0, {}},   {999, 1, 0, {}},
                              {0, 64, 0, {}},    {300, 37, 0, {}}, {2047, 4, 0, {}}, {4999, 1, 0, {}},
                              {8000, 64, 0, {}}, {16383, 1, 0, {}}};
    const int blocks = assign_shuffled_blocks(rng, seqs, kBlock);
    int max_blocks = 0, max_context = 0;
    for (const auto& s : seqs) {
      max_blocks = std::max(max_blocks, int(s.blocks.size()));
      max_context = std::max(max_context, s.start_pos + s.num_tokens);
    }
    DeviceStepMeta meta(seqs, max_blocks);
    const int M = meta.num_tokens();

    // Cache contents of every sequence's positions [0, start + n): random bf16 K and V.
    Pools pools(rng, c, blocks);
    cpu::PagedKvCache cpu_abs(cpu::KvGeometry{c.nkv, c.hd, kBlock}, blocks);  // K, |V|: the error scale
    for (const auto& s : seqs) {
      const int len = s.start_pos + s.num_tokens;
      const auto kk = random_bf16(rng, size_t(len) * c.nkv * c.hd, 1.0f);
      const auto vv = random_bf16(rng, size_t(len) * c.nkv * c.hd, 1.0f);
      pools.cpu.write(s.blocks, 0, len, kk.data(), vv.data());
      const auto av = [&] {
        std::vector<float> a(vv.size());
        for (size_t i = 0; i < a.size(); ++i) a[i] = std::abs(vv[i]);
        return a;
      }();
      cpu_abs.write(s.blocks, 0, len, kk.data(), av.data());
      for (int p = 0; p < len; ++p)
        for (int h = 0; h < c.nkv; ++h) {
          const size_t dst = pools.offset(c, s.blocks[size_t(p / kBlock)], h, p % kBlock);
          const size_t src = (size_t(p) * c.nkv + h) * c.hd;
          std::copy_n(kk.begin() + long(src), c.hd, pools.k_host.begin() + long(dst));
          std::copy_n(vv.begin() + long(src), c.hd, pools.v_host.begin() + long(dst));
        }
    }
    // Queries scaled so that scores have a standard deviation of ~3 (a peaked softmax: a
    // wrongly included or missing position changes the output visibly).
    const auto q = random_bf16(rng, size_t(M) * c.nq * c.hd, 3.0f);
    const auto gate = random_bf16(rng, size_t(M) * c.nq * c.hd, 2.0f);
    const float scale = 1.0f / std::sqrt(float(c.hd));

    std::vector<float> o(q.size()), oabs(q.size());
    std::vector<cpu::AttentionChunk> chunks, abs_chunks;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const size_t r = size_t(meta.seq_token_start[i]) * c.nq * c.hd;
      chunks.push_back({q.data() + r, o.data() + r, seqs[i].num_tokens, seqs[i].start_pos, seqs[i].blocks});
      abs_chunks.push_back({q.data() + r, oabs.data() + r, seqs[i].num_tokens, seqs[i].start_pos, seqs[i].blocks});
    }
    cpu::paged_attention(pool(), pools.cpu, c.nq, scale, chunks);
    cpu::paged_attention(pool(), cpu_abs, c.nq, scale, abs_chunks);
    // out = o ⊙ sigmoid(gate). Bound: bf16 output rounding (relative) plus 1e-4 of the
    // softmax-weighted Σ|v| (fp32 exp/accumulation differences, ~1e-6 in practice).
    std::vector<float> ref(o.size()), bound(o.size());
    for (size_t i = 0; i < o.size(); ++i) {
      const float sg = cpu::sigmoid(gate[i]);
      ref[i] = o[i] * sg;
      bound[i] = float(1e-4 * oabs[i] * sg);
    }

    auto d_k = to_device_bf16(pools.k_host), d_v = to_device_bf16(pools.v_host);
    auto d_q = to_device_bf16(q), d_gate = to_device_bf16(gate);
    const cuda::AttentionShape shape{c.nq, c.nkv, c.hd, c.rot, 1e-6f};
    const cuda::KvCacheView view{d_k.data(), d_v.data(), blocks, c.nkv, kBlock, c.hd};
    const size_t ws_bytes = cuda::paged_attention_workspace_bytes(shape, M, max_context);
    DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
    DeviceBuffer<bf16> d_out(q.size());
    cuda::paged_attention(d_q.data(), d_gate.data(), shape, meta.meta(), view, scale, ws.data(), ws_bytes,
                          d_out.data(), nullptr);
    const auto got = to_host(d_out);
    EXPECT_TRUE(all_close("paged_attention " + c.name(), got, ref, {M, c.nq, c.hd}, {"token", "head", "d"}, 0,
                          kEpsBf16 * 1.001, &bound));
    // Per sequence, so that a failure names the kind of step (decode, chunk, long context).
    for (size_t i = 0; i < seqs.size(); ++i) {
      const size_t b = size_t(meta.seq_token_start[i]) * c.nq * c.hd, e = size_t(meta.seq_token_start[i + 1]) * c.nq * c.hd;
      const auto es = error_stats(std::vector<float>(got.begin() + long(b), got.begin() + long(e)),
                                  std::vector<float>(ref.begin() + long(b), ref.begin() + long(e)));
      std::printf("  seq %zu: start %d, %d tokens: rel %.3e rms rel %.3e\n", i, seqs[i].start_pos,
                  seqs[i].num_tokens, es.rel, es.rms_rel);
    }
  }
}

// The same query (same q, gate and cache) gives the same bits in every kind of step: alone as
// a decode (M = 1: the KV range split over CTAs and merged), inside prefill chunks (one CTA
// per tile of tokens walking the whole range, with and without split), in a decode batch, a
// verify batch and a mixed step. Chunks straddle the first split-chunk boundary (256) and the
// chunk-size doubling at 16384 positions. The alone outputs are also checked against the CPU.
TEST(GpuOpsAttention, PagedAttentionBitIdenticalAcrossSteps) {
  MOESERVE_REQUIRE_GPU();
  const AttnCase shapes[] = {{32, 2, 256, 64}, {16, 2, 256, 64}};
  for (const AttnCase& c : shapes) {
    SCOPED_TRACE(c.name());
    Rng rng(23);
    // Sequences with their whole context already in the cache.
    const std::vector<int> lens{20000, 3000, 700, 40};
    std::vector<SeqSpec> ctx;
    for (int len : lens) ctx.push_back({0, len, 0, {}});
    const int blocks = assign_shuffled_blocks(rng, ctx, kBlock);
    int max_blocks = 0;
    for (const auto& s : ctx) max_blocks = std::max(max_blocks, int(s.blocks.size()));
    Pools pools(rng, c, blocks);
    for (const auto& s : ctx) {
      const int len = s.num_tokens;
      const auto kk = random_bf16(rng, size_t(len) * c.nkv * c.hd, 1.0f);
      const auto vv = random_bf16(rng, size_t(len) * c.nkv * c.hd, 1.0f);
      pools.cpu.write(s.blocks, 0, len, kk.data(), vv.data());
      for (int p = 0; p < len; ++p)
        for (int h = 0; h < c.nkv; ++h) {
          const size_t dst = pools.offset(c, s.blocks[size_t(p / kBlock)], h, p % kBlock);
          const size_t src = (size_t(p) * c.nkv + h) * c.hd;
          std::copy_n(kk.begin() + long(src), c.hd, pools.k_host.begin() + long(dst));
          std::copy_n(vv.begin() + long(src), c.hd, pools.v_host.begin() + long(dst));
        }
    }
    auto d_k = to_device_bf16(pools.k_host), d_v = to_device_bf16(pools.v_host);
    const cuda::AttentionShape shape{c.nq, c.nkv, c.hd, c.rot, 1e-6f};
    const cuda::KvCacheView view{d_k.data(), d_v.data(), blocks, c.nkv, kBlock, c.hd};
    const float scale = 1.0f / std::sqrt(float(c.hd));
    const size_t row = size_t(c.nq) * c.hd;
    // q (scores with a standard deviation of ~3) and gate of the query at (sequence, position).
    auto query = [&](int seq, int pos, uint64_t salt, float sd) {
      Rng r((uint64_t(seq) << 40) ^ (uint64_t(pos) << 8) ^ salt);
      return random_bf16(r, row, sd);
    };

    struct Part {
      int seq, start, n;
    };
    // One step through the f32 entry point (the model's), workspace sized as the model does.
    auto run = [&](const std::vector<Part>& parts) {
      std::vector<SeqSpec> seqs;
      std::vector<float> q, g;
      for (const Part& p : parts) {
        seqs.push_back({p.start, p.n, 0, ctx[size_t(p.seq)].blocks});
        for (int t = 0; t < p.n; ++t) {
          const auto qq = query(p.seq, p.start + t, 1, 3.0f), gg = query(p.seq, p.start + t, 2, 2.0f);
          q.insert(q.end(), qq.begin(), qq.end());
          g.insert(g.end(), gg.begin(), gg.end());
        }
      }
      DeviceStepMeta meta(seqs, max_blocks);
      const int M = meta.num_tokens();
      const size_t ws_bytes = cuda::paged_attention_workspace_bytes(shape, M, max_blocks * kBlock);
      DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
      auto d_q = to_device_f32(q), d_g = to_device_f32(g);
      DeviceBuffer<float> d_out(q.size());
      cuda::paged_attention(d_q.data(), d_g.data(), shape, meta.meta(), view, scale, ws.data(), ws_bytes,
                            d_out.data(), nullptr);
      return to_host(d_out);
    };
    std::map<std::pair<int, int>, std::vector<float>> alone;  // (sequence, position) -> decode alone
    auto alone_of = [&](int seq, int pos) -> const std::vector<float>& {
      auto it = alone.find({seq, pos});
      if (it == alone.end()) it = alone.emplace(std::make_pair(seq, pos), run({{seq, pos, 1}})).first;
      return it->second;
    };

    const std::vector<std::pair<std::string, std::vector<Part>>> steps{
        {"40-token chunk across the chunk-size doubling at 16384", {{0, 16370, 40}}},
        {"32-token chunk at the end of 20000 positions (split KV)", {{0, 19968, 32}}},
        {"10-token chunk with two chunk sizes in one tile (split KV)", {{0, 16380, 10}}},
        {"mixed step: chunks and decodes", {{1, 2980, 20}, {0, 19999, 1}, {2, 699, 1}, {3, 0, 40}}},
        {"decode batch", {{0, 19999, 1}, {1, 2999, 1}, {2, 699, 1}, {3, 39, 1}}},
        {"verify batch and a decode (split KV)", {{2, 696, 4}, {1, 2999, 1}}},
        {"40-token chunk across the first chunk boundary", {{2, 240, 40}}},
        {"12-token chunk across the first chunk boundary (split KV)", {{2, 250, 12}}},
    };
    for (const auto& [name, parts] : steps) {
      SCOPED_TRACE(name);
      const auto got = run(parts);
      size_t tok = 0, mismatched = 0;
      std::string first;
      for (const Part& p : parts)
        for (int t = 0; t < p.n; ++t, ++tok) {
          const auto& ref = alone_of(p.seq, p.start + t);
          for (size_t i = 0; i < row; ++i) {
            uint32_t a, b;
            std::memcpy(&a, &got[tok * row + i], 4);
            std::memcpy(&b, &ref[i], 4);
            if (a == b) continue;
            if (mismatched++ == 0)
              first = "sequence " + std::to_string(p.seq) + " position " + std::to_string(p.start + t) + " head " +
                      std::to_string(i / size_t(c.hd)) + " d " + std::to_string(i % size_t(c.hd)) + ": " +
                      std::to_string(got[tok * row + i]) + " in the step, " + std::to_string(ref[i]) + " alone";
          }
        }
      EXPECT_EQ(mismatched, 0u) << name << ": " << mismatched << " values differ from the lone decode; first: "
                                << first;
      std::printf("  %s: %zu tokens, %zu values differ from the lone decode\n", name.c_str(), tok, mismatched);
    }

    // The lone decodes against the CPU op (every position of the short sequences, every 4th
    // and the boundary ones of the long one).
    std::vector<std::pair<int, int>> keys;
    for (const auto& [key, out] : alone)
      if (key.first != 0 || key.second % 4 == 0 || key.second == 16383 || key.second == 16384 ||
          key.second == 19999)
        keys.push_back(key);
    std::vector<float> q_all, g_all, got_all;
    for (const auto& [seq, pos] : keys) {
      const auto qq = query(seq, pos, 1, 3.0f), gg = query(seq, pos, 2, 2.0f);
      q_all.insert(q_all.end(), qq.begin(), qq.end());
      g_all.insert(g_all.end(), gg.begin(), gg.end());
      const auto& o = alone.at({seq, pos});
      got_all.insert(got_all.end(), o.begin(), o.end());
    }
    std::vector<float> o_cpu(q_all.size());
    std::vector<cpu::AttentionChunk> chunks;
    for (size_t i = 0; i < keys.size(); ++i)
      chunks.push_back({q_all.data() + i * row, o_cpu.data() + i * row, 1, keys[i].second,
                        ctx[size_t(keys[i].first)].blocks});
    cpu::paged_attention(pool(), pools.cpu, c.nq, scale, chunks);
    std::vector<float> ref(o_cpu.size());
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = o_cpu[i] * cpu::sigmoid(g_all[i]);
    // fp32 on both sides, different summation orders: ~1e-6 of |v| ≈ 1 in practice.
    EXPECT_TRUE(all_close("paged_attention alone vs CPU " + c.name(), got_all, ref,
                          {int64_t(keys.size()), c.nq, c.hd}, {"query", "head", "d"}, 2e-5, 1e-4));
  }
}

// Decode steps (one token per sequence, at most 64 tokens) take the work-item decode kernel
// (a CTA per (token, chunk, kv head, head block), then the merge kernel). A query's bits
// must not depend on its company: at contexts of 1, 17, 512 and 4100 positions the query alone
// (batch 1), among 63 other sequences (batch 64, another head-block width), in a batch of 5,
// next to a 2-token chunk (the step is no longer a decode: the tile kernel and its merge) and
// as a decode without workspace (the tile kernel folding the chunks in registers) gives the
// same bits; the lone outputs are also checked against the CPU op.
TEST(GpuOpsAttention, DecodeKernelBitIdenticalBatch1VsBatch64) {
  MOESERVE_REQUIRE_GPU();
  // The test shapes (groups of 16, 8, 3 and 3 q heads) and a group of 32 (16 heads per CTA).
  std::vector<AttnCase> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({32, 1, 128, 32});
  for (const AttnCase& c : cases) {
    SCOPED_TRACE(c.name());
    Rng rng(24);
    constexpr int kSeqs = 64;
    const std::vector<int> targets{1, 17, 512, 4100};  // contexts: the query sits at position ctx - 1
    const std::vector<int> target_seq{63, 0, 37, 13};  // their sequences (slots in the batch of 64)
    std::vector<int> lens(kSeqs);
    for (int& len : lens) len = int(rng.integer(1, 600));
    for (size_t k = 0; k < targets.size(); ++k) lens[size_t(target_seq[k])] = targets[k];
    lens[5] = std::max(lens[5], 2);  // sequence 5 also runs as a 2-token chunk
    std::vector<SeqSpec> ctx;
    for (int len : lens) ctx.push_back({0, len, 0, {}});
    const int blocks = assign_shuffled_blocks(rng, ctx, kBlock);
    int max_blocks = 0;
    for (const auto& s : ctx) max_blocks = std::max(max_blocks, int(s.blocks.size()));
    Pools pools(rng, c, blocks);
    for (const auto& s : ctx) {
      const int len = s.num_tokens;
      const auto kk = random_bf16(rng, size_t(len) * c.nkv * c.hd, 1.0f);
      const auto vv = random_bf16(rng, size_t(len) * c.nkv * c.hd, 1.0f);
      pools.cpu.write(s.blocks, 0, len, kk.data(), vv.data());
      for (int p = 0; p < len; ++p)
        for (int h = 0; h < c.nkv; ++h) {
          const size_t dst = pools.offset(c, s.blocks[size_t(p / kBlock)], h, p % kBlock);
          const size_t src = (size_t(p) * c.nkv + h) * c.hd;
          std::copy_n(kk.begin() + long(src), c.hd, pools.k_host.begin() + long(dst));
          std::copy_n(vv.begin() + long(src), c.hd, pools.v_host.begin() + long(dst));
        }
    }
    auto d_k = to_device_bf16(pools.k_host), d_v = to_device_bf16(pools.v_host);
    const cuda::AttentionShape shape{c.nq, c.nkv, c.hd, c.rot, 1e-6f};
    const cuda::KvCacheView view{d_k.data(), d_v.data(), blocks, c.nkv, kBlock, c.hd};
    const float scale = 1.0f / std::sqrt(float(c.hd));
    const size_t row = size_t(c.nq) * c.hd;
    auto query = [&](int seq, int pos, uint64_t salt, float sd) {
      Rng r((uint64_t(seq) << 40) ^ (uint64_t(pos) << 8) ^ salt);
      return random_bf16(r, row, sd);
    };
    struct Part {
      int seq, start, n;
    };
    // One step through the f32 entry point; the workspace sized as the model does (or none).
    auto run = [&](const std::vector<Part>& parts, bool with_workspace) {
      std::vector<SeqSpec> seqs;
      std::vector<float> q, g;
      for (const Part& p : parts) {
        seqs.push_back({p.start, p.n, 0, ctx[size_t(p.seq)].blocks});
        for (int t = 0; t < p.n; ++t) {
          const auto qq = query(p.seq, p.start + t, 1, 3.0f), gg = query(p.seq, p.start + t, 2, 2.0f);
          q.insert(q.end(), qq.begin(), qq.end());
          g.insert(g.end(), gg.begin(), gg.end());
        }
      }
      DeviceStepMeta meta(seqs, max_blocks);
      const int M = meta.num_tokens();
      const size_t ws_bytes =
          with_workspace ? cuda::paged_attention_workspace_bytes(shape, M, max_blocks * kBlock) : 0;
      DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
      auto d_q = to_device_f32(q), d_g = to_device_f32(g);
      DeviceBuffer<float> d_out(q.size());
      cuda::paged_attention(d_q.data(), d_g.data(), shape, meta.meta(), view, scale,
                            with_workspace ? ws.data() : nullptr, ws_bytes, d_out.data(), nullptr);
      return to_host(d_out);
    };
    // Compares the rows of the step (in part order) with the lone decodes of the targets.
    std::vector<std::vector<float>> alone;
    for (size_t k = 0; k < targets.size(); ++k) alone.push_back(run({{target_seq[k], targets[k] - 1, 1}}, true));
    auto check = [&](const std::string& name, const std::vector<Part>& parts, bool with_workspace) {
      SCOPED_TRACE(name);
      const auto got = run(parts, with_workspace);
      size_t tok = 0, compared = 0, mismatched = 0;
      std::string first;
      for (const Part& p : parts)
        for (int t = 0; t < p.n; ++t, ++tok)
          for (size_t k = 0; k < targets.size(); ++k) {
            if (p.seq != target_seq[k] || p.start + t != targets[k] - 1) continue;
            ++compared;
            for (size_t i = 0; i < row; ++i) {
              uint32_t a, b;
              std::memcpy(&a, &got[tok * row + i], 4);
              std::memcpy(&b, &alone[k][i], 4);
              if (a == b) continue;
              if (mismatched++ == 0)
                first = "context " + std::to_string(targets[k]) + " head " + std::to_string(i / size_t(c.hd)) +
                        " d " + std::to_string(i % size_t(c.hd)) + ": " + std::to_string(got[tok * row + i]) +
                        " in the step, " + std::to_string(alone[k][i]) + " alone";
            }
          }
      EXPECT_EQ(compared, targets.size()) << name;
      EXPECT_EQ(mismatched, 0u) << name << ": " << mismatched << " values differ from the lone decode; first: "
                                << first;
      std::printf("  %s: %zu tokens, %zu values differ from the lone decode\n", name.c_str(), tok, mismatched);
    };
    std::vector<Part> batch64, batch5, with_chunk, targets_only;
    for (int s = 0; s < kSeqs; ++s) batch64.push_back({s, lens[size_t(s)] - 1, 1});
    for (size_t k = 0; k < targets.size(); ++k) targets_only.push_back({target_seq[k], targets[k] - 1, 1});
    batch5 = targets_only;
    batch5.insert(batch5.begin() + 2, {5, lens[5] - 1, 1});
    with_chunk = targets_only;
    with_chunk.push_back({5, lens[5] - 2, 2});
    check("decode batch of 64", batch64, true);
    check("decode batch of 5", batch5, true);
    check("the four decodes next to a 2-token chunk (tile kernel, split KV)", with_chunk, true);
    check("the four decodes without workspace (tile kernel, one CTA per query tile)", targets_only, false);

    // The lone decodes against the CPU op.
    std::vector<float> q_all, g_all, got_all;
    std::vector<cpu::AttentionChunk> chunks;
    for (size_t k = 0; k < targets.size(); ++k) {
      const auto qq = query(target_seq[k], targets[k] - 1, 1, 3.0f), gg = query(target_seq[k], targets[k] - 1, 2, 2.0f);
      q_all.insert(q_all.end(), qq.begin(), qq.end());
      g_all.insert(g_all.end(), gg.begin(), gg.end());
      got_all.insert(got_all.end(), alone[k].begin(), alone[k].end());
    }
    std::vector<float> o_cpu(q_all.size());
    for (size_t k = 0; k < targets.size(); ++k)
      chunks.push_back({q_all.data() + k * row, o_cpu.data() + k * row, 1, targets[k] - 1,
                        ctx[size_t(target_seq[k])].blocks});
    cpu::paged_attention(pool(), pools.cpu, c.nq, scale, chunks);
    std::vector<float> ref(o_cpu.size());
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = o_cpu[i] * cpu::sigmoid(g_all[i]);
    EXPECT_TRUE(all_close("decode kernel alone vs CPU " + c.name(), got_all, ref,
                          {int64_t(targets.size()), c.nq, c.hd}, {"query", "head", "d"}, 2e-5, 1e-4));
  }
}

// attention_prepare followed at once by paged_attention on one stream, as the model runs them:
// the decode kernel is a programmatic dependent launch that starts while attention_prepare
// runs (it copies the older K/V rows before it waits) and the merge kernel one of the decode
// kernel. Every repetition must give the bits of the same two calls with a synchronisation in
// between. The new tokens' cache rows hold large garbage until attention_prepare writes them,
// and the contexts put the new token in the first, second or a later tile of its chunk, so a
// copy of its tile made too early would show.
namespace {

// attention_prepare then paged_attention on one stream without a synchronisation, 20 times,
// against the same two calls with one; lens: the decode tokens' contexts (their positions + 1).
// tensor_cores: through paged_attention_generated's tensor-core kernel instead. prepared: the
// repetitions run paged_attention_generated_prepared (one launch) instead of the two calls, and the
// cache's new rows must match too.
void check_decode_after_prepare(const std::vector<int>& lens, bool tensor_cores = false, bool prepared = false) {
  const AttnCase c{32, 2, 256, 64};
  Rng rng(25);
  std::vector<SeqSpec> seqs;
  for (int len : lens) seqs.push_back({len - 1, 1, 0, {}});
  const int blocks = assign_shuffled_blocks(rng, seqs, kBlock);
  int max_blocks = 0;
  for (const auto& s : seqs) max_blocks = std::max(max_blocks, int(s.blocks.size()));
  DeviceStepMeta meta(seqs, max_blocks);
  const int M = meta.num_tokens();
  Pools pools(rng, c, blocks);  // garbage everywhere, then the older positions
  for (const auto& s : seqs) {
    const int len = s.start_pos;
    const auto kk = random_bf16(rng, size_t(len) * c.nkv * c.hd, 1.0f);
    const auto vv = random_bf16(rng, size_t(len) * c.nkv * c.hd, 1.0f);
    for (int p = 0; p < len; ++p)
      for (int h = 0; h < c.nkv; ++h) {
        const size_t dst = pools.offset(c, s.blocks[size_t(p / kBlock)], h, p % kBlock);
        const size_t src = (size_t(p) * c.nkv + h) * c.hd;
        std::copy_n(kk.begin() + long(src), c.hd, pools.k_host.begin() + long(dst));
        std::copy_n(vv.begin() + long(src), c.hd, pools.v_host.begin() + long(dst));
      }
  }
  const cpu::RotaryEmbedding rope(c.rot, 1e7);
  const auto qg = random_f32(rng, size_t(M) * c.nq * 2 * c.hd, 2.0f);
  const auto k = random_f32(rng, size_t(M) * c.nkv * c.hd, 2.0f);
  const auto v = random_f32(rng, size_t(M) * c.nkv * c.hd, 1.0f);
  const auto qn = random_f32(rng, size_t(c.hd), 0.3f), kn = random_f32(rng, size_t(c.hd), 0.3f);
  auto d_qg = to_device_f32(qg), d_kk = to_device_f32(k), d_vv = to_device_f32(v);
  auto d_qn = to_device_f32(qn), d_kn = to_device_f32(kn), d_freq = to_device_f32(rope.inv_freq());
  const cuda::AttentionShape shape{c.nq, c.nkv, c.hd, c.rot, 1e-6f};
  const size_t ws_bytes = cuda::paged_attention_workspace_bytes(shape, M, max_blocks * kBlock);
  DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
  DeviceBuffer<float> d_q(size_t(M) * c.nq * c.hd), d_gate(d_q.size()), d_out(d_q.size());
  auto d_k_pool = to_device_bf16(pools.k_host), d_v_pool = to_device_bf16(pools.v_host);
  const cuda::KvCacheView view{d_k_pool.data(), d_v_pool.data(), blocks, c.nkv, kBlock, c.hd};
  const auto k_garbage = to_device_bf16(pools.k_host), v_garbage = to_device_bf16(pools.v_host);
  const float scale = 1.0f / std::sqrt(float(c.hd));
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  auto run = [&](bool sync, bool one_launch) {
    // The cache as before the step (the new rows garbage again), q, gate and out cleared.
    const size_t pool_bytes = pools.k_host.size() * sizeof(bf16);
    EXPECT_EQ(cudaMemcpyAsync(d_k_pool.data(), k_garbage.data(), pool_bytes, cudaMemcpyDeviceToDevice, st),
              cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(d_v_pool.data(), v_garbage.data(), pool_bytes, cudaMemcpyDeviceToDevice, st),
              cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(d_q.data(), 0xff, d_q.size() * sizeof(float), st), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(d_gate.data(), 0xff, d_gate.size() * sizeof(float), st), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(d_out.data(), 0xff, d_out.size() * sizeof(float), st), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    if (one_launch) {
      EXPECT_TRUE(cuda::paged_attention_generated_prepared(d_qg.data(), d_kk.data(), d_vv.data(), d_qn.data(),
                                                           d_kn.data(), d_freq.data(), shape, meta.meta(), view, scale,
                                                           ws.data(), ws_bytes, d_out.data(), st));
    } else {
      cuda::attention_prepare(d_qg.data(), d_kk.data(), d_vv.data(), d_qn.data(), d_kn.data(), d_freq.data(), shape,
                              meta.meta(), view, d_q.data(), d_gate.data(), st);
      if (sync) EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      cuda::paged_attention_generated(d_q.data(), d_gate.data(), shape, meta.meta(), view, scale, tensor_cores,
                                      ws.data(), ws_bytes, d_out.data(), st);
    }
    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    return to_host(d_out);
  };
  const auto ref = run(true, false);
  const auto k_ref = to_host(d_k_pool), v_ref = to_host(d_v_pool);  // bf16 -> f32 is exact
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  size_t finite = 0;
  for (float x : ref) finite += std::isfinite(x) ? 1 : 0;
  EXPECT_EQ(finite, ref.size()) << "the synchronised run left non-finite outputs";
  for (int rep = 0; rep < 20; ++rep) {
    const auto got = run(false, prepared);
    if (prepared) {
      EXPECT_TRUE(same_bits(to_host(d_k_pool), k_ref)) << "repetition " << rep << ": the K cache differs";
      EXPECT_TRUE(same_bits(to_host(d_v_pool), v_ref)) << "repetition " << rep << ": the V cache differs";
    }
    size_t mismatched = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &ref[i], 4);
      if (a != b && mismatched++ == 0) first = i;
    }
    const size_t row = size_t(c.nq) * c.hd;
    EXPECT_EQ(mismatched, 0u) << "repetition " << rep << ": " << mismatched << " values differ; first: context "
                              << lens[first / row] << " head " << (first % row) / size_t(c.hd) << ": "
                              << got[first] << " vs " << ref[first];
    if (mismatched) break;
  }
  cudaStreamDestroy(st);
}

}  // namespace

TEST(GpuOpsAttention, DecodeAfterPrepareMatchesSynchronised) {
  MOESERVE_REQUIRE_GPU();
  // 9 tokens: the work-item decode kernel.
  check_decode_after_prepare({1, 17, 33, 64, 65, 512, 513, 1000, 4100});
}

// The tensor-core decode kernel (paged_attention_generated): it prefetches the first item's K / V
// rows into L2 before the wait, the new token's included. 9 tokens, and a lone decode.
TEST(GpuOpsAttention, DecodeTensorCoresAfterPrepareMatchesSynchronised) {
  MOESERVE_REQUIRE_GPU();
  check_decode_after_prepare({1, 17, 33, 64, 65, 512, 513, 1000, 4100}, true);
  check_decode_after_prepare({513}, true);
}

// The same with 8 tokens (the tile-parallel kernel): the new token in the first, second or
// last tile of a 64-position round, in the first tile of a chunk, and in the first and second
// round of a 128-position chunk (contexts above 4096).
TEST(GpuOpsAttention, DecodeTileParallelAfterPrepareMatchesSynchronised) {
  MOESERVE_REQUIRE_GPU();
  const int saved = cuda::attention_decode_variant();
  cuda::set_attention_decode_variant(2);  // the tile-parallel kernel up to 8 tokens
  check_decode_after_prepare({1, 17, 64, 65, 513, 1000, 4100, 4180});
  cuda::set_attention_decode_variant(saved);
}

// paged_attention_generated_prepared (attention_prepare's work inside the tile-parallel decode kernel,
// one launch) gives the bits of attention_prepare followed by the decode kernel: the outputs and the
// cache's new K / V rows, at 1 and 2 tokens (variant 1) and at 8 (variant 2), the new token in every
// place of its round and chunk; where the kernel does not serve the step (9 tokens) it declines.
TEST(GpuOpsAttention, DecodeTileParallelPreparedMatchesPrepareThenDecode) {
  MOESERVE_REQUIRE_GPU();
  check_decode_after_prepare({513}, false, true);
  check_decode_after_prepare({1, 4180}, false, true);
  check_decode_after_prepare({65}, false, true);
  const int saved = cuda::attention_decode_variant();
  cuda::set_attention_decode_variant(2);  // the tile-parallel kernel up to 8 tokens
  check_decode_after_prepare({1, 17, 64, 65, 513, 1000, 4100, 4180}, false, true);
  cuda::set_attention_decode_variant(saved);
  // Nine tokens: the work-item kernel, so the one-launch form declines (and writes nothing).
  const cuda::AttentionShape shape{32, 2, 256, 64, 1e-6f};
  Rng rng(3);
  std::vector<SeqSpec> seqs;
  for (int i = 0; i < 9; ++i) seqs.push_back({10 + i, 1, 0, {}});
  const int blocks = assign_shuffled_blocks(rng, seqs, kBlock);
  int max_blocks = 0;
  for (const auto& sq : seqs) max_blocks = std::max(max_blocks, int(sq.blocks.size()));
  DeviceStepMeta meta(seqs, max_blocks);
  DeviceBuffer<bf16> kp(size_t(blocks) * 2 * kBlock * 256), vp(kp.size());
  const cuda::KvCacheView view{kp.data(), vp.data(), blocks, 2, kBlock, 256};
  DeviceBuffer<float> qg(size_t(9) * 32 * 512), kk(size_t(9) * 2 * 256), out(size_t(9) * 32 * 256), w(256);
  const size_t ws_bytes = cuda::paged_attention_workspace_bytes(shape, 9, max_blocks * kBlock);
  DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
  EXPECT_FALSE(cuda::paged_attention_generated_prepared(qg.data(), kk.data(), kk.data(), w.data(), w.data(), w.data(),
                                                        shape, meta.meta(), view, 0.0625f, ws.data(), ws_bytes,
                                                        out.data(), nullptr));
}

// The tile-parallel decode kernel (decode steps of <= 2 tokens under the default variant 1, <= 8
// under variant 2: a
// CTA per (token, chunk, kv head, 4 q heads) computing a round of 4 tiles side by side) gives
// the bits of the work-item decode kernel (variant 0) and of the tile kernel (no workspace: one
// CTA per query walking all its chunks in registers). Contexts 1, 63, 64, 65 (one chunk, one
// full chunk, the first split), 512, 4096 (the last 64-position chunking), 4097 and 8200
// (128- and 256-position chunks: several rounds per chunk, and a CTA walks several items), alone
// (batch 1), three of them (batch 3), all eight (batch 8), and among 56 other sequences (batch
// 64: the work-item kernel). Outputs start as NaN, so an output never written shows. (The
// tile-parallel kernel takes head dims of 8·2^k: here 256 and 128; the shapes with head_dim 24
// and 72 check that their decode steps keep the bits through the work-item kernel.)
TEST(GpuOpsAttention, DecodeTileParallelBitIdenticalToTileKernel) {
  MOESERVE_REQUIRE_GPU();
  std::vector<AttnCase> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({32, 1, 128, 32});  // a group of 32: 8 head blocks per kv head
  struct VariantReset {
    int saved = cuda::attention_decode_variant();
    int saved_stages = cuda::attention_decode_stages();
    ~VariantReset() {
      cuda::set_attention_decode_variant(saved);
      cuda::set_attention_decode_stages(saved_stages);
    }
  } variant_reset;
  EXPECT_THROW(cuda::set_attention_decode_stages(0), Error);
  EXPECT_THROW(cuda::set_attention_decode_stages(3), Error);
  for (const AttnCase& c : cases) {
    SCOPED_TRACE(c.name());
    Rng rng(26);
    constexpr int kSeqs = 64;
    const std::vector<int> targets{1, 63, 64, 65, 512, 4096, 4097, 8200};  // contexts: position ctx - 1
    std::vector<int> target_seq;
    std::vector<int> lens(kSeqs);
    for (int& len : lens) len = int(rng.integer(1, 700));
    for (size_t k = 0; k < targets.size(); ++k) {
      target_seq.push_back(int(k) * 8 + 3);
      lens[size_t(target_seq.back())] = targets[k];
    }
    std::vector<SeqSpec> ctx;
    for (int len : lens) ctx.push_back({0, len, 0, {}});
    const int blocks = assign_shuffled_blocks(rng, ctx, kBlock);
    int max_blocks = 0;
    for (const auto& s : ctx) max_blocks = std::max(max_blocks, int(s.blocks.size()));
    Pools pools(rng, c, blocks);
    for (const auto& s : ctx) {
      const int len = s.num_tokens;
      const auto kk = random_bf16(rng, size_t(len) * c.nkv * c.hd, 1.0f);
      const auto vv = random_bf16(rng, size_t(len) * c.nkv * c.hd, 1.0f);
      for (int p = 0; p < len; ++p)
        for (int h = 0; h < c.nkv; ++h) {
          const size_t dst = pools.offset(c, s.blocks[size_t(p / kBlock)], h, p % kBlock);
          const size_t src = (size_t(p) * c.nkv + h) * c.hd;
          std::copy_n(kk.begin() + long(src), c.hd, pools.k_host.begin() + long(dst));
          std::copy_n(vv.begin() + long(src), c.hd, pools.v_host.begin() + long(dst));
        }
    }
    auto d_k = to_device_bf16(pools.k_host), d_v = to_device_bf16(pools.v_host);
    const cuda::AttentionShape shape{c.nq, c.nkv, c.hd, c.rot, 1e-6f};
    const cuda::KvCacheView view{d_k.data(), d_v.data(), blocks, c.nkv, kBlock, c.hd};
    const float scale = 1.0f / std::sqrt(float(c.hd));
    const size_t row = size_t(c.nq) * c.hd;
    auto query = [&](int seq, int pos, uint64_t salt, float sd) {
      Rng r((uint64_t(seq) << 40) ^ (uint64_t(pos) << 8) ^ salt);
      return random_bf16(r, row, sd);
    };
    // One decode step (the last position of each listed sequence) through the f32 entry point.
    auto run = [&](const std::vector<int>& seq_ids, bool with_workspace, int variant) {
      cuda::set_attention_decode_variant(variant);
      std::vector<SeqSpec> seqs;
      std::vector<float> q, g;
      for (int sid : seq_ids) {
        const int pos = lens[size_t(sid)] - 1;
        seqs.push_back({pos, 1, 0, ctx[size_t(sid)].blocks});
        const auto qq = query(sid, pos, 1, 3.0f), gg = query(sid, pos, 2, 2.0f);
        q.insert(q.end(), qq.begin(), qq.end());
        g.insert(g.end(), gg.begin(), gg.end());
      }
      DeviceStepMeta meta(seqs, max_blocks);
      const int M = meta.num_tokens();
      const size_t ws_bytes =
          with_workspace ? cuda::paged_attention_workspace_bytes(shape, M, max_blocks * kBlock) : 0;
      DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
      auto d_q = to_device_f32(q), d_g = to_device_f32(g);
      DeviceBuffer<float> d_out(q.size());
      EXPECT_EQ(cudaMemset(d_out.data(), 0xff, d_out.bytes()), cudaSuccess);  // NaN
      cuda::paged_attention(d_q.data(), d_g.data(), shape, meta.meta(), view, scale,
                            with_workspace ? ws.data() : nullptr, ws_bytes, d_out.data(), nullptr);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      return to_host(d_out);
    };
    // The references: each target alone through the tile kernel.
    std::vector<std::vector<float>> ref;
    for (size_t k = 0; k < targets.size(); ++k) {
      ref.push_back(run({target_seq[k]}, false, 1));
      size_t finite = 0;
      for (float x : ref.back()) finite += std::isfinite(x) ? 1 : 0;
      EXPECT_EQ(finite, row) << "tile kernel, context " << targets[k];
    }
    auto check = [&](const std::string& name, const std::vector<int>& seq_ids, bool with_workspace, int variant) {
      SCOPED_TRACE(name);
      const auto got = run(seq_ids, with_workspace, variant);
      size_t compared = 0, mismatched = 0;
      std::string first;
      for (size_t tok = 0; tok < seq_ids.size(); ++tok)
        for (size_t k = 0; k < targets.size(); ++k) {
          if (seq_ids[tok] != target_seq[k]) continue;
          ++compared;
          for (size_t i = 0; i < row; ++i) {
            uint32_t a, b;
            std::memcpy(&a, &got[tok * row + i], 4);
            std::memcpy(&b, &ref[k][i], 4);
            if (a == b) continue;
            if (mismatched++ == 0)
              first = "context " + std::to_string(targets[k]) + " head " + std::to_string(i / size_t(c.hd)) +
                      " d " + std::to_string(i % size_t(c.hd)) + ": " + std::to_string(got[tok * row + i]) +
                      " vs " + std::to_string(ref[k][i]) + " (tile kernel)";
          }
        }
      EXPECT_GT(compared, 0u) << name;
      EXPECT_EQ(mismatched, 0u) << name << ": " << mismatched << " values differ from the tile kernel; first: "
                                << first;
      std::printf("  %s: %zu tokens, %zu values differ from the tile kernel\n", name.c_str(), seq_ids.size(),
                  mismatched);
    };
    for (size_t k = 0; k < targets.size(); ++k) {
      const std::string ctx_name = "context " + std::to_string(targets[k]);
      check(ctx_name + " alone, tile-parallel kernel", {target_seq[k]}, true, 1);
      check(ctx_name + " alone, work-item kernel", {target_seq[k]}, true, 0);
    }
    check("batch 3 (contexts 65, 4096, 1), variant 2 (tile-parallel kernel)",
          {target_seq[3], target_seq[5], target_seq[0]}, true, 2);
    check("batch 2 (contexts 8200, 63), variant 1 (tile-parallel kernel)", {target_seq[7], target_seq[1]}, true, 1);
    std::vector<int> all8(target_seq.rbegin(), target_seq.rend());
    check("batch 8, variant 2 (tile-parallel kernel)", all8, true, 2);
    check("batch 8, work-item kernel", all8, true, 0);
    check("batch 3, variant 1 (work-item kernel)", {target_seq[6], target_seq[1], target_seq[4]}, true, 1);
    check("batch 8, variant 1 (work-item kernel)", all8, true, 1);
    // The tile-parallel kernel with one K/V round in shared memory (the DGX Spark's form; the
    // checks above ran the default, two rounds where they fit).
    cuda::set_attention_decode_stages(1);
    check("context 8200 alone, tile-parallel kernel, one round in shared memory", {target_seq[7]}, true, 1);
    check("batch 8, variant 2 (tile-parallel kernel), one round in shared memory", all8, true, 2);
    cuda::set_attention_decode_stages(2);
    std::vector<int> all64;
    for (int sid = 0; sid < kSeqs; ++sid) all64.push_back(sid);
    check("batch 64 (work-item kernel)", all64, true, 1);
  }
}
