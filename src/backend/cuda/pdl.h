// The process-wide switch for programmatic dependent launch (kernels and launches: pdl.cuh).
#pragma once

namespace moeserve::cuda {

// CudaModelOptions::pdl: off gives plain stream-ordered launches, for A/B measurements and as a
// fallback. On by default.
void set_pdl_enabled(bool on);
bool pdl_enabled();

}  // namespace moeserve::cuda
