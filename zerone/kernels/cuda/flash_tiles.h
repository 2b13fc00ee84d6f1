// The tiling of the CUDA backend's flash attention (attention.cu): tile sizes, which tiles a tile
// meets under the causal mask, the mask itself, and the online-softmax step. Plain C++ (no CUDA
// headers), so that a host test can run the same loop structure without a GPU
// (tests/kernels/flash_tiles_test.cc); under nvcc every function is also a device function.
//
// Note [Flash attention tiles]: a block is kWarps warps of kLanes threads. Two kinds of tile:
//  - the lane tile: kLanes rows, one per lane (the keys of forward and dQ, the queries of dK/dV);
//  - the warp tile: kWarps * rows_per_warp(chunks) rows, rows_per_warp of them per warp (the
//    queries of forward and dQ, the keys of dK/dV), each warp walking its rows one at a time.
// A lane owns the head channels d = lane + kLanes * c for c < chunks (chunks_for(hs) of them, so
// any head size up to kMaxHeadSize, odd ones included: channels d >= hs are skipped), and keeps
// the accumulators of its warp's rows for those channels in registers. Shared-memory rows are
// smem_stride(hs) floats apart, an odd number, so that 32 lanes reading 32 different rows at one
// channel hit 32 different banks.
// The causal mask: query t sees keys t2 <= t. Rows past T (the last tile's tail) are zero-filled
// in shared memory and never written; scores a row does not see are -inf before the softmax and
// exactly 0 after it.
// Thread-safety: pure functions.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define ZERONE_FLASH_FN __host__ __device__ inline
#else
#define ZERONE_FLASH_FN inline
#endif

namespace zerone::cuda::flash {

constexpr int kWarps = 4;
constexpr int kLanes = 32;
constexpr int kThreadsPerBlock = kWarps * kLanes;
// The largest head size the flash kernels take (chunks_for's largest case).
constexpr int kMaxHeadSize = 256;

// Channel chunks of kLanes a lane owns for head size hs (1 <= hs <= kMaxHeadSize): 1, 2, 4 or 8.
ZERONE_FLASH_FN constexpr int chunks_for(int hs) { return hs <= 32 ? 1 : hs <= 64 ? 2 : hs <= 128 ? 4 : 8; }
// Rows each warp walks in a warp tile: fewer with the largest heads, so that the register
// accumulators (rows * chunks floats, twice in dK/dV) stay at 64 floats.
ZERONE_FLASH_FN constexpr int rows_per_warp(int chunks) { return chunks <= 4 ? 8 : 4; }
ZERONE_FLASH_FN constexpr int warp_tile_rows(int chunks) { return kWarps * rows_per_warp(chunks); }
// Floats between consecutive rows of a tile in shared memory: odd (see the Note).
ZERONE_FLASH_FN constexpr int smem_stride(int hs) { return hs | 1; }

// Shared-memory bytes of each kernel (attention.cu lays them out in this order).
// forward: Q (warp tile), K and V (lane tile).
ZERONE_FLASH_FN constexpr int forward_smem_floats(int hs) {
  return (warp_tile_rows(chunks_for(hs)) + 2 * kLanes) * smem_stride(hs);
}
// dQ: Q and dO (warp tile), K and V (lane tile).
ZERONE_FLASH_FN constexpr int dq_smem_floats(int hs) {
  return (2 * warp_tile_rows(chunks_for(hs)) + 2 * kLanes) * smem_stride(hs);
}
// dK/dV: K and V (warp tile), Q and dO (lane tile), then the lane tile's logsumexp and D.
ZERONE_FLASH_FN constexpr int dkv_smem_floats(int hs) {
  return (2 * warp_tile_rows(chunks_for(hs)) + 2 * kLanes) * smem_stride(hs) + 2 * kLanes;
}

ZERONE_FLASH_FN constexpr int tiles_of(int n, int tile) { return (n + tile - 1) / tile; }

// Forward and dQ: the query tile starting at q0 (rows rows) meets the key tiles (of `tile` keys;
// the lane tiles of the CUDA-core form by default) of keys 0 .. min(q0 + rows, T) - 1: this many
// of them, from key tile 0.
ZERONE_FLASH_FN constexpr int key_tiles_seen(int q0, int rows, int T, int tile = kLanes) {
  return tiles_of(q0 + rows < T ? q0 + rows : T, tile);
}
// dK/dV: the key tile starting at k0 is seen by the query lane tiles from this one to the last
// (tiles_of(T, kLanes) - 1): queries before k0 see none of its keys.
ZERONE_FLASH_FN constexpr int first_query_tile_seeing(int k0) { return k0 / kLanes; }

// Whether query row `query` sees key `key` (causal, and the query a real row).
ZERONE_FLASH_FN constexpr bool sees(int query, int key, int T) { return query < T && key <= query; }

// Note [Softmax in base 2, masked only where it must be] (attention_tensor_cores.cu): the
// tensor-core kernels apply the mask element by element only on the tiles these name. Outside
// them, every real query row of the tile (row < T) sees every key of the tile (key < T and key
// <= row); rows past T there compute values that are never written.
// Forward and dQ: a warp owns the span of query rows row0 .. row0 + rows - 1 (row0 < T) and meets
// the key tile (or chunk) k0 .. k0 + tile - 1 (k0 a multiple of tile, k0 < T). With spans of 16
// or 32 rows at multiples of their size and tiles of 64 keys (dQ: also chunks of 16):
//  - tc_query_span_sees_none: every key of the tile is past every row of the span, which then
//    skips the tile (it would add exactly nothing). Otherwise, with tiles of 64, every real row of
//    the span sees the tile's first key, as every row of the first form's query tiles did (the
//    forward's online softmax needs it; with dQ's chunks of 16 a row may see none of a chunk).
//  - tc_query_span_needs_mask: some key of the tile is past the span's first row. Otherwise every
//    key is at most row0 <= every row, and below T: every real row sees the whole tile.
ZERONE_FLASH_FN constexpr bool tc_query_span_sees_none(int row0, int rows, int k0) { return k0 >= row0 + rows; }
ZERONE_FLASH_FN constexpr bool tc_query_span_needs_mask(int row0, int k0, int tile) { return k0 + tile - 1 > row0; }
// dK/dV: a warp owns the span of keys key0 .. key0 + keys - 1 (key0 < T) and meets the chunk of
// queries q0 .. q0 + queries - 1. There queries past T must add nothing. With spans of 16 or 32
// keys at multiples of their size, chunks of 16 or 64 queries at multiples of theirs, and chunks
// no longer than the keys' blocks (64 or 128 keys):
//  - tc_key_span_sees_none: no key of the span is seen by a real query of the chunk (every query
//    is before every key, or past T): the warp skips the chunk, which would add exactly nothing.
//  - tc_key_span_needs_mask: some query of the chunk is before the span's last key or past T.
//    Otherwise every query of the chunk is real and sees every key of the span.
ZERONE_FLASH_FN constexpr bool tc_key_span_sees_none(int key0, int q0, int queries, int T) {
  return q0 + queries - 1 < key0 || q0 >= T;
}
ZERONE_FLASH_FN constexpr bool tc_key_span_needs_mask(int key0, int keys, int q0, int queries, int T) {
  return q0 < key0 + keys - 1 || q0 + queries > T;
}

// Note [Fragments by ldmatrix] (attention_tensor_cores.cu): the cell of a 16-bit tile whose
// address lane `lane` hands ldmatrix.m8n8.x4, relative to the fragment's first row and column.
// ldmatrix.x4 loads four 8 x 8 matrices; lane l names row l % 8 of matrix l / 8, and matrix i
// lands in register i. tests/kernels/flash_tiles_test.cc emulates the instruction and checks each
// of these against mma.m16n8k16's fragment layouts.
struct LaneCell {
  int row, col;
};
// The A fragment (16 x 16, row-major: registers a0..a3 the quarters rows 0-7 / 8-15 at columns
// 0-7, then the same rows at columns 8-15): lane l names row l % 16 at column 8 (l / 16).
ZERONE_FLASH_FN constexpr LaneCell a_fragment_cell(int lane) { return {lane % 16, 8 * (lane / 16)}; }
// Two B fragments (16 x 8 each) side by side, B[k][n] = tile[n0 + n][k0 + k] (the tile's rows are
// B's columns): registers b0, b1 the fragment of columns n0..n0+7 (tile rows n0..n0+7 at columns
// k0..k0+7, then k0+8..k0+15), b2, b3 that of columns n0+8..n0+15. Without .trans.
ZERONE_FLASH_FN constexpr LaneCell b_pair_rows_are_n_cell(int lane) {
  return {lane % 8 + 8 * (lane / 16), 8 * (lane / 8 % 2)};
}
// Two B fragments side by side, B[k][n] = tile[k0 + k][n0 + n] (the tile's rows are B's rows),
// transposed on the way (.trans): b0, b1 tile rows k0..k0+7 and k0+8..k0+15 at columns n0..n0+7,
// b2, b3 the same rows at columns n0+8..n0+15. The same cells as the A fragment's.
ZERONE_FLASH_FN constexpr LaneCell b_pair_rows_are_k_cell(int lane) { return a_fragment_cell(lane); }

// The online softmax (Milakov and Gimelshein): a row's running maximum m and sum l of exp(s - m)
// meet a tile whose largest visible score is tile_max (-inf when the row sees none of it).
// Returns the new maximum; *rescale is the factor exp(m_old - m_new) for l and the output
// accumulator (0 on the row's first tile, where m_old is -inf and nothing has accumulated).
// The first tile of every real row holds key 0, which it sees, so m_new is finite from there on.
ZERONE_FLASH_FN float online_max(float m_old, float tile_max, float* rescale) {
  const float m_new = m_old > tile_max ? m_old : tile_max;
  *rescale = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
  return m_new;
}

}  // namespace zerone::cuda::flash
