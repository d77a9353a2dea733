#include "core/tensor.h"

#include <cstring>

#include "core/error.h"

namespace moeserve {

std::string shape_to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::empty(DType dtype, Shape shape) {
  const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  auto buffer = std::shared_ptr<std::byte[]>(new std::byte[bytes > 0 ? bytes : 1]());
  std::byte* p = buffer.get();
  return Tensor(dtype, std::move(shape), p, std::shared_ptr<void>(buffer, p));
}

Tensor Tensor::from_f32(const std::vector<float>& values, Shape shape) {
  MOESERVE_CHECK(shape_numel(shape) == int64_t(values.size()),
                 "Tensor::from_f32: {} values do not fill shape {}", values.size(),
                 shape_to_string(shape));
  Tensor t = empty(DType::F32, std::move(shape));
  std::memcpy(t.data_, values.data(), values.size() * sizeof(float));
  return t;
}

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  MOESERVE_CHECK(!shape_.empty() && 0 <= begin && begin <= end && end <= shape_[0],
                 "slice [{}, {}) out of range for shape {}", begin, end, shape_to_string(shape_));
  Shape s = shape_;
  const size_t row_bytes = size_t(shape_numel(Shape(shape_.begin() + 1, shape_.end()))) * dtype_size(dtype_);
  s[0] = end - begin;
  return Tensor(dtype_, std::move(s), data_ + size_t(begin) * row_bytes, owner_);
}

Tensor Tensor::index0(int64_t i) const {
  Tensor row = slice0(i, i + 1);
  Shape s(shape_.begin() + 1, shape_.end());
  return Tensor(dtype_, std::move(s), row.data_, owner_);
}

Tensor Tensor::reshaped(Shape shape) const {
  MOESERVE_CHECK(shape_numel(shape) == numel(), "cannot reshape {} to {}", shape_to_string(shape_),
                 shape_to_string(shape));
  return Tensor(dtype_, std::move(shape), data_, owner_);
}

std::vector<float> Tensor::to_f32() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  convert_to_f32(dtype_, data_, out.data(), out.size());
  return out;
}

}  // namespace moeserve
