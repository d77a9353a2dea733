// Tensor: a typed, shaped, row-major view of bytes, with an optional owner that keeps the
// bytes alive (an mmap of a checkpoint shard, or a heap buffer). Views are cheap to copy;
// slicing along the first dimension is pointer arithmetic, which is how fused expert
// tensors [E, ...] become per-expert weights without copying.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace moeserve {

using Shape = std::vector<int64_t>;

std::string shape_to_string(const Shape& shape);
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape, std::byte* data, std::shared_ptr<void> owner)
      : dtype_(dtype), shape_(std::move(shape)), data_(data), owner_(std::move(owner)) {}

  // A new zero-filled heap tensor.
  static Tensor empty(DType dtype, Shape shape);
  // A new fp32 heap tensor holding a copy of `values` with the given shape.
  static Tensor from_f32(const std::vector<float>& values, Shape shape);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t ndim() const { return shape_.size(); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr; }

  std::byte* bytes() const { return data_; }
  template <typename T>
  T* data() const { return reinterpret_cast<T*>(data_); }

  // Rows [begin, end) of dimension 0, as a view.
  Tensor slice0(int64_t begin, int64_t end) const;
  // Index i of dimension 0, dropping that dimension, as a view.
  Tensor index0(int64_t i) const;
  // Same bytes, another shape with the same element count.
  Tensor reshaped(Shape shape) const;

  // Copies the elements to fp32 (any dtype).
  std::vector<float> to_f32() const;

 private:
  DType dtype_ = DType::F32;
  Shape shape_;
  std::byte* data_ = nullptr;
  std::shared_ptr<void> owner_;
};

}  // namespace moeserve
