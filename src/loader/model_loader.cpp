// Definition of model::load_causal_lm (declared in src/model/model_loader.h): the one place
// that knows every backend.
#include "model/model_loader.h"

#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "model/qwen35_cpu.h"

#ifdef MOESERVE_WITH_CUDA
#include "backend/cuda/device_info.h"
#include "backend/cuda/qwen35_cuda.h"
#include <cuda_runtime.h>
#endif

namespace moeserve::model {

std::string resolve_device(const std::string& requested) {
  if (requested == "cpu") return "cpu";
#ifdef MOESERVE_WITH_CUDA
  const bool have_gpu = !cuda::list_devices().empty();
#else
  const bool have_gpu = false;
#endif
  if (requested == "auto") return have_gpu ? "cuda" : "cpu";
  if (requested == "cuda") {
#ifndef MOESERVE_WITH_CUDA
    fail("--device cuda: this build has no CUDA backend (rebuild with -DMOESERVE_CUDA=ON on a machine with nvcc)");
#endif
    MOESERVE_CHECK(have_gpu, "--device cuda: no CUDA device is visible");
    return "cuda";
  }
  fail("unknown device '{}' (expected cpu, cuda or auto)", requested);
}

std::unique_ptr<CausalLM> load_causal_lm(const std::filesystem::path& model_dir, const ModelLoadOptions& options) {
  const std::string device = resolve_device(options.device);
  MOESERVE_CHECK(options.load_format == "auto" || options.load_format == "safetensors" ||
                     options.load_format == "dummy",
                 "unknown --load-format '{}' (expected auto, safetensors or dummy)", options.load_format);
  if (device == "cpu") {
    MOESERVE_CHECK(options.load_format != "dummy", "--load-format dummy needs --device cuda");
    return Qwen35CpuModel::load(model_dir, CpuModelOptions{options.threads, options.kv_block_size, options.load_mtp,
                                                           options.int8_lm_head});
  }
#ifdef MOESERVE_WITH_CUDA
  cuda::CudaModelOptions gpu;
  gpu.dummy = options.load_format == "dummy";
  gpu.dummy_weights = options.dummy_weights;
  gpu.int8_lm_head = options.int8_lm_head;
  gpu.max_tokens_per_step = options.max_num_batched_tokens;
  gpu.max_seqs = options.max_num_seqs;
  gpu.max_graph_batch = std::min(options.max_num_seqs, 256);
  gpu.max_model_len = options.max_model_len;
  gpu.kv_block_size = options.kv_block_size;
  cuda::set_decode_kernels(gpu, options.decode_kernels);
  cuda::set_expert_activations(gpu, options.expert_activations);
  cuda::set_decode_attention(gpu, options.decode_attention);
  return cuda::Qwen35CudaModel::load(model_dir, gpu);
#else
  fail("--device cuda: this build has no CUDA backend");
#endif
}

size_t gpu_cache_budget_bytes(double utilization) {
  MOESERVE_CHECK(utilization > 0.0 && utilization <= 1.0, "--gpu-memory-utilization must be in (0, 1], got {}",
                 utilization);
#ifdef MOESERVE_WITH_CUDA
  size_t free_bytes = 0, total_bytes = 0;
  const cudaError_t err = cudaMemGetInfo(&free_bytes, &total_bytes);
  MOESERVE_CHECK(err == cudaSuccess, "cudaMemGetInfo failed: {}", cudaGetErrorString(err));
  const double used = double(total_bytes - free_bytes);
  const double budget = utilization * double(total_bytes) - used;
  MOESERVE_CHECK(budget > 0.0,
                 "--gpu-memory-utilization {} leaves no room for the KV cache: {:.2f} GB of the GPU's {:.2f} GB are "
                 "in use after loading the model (raise it, or use a smaller --max-num-batched-tokens)",
                 utilization, used / 1e9, double(total_bytes) / 1e9);
  log::info("KV cache budget: {:.2f} GB ({} x {:.2f} GB total, {:.2f} GB in use)", budget / 1e9, utilization,
            double(total_bytes) / 1e9, used / 1e9);
  return size_t(budget);
#else
  fail("--gpu-memory-utilization: this build has no CUDA backend");
#endif
}

}  // namespace moeserve::model
