#include "backend/cuda/device_linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "quant/int8_rowwise.h"

namespace moeserve::cuda {

namespace {

// Converts rows of a QuantWeight to bf16 on the host in bounded chunks and uploads them.
void upload_rows_as_bf16(const quant::QuantWeight& w, DeviceBuffer<bf16>& out, cudaStream_t stream) {
  out.resize(size_t(w.out_features) * size_t(w.in_features));
  const int64_t rows_per_chunk = std::max<int64_t>(1, (int64_t(4) << 20) / std::max<int64_t>(1, w.in_features));
  std::vector<float> f32;
  std::vector<uint16_t> b16;
  for (int64_t r0 = 0; r0 < w.out_features; r0 += rows_per_chunk) {
    const int64_t r1 = std::min(w.out_features, r0 + rows_per_chunk);
    const size_t n = size_t(r1 - r0) * size_t(w.in_features);
    f32.resize(n);
    b16.resize(n);
    w.dequantize_rows(r0, r1, f32.data());
    for (size_t i = 0; i < n; ++i) b16[i] = f32_to_bf16(f32[i]);
    out.upload(reinterpret_cast<const bf16*>(b16.data()), n, stream, size_t(r0) * size_t(w.in_features));
    MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream));  // b16 is reused by the next chunk
  }
}

template <typename T>
void upload_tensor(const Tensor& t, DeviceBuffer<T>& out, cudaStream_t stream) {
  if (t.nbytes() % sizeof(T) != 0) throw Error("upload: tensor byte size is not a multiple of the element size");
  out.resize(t.nbytes() / sizeof(T));
  out.upload(reinterpret_cast<const T*>(t.bytes()), out.size(), stream);
}

void upload_as_f32(const Tensor& t, DeviceBuffer<float>& out, cudaStream_t stream) {
  std::vector<float> v = t.to_f32();
  out.resize(v.size());
  out.upload(v.data(), v.size(), stream);
  MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace

DeviceLinear upload_linear(const quant::QuantWeight& w, cudaStream_t stream) {
  DeviceLinear d;
  d.format = w.format;
  d.N = w.out_features;
  d.K = w.in_features;
  d.group_size = w.group_size;
  d.sym = w.sym;
  switch (w.format) {
    case quant::WeightFormat::Dense: {
      const Tensor& t = w.part("weight");
      if (t.dtype() == DType::BF16) {
        upload_tensor(t, d.dense, stream);
        MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream));
      } else {
        upload_rows_as_bf16(w, d.dense, stream);
      }
      break;
    }
    case quant::WeightFormat::Nvfp4:
      upload_rows_as_bf16(w, d.dense, stream);  // no FP4 MMA on Hopper: dequantise at load
      break;
    case quant::WeightFormat::GptqInt4: {
      upload_tensor(w.part("qweight"), d.qweight, stream);
      upload_tensor(w.part("scales"), d.scales, stream);
      if (w.parts.count("qzeros")) upload_tensor(w.part("qzeros"), d.qzeros, stream);
      if (w.parts.count("g_idx")) upload_tensor(w.part("g_idx"), d.g_idx, stream);
      if (!d.sym && d.qzeros.size() == 0) throw Error("weight '" + w.name + "': asymmetric GPTQ without qzeros");
      MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream));
      break;
    }
    case quant::WeightFormat::Fp8Block: {
      upload_tensor(w.part("weight"), d.fp8, stream);
      upload_as_f32(w.part("weight_scale_inv"), d.scale, stream);
      break;
    }
    case quant::WeightFormat::Int8Rowwise: {
      upload_tensor(w.part("weight"), d.int8, stream);
      upload_as_f32(w.part("row_scales"), d.scale, stream);
      break;
    }
  }
  return d;
}

DeviceLinear upload_linear_int8_rowwise(const quant::QuantWeight& w, cudaStream_t stream) {
  // The same quantisation as the CPU model's --int8-lm-head (quant/int8_rowwise.h), so both
  // backends hold identical INT8 heads.
  return upload_linear(quant::quantize_int8_rowwise(w), stream);
}

}  // namespace moeserve::cuda
