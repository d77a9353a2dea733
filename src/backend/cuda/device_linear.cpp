#include "backend/cuda/device_linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"

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
  DeviceLinear d;
  d.format = quant::WeightFormat::Int8Rowwise;
  d.N = w.out_features;
  d.K = w.in_features;
  d.int8.resize(size_t(d.N) * size_t(d.K));
  d.scale.resize(size_t(d.N));
  std::vector<float> scales(size_t(d.N));
  const int64_t rows_per_chunk = std::max<int64_t>(1, (int64_t(4) << 20) / std::max<int64_t>(1, d.K));
  std::vector<float> rows;
  std::vector<int8_t> q;
  for (int64_t r0 = 0; r0 < d.N; r0 += rows_per_chunk) {
    const int64_t r1 = std::min(d.N, r0 + rows_per_chunk);
    rows.resize(size_t(r1 - r0) * size_t(d.K));
    q.resize(rows.size());
    w.dequantize_rows(r0, r1, rows.data());
    for (int64_t n = r0; n < r1; ++n) {
      const float* row = rows.data() + size_t(n - r0) * size_t(d.K);
      int8_t* qrow = q.data() + size_t(n - r0) * size_t(d.K);
      float amax = 0.0f;
      for (int64_t k = 0; k < d.K; ++k) amax = std::max(amax, std::fabs(row[k]));
      const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
      for (int64_t k = 0; k < d.K; ++k) qrow[k] = int8_t(std::lrint(std::clamp(row[k] / s, -127.0f, 127.0f)));
      scales[size_t(n)] = s;
    }
    d.int8.upload(q.data(), q.size(), stream, size_t(r0) * size_t(d.K));
    MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream));  // q is reused by the next chunk
  }
  d.scale.upload(scales.data(), scales.size(), stream);
  MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d;
}

}  // namespace moeserve::cuda
