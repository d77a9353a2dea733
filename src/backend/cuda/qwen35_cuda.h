// Qwen3.5 MoE on one CUDA GPU: the CausalLM the runtime drives when --device cuda.
// The forward pass mirrors the CPU reference (src/model/qwen35_cpu.cpp, spec section 2.2)
// with the ops of ops_*.h; decode-only steps are captured as CUDA graphs per padded batch
// size and replayed (no allocation in the step loop: every buffer is sized at load).
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_sampler.h"
#include "backend/cuda/linear_runner.h"
#include "backend/cuda/ops_attention.h"
#include "backend/cuda/ops_gdn.h"
#include "backend/cuda/ops_moe.h"
#include "backend/cuda/ops_quant_gemv.h"
#include "backend/cuda/qwen35_cuda_weights.h"
#include "backend/cuda/step_meta.h"
#include "model/causal_lm.h"

namespace moeserve::cuda {

struct CudaModelOptions {
  bool dummy = false;                  // random weights of config.json (--load-format dummy)
  std::string dummy_weights = "bf16";  // see dummy_weights()
  uint64_t dummy_seed = 0;
  bool int8_lm_head = false;
  int max_tokens_per_step = 2048;      // larger steps are split into several passes
  int max_seqs = 256;
  int max_model_len = 4096;
  int kv_block_size = 16;
  bool cuda_graphs = true;             // capture decode steps
  int max_graph_batch = 256;           // largest decode batch captured
  int lm_head_chunk_rows = 256;        // LM head rows per pass (bounds the logits buffer)
  // Every matmul through kernels whose per-row result does not depend on the batch
  // (linear_runner.h); off: cuBLASLt for large M (faster prefill, batch-dependent bits).
  bool batch_invariant = true;
  // Generated tokens' kernel families (prompt tokens always take the prompt-token tensor-core kernels
  // where the format has them). tensor_core_decode: dense projections and the LM head through tc_gemv
  // (ops_tc_gemv.h: swapAB mma.sync, f16 hi/lo activations, its own fixed summation order), else the
  // CUDA-core GEMVs (ops_quant_gemv.h). tensor_core_decode_experts: routed experts through the
  // prompt-token expert kernels (moe_routed_experts_mma, swapAB tiles at decode sizes: the prompt
  // tokens' bits), else the CUDA-core expert kernels. Each family is fixed per op for every batch,
  // so a token's kernels depend only on the token, not on its batch. set_decode_kernels() maps the
  // serve flag's names onto the two.
  bool tensor_core_decode = false;
  bool tensor_core_decode_experts = false;
  // Routed GPTQ INT4 experts in the integer form (moe_routed_experts_int, moe_int_arith.h: activations
  // quantised to 16-bit integers per 128-k block, exact integer sums per weight group; dp4a kernels up to
  // 8 rows, int8 tensor cores above, the same bits either way), per token kind: int_experts_generated
  // (instead of tensor_core_decode_experts' choice; the streaming dp4a kernels made it the fastest at 1-8
  // tokens too, session 17) and int_experts_prompt (instead of the bf16 hi/lo tensor-core kernels; ~1.2x
  // faster at prefill sizes, docs/PERF.md run V4). Formats the form does not cover keep the f32 kernels.
  // set_expert_activations() maps the serve flag's names onto them: "auto" (the default) and "int16" set
  // both, "f32" neither.
  bool int_experts_generated = true;
  bool int_experts_prompt = true;
  // Generated tokens' attention (decode steps and verify batches) on the tensor-core decode kernel
  // (paged_attention_generated, ops_attention_decode_tc.cu: the 16 q heads of a kv head as one MMA
  // tile, q and P split bf16 hi + lo) where the shape has it (head_dim 64 / 128 / 256), else the
  // CUDA-core kernels (paged_attention). Different bits, each batch invariant; every generated
  // token of a model takes the same one. set_decode_attention() maps the serve flag's names ("auto":
  // with the tensor-core decode kernels, as set_decode_kernels left tensor_core_decode).
  bool tensor_core_attention = false;
  // Programmatic dependent launch between small decode kernels (pdl.cuh); a process-wide setting.
  bool pdl = true;
  // Where a decode step's shared expert (its down projection at generated rows) runs: Side, on the
  // side stream beside the routed experts (as steps with prompt tokens always do); Before or After,
  // on the step's stream before or after the routed experts. The same bits every way (the next norm
  // adds the shared expert). set_shared_expert_decode() maps bench_decode's flag names onto it.
  enum class SharedExpertOrder { Side, Before, After };
  SharedExpertOrder shared_expert_decode = SharedExpertOrder::Side;
  // Prompt tokens of DeltaNet layers in the chunked (WY) form (ops_gdn_chunked.h) where the shape
  // allows; prefill steps are then cut at multiples of 64 positions (prefill_alignment()).
  // Off: the sequential recurrence for every token.
  bool chunked_deltanet = true;
  // Steps of generated tokens whose decode attention takes the tile-parallel kernel (1-2 tokens): that
  // kernel does attention_prepare's work itself (paged_attention_generated_prepared, the same bits);
  // off: attention_prepare, then the decode kernel.
  bool fused_attention_prepare = true;
};

// `--decode-kernels`: "gemv" (both families on CUDA cores), "tensor-cores" (both on tensor cores) or
// "mixed" (dense projections on tc_gemv, experts on the CUDA-core kernels). Throws Error otherwise.
void set_decode_kernels(CudaModelOptions& o, const std::string& name);
// `--expert-activations`: "auto" (prompt tokens in the integer form, generated tokens f32), "f32" (every
// token's routed experts on the f32 kernels) or "int16" (every token in the integer form). Throws Error
// otherwise.
void set_expert_activations(CudaModelOptions& o, const std::string& name);
// `--decode-attention`: "auto" (the default: tensor cores when the generated tokens' dense projections
// run on them, i.e. --decode-kernels mixed or tensor-cores; CUDA cores with gemv, the batch-1 setting:
// call it after set_decode_kernels), "tensor-cores" or "cuda-cores" (tensor_core_attention). Throws
// Error otherwise.
void set_decode_attention(CudaModelOptions& o, const std::string& name);

// "side", "before" or "after" (CudaModelOptions::shared_expert_decode). Throws Error otherwise.
void set_shared_expert_decode(CudaModelOptions& o, const std::string& name);

class Qwen35CudaModel final : public model::CausalLM {
 public:
  // Reads config.json in model_dir (or the .json file given) and either the checkpoint or,
  // with options.dummy, nothing else.
  static std::unique_ptr<Qwen35CudaModel> load(const std::filesystem::path& model_dir, const CudaModelOptions& options);
  Qwen35CudaModel(io::Qwen35Config config, CudaWeights weights, const CudaModelOptions& options);
  ~Qwen35CudaModel() override;

  const io::Qwen35Config& config() const override { return config_; }
  model::CacheGeometry cache_geometry() const override;
  void allocate_caches(int num_kv_blocks, int num_state_slots) override;
  void reset_state(int32_t slot) override;
  void copy_state(int32_t src, int32_t dst) override;
  void forward(std::span<const model::SeqStep> batch, model::StepOutput& out) override;
  bool supports_device_sampling() const override { return true; }
  // 64 with the chunked DeltaNet prompt kernel (its chunks sit at multiples of 64 positions), else 1.
  int prefill_alignment() const override { return prompt_alignment_; }

  size_t weight_bytes() const { return weights_.bytes(); }
  const CudaWeights& weights() const { return weights_; }
  // Bytes of GPU memory used by workspaces (activations, scratch), excluding weights and caches.
  size_t workspace_bytes() const { return workspace_bytes_; }
  cudaStream_t stream() const { return stream_; }

 private:
  struct SubStep;  // a slice of the batch that fits the step workspaces
  void run_substep(std::span<const model::SeqStep> batch, const std::vector<int64_t>& token_base,
                   const SubStep& sub, model::StepOutput& out);
  // Rows [0, generated_rows) of a step (sequences [0, generated_seqs)) hold generated tokens,
  // the rest prompt tokens (SeqStep::prompt_len). Prompt tokens take the tensor-core kernels;
  // generated ones the CUDA-core GEMVs and split-KV attention (the matmuls on the tensor cores
  // too with tensor_core_decode).
  struct RowSplit {
    int generated_rows = 0;
    int generated_seqs = 0;
  };
  void enqueue_layers(int M, RowSplit split);
  void enqueue_experts(const CudaMoeWeights& moe, int M, int G);
  void enqueue_shared_expert(const CudaMoeWeights& moe, int M, int G, cudaStream_t ss);
  void linear_rows(const DeviceLinear& w, const float* x, int M, int gemv_rows, float* y, bool accumulate,
                   cudaStream_t s);
  void prompt_multi_rows(std::span<const LinearOut> outs, const float* x, int M, int gemv_rows, cudaStream_t s);
  bool multi_rows_fork(std::span<const LinearOut> outs, const float* x, int M, int gemv_rows, cudaStream_t s);
  void fork_side(cudaStream_t s);
  void generated_multi(std::span<const LinearOut> outs, const float* x, int rows, cudaStream_t s);
  // LM head of logit rows [row_begin, row_begin + rows); the first gemv_rows of them are GEMV rows.
  void enqueue_lm_head_rows(int row_begin, int rows, int gemv_rows);
  void allocate_workspaces();
  void clear_step_metadata();  // every block-table entry (host and device) back to block 0

  io::Qwen35Config config_;
  CudaWeights weights_;
  CudaModelOptions options_;
  cudaStream_t stream_ = nullptr;
  // Side stream for work that overlaps the main chain (the shared expert), forked and joined by
  // the two events inside each layer (also inside graph capture).
  cudaStream_t aux_stream_ = nullptr;
  cudaEvent_t fork_event_ = nullptr, join_event_ = nullptr;
  // Prompt rows' projections on the side stream (multi_rows_fork), done: an attention layer's K
  // and V; a DeltaNet layer's b and a, then its z.
  cudaEvent_t kv_ready_event_ = nullptr, ba_ready_event_ = nullptr, z_ready_event_ = nullptr;
  int prompt_alignment_ = 1;  // prefill_alignment()
  bool chunked_gdn_ = false;  // prompt tokens of DeltaNet layers take gated_delta_net_chunked
  std::unique_ptr<LinearRunner> linear_;
  std::vector<float> inv_freq_host_;
  DeviceBuffer<float> inv_freq_;

  // Caches: per full-attention layer a K and a V pool; per linear layer conv + recurrent state.
  // One extra block and one extra slot (the last ones) absorb padded graph rows.
  int num_kv_blocks_ = 0, num_state_slots_ = 0;
  std::vector<DeviceBuffer<bf16>> k_cache_, v_cache_;
  std::vector<DeviceBuffer<float>> conv_state_, rec_state_;
  std::vector<int> cache_index_;  // per layer: index into the KV pools or the state arrays

  // Step metadata (fixed addresses) and its pinned staging buffer.
  int max_blocks_per_seq_ = 0;
  DeviceBuffer<int32_t> meta_buf_;
  int32_t* meta_host_ = nullptr;
  StepMeta meta_{};
  const int32_t* token_ids_ptr_ = nullptr;   // [M] inside meta_buf_
  const int32_t* logit_rows_ptr_ = nullptr;  // [R] inside meta_buf_

  // Activations and scratch, sized for max_tokens_per_step.
  // Activations stay f32 between ops: a decode step is bound by weight bytes, so f32 costs
  // almost nothing, and bf16 rounding of the intermediates is what separated the bf16 path
  // from the fp32 reference (docs/CUDA_BACKEND.md, "Precision"). x32_: the norm output.
  DeviceBuffer<float> residual_, router_logits_, shared_down_, shared_gate_logit_, logits_, x32_, b_, a_;
  DeviceBuffer<float> qg_, k_, v_, q_, gate_, attn_out_, qkv_, z_, gdn_out_, shared_g_, shared_u_, shared_act_,
      head_in_;
  DeviceBuffer<uint8_t> attn_ws_, gdn_ws_, moe_ws_, moe_mma_ws_;  // moe_mma_ws_: also the integer form's
  size_t workspace_bytes_ = 0;
  float* logits_host_ = nullptr;  // pinned [lm_head_chunk_rows, V]
  std::unique_ptr<DeviceRowSampler> row_sampler_;  // samples device_sample rows, copies the others

  // CUDA graphs of decode steps, per (padded batch size, rows on the tensor cores or not).
  std::map<std::pair<int, bool>, cudaGraphExec_t> graphs_;
  void clear_graphs();
};

}  // namespace moeserve::cuda
