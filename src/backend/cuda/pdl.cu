// The process-wide PDL switch (pdl.h).
#include <atomic>

#include "backend/cuda/pdl.h"

namespace moeserve::cuda {
namespace {
std::atomic<bool> g_pdl_enabled{true};
}  // namespace

void set_pdl_enabled(bool on) { g_pdl_enabled.store(on, std::memory_order_relaxed); }
bool pdl_enabled() { return g_pdl_enabled.load(std::memory_order_relaxed); }

}  // namespace moeserve::cuda
