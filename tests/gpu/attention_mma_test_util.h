// Shared by the tensor-core attention tests (test_ops_attention_mma.cpp: prompt tokens;
// test_ops_attention_decode_tc.cpp: generated tokens): the test shapes, a paged bf16 KV pool on the
// GPU with its fp32 copy on the CPU, and a thread pool for the CPU reference.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/activations.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/paged_kv_cache.h"
#include "core/thread_pool.h"
#include "gpu_test_util.h"

namespace moeserve::gputest {

constexpr int kMmaBlock = 16;  // cache positions per block

inline ThreadPool& mma_pool() {
  static ThreadPool p(0);
  return p;
}

struct MmaCase {
  int nq, nkv, hd;
  std::string name() const {
    return "nq=" + std::to_string(nq) + " nkv=" + std::to_string(nkv) + " hd=" + std::to_string(hd);
  }
};

// A bf16 KV pool on the GPU (garbage of size ~1000 everywhere no sequence wrote, so a wrong block
// or slot shows up) and the same contents in fp32 on the CPU.
struct KvPools {
  MmaCase c;
  int blocks;
  std::vector<float> k_host, v_host;  // [blocks][nkv][kMmaBlock][hd]
  cpu::PagedKvCache cpu;
  KvPools(Rng& rng, const MmaCase& cs, int nblocks)
      : c(cs),
        blocks(nblocks),
        k_host(random_bf16(rng, size_t(nblocks) * cs.nkv * kMmaBlock * cs.hd, 1000.0f)),
        v_host(random_bf16(rng, size_t(nblocks) * cs.nkv * kMmaBlock * cs.hd, 1000.0f)),
        cpu(cpu::KvGeometry{cs.nkv, cs.hd, kMmaBlock}, nblocks) {}
  // Random K and V (bf16 values of size ~1) at positions [0, len) of a sequence.
  void fill(Rng& rng, const std::vector<int32_t>& table, int len) {
    const auto kk = random_bf16(rng, size_t(len) * c.nkv * c.hd, 1.0f);
    const auto vv = random_bf16(rng, size_t(len) * c.nkv * c.hd, 1.0f);
    cpu.write(table, 0, len, kk.data(), vv.data());
    for (int p = 0; p < len; ++p)
      for (int h = 0; h < c.nkv; ++h) {
        const size_t dst =
            ((size_t(table[size_t(p / kMmaBlock)]) * c.nkv + h) * kMmaBlock + p % kMmaBlock) * size_t(c.hd);
        const size_t src = (size_t(p) * c.nkv + h) * c.hd;
        std::copy_n(kk.begin() + long(src), c.hd, k_host.begin() + long(dst));
        std::copy_n(vv.begin() + long(src), c.hd, v_host.begin() + long(dst));
      }
  }
};

inline int max_table(const std::vector<SeqSpec>& seqs) {
  int m = 0;
  for (const auto& s : seqs) m = std::max(m, int(s.blocks.size()));
  return m;
}

// A step over `seqs` (their block tables drawn here from a shuffled pool): the pool with random K / V
// at every position up to each sequence's end, the step's metadata on the device, and f32 queries
// (scores with a standard deviation of ~3: a peaked softmax) and gates for its tokens.
struct FilledStep {
  int blocks;
  KvPools pools;
  DeviceStepMeta meta;
  std::vector<float> q, gate;  // [M, nq·hd]
  FilledStep(Rng& rng, const MmaCase& c, std::vector<SeqSpec>& seqs)
      : blocks(assign_shuffled_blocks(rng, seqs, kMmaBlock)), pools(rng, c, blocks), meta(seqs, max_table(seqs)) {
    for (const auto& s : seqs) pools.fill(rng, s.blocks, s.start_pos + s.num_tokens);
    const size_t n = size_t(meta.num_tokens()) * c.nq * c.hd;
    q = random_f32(rng, n, 3.0f);
    gate = random_f32(rng, n, 2.0f);
  }
};

// The CPU reference of a step's gated attention: softmax(q·Kᵀ·scale)·V ⊙ sigmoid(gate) for the
// tokens of `seqs` (rows in sequence order, meta's seq_token_start), from the pool's CPU copy.
inline std::vector<float> cpu_gated_attention(const KvPools& pools, const std::vector<SeqSpec>& seqs,
                                              const DeviceStepMeta& meta, const std::vector<float>& q,
                                              const std::vector<float>& gate) {
  const size_t row = size_t(pools.c.nq) * pools.c.hd;
  std::vector<float> o(q.size());
  std::vector<cpu::AttentionChunk> chunks;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const size_t r = size_t(meta.seq_token_start[i]) * row;
    chunks.push_back({q.data() + r, o.data() + r, seqs[i].num_tokens, seqs[i].start_pos, seqs[i].blocks});
  }
  cpu::paged_attention(mma_pool(), pools.cpu, pools.c.nq, 1.0f / std::sqrt(float(pools.c.hd)), chunks);
  std::vector<float> ref(o.size());
  for (size_t i = 0; i < o.size(); ++i) ref[i] = o[i] * cpu::sigmoid(gate[i]);
  return ref;
}

}  // namespace moeserve::gputest
