// The workspace layout of the integer-form dp4a expert kernels (ops_moe_int_decode.cu), plain C++
// so that the GPU tests can read the act rows and their quantisation back
// (tests/gpu/test_ops_moe_int_decode.cpp).
//   ids     [M·k] int32        the token's expert ids by slot (slot = m·k + rank), written by gate/up
//   weights [M·k] f32          the renormalised routing weights by slot
//   act     [M·k, I] f32       silu(gate·x)·(up·x) of every slot, written by gate/up
//   planes  [M·k, I/8] 16 B    the act rows quantised (moe_int_arith.h step 1), per packed row (8 k)
//                              {hi of k 0,2,4,6 | hi of k 1,3,5,7 | lo of k 0,2,4,6 | lo of k 1,3,5,7}
//                              (X = 256·hi + lo, hi = X >> 8 signed byte, lo = X & 0xFF), written by
//                              gate/up (the last CTA to finish a 128-column block), read by down
//   sblk    [M·k, nbs] f32     the block scales s_b of each act row (b < ceil(I/128); nbs pads to 4)
//   sx      [M·k, sxs] int32   ΣX per 32 k of each act row (I/32 of them; sxs pads to 4)
// Each region starts at a multiple of 256 bytes from the workspace start; the layout depends on
// the call's M (the workspace passed holds at least int_decode_workspace_bytes(shape, M)).
#pragma once
#include <cstddef>

#include "backend/cuda/ops_moe.h"

namespace moeserve::cuda::moe_int_detail {

struct IntDecodeLayout {
  size_t ids = 0, weights = 0, act = 0, planes = 0, sblk = 0, sx = 0;  // byte offsets
  size_t bytes = 0;                                                    // the whole workspace
  int nbs = 0, sxs = 0;  // row strides (elements) of sblk and sx
};

inline size_t int_decode_align256(size_t b) { return (b + 255) / 256 * 256; }

inline IntDecodeLayout int_decode_layout(const MoeShape& s, int M) {
  const size_t slots = size_t(M > 0 ? M : 0) * size_t(s.top_k > 0 ? s.top_k : 0);
  const size_t I = size_t(s.intermediate > 0 ? s.intermediate : 0);
  IntDecodeLayout L;
  L.nbs = int((I + 127) / 128 + 3) / 4 * 4;
  L.sxs = int(I / 32 + 3) / 4 * 4;
  L.ids = 0;
  L.weights = L.ids + int_decode_align256(slots * 4);
  L.act = L.weights + int_decode_align256(slots * 4);
  L.planes = L.act + int_decode_align256(slots * I * 4);
  L.sblk = L.planes + int_decode_align256(slots * (I / 8) * 16);
  L.sx = L.sblk + int_decode_align256(slots * size_t(L.nbs) * 4);
  L.bytes = L.sx + int_decode_align256(slots * size_t(L.sxs) * 4);
  return L;
}

}  // namespace moeserve::cuda::moe_int_detail
