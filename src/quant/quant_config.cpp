#include "quant/quant_config.h"

#include <string_view>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/json_fields.h"

namespace moeserve::quant {

namespace {

// Characters that make an extra_config key a regex rather than a module name (vLLM's rule).
bool looks_like_regex(std::string_view key) {
  return key.find_first_of("*+?^$()[]{}|\\") != std::string_view::npos;
}

// fnmatch-style glob (ModelOpt exclude_modules: "*mlp.gate") as an ECMAScript regex.
std::string glob_to_regex(std::string_view glob) {
  std::string re;
  for (char c : glob) {
    switch (c) {
      case '*': re += ".*"; break;
      case '?': re += '.'; break;
      case '[':
      case ']': re += c; break;
      default:
        if (std::string_view(".^$+(){}|\\/").find(c) != std::string_view::npos) re += '\\';
        re += c;
    }
  }
  return re;
}

std::regex compile(const std::string& pattern, const std::string& where) {
  try {
    return std::regex(pattern, std::regex::ECMAScript | std::regex::optimize);
  } catch (const std::regex_error& e) {
    fail("{}: '{}' is not a valid regular expression ({})", where, pattern, e.what());
  }
}

// `name` ends with `suffix` at a '.' boundary, or equals it.
bool is_dotted_suffix(const std::string& name, const std::string& suffix) {
  if (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  return name.size() == suffix.size() || name[name.size() - suffix.size() - 1] == '.';
}

std::string canonical_or_self(const std::string& name) {
  std::optional<std::string> c = io::canonical_tensor_name(name);
  return c ? *c : name;
}

}  // namespace

std::string_view quant_method_name(QuantMethod m) {
  switch (m) {
    case QuantMethod::None: return "none";
    case QuantMethod::AutoRound: return "auto-round";
    case QuantMethod::Gptq: return "gptq";
    case QuantMethod::Fp8: return "fp8";
    case QuantMethod::CompressedTensors: return "compressed-tensors";
    case QuantMethod::ModelOpt: return "modelopt";
  }
  return "?";
}

QuantScheme::QuantScheme(const std::optional<io::QuantizationConfig>& config, const std::string& source)
    : source_(source) {
  if (!config) return;
  const io::QuantizationConfig& q = *config;
  const io::JsonFields f(q.raw, source, "quantization_config.");
  const std::string& m = q.quant_method;
  if (m == "auto-round")
    method_ = QuantMethod::AutoRound;
  else if (m == "gptq")
    method_ = QuantMethod::Gptq;
  else if (m == "fp8")
    method_ = QuantMethod::Fp8;
  else if (m == "compressed-tensors")
    method_ = QuantMethod::CompressedTensors;
  else if (m == "modelopt")
    method_ = QuantMethod::ModelOpt;
  else
    fail("{}: '{}' is not supported (this build decodes auto-round and gptq INT4, fp8 block, "
         "compressed-tensors nvfp4-pack-quantized and modelopt NVFP4)",
         f.where("quant_method"), m);

  switch (method_) {
    case QuantMethod::AutoRound:
    case QuantMethod::Gptq: {
      bits_ = q.bits == 0 ? 4 : q.bits;
      MOESERVE_CHECK(bits_ == 4, "{}: {}-bit weights are not supported (INT4 only)", f.where("bits"),
                     bits_);
      // GPTQ's default group size is 128; -1 means one group over all of K.
      int4_.group_size = q.group_size == 0 ? 128 : q.group_size;
      MOESERVE_CHECK(int4_.group_size == -1 || int4_.group_size > 0, "{}: group size {} (expected > 0 or -1)",
                     f.where("group_size"), int4_.group_size);
      int4_.sym = q.sym;
      if (method_ == QuantMethod::AutoRound) {
        const std::string packing = q.packing_format;
        MOESERVE_CHECK(packing.empty() || packing == "auto_round:auto_gptq" || packing == "auto_gptq",
                       "{}: packing '{}' is not supported (INT4 is read in the GPTQ packing auto_round:auto_gptq)",
                       f.where("packing_format"), packing);
        if (auto type = f.string("data_type"))
          MOESERVE_CHECK(*type == "int", "{}: '{}' is not supported (INT4 data_type 'int' only)",
                         f.where("data_type"), *type);
        if (auto extra = f.object("extra_config")) parse_extra_config(extra->json(), source);
      } else if (auto format = f.string("checkpoint_format")) {
        MOESERVE_CHECK(*format == "gptq", "{}: '{}' is not supported (GPTQ v1 checkpoints, qzeros stored as zero - 1)",
                       f.where("checkpoint_format"), *format);
      }
      break;
    }
    case QuantMethod::Fp8: {
      if (!q.weight_block_size.empty()) fp8_block_ = {q.weight_block_size[0], q.weight_block_size[1]};
      if (auto fmt = f.string("fmt"))
        MOESERVE_CHECK(*fmt == "e4m3", "{}: '{}' is not supported (FP8 e4m3 only)", f.where("fmt"), *fmt);
      break;
    }
    case QuantMethod::CompressedTensors: {
      const std::optional<std::string> format = f.string("format");
      MOESERVE_CHECK(format && *format == "nvfp4-pack-quantized",
                     "{}: '{}' is not supported (compressed-tensors checkpoints are read in the NVFP4 format "
                     "nvfp4-pack-quantized)",
                     f.where("format"), format.value_or(""));
      MOESERVE_CHECK(q.group_size == 0 || q.group_size == kNvfp4GroupSize,
                     "{}: NVFP4 group size {} (the format defines 16)", f.where("config_groups.*.weights.group_size"),
                     q.group_size);
      break;
    }
    case QuantMethod::ModelOpt: {
      const std::optional<std::string> algo = f.string("quant_algo");
      MOESERVE_CHECK(algo && *algo == "NVFP4", "{}: '{}' is not supported (ModelOpt checkpoints are read as NVFP4)",
                     f.where("quant_algo"), algo.value_or(""));
      MOESERVE_CHECK(q.group_size == 0 || q.group_size == kNvfp4GroupSize, "{}: NVFP4 group size {} (the format "
                     "defines 16)", f.where("group_size"), q.group_size);
      break;
    }
    case QuantMethod::None: break;
  }
  parse_exclusions(q);
}

void QuantScheme::parse_extra_config(const nlohmann::json& extra, const std::string& source) {
  for (const auto& [key, value] : extra.items()) {
    const std::string where = source + ": quantization_config.extra_config." + key;
    MOESERVE_CHECK(value.is_object(), "{} must be an object ({{\"bits\": .., \"group_size\": .., \"sym\": ..}})",
                   where);
    const io::JsonFields e(value, source, "quantization_config.extra_config." + key + ".");
    Int4Override o;
    o.key = key;
    if (auto bits = e.integer("bits")) o.bits = int(*bits);
    if (auto group = e.integer("group_size")) o.group_size = *group;
    if (auto sym = e.boolean("sym")) o.sym = *sym;
    if (looks_like_regex(key))
      regex_overrides_.emplace_back(o, compile(key, where));
    else
      exact_overrides_.emplace(canonical_or_self(key), std::move(o));
  }
}

void QuantScheme::parse_exclusions(const io::QuantizationConfig& q) {
  for (const char* key : {"modules_to_not_convert", "ignore", "exclude_modules"})
    if (q.raw.contains(key) && !q.raw[key].is_null()) {
      exclusion_field_ = key;
      break;
    }
  const std::string where = source_ + ": quantization_config." + exclusion_field_;
  for (const std::string& entry : q.modules_to_not_convert) {
    Pattern p{entry, std::nullopt};
    if (method_ == QuantMethod::CompressedTensors) {
      if (entry.rfind("re:", 0) == 0) p.regex = compile(entry.substr(3), where);  // re.match: anchored at start
    } else if (method_ == QuantMethod::ModelOpt) {
      if (entry.find_first_of("*?[") != std::string::npos) p.regex = compile(glob_to_regex(entry) + "$", where);
    } else if (looks_like_regex(entry)) {
      p.regex = compile(entry, where);
    }
    exclusions_.push_back(std::move(p));
  }
}

std::string QuantScheme::describe() const {
  if (method_ == QuantMethod::None) return "the checkpoint (no quantization_config)";
  return source_ + ": quantization_config (quant_method '" + std::string(quant_method_name(method_)) + "')";
}

const QuantScheme::Int4Override* QuantScheme::override_for(const ModuleNames& module) const {
  if (auto it = exact_overrides_.find(module.canonical); it != exact_overrides_.end()) return &it->second;
  for (const auto& [o, re] : regex_overrides_)
    if (std::regex_search(module.stored, re) || std::regex_search(module.canonical, re)) return &o;
  return nullptr;
}

std::optional<GptqInt4Params> QuantScheme::int4_params(const ModuleNames& module) const {
  if (method_ != QuantMethod::AutoRound && method_ != QuantMethod::Gptq) return std::nullopt;
  GptqInt4Params p = int4_;
  int bits = bits_;
  const Int4Override* o = override_for(module);
  if (o) {
    bits = o->bits.value_or(bits);
    p.group_size = o->group_size.value_or(p.group_size);
    p.sym = o->sym.value_or(p.sym);
  }
  if (bits != 4)
    fail("module {} is stored as INT4 (qweight) but {}{} gives it {} bits", module.canonical, describe(),
         o ? " extra_config '" + o->key + "'" : std::string(), bits);
  return p;
}

bool QuantScheme::matches_exclusion(const Pattern& p, const std::string& name) const {
  if (p.regex) {
    if (method_ == QuantMethod::ModelOpt) return std::regex_match(name, *p.regex);
    return std::regex_search(name, *p.regex, std::regex_constants::match_continuous);
  }
  if (method_ == QuantMethod::CompressedTensors) return name == p.text;
  // HF / vLLM module lists: the module itself, a suffix of its path, or a parent module.
  return is_dotted_suffix(name, p.text) || name.rfind(p.text + ".", 0) == 0;
}

std::optional<std::string> QuantScheme::excluded_by(const ModuleNames& module) const {
  if (method_ == QuantMethod::AutoRound)
    if (const Int4Override* o = override_for(module); o && o->bits && *o->bits >= 16)
      return "extra_config '" + o->key + "' (bits " + std::to_string(*o->bits) + ")";
  for (const Pattern& p : exclusions_)
    if (matches_exclusion(p, module.stored) || matches_exclusion(p, module.canonical))
      return exclusion_field_ + " '" + p.text + "'";
  return std::nullopt;
}

}  // namespace moeserve::quant
