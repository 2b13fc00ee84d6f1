// The kernels of the tensor-core flash attention (Note [Flash attention on tensor cores], below);
// attention_tensor_cores.cu launches them. Compiled by nvcc for the GPU, and by a host compiler
// for tests/kernels/tensor_core_emulated_test.cc, whose emulated warps run this same source
// (Note [Emulated warps], emulated_gpu.h; the instructions: warp_instructions.cuh).
// Thread-safety: kernels and device functions; the host functions are pure.
//
// Flash attention on tensor cores: the form of the CUDA backend's flash attention that runs when a
// model computes in 16 bits (flash_common.cuh says which calls it takes; attention.cu dispatches).
//
// Note [Flash attention on tensor cores]: FlashAttention-2 (Dao 2023) with the warp-level matrix
// instruction mma.sync m16n8k16 (sm_80 and later): 16-bit operands, f32 accumulators.
//  - What is rounded: q, k, v and the output are stored in the operand dtype (bf16 or f16; Note
//    [Attention's inputs and output in the compute dtype], kernels/backend.h), as PyTorch's
//    autocast hands scaled_dot_product_attention 16-bit tensors; dO is rounded to it once per
//    call; so are P before P V, and dS before dS K and dS^T Q. Scores, the softmax, its
//    statistics (lse, D) and every accumulator stay f32; lse and dqkv are f32 as in the f32 form.
//    An f32 run (operands f32) never comes here: it keeps attention.cu's exact f32 kernels.
//  - Tiles: a block is 4 warps; a warp owns a span of 32 rows of the block's 128 (queries in
//    forward and dQ, keys in dK/dV; 16 of 64 above head size 64: Note [Query rows a warp owns],
//    Note [Key rows a warp owns]), and each sweeps 64-row tiles of the other side. The C fragment
//    of one mma (16 x 8, f32) is laid out as the A fragment of the next (16 x 16, two C fragments
//    side by side), so P and dS go from the score accumulators to the next product in registers.
//  - Shared-memory rows are hs + 8 elements apart (16 bytes of padding): the fragment loads of a
//    warp then hit 32 different banks.
//  - The tiles load 16-bit rows with 16-byte loads (Note [Operands rounded once], below).
//  - Backward forms D = rowsum(dO * O) from the forward's output (one warp per row), then runs dQ
//    in one sweep over the keys and dK/dV over the queries, sweeping the G query heads of a group
//    in order, as attention.cu's grids do: no atomics, the same bits every run.
//  - Head sizes 16, 32, 64, 96 and 128 (template instances); other sizes use the f32 form.
// Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16"), with lane =
// 4 g + t: A (16 x 16, row-major) registers a0..a3 hold rows {g, g+8, g, g+8} and columns
// {2t, 2t, 2t+8, 2t+8} (+1 in the high half); B (16 x 8) registers b0, b1 hold rows (k) 2t and
// 2t+8 (+1 in the high half) of column g; C (16 x 8) c0..c3 hold (g, 2t), (g, 2t+1), (g+8, 2t),
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "zerone/kernels/cuda/flash_common.cuh"
#include "zerone/kernels/cuda/flash_tiles.h"
#include "zerone/kernels/cuda/warp_instructions.cuh"

namespace zerone::cuda::tensor_cores {


constexpr int kWarpsTc = 4;
constexpr int kThreadsTc = 32 * kWarpsTc;
constexpr int kTileRows = 64;  // the rows of a shared-memory tile, and of every tile a sweep takes

// The operand dtypes: packing two f32 into one register of two 16-bit values (the lower column in
// the low half), and the mma instruction (warp_instructions.cuh). One definition for both, by PAIR
// (the CUDA pair type) and TO_PAIR (its round-to-nearest conversion).
template <typename E>
struct Operand;
#define ZERONE_TC_OPERAND(E, PAIR, TO_PAIR)                                                            \
  template <>                                                                                        \
  struct Operand<E> {                                                                                \
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {                            \
      const PAIR v = TO_PAIR(lo, hi);                                                                \
      return *reinterpret_cast<const uint32_t*>(&v);                                                 \
    }                                                                                                \
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], const uint32_t b[2]) { \
      mma_m16n8k16<E>(c, a, b);                                                                      \
    }                                                                                                \
  };
ZERONE_TC_OPERAND(__nv_bfloat16, __nv_bfloat162, __floats2bfloat162_rn)
ZERONE_TC_OPERAND(__half, __half2, __floats2half2_rn)
#undef ZERONE_TC_OPERAND

// A tile of kTileRows rows of hs 16-bit elements in shared memory, rows `ld` elements apart; the
// kernels' dynamic shared memory is tiles side by side, the swept operands twice (Note [Tiles
// loaded ahead]; forward: Q, K, K, V, V; dQ: Q, dO, K, K, V, V; dK/dV: K, V, Q, Q, dO, dO, then
// two pairs of float rows; a block of 128 rows takes two tiles for each operand it keeps: Q and
// dO in forward and dQ, K and V in dK/dV: Note [Query rows a warp owns], Note [Key rows a warp
// owns]), and tile(smem, i) is the i-th. Consecutive tiles are consecutive rows.
template <int HS>
struct TileLayout {
  static constexpr int ld = HS + 8;
  static constexpr int elems = kTileRows * ld;
  static __device__ __forceinline__ uint16_t* tile(uint16_t* smem, int i) { return smem + i * elems; }
};
// Note [Query rows a warp owns]: in forward and dQ a warp owns a span of query_row_tiles(hs)
// consecutive 16-row mma tiles (its block 4 such spans) and sweeps 64-key tiles; each fragment of
// K or V it loads from shared memory serves every 16-row tile of its span. With one tile a span
// (the first form) a 16 x 64 x 64 product pair issued about as many ldmatrix bytes as the SM's
// shared memory moves in the time its tensor cores take for the products, so the loads, not the
// products, set the pace; two tiles halve the loads per product, as FlashAttention-2's 128-query
// blocks of 4 warps do. At head sizes above 64 the span's accumulators and fragments would not fit
// in registers: one tile there.
// A span's rows see exactly the keys the first form's 64-row query tiles saw, tile by tile in the
// same order with the same arithmetic: the same bits. A span skips a key tile all of whose keys
// are past its rows (the block's second diagonal key tile, for the first two spans of a 128-row
// block; dQ also skips such 16-key chunks: Note [Keys in chunks for dQ]), which the first form
// never met or masked whole (flash::tc_query_span_sees_none; flash_tiles_test checks the spans). Registers at hs 64 (ptxas -v, sm_90): forward 255, dQ 225, no spills: 2 blocks an SM
// (were 127 and 168: 4 and 3 blocks of half the rows); per 64-key tile a warp issues 32 ldmatrix
// for 128 mma in forward (36 for 64 before) and 48 for 192 in dQ (56 for 96; Note [Keys in chunks
// for dQ]).
__host__ __device__ constexpr int query_row_tiles(int hs) { return hs <= 64 ? 2 : 1; }
__host__ __device__ constexpr int query_block_rows(int hs) { return kWarpsTc * 16 * query_row_tiles(hs); }
constexpr int kKeyValueTiles = 4;  // the sweep's key and value tiles, two buffers each
// Each kernel's dynamic shared memory at head size hs: the tiles it keeps (forward: the query
// block's queries; dQ: its queries and dO; dK/dV: K and V), then the swept tiles (and dK/dV's
// rows of lse and D).
constexpr size_t tile_bytes(int hs) { return sizeof(uint16_t) * kTileRows * (hs + 8); }  // TileLayout's
constexpr size_t forward_smem_bytes(int hs) { return (query_row_tiles(hs) + kKeyValueTiles) * tile_bytes(hs); }
constexpr size_t dq_smem_bytes(int hs) { return (2 * query_row_tiles(hs) + kKeyValueTiles) * tile_bytes(hs); }
// dK/dV: K and V (key_row_tiles(hs) tiles each: Note [Key rows a warp owns]), then Q and dO two
// buffers each, then two pairs of float rows (lse and D).
__host__ __device__ constexpr int key_row_tiles(int hs) { return hs <= 64 ? 2 : 1; }
__host__ __device__ constexpr int key_block_rows(int hs) { return kWarpsTc * 16 * key_row_tiles(hs); }
__host__ __device__ constexpr int dkv_stat_rows_tile(int hs) { return 2 * key_row_tiles(hs) + 4; }
constexpr size_t dkv_smem_bytes(int hs) {
  return dkv_stat_rows_tile(hs) * tile_bytes(hs) + 2 * 2 * sizeof(float) * kTileRows;
}
constexpr size_t largest_smem_bytes(int hs) {
  return std::max({forward_smem_bytes(hs), dq_smem_bytes(hs), dkv_smem_bytes(hs)});
}

// This thread's warp and its roles in mma's fragments (lane = 4 g + t).
struct LaneRoles {
  int warp, g, t;
};
__device__ __forceinline__ LaneRoles lane_roles() {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  return {warp, lane / 4, lane % 4};
}

// Note [Fragments by ldmatrix]: the fragments come out of shared memory by ldmatrix (sm_75 and
// later), where the first form read them 32 or 16 bits at a time (4 loads for an A fragment, 2 for
// a B fragment, and for a B fragment whose tile rows are its k rows, 4 16-bit loads and the shifts
// that paired them). Every load is the x4 form: an A fragment, or the B fragments of two
// neighbouring 8-column blocks, which every product here takes in pairs (64 score columns, HS / 8
// output columns, both even): per 16 x 64 x HS product half the load instructions of one x2 load
// per B fragment. flash_tiles.h names the cell each lane addresses; flash_tiles_test.cc emulates
// the instruction against the fragment layouts. ldmatrix.m8n8 gives lane 4g + t the two
// 16-bit elements (g, 2t) and (g, 2t + 1) of each 8 x 8 matrix it loads, lane l naming the
// address of row l % 8 of matrix l / 8 (lanes 0-7 the first, 8-15 the second, ...); with .trans
// the elements (2t, g) and (2t + 1, g). That is exactly the mma.m16n8k16 fragment layout above when
// the matrices are the fragment's 8 x 8 quarters in register order, so the same values reach the
// mma as before: the same bits. Each matrix row is 16 contiguous bytes at a 16-byte boundary
// (column offsets are multiples of 8 elements, rows HS + 8 elements apart, HS a multiple of 16),
// and the padded rows put a matrix's 8 rows in 8 different 4-bank groups: no bank conflicts.
// ldmatrix is warp-wide (.sync.aligned): every caller runs it in warp-uniform control flow (a
// warp's liveness, never a lane's).
__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x % 32); }

// The lane's A fragment of rows row0..row0+15, columns col0..col0+15 of a row-major tile (the cells
// of flash::a_fragment_cell).
__device__ __forceinline__ void load_a(uint32_t a[4], const uint16_t* tile, int ld, int row0, int col0) {
  const flash::LaneCell c = flash::a_fragment_cell(lane_id());
  const uint16_t* p = tile + (row0 + c.row) * ld + col0 + c.col;
  ldmatrix_x4(a, p);
}
// Two B fragments side by side, B[k][n] = tile[n0 + n][k0 + k] for n < 16 (the tile's rows are B's
// columns: K for Q K^T, V for dO V^T, Q for K Q^T, dO for V dO^T): b[0..1] the fragment of columns
// n0..n0+7, b[2..3] that of n0+8..n0+15 (flash::b_pair_rows_are_n_cell). One x4 load where the
// first form issued two x2 loads: the same registers.
__device__ __forceinline__ void load_b_pair_rows_are_n(uint32_t b[4], const uint16_t* tile, int ld, int n0, int k0) {
  const flash::LaneCell c = flash::b_pair_rows_are_n_cell(lane_id());
  const uint16_t* p = tile + (n0 + c.row) * ld + k0 + c.col;
  ldmatrix_x4(b, p);
}
// Two B fragments side by side, B[k][n] = tile[k0 + k][n0 + n] for n < 16 (the tile's rows are B's
// rows: V for P V, K for dS K, dO for P^T dO, Q for dS^T Q), transposed on the way: b[0..1]
// columns n0..n0+7, b[2..3] columns n0+8..n0+15 (flash::b_pair_rows_are_k_cell).
__device__ __forceinline__ void load_b_pair_rows_are_k(uint32_t b[4], const uint16_t* tile, int ld, int k0, int n0) {
  const flash::LaneCell c = flash::b_pair_rows_are_k_cell(lane_id());
  const uint16_t* p = tile + (k0 + c.row) * ld + n0 + c.col;
  ldmatrix_x4_trans(b, p);
}

// Rows first..first+kRows-1 of a (T, HS) head view of 16-bit operands (row t at src + at(t);
// Note [Operands rounded once]) into kRows / kTileRows consecutive tiles; rows at or past T are
// zero. 16-byte loads (rows start at multiples of 16 elements). All threads of the block take part.
template <int HS, int kRows = kTileRows, typename At>
__device__ void load_tile(uint16_t* tile, const uint16_t* src, At at, int first, int T) {
  constexpr int kOctets = HS / 8, ld = TileLayout<HS>::ld;
  for (int i = threadIdx.x; i < kRows * kOctets; i += kThreadsTc) {
    const int r = i / kOctets, c = i % kOctets * 8, row = first + r;
    *reinterpret_cast<uint4*>(tile + r * ld + c) =
        row < T ? *reinterpret_cast<const uint4*>(src + at(row) + c) : make_uint4(0u, 0u, 0u, 0u);
  }
}

// The A side of rows_times_rows: 16 rows of a tile, all HS columns, as HS / 16 A fragments, either
// read from shared memory at each product (RowsInTile) or loaded once and held in registers
// (RowsInRegisters: Note [Key and value fragments held]). fragment(k) is columns 16k..16k+15.
template <int HS>
struct RowsInTile {
  const uint16_t* tile;
  int row0;
  __device__ __forceinline__ void fragment(uint32_t fa[4], int k) const {
    load_a(fa, tile, TileLayout<HS>::ld, row0, 16 * k);
  }
};
template <int HS>
struct RowsInRegisters {
  uint32_t held[HS / 16][4];
  __device__ __forceinline__ void load(const uint16_t* tile, int row0) {
#pragma unroll
    for (int k = 0; k < HS / 16; ++k) load_a(held[k], tile, TileLayout<HS>::ld, row0, 16 * k);
  }
  __device__ __forceinline__ void fragment(uint32_t fa[4], int k) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) fa[i] = held[k][i];
  }
};

// The A fragments of a warp's span of M 16-row tiles, rows first .. first + 16 M - 1 of `tile`,
// loaded into held[0..M-1] (after the barrier that makes the tile's stores visible).
template <int HS, int M>
__device__ __forceinline__ void hold_span(RowsInRegisters<HS> (&held)[M], const uint16_t* tile, int first) {
#pragma unroll
  for (int i = 0; i < M; ++i) held[i].load(tile, first + 16 * i);
}

// c[i][n] += A[i] times the first B fragment of the pair fb, c[i][n + 1] += A[i] times the second,
// for i < M: one B fragment pair loaded for M products (Note [Query rows a warp owns]).
template <typename E, int M, int W>
__device__ __forceinline__ void mma_with_pair(float (*c)[W][4], int n, const uint32_t (*fa)[4], const uint32_t fb[4]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
    Operand<E>::mma(c[i][n], fa[i], fb);
    Operand<E>::mma(c[i][n + 1], fa[i], fb + 2);
  }
}

// acc[i] (16 x 8 N8: N8 C fragments) = A[i] (16 rows: RowsInTile or RowsInRegisters) times the
// transpose of rows n0 .. n0 + 8 N8 - 1 of tile b, for i < M: sum over the HS columns of both.
// Each B fragment pair is loaded once for the M products (Note [Query rows a warp owns]); each
// product sums over the columns in the same order whatever M and N8 are.
template <typename E, int HS, int M, int N8 = 8, typename Rows>
__device__ __forceinline__ void rows_times_rows(float (*acc)[N8][4], const Rows* a, const uint16_t* b, int n0 = 0) {
  constexpr int ld = TileLayout<HS>::ld;
  static_assert(N8 % 2 == 0, "B fragments come in pairs");
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int n = 0; n < N8; ++n) acc[i][n][0] = acc[i][n][1] = acc[i][n][2] = acc[i][n][3] = 0.0f;
#pragma unroll
  for (int k = 0; k < HS / 16; ++k) {
    uint32_t fa[M][4];
#pragma unroll
    for (int i = 0; i < M; ++i) a[i].fragment(fa[i], k);
#pragma unroll
    for (int n = 0; n < N8; n += 2) {
      uint32_t fb[4];
      load_b_pair_rows_are_n(fb, b, ld, n0 + 8 * n, 16 * k);
      mma_with_pair<E, M>(acc, n, fa, fb);
    }
  }
}

// out[i] (16 x HS: HS/8 C fragments) += P[i] (16 x 16 K16, the C fragments p[i], rounded to E)
// times rows k0 .. k0 + 16 K16 - 1 of tile b (all HS columns), for i < M (each B fragment pair
// loaded once for the M products). The sum runs over those rows 16 at a time, in order.
template <typename E, int HS, int M, int K16 = 4>
__device__ __forceinline__ void accumulate_times_tile(float (*out)[HS / 8][4], const float (*p)[2 * K16][4],
                                                      const uint16_t* b, int k0 = 0) {
  constexpr int ld = TileLayout<HS>::ld;
#pragma unroll
  for (int k = 0; k < K16; ++k) {
    uint32_t fa[M][4];
#pragma unroll
    for (int i = 0; i < M; ++i) {
      fa[i][0] = Operand<E>::pack(p[i][2 * k][0], p[i][2 * k][1]);
      fa[i][1] = Operand<E>::pack(p[i][2 * k][2], p[i][2 * k][3]);
      fa[i][2] = Operand<E>::pack(p[i][2 * k + 1][0], p[i][2 * k + 1][1]);
      fa[i][3] = Operand<E>::pack(p[i][2 * k + 1][2], p[i][2 * k + 1][3]);
    }
#pragma unroll
    for (int n = 0; n < HS / 8; n += 2) {  // HS / 8 is even: HS is a multiple of 16
      uint32_t fb[4];
      load_b_pair_rows_are_k(fb, b, ld, k0 + 16 * k, 8 * n);
      mma_with_pair<E, M>(out, n, fa, fb);
    }
  }
}

// Sum of v over the 4 lanes of a row group (lanes 4g .. 4g+3), the same bits in each.
__device__ __forceinline__ float group_sum(float v) {
  v += shfl_xor(v, 1);
  return v + shfl_xor(v, 2);
}
__device__ __forceinline__ float group_max(float v) {
  v = fmaxf(v, shfl_xor(v, 1));
  return fmaxf(v, shfl_xor(v, 2));
}

// Note [Softmax in base 2, masked only where it must be]: FlashAttention-2's arithmetic for the
// elements between the two products, which on tensor cores costs as much as the products
// themselves at head size 64 (the first form spent about 20 instructions a score: the mask's
// compares and selects on every tile, a multiply by the scale, expf's range reduction, a test for
// -inf). Now:
//  - Scores are scaled by scale * log2(e), so the softmax is 2^(x - max): one FFMA and one ex2
//    (the MUFU's ex2.approx.ftz: relative error about 2^-22, far below the 2^-9 of the bf16 P
//    that the next product rounds to; ex2(-inf) = +0, so masked scores need no test). The
//    statistics saved for backward stay in natural units: lse = max * ln 2 + ln(row sum), and
//    backward forms P = 2^(s * scale * log2 e - lse * log2 e).
//  - The causal mask is applied only on tiles that hold a masked element: in forward and dQ the
//    diagonal key tile of each warp's span of queries (dQ at head sizes up to 64: the two 16-key
//    chunks at the span's rows; every earlier key is seen by every row of the span, and keys past
//    T occur only in the last key tile, which is the diagonal of the last span); in dK/dV the chunks of queries holding one before a key of the warp's span,
//    and those running past T (queries past T must add nothing to dK and dV). Rows past T
//    elsewhere compute finite values from zero-filled operands and are never written. The branch
//    is uniform over the warp.
// The values differ from the first form's by the exponential's rounding: other bits, well within
// the tolerance of the bf16 products (the op harness's attention rows; bitwise repeatable still).
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Note [Tiles loaded ahead]: each kernel sweeps tiles of one side (forward and dQ the key tiles,
// dK/dV the query tiles of each head of the group) and loads the next one while its warps compute
// on this one: cp.async (sm_80) copies 16 bytes from global to shared memory without passing
// through registers, into the other of two buffers per swept operand. A step of a sweep is
//   barrier            (every warp is done with the step before, whose buffers the next tile fills)
//   issue the next tile's copies; wait for this tile's (cp.async.wait_group 1; 0 at the last step)
//   barrier            (every thread's copies of this tile are visible)
//   compute on this tile.
// Rows at or past T are zero-filled by the copy itself (a source size of 0 reads nothing); dK/dV's
// rows of lse and D for the query tile go in the same group, 4 bytes a copy. The next step's first
// copies are issued before the plain loads of the operands the sweep keeps (Q and dO, or K and V).
// The first form loaded each tile between two barriers, every warp waiting on global memory at
// every step. The values in the tiles are the same: the same bits. The price is shared memory:
// two buffers per swept operand (dK/dV at hs 128: 105 KB a block; tensor_core_flash_takes leaves
// a GPU that offers less to the f32 form).
// load_tile's rows by cp.async, not yet committed (the caller commits the step's group).
template <int HS, typename At>
__device__ void load_tile_async(uint16_t* tile, const uint16_t* src, At at, int first, int T) {
  constexpr int kOctets = HS / 8, ld = TileLayout<HS>::ld;
  for (int i = threadIdx.x; i < kTileRows * kOctets; i += kThreadsTc) {
    const int r = i / kOctets, c = i % kOctets * 8, row = first + r;
    const bool valid = row < T;
    copy16_async(tile + r * ld + c, valid ? src + at(row) + c : src, valid);
  }
}

// Step `step` of a sweep of `steps` (Note [Tiles loaded ahead]): after the first barrier, `issue`
// the next step's copies (and commit them), then wait for this step's.
template <typename Issue>
__device__ __forceinline__ void sweep_step_begin(int step, int steps, Issue issue) {
  __syncthreads();
  if (step + 1 < steps) {
    issue(step + 1);
    copies_wait<1>();
  } else {
    copies_wait<0>();
  }
  __syncthreads();
}

// The key and value tiles of a sweep over key tiles (forward and dQ): two buffers each, tiles
// first, first + 1 (keys) and first + 2, first + 3 (values) of the block's shared memory.
template <int HS>
struct KeyValueSweep {
  uint16_t* smem;
  int first;
  const uint16_t* qkv;
  FlashShape s;
  int b, kv;
  __device__ uint16_t* keys(int key_tile) const { return TileLayout<HS>::tile(smem, first + (key_tile & 1)); }
  __device__ uint16_t* values(int key_tile) const { return TileLayout<HS>::tile(smem, first + 2 + (key_tile & 1)); }
  // Issues and commits the copies of key tile `key_tile` (Note [Tiles loaded ahead]).
  __device__ void issue(int key_tile) const {
    const FlashShape shape = s;
    const int batch = b, head = kv;
    load_tile_async<HS>(keys(key_tile), qkv, [=](int r) { return shape.k(batch, r, head); }, key_tile * kTileRows, s.T);
    load_tile_async<HS>(values(key_tile), qkv, [=](int r) { return shape.v(batch, r, head); }, key_tile * kTileRows,
                        s.T);
    copies_commit();
  }
};

// ---------------------------------------------------------------- forward

// One block per (b, h, query block of query_block_rows(HS)), the longest rows first; warp w owns
// the span of M = query_row_tiles(HS) 16-row tiles from row q0 + 16 M w (Note [Query rows a warp
// owns]) and holds its queries' A fragments in registers for the whole sweep.
template <typename E, int HS>
__global__ void __launch_bounds__(kThreadsTc)
    tc_flash_forward_kernel(uint16_t* out, float* lse, const uint16_t* qkv, FlashShape s, float scale) {
  using L = TileLayout<HS>;
  constexpr int M = query_row_tiles(HS), kSpanRows = 16 * M, kBlockRows = query_block_rows(HS);
  ZERONE_DYNAMIC_SHARED(uint16_t, smem);
  // Queries (M tiles); keys and values after them, two buffers each (Note [Tiles loaded ahead]).
  uint16_t* q_s = L::tile(smem, 0);
  const int T = s.T, b = blockIdx.x / s.NH, h = blockIdx.x % s.NH, kv = h / s.G();
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBlockRows;
  const auto [warp, g, t] = lane_roles();
  const int row0 = q0 + kSpanRows * warp;  // the warp's span: rows row0 .. row0 + kSpanRows - 1
  int rows[M][2];
#pragma unroll
  for (int i = 0; i < M; ++i) rows[i][0] = row0 + 16 * i + g, rows[i][1] = row0 + 16 * i + g + 8;
  const bool warp_live = row0 < T;
  const KeyValueSweep<HS> sweep{smem, M, qkv, s, b, kv};
  const auto issue = [&](int key_tile) { sweep.issue(key_tile); };
  const int key_tiles = flash::key_tiles_seen(q0, kBlockRows, T, kTileRows);
  const float scale_log2 = scale * kLog2e;

  issue(0);  // first: its copies run while the queries load
  load_tile<HS, kBlockRows>(q_s, qkv, [=](int r) { return s.q(b, r, h); }, q0, T);
  __syncthreads();  // the query tiles, stored by every thread
  RowsInRegisters<HS> q_held[M];
  if (warp_live) hold_span(q_held, q_s, kSpanRows * warp);
  float o[M][HS / 8][4] = {}, m[M][2], l[M][2];
#pragma unroll
  for (int i = 0; i < M; ++i) m[i][0] = m[i][1] = -INFINITY, l[i][0] = l[i][1] = 0.0f;
  for (int key_tile = 0; key_tile < key_tiles; ++key_tile) {
    const int k0 = key_tile * kTileRows;
    sweep_step_begin(key_tile, key_tiles, issue);
    if (!warp_live || flash::tc_query_span_sees_none(row0, kSpanRows, k0)) continue;
    const uint16_t *k_s = sweep.keys(key_tile), *v_s = sweep.values(key_tile);
    float p[M][8][4];
    rows_times_rows<E, HS, M>(p, q_held, k_s);  // scores (16 x 64 a tile)
    // Note [Softmax in base 2, masked only where it must be]: scores in units of log2.
    const bool masked = flash::tc_query_span_needs_mask(row0, k0, kTileRows);
    // The tile's scores in units of log2 and each row's largest; is_masked a compile-time constant.
    const auto scale_scores = [&](int i, float tile_max[2], auto is_masked) {
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + 8 * n + 2 * t + (e & 1);
          p[i][n][e] = !decltype(is_masked)::value || flash::sees(rows[i][e / 2], key, T) ? scale_log2 * p[i][n][e] : -INFINITY;
          tile_max[e / 2] = fmaxf(tile_max[e / 2], p[i][n][e]);
        }
    };
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float tile_max[2] = {-INFINITY, -INFINITY};
      if (masked) scale_scores(i, tile_max, std::true_type{});
      else scale_scores(i, tile_max, std::false_type{});
      float rescale[2], m_sub[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_new = fmaxf(m[i][r], group_max(tile_max[r]));
        rescale[r] = m[i][r] == -INFINITY ? 0.0f : exp2_approx(m[i][r] - m_new);  // 0 on the row's first tile
        m[i][r] = m_new;
        m_sub[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing seen yet (past T): 2^-inf = 0
        l[i][r] *= rescale[r];
      }
#pragma unroll
      for (int n = 0; n < HS / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[i][n][e] *= rescale[e / 2];
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          p[i][n][e] = exp2_approx(p[i][n][e] - m_sub[e / 2]);
          l[i][e / 2] += p[i][n][e];  // this lane's share of the row sum (summed over the group at the end)
        }
    }
    accumulate_times_tile<E, HS, M>(o, p, v_s);
  }
  if (!warp_live) return;
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float row_sum = group_sum(l[i][r]);
      if (rows[i][r] >= T) continue;
      const float inv = 1.0f / row_sum;
      uint16_t* dst = out + s.o(b, rows[i][r], h);  // in E (Note [Attention's inputs and output in the compute dtype])
#pragma unroll
      for (int n = 0; n < HS / 8; ++n)
        *reinterpret_cast<uint32_t*>(dst + 8 * n + 2 * t) =
            Operand<E>::pack(o[i][n][2 * r] * inv, o[i][n][2 * r + 1] * inv);
      if (t == 0) lse[s.stat(b, h, rows[i][r])] = m[i][r] * kLn2 + logf(row_sum);  // natural units
    }
}

// ---------------------------------------------------------------- dQ

// One block per (b, h, query block of query_block_rows(HS)): dQ = dS K with dS = P (dP - D), P
// recomputed; warp w owns the span of M = query_row_tiles(HS) 16-row tiles from row q0 + 16 M w
// (Note [Query rows a warp owns]).
// Note [Keys in chunks for dQ]: with two row tiles a warp (head sizes up to 64) each 64-key tile
// is taken 16 keys at a time, as dK/dV takes its queries (Note [Key rows a warp owns]): the
// scores and dP of a chunk (16 registers each, where the whole tile's took 64 each) leave room for
// the warp's query and dO A fragments, held for the whole sweep, so that a chunk issues 12
// ldmatrix for its 48 mma (the whole tile at once, Q and dO read at each product: 64 for 192).
// dQ sums the same products in the same order (key tiles in order, 16 keys at a time, as mma's k
// steps ran), and a chunk all of whose keys are past the span's rows adds nothing, where the tile
// form added products of zero (±0, which leave a sum unchanged): the same bits. Above head size 64 the tile is taken whole, Q and dO from
// shared memory.
template <typename E, int HS>
__global__ void __launch_bounds__(kThreadsTc)
    tc_flash_dq_kernel(float* dqkv, const float* dsum, const uint16_t* dout, const uint16_t* qkv, const float* lse,
                       FlashShape s, float scale) {
  using L = TileLayout<HS>;
  constexpr int M = query_row_tiles(HS), kSpanRows = 16 * M, kBlockRows = query_block_rows(HS);
  constexpr int kChunk = M == 2 ? 16 : kTileRows, kChunks = kTileRows / kChunk, N8 = kChunk / 8, K16 = kChunk / 16;
  constexpr bool kHeld = M == 2;  // Note [Keys in chunks for dQ]
  ZERONE_DYNAMIC_SHARED(uint16_t, smem);
  // Queries and dO (M tiles each); keys and values after them, two buffers each.
  uint16_t *q_s = L::tile(smem, 0), *do_s = L::tile(smem, M);
  const int T = s.T, b = blockIdx.x / s.NH, h = blockIdx.x % s.NH, kv = h / s.G();
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBlockRows;
  const auto [warp, g, t] = lane_roles();
  const int row0 = q0 + kSpanRows * warp;  // the warp's span: rows row0 .. row0 + kSpanRows - 1
  int rows[M][2];
#pragma unroll
  for (int i = 0; i < M; ++i) rows[i][0] = row0 + 16 * i + g, rows[i][1] = row0 + 16 * i + g + 8;
  const bool warp_live = row0 < T;
  const KeyValueSweep<HS> sweep{smem, 2 * M, qkv, s, b, kv};
  const auto issue = [&](int key_tile) { sweep.issue(key_tile); };
  const int key_tiles = flash::key_tiles_seen(q0, kBlockRows, T, kTileRows);
  RowsInTile<HS> q_rows[M], do_rows[M];
#pragma unroll
  for (int i = 0; i < M; ++i) {
    q_rows[i] = {q_s, kSpanRows * warp + 16 * i};
    do_rows[i] = {do_s, kSpanRows * warp + 16 * i};
  }

  issue(0);  // first: its copies run while the queries and dO load
  load_tile<HS, kBlockRows>(q_s, qkv, [=](int r) { return s.q(b, r, h); }, q0, T);
  load_tile<HS, kBlockRows>(do_s, dout, [=](int r) { return s.o(b, r, h); }, q0, T);
  RowsInRegisters<kHeld ? HS : 16> q_held[kHeld ? M : 1], do_held[kHeld ? M : 1];
  if constexpr (kHeld) {
    __syncthreads();  // the query and dO tiles, stored by every thread
    if (warp_live) {
      hold_span(q_held, q_s, kSpanRows * warp);
      hold_span(do_held, do_s, kSpanRows * warp);
    }
  }
  const float scale_log2 = scale * kLog2e;
  float row_lse2[M][2], D[M][2], dq[M][HS / 8][4] = {};  // row_lse2: lse in units of log2
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = rows[i][r];
      row_lse2[i][r] = row < T ? lse[s.stat(b, h, row)] * kLog2e : 0.0f;
      D[i][r] = row < T ? dsum[s.stat(b, h, row)] : 0.0f;
    }
  for (int key_tile = 0; key_tile < key_tiles; ++key_tile) {
    const int k0 = key_tile * kTileRows;
    sweep_step_begin(key_tile, key_tiles, issue);
    if (!warp_live) continue;
    const uint16_t *k_s = sweep.keys(key_tile), *v_s = sweep.values(key_tile);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int c0 = k0 + c * kChunk;  // the chunk's first key
      if (flash::tc_query_span_sees_none(row0, kSpanRows, c0)) continue;
      float p[M][N8][4], dp[M][N8][4];
      if constexpr (kHeld) {
        rows_times_rows<E, HS, M, N8>(p, q_held, k_s, c * kChunk);    // scores
        rows_times_rows<E, HS, M, N8>(dp, do_held, v_s, c * kChunk);  // dP = dO V^T
      } else {
        rows_times_rows<E, HS, M, N8>(p, q_rows, k_s, c * kChunk);
        rows_times_rows<E, HS, M, N8>(dp, do_rows, v_s, c * kChunk);
      }
      // Note [Softmax in base 2, masked only where it must be]; masked is a compile-time constant.
      const auto ds_over_p = [&](auto masked) {
#pragma unroll
        for (int i = 0; i < M; ++i)
#pragma unroll
          for (int n = 0; n < N8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = c0 + 8 * n + 2 * t + (e & 1);
              const float prob = !decltype(masked)::value || flash::sees(rows[i][e / 2], key, T)
                                     ? exp2_approx(fmaf(p[i][n][e], scale_log2, -row_lse2[i][e / 2]))
                                     : 0.0f;
              p[i][n][e] = prob * (dp[i][n][e] - D[i][e / 2]);  // dS
            }
      };
      if (flash::tc_query_span_needs_mask(row0, c0, kChunk)) ds_over_p(std::true_type{});
      else ds_over_p(std::false_type{});
      accumulate_times_tile<E, HS, M, K16>(dq, p, k_s, c * kChunk);
    }
  }
  if (!warp_live) return;
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (rows[i][r] >= T) continue;
      float* dst = dqkv + s.q(b, rows[i][r], h);
#pragma unroll
      for (int n = 0; n < HS / 8; ++n)
        *reinterpret_cast<float2*>(dst + 8 * n + 2 * t) =
            make_float2(scale * dq[i][n][2 * r], scale * dq[i][n][2 * r + 1]);
    }
}

// ---------------------------------------------------------------- dK and dV

// Note [Key rows a warp owns]: at head sizes up to 64 a dK/dV warp owns 32 keys (two 16-row mma
// tiles, its block 128) and takes each 64-query tile of its sweep 16 queries at a time: per chunk
// the two score products (32 keys x 16 queries), then dV and dK over those 16 queries. Every
// fragment of Q or dO it loads then serves both key tiles, and the chunk's scores and dP (16
// registers each) leave room beside dK and dV (128 f32 registers) for the keys' A fragments,
// held for the whole sweep (Note [Key and value fragments held]; the values' too spilled 228
// bytes at hs 64). A chunk issues 24 ldmatrix for its 64 mma (254 registers, no spill: ptxas -v,
// sm_90), where the first form (16 keys, the 64 queries at once, K and V held) issued 64 for 128.
// Above head size 64: 16 keys a warp, the 64 queries at once, K and V read from shared memory.
// A key's dK and dV sum the same products in the same order either way (query tiles in order, 16
// queries at a time, as mma's k steps ran), and a chunk a warp skips (all its queries before the
// warp's keys, or past T) is one whose products the first form added as zeros (±0, which leave a
// sum unchanged), or never met (the block's first query tile, for its second 64 keys): the same
// bits.
//
// One block per (b, kv head, key block of key_block_rows(HS)), the keys seen by the most queries
// first. Warp w owns the span of M = key_row_tiles(HS) 16-row tiles from key k0 + 16 M w and, for
// each query head of the group in order, sweeps the 64-query tiles that see them (from k0 on):
// S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q, all in registers.
template <typename E, int HS>
__global__ void __launch_bounds__(kThreadsTc)
    tc_flash_dkv_kernel(float* dqkv, const uint16_t* dout, const uint16_t* qkv, const float* lse, const float* dsum,
                        FlashShape s, float scale) {
  using L = TileLayout<HS>;
  constexpr int M = key_row_tiles(HS), kSpanKeys = 16 * M, kBlockKeys = key_block_rows(HS);
  constexpr int kChunk = M == 2 ? 16 : kTileRows, kChunks = kTileRows / kChunk, N8 = kChunk / 8, K16 = kChunk / 16;
  constexpr bool kHeld = M == 2;  // Note [Key and value fragments held]
  ZERONE_DYNAMIC_SHARED(uint16_t, smem);
  // Keys and values (M tiles each); queries and dO after them, two buffers each.
  uint16_t *k_s = L::tile(smem, 0), *v_s = L::tile(smem, M);
  const int T = s.T, b = blockIdx.x / s.NKV, kv = blockIdx.x % s.NKV, G = s.G();
  const int k0 = blockIdx.y * kBlockKeys;
  const auto [warp, g, t] = lane_roles();
  const int key0 = k0 + kSpanKeys * warp;  // the warp's span: keys key0 .. key0 + kSpanKeys - 1
  int keys[M][2];
#pragma unroll
  for (int i = 0; i < M; ++i) keys[i][0] = key0 + 16 * i + g, keys[i][1] = key0 + 16 * i + g + 8;
  const bool warp_live = key0 < T;
  const int query_tiles = flash::tiles_of(T, kTileRows), first_tile = k0 / kTileRows;
  // The sweep's steps: for each query head of the group in order, the query tiles that see these
  // keys, step = group * tiles_per_head + (query_tile - first_tile).
  const int tiles_per_head = query_tiles - first_tile, steps = G * tiles_per_head;
  const auto head_of = [&](int step) { return kv * G + step / tiles_per_head; };
  const auto first_query_of = [&](int step) { return (first_tile + step % tiles_per_head) * kTileRows; };
  const auto queries_of = [&](int step) { return L::tile(smem, 2 * M + (step & 1)); };
  const auto dout_of = [&](int step) { return L::tile(smem, 2 * M + 2 + (step & 1)); };
  // (64) the query tile's lse, then (64) its D, per buffer.
  const auto lse_of = [&](int step) {
    return reinterpret_cast<float*>(L::tile(smem, dkv_stat_rows_tile(HS))) + (step & 1) * 2 * kTileRows;
  };
  const auto issue = [&](int step) {
    const int h = head_of(step), q0 = first_query_of(step);
    load_tile_async<HS>(queries_of(step), qkv, [=](int r) { return s.q(b, r, h); }, q0, T);
    load_tile_async<HS>(dout_of(step), dout, [=](int r) { return s.o(b, r, h); }, q0, T);
    if (threadIdx.x < kTileRows) {  // in the same group: zero past T, as the rows
      const int query = q0 + threadIdx.x;
      const bool valid = query < T;
      const size_t at = valid ? s.stat(b, h, query) : 0;
      float* rows = lse_of(step);
      copy4_async(rows + threadIdx.x, lse + at, valid);
      copy4_async(rows + kTileRows + threadIdx.x, dsum + at, valid);
    }
    copies_commit();
  };

  issue(0);  // first: its copies run while the keys and values load
  load_tile<HS, kBlockKeys>(k_s, qkv, [=](int r) { return s.k(b, r, kv); }, k0, T);
  load_tile<HS, kBlockKeys>(v_s, qkv, [=](int r) { return s.v(b, r, kv); }, k0, T);
  const float scale_log2 = scale * kLog2e;
  // Note [Key and value fragments held]: the warp's keys and values are the A side of both score
  // products at every chunk of the sweep. With 32 keys a warp (head sizes up to 64) the keys'
  // fragments (HS / 2 registers: 32 at hs 64) are loaded once and held, the values' read at each
  // chunk (holding both spilled at hs 64; with the keys' alone: 254 registers at hs 64, 168 at 32,
  // 126 at 16, no spills); at larger heads (16 keys a warp) both are read from shared memory,
  // where holding them spilled (hs 128).
  RowsInRegisters<kHeld ? HS : 16> k_held[kHeld ? M : 1];
  RowsInTile<HS> k_rows[M], v_rows[M];
#pragma unroll
  for (int i = 0; i < M; ++i) {
    k_rows[i] = {k_s, kSpanKeys * warp + 16 * i};
    v_rows[i] = {v_s, kSpanKeys * warp + 16 * i};
  }
  if constexpr (kHeld) {
    __syncthreads();  // the key and value tiles, stored by every thread
    if (warp_live) hold_span(k_held, k_s, kSpanKeys * warp);
  }
  float dk[M][HS / 8][4] = {}, dv[M][HS / 8][4] = {};
  for (int step = 0; step < steps; ++step) {
    const int q0 = first_query_of(step);
    sweep_step_begin(step, steps, issue);
    if (!warp_live) continue;
    const uint16_t *q_s = queries_of(step), *do_s = dout_of(step);
    const float *lse_s = lse_of(step), *d_s = lse_s + kTileRows;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int c0 = q0 + c * kChunk;  // the chunk's first query
      if (flash::tc_key_span_sees_none(key0, c0, kChunk, T)) continue;
      float p[M][N8][4], ds[M][N8][4];
      if constexpr (kHeld) {
        rows_times_rows<E, HS, M, N8>(p, k_held, q_s, c * kChunk);    // S^T (keys x queries)
        rows_times_rows<E, HS, M, N8>(ds, v_rows, do_s, c * kChunk);  // dP^T = V dO^T
      } else {
        rows_times_rows<E, HS, M, N8>(p, k_rows, q_s, c * kChunk);
        rows_times_rows<E, HS, M, N8>(ds, v_rows, do_s, c * kChunk);
      }
      // Note [Softmax in base 2, masked only where it must be]: the chunks holding a query before
      // one of the span's keys, and those running past T; masked is a compile-time constant.
      const auto probabilities_and_ds = [&](auto masked) {
#pragma unroll
        for (int i = 0; i < M; ++i)
#pragma unroll
          for (int n = 0; n < N8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int column = c * kChunk + 8 * n + 2 * t + (e & 1);
              const float prob = !decltype(masked)::value || flash::sees(q0 + column, keys[i][e / 2], T)
                                     ? exp2_approx(fmaf(p[i][n][e], scale_log2, -lse_s[column] * kLog2e))
                                     : 0.0f;
              p[i][n][e] = prob;
              ds[i][n][e] = prob * (ds[i][n][e] - d_s[column]);
            }
      };
      if (flash::tc_key_span_needs_mask(key0, kSpanKeys, c0, kChunk, T)) probabilities_and_ds(std::true_type{});
      else probabilities_and_ds(std::false_type{});
      accumulate_times_tile<E, HS, M, K16>(dv, p, do_s, c * kChunk);
      accumulate_times_tile<E, HS, M, K16>(dk, ds, q_s, c * kChunk);
    }
  }
  if (!warp_live) return;
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (keys[i][r] >= T) continue;
      float* dk_dst = dqkv + s.k(b, keys[i][r], kv);
      float* dv_dst = dqkv + s.v(b, keys[i][r], kv);
#pragma unroll
      for (int n = 0; n < HS / 8; ++n) {
        *reinterpret_cast<float2*>(dk_dst + 8 * n + 2 * t) =
            make_float2(scale * dk[i][n][2 * r], scale * dk[i][n][2 * r + 1]);
        *reinterpret_cast<float2*>(dv_dst + 8 * n + 2 * t) = make_float2(dv[i][n][2 * r], dv[i][n][2 * r + 1]);
      }
    }
}

// ---------------------------------------------------------------- launch geometry

// Each kernel's grid for shape s (blocks of kThreadsTc threads, dynamic shared memory
// forward_smem_bytes, dq_smem_bytes, dkv_smem_bytes).
inline dim3 forward_grid(const FlashShape& s, int hs) {
  return dim3(static_cast<unsigned>(s.B * s.NH), static_cast<unsigned>(flash::tiles_of(s.T, query_block_rows(hs))));
}
inline dim3 dq_grid(const FlashShape& s, int hs) { return forward_grid(s, hs); }
inline dim3 dkv_grid(const FlashShape& s, int hs) {
  return dim3(static_cast<unsigned>(s.B * s.NKV), static_cast<unsigned>(flash::tiles_of(s.T, key_block_rows(hs))));
}

}  // namespace zerone::cuda::tensor_cores
