// quantization_config as the four published flavours write it (../shared/spec/qwen35_arch.md 4):
//   auto-round / gptq:   {quant_method, bits, group_size, sym, packing_format, extra_config, ...}
//   fp8 (Qwen):          {quant_method:"fp8", weight_block_size:[128,128], modules_to_not_convert}
//   compressed-tensors:  {quant_method, format, config_groups:{g:{weights:{num_bits, group_size,
//                         symmetric}}}, ignore:[...]}
//   modelopt:            {quant_method:"modelopt", quant_algo:"NVFP4", group_size, exclude_modules}
#include "core/error.h"
#include "io/json_fields.h"
#include "io/qwen35_config.h"

namespace moeserve::io {

QuantizationConfig parse_quantization_config(const nlohmann::json& j, const std::string& source,
                                             const std::string& field) {
  const JsonFields q(j, source, field + ".");
  QuantizationConfig out;
  out.raw = j;
  const std::optional<std::string> method = q.string("quant_method");
  if (!method || method->empty()) fail("{} is missing", q.where("quant_method"));
  out.quant_method = *method;

  if (auto bits = q.integer("bits")) out.bits = int(*bits);
  if (auto group = q.integer("group_size")) out.group_size = int(*group);
  if (auto sym = q.boolean("sym")) out.sym = *sym;
  if (auto packing = q.string("packing_format")) out.packing_format = *packing;

  if (auto block = q.integer_list("weight_block_size")) {
    if (block->size() != 2 || (*block)[0] <= 0 || (*block)[1] <= 0 || (*block)[0] > (1 << 20) ||
        (*block)[1] > (1 << 20))
      fail("{} must be two positive integers [rows, cols]", q.where("weight_block_size"));
    out.weight_block_size = {int((*block)[0]), int((*block)[1])};
  }

  // The modules left unquantised go by three names.
  for (const char* key : {"modules_to_not_convert", "ignore", "exclude_modules"})
    if (auto list = q.string_list(key)) {
      out.modules_to_not_convert = *list;
      break;
    }

  if (out.quant_method == "compressed-tensors") {
    // The weight scheme of the first config group (all published NVFP4 exports have one).
    if (auto groups = q.object("config_groups")) {
      for (const auto& [name, group] : groups->json().items()) {
        const JsonFields g(group, source, field + ".config_groups." + name + ".");
        if (auto weights = g.object("weights")) {
          if (auto bits = weights->integer("num_bits")) out.bits = int(*bits);
          if (auto group_size = weights->integer("group_size")) out.group_size = int(*group_size);
          if (auto sym = weights->boolean("symmetric")) out.sym = *sym;
        }
        break;
      }
    }
  } else if (out.quant_method == "modelopt") {
    if (auto algo = q.string("quant_algo"); algo && *algo == "NVFP4") out.bits = 4;
  }

  if (out.bits < 0 || out.bits > 16) fail("{} must be between 1 and 16", q.where("bits"));
  if (out.group_size < -1 || out.group_size > (1 << 20))
    fail("{} is out of range ({})", q.where("group_size"), out.group_size);
  return out;
}

}  // namespace moeserve::io
