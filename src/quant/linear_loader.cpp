#include "quant/linear_loader.h"

#include "core/error.h"
#include "quant/fp8_block.h"
#include "quant/gptq_int4.h"
#include "quant/nvfp4.h"

namespace moeserve::quant {

// One module being loaded: its names and the labels of its tensors for messages.
struct LinearLoader::Context {
  std::string module;  // canonical
  int64_t N = 0, K = 0;
  ModuleNames names;
  PartLabels labels;

  std::string tensor(const std::string& suffix) const { return module + "." + suffix; }
};

namespace {

// The module's name as stored on disk, from the source of one of its tensors
// ("model.safetensors: model.layers.0.mlp.gate.weight" -> "model.layers.0.mlp.gate").
std::string stored_module_name(const io::Checkpoint& ckpt, const std::string& tensor, const std::string& suffix) {
  const std::string source = ckpt.source_of(tensor);
  const size_t colon = source.find(": ");
  std::string name = colon == std::string::npos ? source : source.substr(colon + 2);
  if (name.size() > suffix.size() + 1 && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
    name.resize(name.size() - suffix.size() - 1);
  return name;
}

// The tensor if the checkpoint has it, else an undefined Tensor.
Tensor optional_tensor(const io::Checkpoint& ckpt, const std::string& name) {
  return ckpt.has(name) ? ckpt.get(name) : Tensor();
}

}  // namespace

LinearLoader::LinearLoader(const io::Checkpoint& ckpt, const io::Qwen35Config& config)
    : ckpt_(ckpt), scheme_(config.quantization, (ckpt.dir() / "config.json").string()) {}

QuantWeight LinearLoader::load(const std::string& module, int64_t out_features, int64_t in_features) const {
  Context c;
  c.module = module;
  c.N = out_features;
  c.K = in_features;
  c.labels.weight = "checkpoint " + ckpt_.dir().string() + ": module " + module;
  // Every tensor of this module the checkpoint holds, labelled with its file and stored name.
  static const char* const kSuffixes[] = {"weight",       "qweight",        "qzeros",         "scales",
                                          "g_idx",        "weight_scale_inv", "weight_packed", "weight_scale",
                                          "weight_global_scale", "weight_scale_2"};
  std::string present;
  for (const char* suffix : kSuffixes) {
    const std::string name = c.tensor(suffix);
    if (!ckpt_.has(name)) continue;
    const std::string role = std::string(suffix) == "weight_global_scale" ? "global_scale" : suffix;
    c.labels.tensors[role] = "checkpoint " + ckpt_.dir().string() + ": tensor " + name + " (" + ckpt_.source_of(name) + ")";
    if (present.empty()) {
      present = suffix;
      c.names = {module, stored_module_name(ckpt_, name, suffix)};
    }
  }
  if (present.empty())
    fail("checkpoint {}: missing tensor {}.weight (a Linear is stored as {}.weight, or quantised as .qweight or "
         ".weight_packed)",
         ckpt_.dir().string(), module, module);

  QuantWeight w;
  if (ckpt_.has(c.tensor("qweight"))) {
    w = load_gptq(c);
  } else if (ckpt_.has(c.tensor("weight_packed"))) {
    w = load_nvfp4(c, false);
  } else if (!ckpt_.has(c.tensor("weight"))) {
    fail("{}: has {} but no weight, qweight or weight_packed", c.labels.weight, c.tensor(present));
  } else {
    switch (ckpt_.info(c.tensor("weight")).dtype) {
      case DType::F8_E4M3: w = load_fp8(c); break;
      case DType::U8: w = load_nvfp4(c, true); break;
      default: w = load_dense(c); break;
    }
  }
  if (w.format != WeightFormat::Dense)
    if (std::optional<std::string> entry = scheme_.excluded_by(c.names))
      fail("{}: stored as {} but {} declares it unquantised by {}", c.labels.weight, format_name(w.format),
           scheme_.describe(), *entry);
  return w;
}

QuantWeight LinearLoader::load_gptq(const Context& c) const {
  std::optional<GptqInt4Params> params = scheme_.int4_params(c.names);
  const Tensor scales = optional_tensor(ckpt_, c.tensor("scales"));
  const Tensor qzeros = optional_tensor(ckpt_, c.tensor("qzeros"));
  if (!params) {
    // No INT4 quantization_config (a hybrid written under an FP8 config, or none): the group
    // size is what the scale grid says, and the weight is symmetric unless qzeros says otherwise.
    MOESERVE_CHECK(scales.defined() && scales.ndim() == 2 && scales.dim(0) > 0 && c.K % scales.dim(0) == 0,
                   "{}: INT4 weight whose group size cannot be read: {} has no INT4 group_size and {} does not "
                   "divide in_features {} into groups",
                   c.labels.weight, scheme_.describe(), c.labels.of("scales"), c.K);
    params = GptqInt4Params{c.K / scales.dim(0), true};
    if (qzeros.defined() && qzeros.dtype() == DType::I32)
      for (int64_t i = 0; i < qzeros.numel() && params->sym; ++i)
        params->sym = qzeros.data<uint32_t>()[i] == 0x77777777u;
  }
  return gptq_int4_weight(c.module, c.N, c.K, *params, ckpt_.get(c.tensor("qweight")), qzeros, scales,
                          optional_tensor(ckpt_, c.tensor("g_idx")), c.labels);
}

QuantWeight LinearLoader::load_fp8(const Context& c) const {
  if (!ckpt_.has(c.tensor("weight_scale_inv")) && ckpt_.has(c.tensor("weight_scale")))
    fail("{}: F8_E4M3 weight with a per-tensor/per-channel weight_scale is not supported (FP8 is read as block-scaled "
         "weight + weight_scale_inv)",
         c.labels.weight);
  return fp8_block_weight(c.module, c.N, c.K, scheme_.fp8_block(), ckpt_.get(c.tensor("weight")),
                          optional_tensor(ckpt_, c.tensor("weight_scale_inv")), c.labels);
}

QuantWeight LinearLoader::load_nvfp4(const Context& c, bool modelopt) const {
  // Activation scales (input_global_scale, input_scale) are for W4A4 kernels; the
  // dequantised path keeps activations in full precision and leaves them unread.
  PartLabels labels = c.labels;
  if (modelopt) {
    labels.tensors["weight_packed"] = c.labels.of("weight");
    return nvfp4_weight(c.module, c.N, c.K, Nvfp4Flavour::ModelOpt, ckpt_.get(c.tensor("weight")),
                        optional_tensor(ckpt_, c.tensor("weight_scale")),
                        optional_tensor(ckpt_, c.tensor("weight_scale_2")), labels);
  }
  return nvfp4_weight(c.module, c.N, c.K, Nvfp4Flavour::CompressedTensors, ckpt_.get(c.tensor("weight_packed")),
                      optional_tensor(ckpt_, c.tensor("weight_scale")),
                      optional_tensor(ckpt_, c.tensor("weight_global_scale")), labels);
}

QuantWeight LinearLoader::load_dense(const Context& c) const {
  // Scale tensors beside a float weight mean a quantised weight stored in the wrong dtype.
  for (const char* scale : {"weight_scale_inv", "weight_scale", "weight_scale_2", "scales", "qzeros"})
    if (ckpt_.has(c.tensor(scale)))
      fail("{}: dtype {}, but {} exists: a quantised weight must be F8_E4M3 (FP8 block) or U8 (NVFP4)",
           c.labels.of("weight"), dtype_name(ckpt_.info(c.tensor("weight")).dtype), c.tensor(scale));
  return dense_weight(ckpt_.get_float(c.tensor("weight"), {c.N, c.K}), c.module);
}

QuantWeight load_linear(const io::Checkpoint& ckpt, const std::string& module, int64_t out_features,
                        int64_t in_features, const io::Qwen35Config& config) {
  return LinearLoader(ckpt, config).load(module, out_features, in_features);
}

}  // namespace moeserve::quant
