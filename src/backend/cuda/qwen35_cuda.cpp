#include "backend/cuda/qwen35_cuda.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <cmath>
#include <cstring>

#include "backend/cpu/rope.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_basic.h"
#include "backend/cuda/ops_gdn_chunked.h"
#include "backend/cuda/ops_mma_gemm.h"
#include "backend/cuda/ops_quant_gemv.h"
#include "backend/cuda/ops_tc_gemv.h"
#include "backend/cuda/pdl.h"
#include "core/log.h"
#include "core/progress_bar.h"
#include "io/checkpoint.h"

namespace moeserve::cuda {

void set_decode_kernels(CudaModelOptions& o, const std::string& name) {
  if (name != "gemv" && name != "tensor-cores" && name != "mixed")
    throw Error(fmt::format("--decode-kernels must be gemv, tensor-cores or mixed, got '{}'", name));
  o.tensor_core_decode = name != "gemv";
  o.tensor_core_decode_experts = name == "tensor-cores";
}

void set_expert_activations(CudaModelOptions& o, const std::string& name) {
  if (name != "auto" && name != "f32" && name != "int16")
    throw Error(fmt::format("--expert-activations must be auto, f32 or int16, got '{}'", name));
  // auto: the integer form for every token kind (since session 17 the fastest at every batch size:
  // docs/PERF.md); f32 keeps exact f32 products for both.
  o.int_experts_generated = name != "f32";
  o.int_experts_prompt = name != "f32";
}

void set_decode_attention(CudaModelOptions& o, const std::string& name) {
  if (name != "auto" && name != "tensor-cores" && name != "cuda-cores")
    throw Error(fmt::format("--decode-attention must be auto, tensor-cores or cuda-cores, got '{}'", name));
  o.tensor_core_attention = name == "auto" ? o.tensor_core_decode : name == "tensor-cores";
}

void set_shared_expert_decode(CudaModelOptions& o, const std::string& name) {
  using Order = CudaModelOptions::SharedExpertOrder;
  if (name == "side") o.shared_expert_decode = Order::Side;
  else if (name == "before") o.shared_expert_decode = Order::Before;
  else if (name == "after") o.shared_expert_decode = Order::After;
  else throw Error(fmt::format("--shared-expert-decode must be side, before or after, got '{}'", name));
}

namespace {

// Padded decode batch sizes that get their own CUDA graph.
int graph_bucket(int n) {
  static const int kBuckets[] = {1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512};
  for (int b : kBuckets)
    if (n <= b) return b;
  return -1;
}

std::vector<float> rope_inv_freq(const io::Qwen35Config& c) {
  // inv_freq[j] = theta^(-2j / rotary_dim) exactly as the CPU reference computes it (fp32 like
  // torch, spec 2.4); a double-precision formula differs in the last ulp for half the entries.
  return cpu::RotaryEmbedding(c.rotary_dim(), c.rope_theta).inv_freq();
}

}  // namespace

// A slice of the batch that fits the workspaces: entries of (sequence, token range).
struct Qwen35CudaModel::SubStep {
  struct Entry {
    size_t batch_index;      // into the forward() batch
    int64_t token_offset;    // first token of the slice within the SeqStep's tokens
    int64_t num_tokens;
    bool emit_all;           // logits for every token of the slice
    bool emit_last;          // logits for the slice's last token (the sequence's last)
    bool prompt;             // prompt tokens (SeqStep::prompt_len), else generated ones
  };
  std::vector<Entry> entries;  // at run time: the generated-token slices first, then the prompt ones
  int num_tokens = 0;
  int num_logit_rows = 0;
  int generated_tokens = 0;    // tokens of the generated-token slices (the step's first rows)
  int generated_seqs = 0;      // and their number
  bool decode_only = false;
};

std::unique_ptr<Qwen35CudaModel> Qwen35CudaModel::load(const std::filesystem::path& path,
                                                       const CudaModelOptions& options) {
  const bool is_file = std::filesystem::is_regular_file(path);
  const std::filesystem::path dir = is_file ? path.parent_path() : path;
  io::Qwen35Config config = is_file ? io::parse_qwen35_config(
                                          nlohmann::json::parse(std::ifstream(path)), path.string())
                                    : io::load_qwen35_config(dir);
  MOESERVE_CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t stream;
  MOESERVE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CudaWeights weights;
  if (options.dummy) {
    log::info("creating random {} weights for {} on the GPU", options.dummy_weights, path.string());
    weights = dummy_weights(config, options.dummy_weights, options.int8_lm_head, options.dummy_seed, stream);
  } else {
    io::Checkpoint ckpt = io::Checkpoint::open(dir);
    model::WeightLoadOptions wopt;
    wopt.load_mtp = false;  // MTP on CUDA arrives with speculative decoding
    model::Qwen35Weights host = model::load_qwen35_weights(ckpt, config, wopt);
    // Tensors stream from the mmap'd shards to the GPU one at a time (host memory stays
    // bounded); the bar counts megabytes of checkpoint read.
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<ProgressBar> bar;
    int64_t shown_mb = 0;
    size_t total_bytes = 0;
    weights = upload_weights(host, options.int8_lm_head, stream, [&](size_t done, size_t total) {
      total_bytes = total;
      if (!bar) bar = std::make_unique<ProgressBar>("loading weights", int64_t(total >> 20), stderr,
                                                    ProgressBar::Mode::Auto, "MB");
      const int64_t mb = int64_t(done >> 20);
      bar->advance(mb - shown_mb);
      shown_mb = mb;
    });
    if (bar) bar->finish();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log::info("loaded {:.2f} GB of weights in {:.1f} s ({:.2f} GB/s)", total_bytes / 1e9, secs,
              secs > 0 ? total_bytes / 1e9 / secs : 0.0);
  }
  MOESERVE_CUDA_CHECK(cudaStreamDestroy(stream));
  auto m = std::make_unique<Qwen35CudaModel>(std::move(config), std::move(weights), options);
  log::info("model on the GPU: {:.2f} GB of weights, {:.2f} GB of workspaces", m->weight_bytes() / 1e9,
            m->workspace_bytes() / 1e9);
  return m;
}

Qwen35CudaModel::Qwen35CudaModel(io::Qwen35Config config, CudaWeights weights, const CudaModelOptions& options)
    : config_(std::move(config)), weights_(std::move(weights)), options_(options) {
  MOESERVE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MOESERVE_CUDA_CHECK(cudaStreamCreateWithFlags(&aux_stream_, cudaStreamNonBlocking));
  MOESERVE_CUDA_CHECK(cudaEventCreateWithFlags(&fork_event_, cudaEventDisableTiming));
  MOESERVE_CUDA_CHECK(cudaEventCreateWithFlags(&join_event_, cudaEventDisableTiming));
  for (cudaEvent_t* e : {&kv_ready_event_, &ba_ready_event_, &z_ready_event_})
    MOESERVE_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  set_pdl_enabled(options_.pdl);
  mma_gemm_prepare();
  paged_attention_prefill_prepare();
  moe_mma_prepare();
  {
    const auto& c = config_;
    const GdnShape gs{int(c.linear_num_key_heads), int(c.linear_num_value_heads), int(c.linear_key_head_dim),
                      int(c.linear_value_head_dim), int(c.linear_conv_kernel_dim), float(c.rms_norm_eps)};
    chunked_gdn_ = options_.chunked_deltanet && c.num_linear_attention_layers() > 0 &&
                   gated_delta_net_chunked_supported(gs);
    if (chunked_gdn_) {
      gated_delta_net_chunked_prepare();
      prompt_alignment_ = 64;  // the chunk of gated_delta_net_chunked
    }
  }
  linear_ = std::make_unique<LinearRunner>(options_.batch_invariant ? 0 : weights_.max_quantized_linear_elems(),
                                           options_.batch_invariant);
  inv_freq_host_ = rope_inv_freq(config_);
  inv_freq_.upload(inv_freq_host_, stream_);
  int kv = 0, lin = 0;
  for (auto t : config_.layer_types) cache_index_.push_back(t == io::LayerType::FullAttention ? kv++ : lin++);
  max_blocks_per_seq_ = (options_.max_model_len + options_.kv_block_size - 1) / options_.kv_block_size;
  allocate_workspaces();
}

Qwen35CudaModel::~Qwen35CudaModel() {
  clear_graphs();
  if (meta_host_) cudaFreeHost(meta_host_);
  if (logits_host_) cudaFreeHost(logits_host_);
  if (fork_event_) cudaEventDestroy(fork_event_);
  if (join_event_) cudaEventDestroy(join_event_);
  for (cudaEvent_t e : {kv_ready_event_, ba_ready_event_, z_ready_event_})
    if (e) cudaEventDestroy(e);
  if (aux_stream_) cudaStreamDestroy(aux_stream_);
  if (stream_) cudaStreamDestroy(stream_);
}

void Qwen35CudaModel::clear_graphs() {
  for (auto& [b, g] : graphs_) cudaGraphExecDestroy(g);
  graphs_.clear();
}

model::CacheGeometry Qwen35CudaModel::cache_geometry() const {
  model::CacheGeometry g;
  g.kv_block_size = options_.kv_block_size;
  const size_t per_layer_kv = size_t(2 * config_.num_key_value_heads * options_.kv_block_size * config_.head_dim) * 2;
  g.bytes_per_kv_block = per_layer_kv * size_t(config_.num_full_attention_layers());
  const size_t per_layer_state =
      size_t(config_.linear_conv_dim() * (config_.linear_conv_kernel_dim - 1) +
             config_.linear_num_value_heads * config_.linear_key_head_dim * config_.linear_value_head_dim) *
      4;
  g.bytes_per_state_slot = per_layer_state * size_t(config_.num_linear_attention_layers());
  return g;
}

void Qwen35CudaModel::allocate_workspaces() {
  const auto& c = config_;
  const size_t T = size_t(options_.max_tokens_per_step);
  const int S = std::max(options_.max_seqs, options_.max_graph_batch);
  const size_t H = size_t(c.hidden_size);
  size_t total = 0;
  auto f32 = [&](DeviceBuffer<float>& b, size_t n) { b.resize(n); total += b.bytes(); };
  f32(residual_, T * H);
  f32(router_logits_, T * size_t(c.num_experts));
  f32(shared_down_, T * H);
  f32(shared_gate_logit_, T);
  f32(x32_, T * H);
  const size_t q_dim = size_t(c.num_attention_heads * c.head_dim), kv_dim = size_t(c.num_key_value_heads * c.head_dim);
  if (c.num_full_attention_layers() > 0) {
    f32(qg_, T * 2 * q_dim);
    f32(k_, T * kv_dim);
    f32(v_, T * kv_dim);
    f32(q_, T * q_dim);
    f32(gate_, T * q_dim);
    f32(attn_out_, T * q_dim);
  }
  if (c.num_linear_attention_layers() > 0) {
    f32(qkv_, T * size_t(c.linear_conv_dim()));
    f32(z_, T * size_t(c.linear_value_dim()));
    f32(b_, T * size_t(c.linear_num_value_heads));
    f32(a_, T * size_t(c.linear_num_value_heads));
    f32(gdn_out_, T * size_t(c.linear_value_dim()));
  }
  f32(shared_g_, T * size_t(c.shared_expert_intermediate_size));
  f32(shared_u_, T * size_t(c.shared_expert_intermediate_size));
  f32(shared_act_, T * size_t(c.shared_expert_intermediate_size));
  const int chunk = std::max(1, options_.lm_head_chunk_rows);
  f32(head_in_, size_t(chunk) * H);
  f32(logits_, size_t(chunk) * size_t(c.vocab_size));

  AttentionShape as{int(c.num_attention_heads), int(c.num_key_value_heads), int(c.head_dim), int(c.rotary_dim()),
                    float(c.rms_norm_eps)};
  if (c.num_full_attention_layers() > 0) {
    attn_ws_.resize(std::max<size_t>(1, paged_attention_workspace_bytes(as, int(T), options_.max_model_len)));
    total += attn_ws_.bytes();
  }
  GdnShape gs{int(c.linear_num_key_heads), int(c.linear_num_value_heads), int(c.linear_key_head_dim),
              int(c.linear_value_head_dim), int(c.linear_conv_kernel_dim), float(c.rms_norm_eps)};
  if (c.num_linear_attention_layers() > 0) {
    size_t bytes = gdn_workspace_bytes(gs, int(T));
    if (chunked_gdn_) bytes = std::max(bytes, gated_delta_net_chunked_workspace_bytes(gs, int(T)));
    gdn_ws_.resize(std::max<size_t>(1, bytes));
    total += gdn_ws_.bytes();
  }
  MoeShape ms{int(c.num_experts), int(c.num_experts_per_tok), int(c.hidden_size), int(c.moe_intermediate_size)};
  moe_ws_.resize(std::max<size_t>(1, moe_workspace_bytes(ms, int(T))));
  total += moe_ws_.bytes();
  // The tensor-core and the integer-form expert calls share one workspace (stream-ordered: a step's calls
  // never overlap).
  size_t expert_ws = moe_mma_workspace_bytes(ms, int(T));
  if (options_.int_experts_generated || options_.int_experts_prompt)
    expert_ws = std::max(expert_ws, moe_int_workspace_bytes(ms, int(T)));
  moe_mma_ws_.resize(std::max<size_t>(1, expert_ws));
  total += moe_mma_ws_.bytes();

  // Metadata: token_seq, token_pos, token_ids, logit_rows [T]; seq_token_start [S+1];
  // seq_start_pos, seq_state_slot [S]; block_tables [S][max_blocks].
  const size_t meta_ints = 4 * T + size_t(S + 1) + 2 * size_t(S) + size_t(S) * size_t(max_blocks_per_seq_);
  meta_buf_.resize(meta_ints);
  total += meta_buf_.bytes();
  MOESERVE_CUDA_CHECK(cudaMallocHost(&meta_host_, meta_ints * sizeof(int32_t)));
  clear_step_metadata();
  MOESERVE_CUDA_CHECK(cudaMallocHost(&logits_host_, size_t(chunk) * size_t(c.vocab_size) * sizeof(float)));
  row_sampler_ = std::make_unique<DeviceRowSampler>(chunk, c.vocab_size);
  if (options_.tensor_core_decode) {  // tc_gemv's pre-converted activations (9..256 tokens), sized before any capture
    const int64_t Kmax = std::max({int64_t(c.hidden_size), int64_t(q_dim), int64_t(c.linear_value_dim()),
                                   int64_t(c.shared_expert_intermediate_size)});
    tc_gemv_reserve(std::min(S, 256), int(Kmax));
  }
  workspace_bytes_ = total;
}

// Block 0 (which every cache has) in every block-table entry, host and device, until a step
// writes it: run_substep uploads only the columns its rows use, so a column no step has uploaded
// since the caches were (re)allocated still names a block that exists.
void Qwen35CudaModel::clear_step_metadata() {
  std::fill_n(meta_host_, meta_buf_.size(), 0);
  meta_buf_.zero(stream_);
}

void Qwen35CudaModel::allocate_caches(int num_kv_blocks, int num_state_slots) {
  MOESERVE_CHECK(num_kv_blocks >= 0 && num_state_slots >= 0, "allocate_caches: negative sizes");
  clear_graphs();  // captured graphs hold the old cache addresses
  clear_step_metadata();  // earlier tables may name blocks the new caches do not have
  num_kv_blocks_ = num_kv_blocks;
  num_state_slots_ = num_state_slots;
  const auto& c = config_;
  const size_t blocks = size_t(num_kv_blocks + 1);  // + the padding block
  const size_t slots = size_t(num_state_slots + 1);  // + the padding slot
  const size_t kv_elems =
      blocks * size_t(c.num_key_value_heads) * size_t(options_.kv_block_size) * size_t(c.head_dim);
  k_cache_.clear();
  v_cache_.clear();
  conv_state_.clear();
  rec_state_.clear();
  for (int i = 0; i < c.num_full_attention_layers(); ++i) {
    k_cache_.emplace_back(kv_elems);
    v_cache_.emplace_back(kv_elems);
  }
  const size_t conv = size_t(c.linear_conv_dim() * (c.linear_conv_kernel_dim - 1));
  const size_t rec = size_t(c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim);
  for (int i = 0; i < c.num_linear_attention_layers(); ++i) {
    conv_state_.emplace_back(slots * conv);
    rec_state_.emplace_back(slots * rec);
    conv_state_.back().zero(stream_);
    rec_state_.back().zero(stream_);
  }
  MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void Qwen35CudaModel::reset_state(int32_t slot) {
  MOESERVE_CHECK(slot >= 0 && slot < num_state_slots_, "reset_state: slot {} out of range [0, {})", slot,
                 num_state_slots_);
  const size_t conv = size_t(config_.linear_conv_dim() * (config_.linear_conv_kernel_dim - 1));
  const size_t rec =
      size_t(config_.linear_num_value_heads * config_.linear_key_head_dim * config_.linear_value_head_dim);
  for (size_t i = 0; i < conv_state_.size(); ++i) {
    MOESERVE_CUDA_CHECK(cudaMemsetAsync(conv_state_[i].data() + size_t(slot) * conv, 0, conv * 4, stream_));
    MOESERVE_CUDA_CHECK(cudaMemsetAsync(rec_state_[i].data() + size_t(slot) * rec, 0, rec * 4, stream_));
  }
}

void Qwen35CudaModel::copy_state(int32_t src, int32_t dst) {
  MOESERVE_CHECK(src >= 0 && src < num_state_slots_ && dst >= 0 && dst < num_state_slots_,
                 "copy_state: slots {} -> {} out of range [0, {})", src, dst, num_state_slots_);
  const size_t conv = size_t(config_.linear_conv_dim() * (config_.linear_conv_kernel_dim - 1));
  const size_t rec =
      size_t(config_.linear_num_value_heads * config_.linear_key_head_dim * config_.linear_value_head_dim);
  for (size_t i = 0; i < conv_state_.size(); ++i) {
    MOESERVE_CUDA_CHECK(cudaMemcpyAsync(conv_state_[i].data() + size_t(dst) * conv,
                                        conv_state_[i].data() + size_t(src) * conv, conv * 4,
                                        cudaMemcpyDeviceToDevice, stream_));
    MOESERVE_CUDA_CHECK(cudaMemcpyAsync(rec_state_[i].data() + size_t(dst) * rec,
                                        rec_state_[i].data() + size_t(src) * rec, rec * 4,
                                        cudaMemcpyDeviceToDevice, stream_));
  }
}

void Qwen35CudaModel::forward(std::span<const model::SeqStep> batch, model::StepOutput& out) {
  MOESERVE_CHECK(num_state_slots_ > 0 || config_.num_linear_attention_layers() == 0,
                 "forward before allocate_caches");
  const int T = options_.max_tokens_per_step;
  const int S = std::max(options_.max_seqs, options_.max_graph_batch);
  out.vocab = config_.vocab_size;
  out.first_row.assign(batch.size(), 0);
  out.num_rows.assign(batch.size(), 0);
  int64_t rows = 0, tokens = 0;
  bool any_device_sample = false;
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& s = batch[i];
    MOESERVE_CHECK(!s.tokens.empty(), "forward: sequence {} has no tokens", i);
    MOESERVE_CHECK(s.state_slot >= 0 && s.state_slot < num_state_slots_, "forward: state slot {} out of range",
                   s.state_slot);
    const int64_t end = s.start_pos + int64_t(s.tokens.size());
    MOESERVE_CHECK(end <= options_.max_model_len, "forward: sequence of {} tokens exceeds max model length {}", end,
                   options_.max_model_len);
    const int64_t need = (end + options_.kv_block_size - 1) / options_.kv_block_size;
    MOESERVE_CHECK(config_.num_full_attention_layers() == 0 || int64_t(s.kv_blocks.size()) >= need,
                   "forward: block table of {} blocks does not cover {} positions", s.kv_blocks.size(), end);
    for (int64_t b = 0; b < need && config_.num_full_attention_layers() > 0; ++b)
      MOESERVE_CHECK(s.kv_blocks[size_t(b)] >= 0 && s.kv_blocks[size_t(b)] < num_kv_blocks_,
                     "forward: KV block id {} out of range", s.kv_blocks[size_t(b)]);
    MOESERVE_CHECK(!(s.device_sample && s.all_logits), "forward: sequence {} asks for device sampling and all logits", i);
    any_device_sample = any_device_sample || s.device_sample.has_value();
    out.first_row[i] = rows;
    out.num_rows[i] = s.device_sample ? 0 : s.all_logits ? int64_t(s.tokens.size()) : 1;
    rows += out.num_rows[i];
    tokens += int64_t(s.tokens.size());
  }
  out.logits.assign(size_t(rows) * size_t(config_.vocab_size), 0.0f);
  out.samples.assign(any_device_sample ? batch.size() : 0, model::DeviceSampleResult{});
  if (out.want_hidden) {
    out.hidden_size = config_.hidden_size;
    out.hidden.assign(size_t(tokens) * size_t(config_.hidden_size), 0.0f);
  }

  // Greedy packing into sub-steps of at most T tokens and S sequences; a sequence longer
  // than T continues in the next sub-step (its slices run in order). A slice holds tokens of
  // one kind (prompt or generated: a sequence re-prefilled after preemption is cut at its
  // prompt length), and one sequence has at most one slice per sub-step.
  std::vector<int64_t> token_base(batch.size(), 0);
  for (size_t i = 1; i < batch.size(); ++i) token_base[i] = token_base[i - 1] + int64_t(batch[i - 1].tokens.size());
  SubStep cur;
  auto flush = [&] {
    if (cur.entries.empty()) return;
    cur.decode_only = true;
    for (const auto& e : cur.entries) cur.decode_only = cur.decode_only && e.num_tokens == 1 && !e.emit_all;
    // Generated-token slices first: each kind of kernel then sees its rows (and sequences) as
    // one range.
    std::stable_partition(cur.entries.begin(), cur.entries.end(), [](const SubStep::Entry& e) { return !e.prompt; });
    for (const auto& e : cur.entries)
      if (!e.prompt) {
        cur.generated_tokens += int(e.num_tokens);
        ++cur.generated_seqs;
      }
    run_substep(batch, token_base, cur, out);
    cur = SubStep{};
  };
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& s = batch[i];
    int64_t off = 0;
    const int64_t n = int64_t(s.tokens.size());
    while (off < n) {
      if (cur.num_tokens == T || int(cur.entries.size()) == S ||
          (!cur.entries.empty() && cur.entries.back().batch_index == i))
        flush();
      const int64_t pos = s.start_pos + off;
      const bool prompt = pos < s.prompt_len;
      int64_t take = std::min<int64_t>(n - off, T - cur.num_tokens);
      if (prompt && s.prompt_len - pos < take) take = s.prompt_len - pos;  // the prompt ends inside
      // A prompt slice cut short by the sub-step's room ends at an aligned position (as the
      // scheduler cuts steps: prefill_alignment()); with no aligned cut in reach it moves to a
      // fresh sub-step, or (T below the alignment) is cut where the room ends.
      const int64_t a = prefill_alignment();
      if (prompt && a > 1 && take < std::min<int64_t>(n - off, s.prompt_len - pos)) {
        const int64_t aligned_end = (pos + take) - (pos + take) % a;
        if (aligned_end > pos) {
          take = aligned_end - pos;
        } else if (!cur.entries.empty()) {
          flush();
          continue;
        }
      }
      SubStep::Entry e{i, off, take, s.all_logits, !s.all_logits && off + take == n, prompt};
      cur.entries.push_back(e);
      cur.num_tokens += int(take);
      cur.num_logit_rows += int(e.emit_all ? take : (e.emit_last ? 1 : 0));
      off += take;
    }
  }
  flush();
}

// Offsets (in int32s) of the metadata sections in meta_buf_ / meta_host_.
struct MetaLayout {
  size_t token_seq, token_pos, token_ids, logit_rows, seq_token_start, seq_start_pos, seq_state_slot, block_tables;
  MetaLayout(size_t T, size_t S) {
    token_seq = 0;
    token_pos = T;
    token_ids = 2 * T;
    logit_rows = 3 * T;
    seq_token_start = 4 * T;
    seq_start_pos = seq_token_start + S + 1;
    seq_state_slot = seq_start_pos + S;
    block_tables = seq_state_slot + S;
  }
};

void Qwen35CudaModel::run_substep(std::span<const model::SeqStep> batch, const std::vector<int64_t>& token_base,
                                  const SubStep& sub, model::StepOutput& out) {
  const int T = options_.max_tokens_per_step;
  const int S = std::max(options_.max_seqs, options_.max_graph_batch);
  const MetaLayout L{size_t(T), size_t(S)};
  const int H = int(config_.hidden_size);
  const int chunk = std::max(1, options_.lm_head_chunk_rows);
  const int nseq = int(sub.entries.size());

  // Decode-only steps whose rows all take one kind of kernel run as a CUDA graph of a padded
  // batch size (the padding rows take the same kind).
  int padded = sub.num_tokens;
  bool use_graph = false;
  const bool one_kind = sub.generated_tokens == 0 || sub.generated_tokens == sub.num_tokens;
  if (options_.cuda_graphs && sub.decode_only && one_kind) {
    const int b = graph_bucket(sub.num_tokens);
    if (b > 0 && b <= options_.max_graph_batch && b <= T && b <= S && b <= chunk) {
      padded = b;
      use_graph = true;
    }
  }

  // ---- host metadata ----
  int32_t* h = meta_host_;
  std::vector<LogitRowTarget> out_row;  // per logit row: its sequence and the row of out.logits it fills
  std::vector<int64_t> hidden_row(size_t(sub.num_tokens));
  int m = 0, r = 0, gemv_logit_rows = 0;  // logit rows of GEMV slices come first, like their tokens
  const int32_t pad_block = num_kv_blocks_, pad_slot = num_state_slots_;
  // Block-table columns written and uploaded: every row's own blocks (at least one), not the
  // whole max_model_len row (16,384 entries at 262,144 tokens). No kernel reads a table entry
  // past the block of its sequence's last position (step_meta.h), so the columns past a row's
  // blocks may keep an earlier step's values.
  int table_cols = 1;
  for (int j = 0; j < nseq; ++j) {
    const auto& e = sub.entries[size_t(j)];
    const auto& s = batch[e.batch_index];
    const int64_t start = s.start_pos + e.token_offset;
    h[L.seq_token_start + size_t(j)] = m;
    h[L.seq_start_pos + size_t(j)] = int32_t(start);
    h[L.seq_state_slot + size_t(j)] = s.state_slot;
    int32_t* bt = h + L.block_tables + size_t(j) * size_t(max_blocks_per_seq_);
    const size_t nb = std::min(s.kv_blocks.size(), size_t(max_blocks_per_seq_));
    std::copy_n(s.kv_blocks.begin(), nb, bt);
    if (nb == 0) bt[0] = pad_block;
    table_cols = std::max(table_cols, int(nb));
    for (int64_t t = 0; t < e.num_tokens; ++t, ++m) {
      h[L.token_seq + size_t(m)] = j;
      h[L.token_pos + size_t(m)] = int32_t(start + t);
      h[L.token_ids + size_t(m)] = s.tokens[size_t(e.token_offset + t)];
      hidden_row[size_t(m)] = token_base[e.batch_index] + e.token_offset + t;
      const bool last = t == e.num_tokens - 1;
      if (e.emit_all || (e.emit_last && last)) {
        h[L.logit_rows + size_t(r++)] = m;
        if (!e.prompt) gemv_logit_rows = r;
        out_row.push_back({e.batch_index, s.device_sample ? -1 : out.first_row[e.batch_index] + (e.emit_all ? e.token_offset + t : 0)});
      }
    }
  }
  for (int j = nseq; use_graph && j < padded; ++j, ++m) {  // padding rows of a graph batch
    h[L.seq_token_start + size_t(j)] = m;
    h[L.seq_start_pos + size_t(j)] = 0;
    h[L.seq_state_slot + size_t(j)] = pad_slot;
    int32_t* bt = h + L.block_tables + size_t(j) * size_t(max_blocks_per_seq_);
    bt[0] = pad_block;  // position 0's block: the only one a padding row's token reads
    h[L.token_seq + size_t(m)] = j;
    h[L.token_pos + size_t(m)] = 0;
    h[L.token_ids + size_t(m)] = 0;
    h[L.logit_rows + size_t(m)] = m;
  }
  const int padded_seqs = use_graph ? padded : nseq;  // graph padding adds one sequence per row
  h[L.seq_token_start + size_t(padded_seqs)] = padded;
  if (table_cols == max_blocks_per_seq_) {  // whole rows: one copy
    const size_t used = L.block_tables + size_t(padded_seqs) * size_t(max_blocks_per_seq_);
    MOESERVE_CUDA_CHECK(cudaMemcpyAsync(meta_buf_.data(), h, used * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  } else {  // the sections before the tables, then the first table_cols columns of each row
    MOESERVE_CUDA_CHECK(
        cudaMemcpyAsync(meta_buf_.data(), h, L.block_tables * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    const size_t pitch = size_t(max_blocks_per_seq_) * sizeof(int32_t);
    MOESERVE_CUDA_CHECK(cudaMemcpy2DAsync(meta_buf_.data() + L.block_tables, pitch, h + L.block_tables, pitch,
                                          size_t(table_cols) * sizeof(int32_t), size_t(padded_seqs),
                                          cudaMemcpyHostToDevice, stream_));
  }

  meta_.num_tokens = padded;
  meta_.num_seqs = padded_seqs;
  meta_.max_blocks_per_seq = max_blocks_per_seq_;
  int32_t* d = meta_buf_.data();
  meta_.token_seq = d + L.token_seq;
  meta_.token_pos = d + L.token_pos;
  meta_.seq_token_start = d + L.seq_token_start;
  meta_.seq_start_pos = d + L.seq_start_pos;
  meta_.seq_state_slot = d + L.seq_state_slot;
  meta_.block_tables = d + L.block_tables;
  token_ids_ptr_ = d + L.token_ids;
  logit_rows_ptr_ = d + L.logit_rows;

  auto fetch_logits = [&](int row0, int nrows) {  // device_sample rows are sampled, the rest copied
    row_sampler_->finish(logits_.data(), std::span<const LogitRowTarget>(out_row).subspan(size_t(row0), size_t(nrows)),
                         batch, logits_host_, out, stream_);
  };

  // Rows of generated tokens (the padding of a graph batch takes the kind of its rows); their
  // matmuls take the generated-token family (CUDA-core GEMVs, or tc_gemv with tensor_core_decode).
  const bool all_generated = sub.generated_tokens == sub.num_tokens;
  const RowSplit split{use_graph && all_generated ? padded : sub.generated_tokens,
                       use_graph && all_generated ? padded_seqs : sub.generated_seqs};
  const int lm_gemv_rows = use_graph && all_generated ? padded : gemv_logit_rows;
  if (use_graph) {
    const std::pair<int, bool> key{padded, all_generated};
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      cudaGraph_t graph;
      MOESERVE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      try {
        enqueue_layers(padded, split);
        enqueue_lm_head_rows(0, padded, lm_gemv_rows);
      } catch (...) {
        cudaStreamEndCapture(stream_, &graph);
        throw;
      }
      MOESERVE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
      cudaGraphExec_t exec;
      MOESERVE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      cudaGraphDestroy(graph);
      it = graphs_.emplace(key, exec).first;
    }
    MOESERVE_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
    fetch_logits(0, r);
  } else {
    enqueue_layers(padded, split);
    for (int row0 = 0; row0 < r; row0 += chunk) {
      const int n = std::min(chunk, r - row0);
      enqueue_lm_head_rows(row0, n, std::clamp(lm_gemv_rows - row0, 0, n));
      fetch_logits(row0, n);
    }
  }

  if (out.want_hidden) {  // x32_ holds the post-final-norm hidden rows (f32)
    std::vector<float> hb(size_t(sub.num_tokens) * size_t(H));
    MOESERVE_CUDA_CHECK(cudaMemcpyAsync(hb.data(), x32_.data(), hb.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                        stream_));
    MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int i = 0; i < sub.num_tokens; ++i)
      std::copy_n(hb.data() + size_t(i) * size_t(H), size_t(H), out.hidden.data() + size_t(hidden_row[size_t(i)]) * size_t(H));
  }
  MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void Qwen35CudaModel::enqueue_lm_head_rows(int row0, int rows, int gemv_rows) {
  gather_rows(x32_.data(), logit_rows_ptr_ + row0, rows, int(config_.hidden_size), head_in_.data(), stream_);
  linear_rows(weights_.lm_head, head_in_.data(), rows, gemv_rows, logits_.data(), false, stream_);
}

// y [M, N] (=, or += with accumulate) x [M, K] · Wᵀ: rows [0, gemv_rows) on the row-tiled
// CUDA-core kernels, the rest on the tensor cores (ops_mma_gemm.h) when the format has them
// (GPTQ INT4 dense projections stay on the row-tiled kernels for every row).
void Qwen35CudaModel::linear_rows(const DeviceLinear& w, const float* x, int M, int gemv_rows, float* y,
                                  bool accumulate, cudaStream_t s) {
  const bool tc = options_.tensor_core_decode && tc_gemv_supported(w);
  if (!tc && (gemv_rows >= M || !mma_gemm_supported(w))) {  // one CUDA-core family for every row
    linear_->run(x, M, w, y, true, s, accumulate);
    return;
  }
  if (gemv_rows > 0) {
    if (tc) {
      const RowGemvJob job{&w, y, accumulate};
      tc_gemv_f32(x, std::min(gemv_rows, M), std::span<const RowGemvJob>(&job, 1), s);
    } else {
      linear_->run(x, gemv_rows, w, y, true, s, accumulate);
    }
  }
  if (gemv_rows >= M) return;
  if (!mma_gemm_supported(w)) {  // prompt rows of a format without a tensor-core GEMM (GPTQ dense)
    linear_->run(x + size_t(gemv_rows) * size_t(w.K), M - gemv_rows, w, y + size_t(gemv_rows) * size_t(w.N), true, s,
                 accumulate);
    return;
  }
  mma_gemm(x + size_t(gemv_rows) * size_t(w.K), M - gemv_rows, w, y + size_t(gemv_rows) * size_t(w.N), accumulate,
           s);
}

// Generated rows of several projections of the same x in one launch where the family allows:
// tc_gemv (tensor_core_decode, every weight supported, one K) or the CUDA-core GEMVs.
void Qwen35CudaModel::generated_multi(std::span<const LinearOut> outs, const float* x, int rows, cudaStream_t s) {
  bool tc = options_.tensor_core_decode;
  for (const auto& o : outs) tc = tc && tc_gemv_supported(*o.w) && o.w->K == outs[0].w->K;
  if (!tc) {
    quant_gemv_multi(x, rows, outs, s);
    return;
  }
  std::vector<RowGemvJob> jobs;
  jobs.reserve(outs.size());
  for (const auto& o : outs) jobs.push_back({o.w, o.y, false});
  tc_gemv_f32(x, rows, jobs, s);
}

// Makes the side stream wait for the work enqueued on s so far.
void Qwen35CudaModel::fork_side(cudaStream_t s) {
  MOESERVE_CUDA_CHECK(cudaEventRecord(fork_event_, s));
  MOESERVE_CUDA_CHECK(cudaStreamWaitEvent(aux_stream_, fork_event_, 0));
}

// Projections of the same x whose prompt rows the caller splits between s and the side stream:
// the generated rows of all of them in one launch on s (generated_multi); then, where the side
// stream is in use (batch-invariant runs; otherwise linear_ shares one dequantisation workspace)
// and there are prompt rows, forks the side stream from s and returns true: the caller runs each
// projection's prompt rows (prompt_multi_rows) on one of the two streams and joins them. Otherwise
// runs the prompt rows on s and returns false. The small projections (KV, b / a, z, the shared
// expert's) are latency-bound GEMMs that leave most SMs idle: on the side stream they overlap
// the large ones or the kernels that come before their consumer.
bool Qwen35CudaModel::multi_rows_fork(std::span<const LinearOut> outs, const float* x, int M, int gemv_rows,
                                      cudaStream_t s) {
  const int g = std::min(gemv_rows, M);
  if (g > 0) generated_multi(outs, x, g, s);
  if (!options_.batch_invariant || gemv_rows >= M) {
    prompt_multi_rows(outs, x, M, gemv_rows, s);
    return false;
  }
  fork_side(s);
  return true;
}

// The prompt rows [gemv_rows, M) of several projections of the same x: one GEMM per weight.
void Qwen35CudaModel::prompt_multi_rows(std::span<const LinearOut> outs, const float* x, int M, int gemv_rows,
                                        cudaStream_t s) {
  if (gemv_rows >= M) return;
  for (const auto& o : outs) {
    const DeviceLinear& w = *o.w;
    const size_t xo = size_t(gemv_rows) * size_t(w.K), yo = size_t(gemv_rows) * size_t(w.N);
    if (mma_gemm_supported(w))
      mma_gemm(x + xo, M - gemv_rows, w, o.y + yo, false, s);
    else
      linear_->run(x + xo, M - gemv_rows, w, o.y + yo, true, s);
  }
}

// The routed experts of one layer. Rows [0, G) are generated tokens, [G, M) prompt tokens; each kind takes
// one family, fixed by the options (so a token's bits never depend on its batch): the integer form
// (moe_routed_experts_int; int_experts_generated / int_experts_prompt, formats it covers), the CUDA-core
// f32 kernels (generated tokens by default) or the f32 tensor-core kernels (prompt tokens, and generated
// ones with tensor_core_decode_experts). Rows of one family share a call; each call routes its own rows.
// They add the routed experts only: the shared expert is added by the next norm (enqueue_layers).
void Qwen35CudaModel::enqueue_experts(const CudaMoeWeights& moe, int M, int G) {
  enum class Family { CudaCores, TensorCores, Int };
  const auto& c = config_;
  const int H = int(c.hidden_size), E = int(c.num_experts);
  const MoeShape ms{E, int(c.num_experts_per_tok), H, int(c.moe_intermediate_size)};
  const bool int_ok = moe_int_supported(ms, moe.experts);
  const Family gen = options_.int_experts_generated && int_ok ? Family::Int
                     : options_.tensor_core_decode_experts    ? Family::TensorCores
                                                              : Family::CudaCores;
  const Family prompt = options_.int_experts_prompt && int_ok ? Family::Int : Family::TensorCores;
  cudaStream_t s = stream_;
  auto run = [&](Family f, int r0, int n) {
    const size_t xo = size_t(r0) * size_t(H);
    const float* x = x32_.data() + xo;
    const float* logits = router_logits_.data() + size_t(r0) * size_t(E);
    float* res = residual_.data() + xo;
    if (f == Family::Int) {
      if (!moe_routed_experts_int(x, logits, ms, moe.experts, n, moe_mma_ws_.data(), moe_mma_ws_.bytes(), res, s))
        throw Error("moe_routed_experts_int declined experts moe_int_supported accepted");
    } else if (f == Family::CudaCores) {
      moe_routed_experts(x, logits, ms, moe.experts, n, moe_ws_.data(), moe_ws_.bytes(), res, s);
    } else {  // formats without tensor-core kernels (act-order GPTQ) take the CUDA-core ones
      if (!moe_routed_experts_mma(x, logits, ms, moe.experts, n, moe_mma_ws_.data(), moe_mma_ws_.bytes(), res, s))
        moe_routed_experts(x, logits, ms, moe.experts, n, moe_ws_.data(), moe_ws_.bytes(), res, s);
    }
  };
  if (G == 0 || G == M || gen == prompt) {
    run(G > 0 ? gen : prompt, 0, M);
  } else {
    run(gen, 0, G);
    run(prompt, G, M - G);
  }
}

void Qwen35CudaModel::enqueue_layers(int M, RowSplit split) {
  // G: generated rows (the matmuls' generated-token family: CUDA-core GEMVs, or tc_gemv with
  // tensor_core_decode); the routed experts' family per token kind: enqueue_experts.
  const int G = split.generated_rows;
  const auto& c = config_;
  const int H = int(c.hidden_size);
  const float eps = float(c.rms_norm_eps);
  cudaStream_t s = stream_;
  embedding_lookup(token_ids_ptr_, M, weights_.embed_tokens.data(), H, residual_.data(), s);
  const AttentionShape as{int(c.num_attention_heads), int(c.num_key_value_heads), int(c.head_dim),
                          int(c.rotary_dim()), eps};
  const GdnShape gs{int(c.linear_num_key_heads), int(c.linear_num_value_heads), int(c.linear_key_head_dim),
                    int(c.linear_value_head_dim), int(c.linear_conv_kernel_dim), eps};
  // The previous layer's shared expert, added by the next norm (after the routed experts, which add
  // only themselves): residual = fmaf(sigmoid(gate), shared, residual + routed), the combine's order
  // (ops_basic.h GatedAdd), so the routed experts' kernels never wait for the side stream.
  GatedAdd pending_shared{};
  cudaEvent_t shared_ready = nullptr;
  auto norm_adding_shared = [&](const float* w) {
    if (shared_ready) MOESERVE_CUDA_CHECK(cudaStreamWaitEvent(s, shared_ready, 0));
    add_rms_norm(residual_.data(), nullptr, pending_shared, w, M, H, eps, nullptr, s, x32_.data());
    pending_shared = GatedAdd{};
    shared_ready = nullptr;
  };
  for (size_t li = 0; li < weights_.layers.size(); ++li) {
    const auto& L = weights_.layers[li];
    norm_adding_shared(L.input_norm.data());
    if (L.attention) {
      const auto& a = *L.attention;
      const int idx = cache_index_[li];
      KvCacheView kv{k_cache_[size_t(idx)].data(), v_cache_[size_t(idx)].data(), num_kv_blocks_ + 1,
                     int(c.num_key_value_heads), options_.kv_block_size, int(c.head_dim)};
      const LinearOut qkv[] = {{&a.q_proj, qg_.data()}, {&a.k_proj, k_.data()}, {&a.v_proj, v_.data()}};
      if (multi_rows_fork(qkv, x32_.data(), M, G, s)) {  // K and V beside Q's GEMM
        prompt_multi_rows(std::span<const LinearOut>(qkv + 1, 2), x32_.data(), M, G, aux_stream_);
        MOESERVE_CUDA_CHECK(cudaEventRecord(kv_ready_event_, aux_stream_));
        prompt_multi_rows(std::span<const LinearOut>(qkv, 1), x32_.data(), M, G, s);
        MOESERVE_CUDA_CHECK(cudaStreamWaitEvent(s, kv_ready_event_, 0));
      }
      const float scale = 1.0f / std::sqrt(float(c.head_dim));
      StepMeta gen = meta_;  // the generated tokens: their sequences and rows are the step's first ones
      gen.num_tokens = split.generated_rows;
      gen.num_seqs = split.generated_seqs;
      // Steps of generated tokens only: attention_prepare's work inside the tile-parallel decode kernel
      // where that kernel serves the step (paged_attention_generated_prepared), else the launches below.
      const bool prepared = options_.fused_attention_prepare && G == M && paged_attention_prefill_supported(as) &&
                            !(options_.tensor_core_attention && paged_attention_generated_tc_supported(as)) &&
                            paged_attention_generated_prepared(qg_.data(), k_.data(), v_.data(), a.q_norm.data(),
                                                               a.k_norm.data(), inv_freq_.data(), as, gen, kv, scale,
                                                               attn_ws_.data(), attn_ws_.bytes(), attn_out_.data(), s);
      if (!prepared) {
        attention_prepare(qg_.data(), k_.data(), v_.data(), a.q_norm.data(), a.k_norm.data(), inv_freq_.data(), as,
                          meta_, kv, q_.data(), gate_.data(), s);
        if (!paged_attention_prefill_supported(as)) {  // e.g. head_dim 24: every token on CUDA cores
          paged_attention(q_.data(), gate_.data(), as, meta_, kv, scale, attn_ws_.data(), attn_ws_.bytes(),
                          attn_out_.data(), s);
        } else if (split.generated_rows > 0) {  // generated tokens: split-KV decode attention
          paged_attention_generated(q_.data(), gate_.data(), as, gen, kv, scale, options_.tensor_core_attention,
                                    attn_ws_.data(), attn_ws_.bytes(), attn_out_.data(), s);
        }
        if (paged_attention_prefill_supported(as) && split.generated_rows < M)  // prompt tokens: tensor cores
          paged_attention_prefill(q_.data(), gate_.data(), as, meta_, kv, scale, split.generated_seqs, meta_.num_seqs,
                                  split.generated_rows, M - split.generated_rows, nullptr, 0, attn_out_.data(), s);
      }
      linear_rows(a.o_proj, attn_out_.data(), M, G, residual_.data(), /*accumulate=*/true, s);
    } else {
      const auto& g = *L.gdn;
      const int idx = cache_index_[li];
      GdnLayerParams p{g.conv1d.data(), g.dt_bias.data(), g.a_log.data(), g.norm.data(),
                       conv_state_[size_t(idx)].data(), rec_state_[size_t(idx)].data()};
      // One launch for the generated rows (mixed FP8 / bf16 jobs over the same x, ops_quant_gemv.h).
      const LinearOut in_proj[] = {{&g.in_proj_qkv, qkv_.data()},
                                   {&g.in_proj_z, z_.data()},
                                   {&g.in_proj_b, b_.data()},
                                   {&g.in_proj_a, a_.data()}};
      // Prompt rows: b and a, then z on the side stream beside the qkv GEMM; z is waited for only
      // before the kernel that reads it (the chunked scan's gated norm: its z_ready).
      cudaEvent_t z_ready = nullptr;
      if (multi_rows_fork(in_proj, x32_.data(), M, G, s)) {
        prompt_multi_rows(std::span<const LinearOut>(in_proj + 2, 2), x32_.data(), M, G, aux_stream_);
        MOESERVE_CUDA_CHECK(cudaEventRecord(ba_ready_event_, aux_stream_));
        prompt_multi_rows(std::span<const LinearOut>(in_proj + 1, 1), x32_.data(), M, G, aux_stream_);
        MOESERVE_CUDA_CHECK(cudaEventRecord(z_ready_event_, aux_stream_));
        z_ready = z_ready_event_;
        prompt_multi_rows(std::span<const LinearOut>(in_proj, 1), x32_.data(), M, G, s);
        MOESERVE_CUDA_CHECK(cudaStreamWaitEvent(s, ba_ready_event_, 0));
        if (!chunked_gdn_) {  // the recurrent kernel below reads z from the start
          MOESERVE_CUDA_CHECK(cudaStreamWaitEvent(s, z_ready_event_, 0));
          z_ready = nullptr;
        }
      }
      if (chunked_gdn_ && split.generated_rows < M) {
        // Generated tokens: the recurrent decode kernel; prompt tokens: the chunked (WY) form on
        // position-aligned chunks of 64 (prefill_alignment()).
        if (split.generated_rows > 0) {
          StepMeta gen = meta_;  // the generated sequences and rows are the step's first ones
          gen.num_tokens = split.generated_rows;
          gen.num_seqs = split.generated_seqs;
          gated_delta_net(qkv_.data(), z_.data(), b_.data(), a_.data(), gs, p, gen, gdn_ws_.data(), gdn_ws_.bytes(),
                          gdn_out_.data(), s);
        }
        gated_delta_net_chunked(qkv_.data(), z_.data(), b_.data(), a_.data(), gs, p, meta_, split.generated_seqs,
                                split.generated_rows, gdn_ws_.data(), gdn_ws_.bytes(), gdn_out_.data(), s, z_ready);
      } else {
        gated_delta_net(qkv_.data(), z_.data(), b_.data(), a_.data(), gs, p, meta_, gdn_ws_.data(), gdn_ws_.bytes(),
                        gdn_out_.data(), s);
      }
      linear_rows(g.out_proj, gdn_out_.data(), M, G, residual_.data(), /*accumulate=*/true, s);
    }
    add_rms_norm(residual_.data(), nullptr, L.post_attention_norm.data(), M, H, eps, nullptr, s, x32_.data());
    const auto& moe = L.moe;
    // Router, shared-expert gate, shared gate and up: one launch for the generated rows.
    const LinearOut moe_in[] = {{&moe.router, router_logits_.data()},
                                {&moe.shared_expert_gate, shared_gate_logit_.data()},
                                {&moe.shared_gate, shared_g_.data()},
                                {&moe.shared_up, shared_u_.data()}};
    if (std::min(G, M) > 0) generated_multi(moe_in, x32_.data(), std::min(G, M), s);
    // The shared expert (the prompt rows' gate logit, gate and up GEMMs, then every row's down
    // projection; the next norm adds it: residual = (residual + routed) + sigmoid(gate)·shared).
    // Steps with prompt tokens run it on the side stream beside the routing and the routed experts
    // (the shared expert's small GEMMs fill the SMs the expert kernels leave idle; the next norm
    // waits for it: join_event_). Decode steps take shared_expert_decode: on the side stream too
    // (the default; at one token the fused expert kernel holds every SM, so the down projection
    // waits beside it for CTAs to retire, yet ends within ~1-2 us of it), or on this stream before
    // or after the routed experts (2.7 us more per layer in the chain: docs/PERF.md run S20-2).
    // Not batch invariant: this stream only (linear_ shares one dequant workspace between streams).
    using Order = CudaModelOptions::SharedExpertOrder;
    Order order = G == M ? options_.shared_expert_decode : Order::Side;
    if (!options_.batch_invariant) order = Order::Before;
    if (order == Order::Side) fork_side(s);  // before the router's prompt rows: the side stream does not wait for them
    prompt_multi_rows(std::span<const LinearOut>(moe_in, 1), x32_.data(), M, G, s);
    if (order == Order::Side) {
      enqueue_shared_expert(moe, M, G, aux_stream_);
      MOESERVE_CUDA_CHECK(cudaEventRecord(join_event_, aux_stream_));
      shared_ready = join_event_;
    } else if (order == Order::Before) {
      enqueue_shared_expert(moe, M, G, s);
    }
    enqueue_experts(moe, M, G);
    if (order == Order::After) enqueue_shared_expert(moe, M, G, s);
    pending_shared = GatedAdd{shared_down_.data(), shared_gate_logit_.data()};
  }
  norm_adding_shared(weights_.final_norm.data());
}

// The shared expert of a MoE block on stream ss, after the router set (generated_multi) wrote the
// generated rows' gate logit, gate and up: the prompt rows' three GEMMs, then every row's down
// projection into shared_down_ (generated rows through the gated GEMV, silu(g)·u read directly).
void Qwen35CudaModel::enqueue_shared_expert(const CudaMoeWeights& moe, int M, int G, cudaStream_t ss) {
  const int H = int(config_.hidden_size), Is = int(config_.shared_expert_intermediate_size);
  const LinearOut gate_up[] = {{&moe.shared_expert_gate, shared_gate_logit_.data()},
                               {&moe.shared_gate, shared_g_.data()},
                               {&moe.shared_up, shared_u_.data()}};
  prompt_multi_rows(gate_up, x32_.data(), M, G, ss);
  int sd = 0;  // rows whose down projection reads silu(g)·u directly (the gated GEMV)
  if (G > 0 && options_.tensor_core_decode && tc_gemv_gated_supported(moe.shared_down)) {
    tc_gemv_f32_gated(shared_g_.data(), shared_u_.data(), G, moe.shared_down, shared_down_.data(), false, ss);
    sd = G;
  } else if (G > 0 && !options_.tensor_core_decode && row_gemv_gated_supported(moe.shared_down)) {
    row_gemv_f32_gated(shared_g_.data(), shared_u_.data(), G, moe.shared_down, shared_down_.data(), false, ss);
    sd = G;
  }
  if (sd < M) {
    const size_t o = size_t(sd) * size_t(Is);
    silu_mul_split(shared_g_.data() + o, shared_u_.data() + o, M - sd, Is, shared_act_.data() + o, ss);
    linear_rows(moe.shared_down, shared_act_.data() + o, M - sd, G - sd, shared_down_.data() + size_t(sd) * size_t(H),
                false, ss);
  }
}

}  // namespace moeserve::cuda
