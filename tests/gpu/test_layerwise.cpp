// Layer-by-layer diagnosis of the CUDA model against the CPU model on the fixtures.
//
// How the GPU's intermediate residual streams are observed without a debug hook in the
// model: for every cut (after the mixer, or after the MoE, of layer l) a model is built from
// the same host weights truncated to layers 0..l (for the after-mixer cut, layer l's routed
// and shared down projections are zeroed, so its MoE adds exactly 0), on the GPU
// (Qwen35CudaModel's public constructor over upload_weights) and on the CPU
// (Qwen35CpuModel). Both return StepOutput::hidden = final RMSNorm of the residual after the
// cut (bf16 on the GPU), whose error is the residual stream's up to its scale.
//
// Each cut is compared three ways and printed as a table:
//   gpu~cpu   the GPU against the fp32 CPU model;
//   gpu~emu   the GPU against EmulatedForward with the CUDA model's bf16 storage points
//             (layerwise_emulation.h): the error left once bf16 storage is accounted for;
//   emu~cpu   what the bf16 storage alone costs.
// If gpu~emu is much smaller than gpu~cpu, the GPU error is rounding, not a wrong kernel;
// the first cut where gpu~emu jumps names the sub-block to look at.
//
// The steps: a prefill of all but the last 3 tokens of input_ids, then 3 decode steps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>

#include "../unit/model/fixture_util.h"
#include "backend/cuda/qwen35_cuda.h"
#include "backend/cuda/qwen35_cuda_weights.h"
#include "core/thread_pool.h"
#include "gpu_test_util.h"
#include "io/checkpoint.h"
#include "layerwise_emulation.h"
#include "model/qwen35_cpu.h"

using namespace moeserve;
using namespace moeserve::gputest;
using model::testing::fixture_dir;
using model::testing::Reference;

namespace {

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

// A zero weight of the same format and shape: the part that scales the values (or the
// dense weight itself) replaced by zeros, so that it dequantises to 0 on every backend.
quant::QuantWeight zeroed(const quant::QuantWeight& w) {
  quant::QuantWeight z = w;
  std::string role;
  switch (w.format) {
    case quant::WeightFormat::Dense: role = "weight"; break;
    case quant::WeightFormat::GptqInt4: role = "scales"; break;
    case quant::WeightFormat::Fp8Block: role = "weight_scale_inv"; break;
    case quant::WeightFormat::Nvfp4: role = "weight_scale"; break;
    case quant::WeightFormat::Int8Rowwise: role = "row_scales"; break;
  }
  const Tensor& t = w.part(role);
  z.parts[role] = Tensor::empty(t.dtype(), t.shape());
  return z;
}

struct Cut {
  int layer;
  bool after_moe;
  std::string label() const { return "L" + std::to_string(layer) + (after_moe ? " moe  " : " mixer"); }
};

// The host weights and config of the model that stops at `cut`.
std::pair<io::Qwen35Config, model::Qwen35Weights> truncated(const io::Qwen35Config& config,
                                                            const model::Qwen35Weights& weights, const Cut& cut) {
  io::Qwen35Config c = config;
  model::Qwen35Weights w = weights;
  c.num_hidden_layers = cut.layer + 1;
  c.layer_types.resize(size_t(cut.layer + 1));
  c.mtp_num_hidden_layers = 0;
  w.layers.resize(size_t(cut.layer + 1));
  w.mtp.reset();
  if (!cut.after_moe) {
    auto& moe = w.layers.back().moe;
    for (auto& e : moe.experts) e.down = zeroed(e.down);
    moe.shared.down = zeroed(moe.shared.down);
  }
  return {std::move(c), std::move(w)};
}

struct RunOutput {
  std::vector<float> hidden;  // [T, H]
  std::vector<float> logits;  // [T, V]
};

// Feeds `ids` as a prefill of all but the last `decode` tokens, then one token per step.
RunOutput run(model::CausalLM& m, const std::vector<int32_t>& ids, int decode) {
  const int bs = m.cache_geometry().kv_block_size;
  std::vector<int32_t> blocks((ids.size() + size_t(bs) - 1) / size_t(bs));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::reverse(blocks.begin(), blocks.end());
  m.allocate_caches(int(blocks.size()) + 2, 2);
  m.reset_state(1);
  RunOutput out;
  size_t pos = 0;
  while (pos < ids.size()) {
    const size_t n = pos == 0 ? ids.size() - size_t(decode) : 1;
    model::SeqStep s;
    s.tokens = std::span<const int32_t>(ids.data() + pos, n);
    s.start_pos = int64_t(pos);
    s.kv_blocks = blocks;
    s.state_slot = 1;
    s.all_logits = true;
    model::StepOutput o;
    o.want_hidden = true;
    m.forward(std::span<const model::SeqStep>(&s, 1), o);
    out.hidden.insert(out.hidden.end(), o.hidden.begin(), o.hidden.end());
    out.logits.insert(out.logits.end(), o.logits.begin(), o.logits.end());
    pos += n;
  }
  return out;
}

cuda::CudaModelOptions gpu_options(int T) {
  cuda::CudaModelOptions o;
  o.max_tokens_per_step = std::max(T, 16);  // the prefill is one step
  o.max_seqs = 4;
  o.max_graph_batch = 4;
  o.max_model_len = T + 16;
  o.lm_head_chunk_rows = 32;
  return o;
}

RunOutput run_gpu(const io::Qwen35Config& c, const model::Qwen35Weights& w, const std::vector<int32_t>& ids,
                  int decode) {
  cuda::CudaWeights dw = cuda::upload_weights(w, /*int8_lm_head=*/false, nullptr);
  cuda::Qwen35CudaModel m(c, std::move(dw), gpu_options(int(ids.size())));
  return run(m, ids, decode);
}

RunOutput run_cpu(const io::Qwen35Config& c, const model::Qwen35Weights& w, const std::vector<int32_t>& ids,
                  int decode) {
  model::Qwen35CpuModel m(c, w, model::CpuModelOptions{});
  return run(m, ids, decode);
}

EmulatedForward emulate(const io::Qwen35Config& c, const model::Qwen35Weights& w, Bf16Points points,
                        const std::vector<int32_t>& ids, int decode) {
  EmulatedForward e(c, w, points, pool(), int(ids.size()));
  size_t pos = 0;
  while (pos < ids.size()) {
    const size_t n = pos == 0 ? ids.size() - size_t(decode) : 1;
    // run() leaves SeqStep::prompt_len at its default: every token, decode steps too, is a prompt token.
    e.step(std::span<const int32_t>(ids.data() + pos, n), /*prompt=*/true);
    pos += n;
  }
  return e;
}

double top1_agreement(const std::vector<float>& a, const std::vector<float>& b, size_t V) {
  size_t agree = 0, rows = a.size() / V;
  for (size_t r = 0; r < rows; ++r) {
    const auto ra = a.begin() + long(r * V), rb = b.begin() + long(r * V);
    agree += (std::max_element(ra, ra + long(V)) - ra) == (std::max_element(rb, rb + long(V)) - rb);
  }
  return rows ? double(agree) / double(rows) : 0.0;
}

// Tokens (of T) whose routed expert set differs between two runs at one layer.
int routing_differences(const std::vector<int32_t>& a, const std::vector<int32_t>& b, int k) {
  int diff = 0;
  for (size_t t = 0; t + size_t(k) <= std::min(a.size(), b.size()); t += size_t(k)) {
    std::vector<int32_t> x(a.begin() + long(t), a.begin() + long(t) + k), y(b.begin() + long(t), b.begin() + long(t) + k);
    std::sort(x.begin(), x.end());
    std::sort(y.begin(), y.end());
    diff += x != y;
  }
  return diff;
}

void diagnose(const std::string& name) {  // GTEST_SKIP inside: returns void
  SCOPED_TRACE(name);
  const Reference ref(name);
  const std::vector<int32_t> ids = ref.ids("input_ids");
  const int decode = 3;
  const io::Qwen35Config config = io::load_qwen35_config(fixture_dir(name));
  const io::Checkpoint ckpt = io::Checkpoint::open(fixture_dir(name));
  const model::Qwen35Weights weights = model::load_qwen35_weights(ckpt, config, model::WeightLoadOptions{false});
  const int L = int(config.num_hidden_layers);
  const size_t V = size_t(config.vocab_size);
  try {  // formats the CUDA backend rejects at upload (e.g. act-order GPTQ experts) end here
    cuda::upload_weights(weights, false, nullptr);
  } catch (const Error& e) {
    GTEST_SKIP() << name << ": the CUDA backend cannot load these weights: " << e.what();
  }

  const EmulatedForward exact = emulate(config, weights, Bf16Points::none(), ids, decode);
  const EmulatedForward emu = emulate(config, weights, Bf16Points::cuda_model(), ids, decode);

  std::printf("\n[layerwise] %s: T=%zu (prefill %zu + %d decode), %d layers; hidden after each cut, "
              "rel = max|d|/max|ref|, rms = ||d||/||ref||\n",
              name.c_str(), ids.size(), ids.size() - size_t(decode), decode, L);
  std::printf("  cut         type   | gpu~cpu rel  rms      | gpu~emu rel  rms      | emu~cpu rel  rms      | "
              "routing flips emu~cpu\n");
  std::string first_unexplained;
  for (int l = 0; l < L; ++l) {
    for (bool after_moe : {false, true}) {
      const Cut cut{l, after_moe};
      const auto [c, w] = truncated(config, weights, cut);
      const RunOutput gpu = run_gpu(c, w, ids, decode);
      const RunOutput cpu = run_cpu(c, w, ids, decode);
      const int ci = 2 * l + (after_moe ? 1 : 0);
      // The emulations ran the whole model: their residual after this cut, final-normed.
      const std::vector<float> emu_h = emu.final_normed(emu.residual(ci));
      const std::vector<float> exact_h = exact.final_normed(exact.residual(ci));
      ASSERT_EQ(gpu.hidden.size(), cpu.hidden.size());
      ASSERT_EQ(emu_h.size(), cpu.hidden.size());
      // The emulation without rounding is the CPU model's math (fp32 order noise only).
      const ErrorStats sanity = error_stats(exact_h, cpu.hidden);
      EXPECT_LT(sanity.rel, 1e-4) << cut.label() << ": the unrounded emulation differs from the CPU model";
      const ErrorStats gc = error_stats(gpu.hidden, cpu.hidden), ge = error_stats(gpu.hidden, emu_h),
                       ec = error_stats(emu_h, cpu.hidden);
      const int flips = after_moe ? routing_differences(emu.routing(l), exact.routing(l),
                                                        int(config.num_experts_per_tok))
                                  : 0;
      std::printf("  %-11s %-6s | %.3e %.3e | %.3e %.3e | %.3e %.3e | %d of %zu tokens\n", cut.label().c_str(),
                  config.layer_types[size_t(l)] == io::LayerType::FullAttention ? "attn" : "gdn", gc.rel, gc.rms_rel,
                  ge.rel, ge.rms_rel, ec.rel, ec.rms_rel, flips, ids.size());
      // Unexplained: the GPU strays from the fp32 CPU model more than twice as far as the
      // bf16 storage points of Bf16Points::cuda_model() explain (and above a floor). Now
      // that activations are f32 the emulation slightly over-rounds (it rounds q with the
      // cache), so "GPU closer to the emulation than to the CPU" is no longer the test.
      // The floor: the fixtures' tokens are prompt tokens, whose matmuls run on the tensor
      // cores with each f32 input split into bf16 hi + lo (docs/CUDA_BACKEND.md), which keeps
      // 16 of its 24 significant bits (relative error <= 2^-17 per element). Measured on the
      // H200 before any attention layer: 5e-6 rms after one sub-block, 2e-5 after six; a
      // kernel fault shows up at 1e-3 and above.
      if (first_unexplained.empty() && gc.rms_rel > std::max(2.0 * ec.rms_rel, 5e-5))
        first_unexplained = cut.label();
    }
  }

  // The whole model: logits.
  const RunOutput gpu = run_gpu(config, weights, ids, decode);
  const RunOutput cpu = run_cpu(config, weights, ids, decode);
  const ErrorStats gc = error_stats(gpu.logits, cpu.logits), ge = error_stats(gpu.logits, emu.logits()),
                   ec = error_stats(emu.logits(), cpu.logits), sanity = error_stats(exact.logits(), cpu.logits);
  std::printf("  logits             | %.3e %.3e | %.3e %.3e | %.3e %.3e |\n", gc.rel, gc.rms_rel, ge.rel, ge.rms_rel,
              ec.rel, ec.rms_rel);
  std::printf("  top-1 agreement: gpu~cpu %.4f, gpu~emu %.4f, emu~cpu %.4f; unrounded emulation~cpu rel %.3e\n",
              top1_agreement(gpu.logits, cpu.logits, V), top1_agreement(gpu.logits, emu.logits(), V),
              top1_agreement(emu.logits(), cpu.logits, V), sanity.rel);
  if (ref.has("logits")) {
    const std::vector<float> hf = ref.floats("logits");
    if (hf.size() == cpu.logits.size())
      std::printf("  vs transformers: cpu rel %.3e, gpu rel %.3e, top-1 gpu~hf %.4f\n", error_stats(cpu.logits, hf).rel,
                  error_stats(gpu.logits, hf).rel, top1_agreement(gpu.logits, hf, V));
  }
  EXPECT_LT(sanity.rel, 1e-4) << "the unrounded emulation differs from the CPU model's logits";
  EXPECT_TRUE(first_unexplained.empty())
      << name << ": from cut " << first_unexplained
      << " on, the GPU is not explained by bf16 storage (gpu~cpu rms > 2x emu~cpu rms): look at that sub-block's "
         "kernels, or update Bf16Points::cuda_model() if the model's storage changed";
}

}  // namespace

class Layerwise : public ::testing::TestWithParam<std::string> {};

// Runs without a GPU: the unrounded emulation after every cut equals the truncated CPU
// model (so the cuts and the emulation measure what they claim). Prints what bf16 storage
// costs per cut and per storage point.
TEST_P(Layerwise, EmulationAndCutsMatchTheCpuModel) {
  const std::string name = GetParam();
  const Reference ref(name);
  const std::vector<int32_t> ids = ref.ids("input_ids");
  const int decode = 3;
  const io::Qwen35Config config = io::load_qwen35_config(fixture_dir(name));
  const io::Checkpoint ckpt = io::Checkpoint::open(fixture_dir(name));
  const model::Qwen35Weights weights = model::load_qwen35_weights(ckpt, config, model::WeightLoadOptions{false});
  const EmulatedForward exact = emulate(config, weights, Bf16Points::none(), ids, decode);
  const EmulatedForward emu = emulate(config, weights, Bf16Points::cuda_model(), ids, decode);
  for (int l = 0; l < int(config.num_hidden_layers); ++l) {
    for (bool after_moe : {false, true}) {
      const Cut cut{l, after_moe};
      const auto [c, w] = truncated(config, weights, cut);
      const RunOutput cpu = run_cpu(c, w, ids, decode);
      const int ci = 2 * l + (after_moe ? 1 : 0);
      const auto exact_h = exact.final_normed(exact.residual(ci)), emu_h = emu.final_normed(emu.residual(ci));
      const ErrorStats e = error_stats(exact_h, cpu.hidden), r = error_stats(emu_h, cpu.hidden);
      const int flips =
          after_moe ? routing_differences(emu.routing(l), exact.routing(l), int(config.num_experts_per_tok)) : 0;
      std::printf("[emulation %s %s] unrounded~cpu rel %.3e, bf16-storage~cpu rel %.3e rms %.3e, routing flips %d of "
                  "%zu tokens\n",
                  name.c_str(), cut.label().c_str(), e.rel, r.rel, r.rms_rel, flips, ids.size());
      EXPECT_LT(e.rel, 1e-4) << cut.label();
    }
  }
  const RunOutput cpu = run_cpu(config, weights, ids, decode);
  EXPECT_LT(error_stats(exact.logits(), cpu.logits).rel, 1e-4);
  // What each bf16 storage point costs (logits vs the fp32 CPU model): alone, and what the
  // CUDA model's storage gains when only that point is kept in f32 instead. This says where
  // f32 pays off; on these small random fixtures bf16 errors grow layer by layer.
  const std::vector<std::pair<std::string, bool Bf16Points::*>> points{
      {"weights", &Bf16Points::weights},
      {"norm_out", &Bf16Points::norm_out},
      {"side_inputs", &Bf16Points::side_inputs},
      {"attn_projections", &Bf16Points::attn_projections},
      {"attn_q_and_cache", &Bf16Points::attn_q_and_cache},
      {"attn_out", &Bf16Points::attn_out},
      {"gdn_qkv_z", &Bf16Points::gdn_qkv_z},
      {"gdn_gates", &Bf16Points::gdn_gates},
      {"gdn_out", &Bf16Points::gdn_out},
      {"expert_act", &Bf16Points::expert_act},
      {"shared_expert", &Bf16Points::shared_expert},
      {"final_norm_out", &Bf16Points::final_norm_out}};
  const size_t V = size_t(config.vocab_size);
  const ErrorStats all = error_stats(emu.logits(), cpu.logits);
  std::printf("[bf16 points %s] the CUDA model's storage: logits rel %.3e rms %.3e, top-1 agreement %.4f\n",
              name.c_str(), all.rel, all.rms_rel, top1_agreement(emu.logits(), cpu.logits, V));
  std::printf("  %-17s | alone: rel  rms       top-1  | CUDA model with it in f32: rel rms top-1\n", "point");
  for (const auto& [label, field] : points) {
    Bf16Points one = Bf16Points::none();
    one.*field = true;
    if (field == &Bf16Points::side_inputs) one.norm_out = true;  // side inputs then read the rounded x_
    const EmulatedForward e1 = emulate(config, weights, one, ids, decode);
    Bf16Points but = Bf16Points::cuda_model();
    but.*field = false;
    const EmulatedForward e2 = emulate(config, weights, but, ids, decode);
    const ErrorStats s1 = error_stats(e1.logits(), cpu.logits), s2 = error_stats(e2.logits(), cpu.logits);
    std::printf("  %-17s | %.3e %.3e %.4f | %.3e %.3e %.4f%s\n", label.c_str(), s1.rel, s1.rms_rel,
                top1_agreement(e1.logits(), cpu.logits, V), s2.rel, s2.rms_rel,
                top1_agreement(e2.logits(), cpu.logits, V),
                Bf16Points::cuda_model().*field ? "" : "   (f32 in the CUDA model already)");
  }
}

TEST_P(Layerwise, GpuAgainstCpuAndBf16Emulation) {
  MOESERVE_REQUIRE_GPU();
  diagnose(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Layerwise, ::testing::ValuesIn(model::testing::fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });
