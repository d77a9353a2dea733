// upload_experts (ops_moe.h): stacks E per-expert host weights into one buffer per
// projection, each expert in the single-Linear device layout.
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_moe.h"
#include "core/error.h"

namespace moeserve::cuda {

namespace {

// Appends a tensor's raw bytes to a host staging vector.
void append_bytes(std::vector<uint8_t>& dst, const Tensor& t) {
  const size_t off = dst.size();
  dst.resize(off + t.nbytes());
  std::memcpy(dst.data() + off, t.bytes(), t.nbytes());
}

template <typename T>
void upload_staged(const std::vector<uint8_t>& bytes, DeviceBuffer<T>& out, cudaStream_t stream) {
  out.resize(bytes.size() / sizeof(T));
  out.upload(reinterpret_cast<const T*>(bytes.data()), out.size(), stream);
  MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

DeviceLinear stack(const std::vector<const quant::QuantWeight*>& ws, quant::WeightFormat fmt, cudaStream_t stream) {
  const auto& w0 = *ws.at(0);
  DeviceLinear d;
  d.format = fmt == quant::WeightFormat::Nvfp4 ? quant::WeightFormat::Dense : fmt;
  d.N = w0.out_features;
  d.K = w0.in_features;
  d.group_size = w0.group_size;
  d.sym = w0.sym;
  for (const auto* w : ws) {
    MOESERVE_CHECK(w->format == fmt && w->out_features == d.N && w->in_features == d.K,
                   "experts of one layer must share format and shape: '{}' differs from '{}'", w->name, w0.name);
    MOESERVE_CHECK(w->group_size == w0.group_size && w->sym == w0.sym,
                   "experts of one layer must share the quantisation group size: '{}'", w->name);
  }
  std::vector<uint8_t> a, b, c;
  switch (fmt) {
    case quant::WeightFormat::Dense:
    case quant::WeightFormat::Nvfp4: {
      std::vector<float> rows(size_t(d.N) * size_t(d.K));
      a.resize(size_t(ws.size()) * rows.size() * 2);
      uint16_t* out = reinterpret_cast<uint16_t*>(a.data());
      for (size_t e = 0; e < ws.size(); ++e) {
        ws[e]->dequantize_rows(0, d.N, rows.data());
        for (size_t i = 0; i < rows.size(); ++i) out[e * rows.size() + i] = f32_to_bf16(rows[i]);
      }
      upload_staged(a, d.dense, stream);
      break;
    }
    case quant::WeightFormat::GptqInt4: {
      // Act-order (g_idx) is all or nothing within a layer: the kernels take one [E][K] table.
      const bool act_order = w0.parts.count("g_idx") > 0;
      std::vector<uint8_t> gi;
      for (const auto* w : ws) {
        MOESERVE_CHECK((w->parts.count("g_idx") > 0) == act_order,
                       "experts of one layer must all have act-order g_idx or none: '{}' differs from '{}'", w->name,
                       w0.name);
        append_bytes(a, w->part("qweight"));
        append_bytes(b, w->part("scales"));
        if (w->parts.count("qzeros")) append_bytes(c, w->part("qzeros"));
        if (act_order) append_bytes(gi, w->part("g_idx"));
      }
      upload_staged(a, d.qweight, stream);
      upload_staged(b, d.scales, stream);
      if (!c.empty()) upload_staged(c, d.qzeros, stream);
      if (act_order) upload_staged(gi, d.g_idx, stream);
      break;
    }
    case quant::WeightFormat::Fp8Block: {
      std::vector<float> scales;
      for (const auto* w : ws) {
        append_bytes(a, w->part("weight"));
        const std::vector<float> s = w->part("weight_scale_inv").to_f32();
        scales.insert(scales.end(), s.begin(), s.end());
      }
      upload_staged(a, d.fp8, stream);
      d.scale.resize(scales.size());
      d.scale.upload(scales.data(), scales.size(), stream);
      MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream));
      break;
    }
    default:
      fail("expert '{}': format {} is not supported for routed experts", w0.name, quant::format_name(fmt));
  }
  return d;
}

}  // namespace

DeviceExperts upload_experts(const std::vector<const quant::QuantWeight*>& gate,
                             const std::vector<const quant::QuantWeight*>& up,
                             const std::vector<const quant::QuantWeight*>& down, cudaStream_t stream) {
  MOESERVE_CHECK(!gate.empty() && gate.size() == up.size() && gate.size() == down.size(),
                 "upload_experts: gate/up/down lists differ in length");
  const quant::WeightFormat fmt = gate[0]->format;
  DeviceExperts d;
  d.num_experts = int(gate.size());
  d.hidden = int(gate[0]->in_features);
  d.intermediate = int(gate[0]->out_features);
  d.gate = stack(gate, fmt, stream);
  d.up = stack(up, fmt, stream);
  d.down = stack(down, down[0]->format, stream);
  d.format = d.gate.format;
  MOESERVE_CHECK(d.down.format == d.gate.format, "experts: down projection format differs from gate/up");
  d.group_size = int(d.gate.group_size);
  d.sym = d.gate.sym;
  return d;
}

}  // namespace moeserve::cuda
