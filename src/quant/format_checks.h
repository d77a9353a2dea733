// Validation shared by the weight formats: every failure names the tensor (PartLabels) and
// says what was expected and what was found.
#pragma once
#include <initializer_list>
#include <string>

#include "core/tensor.h"
#include "quant/part_labels.h"

namespace moeserve::quant {

// Throws unless `t` is defined and has one of `dtypes`.
void check_part_dtype(const Tensor& t, std::initializer_list<DType> dtypes, const PartLabels& labels,
                      const std::string& role);
// Throws unless `t` has exactly `shape`; `meaning` explains the expected shape
// ("[K/8, N] = [16, 64]: eight 4-bit codes along K per int32").
void check_part_shape(const Tensor& t, const Shape& shape, const PartLabels& labels, const std::string& role,
                      const std::string& meaning);
// Throws unless `t` holds exactly one element (shape [] or [1]).
void check_part_scalar(const Tensor& t, const PartLabels& labels, const std::string& role);

}  // namespace moeserve::quant
