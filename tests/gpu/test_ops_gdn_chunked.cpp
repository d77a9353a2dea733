// Chunked Gated DeltaNet for prompt rows (ops_gdn_chunked.h) against the CPU op run with the
// sequential recurrence (cpu::DeltaRuleMode::Recurrent) and against the GPU sequential kernel
// (gated_delta_net), on random f32 inputs from carried (non-zero) conv and recurrent states:
//   - one prompt of 1, 63, 64, 65, 200, 1000 tokens from position 0, and slices starting inside
//     a chunk (positions 37 and 100: partial first chunks);
//   - a step with generated rows first (first_row > 0): those rows of out and their sequences'
//     states are left untouched; two prompt sequences in one launch, each equal bit for bit to
//     itself alone (batch invariance);
//   - a 1000-token prompt cut at multiples of 64 positions, sharing every step with another
//     prompt sequence, equal bit for bit to the one-pass prefill (outputs and final states);
//   - the 122B-A10B shape (16 / 64 heads of 128) against the sequential GPU kernel.
// Shapes: nk 2, nv 4, dk = dv = 32 and 128; nk 1, nv 2, dk 96 (a 64-wide and a 32-wide product
// stage in the state pass), dv 64, conv kernel 3.
// Every test runs for each kernel variant (set_gdn_chunked_variant: 0 CUDA-core intra-chunk
// kernel and state pass, 1 tensor-core intra-chunk kernel, 2 tensor-core intra-chunk kernel
// and state pass), and variants 1 and 2 are compared with 0 at the 122B shape
// (VariantsAgree122B).
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/activations.h"
#include "backend/cpu/gated_delta_net.h"
#include "backend/cuda/ops_gdn.h"
#include "backend/cuda/ops_gdn_chunked.h"
#include "core/thread_pool.h"
#include "gpu_test_util.h"

using namespace moeserve;
using namespace moeserve::gputest;

namespace {

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

const cuda::GdnShape kSmallShapes[] = {
    {2, 4, 32, 32, 4, 1e-6f}, {2, 4, 128, 128, 4, 1e-6f}, {1, 2, 96, 64, 3, 1e-6f}};
const cuda::GdnShape kShape122B{16, 64, 128, 128, 4, 1e-6f};
constexpr float kSentinel = 12345.0f;  // out rows the op must not write

constexpr int kVariants[] = {0, 1, 2};

// Sets the intra-chunk variant for a scope, restoring the previous one after.
struct VariantScope {
  int previous;
  explicit VariantScope(int v) : previous(cuda::gdn_chunked_variant()) { cuda::set_gdn_chunked_variant(v); }
  ~VariantScope() { cuda::set_gdn_chunked_variant(previous); }
  VariantScope(const VariantScope&) = delete;
  VariantScope& operator=(const VariantScope&) = delete;
};

std::string name_of(const cuda::GdnShape& s) {
  return "nk=" + std::to_string(s.num_k_heads) + " nv=" + std::to_string(s.num_v_heads) +
         " dk=" + std::to_string(s.k_head_dim) + " dv=" + std::to_string(s.v_head_dim);
}

// One layer's parameters and the state slots, on host and device (two problems built from
// copies of one Rng are identical).
struct Problem {
  cuda::GdnShape s;
  int num_slots;
  std::vector<float> conv_w, dt_bias, a_log, norm_w, conv_state, rec_state;
  DeviceBuffer<float> d_conv_w, d_dt_bias, d_a_log, d_norm_w, d_conv_state, d_rec_state;

  Problem(Rng& rng, const cuda::GdnShape& shape, int slots) : s(shape), num_slots(slots) {
    const int C = s.conv_dim(), K = s.conv_kernel;
    conv_w = random_f32(rng, size_t(C) * K, 0.5f);
    dt_bias = random_f32(rng, size_t(s.num_v_heads), 1.0f);
    a_log.resize(size_t(s.num_v_heads));
    for (auto& v : a_log) v = std::log(rng.uniform(1.0f, 16.0f));
    norm_w = random_f32(rng, size_t(s.v_head_dim), 0.2f);
    for (auto& v : norm_w) v += 1.0f;
    conv_state = random_f32(rng, size_t(slots) * C * (K - 1), 1.0f);
    rec_state = random_f32(rng, size_t(slots) * s.num_v_heads * s.k_head_dim * s.v_head_dim, 0.1f);
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

struct Inputs {
  std::vector<float> qkv, z, b, a;
};

Inputs random_inputs(Rng& rng, const cuda::GdnShape& s, int M) {
  return {random_f32(rng, size_t(M) * s.conv_dim(), 1.0f), random_f32(rng, size_t(M) * s.value_dim(), 1.5f),
          random_f32(rng, size_t(M) * s.num_v_heads, 2.0f), random_f32(rng, size_t(M) * s.num_v_heads, 2.0f)};
}

Inputs slice(const Inputs& src, const cuda::GdnShape& s, int t0, int n) {
  auto take = [&](const std::vector<float>& v, int width) {
    return std::vector<float>(v.begin() + long(size_t(t0) * width), v.begin() + long(size_t(t0 + n) * width));
  };
  return {take(src.qkv, s.conv_dim()), take(src.z, s.value_dim()), take(src.b, s.num_v_heads),
          take(src.a, s.num_v_heads)};
}

Inputs concat(Inputs x, const Inputs& y) {
  x.qkv.insert(x.qkv.end(), y.qkv.begin(), y.qkv.end());
  x.z.insert(x.z.end(), y.z.begin(), y.z.end());
  x.b.insert(x.b.end(), y.b.begin(), y.b.end());
  x.a.insert(x.a.end(), y.a.begin(), y.a.end());
  return x;
}

std::vector<float> rows_of(const std::vector<float>& v, size_t width, int r0, int n) {
  return std::vector<float>(v.begin() + long(width * size_t(r0)), v.begin() + long(width * size_t(r0 + n)));
}

// The chunked op on a step whose prompt sequences start at seqs[first_seq]; out starts as
// kSentinel everywhere. Returns out [M][nv·dv].
std::vector<float> run_chunked(Problem& p, const Inputs& in, const std::vector<SeqSpec>& seqs, int first_seq) {
  DeviceStepMeta meta(seqs, 1);
  const int M = meta.num_tokens();
  const int first_row = meta.seq_token_start[size_t(first_seq)];
  auto d_qkv = to_device_f32(in.qkv), d_z = to_device_f32(in.z), d_b = to_device_f32(in.b),
       d_a = to_device_f32(in.a);
  const size_t ws_bytes = cuda::gated_delta_net_chunked_workspace_bytes(p.s, M - first_row);
  DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
  auto out = to_device_f32(std::vector<float>(size_t(M) * p.s.value_dim(), kSentinel));
  cuda::gated_delta_net_chunked(d_qkv.data(), d_z.data(), d_b.data(), d_a.data(), p.s, p.params(), meta.meta(),
                                first_seq, first_row, ws.data(), ws_bytes, out.data(), nullptr);
  sync_device();
  return to_host(out);
}

// The sequential GPU op (gated_delta_net, f32 entry point) on a whole step.
std::vector<float> run_sequential(Problem& p, const Inputs& in, const std::vector<SeqSpec>& seqs) {
  DeviceStepMeta meta(seqs, 1);
  const int M = meta.num_tokens();
  auto d_qkv = to_device_f32(in.qkv), d_z = to_device_f32(in.z), d_b = to_device_f32(in.b),
       d_a = to_device_f32(in.a);
  const size_t ws_bytes = cuda::gdn_workspace_bytes(p.s, M);
  DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
  DeviceBuffer<float> out(size_t(M) * p.s.value_dim());
  cuda::gated_delta_net(d_qkv.data(), d_z.data(), d_b.data(), d_a.data(), p.s, p.params(), meta.meta(), ws.data(),
                        ws_bytes, out.data(), nullptr);
  sync_device();
  return to_host(out);
}

// The CPU op with the sequential recurrence on sequences [first_seq, end) of a step, on copies
// of p's initial states (returned in conv / rec). Returns their rows of out.
std::vector<float> run_cpu(const Problem& p, const Inputs& in, const std::vector<SeqSpec>& seqs, int first_seq,
                           std::vector<float>& conv, std::vector<float>& rec) {
  const cuda::GdnShape& sh = p.s;
  conv = p.conv_state;
  rec = p.rec_state;
  int row = 0, M = 0;
  for (int i = 0; i < int(seqs.size()); ++i) {
    if (i < first_seq) row += seqs[size_t(i)].num_tokens;
    else M += seqs[size_t(i)].num_tokens;
  }
  std::vector<float> ref(size_t(M) * sh.value_dim());
  std::vector<cpu::GdnChunk> chunks;
  int r = 0;
  for (size_t i = size_t(first_seq); i < seqs.size(); ++i) {
    const auto& s = seqs[i];
    const size_t g = size_t(row + r);
    chunks.push_back({s.num_tokens, in.qkv.data() + g * sh.conv_dim(), in.z.data() + g * sh.value_dim(),
                      in.b.data() + g * sh.num_v_heads, in.a.data() + g * sh.num_v_heads,
                      conv.data() + size_t(s.state_slot) * p.conv_size(),
                      rec.data() + size_t(s.state_slot) * p.rec_size(), ref.data() + size_t(r) * sh.value_dim()});
    r += s.num_tokens;
  }
  const cpu::GdnGeometry geo{sh.num_k_heads, sh.num_v_heads, sh.k_head_dim, sh.v_head_dim, sh.conv_kernel};
  const cpu::GdnParams params{p.conv_w.data(), p.dt_bias.data(), p.a_log.data(), p.norm_w.data(), sh.norm_eps};
  cpu::gated_delta_net(pool(), geo, params, chunks, cpu::DeltaRuleMode::Recurrent);
  return ref;
}

// Output bound against the sequential recurrence: 1e-3 of the head's gated scale |w_j·silu(z)|
// (the normalised core output is O(1); chunked vs recurrent f32 differ by ~1e-5..1e-4 of it,
// the cumulative log decays of a chunk being large in magnitude; a wrong token, head or gate is
// O(1)). rows: the z rows of the compared outputs.
std::vector<float> out_bound(const Problem& p, const std::vector<float>& z) {
  std::vector<float> bound(z.size());
  for (size_t i = 0; i < bound.size(); ++i) {
    const int j = int(i % size_t(p.s.v_head_dim));
    bound[i] = float(1e-3 * std::abs(p.norm_w[size_t(j)] * cpu::silu(z[i])));
  }
  return bound;
}

// Compares the prompt rows [r0, r0 + n) of a GPU output and the states of the listed slots
// with the CPU reference (states: 1e-4 of the reference's scale, as test_ops_gdn).
void expect_matches_cpu(const std::string& what, const Problem& p, const std::vector<float>& got_out, int r0,
                        const std::vector<float>& ref_out, const Inputs& in, const std::vector<float>& conv,
                        const std::vector<float>& rec) {
  const auto& sh = p.s;
  const size_t vd = size_t(sh.value_dim());
  const int n = int(ref_out.size() / vd);
  const auto bound = out_bound(p, rows_of(in.z, vd, r0, n));
  EXPECT_TRUE(all_close(what + ".out " + name_of(sh), rows_of(got_out, vd, r0, n), ref_out,
                        {n, sh.num_v_heads, sh.v_head_dim}, {"token", "v_head", "j"}, 0, 1e-4, &bound));
  EXPECT_TRUE(all_close(what + ".conv_state " + name_of(sh), to_host(p.d_conv_state), conv,
                        {p.num_slots, sh.conv_dim(), sh.conv_kernel - 1}, {"slot", "channel", "tap"}, 0, 0));
  const double smax = error_stats(rec, rec).max_ref;
  EXPECT_TRUE(all_close(what + ".recurrent_state " + name_of(sh), to_host(p.d_rec_state), rec,
                        {p.num_slots, sh.num_v_heads, sh.k_head_dim, sh.v_head_dim}, {"slot", "v_head", "i", "j"},
                        1e-4 * smax, 1e-4));
}

}  // namespace

TEST(GpuOpsGdnChunked, SupportedShapes) {
  EXPECT_TRUE(cuda::gated_delta_net_chunked_supported(kShape122B));
  for (const auto& s : kSmallShapes) EXPECT_TRUE(cuda::gated_delta_net_chunked_supported(s));
  EXPECT_FALSE(cuda::gated_delta_net_chunked_supported({2, 6, 20, 12, 4, 1e-6f}));
  EXPECT_FALSE(cuda::gated_delta_net_chunked_supported({2, 4, 256, 128, 4, 1e-6f}));
}

// One prompt per launch, from carried states: lengths around the chunk size, and slices that
// start inside a chunk (positions 37 and 100) or end inside one.
TEST(GpuOpsGdnChunked, MatchesCpuRecurrence) {
  MOESERVE_REQUIRE_GPU();
  for (int variant : kVariants) {
    VariantScope vs(variant);
    SCOPED_TRACE("variant " + std::to_string(variant));
    Rng rng(71);
    const std::pair<int, int> cases[] = {{0, 1}, {0, 63}, {0, 64}, {0, 65}, {0, 200}, {0, 1000}, {37, 200}, {100, 65},
                                         {64, 1}, {127, 2}};
    for (const auto& shape : kSmallShapes) {
      for (const auto& [start, T] : cases) {
        SCOPED_TRACE(name_of(shape) + " start " + std::to_string(start) + " tokens " + std::to_string(T));
        Problem p(rng, shape, 3);
        const Inputs in = random_inputs(rng, shape, T);
        const std::vector<SeqSpec> seqs{{start, T, 1, {}}};
        const auto got = run_chunked(p, in, seqs, 0);
        std::vector<float> conv, rec;
        const auto ref = run_cpu(p, in, seqs, 0, conv, rec);
        expect_matches_cpu("gdn chunked T=" + std::to_string(T), p, got, 0, ref, in, conv, rec);
      }
    }
  }
}

// A step [2 generated rows][prompt A: 200 tokens from 0][prompt B: 65 tokens from 100]: the
// generated rows' outputs and their slots' states stay untouched, A and B match the CPU, and
// each of A and B equals itself alone bit for bit.
TEST(GpuOpsGdnChunked, GeneratedRowsFirstAndTwoSequences) {
  MOESERVE_REQUIRE_GPU();
  for (int variant : kVariants) {
    VariantScope vs(variant);
    SCOPED_TRACE("variant " + std::to_string(variant));
    Rng rng(72);
    for (const auto& shape : kSmallShapes) {
      SCOPED_TRACE(name_of(shape));
      const int slots = 6;
      Rng rng_copy = rng;
      Problem mixed(rng, shape, slots);
      Problem alone(rng_copy, shape, slots);
      const std::vector<SeqSpec> seqs{{50, 1, 0, {}}, {9, 1, 4, {}}, {0, 200, 2, {}}, {100, 65, 1, {}}};
      const int M = 2 + 200 + 65;
      const Inputs in = random_inputs(rng, shape, M);
      const auto got = run_chunked(mixed, in, seqs, 2);
      const size_t vd = size_t(shape.value_dim());

      // Generated rows untouched.
      EXPECT_TRUE(all_close("gdn chunked generated rows " + name_of(shape), rows_of(got, vd, 0, 2),
                            std::vector<float>(2 * vd, kSentinel), {2, shape.num_v_heads, shape.v_head_dim},
                            {"token", "v_head", "j"}, 0, 0));
      // Prompt rows and every slot's state against the CPU on the prompt sequences only (slots
      // 0, 3, 4, 5 keep their initial states on both sides).
      std::vector<float> conv, rec;
      const auto ref = run_cpu(mixed, in, seqs, 2, conv, rec);
      expect_matches_cpu("gdn chunked mixed", mixed, got, 2, ref, in, conv, rec);

      // Each prompt sequence alone (first_row 0), one after the other on the same slots.
      const auto out_a = run_chunked(alone, slice(in, shape, 2, 200), {{0, 200, 2, {}}}, 0);
      const auto out_b = run_chunked(alone, slice(in, shape, 202, 65), {{100, 65, 1, {}}}, 0);
      std::vector<float> out_alone = out_a;
      out_alone.insert(out_alone.end(), out_b.begin(), out_b.end());
      EXPECT_TRUE(all_close("gdn chunked mixed vs alone.out " + name_of(shape), rows_of(got, vd, 2, 265), out_alone,
                            {265, shape.num_v_heads, shape.v_head_dim}, {"token", "v_head", "j"}, 0, 0));
      EXPECT_TRUE(all_close("gdn chunked mixed vs alone.conv_state " + name_of(shape), to_host(mixed.d_conv_state),
                            to_host(alone.d_conv_state), {slots, shape.conv_dim(), shape.conv_kernel - 1},
                            {"slot", "channel", "tap"}, 0, 0));
      EXPECT_TRUE(all_close("gdn chunked mixed vs alone.recurrent_state " + name_of(shape),
                            to_host(mixed.d_rec_state), to_host(alone.d_rec_state),
                            {slots, shape.num_v_heads, shape.k_head_dim, shape.v_head_dim},
                            {"slot", "v_head", "i", "j"}, 0, 0));
    }
  }
}

// A 1000-token prompt (slot 2) in one launch vs cut at positions 128, 192 and 640 (multiples of
// 64); every split step also holds a generated row first (slot 5, not run) and another prompt
// sequence after it (slot 0, lengths 10, 70, 3, 130): outputs and final states bit for bit.
TEST(GpuOpsGdnChunked, SplitAtMultiplesOf64EqualsOnePass) {
  MOESERVE_REQUIRE_GPU();
  for (int variant : kVariants) {
    VariantScope vs(variant);
    SCOPED_TRACE("variant " + std::to_string(variant));
    Rng rng(73);
    for (const auto& shape : kSmallShapes) {
      SCOPED_TRACE(name_of(shape));
      const int T = 1000, slots = 6;
      Rng rng_copy = rng;
      Problem one(rng, shape, slots);
      Problem split(rng_copy, shape, slots);
      const Inputs in = random_inputs(rng, shape, T);
      const auto out_one = run_chunked(one, in, {{0, T, 2, {}}}, 0);

      const int cuts[] = {0, 128, 192, 640, T};
      const int other_len[] = {10, 70, 3, 130};
      std::vector<float> out_split;
      const size_t vd = size_t(shape.value_dim());
      int other_pos = 0;
      for (int k = 0; k < 4; ++k) {
        const int t0 = cuts[k], n = cuts[k + 1] - cuts[k];
        const Inputs step = concat(concat(random_inputs(rng, shape, 1), slice(in, shape, t0, n)),
                                   random_inputs(rng, shape, other_len[k]));
        const std::vector<SeqSpec> seqs{{77, 1, 5, {}}, {t0, n, 2, {}}, {other_pos, other_len[k], 0, {}}};
        const auto out = run_chunked(split, step, seqs, 1);
        const auto mine = rows_of(out, vd, 1, n);
        out_split.insert(out_split.end(), mine.begin(), mine.end());
        other_pos += other_len[k];
      }
      EXPECT_TRUE(all_close("gdn chunked split vs one.out " + name_of(shape), out_split, out_one,
                            {T, shape.num_v_heads, shape.v_head_dim}, {"token", "v_head", "j"}, 0, 0));
      const size_t cs = one.conv_size(), rs = one.rec_size();
      EXPECT_TRUE(all_close("gdn chunked split vs one.conv_state " + name_of(shape),
                            rows_of(to_host(split.d_conv_state), cs, 2, 1),
                            rows_of(to_host(one.d_conv_state), cs, 2, 1),
                            {shape.conv_dim(), shape.conv_kernel - 1}, {"channel", "tap"}, 0, 0));
      EXPECT_TRUE(all_close("gdn chunked split vs one.recurrent_state " + name_of(shape),
                            rows_of(to_host(split.d_rec_state), rs, 2, 1), rows_of(to_host(one.d_rec_state), rs, 2, 1),
                            {shape.num_v_heads, shape.k_head_dim, shape.v_head_dim}, {"v_head", "i", "j"}, 0, 0));
      // The generated row's slot was never touched by the chunked op.
      EXPECT_TRUE(all_close("gdn chunked split.untouched slot " + name_of(shape),
                            rows_of(to_host(split.d_rec_state), rs, 5, 1), rows_of(split.rec_state, rs, 5, 1),
                            {shape.num_v_heads, shape.k_head_dim, shape.v_head_dim}, {"v_head", "i", "j"}, 0, 0));
    }
  }
}

// The 122B-A10B shape: a 300-token prompt from position 0 and a 100-token slice from position
// 20 in one launch, against the sequential GPU kernel on the same step.
TEST(GpuOpsGdnChunked, Shape122BMatchesSequentialKernel) {
  MOESERVE_REQUIRE_GPU();
  for (int variant : kVariants) {
    VariantScope vs(variant);
    SCOPED_TRACE("variant " + std::to_string(variant));
    Rng rng(74);
    const auto& shape = kShape122B;
    const int slots = 3;
    Rng rng_copy = rng;
    Problem chunked(rng, shape, slots);
    Problem seq(rng_copy, shape, slots);
    const std::vector<SeqSpec> seqs{{0, 300, 2, {}}, {20, 100, 0, {}}};
    const int M = 400;
    const Inputs in = random_inputs(rng, shape, M);
    const auto got = run_chunked(chunked, in, seqs, 0);
    const auto ref = run_sequential(seq, in, seqs);
    const auto bound = out_bound(chunked, in.z);
    EXPECT_TRUE(all_close("gdn chunked vs sequential.out " + name_of(shape), got, ref,
                          {M, shape.num_v_heads, shape.v_head_dim}, {"token", "v_head", "j"}, 0, 1e-4, &bound));
    EXPECT_TRUE(all_close("gdn chunked vs sequential.conv_state " + name_of(shape), to_host(chunked.d_conv_state),
                          to_host(seq.d_conv_state), {slots, shape.conv_dim(), shape.conv_kernel - 1},
                          {"slot", "channel", "tap"}, 0, 0));
    const auto rec_ref = to_host(seq.d_rec_state);
    const double smax = error_stats(rec_ref, rec_ref).max_ref;
    EXPECT_TRUE(all_close("gdn chunked vs sequential.recurrent_state " + name_of(shape), to_host(chunked.d_rec_state),
                          rec_ref, {slots, shape.num_v_heads, shape.k_head_dim, shape.v_head_dim},
                          {"slot", "v_head", "i", "j"}, 1e-4 * smax, 1e-4));
  }
}

// Variants 1 (tensor-core intra kernel) and 2 (tensor-core intra kernel and state pass) vs 0
// (CUDA cores) at the 122B shape: a 1000-token prompt from position 0 and a 150-token slice
// from position 40 (a partial first chunk), from carried states. They differ by f32-level
// rounding (other sum orders, the 3xTF32 products' ~2^-21 relative error, T = (I + A)^{-1}
// instead of a substitution per column), so the bounds are those of the comparisons with the
// recurrence; a wrong index, mask or head in any kernel is O(1).
TEST(GpuOpsGdnChunked, VariantsAgree122B) {
  MOESERVE_REQUIRE_GPU();
  const auto& shape = kShape122B;
  const int slots = 3;
  const std::vector<SeqSpec> seqs{{0, 1000, 2, {}}, {40, 150, 0, {}}};
  const int M = 1150;
  std::vector<float> out[3], rec[3], conv[3], bound;
  for (int variant : kVariants) {
    Rng rng(75);
    Problem p(rng, shape, slots);
    const Inputs in = random_inputs(rng, shape, M);
    VariantScope vs(variant);
    out[variant] = run_chunked(p, in, seqs, 0);
    rec[variant] = to_host(p.d_rec_state);
    conv[variant] = to_host(p.d_conv_state);
    if (variant == 0) bound = out_bound(p, in.z);
  }
  const double smax = error_stats(rec[0], rec[0]).max_ref;
  for (int variant : {1, 2}) {
    const std::string what = "gdn chunked variant " + std::to_string(variant) + " vs 0";
    EXPECT_TRUE(all_close(what + ".out " + name_of(shape), out[variant], out[0],
                          {M, shape.num_v_heads, shape.v_head_dim}, {"token", "v_head", "j"}, 0, 1e-4, &bound));
    EXPECT_TRUE(all_close(what + ".conv_state " + name_of(shape), conv[variant], conv[0],
                          {slots, shape.conv_dim(), shape.conv_kernel - 1}, {"slot", "channel", "tap"}, 0, 0));
    EXPECT_TRUE(all_close(what + ".recurrent_state " + name_of(shape), rec[variant], rec[0],
                          {slots, shape.num_v_heads, shape.k_head_dim, shape.v_head_dim},
                          {"slot", "v_head", "i", "j"}, 1e-4 * smax, 1e-4));
  }
}
