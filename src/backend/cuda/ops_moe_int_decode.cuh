// The workspace layout of the integer-form dp4a expert kernels (ops_moe_int_decode.cu), plain C++
// so that the GPU tests can read the act rows back (tests/gpu/test_ops_moe_int_decode.cpp).
//   ids     [M·k] int32  the token's expert ids by slot (slot = m·k + rank), written by gate/up
//   weights [M·k] f32    the renormalised routing weights by slot
//   act     [M·k, I] f32 silu(gate·x)·(up·x) of every slot, written by gate/up, read by down
// Each region starts at a multiple of 256 bytes from the workspace start; the layout depends on
// the call's M (the workspace passed holds at least int_decode_workspace_bytes(shape, M)).
#pragma once
#include <cstddef>

#include "backend/cuda/ops_moe.h"

namespace moeserve::cuda::moe_int_detail {

struct IntDecodeLayout {
  size_t ids = 0, weights = 0, act = 0;  // byte offsets
  size_t bytes = 0;                      // the whole workspace
};

inline size_t int_decode_align256(size_t b) { return (b + 255) / 256 * 256; }

inline IntDecodeLayout int_decode_layout(const MoeShape& s, int M) {
  const size_t slots = size_t(M > 0 ? M : 0) * size_t(s.top_k > 0 ? s.top_k : 0);
  IntDecodeLayout L;
  L.ids = 0;
  L.weights = L.ids + int_decode_align256(slots * 4);
  L.act = L.weights + int_decode_align256(slots * 4);
  L.bytes = L.act + int_decode_align256(slots * size_t(s.intermediate > 0 ? s.intermediate : 0) * 4);
  return L;
}

}  // namespace moeserve::cuda::moe_int_detail
