// Per-kernel decode benchmark: every op of a Qwen3.5 MoE decode step, alone, at the shapes
// of a config.json, with random weights in the format the model would hold them, against the
// measured copy bandwidth.
//
//   bench_kernels --config bench/configs/qwen3.5-122b-a10b.json --weights hybrid-int4-fp8 --batch 1,8,64
//   bench_kernels --config bench/configs/qwen3.5-35b-a3b.json --weights bf16 --batch 1,8,64 --csv
//   bench_kernels --only moe,lm_head --batch 1      (ops whose name contains a listed substring)
//   bench_kernels --only proj,lm_head,router,shared --gemv-family tensor-cores
//       (the generated tokens' dense projections through tc_gemv, ops_tc_gemv.h, instead of the
//       CUDA-core row GEMVs; the format column then ends in "/tc")
//
// Built by bench/CMakeLists.txt (every bench/cuda/*.cpp is a program when MOESERVE_CUDA is on).
// Formats (as dummy_weights() makes them): hybrid-int4-fp8 = GPTQ INT4 routed experts, FP8
// block-128 attention / DeltaNet qkv, z, out / shared expert, BF16 router, in_proj_b/a and
// shared_expert_gate; bf16 = everything BF16. The LM head is INT8 row-wise unless the weights
// are bf16 (--lm-head overrides). The ops are called through their public APIs exactly as
// qwen35_cuda.cpp calls them (f32 activations, LinearRunner / linear_f32_input, ...).
//
// Timing. For each op and batch size: one warm-up pass over all its copies, then --iters
// launches (>= 50) queued behind a few large device-to-device copies, so the whole queue is
// submitted before the GPU reaches it (the host enqueue time is checked against that delay),
// with a CUDA event between consecutive launches: `us` is the median interval (kernel time
// plus the gap between stream launches and the event, a few us that dominate the tiny ops).
// `graph_us` is the median over 5 replays of one CUDA graph of --iters launches, per launch
// (the way a decode step runs them): the number to compare with a step's time.
//
// Bytes: the minimum a launch must move: weights read (for the routed MoE, the distinct
// experts the random router logits select, counted on the host), activations read and
// written, KV cache read (attention) or written (attention_prepare), GDN states read and
// written. Scratch traffic inside an op (MoE / GDN workspaces) is not counted. GB/s = bytes
// / us; `copy` = that over the copy bandwidth (a 4 GiB device-to-device copy, read + write).
//
// L2: each op rotates over enough distinct copies of its weights (or KV blocks, state slots,
// embedding rows, router choices) that the data of one rotation is >= --rotate-mb (256 MB
// by default, several times the L2), so every launch reads its weights from HBM as in the
// model, where the other layers' weights evict them. Activations stay in L2, as in the model.
//
// `calls` is the number of launches of the op per decode step of the whole model and
// `us/step` = us · calls; the `step total` rows add them up (attention at the first --context).
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "bench_util.h"
#include "kernel_variant_flags.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_linear.h"
#include "backend/cuda/dummy_fill.h"
#include "backend/cuda/linear_runner.h"
#include "backend/cuda/ops_attention.h"
#include "backend/cuda/ops_basic.h"
#include "backend/cuda/ops_gdn.h"
#include "backend/cuda/ops_moe.h"
#include "backend/cuda/ops_quant_gemv.h"
#include "backend/cuda/ops_small_linear.h"
#include "backend/cuda/ops_tc_gemv.h"
#include "backend/cuda/step_meta.h"
#include "io/qwen35_config.h"

using namespace moeserve;
using namespace moeserve::cuda;
using quant::WeightFormat;
using Clock = std::chrono::steady_clock;

namespace {



double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? std::nan("") : v[v.size() / 2];
}

// ---- timing -------------------------------------------------------------------------------

struct Timing {
  double us = 0;        // median per-launch interval, stream launches
  double graph_us = 0;  // mean per launch inside one CUDA graph (NaN if capture failed)
};

class Timer {
 public:
  Timer(cudaStream_t stream, int iters) : s_(stream), iters_(iters), events_(size_t(iters) + 1) {
    for (auto& e : events_) MOESERVE_CUDA_CHECK(cudaEventCreate(&e));
    MOESERVE_CUDA_CHECK(cudaEventCreate(&start_));
    delay_src_.resize(kDelayBytes);
    delay_dst_.resize(kDelayBytes);
    delay_src_.zero(s_);
  }
  ~Timer() {
    for (auto& e : events_) cudaEventDestroy(e);
    cudaEventDestroy(start_);
  }

  // launch(i) enqueues one launch on the stream using copy i % rotation of the op's data.
  Timing time(const std::function<void(int64_t)>& launch, int rotation) {
    Timing t;
    for (int i = 0; i < std::max(3, rotation); ++i) launch(next_++);  // warm-up: every copy once
    MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s_));

    std::vector<double> us;
    for (int attempt = 0; attempt < 6; ++attempt) {
      // A queue of large copies holds the GPU while the host submits every timed launch.
      MOESERVE_CUDA_CHECK(cudaEventRecord(start_, s_));
      for (int k = 0; k < delay_copies_; ++k)
        MOESERVE_CUDA_CHECK(cudaMemcpyAsync(delay_dst_.data(), delay_src_.data(), kDelayBytes,
                                            cudaMemcpyDeviceToDevice, s_));
      const auto h0 = Clock::now();
      for (int i = 0; i < iters_; ++i) {
        MOESERVE_CUDA_CHECK(cudaEventRecord(events_[size_t(i)], s_));
        launch(next_++);
      }
      MOESERVE_CUDA_CHECK(cudaEventRecord(events_[size_t(iters_)], s_));
      const double enqueue_ms = std::chrono::duration<double, std::milli>(Clock::now() - h0).count();
      MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s_));
      float delay_ms = 0;
      MOESERVE_CUDA_CHECK(cudaEventElapsedTime(&delay_ms, start_, events_[0]));
      us.clear();
      for (int i = 0; i < iters_; ++i) {
        float ms = 0;
        MOESERVE_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[size_t(i)], events_[size_t(i) + 1]));
        us.push_back(double(ms) * 1e3);
      }
      if (enqueue_ms < 0.8 * delay_ms) break;  // the GPU never waited for the host
      if (delay_copies_ >= 1024) {
        std::fprintf(stderr, "warning: host enqueue (%.2f ms) outlasted the delay (%.2f ms)\n", enqueue_ms,
                     double(delay_ms));
        break;
      }
      delay_copies_ *= 2;
    }
    t.us = median(us);
    t.graph_us = time_graph(launch);
    return t;
  }

 private:
  double time_graph(const std::function<void(int64_t)>& launch) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    try {
      MOESERVE_CUDA_CHECK(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal));
      try {
        for (int i = 0; i < iters_; ++i) launch(next_++);
      } catch (...) {
        cudaStreamEndCapture(s_, &graph);
        throw;
      }
      MOESERVE_CUDA_CHECK(cudaStreamEndCapture(s_, &graph));
      MOESERVE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "graph capture failed: %s\n", e.what());
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      return std::nan("");
    }
    MOESERVE_CUDA_CHECK(cudaGraphLaunch(exec, s_));  // warm-up (uploads the graph)
    MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s_));
    constexpr int kReps = 5;
    std::vector<double> per_launch;
    for (int r = 0; r < kReps; ++r) {
      MOESERVE_CUDA_CHECK(cudaEventRecord(events_[0], s_));
      MOESERVE_CUDA_CHECK(cudaGraphLaunch(exec, s_));
      MOESERVE_CUDA_CHECK(cudaEventRecord(events_[1], s_));
      MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s_));
      float ms = 0;
      MOESERVE_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[0], events_[1]));
      per_launch.push_back(double(ms) * 1e3 / iters_);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return median(per_launch);
  }

  static constexpr size_t kDelayBytes = size_t(256) << 20;
  cudaStream_t s_;
  int iters_;
  int delay_copies_ = 16;
  int64_t next_ = 0;  // launches keep rotating across calls
  std::vector<cudaEvent_t> events_;
  cudaEvent_t start_ = nullptr;
  DeviceBuffer<uint8_t> delay_src_, delay_dst_;
};

// ---- random data in each format -------------------------------------------------------------

struct Maker {
  cudaStream_t s;
  uint64_t seed = 1;

  // One [N, K] weight (copies > 1: that many stacked, as the routed experts are).
  DeviceLinear linear(int64_t N, int64_t K, WeightFormat fmt, int64_t copies = 1) {
    DeviceLinear d;
    d.format = fmt;
    d.N = N;
    d.K = K;
    const size_t nk = size_t(N) * size_t(K) * size_t(copies);
    const float amp = std::sqrt(3.0f / float(K));
    switch (fmt) {
      case WeightFormat::Dense:
        d.dense.resize(nk);
        fill_uniform_bf16(d.dense.data(), nk, ++seed, amp, s);
        break;
      case WeightFormat::GptqInt4: {
        if (K % 32 != 0 || N % 8 != 0) throw Error("GPTQ weight needs K % 32 == 0 and N % 8 == 0");
        d.group_size = K % 128 == 0 ? 128 : 32;
        d.sym = true;
        const size_t groups = size_t(K / d.group_size) * size_t(copies);
        d.qweight.resize(size_t(K / 8) * size_t(N) * size_t(copies));
        fill_random_words(d.qweight.data(), d.qweight.size(), ++seed, s);
        d.scales.resize(groups * size_t(N));
        fill_uniform_f16(d.scales.data(), d.scales.size(), ++seed, 0.05f * amp, 0.15f * amp, s);
        d.qzeros.resize(groups * size_t(N / 8));
        fill_constant_words(d.qzeros.data(), d.qzeros.size(), 0x77777777, s);  // zero 8 (stored 7)
        break;
      }
      case WeightFormat::Fp8Block: {
        d.fp8.resize(nk);
        fill_uniform_fp8(d.fp8.data(), nk, ++seed, 2.0f, s);
        d.scale.resize(size_t((N + 127) / 128) * size_t((K + 127) / 128) * size_t(copies));
        fill_uniform_f32(d.scale.data(), d.scale.size(), ++seed, 0.3f * amp, 0.9f * amp, s);
        break;
      }
      case WeightFormat::Int8Rowwise: {
        d.int8.resize(nk);
        fill_uniform_int8(d.int8.data(), nk, ++seed, s);
        d.scale.resize(size_t(N) * size_t(copies));
        fill_uniform_f32(d.scale.data(), d.scale.size(), ++seed, 0.5f * amp / 127, 1.5f * amp / 127, s);
        break;
      }
      default:
        throw Error("bench_kernels: unsupported weight format");
    }
    return d;
  }

  DeviceBuffer<float> f32(size_t n, float lo, float hi) {
    DeviceBuffer<float> d(n);
    fill_uniform_f32(d.data(), n, ++seed, lo, hi, s);
    return d;
  }
  DeviceBuffer<bf16> bf16s(size_t n, float amp) {
    DeviceBuffer<bf16> d(n);
    fill_uniform_bf16(d.data(), n, ++seed, amp, s);
    return d;
  }
};

const char* fmt_label(WeightFormat f) {
  switch (f) {
    case WeightFormat::Dense: return "bf16";
    case WeightFormat::GptqInt4: return "int4";
    case WeightFormat::Fp8Block: return "fp8";
    case WeightFormat::Int8Rowwise: return "int8";
    default: return "?";
  }
}

// Decode metadata of `copies` independent batches of b sequences, one new token each at
// position ctx. Copy c's sequence i owns state slot c·b + i and KV blocks
// (c·b + i)·bps .. + bps - 1 (bps = blocks per sequence). Per copy, in int32s:
// token_seq [b] | token_pos [b] | seq_start_pos [b] | seq_state_slot [b] | seq_token_start [b+1]
// | block_tables [b][bps].
class DecodeMeta {
 public:
  DecodeMeta(int b, int ctx, int copies, int block_size) : b_(b) {
    bps_ = (ctx + 1 + block_size - 1) / block_size;
    stride_ = 5 * size_t(b) + 1 + size_t(b) * size_t(bps_);
    std::vector<int32_t> h(stride_ * size_t(copies));
    for (int c = 0; c < copies; ++c) {
      int32_t* p = h.data() + size_t(c) * stride_;
      for (int i = 0; i < b; ++i) {
        p[i] = i;
        p[b + i] = ctx;
        p[2 * b + i] = ctx;
        p[3 * b + i] = c * b + i;
      }
      for (int i = 0; i <= b; ++i) p[4 * b + i] = i;
      int32_t* tables = p + 5 * b + 1;
      for (int i = 0; i < b; ++i)
        for (int j = 0; j < bps_; ++j) tables[size_t(i) * bps_ + j] = (c * b + i) * bps_ + j;
    }
    dev_.resize(h.size());
    dev_.upload(h.data(), h.size());
  }
  StepMeta at(int c) const {
    const int32_t* p = dev_.data() + size_t(c) * stride_;
    StepMeta m;
    m.num_tokens = b_;
    m.num_seqs = b_;
    m.max_blocks_per_seq = bps_;
    m.token_seq = p;
    m.token_pos = p + b_;
    m.seq_start_pos = p + 2 * b_;
    m.seq_state_slot = p + 3 * b_;
    m.seq_token_start = p + 4 * b_;
    m.block_tables = p + 5 * b_ + 1;
    return m;
  }
  int blocks_per_seq() const { return bps_; }

 private:
  int b_, bps_;
  size_t stride_;
  DeviceBuffer<int32_t> dev_;
};

// ---- the benchmark --------------------------------------------------------------------------

struct Row {
  std::string op, format, shape;
  int batch = 0, calls = 0;
  bool in_total = true;
  Timing t;
  double bytes = 0;
};

struct Options {
  std::string weights = "hybrid-int4-fp8", lm_head = "auto";
  std::vector<int> batches, contexts;
  std::vector<std::string> only;
  int iters = 100;
  double rotate_bytes = 256e6;
  bool tensor_core_gemv = false;  // --gemv-family tensor-cores: dense projections through tc_gemv
  bool tensor_core_attention = true;  // --decode-attention: paged_attention_generated's family
};

class KernelBench {
 public:
  KernelBench(const io::Qwen35Config& c, const Options& o, cudaStream_t s)
      : c_(c), o_(o), s_(s), timer_(s, o.iters), mk_{s}, runner_(0, true) {
    WeightFormat experts = WeightFormat::Dense, dense_proj = WeightFormat::Dense;
    if (o.weights == "gptq-int4") experts = dense_proj = WeightFormat::GptqInt4;
    else if (o.weights == "fp8-block") experts = dense_proj = WeightFormat::Fp8Block;
    else if (o.weights == "hybrid-int4-fp8") experts = WeightFormat::GptqInt4, dense_proj = WeightFormat::Fp8Block;
    else if (o.weights != "bf16")
      throw Error("unknown --weights '" + o.weights + "' (bf16, gptq-int4, fp8-block, hybrid-int4-fp8)");
    experts_ = experts;
    dense_proj_ = dense_proj;
    if (o.lm_head == "auto") head_ = o.weights == "bf16" ? WeightFormat::Dense : WeightFormat::Int8Rowwise;
    else if (o.lm_head == "int8") head_ = WeightFormat::Int8Rowwise;
    else if (o.lm_head == "bf16") head_ = WeightFormat::Dense;
    else throw Error("unknown --lm-head '" + o.lm_head + "' (auto, bf16, int8)");
    const int maxM = *std::max_element(o.batches.begin(), o.batches.end());
    const size_t widest = size_t(std::max({c.hidden_size, c.num_attention_heads * c.head_dim * 2, c.linear_conv_dim(),
                                           c.linear_value_dim(), c.num_experts, c.shared_expert_intermediate_size,
                                           c.moe_intermediate_size}));
    x_ = mk_.f32(size_t(maxM) * widest, -1.0f, 1.0f);
    y_.resize(size_t(maxM) * std::max(widest, size_t(c.vocab_size)));
    y_.zero(s_);
  }

  void run_all() {
    const auto& c = c_;
    const int64_t H = c.hidden_size, L = c.num_hidden_layers, E = c.num_experts;
    const int64_t Is = c.shared_expert_intermediate_size, nq = c.num_attention_heads, nkv = c.num_key_value_heads;
    const int64_t hd = c.head_dim, nv = c.linear_num_value_heads;
    const int nfull = c.num_full_attention_layers(), nlin = c.num_linear_attention_layers();
    for (int b : o_.batches) {
      if (nfull > 0) {
        linear("q_proj", nq * hd * 2, H, dense_proj_, b, nfull, false, false);
        linear("k_proj", nkv * hd, H, dense_proj_, b, nfull, false, false);
        linear("v_proj", nkv * hd, H, dense_proj_, b, nfull, false, false);
        linear("o_proj", H, nq * hd, dense_proj_, b, nfull, true, false);
        for (size_t i = 0; i < o_.contexts.size(); ++i) attention(b, o_.contexts[i], nfull, i == 0);
      }
      if (nlin > 0) {
        linear("in_proj_qkv", c.linear_conv_dim(), H, dense_proj_, b, nlin, false, false);
        linear("in_proj_z", c.linear_value_dim(), H, dense_proj_, b, nlin, false, false);
        linear("in_proj_b", nv, H, WeightFormat::Dense, b, nlin, false, true);
        linear("in_proj_a", nv, H, WeightFormat::Dense, b, nlin, false, true);
        linear_group("in_proj_qkv+z+b+a (1 launch)",
                     {{c.linear_conv_dim(), dense_proj_}, {c.linear_value_dim(), dense_proj_},
                      {nv, WeightFormat::Dense}, {nv, WeightFormat::Dense}},
                     H, b, nlin);
        gdn(b, nlin);
        linear("out_proj", H, c.linear_value_dim(), dense_proj_, b, nlin, true, false);
      }
      linear("router", E, H, WeightFormat::Dense, b, int(L), false, true);
      moe(b, int(L));
      linear("shared_gate", Is, H, dense_proj_, b, int(L), false, false);
      linear("shared_up", Is, H, dense_proj_, b, int(L), false, false);
      linear("shared_down", H, Is, dense_proj_, b, int(L), false, false);
      linear("shared_expert_gate", 1, H, WeightFormat::Dense, b, int(L), false, true);
      linear_group("router+seg+shared_gate+up (1 launch)",
                   {{E, WeightFormat::Dense}, {1, WeightFormat::Dense}, {Is, dense_proj_}, {Is, dense_proj_}}, H, b,
                   int(L));
      shared_down_gated(H, Is, b, int(L));
      basic(b);
      linear("lm_head", c.vocab_size, H, head_, b, 1, false, false);
    }
  }

  const std::vector<Row>& rows() const { return rows_; }

 private:
  bool wanted(const std::string& op) const {
    if (o_.only.empty()) return true;
    for (const auto& s : o_.only)
      if (op.find(s) != std::string::npos) return true;
    return false;
  }

  // Number of copies so that one rotation covers at least rotate_bytes.
  int copies_for(double bytes_each) const {
    return int(std::clamp(std::ceil(o_.rotate_bytes / std::max(bytes_each, 1.0)), 1.0, 16384.0));
  }

  void record(const std::string& op, const std::string& format, const std::string& shape, int b, int calls,
              const Timing& t, double bytes, bool in_total = true) {
    rows_.push_back(Row{op, format, shape, b, calls, in_total, t, bytes});
    const Row& r = rows_.back();
    std::fprintf(stderr, "  %-28s b=%-3d %9.2f us  graph %9.2f us  %10.3f MB\n", op.c_str(), b, r.t.us, r.t.graph_us,
                 bytes / 1e6);
  }

  // Y = X·Wᵀ as the model runs it: f32 activations through LinearRunner (batch-invariant
  // row-tiled kernels), or linear_f32_input for the f32-input projections (router, DeltaNet
  // gates, shared expert gate) when the weight allows it. accumulate: y += (o_proj, out_proj).
  void linear(const std::string& op, int64_t N, int64_t K, WeightFormat fmt, int b, int calls, bool accumulate,
              bool f32_input_path) {
    if (!wanted(op)) return;
    std::vector<DeviceLinear> ws;
    ws.push_back(mk_.linear(N, K, fmt));
    const double wbytes = double(ws[0].bytes());
    const int n = copies_for(wbytes);
    for (int i = 1; i < n; ++i) ws.push_back(mk_.linear(N, K, fmt));
    MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s_));
    const bool tc = o_.tensor_core_gemv && tc_gemv_supported(ws[0]);
    const bool small = !tc && f32_input_path && small_linear_supported(ws[0]);
    auto launch = [&](int64_t i) {
      const DeviceLinear& w = ws[size_t(i % n)];
      if (tc) {
        const RowGemvJob job{&w, y_.data(), accumulate};
        tc_gemv_f32(x_.data(), b, std::span<const RowGemvJob>(&job, 1), s_);
      } else if (small) {
        linear_f32_input(x_.data(), b, w, y_.data(), s_);
      } else {
        runner_.run(x_.data(), b, w, y_.data(), /*y_f32=*/true, s_, accumulate);
      }
    };
    const Timing t = timer_.time(launch, n);
    const double bytes = wbytes + double(b) * double(K) * 4 + double(b) * double(N) * 4 * (accumulate ? 2 : 1);
    record(op, std::string(fmt_label(fmt)) + (tc ? "/tc" : ""), std::to_string(N) + "x" + std::to_string(K), b, calls,
           t, bytes);
  }

  // Several projections of the same f32 x in ONE row_gemv_f32 launch (mixed formats), as the
  // model can run them (router + shared_expert_gate + shared_gate + shared_up; in_proj_qkv +
  // z + b + a). Not in the step total: the separate rows above are what the model runs today.
  struct Proj {
    int64_t N;
    WeightFormat fmt;
  };
  void linear_group(const std::string& op, const std::vector<Proj>& ps, int64_t K, int b, int calls) {
    if (!wanted(op)) return;
    std::vector<std::vector<DeviceLinear>> sets(1);
    double wbytes = 0;
    int64_t rows = 0;
    std::string fmt, shape;
    for (const auto& p : ps) {
      sets[0].push_back(mk_.linear(p.N, K, p.fmt));
      wbytes += double(sets[0].back().bytes());
      rows += p.N;
      fmt += std::string(fmt.empty() ? "" : "+") + fmt_label(p.fmt);
      shape += (shape.empty() ? "" : "+") + std::to_string(p.N);
    }
    const int n = copies_for(wbytes);
    for (int i = 1; i < n; ++i) {
      sets.emplace_back();
      for (const auto& p : ps) sets.back().push_back(mk_.linear(p.N, K, p.fmt));
    }
    MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s_));
    std::vector<std::vector<RowGemvJob>> jobs(sets.size());
    for (size_t i = 0; i < sets.size(); ++i) {
      size_t off = 0;
      for (const auto& w : sets[i]) {
        jobs[i].push_back({&w, y_.data() + off, false});
        off += size_t(b) * size_t(w.N);
      }
    }
    bool tc = o_.tensor_core_gemv;
    for (const auto& w : sets[0]) tc = tc && tc_gemv_supported(w);
    auto launch = [&](int64_t i) {
      if (tc) tc_gemv_f32(x_.data(), b, jobs[size_t(i % n)], s_);
      else row_gemv_f32(x_.data(), b, jobs[size_t(i % n)], s_);
    };
    const Timing t = timer_.time(launch, n);
    const double bytes = wbytes + double(b) * double(K) * 4 + double(b) * double(rows) * 4;
    record(op, fmt + (tc ? "/tc" : ""), shape + "x" + std::to_string(K), b, calls, t, bytes, /*in_total=*/false);
  }

  // The shared expert's down projection reading silu(g)·u directly (row_gemv_f32_gated): the
  // silu_mul_split + shared_down pair in one launch. Not in the step total.
  void shared_down_gated(int64_t H, int64_t Is, int b, int calls) {
    const std::string op = "shared_down gated (silu fused)";
    if (!wanted(op)) return;
    std::vector<DeviceLinear> ws;
    ws.push_back(mk_.linear(H, Is, dense_proj_));
    const double wbytes = double(ws[0].bytes());
    const int n = copies_for(wbytes);
    for (int i = 1; i < n; ++i) ws.push_back(mk_.linear(H, Is, dense_proj_));
    MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s_));
    const bool tc = o_.tensor_core_gemv && tc_gemv_gated_supported(ws[0]);
    if (!tc && !row_gemv_gated_supported(ws[0])) return;
    DeviceBuffer<float> g = mk_.f32(size_t(b) * Is, -4, 4), u = mk_.f32(size_t(b) * Is, -2, 2);
    MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s_));
    auto launch = [&](int64_t i) {
      if (tc) tc_gemv_f32_gated(g.data(), u.data(), b, ws[size_t(i % n)], y_.data(), false, s_);
      else row_gemv_f32_gated(g.data(), u.data(), b, ws[size_t(i % n)], y_.data(), false, s_);
    };
    const Timing t = timer_.time(launch, n);
    const double bytes = wbytes + double(b) * double(Is) * 8 + double(b) * double(H) * 4;
    record(op, std::string(fmt_label(dense_proj_)) + (tc ? "/tc" : ""), std::to_string(H) + "x" + std::to_string(Is),
           b, calls, t, bytes, /*in_total=*/false);
  }

  void attention(int b, int ctx, int calls, bool in_total) {
    const auto& c = c_;
    const std::string suffix = " ctx=" + std::to_string(ctx);
    if (!wanted("attention_prepare" + suffix) && !wanted("paged_attention" + suffix) &&
        !wanted("attention_prepare+paged" + suffix))
      return;
    const AttentionShape as{int(c.num_attention_heads), int(c.num_key_value_heads), int(c.head_dim),
                            int(c.rotary_dim()), float(c.rms_norm_eps)};
    constexpr int kBlock = 16;
    const size_t q_dim = size_t(as.num_q_heads) * as.head_dim, kv_dim = size_t(as.num_kv_heads) * as.head_dim;
    const double kv_read = double(b) * double(ctx + 1) * double(kv_dim) * 2 * 2;  // K and V, bf16
    const int copies = copies_for(kv_read);
    DecodeMeta meta(b, ctx, copies, kBlock);
    const size_t blocks = size_t(copies) * size_t(b) * size_t(meta.blocks_per_seq());
    const size_t cache_elems = blocks * kv_dim * kBlock;
    DeviceBuffer<bf16> kc = mk_.bf16s(cache_elems, 1.0f), vc = mk_.bf16s(cache_elems, 1.0f);
    const KvCacheView kv{kc.data(), vc.data(), int(blocks), as.num_kv_heads, kBlock, as.head_dim};
    DeviceBuffer<float> qg = mk_.f32(size_t(b) * q_dim * 2, -1, 1), k = mk_.f32(size_t(b) * kv_dim, -1, 1),
                        v = mk_.f32(size_t(b) * kv_dim, -1, 1), qn = mk_.f32(size_t(as.head_dim), -0.1f, 0.1f),
                        kn = mk_.f32(size_t(as.head_dim), -0.1f, 0.1f);
    std::vector<float> inv_freq_h(size_t(as.rotary_dim / 2));
    for (size_t j = 0; j < inv_freq_h.size(); ++j)
      inv_freq_h[j] = float(std::pow(c.rope_theta, -2.0 * double(j) / double(as.rotary_dim)));
    DeviceBuffer<float> inv_freq(inv_freq_h.size());
    inv_freq.upload(inv_freq_h.data(), inv_freq_h.size());
    DeviceBuffer<float> q(size_t(b) * q_dim), gate(size_t(b) * q_dim), out(size_t(b) * q_dim);
    DeviceBuffer<uint8_t> ws(std::max<size_t>(1, paged_attention_workspace_bytes(as, b, ctx + 1)));
    MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s_));
    // Queries and gates as attention_prepare leaves them (normalised, rotated).
    attention_prepare(qg.data(), k.data(), v.data(), qn.data(), kn.data(), inv_freq.data(), as, meta.at(0), kv,
                      q.data(), gate.data(), s_);
    if (wanted("attention_prepare" + suffix)) {
      auto launch = [&](int64_t i) {
        attention_prepare(qg.data(), k.data(), v.data(), qn.data(), kn.data(), inv_freq.data(), as,
                          meta.at(int(i % copies)), kv, q.data(), gate.data(), s_);
      };
      const Timing t = timer_.time(launch, copies);
      const double bytes = double(b) * (double(q_dim) * 2 * 4 + double(kv_dim) * 2 * 4 +  // qg, k, v read
                                        double(q_dim) * 2 * 4 +                            // q, gate written
                                        double(kv_dim) * 2 * 2) +                          // K, V cached (bf16)
                           double(as.head_dim) * 8 + double(inv_freq_h.size()) * 4;
      record("attention_prepare" + suffix, "-", "nq" + std::to_string(as.num_q_heads) + "/nkv" +
             std::to_string(as.num_kv_heads) + "/hd" + std::to_string(as.head_dim), b, calls, t, bytes, in_total);
    }
    if (wanted("paged_attention" + suffix)) {
      const float scale = 1.0f / std::sqrt(float(as.head_dim));
      auto launch = [&](int64_t i) {
        paged_attention_generated(q.data(), gate.data(), as, meta.at(int(i % copies)), kv, scale,
                                  o_.tensor_core_attention, ws.data(), ws.bytes(), out.data(), s_);
      };
      const Timing t = timer_.time(launch, copies);
      const double bytes = kv_read + double(b) * double(q_dim) * 3 * 4;  // + q, gate read, out written
      record("paged_attention" + suffix, "bf16 kv", "kv " + std::to_string(ctx + 1), b, calls, t, bytes, in_total);
    }
    // The two as the model runs them back to back (the decode kernel is a programmatic
    // dependent launch of attention_prepare): the generated tokens' attention per layer. Not
    // in the step total (the rows above are). Bytes: the K/V read and the activations of both.
    if (wanted("attention_prepare+paged" + suffix)) {
      const float scale = 1.0f / std::sqrt(float(as.head_dim));
      auto launch = [&](int64_t i) {
        const StepMeta m = meta.at(int(i % copies));
        attention_prepare(qg.data(), k.data(), v.data(), qn.data(), kn.data(), inv_freq.data(), as, m, kv, q.data(),
                          gate.data(), s_);
        paged_attention_generated(q.data(), gate.data(), as, m, kv, scale, o_.tensor_core_attention, ws.data(),
                                  ws.bytes(), out.data(), s_);
      };
      const Timing t = timer_.time(launch, copies);
      const double bytes = kv_read + double(b) * (double(q_dim) * 2 * 4 + double(kv_dim) * 2 * 4 +  // qg, k, v
                                                  double(q_dim) * 5 * 4 + double(kv_dim) * 2 * 2);  // q, gate, out, K/V
      record("attention_prepare+paged" + suffix, "bf16 kv", "kv " + std::to_string(ctx + 1), b, calls, t, bytes,
             false);
    }
  }

  void gdn(int b, int calls) {
    if (!wanted("gated_delta_net")) return;
    const auto& c = c_;
    const GdnShape gs{int(c.linear_num_key_heads), int(c.linear_num_value_heads), int(c.linear_key_head_dim),
                      int(c.linear_value_head_dim), int(c.linear_conv_kernel_dim), float(c.rms_norm_eps)};
    const size_t rec = size_t(gs.num_v_heads) * gs.k_head_dim * gs.v_head_dim;
    const size_t conv = size_t(gs.conv_dim()) * size_t(gs.conv_kernel - 1);
    const double state_bytes = double(b) * double(rec + conv) * 4;
    const int copies = copies_for(state_bytes);
    DecodeMeta meta(b, 512, copies, 16);
    const size_t slots = size_t(copies) * size_t(b);
    DeviceBuffer<float> conv_state = mk_.f32(slots * conv, -0.5f, 0.5f);
    DeviceBuffer<float> rec_state = mk_.f32(slots * rec, -0.01f, 0.01f);
    DeviceBuffer<float> conv_w = mk_.f32(size_t(gs.conv_dim()) * gs.conv_kernel, -0.5f, 0.5f);
    DeviceBuffer<float> dt_bias = mk_.f32(size_t(gs.num_v_heads), -0.5f, 0.5f);
    DeviceBuffer<float> a_log = mk_.f32(size_t(gs.num_v_heads), -1.0f, 1.0f);
    DeviceBuffer<float> norm_w = mk_.f32(size_t(gs.v_head_dim), 0.8f, 1.2f);
    DeviceBuffer<float> qkv = mk_.f32(size_t(b) * gs.conv_dim(), -1, 1), z = mk_.f32(size_t(b) * gs.value_dim(), -1, 1);
    DeviceBuffer<float> bb = mk_.f32(size_t(b) * gs.num_v_heads, -2, 2);
    DeviceBuffer<float> aa = mk_.f32(size_t(b) * gs.num_v_heads, -2, 2);
    DeviceBuffer<float> out(size_t(b) * gs.value_dim());
    DeviceBuffer<uint8_t> ws(std::max<size_t>(1, gdn_workspace_bytes(gs, b)));
    MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s_));
    const double bytes = 2 * state_bytes +  // states read and written
                         double(b) * (double(gs.conv_dim()) + 2.0 * gs.value_dim() + 2.0 * gs.num_v_heads) * 4 +
                         double(gs.conv_dim()) * gs.conv_kernel * 4 + double(gs.num_v_heads) * 8 + gs.v_head_dim * 4;
    const std::string shape = "nv" + std::to_string(gs.num_v_heads) + "/dk" + std::to_string(gs.k_head_dim) + "/dv" +
                              std::to_string(gs.v_head_dim);
    // The model's path (a decode step: the one-launch decode kernel where the shape allows),
    // then, for comparison and outside the totals, the prep + recurrence path forced.
    for (const GdnKernels kernels : {GdnKernels::Auto, GdnKernels::TwoPass}) {
      const bool two_pass = kernels == GdnKernels::TwoPass;
      if (two_pass && !gdn_decode_kernel_supported(gs)) break;  // Auto already ran the two-pass path
      auto launch = [&](int64_t i) {
        const GdnLayerParams p{conv_w.data(), dt_bias.data(), a_log.data(), norm_w.data(), conv_state.data(),
                               rec_state.data()};
        gated_delta_net(qkv.data(), z.data(), bb.data(), aa.data(), gs, p, meta.at(int(i % copies)), ws.data(),
                        ws.bytes(), out.data(), s_, kernels);
      };
      const Timing t = timer_.time(launch, copies);
      const std::string format = two_pass ? "f32 state, prep + recurrence" : "f32 state";
      record("gated_delta_net", format, shape, b, calls, t, bytes, /*in_total=*/!two_pass);
    }
  }

  void moe(int b, int calls) {
    if (!wanted("moe_routed_experts")) return;
    const auto& c = c_;
    const int E = int(c.num_experts), k = int(c.num_experts_per_tok), H = int(c.hidden_size);
    const int I = int(c.moe_intermediate_size);
    DeviceExperts ex;
    ex.format = experts_;
    ex.num_experts = E;
    ex.hidden = H;
    ex.intermediate = I;
    ex.gate = mk_.linear(I, H, experts_, E);
    ex.up = mk_.linear(I, H, experts_, E);
    ex.down = mk_.linear(H, I, experts_, E);
    ex.group_size = int(ex.gate.group_size);
    ex.sym = true;
    const double per_expert = double(ex.gate.bytes() + ex.up.bytes() + ex.down.bytes()) / E;
    // Router logits: kSets random sets of [b, E]; the distinct experts each selects (top-k of
    // the logits = top-k of their softmax) are counted here.
    constexpr int kSets = 64;
    std::mt19937 rng(uint32_t(1000 + b));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> logits(size_t(kSets) * size_t(b) * size_t(E));
    for (auto& v : logits) v = nd(rng);
    double distinct_sum = 0;
    std::vector<int> idx(static_cast<size_t>(E));
    for (int sidx = 0; sidx < kSets; ++sidx) {
      std::set<int> chosen;
      for (int t = 0; t < b; ++t) {
        const float* row = logits.data() + (size_t(sidx) * size_t(b) + size_t(t)) * size_t(E);
        for (int e = 0; e < E; ++e) idx[size_t(e)] = e;
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int c2) { return row[a] > row[c2]; });
        chosen.insert(idx.begin(), idx.begin() + k);
      }
      distinct_sum += double(chosen.size());
    }
    DeviceBuffer<float> d_logits(logits.size());
    d_logits.upload(logits.data(), logits.size());
    const MoeShape ms{E, k, H, I};
    DeviceBuffer<uint8_t> ws(std::max<size_t>(1, moe_workspace_bytes(ms, b)));
    DeviceBuffer<float> residual = mk_.f32(size_t(b) * H, -1, 1);
    MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s_));
    auto launch = [&](int64_t i) {
      moe_routed_experts(x_.data(), d_logits.data() + size_t(i % kSets) * size_t(b) * size_t(E), ms, ex, b, ws.data(),
                         ws.bytes(), residual.data(), s_);
    };
    const Timing t = timer_.time(launch, kSets);
    const double distinct = distinct_sum / kSets;
    const double bytes = distinct * per_expert + double(b) * H * 4 /* x */ + double(b) * H * 8 /* residual r+w */ +
                         double(b) * E * 4 /* logits */;
    char shape[96];
    std::snprintf(shape, sizeof shape, "E%d k%d %dx%d, %.1f experts", E, k, I, H, distinct);
    record("moe_routed_experts", fmt_label(experts_), shape, b, calls, t, bytes);
    // The integer form (serve --expert-activations int16) on the same experts and logits.
    if (moe_int_supported(ms, ex)) {
      DeviceBuffer<uint8_t> iws(std::max<size_t>(1, moe_int_workspace_bytes(ms, b)));
      auto launch_int = [&](int64_t i) {
        moe_routed_experts_int(x_.data(), d_logits.data() + size_t(i % kSets) * size_t(b) * size_t(E), ms, ex, b,
                               iws.data(), iws.bytes(), residual.data(), s_);
      };
      const Timing ti = timer_.time(launch_int, kSets);
      record("moe_routed_experts_int", std::string(fmt_label(experts_)) + " int16 act", shape, b, calls, ti, bytes,
             /*in_total=*/false);
    }
  }

  // The small ops, with the arguments the model passes (qwen35_cuda.cpp).
  void basic(int b) {
    const auto& c = c_;
    const int H = int(c.hidden_size), Is = int(c.shared_expert_intermediate_size), L = int(c.num_hidden_layers);
    const std::string hs = "H" + std::to_string(H);
    DeviceBuffer<float> residual = mk_.f32(size_t(b) * H, -2, 2), w = mk_.f32(size_t(H), -0.1f, 0.1f);
    DeviceBuffer<float> out32(size_t(b) * H), xs = mk_.f32(size_t(b) * H, -1, 1), gate = mk_.f32(size_t(b), -3, 3);
    MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s_));
    if (wanted("add_rms_norm")) {  // delta null, f32 output only: x32 = norm(residual)
      auto launch = [&](int64_t) {
        add_rms_norm(residual.data(), nullptr, w.data(), b, H, float(c.rms_norm_eps), nullptr, s_, out32.data());
      };
      record("add_rms_norm", "f32", hs, b, 2 * L + 1, timer_.time(launch, 1), double(b) * H * 8 + double(H) * 4);
    }
    if (wanted("silu_mul_split")) {
      DeviceBuffer<float> g = mk_.f32(size_t(b) * Is, -4, 4), u = mk_.f32(size_t(b) * Is, -2, 2), act(size_t(b) * Is);
      MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s_));
      auto launch = [&](int64_t) { silu_mul_split(g.data(), u.data(), b, Is, act.data(), s_); };
      record("silu_mul_split", "f32", "I" + std::to_string(Is), b, L, timer_.time(launch, 1), double(b) * Is * 12);
    }
    if (wanted("add_scaled_rows")) {
      auto launch = [&](int64_t) { add_scaled_rows(residual.data(), xs.data(), gate.data(), b, H, s_); };
      record("add_scaled_rows", "f32", hs, b, L, timer_.time(launch, 1), double(b) * H * 12 + double(b) * 4);
    }
    if (wanted("embedding")) {  // random rows of the bf16 table: kSets id sets
      constexpr int kSets = 64;
      DeviceBuffer<bf16> table = mk_.bf16s(size_t(c.vocab_size) * H, 1.0f);
      std::mt19937 rng(uint32_t(7 + b));
      std::uniform_int_distribution<int32_t> tok(0, int32_t(c.vocab_size) - 1);
      std::vector<int32_t> ids(size_t(kSets) * size_t(b));
      for (auto& id : ids) id = tok(rng);
      DeviceBuffer<int32_t> d_ids(ids.size());
      d_ids.upload(ids.data(), ids.size());
      MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s_));
      auto launch = [&](int64_t i) {
        embedding_lookup(d_ids.data() + size_t(i % kSets) * size_t(b), b, table.data(), H, out32.data(), s_);
      };
      record("embedding", "bf16", hs, b, 1, timer_.time(launch, kSets), double(b) * H * 6 + double(b) * 4);
    }
    if (wanted("gather_rows")) {  // the LM head's input rows
      std::vector<int32_t> rows(static_cast<size_t>(b));
      for (int i = 0; i < b; ++i) rows[size_t(i)] = i;
      DeviceBuffer<int32_t> d_rows(rows.size());
      d_rows.upload(rows.data(), rows.size());
      MOESERVE_CUDA_CHECK(cudaStreamSynchronize(s_));
      auto launch = [&](int64_t) { gather_rows(residual.data(), d_rows.data(), b, H, out32.data(), s_); };
      record("gather_rows", "f32", hs, b, 1, timer_.time(launch, 1), double(b) * H * 8 + double(b) * 4);
    }
  }

  const io::Qwen35Config& c_;
  Options o_;
  cudaStream_t s_;
  Timer timer_;
  Maker mk_;
  LinearRunner runner_;
  WeightFormat experts_ = WeightFormat::Dense, dense_proj_ = WeightFormat::Dense, head_ = WeightFormat::Dense;
  DeviceBuffer<float> x_, y_;
  std::vector<Row> rows_;
};

void print_table(const std::vector<Row>& rows, const std::vector<int>& batches, double bw, bool csv) {
  auto gbps = [](const Row& r) { return r.bytes / (r.t.us * 1e-6) / 1e9; };
  if (csv) {
    std::printf(
        "op,format,shape,batch,calls_per_step,us,graph_us,bytes,gb_per_s,copy_fraction,us_per_step,"
        "graph_us_per_step\n");
    for (const auto& r : rows)
      std::printf("%s,%s,\"%s\",%d,%d,%.3f,%.3f,%.0f,%.1f,%.4f,%.2f,%.2f\n", r.op.c_str(), r.format.c_str(),
                  r.shape.c_str(), r.batch, r.calls, r.t.us, r.t.graph_us, r.bytes, gbps(r), gbps(r) * 1e9 / bw,
                  r.t.us * r.calls, r.t.graph_us * r.calls);
  } else {
    std::printf("\n%-26s %-9s %-28s %5s %5s %9s %9s %10s %8s %6s %9s\n", "op", "format", "shape", "batch", "calls",
                "us", "graph_us", "MB", "GB/s", "copy", "us/step");
    int last_batch = -1;
    for (const auto& r : rows) {
      if (r.batch != last_batch && last_batch != -1) std::printf("\n");
      last_batch = r.batch;
      std::printf("%-26s %-9s %-28s %5d %5d %9.2f %9.2f %10.3f %8.1f %6.3f %9.1f\n", r.op.c_str(), r.format.c_str(),
                  r.shape.c_str(), r.batch, r.calls, r.t.us, r.t.graph_us, r.bytes / 1e6, gbps(r),
                  gbps(r) * 1e9 / bw, r.t.us * r.calls);
    }
  }
  // Per batch: the sum over the step of every op's time (what a step of these kernels costs
  // alone) and of its bytes, against the copy roofline of those bytes.
  if (!csv) std::printf("\n%-26s %5s %12s %12s %12s %14s\n", "step total", "batch", "ms/step", "graph ms", "GB/step",
                        "roofline ms");
  for (int b : batches) {
    double us = 0, gus = 0, bytes = 0;
    for (const auto& r : rows)
      if (r.batch == b && r.in_total) {
        us += r.t.us * r.calls;
        gus += r.t.graph_us * r.calls;
        bytes += r.bytes * r.calls;
      }
    if (csv)
      std::printf("step_total,-,-,%d,-,-,-,%.0f,-,-,%.2f,%.2f\n", b, bytes, us, gus);
    else
      std::printf("%-26s %5d %12.3f %12.3f %12.3f %14.3f\n", "sum of ops", b, us / 1e3, gus / 1e3, bytes / 1e9,
                  bytes / bw * 1e3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moeserve per-kernel decode benchmark (random weights)"};
  std::string config = std::string(MOESERVE_SOURCE_DIR) + "/bench/configs/qwen3.5-122b-a10b.json";
  std::string batches = "1,8,64", contexts = "512,8192", only;
  Options o;
  bool csv = false;
  double rotate_mb = 256;
  int gemv_variant = 0;
  std::string gemv_family = "cuda-cores";
  int tc_split = 0;
  int tc_form = 0;
  app.add_option("--config", config, "config.json of the model whose shapes to use");
  app.add_option("--weights", o.weights, "bf16, gptq-int4, fp8-block or hybrid-int4-fp8");
  app.add_option("--lm-head", o.lm_head, "auto (INT8 unless --weights bf16), bf16 or int8");
  app.add_option("--batch", batches, "decode batch sizes");
  app.add_option("--context", contexts, "attention context lengths (the first one goes into the step total)");
  app.add_option("--iters", o.iters, "timed launches per op and batch (at least 50)");
  app.add_option("--rotate-mb", rotate_mb, "distinct data each op rotates over (MB), to defeat the L2");
  app.add_option("--only", only, "comma-separated substrings: run only the ops whose name contains one");
  app.add_flag("--csv", csv, "CSV output");
  app.add_option("--gemv-variant", gemv_variant,
                 "force the one-token row GEMV kernel shape (0 = by shape; see set_row_gemv_one_token_variant)");
  app.add_option("--gemv-family", gemv_family,
                 "generated tokens' dense projections: cuda-cores (row_gemv_f32, the model's path today) or "
                 "tensor-cores (tc_gemv_f32, ops_tc_gemv.h)");
  app.add_option("--tc-gemv-split", tc_split,
                 "tensor-core GEMV: warps that split K inside a CTA (1, 2, 4, 8; 0 = by shape); same bits");
  app.add_option("--tc-gemv-form", tc_form,
                 "tensor-core GEMV kernel form (0 = by shape, 1 = stepped, 2 = lean where it fits, 3 = "
                 "pre-converted planes; see set_tc_gemv_form); same bits");
  std::string decode_attention = "tensor-cores";
  app.add_option("--decode-attention", decode_attention,
                 "generated tokens' attention (paged_attention_generated): tensor-cores or cuda-cores");
  bench::KernelVariantFlags variants;
  variants.add_to(app);
  CLI11_PARSE(app, argc, argv);
  set_row_gemv_one_token_variant(gemv_variant);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    variants.apply();
    if (gemv_family != "cuda-cores" && gemv_family != "tensor-cores")
      throw Error("unknown --gemv-family '" + gemv_family + "' (cuda-cores, tensor-cores)");
    o.tensor_core_gemv = gemv_family == "tensor-cores";
    if (decode_attention != "tensor-cores" && decode_attention != "cuda-cores")
      throw Error("unknown --decode-attention '" + decode_attention + "' (tensor-cores, cuda-cores)");
    o.tensor_core_attention = decode_attention == "tensor-cores";
    set_tc_gemv_split(tc_split);
    set_tc_gemv_form(tc_form);
    o.batches = bench::parse_int_list(batches);
    o.contexts = bench::parse_int_list(contexts);
    if (o.batches.empty()) throw Error("--batch is empty");
    o.iters = std::max(o.iters, 50);
    o.rotate_bytes = rotate_mb * 1e6;
    std::stringstream ss(only);
    for (std::string item; std::getline(ss, item, ',');)
      if (!item.empty()) o.only.push_back(item);
    const io::Qwen35Config c = io::load_qwen35_config(config);
    MOESERVE_CUDA_CHECK(cudaSetDevice(0));
    cudaDeviceProp prop{};
    MOESERVE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const double bw = bench::measure_copy_bandwidth();
    std::printf("%s%s, L2 %.0f MB; device-to-device copy bandwidth %.2f TB/s (read + write)\n", csv ? "# " : "",
                prop.name, prop.l2CacheSize / 1e6, bw / 1e12);
    std::printf("%sconfig %s, weights %s, LM head %s, %d timed launches per op, rotation over >= %.0f MB\n",
                csv ? "# " : "", config.c_str(), o.weights.c_str(), o.lm_head.c_str(), o.iters, rotate_mb);
    cudaStream_t s;
    MOESERVE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    {
      KernelBench bench(c, o, s);
      bench.run_all();
      print_table(bench.rows(), o.batches, bw, csv);
    }
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
