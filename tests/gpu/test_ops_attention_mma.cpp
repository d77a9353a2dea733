// paged_attention_prefill (ops_attention.h, ops_attention_mma.cu: tensor-core attention for
// prompt-class tokens) against the CPU attention, and its invariance:
//   MatchesCpu: one step with prompts of 1, 17, 300 and 1100 tokens in one pass and chunks at
//     start_pos > 0, over shuffled block tables in a pool of garbage, at the 122B shape (32 q heads,
//     2 kv heads, head_dim 256), the 35B-like (16 / 4, 128) and an odd group (6 / 2, 64);
//     max |got − ref| / max |ref| < 2e-3 (printed);
//   ChunkingAndBatchInvariant: one prompt in one pass == in chunks of 7 == in chunks of 64 ==
//     token by token == sharing the step with two other sequences (seq_begin > 0, row_begin > 0,
//     a decode-class row before the range that must stay untouched): bit-equal outputs.
//   WideKernelMatchesFourWarpBitForBit: the wide kernel (prefill variant 1, the default where it
//     fits) against the 4-warp kernel (variant 0) on the MatchesCpu step and on a sub-range of it
//     (seq_begin > 0), at block sizes 16 and 12 (the shift and the division paths of the wide
//     kernel's row addressing) and at one more shape (64 / 1, 64: group 64, two tokens per wide
//     CTA): bit-equal outputs (same arithmetic contract), rows outside the range untouched.
// q and gate are f32 (not bf16-representable: the hi/lo split is exercised); the cache is bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/activations.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/paged_kv_cache.h"
#include "backend/cuda/ops_attention.h"
#include "core/thread_pool.h"
#include "attention_mma_test_util.h"
#include "gpu_test_util.h"

using namespace moeserve;
using namespace moeserve::gputest;

namespace {

constexpr int kBlock = kMmaBlock;

const MmaCase kMmaCases[] = {{32, 2, 256}, {16, 4, 128}, {6, 2, 64}};

}  // namespace

TEST(GpuOpsAttentionMma, MatchesCpu) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(71);
  for (const MmaCase& c : kMmaCases) {
    SCOPED_TRACE(c.name());
    // Prompts in one pass (1, 17, 300, 1100 tokens) and chunks continuing earlier context.
    std::vector<SeqSpec> seqs{{0, 1, 0, {}},    {0, 17, 0, {}},  {0, 300, 0, {}},
                              {0, 1100, 0, {}}, {650, 450, 0, {}}, {33, 7, 0, {}}};
    const FilledStep step(rng, c, seqs);
    const KvPools& pools = step.pools;
    const DeviceStepMeta& meta = step.meta;
    const auto &q = step.q, &gate = step.gate;
    const int M = meta.num_tokens(), blocks = step.blocks;
    const size_t row = size_t(c.nq) * c.hd;
    const float scale = 1.0f / std::sqrt(float(c.hd));
    const auto ref = cpu_gated_attention(pools, seqs, meta, q, gate);

    auto d_k = to_device_bf16(pools.k_host), d_v = to_device_bf16(pools.v_host);
    auto d_q = to_device_f32(q), d_g = to_device_f32(gate);
    const cuda::AttentionShape shape{c.nq, c.nkv, c.hd, c.hd / 4, 1e-6f};
    const cuda::KvCacheView view{d_k.data(), d_v.data(), blocks, c.nkv, kBlock, c.hd};
    const size_t ws_bytes = cuda::paged_attention_prefill_workspace_bytes(shape, M, 2048);
    DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
    DeviceBuffer<float> d_out(q.size());
    cuda::paged_attention_prefill(d_q.data(), d_g.data(), shape, meta.meta(), view, scale, 0, int(seqs.size()), 0, M,
                                  ws.data(), ws_bytes, d_out.data(), nullptr);
    sync_device();
    const auto got = to_host(d_out);
    const auto all = error_stats(got, ref);
    std::printf("  [%s] all: max abs err / max |ref| = %.3e (rms rel %.3e)\n", c.name().c_str(), all.rel,
                all.rms_rel);
    EXPECT_LT(all.rel, 2e-3) << c.name();
    for (size_t i = 0; i < seqs.size(); ++i) {
      const size_t b = size_t(meta.seq_token_start[i]) * row, e = size_t(meta.seq_token_start[i + 1]) * row;
      const auto es = error_stats(std::vector<float>(got.begin() + long(b), got.begin() + long(e)),
                                  std::vector<float>(ref.begin() + long(b), ref.begin() + long(e)));
      std::printf("  seq %zu: start %d, %d tokens: max abs err / max |ref| = %.3e (rms rel %.3e)\n", i,
                  seqs[i].start_pos, seqs[i].num_tokens, es.rel, es.rms_rel);
      EXPECT_LT(es.rel, 2e-3) << "sequence " << i << " (start " << seqs[i].start_pos << ", " << seqs[i].num_tokens
                              << " tokens)";
    }
  }
}

TEST(GpuOpsAttentionMma, ChunkingAndBatchInvariant) {
  MOESERVE_REQUIRE_GPU();
  for (const MmaCase& c : kMmaCases) {
    SCOPED_TRACE(c.name());
    Rng rng(72);
    constexpr int kLen = 300;  // the prompt
    // Sequences with their whole context in the cache: the prompt, a decode-class one (context
    // 101) and another prompt (45 tokens).
    std::vector<SeqSpec> ctx{{0, kLen, 0, {}}, {0, 101, 0, {}}, {0, 45, 0, {}}};
    const int blocks = assign_shuffled_blocks(rng, ctx, kBlock);
    KvPools pools(rng, c, blocks);
    for (const auto& s : ctx) pools.fill(rng, s.blocks, s.num_tokens);
    const int max_blocks = max_table(ctx);
    auto d_k = to_device_bf16(pools.k_host), d_v = to_device_bf16(pools.v_host);
    const cuda::AttentionShape shape{c.nq, c.nkv, c.hd, c.hd / 4, 1e-6f};
    const cuda::KvCacheView view{d_k.data(), d_v.data(), blocks, c.nkv, kBlock, c.hd};
    const float scale = 1.0f / std::sqrt(float(c.hd));
    const size_t row = size_t(c.nq) * c.hd;
    // q and gate of every position of every sequence.
    std::vector<std::vector<float>> q_of, g_of;
    for (const auto& s : ctx) {
      q_of.push_back(random_f32(rng, size_t(s.num_tokens) * row, 3.0f));
      g_of.push_back(random_f32(rng, size_t(s.num_tokens) * row, 2.0f));
    }

    struct Part {
      int seq, start, n;
    };
    constexpr float kSentinel = 12345.0f;
    // One step of `parts`; paged_attention_prefill over sequences [seq_begin, parts.size()) and
    // their rows. Returns the whole output (rows before the range keep the sentinel).
    auto run = [&](const std::vector<Part>& parts, int seq_begin) {
      std::vector<SeqSpec> seqs;
      std::vector<float> q, g;
      int row_begin = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        const Part& p = parts[i];
        seqs.push_back({p.start, p.n, 0, ctx[size_t(p.seq)].blocks});
        if (int(i) < seq_begin) row_begin += p.n;
        q.insert(q.end(), q_of[size_t(p.seq)].begin() + long(size_t(p.start) * row),
                 q_of[size_t(p.seq)].begin() + long(size_t(p.start + p.n) * row));
        g.insert(g.end(), g_of[size_t(p.seq)].begin() + long(size_t(p.start) * row),
                 g_of[size_t(p.seq)].begin() + long(size_t(p.start + p.n) * row));
      }
      DeviceStepMeta meta(seqs, max_blocks);
      const int M = meta.num_tokens();
      const size_t ws_bytes = cuda::paged_attention_prefill_workspace_bytes(shape, M, max_blocks * kBlock);
      DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
      auto d_q = to_device_f32(q), d_g = to_device_f32(g);
      auto d_out = to_device_f32(std::vector<float>(q.size(), kSentinel));
      cuda::paged_attention_prefill(d_q.data(), d_g.data(), shape, meta.meta(), view, scale, seq_begin,
                                    int(parts.size()), row_begin, M - row_begin, ws.data(), ws_bytes, d_out.data(),
                                    nullptr);
      sync_device();
      return to_host(d_out);
    };

    // The reference: the prompt in one pass.
    const auto one_pass = run({{0, 0, kLen}}, 0);
    // Compares `got` rows [row0, row0 + n) with the one-pass rows of positions [start, start + n).
    size_t mismatched = 0;
    std::string first;
    auto compare = [&](const std::string& what, const std::vector<float>& got, size_t row0, int start, int n) {
      for (int t = 0; t < n; ++t)
        for (size_t i = 0; i < row; ++i) {
          const float a = got[(row0 + size_t(t)) * row + i], b = one_pass[size_t(start + t) * row + i];
          uint32_t ua, ub;
          std::memcpy(&ua, &a, 4);
          std::memcpy(&ub, &b, 4);
          if (ua == ub) continue;
          if (mismatched++ == 0)
            first = what + ": position " + std::to_string(start + t) + " head " + std::to_string(i / size_t(c.hd)) +
                    " d " + std::to_string(i % size_t(c.hd)) + ": " + std::to_string(a) + " vs one pass " +
                    std::to_string(b);
        }
    };
    auto report = [&](const std::string& what) {
      EXPECT_EQ(mismatched, 0u) << what << ": " << mismatched << " values differ from the one-pass prompt; first: "
                                << first;
      std::printf("  [%s] %s: %zu values differ from the one pass\n", c.name().c_str(), what.c_str(), mismatched);
      mismatched = 0;
      first.clear();
    };

    for (int chunk : {7, 64}) {
      const std::string what = "chunks of " + std::to_string(chunk);
      for (int s = 0; s < kLen; s += chunk) {
        const int n = std::min(chunk, kLen - s);
        compare(what, run({{0, s, n}}, 0), 0, s, n);
      }
      report(what);
    }
    for (int p = 0; p < kLen; ++p) compare("token by token", run({{0, p, 1}}, 0), 0, p, 1);
    report("token by token");

    // Shared step: [decode-class row of sequence 1 at position 100][sequence 2's 45-token prompt]
    // [the prompt]; the call covers sequences 1..2 (rows 1..).
    const auto shared = run({{1, 100, 1}, {2, 0, 45}, {0, 0, kLen}}, 1);
    compare("shared step", shared, 1 + 45, 0, kLen);
    report("shared step");
    size_t touched = 0;
    for (size_t i = 0; i < row; ++i) touched += shared[i] != kSentinel;
    EXPECT_EQ(touched, 0u) << "the decode-class row before row_begin was written";
    // The shared step's prompt rows start mid-CTA relative to the step (row_begin = 1 + 45) and the
    // other prompt's rows are valid too (not the sentinel, finite).
    size_t bad = 0;
    for (size_t i = row; i < (1 + 45) * row; ++i) bad += !std::isfinite(shared[i]) || shared[i] == kSentinel;
    EXPECT_EQ(bad, 0u) << "the other prompt's rows in the shared step";
  }
}

TEST(GpuOpsAttentionMma, WideKernelMatchesFourWarpBitForBit) {
  MOESERVE_REQUIRE_GPU();
  struct VariantGuard {  // restores the process-wide switch
    int saved = cuda::attention_prefill_variant();
    ~VariantGuard() { cuda::set_attention_prefill_variant(saved); }
  } guard;
  std::vector<MmaCase> cases(std::begin(kMmaCases), std::end(kMmaCases));
  cases.push_back({64, 1, 64});
  for (const MmaCase& c : cases)
    for (int block : {16, 12}) {
      const std::string name = c.name() + " block=" + std::to_string(block);
      SCOPED_TRACE(name);
      Rng rng(73);
      std::vector<SeqSpec> seqs{{0, 1, 0, {}},    {0, 17, 0, {}},    {0, 300, 0, {}},
                                {0, 1100, 0, {}}, {650, 450, 0, {}}, {33, 7, 0, {}}};
      const int blocks = assign_shuffled_blocks(rng, seqs, block);
      // Random bf16 K / V everywhere (the kernels only read the positions the tables cover).
      const size_t pool = size_t(blocks) * c.nkv * block * c.hd;
      auto d_k = to_device_bf16(random_bf16(rng, pool, 1.0f)), d_v = to_device_bf16(random_bf16(rng, pool, 1.0f));
      DeviceStepMeta meta(seqs, max_table(seqs));
      const int M = meta.num_tokens();
      const size_t row = size_t(c.nq) * c.hd;
      auto d_q = to_device_f32(random_f32(rng, size_t(M) * row, 3.0f));
      auto d_g = to_device_f32(random_f32(rng, size_t(M) * row, 2.0f));
      const cuda::AttentionShape shape{c.nq, c.nkv, c.hd, c.hd / 4, 1e-6f};
      const cuda::KvCacheView view{d_k.data(), d_v.data(), blocks, c.nkv, block, c.hd};
      const float scale = 1.0f / std::sqrt(float(c.hd));
      constexpr float kSentinel = 12345.0f;
      auto run = [&](int variant, int seq_begin) {
        cuda::set_attention_prefill_variant(variant);
        const int row_begin = meta.seq_token_start[size_t(seq_begin)];
        auto d_out = to_device_f32(std::vector<float>(size_t(M) * row, kSentinel));
        cuda::paged_attention_prefill(d_q.data(), d_g.data(), shape, meta.meta(), view, scale, seq_begin,
                                      int(seqs.size()), row_begin, M - row_begin, nullptr, 0, d_out.data(), nullptr);
        sync_device();
        return to_host(d_out);
      };
      for (int seq_begin : {0, 2}) {
        const auto four = run(0, seq_begin), wide = run(1, seq_begin);
        const size_t row_begin = size_t(meta.seq_token_start[size_t(seq_begin)]);
        size_t differ = 0, untouched_bad = 0, nonfinite = 0;
        std::string first;
        for (size_t i = 0; i < wide.size(); ++i) {
          if (i < row_begin * row) {
            untouched_bad += (wide[i] != kSentinel) + (four[i] != kSentinel);
            continue;
          }
          nonfinite += !std::isfinite(wide[i]);
          uint32_t ua, ub;
          std::memcpy(&ua, &wide[i], 4);
          std::memcpy(&ub, &four[i], 4);
          if (ua != ub && differ++ == 0)
            first = "row " + std::to_string(i / row) + " head " + std::to_string(i % row / size_t(c.hd)) + " d " +
                    std::to_string(i % size_t(c.hd)) + ": wide " + std::to_string(wide[i]) + " vs 4-warp " +
                    std::to_string(four[i]);
        }
        std::printf("  [%s] seq_begin %d: %zu values differ (wide vs 4-warp)\n", name.c_str(), seq_begin, differ);
        EXPECT_EQ(differ, 0u) << "seq_begin " << seq_begin << ": first: " << first;
        EXPECT_EQ(untouched_bad, 0u) << "rows before row_begin were written";
        EXPECT_EQ(nonfinite, 0u) << "non-finite outputs";
      }
    }
}
