// mma.sync probe for test_mma_swap_symmetry.cpp (mma_swap_probe.cu): trials of D = A·B + C with
// m16n8k16, one warp each. Device pointers: A [trials][16][16] and B [trials][8][16] (column j's 16
// k values contiguous) as raw bf16 / f16 bits, C and D [trials][16][8] f32 row-major.
#pragma once
#include <cstdint>

namespace moeserve::gputest {
void mma_probe_run(bool f16, int trials, const uint16_t* a, const uint16_t* b, const float* c, float* d);
}
