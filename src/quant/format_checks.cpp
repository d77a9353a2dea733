#include "quant/format_checks.h"

#include "core/error.h"

namespace moeserve::quant {

void check_part_dtype(const Tensor& t, std::initializer_list<DType> dtypes, const PartLabels& labels,
                      const std::string& role) {
  MOESERVE_CHECK(t.defined(), "{}: missing", labels.of(role));
  std::string expected;
  for (DType d : dtypes) {
    if (t.dtype() == d) return;
    expected += (expected.empty() ? "" : " or ") + std::string(dtype_name(d));
  }
  fail("{}: dtype {}, expected {}", labels.of(role), dtype_name(t.dtype()), expected);
}

void check_part_shape(const Tensor& t, const Shape& shape, const PartLabels& labels, const std::string& role,
                      const std::string& meaning) {
  MOESERVE_CHECK(t.defined(), "{}: missing", labels.of(role));
  if (t.shape() != shape)
    fail("{}: shape {}, expected {} ({})", labels.of(role), shape_to_string(t.shape()), shape_to_string(shape),
         meaning);
}

void check_part_scalar(const Tensor& t, const PartLabels& labels, const std::string& role) {
  MOESERVE_CHECK(t.defined(), "{}: missing", labels.of(role));
  if (t.numel() != 1 || t.ndim() > 1)
    fail("{}: shape {}, expected a single value (shape [] or [1])", labels.of(role), shape_to_string(t.shape()));
}

}  // namespace moeserve::quant
