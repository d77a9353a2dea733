// Gated DeltaNet on the GPU (ops_gdn.h) against cpu::gated_delta_net (the CPU model's op:
// recurrent for one token, chunked for longer chunks) on one step mixing decode tokens and
// prefill chunks of several sequences in shuffled state slots, some starting from carried
// (non-zero) conv and recurrent states, and on a long (300-token) prefill; and the GPU against
// itself, bit for bit: a chunk followed by single tokens equals the same tokens in one call,
// every sequence of a mixed step equals that sequence alone (batch invariance), a long prefill
// equals itself chunked and token by token, and the f32 entry point equals the bf16 one.
// The op has three launch shapes (one-token-per-sequence steps: the one-launch decode kernel;
// otherwise the prep kernel, then one CTA per head for small decode-like steps or column strips
// plus a norm kernel); these comparisons cross them (single-token steps alone vs in mixed
// steps; DecodeKernelEqualsTwoPassAloneAndPadded forces the two-pass path on a 64-sequence
// decode step), so they also check that all give the same bits.
// Shapes: the 122B-A10B GDN (16 k-heads / 64 v-heads of 128, conv 4), the fixtures'
// (2 / 6 heads, dk 20, dv 12) and an odd one (3 / 9 heads, dk 40, dv 72).
#include <gtest/gtest.h>

#include <cmath>
#include <utility>

#include "backend/cpu/activations.h"
#include "backend/cpu/gated_delta_net.h"
#include "backend/cuda/ops_gdn.h"
#include "core/thread_pool.h"
#include "gpu_test_util.h"

using namespace moeserve;
using namespace moeserve::gputest;

namespace {

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

const cuda::GdnShape kShapes[] = {{16, 64, 128, 128, 4, 1e-6f}, {2, 6, 20, 12, 4, 1e-6f}, {3, 9, 40, 72, 4, 1e-6f}};

std::string name_of(const cuda::GdnShape& s) {
  return "nk=" + std::to_string(s.num_k_heads) + " nv=" + std::to_string(s.num_v_heads) +
         " dk=" + std::to_string(s.k_head_dim) + " dv=" + std::to_string(s.v_head_dim);
}

// One layer's parameters, the inputs of a step and the state slots, on host and device.
struct GdnProblem {
  cuda::GdnShape s;
  int num_slots;
  std::vector<float> conv_w, dt_bias, a_log, norm_w;  // f32 parameters
  std::vector<float> conv_state, rec_state;           // [slots][C][K-1], [slots][nv][dk][dv]
  DeviceBuffer<float> d_conv_w, d_dt_bias, d_a_log, d_norm_w, d_conv_state, d_rec_state;

  GdnProblem(Rng& rng, const cuda::GdnShape& shape, int slots) : s(shape), num_slots(slots) {
    const int C = s.conv_dim(), K = s.conv_kernel;
    conv_w = random_f32(rng, size_t(C) * K, 0.5f);
    dt_bias = random_f32(rng, size_t(s.num_v_heads), 1.0f);
    a_log.resize(size_t(s.num_v_heads));
    for (auto& v : a_log) v = std::log(rng.uniform(1.0f, 16.0f));  // A in [1, 16] as initialised
    norm_w = random_f32(rng, size_t(s.v_head_dim), 0.2f);
    for (auto& v : norm_w) v += 1.0f;
    // Carried states: every slot starts non-zero (garbage in slots the step does not use
    // must survive untouched).
    conv_state = random_bf16(rng, size_t(slots) * C * (K - 1), 1.0f);
    rec_state = random_f32(rng, size_t(slots) * s.num_v_heads * s.k_head_dim * s.v_head_dim, 0.1f);
    upload();
  }
  // The same parameters and initial states in fresh device buffers (whatever ran on o).
  GdnProblem(const GdnProblem& o)
      : s(o.s), num_slots(o.num_slots), conv_w(o.conv_w), dt_bias(o.dt_bias), a_log(o.a_log), norm_w(o.norm_w),
        conv_state(o.conv_state), rec_state(o.rec_state) {
    upload();
  }
  void upload() {
    d_conv_w = to_device_f32(conv_w);
    d_dt_bias = to_device_f32(dt_bias);
    d_a_log = to_device_f32(a_log);
    d_norm_w = to_device_f32(norm_w);
    d_conv_state = to_device_f32(conv_state);
    d_rec_state = to_device_f32(rec_state);
  }
  cuda::GdnLayerParams params() {
    return {d_conv_w.data(), d_dt_bias.data(), d_a_log.data(), d_norm_w.data(), d_conv_state.data(),
            d_rec_state.data()};
  }
  size_t conv_size() const { return size_t(s.conv_dim()) * (s.conv_kernel - 1); }
  size_t rec_size() const { return size_t(s.num_v_heads) * s.k_head_dim * s.v_head_dim; }
};

struct GdnInputs {
  std::vector<float> qkv, z;  // bf16 values (in_proj_qkv / in_proj_z outputs)
  std::vector<float> b, a;    // f32 (the gate projections are kept in f32, ops_gdn.h)
};

GdnInputs random_inputs(Rng& rng, const cuda::GdnShape& s, int M) {
  return {random_bf16(rng, size_t(M) * s.conv_dim(), 1.0f), random_bf16(rng, size_t(M) * s.value_dim(), 1.5f),
          random_f32(rng, size_t(M) * s.num_v_heads, 2.0f), random_f32(rng, size_t(M) * s.num_v_heads, 2.0f)};
}

// Runs the GPU op for one step; returns the output [M, nv·dv]. f32: the f32 entry point (the
// model's), else the bf16 one (the inputs are bf16 values either way).
// kernels: Auto (one launch for one-token-per-sequence steps) or TwoPass (prep + recurrence).
std::vector<float> run_gpu(GdnProblem& p, const GdnInputs& in, const std::vector<SeqSpec>& seqs, bool f32 = false,
                           cuda::GdnKernels kernels = cuda::GdnKernels::Auto) {
  DeviceStepMeta meta(seqs, 1);
  const int M = meta.num_tokens();
  auto d_b = to_device_f32(in.b), d_a = to_device_f32(in.a);
  const size_t ws_bytes = cuda::gdn_workspace_bytes(p.s, M);
  DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
  if (f32) {
    auto d_qkv = to_device_f32(in.qkv), d_z = to_device_f32(in.z);
    DeviceBuffer<float> out(size_t(M) * p.s.value_dim());
    cuda::gated_delta_net(d_qkv.data(), d_z.data(), d_b.data(), d_a.data(), p.s, p.params(), meta.meta(), ws.data(),
                          ws_bytes, out.data(), nullptr, kernels);
    return to_host(out);
  }
  auto d_qkv = to_device_bf16(in.qkv), d_z = to_device_bf16(in.z);
  DeviceBuffer<bf16> out(size_t(M) * p.s.value_dim());
  cuda::gated_delta_net(d_qkv.data(), d_z.data(), d_b.data(), d_a.data(), p.s, p.params(), meta.meta(), ws.data(),
                        ws_bytes, out.data(), nullptr, kernels);
  return to_host(out);
}

// Tokens [t0, t0 + n) of a step's inputs.
GdnInputs slice(const GdnInputs& src, const cuda::GdnShape& s, int t0, int n) {
  auto take = [&](const std::vector<float>& v, int width) {
    return std::vector<float>(v.begin() + long(size_t(t0) * width), v.begin() + long(size_t(t0 + n) * width));
  };
  return {take(src.qkv, s.conv_dim()), take(src.z, s.value_dim()), take(src.b, s.num_v_heads),
          take(src.a, s.num_v_heads)};
}

GdnInputs concat(GdnInputs x, const GdnInputs& y) {
  x.qkv.insert(x.qkv.end(), y.qkv.begin(), y.qkv.end());
  x.z.insert(x.z.end(), y.z.begin(), y.z.end());
  x.b.insert(x.b.end(), y.b.begin(), y.b.end());
  x.a.insert(x.a.end(), y.a.begin(), y.a.end());
  return x;
}

std::vector<float> slot_of(const std::vector<float>& v, size_t size, int s) {
  return std::vector<float>(v.begin() + long(size * size_t(s)), v.begin() + long(size * size_t(s + 1)));
}

// Output bound against the CPU: bf16 rounding plus 1e-3 of the head's gated scale
// |w_j·silu(z)| (the normalised core output is O(1); chunked vs recurrent fp32 differ by ~1e-5
// of it; a wrong token, head or gate is O(1)).
std::vector<float> out_bound(const GdnProblem& p, const GdnInputs& in) {
  std::vector<float> bound(in.z.size());
  for (size_t i = 0; i < bound.size(); ++i) {
    const int j = int(i % size_t(p.s.v_head_dim));
    bound[i] = float(1e-3 * std::abs(p.norm_w[size_t(j)] * cpu::silu(in.z[i])));
  }
  return bound;
}

cpu::GdnGeometry geometry(const cuda::GdnShape& s) {
  return {s.num_k_heads, s.num_v_heads, s.k_head_dim, s.v_head_dim, s.conv_kernel};
}

// The CPU op on one step, on copies of p's initial states (returned in conv / rec).
std::vector<float> run_cpu(const GdnProblem& p, const GdnInputs& in, const std::vector<SeqSpec>& seqs,
                           std::vector<float>& conv, std::vector<float>& rec) {
  const cuda::GdnShape& shape = p.s;
  int M = 0;
  for (const auto& s : seqs) M += s.num_tokens;
  conv = p.conv_state;
  rec = p.rec_state;
  std::vector<float> ref(size_t(M) * shape.value_dim());
  std::vector<cpu::GdnChunk> chunks;
  int row = 0;
  for (const auto& s : seqs) {
    const size_t r = size_t(row);
    chunks.push_back({s.num_tokens, in.qkv.data() + r * shape.conv_dim(), in.z.data() + r * shape.value_dim(),
                      in.b.data() + r * shape.num_v_heads, in.a.data() + r * shape.num_v_heads,
                      conv.data() + size_t(s.state_slot) * p.conv_size(),
                      rec.data() + size_t(s.state_slot) * p.rec_size(), ref.data() + r * shape.value_dim()});
    row += s.num_tokens;
  }
  const cpu::GdnParams params{p.conv_w.data(), p.dt_bias.data(), p.a_log.data(), p.norm_w.data(), shape.norm_eps};
  cpu::gated_delta_net(pool(), geometry(shape), params, chunks);
  return ref;
}

}  // namespace

TEST(GpuOpsGdn, MixedStepMatchesCpu) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(31);
  for (const auto& shape : kShapes) {
    SCOPED_TRACE(name_of(shape));
    const int slots = 8;
    GdnProblem p(rng, shape, slots);
    // decode in slot 3, a 37-token prefill in slot 0, decode in slot 5, a 70-token chunk in
    // slot 2 (the CPU runs it as 64 + 6 chunked), a 4-token verify batch in slot 6.
    const std::vector<SeqSpec> seqs{{10, 1, 3, {}}, {0, 37, 0, {}}, {99, 1, 5, {}}, {5, 70, 2, {}}, {40, 4, 6, {}}};
    int M = 0;
    for (const auto& s : seqs) M += s.num_tokens;
    const GdnInputs in = random_inputs(rng, shape, M);
    const auto got = run_gpu(p, in, seqs);

    // CPU: the same step on copies of the same initial states.
    std::vector<float> conv, rec;
    const auto ref = run_cpu(p, in, seqs, conv, rec);
    const auto bound = out_bound(p, in);
    EXPECT_TRUE(all_close("gdn.out " + name_of(shape), got, ref, {M, shape.num_v_heads, shape.v_head_dim},
                          {"token", "v_head", "j"}, 0, kEpsBf16 * 1.001, &bound));
    // Conv state: the last K−1 pre-conv inputs, copied: exact. Slots outside the step keep
    // their garbage.
    EXPECT_TRUE(all_close("gdn.conv_state " + name_of(shape), to_host(p.d_conv_state), conv,
                          {slots, shape.conv_dim(), shape.conv_kernel - 1}, {"slot", "channel", "tap"}, 0, 0));
    // Recurrent state: fp32 on both sides; 1e-4 of its scale (recurrent vs chunked order).
    const double smax = error_stats(rec, rec).max_ref;
    EXPECT_TRUE(all_close("gdn.recurrent_state " + name_of(shape), to_host(p.d_rec_state), rec,
                          {slots, shape.num_v_heads, shape.k_head_dim, shape.v_head_dim}, {"slot", "v_head", "i", "j"},
                          1e-4 * smax, 1e-4));
  }
}

TEST(GpuOpsGdn, ChunkThenSingleTokensEqualsOneCall) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(32);
  for (const auto& shape : kShapes) {
    SCOPED_TRACE(name_of(shape));
    const int T = 20, first = 13;
    Rng rng_copy = rng;  // the split run gets identical parameters and states
    GdnProblem whole(rng, shape, 4);
    GdnProblem split(rng_copy, shape, 4);
    const GdnInputs in = random_inputs(rng, shape, T);
    // Another sequence shares every step (slot 1), so the split run also mixes sequences.
    const GdnInputs other = random_inputs(rng, shape, 1 + (T - first));

    // One call: the 20 tokens of slot 2 alone.
    const auto out_whole = run_gpu(whole, in, {{0, T, 2, {}}});
    // Split: [13 tokens of slot 2 + 1 token of slot 1], then 7 steps of [1 + 1] (decode steps:
    // the one-launch decode kernel).
    std::vector<float> out_split;
    const size_t width = size_t(shape.value_dim());
    for (int step = 0; step <= T - first; ++step) {
      const int t0 = step == 0 ? 0 : first + step - 1, n = step == 0 ? first : 1;
      const auto out = run_gpu(split, concat(slice(in, shape, t0, n), slice(other, shape, step, 1)),
                               {{t0, n, 2, {}}, {step, 1, 1, {}}});
      out_split.insert(out_split.end(), out.begin(), out.begin() + long(size_t(n) * width));
    }
    // The same arithmetic on the same values in the same order: bit for bit.
    EXPECT_TRUE(all_close("gdn split vs whole.out " + name_of(shape), out_split, out_whole,
                          {T, shape.num_v_heads, shape.v_head_dim}, {"token", "v_head", "j"}, 0, 0));
    const auto conv_w = to_host(whole.d_conv_state), conv_s = to_host(split.d_conv_state);
    const auto rec_w = to_host(whole.d_rec_state), rec_s = to_host(split.d_rec_state);
    const size_t cs = whole.conv_size(), rs = whole.rec_size();
    EXPECT_TRUE(all_close("gdn split vs whole.conv_state " + name_of(shape), slot_of(conv_s, cs, 2),
                          slot_of(conv_w, cs, 2), {shape.conv_dim(), shape.conv_kernel - 1}, {"channel", "tap"}, 0,
                          0));
    EXPECT_TRUE(all_close("gdn split vs whole.recurrent_state " + name_of(shape), slot_of(rec_s, rs, 2),
                          slot_of(rec_w, rs, 2), {shape.num_v_heads, shape.k_head_dim, shape.v_head_dim},
                          {"v_head", "i", "j"}, 0, 0));
  }
}

// Batch invariance: each sequence of a mixed step (decode tokens, a 2-token chunk, shorter
// than the conv window, short and long chunks) gives the same bits as that sequence alone.
// Alone, a decode token takes the one-launch decode kernel; in the mix, the prep kernel's
// 8-token tiles and the recurrence's column strips.
TEST(GpuOpsGdn, MixedStepEqualsEachSequenceAlone) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(33);
  for (const auto& shape : kShapes) {
    SCOPED_TRACE(name_of(shape));
    const int slots = 8;
    Rng rng_copy = rng;
    GdnProblem mixed(rng, shape, slots);
    GdnProblem alone(rng_copy, shape, slots);
    const std::vector<SeqSpec> seqs{{7, 1, 4, {}}, {0, 45, 1, {}}, {3, 2, 7, {}}, {12, 1, 0, {}},
                                    {30, 130, 5, {}}, {2, 9, 3, {}}};
    int M = 0;
    for (const auto& s : seqs) M += s.num_tokens;
    const GdnInputs in = random_inputs(rng, shape, M);
    const auto out_mixed = run_gpu(mixed, in, seqs);

    std::vector<float> out_alone;
    int row = 0;
    for (const auto& s : seqs) {
      const auto out = run_gpu(alone, slice(in, shape, row, s.num_tokens), {s});
      out_alone.insert(out_alone.end(), out.begin(), out.end());
      row += s.num_tokens;
    }
    EXPECT_TRUE(all_close("gdn mixed vs alone.out " + name_of(shape), out_mixed, out_alone,
                          {M, shape.num_v_heads, shape.v_head_dim}, {"token", "v_head", "j"}, 0, 0));
    EXPECT_TRUE(all_close("gdn mixed vs alone.conv_state " + name_of(shape), to_host(mixed.d_conv_state),
                          to_host(alone.d_conv_state), {slots, shape.conv_dim(), shape.conv_kernel - 1},
                          {"slot", "channel", "tap"}, 0, 0));
    EXPECT_TRUE(all_close("gdn mixed vs alone.recurrent_state " + name_of(shape), to_host(mixed.d_rec_state),
                          to_host(alone.d_rec_state),
                          {slots, shape.num_v_heads, shape.k_head_dim, shape.v_head_dim},
                          {"slot", "v_head", "i", "j"}, 0, 0));
  }
}

// A 300-token prefill from a carried state, in one call: against the CPU op (chunked, 64 at a
// time); against itself run in uneven chunks and token by token (bit for bit); and the f32
// entry point against the bf16 one (the same bits once the f32 output is rounded to bf16).
TEST(GpuOpsGdn, LongPrefillMatchesCpuChunksAndDecode) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(34);
  for (const auto& shape : kShapes) {
    SCOPED_TRACE(name_of(shape));
    const int T = 300, slot = 1;
    Rng rng_a = rng, rng_b = rng, rng_c = rng;
    GdnProblem one(rng, shape, 2), chunked(rng_a, shape, 2), decode(rng_b, shape, 2), f32(rng_c, shape, 2);
    const GdnInputs in = random_inputs(rng, shape, T);
    const std::vector<SeqSpec> seq{{0, T, slot, {}}};
    const auto got = run_gpu(one, in, seq);

    std::vector<float> conv, rec;
    const auto ref = run_cpu(one, in, seq, conv, rec);
    const auto bound = out_bound(one, in);
    EXPECT_TRUE(all_close("gdn long.out " + name_of(shape), got, ref, {T, shape.num_v_heads, shape.v_head_dim},
                          {"token", "v_head", "j"}, 0, kEpsBf16 * 1.001, &bound));
    EXPECT_TRUE(all_close("gdn long.conv_state " + name_of(shape), to_host(one.d_conv_state), conv,
                          {2, shape.conv_dim(), shape.conv_kernel - 1}, {"slot", "channel", "tap"}, 0, 0));
    const double smax = error_stats(rec, rec).max_ref;
    EXPECT_TRUE(all_close("gdn long.recurrent_state " + name_of(shape), to_host(one.d_rec_state), rec,
                          {2, shape.num_v_heads, shape.k_head_dim, shape.v_head_dim}, {"slot", "v_head", "i", "j"},
                          1e-4 * smax, 1e-4));

    // Uneven chunks (1, 130, 64, 3, 102) and single tokens.
    std::vector<float> out_chunked, out_decode;
    int t0 = 0;
    for (const int n : {1, 130, 64, 3, 102}) {
      const auto out = run_gpu(chunked, slice(in, shape, t0, n), {{t0, n, slot, {}}});
      out_chunked.insert(out_chunked.end(), out.begin(), out.end());
      t0 += n;
    }
    ASSERT_EQ(t0, T);
    for (int t = 0; t < T; ++t) {
      const auto out = run_gpu(decode, slice(in, shape, t, 1), {{t, 1, slot, {}}});
      out_decode.insert(out_decode.end(), out.begin(), out.end());
    }
    const std::vector<int64_t> dims{T, shape.num_v_heads, shape.v_head_dim};
    const std::vector<int64_t> rdims{2, shape.num_v_heads, shape.k_head_dim, shape.v_head_dim};
    EXPECT_TRUE(all_close("gdn long chunked vs one.out " + name_of(shape), out_chunked, got, dims,
                          {"token", "v_head", "j"}, 0, 0));
    EXPECT_TRUE(all_close("gdn long decode vs one.out " + name_of(shape), out_decode, got, dims,
                          {"token", "v_head", "j"}, 0, 0));
    EXPECT_TRUE(all_close("gdn long chunked vs one.recurrent_state " + name_of(shape),
                          to_host(chunked.d_rec_state), to_host(one.d_rec_state), rdims,
                          {"slot", "v_head", "i", "j"}, 0, 0));
    EXPECT_TRUE(all_close("gdn long decode vs one.recurrent_state " + name_of(shape), to_host(decode.d_rec_state),
                          to_host(one.d_rec_state), rdims, {"slot", "v_head", "i", "j"}, 0, 0));
    EXPECT_TRUE(all_close("gdn long decode vs one.conv_state " + name_of(shape), to_host(decode.d_conv_state),
                          to_host(one.d_conv_state), {2, shape.conv_dim(), shape.conv_kernel - 1},
                          {"slot", "channel", "tap"}, 0, 0));

    // f32 activations in and out (the model's entry point).
    auto out_f32 = run_gpu(f32, in, seq, /*f32=*/true);
    for (auto& v : out_f32) v = round_bf16(v);
    EXPECT_TRUE(all_close("gdn long f32 vs bf16.out " + name_of(shape), out_f32, got, dims,
                          {"token", "v_head", "j"}, 0, 0));
    EXPECT_TRUE(all_close("gdn long f32 vs bf16.recurrent_state " + name_of(shape), to_host(f32.d_rec_state),
                          to_host(one.d_rec_state), rdims, {"slot", "v_head", "i", "j"}, 0, 0));
  }
}

// The one-launch decode kernel (every sequence has one new token) against the two-pass path
// (prep + recurrence, forced) on a 64-sequence decode step in shuffled slots from carried
// states: outputs, conv and recurrent states (every slot) bit for bit; the step against the
// CPU; some of its sequences alone (batch invariance, bit for bit); the f32 entry point
// against the bf16 one; and graph padding (extra one-token sequences sharing a padding slot)
// leaves the real rows' outputs and states bit-identical and other slots untouched.
TEST(GpuOpsGdn, DecodeKernelEqualsTwoPassAloneAndPadded) {
  MOESERVE_REQUIRE_GPU();
  Rng rng(35);
  for (const auto& shape : kShapes) {
    SCOPED_TRACE(name_of(shape));
    EXPECT_TRUE(cuda::gdn_decode_kernel_supported(shape));
    const int B = 64, slots = B + 2, pad_slot = B + 1;  // slot B: never used
    GdnProblem fused(rng, shape, slots);
    GdnProblem two_pass(fused), alone(fused), padded(fused), f32(fused);
    std::vector<int> perm(static_cast<size_t>(B));
    for (int i = 0; i < B; ++i) perm[size_t(i)] = i;
    for (int i = B - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(rng.next() % uint64_t(i + 1))]);
    std::vector<SeqSpec> seqs;
    for (int i = 0; i < B; ++i) seqs.push_back({int(rng.next() % 1000), 1, perm[size_t(i)], {}});
    const GdnInputs in = random_inputs(rng, shape, B);
    const std::vector<int64_t> dims{B, shape.num_v_heads, shape.v_head_dim};
    const std::vector<int64_t> cdims{slots, shape.conv_dim(), shape.conv_kernel - 1};
    const std::vector<int64_t> rdims{slots, shape.num_v_heads, shape.k_head_dim, shape.v_head_dim};

    // 64 sequences: Auto would take the two-pass path (more than one wave); force the decode kernel.
    const auto out_fused = run_gpu(fused, in, seqs, false, cuda::GdnKernels::Decode);
    const auto out_two = run_gpu(two_pass, in, seqs, false, cuda::GdnKernels::TwoPass);
    const auto conv_fused = to_host(fused.d_conv_state), rec_fused = to_host(fused.d_rec_state);
    EXPECT_TRUE(all_close("gdn decode vs two-pass.out " + name_of(shape), out_fused, out_two, dims,
                          {"token", "v_head", "j"}, 0, 0));
    EXPECT_TRUE(all_close("gdn decode vs two-pass.conv_state " + name_of(shape), conv_fused,
                          to_host(two_pass.d_conv_state), cdims, {"slot", "channel", "tap"}, 0, 0));
    EXPECT_TRUE(all_close("gdn decode vs two-pass.recurrent_state " + name_of(shape), rec_fused,
                          to_host(two_pass.d_rec_state), rdims, {"slot", "v_head", "i", "j"}, 0, 0));

    // Against the CPU (the recurrent rule for one token), on copies of the initial states.
    std::vector<float> conv, rec;
    const auto ref = run_cpu(fused, in, seqs, conv, rec);
    const auto bound = out_bound(fused, in);
    EXPECT_TRUE(all_close("gdn decode.out " + name_of(shape), out_fused, ref, dims, {"token", "v_head", "j"}, 0,
                          kEpsBf16 * 1.001, &bound));
    EXPECT_TRUE(all_close("gdn decode.conv_state " + name_of(shape), conv_fused, conv, cdims,
                          {"slot", "channel", "tap"}, 0, 0));
    const double smax = error_stats(rec, rec).max_ref;
    EXPECT_TRUE(all_close("gdn decode.recurrent_state " + name_of(shape), rec_fused, rec, rdims,
                          {"slot", "v_head", "i", "j"}, 1e-4 * smax, 1e-4));

    // Some of the sequences alone: the same bits for their rows and slots.
    const size_t width = size_t(shape.value_dim()), cs = fused.conv_size(), rs = fused.rec_size();
    for (const int i : {0, 1, 37, B - 1}) {
      const auto out = run_gpu(alone, slice(in, shape, i, 1), {seqs[size_t(i)]});
      const std::vector<float> row(out_fused.begin() + long(size_t(i) * width),
                                   out_fused.begin() + long(size_t(i + 1) * width));
      const int sl = seqs[size_t(i)].state_slot;
      EXPECT_TRUE(all_close("gdn decode alone vs batch.out " + name_of(shape), out, row,
                            {shape.num_v_heads, shape.v_head_dim}, {"v_head", "j"}, 0, 0));
      EXPECT_TRUE(all_close("gdn decode alone vs batch.conv_state " + name_of(shape),
                            slot_of(to_host(alone.d_conv_state), cs, sl), slot_of(conv_fused, cs, sl),
                            {shape.conv_dim(), shape.conv_kernel - 1}, {"channel", "tap"}, 0, 0));
      EXPECT_TRUE(all_close("gdn decode alone vs batch.recurrent_state " + name_of(shape),
                            slot_of(to_host(alone.d_rec_state), rs, sl), slot_of(rec_fused, rs, sl),
                            {shape.num_v_heads, shape.k_head_dim, shape.v_head_dim}, {"v_head", "i", "j"}, 0, 0));
    }

    // f32 activations in and out: the bf16 output's bits once rounded, the same states.
    auto out_f32 = run_gpu(f32, in, seqs, /*f32=*/true);
    for (auto& v : out_f32) v = round_bf16(v);
    EXPECT_TRUE(all_close("gdn decode f32 vs bf16.out " + name_of(shape), out_f32, out_fused, dims,
                          {"token", "v_head", "j"}, 0, 0));
    EXPECT_TRUE(all_close("gdn decode f32 vs bf16.recurrent_state " + name_of(shape), to_host(f32.d_rec_state),
                          rec_fused, rdims, {"slot", "v_head", "i", "j"}, 0, 0));

    // Graph padding: the first 5 sequences, then 3 one-token rows in the padding slot.
    const int real = 5, pads = 3;
    std::vector<SeqSpec> pseqs(seqs.begin(), seqs.begin() + real);
    for (int j = 0; j < pads; ++j) pseqs.push_back({0, 1, pad_slot, {}});
    const auto out_pad = run_gpu(padded, concat(slice(in, shape, 0, real), random_inputs(rng, shape, pads)), pseqs);
    EXPECT_TRUE(all_close("gdn decode padded.out " + name_of(shape),
                          std::vector<float>(out_pad.begin(), out_pad.begin() + long(real * width)),
                          std::vector<float>(out_fused.begin(), out_fused.begin() + long(real * width)),
                          {real, shape.num_v_heads, shape.v_head_dim}, {"token", "v_head", "j"}, 0, 0));
    const auto conv_pad = to_host(padded.d_conv_state), rec_pad = to_host(padded.d_rec_state);
    for (int sl = 0; sl < slots; ++sl) {
      if (sl == pad_slot) continue;
      bool in_step = false;
      for (int j = 0; j < real; ++j) in_step = in_step || seqs[size_t(j)].state_slot == sl;
      // A slot of the step holds the decode step's new state; any other its initial one.
      const auto& conv_want = in_step ? conv_fused : fused.conv_state;
      const auto& rec_want = in_step ? rec_fused : fused.rec_state;
      SCOPED_TRACE("slot " + std::to_string(sl));
      EXPECT_TRUE(all_close("gdn decode padded.conv_state " + name_of(shape), slot_of(conv_pad, cs, sl),
                            slot_of(conv_want, cs, sl), {shape.conv_dim(), shape.conv_kernel - 1},
                            {"channel", "tap"}, 0, 0));
      EXPECT_TRUE(all_close("gdn decode padded.recurrent_state " + name_of(shape), slot_of(rec_pad, rs, sl),
                            slot_of(rec_want, rs, sl), {shape.num_v_heads, shape.k_head_dim, shape.v_head_dim},
                            {"v_head", "i", "j"}, 0, 0));
    }
  }
}
