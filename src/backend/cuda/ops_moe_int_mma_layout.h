// The workspace layout of the integer-form tensor-core expert kernels (ops_moe_int_mma.cu), in plain
// C++ so that the GPU tests can read a call's intermediate buffers back (act, y, ids). Byte offsets
// from the workspace start, every region 256-byte aligned, for a call of `tokens` tokens (a call
// carves the workspace for its own M, as moe_routed_experts_mma does).
//   ids [M·k] i32, weights [M·k] f32, order [M·k] i32: route_and_group's slots (slot = token·k + rank)
//   num_tiles [2] i32, tile_expert / tile_start / tile_count [tiles] i32: the tile lists
//   x_hi [M][H] s8, x_lo [M][H] u8: X = 256·hi + lo (moe_int_arith.h step 1), k permuted inside each
//     32-k block (logical byte 16·h + 4·t + i holds physical k 8·t + 2·i + h)
//   x_sb [M][ceil(H/128)] f32: the block scales s_b;  x_sum [M][H/32] int2: (Σ hi, Σ lo) per unit
//   act [M·k][I] f32 by slot: silu(g)·u;  a_hi, a_lo, a_sb, a_sum: act quantised as x
//   y [M·k][H] f32 by slot: the down projection, before the combine
#pragma once
#include <cstddef>

#include "backend/cuda/ops_moe.h"

namespace moeserve::cuda::moe_int_detail {

struct IntMmaLayout {
  size_t ids, weights, order, num_tiles, tile_expert, tile_start, tile_count;
  size_t x_hi, x_lo, x_sb, x_sum;
  size_t act, a_hi, a_lo, a_sb, a_sum;
  size_t y;
  size_t tiles;  // capacity of the tile arrays
  size_t total;  // bytes
};

inline IntMmaLayout int_mma_layout(const MoeShape& s, int tokens) {
  const size_t M = size_t(tokens), slots = M * size_t(s.top_k), H = size_t(s.hidden), I = size_t(s.intermediate);
  const size_t E = size_t(s.num_experts);
  IntMmaLayout l{};
  // Tiles of >= 16 slots: every expert adds at most one partial tile (moe_detail::max_tiles with tile 16;
  // the mixed 32 / 64-slot lists fit in it too, see ops_moe_int_mma.cu).
  l.tiles = (slots + 15) / 16 + (slots < E ? slots : E);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t r = off;
    off += (bytes + 255) / 256 * 256;
    return r;
  };
  l.ids = take(slots * 4);
  l.weights = take(slots * 4);
  l.order = take(slots * 4);
  l.num_tiles = take(8);
  l.tile_expert = take(l.tiles * 4);
  l.tile_start = take(l.tiles * 4);
  l.tile_count = take(l.tiles * 4);
  l.x_hi = take(M * H);
  l.x_lo = take(M * H);
  l.x_sb = take(M * ((H + 127) / 128) * 4);  // a short last block has its scale too
  l.x_sum = take(M * (H / 32) * 8);
  l.act = take(slots * I * 4);
  l.a_hi = take(slots * I);
  l.a_lo = take(slots * I);
  l.a_sb = take(slots * ((I + 127) / 128) * 4);
  l.a_sum = take(slots * (I / 32) * 8);
  l.y = take(slots * H * 4);
  l.total = off;
  return l;
}

}  // namespace moeserve::cuda::moe_int_detail
