#include "tools/convert_plan.h"

#include <map>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "quant/quantize_fp8_block.h"
#include "quant/quantize_gptq_int4.h"

namespace moeserve::tools {

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_float(DType t) { return t == DType::BF16 || t == DType::F16 || t == DType::F32; }

constexpr std::string_view kFusedGateUp = "mlp.experts.gate_up_proj";
constexpr std::string_view kFusedDown = "mlp.experts.down_proj";

// How a source tensor takes part in the plan.
enum class SourceKind { Other, Linear2d, FusedGateUp, FusedDown };

SourceKind source_kind(const SourceTensor& t) {
  if (t.canonical.empty() || !is_float(t.dtype())) return SourceKind::Other;
  const Shape& s = t.shape();
  if (ends_with(t.canonical, kFusedGateUp) && s.size() == 3 && s[1] % 2 == 0) return SourceKind::FusedGateUp;
  if (ends_with(t.canonical, kFusedDown) && s.size() == 3) return SourceKind::FusedDown;
  if (ends_with(t.canonical, ".weight") && s.size() == 2 && t.canonical != "embed_tokens.weight")
    return SourceKind::Linear2d;
  return SourceKind::Other;
}

// "layers.0.mlp.experts." for a fused experts tensor.
std::string fused_base(const SourceTensor& t) { return t.canonical.substr(0, t.canonical.rfind('.') + 1); }

// One Linear module as the planner sees it: where its [N, K] slab is.
struct LinearSlab {
  std::string module;  // canonical
  const SourceTensor* source;
  uint64_t offset;
  int64_t rows, cols;
};

// The Linear modules a source tensor holds (one, or 2E / E for fused experts).
std::vector<LinearSlab> linear_slabs(const SourceTensor& t, SourceKind kind) {
  std::vector<LinearSlab> out;
  const Shape& s = t.shape();
  const uint64_t esize = dtype_size(t.dtype());
  if (kind == SourceKind::Linear2d) {
    out.push_back({t.canonical.substr(0, t.canonical.size() - 7), &t, 0, s[0], s[1]});
  } else if (kind == SourceKind::FusedGateUp) {
    const int64_t E = s[0], I = s[1] / 2, H = s[2];
    for (int64_t e = 0; e < E; ++e) {
      const std::string p = fused_base(t) + std::to_string(e);
      out.push_back({p + ".gate_proj", &t, uint64_t(e * 2 * I * H) * esize, I, H});
      out.push_back({p + ".up_proj", &t, uint64_t((e * 2 + 1) * I * H) * esize, I, H});
    }
  } else if (kind == SourceKind::FusedDown) {
    const int64_t E = s[0], H = s[1], I = s[2];
    for (int64_t e = 0; e < E; ++e)
      out.push_back({fused_base(t) + std::to_string(e) + ".down_proj", &t, uint64_t(e * H * I) * esize, H, I});
  }
  return out;
}

bool in_default_set(LinearRole role) {
  return role == LinearRole::RoutedExpert || role == LinearRole::AttentionProj || role == LinearRole::DeltaNetProj ||
         role == LinearRole::SharedExpert;
}

// The format each module is written in.
class Selector {
 public:
  explicit Selector(const PlanOptions& o) : options_(o) {
    const bool single = o.mode == WeightsMode::GptqInt4 || o.mode == WeightsMode::Fp8Block;
    if (o.modules_regex && !single)
      fail("--modules applies to --weights gptq-int4 and fp8-block, not {}", weights_mode_name(o.mode));
    if (o.modules_regex) {
      try {
        regex_.emplace(*o.modules_regex, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        fail("--modules '{}' is not a valid regular expression: {}", *o.modules_regex, e.what());
      }
    }
    if (o.mode == WeightsMode::GptqInt4 || o.mode == WeightsMode::HybridInt4Fp8)
      MOESERVE_CHECK(o.group_size > 0, "--group-size must be positive, got {}", o.group_size);
  }

  QuantFormat format(const std::string& module) {
    const QuantFormat single = options_.mode == WeightsMode::GptqInt4 ? QuantFormat::GptqInt4 : QuantFormat::Fp8Block;
    switch (options_.mode) {
      case WeightsMode::Keep: return QuantFormat::Dense;
      case WeightsMode::GptqInt4:
      case WeightsMode::Fp8Block:
        if (regex_) {
          if (!std::regex_search(module, *regex_)) return QuantFormat::Dense;
          ++matched_;
          return single;
        }
        return in_default_set(linear_role(module)) ? single : QuantFormat::Dense;
      case WeightsMode::HybridInt4Fp8: {
        const LinearRole role = linear_role(module);
        if (role == LinearRole::RoutedExpert) return QuantFormat::GptqInt4;
        return in_default_set(role) ? QuantFormat::Fp8Block : QuantFormat::Dense;
      }
    }
    return QuantFormat::Dense;
  }

  int64_t matched() const { return matched_; }
  bool has_regex() const { return regex_.has_value(); }

 private:
  const PlanOptions& options_;
  std::optional<std::regex> regex_;
  int64_t matched_ = 0;
};

PlanItem linear_item(const LinearSlab& slab, QuantFormat format, int64_t group_size, const std::string& stored_module,
                     ConvertPlan& plan) {
  PlanItem item;
  item.source = slab.source;
  item.source_offset = slab.offset;
  item.source_bytes = uint64_t(slab.rows * slab.cols) * dtype_size(slab.source->dtype());
  item.rows = slab.rows;
  item.cols = slab.cols;
  item.module = slab.module;
  const int64_t N = slab.rows, K = slab.cols;
  switch (format) {
    case QuantFormat::Dense:
      item.action = PlanItem::Action::Copy;
      item.outputs.push_back({stored_module + ".weight", slab.source->dtype(), {N, K}});
      plan.dense_modules.push_back(stored_module);
      break;
    case QuantFormat::GptqInt4:
      quant::check_gptq_int4_shape(slab.module, N, K, group_size);
      item.action = PlanItem::Action::GptqInt4;
      item.outputs.push_back({stored_module + ".qweight", DType::I32, {K / 8, N}});
      item.outputs.push_back({stored_module + ".qzeros", DType::I32, {K / group_size, N / 8}});
      item.outputs.push_back({stored_module + ".scales", DType::F16, {K / group_size, N}});
      plan.int4_modules.push_back(stored_module);
      break;
    case QuantFormat::Fp8Block:
      item.action = PlanItem::Action::Fp8Block;
      item.outputs.push_back({stored_module + ".weight", DType::F8_E4M3, {N, K}});
      item.outputs.push_back(
          {stored_module + ".weight_scale_inv", DType::F32, {quant::fp8_block_count(N), quant::fp8_block_count(K)}});
      plan.fp8_modules.push_back(stored_module);
      break;
  }
  return item;
}

PlanItem copy_item(const SourceTensor& t) {
  PlanItem item;
  item.action = PlanItem::Action::Copy;
  item.source = &t;
  item.source_bytes = t.nbytes();
  item.outputs.push_back({t.name, t.dtype(), t.shape()});
  return item;
}

}  // namespace

std::string_view weights_mode_name(WeightsMode mode) {
  switch (mode) {
    case WeightsMode::Keep: return "keep";
    case WeightsMode::GptqInt4: return "gptq-int4";
    case WeightsMode::Fp8Block: return "fp8-block";
    case WeightsMode::HybridInt4Fp8: return "hybrid-int4-fp8";
  }
  return "?";
}

WeightsMode parse_weights_mode(const std::string& text) {
  for (WeightsMode m : {WeightsMode::Keep, WeightsMode::GptqInt4, WeightsMode::Fp8Block, WeightsMode::HybridInt4Fp8})
    if (text == weights_mode_name(m)) return m;
  fail("unknown --weights '{}' (expected keep, gptq-int4, fp8-block or hybrid-int4-fp8)", text);
}

LinearRole linear_role(const std::string& m) {
  if (m == "lm_head") return LinearRole::LmHead;
  if (m == "mtp.fc") return LinearRole::MtpFc;
  if (m.find(".mlp.experts.") != std::string::npos) return LinearRole::RoutedExpert;
  for (const char* s : {".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.o_proj"})
    if (ends_with(m, s)) return LinearRole::AttentionProj;
  for (const char* s : {".linear_attn.in_proj_qkv", ".linear_attn.in_proj_z", ".linear_attn.out_proj"})
    if (ends_with(m, s)) return LinearRole::DeltaNetProj;
  if (ends_with(m, ".linear_attn.in_proj_a") || ends_with(m, ".linear_attn.in_proj_b")) return LinearRole::DeltaNetGate;
  for (const char* s : {".mlp.shared_expert.gate_proj", ".mlp.shared_expert.up_proj", ".mlp.shared_expert.down_proj"})
    if (ends_with(m, s)) return LinearRole::SharedExpert;
  if (ends_with(m, ".mlp.shared_expert_gate")) return LinearRole::SharedExpertGate;
  if (ends_with(m, ".mlp.gate")) return LinearRole::Router;
  return LinearRole::Other;
}

ConvertPlan plan_conversion(const std::vector<SourceTensor>& tensors, const PlanOptions& options) {
  Selector select(options);

  // Pass 1: the format of every Linear module, and which fused expert tensors must be split
  // (all of a layer's experts go per-expert as soon as one of them is quantised, since the
  // loader reads either both fused tensors or per-expert modules).
  std::map<std::string, QuantFormat> formats;
  std::set<std::string> split_bases;
  for (const SourceTensor& t : tensors) {
    const SourceKind kind = source_kind(t);
    for (const LinearSlab& slab : linear_slabs(t, kind)) {
      const QuantFormat f = select.format(slab.module);
      formats[slab.module] = f;
      if (f != QuantFormat::Dense && kind != SourceKind::Linear2d) split_bases.insert(fused_base(t));
    }
  }
  if (select.has_regex() && select.matched() == 0)
    fail("--modules '{}' matches no Linear module of the checkpoint (modules are matched by canonical name, e.g. "
         "'layers.0.mlp.experts.0.gate_proj', 'layers.3.self_attn.q_proj', 'mtp.fc', 'lm_head')",
         *options.modules_regex);

  // Pass 2: the items, in source order.
  ConvertPlan plan;
  for (const SourceTensor& t : tensors) {
    const SourceKind kind = source_kind(t);
    const bool fused = kind == SourceKind::FusedGateUp || kind == SourceKind::FusedDown;
    if (kind == SourceKind::Other || (fused && !split_bases.count(fused_base(t)))) {
      plan.items.push_back(copy_item(t));
      continue;
    }
    if (fused) ++plan.fused_tensors_split;
    const std::string prefix = t.prefix();
    for (const LinearSlab& slab : linear_slabs(t, kind))
      plan.items.push_back(linear_item(slab, formats.at(slab.module), options.group_size, prefix + slab.module, plan));
  }

  std::set<std::string> names;
  for (const PlanItem& item : plan.items) {
    plan.source_bytes += item.source_bytes;
    for (const OutputTensor& o : item.outputs) {
      if (!names.insert(o.name).second)
        fail("the converted checkpoint would hold the tensor '{}' twice (from {}: {}); does the source store "
             "experts both fused and per expert?",
             o.name, item.source->origin, item.source->name);
      plan.output_bytes += o.nbytes();
    }
  }
  return plan;
}

}  // namespace moeserve::tools
