// The transformers' operations on the GPU (kernels.h; kernels/cpu/ops.h is the spec).
// Note [CUDA kernels, correctness first] (kernels.h).
#include <cmath>

#include "zerone/kernels/cuda/common.cuh"
#include "zerone/kernels/cuda/kernels.h"

namespace zerone::cuda {
namespace {

// ---------------------------------------------------------------- embedding

__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const void* wte, const void* wpe,
                                         DType dtype, int B, int T, int C) {
  const size_t total = static_cast<size_t>(B) * T * C;
  ZERONE_GRID_STRIDE(i, total) {
    const size_t bt = i / C, c = i % C;
    const int t = static_cast<int>(bt % T);
    float x = load_param(wte, dtype, static_cast<size_t>(tokens[bt]) * C + c);
    if (wpe) x += load_param(wpe, dtype, static_cast<size_t>(t) * C + c);
    out[i] = x;
  }
}

// Note [Embedding backward without atomics]: repeated tokens must add into one row of dwte in a
// fixed order (position order, as the cpu does). One block per position bt: it is the row's
// "owner" when bt is the first position holding its token (a scan of the positions before it);
// the owner then lists, in order, every position holding the token (ballots over chunks of the
// token array) and sums their dout rows channel by channel. Every row of dwte has one owner, no
// two blocks write one element, and the work is spread over the distinct tokens (the worst case,
// one token everywhere, is one block summing B*T rows: the old one-thread-per-channel loop).
__global__ void embedding_backward_wte_kernel(float* dwte, const float* dout, const int32_t* tokens, int BT, int C) {
  __shared__ int positions[kThreads];
  __shared__ int warp_counts[kThreads / 32];
  const int bt = blockIdx.x;
  const int32_t token = tokens[bt];
  // Owner test: no earlier position holds the token.
  bool earlier = false;
  for (int j = threadIdx.x; j < bt; j += blockDim.x) earlier |= tokens[j] == token;
  if (__syncthreads_or(earlier)) return;  // the whole block leaves together
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float acc[4];  // channels c = threadIdx.x + kThreads * k (C <= 4 * kThreads here; wider in passes)
  for (int c0 = 0; c0 < C; c0 += 4 * kThreads) {
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[k] = 0.0f;
    for (int j0 = bt; j0 < BT; j0 += kThreads) {
      // Positions j0 .. j0+kThreads-1 holding the token, compacted in order into `positions`.
      const int j = j0 + threadIdx.x;
      const bool match = j < BT && tokens[j] == token;
      const unsigned ballot = __ballot_sync(0xffffffffu, match);
      if (lane == 0) warp_counts[warp] = __popc(ballot);
      __syncthreads();
      int before = 0, count = 0;
      for (int w = 0; w < kThreads / 32; ++w) {
        if (w < warp) before += warp_counts[w];
        count += warp_counts[w];
      }
      if (match) positions[before + __popc(ballot & ((1u << lane) - 1u))] = j;
      __syncthreads();
      for (int i = 0; i < count; ++i) {
        const float* row = dout + static_cast<size_t>(positions[i]) * C;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int c = c0 + threadIdx.x + kThreads * k;
          if (c < C) acc[k] += row[c];
        }
      }
      __syncthreads();  // positions and warp_counts are rewritten next chunk
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int c = c0 + threadIdx.x + kThreads * k;
      if (c < C) dwte[static_cast<size_t>(token) * C + c] += acc[k];
    }
  }
}

// dwpe row t += sum over b of dout row (b, t), in b order: one thread per (t, channel).
__global__ void embedding_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const size_t total = static_cast<size_t>(T) * C;
  ZERONE_GRID_STRIDE(i, total) {
    float g = 0.0f;
    for (int b = 0; b < B; ++b) g += dout[static_cast<size_t>(b) * total + i];
    dwpe[i] += g;
  }
}

// ---------------------------------------------------------------- norms

// Note [Norms a warp per row]: the norms give each row one warp (kRowsPerBlock rows to a
// block of kThreads), its lanes taking elements lane, lane + 32, ... and summing them with
// warp_sum: no shared memory and no block-wide barrier. The first form, a block of 256 threads per
// row with four block-wide reductions, kept one load per thread in flight and reached 1.0 TB/s on
// an H200 at 8192 rows of 768 (36.5 us; docs/BENCHMARKS.md, call 7's profile). The sums are in
// another order than the cpu's, within the op harness's tolerance (Note [CUDA against the cpu
// backend]), and the same every run. The backward rows likewise (dinp += ..., each lane its own
// elements).
constexpr int kRowsPerBlock = kThreads / 32;
unsigned row_warp_blocks(int N) { return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock); }
// This warp's row and this thread's lane in it (a kernel launched with row_warp_blocks).
struct WarpRow {
  size_t n;
  int lane;
};
__device__ __forceinline__ WarpRow warp_row() {
  return {blockIdx.x * static_cast<size_t>(kRowsPerBlock) + threadIdx.x / 32, static_cast<int>(threadIdx.x % 32)};
}

__global__ void layernorm_forward_kernel(void* out, DType out_dtype, float* mean, float* rstd, const float* inp,
                                         const void* weight, const void* bias, DType dtype, int N, int C) {
  const auto [n, lane] = warp_row();
  if (n >= static_cast<size_t>(N)) return;  // the whole warp: warp_sum needs every lane
  const float* x = inp + n * C;
  float s = 0.0f;
#pragma unroll 4
  for (int i = lane; i < C; i += 32) s += x[i];
  const float m = warp_sum(s) / C;
  float v = 0.0f;
#pragma unroll 4
  for (int i = lane; i < C; i += 32) v += (x[i] - m) * (x[i] - m);
  const float r = 1.0f / sqrtf(warp_sum(v) / C + 1e-5f);
#pragma unroll 4
  for (int i = lane; i < C; i += 32)
    store_param(out, out_dtype, n * C + i, (x[i] - m) * r * load_param(weight, dtype, i) + load_param(bias, dtype, i));
  if (lane == 0) mean[n] = m, rstd[n] = r;
}

// Note [Norms a warp per row]: the backward rows too (one pass of sums, one of updates).
__global__ void layernorm_backward_rows(float* dinp, const float* dout, const float* inp, const void* weight,
                                        DType dtype, const float* mean, const float* rstd, int N, int C) {
  const auto [n, lane] = warp_row();
  if (n >= static_cast<size_t>(N)) return;  // the whole warp: warp_sum needs every lane
  const float* x = inp + n * C;
  const float* dy = dout + n * C;
  const float m = mean[n], r = rstd[n];
  float a = 0.0f, b = 0.0f;
#pragma unroll 4
  for (int i = lane; i < C; i += 32) {
    const float norm = (x[i] - m) * r, dnorm = load_param(weight, dtype, i) * dy[i];
    a += dnorm;
    b += dnorm * norm;
  }
  const float dnorm_mean = warp_sum(a) / C, dnorm_norm_mean = warp_sum(b) / C;
  float* dx = dinp + n * C;
#pragma unroll 4
  for (int i = lane; i < C; i += 32) {
    const float norm = (x[i] - m) * r, dnorm = load_param(weight, dtype, i) * dy[i];
    dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
  }
}

// Note [Column sums]: the parameter gradients of the norms and of linear's bias sum a column of
// an (N, C) tensor over its N rows. A block takes kColumnWidth adjacent columns (one 32-byte
// memory sector of each row) and kColumnLanes row lanes: lane y sums rows y, y + kColumnLanes, ...
// in order, then the lanes are summed in a fixed tree. The same bits every run, no atomics, and
// C / kColumnWidth blocks reading N rows each (one thread per column walking N rows, before, took
// 1.7 ms per layernorm on an H200 at N = 8192, C = 768; docs/BENCHMARKS.md "GPU runs"). Blocks
// of 1024 threads: at C = 768 there are only 96 blocks, each of which must keep many loads in
// flight (32 lanes, the first form, took 72 us there: a fifth of the bandwidth).
constexpr int kColumnWidth = 8;
constexpr int kColumnLanes = 128;
const dim3 kColumnBlock(kColumnWidth, kColumnLanes);
unsigned column_sum_blocks(int C) { return static_cast<unsigned>((C + kColumnWidth - 1) / kColumnWidth); }

// Sum of v over the block's row lanes (threadIdx.y) for this thread's column, in a fixed tree; every
// thread of the column gets it. All threads of the block must call it.
__device__ float column_lanes_sum(float v, float (*shared)[kColumnWidth]) {
  shared[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  for (int stride = kColumnLanes / 2; stride > 0; stride /= 2) {
    if (threadIdx.y < stride) shared[threadIdx.y][threadIdx.x] += shared[threadIdx.y + stride][threadIdx.x];
    __syncthreads();
  }
  const float sum = shared[0][threadIdx.x];
  __syncthreads();
  return sum;
}

// dweight[i] += sum_n (inp - mean) rstd dout, dbias[i] += sum_n dout (Note [Column sums]).
__global__ void layernorm_backward_params(float* dweight, float* dbias, const float* dout, const float* inp,
                                          const float* mean, const float* rstd, int N, int C) {
  __shared__ float shared[kColumnLanes][kColumnWidth];
  const int i = blockIdx.x * kColumnWidth + threadIdx.x;
  float dw = 0.0f, db = 0.0f;
  if (i < C)
    for (int n = threadIdx.y; n < N; n += kColumnLanes) {
      const size_t k = static_cast<size_t>(n) * C + i;
      dw += (inp[k] - mean[n]) * rstd[n] * dout[k];
      db += dout[k];
    }
  dw = column_lanes_sum(dw, shared);
  db = column_lanes_sum(db, shared);
  if (i < C && threadIdx.y == 0) {
    if (dweight) dweight[i] += dw;
    if (dbias) dbias[i] += db;
  }
}

// Note [Norms a warp per row].
__global__ void rmsnorm_forward_kernel(void* out, DType out_dtype, float* rstd, const float* inp, const void* weight,
                                       DType dtype, int N, int C, float eps) {
  const auto [n, lane] = warp_row();
  if (n >= static_cast<size_t>(N)) return;  // the whole warp: warp_sum needs every lane
  const float* x = inp + n * C;
  float s = 0.0f;
#pragma unroll 4
  for (int i = lane; i < C; i += 32) s += x[i] * x[i];
  const float r = 1.0f / sqrtf(warp_sum(s) / C + eps);
#pragma unroll 4
  for (int i = lane; i < C; i += 32) store_param(out, out_dtype, n * C + i, x[i] * r * load_param(weight, dtype, i));
  if (lane == 0) rstd[n] = r;
}

// Note [Norms a warp per row].
// With `rounded` (Note [Gradients rounded where they are made], kernels/backend.h) the row's new
// dinp also stored there rounded to rounded_dtype.
__global__ void rmsnorm_backward_rows(float* dinp, const float* dout, const float* inp, const void* weight, DType dtype,
                                      const float* rstd, int N, int C, void* rounded, DType rounded_dtype) {
  const auto [n, lane] = warp_row();
  if (n >= static_cast<size_t>(N)) return;  // the whole warp: warp_sum needs every lane
  const float* x = inp + n * C;
  const float* dy = dout + n * C;
  const float r = rstd[n];
  float d = 0.0f;
#pragma unroll 4
  for (int i = lane; i < C; i += 32) d += load_param(weight, dtype, i) * dy[i] * x[i] * r;
  const float dot = warp_sum(d) / C;
  float* dx = dinp + n * C;
#pragma unroll 4
  for (int i = lane; i < C; i += 32) {
    const float sum = dx[i] + r * (load_param(weight, dtype, i) * dy[i] - x[i] * r * dot);
    dx[i] = sum;
    if (rounded) store_param(rounded, rounded_dtype, n * C + i, sum);
  }
}

__global__ void rmsnorm_backward_params(float* dweight, const float* dout, const float* inp, const float* rstd, int N,
                                        int C) {
  __shared__ float shared[kColumnLanes][kColumnWidth];
  const int i = blockIdx.x * kColumnWidth + threadIdx.x;
  float dw = 0.0f;
  if (i < C)
    for (int n = threadIdx.y; n < N; n += kColumnLanes) {
      const size_t k = static_cast<size_t>(n) * C + i;
      dw += inp[k] * rstd[n] * dout[k];
    }
  dw = column_lanes_sum(dw, shared);
  if (i < C && threadIdx.y == 0) dweight[i] += dw;
}

// Note [Column sums in two passes]: where the rows are whole 16-byte vectors (C % 4 == 0, every
// array 16-byte aligned), the column sums are two kernels instead of Note [Column sums]' one. The
// first cuts the (N, C) tensor into blocks of kSumRowsPerBlock rows by kSumColumns columns: a
// warp reads 512 contiguous bytes of a row (a lane's four columns by one 16-byte load), its eight
// warps take rows r, r + 8, ... of the block's rows in order, and the warps' sums are added in
// warp order into one partial per (row block, column). The second adds a column's partials in
// row-block order. The same bits every run and no atomics, as before, but every load is part of
// a whole row segment and the grid has (N / 64) x (C / 128) blocks (768 at W5's N = 8192, C =
// 768) where the first form had C / 8 (96) blocks of 1024 threads each reading 32-byte pieces
// of 8192 rows. The sums are in another order than the one-kernel form's: other bits, the same
// tolerance. `Rows` supplies a row's K contributions to four columns (Bias, Norm and RmsNorm
// below); the bias's also stores a rounded copy of the row as it passes (Note [Rounded on the
// way], kernels.h).
constexpr int kSumWarps = 8;
constexpr int kSumColumns = 4 * 32;
constexpr int kSumRowsPerBlock = kColumnSumRowsPerBlock;  // sizes.h
int row_blocks(int N) { return column_sum_row_blocks(N); }

template <int K, typename Rows>
__global__ void __launch_bounds__(32 * kSumWarps) column_partials_kernel(float* partials, Rows rows, int N, int C) {
  __shared__ __align__(16) float shared[kSumWarps][K][kSumColumns];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int c0 = blockIdx.x * kSumColumns + 4 * lane;  // C % 4 == 0: c0 < C means c0 + 3 < C
  const int r0 = blockIdx.y * kSumRowsPerBlock, r_end = min(N, r0 + kSumRowsPerBlock);
  float acc[K][4] = {};
  if (c0 < C)
    for (int r = r0 + warp; r < r_end; r += kSumWarps) rows.add(r, c0, acc);
#pragma unroll
  for (int k = 0; k < K; ++k)  // one 16-byte store a lane: no bank conflicts
    *reinterpret_cast<float4*>(&shared[warp][k][4 * lane]) = make_float4(acc[k][0], acc[k][1], acc[k][2], acc[k][3]);
  __syncthreads();
  for (int i = threadIdx.x; i < K * kSumColumns; i += blockDim.x) {
    const int k = i / kSumColumns, column = i % kSumColumns, c = blockIdx.x * kSumColumns + column;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kSumWarps; ++w) sum += shared[w][k][column];
    if (c < C) partials[(static_cast<size_t>(blockIdx.y) * K + k) * C + c] = sum;
  }
}

// out_k[c] (+)= the sum of column c's partials k over the row blocks (out_k may be null), in a fixed
// order: a block takes 32 columns, a lane one column (the warp's loads are one 128-byte row of
// partials), warp w adds row blocks w, w + kSumWarps, ... in order, then warp 0 adds the warps'
// sums in warp order. (One thread per column adding every row block in turn waits on 128 loads one
// after another at W5's N.)
template <int K>
__global__ void __launch_bounds__(32 * kSumWarps) column_finish_kernel(float* out0, float* out1, const float* partials,
                                                                       int blocks, int C, bool accumulate) {
  __shared__ float shared[kSumWarps][K][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, c = blockIdx.x * 32 + lane;
  float acc[K] = {};
  if (c < C)
#pragma unroll 4
    for (int j = warp; j < blocks; j += kSumWarps)
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] += partials[(static_cast<size_t>(j) * K + k) * C + c];
#pragma unroll
  for (int k = 0; k < K; ++k) shared[warp][k][lane] = acc[k];
  __syncthreads();
  if (warp != 0 || c >= C) return;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float* out = k == 0 ? out0 : out1;
    if (out == nullptr) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kSumWarps; ++w) sum += shared[w][k][lane];
    out[c] = accumulate ? out[c] + sum : sum;
  }
}

template <int K, typename Rows>
void column_sums(float* out0, float* out1, float* partials, Rows rows, int N, int C, bool accumulate,
                 cudaStream_t stream) {
  ZERONE_ASSERT(N > 0 && C > 0, "column sums of an empty ", N, " x ", C, " tensor");
  const dim3 grid(static_cast<unsigned>((C + kSumColumns - 1) / kSumColumns), static_cast<unsigned>(row_blocks(N)));
  ZERONE_LAUNCH(grid, 32 * kSumWarps, 0, stream, column_partials_kernel<K, Rows>)(partials, rows, N, C);
  ZERONE_CUDA_LAUNCHED();
  ZERONE_LAUNCH(static_cast<unsigned>((C + 31) / 32), 32 * kSumWarps, 0, stream, column_finish_kernel<K>)(
      out0, out1, partials, row_blocks(N), C, accumulate);
  ZERONE_CUDA_LAUNCHED();
}

// Whether an (N, C) column sum can take the two-pass form: whole 16-byte rows (C % 4 == 0, the
// arrays 16-byte aligned) and a grid the launch allows (at most 65535 row blocks: N < 4.19M).
bool two_pass_column_sums(int N, int C, std::initializer_list<const void*> arrays) {
  if (N <= 0 || C <= 0 || C % 4 != 0 || row_blocks(N) > 65535) return false;
  for (const void* p : arrays)
    if (!aligned_to(p, 16)) return false;
  return true;
}

// Linear's bias: sum dout; with `rounded`, store dout rounded to kRounded on the way.
template <DType kRounded>
struct BiasRows {
  const float* dout;
  void* rounded;  // may be null
  int C;
  __device__ void add(int r, int c0, float (&acc)[1][4]) const {
    const size_t i = static_cast<size_t>(r) * C + c0;
    const float4 d = *reinterpret_cast<const float4*>(dout + i);
    acc[0][0] += d.x, acc[0][1] += d.y, acc[0][2] += d.z, acc[0][3] += d.w;
    if (rounded) store4<kRounded>(rounded, i / 4, d.x, d.y, d.z, d.w);
  }
};
// LayerNorm: dweight sums (inp - mean) rstd dout, dbias sums dout.
struct NormRows {
  const float *dout, *inp, *mean, *rstd;
  int C;
  __device__ void add(int r, int c0, float (&acc)[2][4]) const {
    const size_t i = static_cast<size_t>(r) * C + c0;
    const float4 d = *reinterpret_cast<const float4*>(dout + i), x = *reinterpret_cast<const float4*>(inp + i);
    const float m = mean[r], s = rstd[r];
    acc[0][0] += (x.x - m) * s * d.x, acc[0][1] += (x.y - m) * s * d.y;
    acc[0][2] += (x.z - m) * s * d.z, acc[0][3] += (x.w - m) * s * d.w;
    acc[1][0] += d.x, acc[1][1] += d.y, acc[1][2] += d.z, acc[1][3] += d.w;
  }
};
// RMSNorm: dweight sums inp rstd dout.
struct RmsNormRows {
  const float *dout, *inp, *rstd;
  int C;
  __device__ void add(int r, int c0, float (&acc)[1][4]) const {
    const size_t i = static_cast<size_t>(r) * C + c0;
    const float4 d = *reinterpret_cast<const float4*>(dout + i), x = *reinterpret_cast<const float4*>(inp + i);
    const float s = rstd[r];
    acc[0][0] += x.x * s * d.x, acc[0][1] += x.y * s * d.y, acc[0][2] += x.z * s * d.z, acc[0][3] += x.w * s * d.w;
  }
};

// ---------------------------------------------------------------- linear's bias

__global__ void add_bias_kernel(float* out, const void* bias, DType dtype, int N, int OC) {
  const size_t total = static_cast<size_t>(N) * OC;
  ZERONE_GRID_STRIDE(i, total) out[i] += load_param(bias, dtype, i % OC);
}

__global__ void bias_backward_kernel(float* dbias, const float* dout, int N, int OC, bool accumulate) {
  __shared__ float shared[kColumnLanes][kColumnWidth];
  const int o = blockIdx.x * kColumnWidth + threadIdx.x;
  float s = 0.0f;
  if (o < OC)
    for (int n = threadIdx.y; n < N; n += kColumnLanes) s += dout[static_cast<size_t>(n) * OC + o];
  s = column_lanes_sum(s, shared);
  if (o < OC && threadIdx.y == 0) dbias[o] = accumulate ? dbias[o] + s : s;
}

// ---------------------------------------------------------------- attention
// qkv rows (R = (NH + 2 NKV) hs): query head h at h*hs, key head kv at (NH + kv)*hs, value head kv
// at (NH + NKV + kv)*hs; query head h reads kv head h / (NH / NKV). att (B, NH, T, T).

struct AttShape {
  int B, T, NH, NKV, hs;
  __device__ size_t R() const { return static_cast<size_t>(NH + 2 * NKV) * hs; }
  __device__ int kv_of(int h) const { return h / (NH / NKV); }
  __device__ size_t q(int b, int t, int h) const { return (static_cast<size_t>(b) * T + t) * R() + static_cast<size_t>(h) * hs; }
  __device__ size_t k(int b, int t, int kv) const { return (static_cast<size_t>(b) * T + t) * R() + static_cast<size_t>(NH + kv) * hs; }
  __device__ size_t v(int b, int t, int kv) const { return (static_cast<size_t>(b) * T + t) * R() + static_cast<size_t>(NH + NKV + kv) * hs; }
  __device__ size_t o(int b, int t, int h) const { return (static_cast<size_t>(b) * T + t) * NH * hs + static_cast<size_t>(h) * hs; }
  // Element i of a (B, T, NH, hs) tensor as (b, t, h, d).
  __device__ void decode(size_t i, int& b, int& t, int& h, int& d) const {
    d = static_cast<int>(i % hs), h = static_cast<int>(i / hs % NH);
    t = static_cast<int>(i / hs / NH % T), b = static_cast<int>(i / hs / NH / T);
  }
};

__device__ float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// One block per (b, h, t) row: scores of the row, causal softmax, zeros after t.
__global__ void attention_probs_kernel(float* att, const float* qkv, AttShape s, float scale) {
  __shared__ float shared[kThreads];
  const size_t row = blockIdx.x;
  const int t = static_cast<int>(row % s.T), h = static_cast<int>(row / s.T % s.NH), b = static_cast<int>(row / s.T / s.NH);
  float* r = att + row * s.T;
  const float* q = qkv + s.q(b, t, h);
  float mx = -1e30f;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const float x = scale * dot(q, qkv + s.k(b, t2, s.kv_of(h)), s.hs);
    r[t2] = x;
    mx = fmaxf(mx, x);
  }
  mx = block_max(mx, shared);
  float sum = 0.0f;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const float e = expf(r[t2] - mx);
    r[t2] = e;
    sum += e;
  }
  const float inv = 1.0f / block_sum(sum, shared);
  for (int t2 = threadIdx.x; t2 < s.T; t2 += blockDim.x) r[t2] = t2 <= t ? r[t2] * inv : 0.0f;
}

// out (b, t, h, d) = sum over t2 <= t of P (b, h, t, t2) V (b, t2, kv, d).
__global__ void attention_out_kernel(float* out, const float* att, const float* qkv, AttShape s) {
  const size_t total = static_cast<size_t>(s.B) * s.T * s.NH * s.hs;
  ZERONE_GRID_STRIDE(i, total) {
    int b, t, h, d;
    s.decode(i, b, t, h, d);
    const float* p = att + ((static_cast<size_t>(b) * s.NH + h) * s.T + t) * s.T;
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; ++t2) acc += p[t2] * qkv[s.v(b, t2, s.kv_of(h)) + d];
    out[s.o(b, t, h) + d] = acc;
  }
}

// One block per row: dP = dO V^T, then dS = P (dP - sum_j P dP) (zero after t) into datt.
__global__ void attention_dscores_kernel(float* datt, const float* att, const float* dout, const float* qkv, AttShape s) {
  __shared__ float shared[kThreads];
  const size_t row = blockIdx.x;
  const int t = static_cast<int>(row % s.T), h = static_cast<int>(row / s.T % s.NH), b = static_cast<int>(row / s.T / s.NH);
  const float* p = att + row * s.T;
  float* d = datt + row * s.T;
  const float* dy = dout + s.o(b, t, h);
  float acc = 0.0f;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const float x = dot(dy, qkv + s.v(b, t2, s.kv_of(h)), s.hs);
    d[t2] = x;
    acc += p[t2] * x;
  }
  const float pd = block_sum(acc, shared);
  for (int t2 = threadIdx.x; t2 < s.T; t2 += blockDim.x) d[t2] = t2 <= t ? p[t2] * (d[t2] - pd) : 0.0f;
}

// dQ (b, t, h, d) = scale * sum over t2 <= t of dS K.
__global__ void attention_dq_kernel(float* dqkv, const float* datt, const float* qkv, AttShape s, float scale) {
  const size_t total = static_cast<size_t>(s.B) * s.T * s.NH * s.hs;
  ZERONE_GRID_STRIDE(i, total) {
    int b, t, h, d;
    s.decode(i, b, t, h, d);
    const float* ds = datt + ((static_cast<size_t>(b) * s.NH + h) * s.T + t) * s.T;
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; ++t2) acc += ds[t2] * qkv[s.k(b, t2, s.kv_of(h)) + d];
    dqkv[s.q(b, t, h) + d] = scale * acc;
  }
}

// dK (b, t2, kv, d) = scale * sum over the group's heads and t >= t2 of dS Q;
// dV (b, t2, kv, d) = sum over the same of P dO.
__global__ void attention_dkv_kernel(float* dqkv, const float* datt, const float* att, const float* dout,
                                     const float* qkv, AttShape s, float scale) {
  const size_t total = static_cast<size_t>(s.B) * s.T * s.NKV * s.hs;
  const int G = s.NH / s.NKV;
  ZERONE_GRID_STRIDE(i, total) {
    const int d = static_cast<int>(i % s.hs), kv = static_cast<int>(i / s.hs % s.NKV);
    const int t2 = static_cast<int>(i / s.hs / s.NKV % s.T), b = static_cast<int>(i / s.hs / s.NKV / s.T);
    float dk = 0.0f, dv = 0.0f;
    for (int g = 0; g < G; ++g) {
      const int h = kv * G + g;
      const size_t head = (static_cast<size_t>(b) * s.NH + h) * s.T;
      for (int t = t2; t < s.T; ++t) {
        const size_t e = (head + t) * s.T + t2;
        dk += datt[e] * qkv[s.q(b, t, h) + d];
        dv += att[e] * dout[s.o(b, t, h) + d];
      }
    }
    dqkv[s.k(b, t2, kv) + d] = scale * dk;
    dqkv[s.v(b, t2, kv) + d] = dv;
  }
}

// ---------------------------------------------------------------- rope, swiglu, gelu, residual

// Pair i of a head vector at position t, (a, b) = elements (i, i + hs/2), rotated by the angle
// sign * t * inv_freq[i]. As Hugging Face: the angle t * inv_freq is formed in f32, then cos and
// sin of it.
__device__ __forceinline__ float2 rope_pair(float a, float b, int t, const float* inv_freq, int i, float sign) {
  const float angle = static_cast<float>(t) * inv_freq[i];
  const float c = cosf(angle), sn = sign * sinf(angle);
  return make_float2(a * c - b * sn, b * c + a * sn);
}

__global__ void rope_kernel(void* x, DType dtype, const float* inv_freq, int B, int T, int stride, int heads, int hs,
                            float sign) {
  const int half = hs / 2;
  const size_t total = static_cast<size_t>(B) * T * heads * half;
  ZERONE_GRID_STRIDE(e, total) {
    const int i = static_cast<int>(e % half), h = static_cast<int>(e / half % heads);
    const size_t bt = e / half / heads;
    const size_t v = bt * stride + static_cast<size_t>(h) * hs;  // the head's first element
    const float2 r = rope_pair(load_param(x, dtype, v + i), load_param(x, dtype, v + i + half),
                               static_cast<int>(bt % T), inv_freq, i, sign);
    store_param(x, dtype, v + i, r.x);
    store_param(x, dtype, v + i + half, r.y);
  }
}

// rope_kernel's backward rotation out of place into a 16-bit copy of every row (Note [Gradients
// rounded where they are made], kernels/backend.h): a thread per pair of elements of a row, the
// pairs (i, i + hs/2) of the first `heads` heads rotated, the rest of the row (its value heads)
// two neighbours at a time, each stored rounded to out_dtype; dx is only read.
__global__ void rope_rounded_kernel(void* out, DType out_dtype, const float* dx, const float* inv_freq, int B, int T,
                                    int stride, int heads, int hs, float sign) {
  const int half = hs / 2, pairs = stride / 2, rotated = heads * half;
  const size_t total = static_cast<size_t>(B) * T * pairs;
  ZERONE_GRID_STRIDE(e, total) {
    const int p = static_cast<int>(e % pairs);
    const size_t bt = e / pairs, row = bt * stride;
    if (p >= rotated) {  // past the rotated heads: elements 2q and 2q + 1 of the rest
      const size_t v = row + static_cast<size_t>(heads) * hs + 2 * static_cast<size_t>(p - rotated);
      store_param(out, out_dtype, v, dx[v]);
      store_param(out, out_dtype, v + 1, dx[v + 1]);
      continue;
    }
    const int i = p % half, h = p / half;
    const size_t v = row + static_cast<size_t>(h) * hs;
    const float2 r = rope_pair(dx[v + i], dx[v + i + half], static_cast<int>(bt % T), inv_freq, i, sign);
    store_param(out, out_dtype, v + i, r.x);
    store_param(out, out_dtype, v + i + half, r.y);
  }
}

// inp (N, 2F) in inp_dtype (Note [The MLP's hidden activation in the compute dtype], kernels/
// backend.h): load_param widens it exactly.
__global__ void swiglu_forward_kernel(void* out, DType out_dtype, const void* inp, DType inp_dtype, int N, int F) {
  const size_t total = static_cast<size_t>(N) * F;
  ZERONE_GRID_STRIDE(e, total) {
    const size_t n = e / F, i = e % F;
    const float g = load_param(inp, inp_dtype, n * 2 * F + i), up = load_param(inp, inp_dtype, n * 2 * F + F + i);
    store_param(out, out_dtype, e, g / (1.0f + expf(-g)) * up);
  }
}

__global__ void swiglu_backward_kernel(void* dinp, DType dinp_dtype, const float* dout, const void* inp,
                                       DType inp_dtype, int N, int F) {
  const size_t total = static_cast<size_t>(N) * F;
  ZERONE_GRID_STRIDE(e, total) {
    const size_t n = e / F, i = e % F;
    const float g = load_param(inp, inp_dtype, n * 2 * F + i), up = load_param(inp, inp_dtype, n * 2 * F + F + i);
    const float dy = dout[e];
    const float sig = 1.0f / (1.0f + expf(-g));
    store_param(dinp, dinp_dtype, n * 2 * F + i, dy * up * sig * (1.0f + g * (1.0f - sig)));
    store_param(dinp, dinp_dtype, n * 2 * F + F + i, dy * g * sig);
  }
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x)));
}

// x in inp_dtype (Note [The MLP's hidden activation in the compute dtype], kernels/backend.h).
__global__ void gelu_forward_kernel(void* out, DType out_dtype, const void* inp, DType inp_dtype, size_t n) {
  ZERONE_GRID_STRIDE(i, n) store_param(out, out_dtype, i, gelu(load_param(inp, inp_dtype, i)));
}

// Four elements a thread-step (load4, store4), each the same function as above: GELU's forward
// moved 1.8 TB/s one element at a time (docs/BENCHMARKS.md, call 7's profile).
template <DType kIn, DType kOut>
__global__ void gelu_forward4_kernel(void* out, const void* inp, size_t n4) {
  ZERONE_GRID_STRIDE(i, n4) {
    const float4 x = load4<kIn>(inp, i);
    store4<kOut>(out, i, gelu(x.x), gelu(x.y), gelu(x.z), gelu(x.w));
  }
}

// GELU's derivative at x.
__device__ __forceinline__ float gelu_slope(float x) {
  const float th = tanhf(kGeluScale * (x + 0.044715f * x * x * x));
  const float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

struct GeluBackward {  // (x, dy) -> dx
  __device__ float operator()(float x, float dy) const { return gelu_slope(x) * dy; }
};

// dx = gelu'(x) dy with x in a 16-bit kIn (the f32 case is launch_binary's): one element a
// thread-step, or four (load4; 16-byte dy and dx) where the caller found them aligned. dx may be dy.
template <DType kIn>
__global__ void gelu_backward_kernel(float* dinp, const void* inp, const float* dout, size_t n) {
  ZERONE_GRID_STRIDE(i, n) dinp[i] = gelu_slope(load_param(inp, kIn, i)) * dout[i];
}
template <DType kIn>
__global__ void gelu_backward4_kernel(float4* dinp, const void* inp, const float4* dout, size_t n4) {
  ZERONE_GRID_STRIDE(i, n4) {
    const float4 x = load4<kIn>(inp, i), dy = dout[i];
    dinp[i] = make_float4(gelu_slope(x.x) * dy.x, gelu_slope(x.y) * dy.y, gelu_slope(x.z) * dy.z,
                          gelu_slope(x.w) * dy.w);
  }
}

// Note [GELU's backward in the linear's] (kernels/backend.h): the bias's column sums (BiasRows) over
// dout = gelu'(pre) dgelu, formed as gelu_backward4_kernel forms it, each value summed and stored
// rounded as BiasRows sums and rounds the stored dout: the same bits as gelu_backward, then
// bias_backward, without dout in f32 written and read again.
template <DType kPre, DType kRounded>
struct GeluBiasRows {
  const float* dgelu;
  const void* pre;
  void* rounded;
  int C;
  __device__ void add(int r, int c0, float (&acc)[1][4]) const {
    const size_t i = static_cast<size_t>(r) * C + c0;
    const float4 dy = *reinterpret_cast<const float4*>(dgelu + i), x = load4<kPre>(pre, i / 4);
    // Rounded products, as gelu_backward stores them: not contracted into the sums below.
    const float d0 = __fmul_rn(gelu_slope(x.x), dy.x), d1 = __fmul_rn(gelu_slope(x.y), dy.y),
                d2 = __fmul_rn(gelu_slope(x.z), dy.z), d3 = __fmul_rn(gelu_slope(x.w), dy.w);
    acc[0][0] += d0, acc[0][1] += d1, acc[0][2] += d2, acc[0][3] += d3;
    store4<kRounded>(rounded, i / 4, d0, d1, d2, d3);
  }
};


// ---------------------------------------------------------------- cross-entropy (one block per row)

// One pass over the row (the online softmax: each thread keeps its running maximum and its sum of
// exp(x - maximum), rescaled when the maximum grows), then the threads' pairs are combined in a
// fixed tree: half the reads of a max pass followed by a sum pass.
__device__ __forceinline__ void online_softmax_add(float x, float& m, float& s) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;
    m = x;
  } else {
    s += expf(x - m);
  }
}

// The row's combination of the threads' (m, s) pairs: lse and the loss of row n, whose target's
// logit is `target_logit`.
__device__ __forceinline__ void crossentropy_finish(float m, float s, float target_logit, size_t n, float* losses,
                                                    float* lse, float* shared) {
  const float mx = block_max(m, shared);
  s *= expf(m - mx);
  const float l = mx + logf(block_sum(s, shared));
  if (threadIdx.x == 0) lse[n] = l, losses[n] = l - target_logit;
}

// logits (N, Vp) of kIn (Note [Logits in the compute dtype], kernels/backend.h), widened to f32.
template <DType kIn>
__global__ void crossentropy_forward_kernel(float* losses, float* lse, const void* logits, const int32_t* targets,
                                            int V, int Vp) {
  __shared__ float shared[kThreads];
  const size_t n = blockIdx.x, row = n * Vp;
  float m = -1e30f, s = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) online_softmax_add(load_param(logits, kIn, row + v), m, s);
  crossentropy_finish(m, s, load_param(logits, kIn, row + targets[n]), n, losses, lse, shared);
}

// The same four elements a thread-step (rows of Vp % 4 == 0 elements, aligned for load4): thread t
// takes elements 4t .. 4t+3, 4(t + blockDim.x) .., then the last V % 4 one at a time. The forward
// read its 1.65 GB of W5 f32 logits at 2.2 TB/s one float a thread-step (docs/BENCHMARKS.md, call 7).
template <DType kIn>
__global__ void crossentropy_forward4_kernel(float* losses, float* lse, const void* logits, const int32_t* targets,
                                             int V, int Vp) {
  __shared__ float shared[kThreads];
  const size_t n = blockIdx.x, row = n * Vp;
  float m = -1e30f, s = 0.0f;
  const int V4 = V / 4;
#pragma unroll 2
  for (int j = threadIdx.x; j < V4; j += blockDim.x) {
    const float4 x = load4<kIn>(logits, row / 4 + j);
    online_softmax_add(x.x, m, s);
    online_softmax_add(x.y, m, s);
    online_softmax_add(x.z, m, s);
    online_softmax_add(x.w, m, s);
  }
  for (int v = 4 * V4 + threadIdx.x; v < V; v += blockDim.x) online_softmax_add(load_param(logits, kIn, row + v), m, s);
  crossentropy_finish(m, s, load_param(logits, kIn, row + targets[n]), n, losses, lse, shared);
}

// The gradient of one logit: (softmax - onehot(target)) * dloss, 0 in the padded columns.
__device__ __forceinline__ float crossentropy_grad(float logit, int v, int V, int target, float l, float dloss) {
  float g = v < V ? expf(logit - l) * dloss : 0.0f;
  if (v == target) g -= dloss;
  return g;
}

template <DType kIn>
__global__ void crossentropy_backward_kernel(void* dlogits, DType dlogits_dtype, const void* logits, const float* lse,
                                             const int32_t* targets, float dloss, int N, int V, int Vp) {
  const size_t total = static_cast<size_t>(N) * Vp;
  ZERONE_GRID_STRIDE(e, total) {
    const size_t n = e / Vp;
    const float g = crossentropy_grad(load_param(logits, kIn, e), static_cast<int>(e % Vp), V, targets[n], lse[n], dloss);
    store_param(dlogits, dlogits_dtype, e, g);  // in place: the element was read just above
  }
}

// The same, four elements of a row a thread-step (Vp % 4 == 0: the four share a row).
template <DType kIn, DType kOut>
__global__ void crossentropy_backward4_kernel(void* dlogits, const void* logits, const float* lse,
                                              const int32_t* targets, float dloss, int N, int V, int Vp) {
  const size_t total4 = static_cast<size_t>(N) * Vp / 4;
  ZERONE_GRID_STRIDE(e4, total4) {
    const size_t n = e4 * 4 / Vp;
    const int v0 = static_cast<int>(e4 * 4 % Vp), target = targets[n];
    const float l = lse[n];
    const float4 x = load4<kIn>(logits, e4);
    store4<kOut>(dlogits, e4, crossentropy_grad(x.x, v0, V, target, l, dloss),
                 crossentropy_grad(x.y, v0 + 1, V, target, l, dloss), crossentropy_grad(x.z, v0 + 2, V, target, l, dloss),
                 crossentropy_grad(x.w, v0 + 3, V, target, l, dloss));
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const void* wte, const void* wpe, DType param_dtype, int B,
                       int T, int C, cudaStream_t stream) {
  ZERONE_LAUNCH(grid_for(static_cast<size_t>(B) * T * C), kThreads, 0, stream, embedding_forward_kernel)(out, tokens, wte, wpe,
                                                                                             param_dtype, B, T, C);
  ZERONE_CUDA_LAUNCHED();
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                        cudaStream_t stream) {
  const int BT = B * T;
  if (BT == 0 || C == 0) return;
  ZERONE_LAUNCH(BT, kThreads, 0, stream, embedding_backward_wte_kernel)(dwte, dout, tokens, BT, C);
  ZERONE_CUDA_LAUNCHED();
  if (dwpe) {
    ZERONE_LAUNCH(grid_for(static_cast<size_t>(T) * C), kThreads, 0, stream, embedding_backward_wpe_kernel)(dwpe, dout, B, T, C);
    ZERONE_CUDA_LAUNCHED();
  }
}

void layernorm_forward(void* out, DType out_dtype, float* mean, float* rstd, const float* inp, const void* weight,
                       const void* bias, DType param_dtype, int N, int C, cudaStream_t stream) {
  if (N == 0) return;
  ZERONE_LAUNCH(row_warp_blocks(N), kThreads, 0, stream, layernorm_forward_kernel)(out, out_dtype, mean, rstd, inp, weight, bias,
                                                                         param_dtype, N, C);
  ZERONE_CUDA_LAUNCHED();
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const void* weight, DType param_dtype, const float* mean, const float* rstd, int N, int C,
                        float* partials, cudaStream_t stream) {
  if (N == 0) return;
  ZERONE_LAUNCH(row_warp_blocks(N), kThreads, 0, stream, layernorm_backward_rows)(dinp, dout, inp, weight, param_dtype, mean, rstd,
                                                                        N, C);
  ZERONE_CUDA_LAUNCHED();
  if (two_pass_column_sums(N, C, {dout, inp})) {  // Note [Column sums in two passes]
    column_sums<2>(dweight, dbias, partials, NormRows{dout, inp, mean, rstd, C}, N, C, /*accumulate=*/true, stream);
    return;
  }
  ZERONE_LAUNCH(column_sum_blocks(C), kColumnBlock, 0, stream, layernorm_backward_params)(dweight, dbias, dout, inp, mean, rstd, N, C);
  ZERONE_CUDA_LAUNCHED();
}

void rmsnorm_forward(void* out, DType out_dtype, float* rstd, const float* inp, const void* weight, DType param_dtype,
                     int N, int C, float eps, cudaStream_t stream) {
  if (N == 0) return;
  ZERONE_LAUNCH(row_warp_blocks(N), kThreads, 0, stream, rmsnorm_forward_kernel)(out, out_dtype, rstd, inp, weight, param_dtype, N,
                                                                       C, eps);
  ZERONE_CUDA_LAUNCHED();
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const void* weight,
                      DType param_dtype, const float* rstd, int N, int C, void* dinp_rounded, DType rounded_dtype,
                      float* partials, cudaStream_t stream) {
  if (N == 0) return;
  ZERONE_LAUNCH(row_warp_blocks(N), kThreads, 0, stream, rmsnorm_backward_rows)(dinp, dout, inp, weight, param_dtype, rstd, N, C,
                                                                      dinp_rounded, rounded_dtype);
  ZERONE_CUDA_LAUNCHED();
  if (two_pass_column_sums(N, C, {dout, inp})) {  // Note [Column sums in two passes]
    column_sums<1>(dweight, nullptr, partials, RmsNormRows{dout, inp, rstd, C}, N, C, /*accumulate=*/true, stream);
    return;
  }
  ZERONE_LAUNCH(column_sum_blocks(C), kColumnBlock, 0, stream, rmsnorm_backward_params)(dweight, dout, inp, rstd, N, C);
  ZERONE_CUDA_LAUNCHED();
}

void add_bias(float* out, const void* bias, DType param_dtype, int N, int OC, cudaStream_t stream) {
  ZERONE_LAUNCH(grid_for(static_cast<size_t>(N) * OC), kThreads, 0, stream, add_bias_kernel)(out, bias, param_dtype, N, OC);
  ZERONE_CUDA_LAUNCHED();
}

void bias_backward(float* dbias, const float* dout, int N, int OC, bool accumulate, void* rounded, DType rounded_dtype,
                   float* partials, cudaStream_t stream) {
  if (OC == 0) return;
  ZERONE_ASSERT(rounded == nullptr || rounded_dtype != DType::f32, "the rounded copy of dout is 16-bit");
  const bool rounded_aligned = rounded == nullptr || aligned4(rounded, rounded_dtype);
  if (two_pass_column_sums(N, OC, {dout}) && rounded_aligned) {  // Note [Column sums in two passes]
    if (rounded_dtype == DType::f16)
      column_sums<1>(dbias, nullptr, partials, BiasRows<DType::f16>{dout, rounded, OC}, N, OC, accumulate, stream);
    else
      column_sums<1>(dbias, nullptr, partials, BiasRows<DType::bf16>{dout, rounded, OC}, N, OC, accumulate, stream);
    return;
  }
  ZERONE_LAUNCH(column_sum_blocks(OC), kColumnBlock, 0, stream, bias_backward_kernel)(dbias, dout, N, OC, accumulate);
  ZERONE_CUDA_LAUNCHED();
  if (rounded) convert(rounded, rounded_dtype, dout, DType::f32, static_cast<size_t>(N) * OC, stream);
}

void gqa_attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int NKV, int hs,
                           cudaStream_t stream) {
  ZERONE_ASSERT(NKV >= 1 && NH % NKV == 0, "NH ", NH, " is not a multiple of NKV ", NKV);
  const AttShape s{B, T, NH, NKV, hs};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t rows = static_cast<size_t>(B) * NH * T;
  if (rows == 0) return;
  ZERONE_LAUNCH(static_cast<unsigned>(rows), kThreads, 0, stream, attention_probs_kernel)(att, qkv, s, scale);
  ZERONE_CUDA_LAUNCHED();
  ZERONE_LAUNCH(grid_for(rows * hs), kThreads, 0, stream, attention_out_kernel)(out, att, qkv, s);
  ZERONE_CUDA_LAUNCHED();
}

void gqa_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, float* datt, int B,
                            int T, int NH, int NKV, int hs, cudaStream_t stream) {
  ZERONE_ASSERT(NKV >= 1 && NH % NKV == 0, "NH ", NH, " is not a multiple of NKV ", NKV);
  const AttShape s{B, T, NH, NKV, hs};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t rows = static_cast<size_t>(B) * NH * T;
  if (rows == 0) return;
  ZERONE_LAUNCH(static_cast<unsigned>(rows), kThreads, 0, stream, attention_dscores_kernel)(datt, att, dout, qkv, s);
  ZERONE_CUDA_LAUNCHED();
  ZERONE_LAUNCH(grid_for(rows * hs), kThreads, 0, stream, attention_dq_kernel)(dqkv, datt, qkv, s, scale);
  ZERONE_CUDA_LAUNCHED();
  ZERONE_LAUNCH(grid_for(static_cast<size_t>(B) * T * NKV * hs), kThreads, 0, stream, attention_dkv_kernel)(dqkv, datt, att, dout,
                                                                                                 qkv, s, scale);
  ZERONE_CUDA_LAUNCHED();
}

void rope_rotate(void* x, DType dtype, const float* inv_freq, int B, int T, int stride, int heads, int hs, float sign,
                 cudaStream_t stream) {
  ZERONE_ASSERT(hs % 2 == 0, "rotary head size ", hs, " is odd");
  ZERONE_LAUNCH(grid_for(static_cast<size_t>(B) * T * heads * (hs / 2)), kThreads, 0, stream, rope_kernel)(
      x, dtype, inv_freq, B, T, stride, heads, hs, sign);
  ZERONE_CUDA_LAUNCHED();
}

void rope_backward_rounded(void* out, DType out_dtype, const float* dx, const float* inv_freq, int B, int T, int stride,
                           int heads, int hs, cudaStream_t stream) {
  ZERONE_ASSERT(hs % 2 == 0 && stride % 2 == 0, "rotary head size ", hs, " or row of ", stride, " is odd");
  ZERONE_LAUNCH(grid_for(static_cast<size_t>(B) * T * (stride / 2)), kThreads, 0, stream, rope_rounded_kernel)(
      out, out_dtype, dx, inv_freq, B, T, stride, heads, hs, -1.0f);
  ZERONE_CUDA_LAUNCHED();
}

void swiglu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, int N, int F, cudaStream_t stream) {
  ZERONE_LAUNCH(grid_for(static_cast<size_t>(N) * F), kThreads, 0, stream, swiglu_forward_kernel)(out, out_dtype, inp, inp_dtype,
                                                                                       N, F);
  ZERONE_CUDA_LAUNCHED();
}

void swiglu_backward(void* dinp, DType dinp_dtype, const float* dout, const void* inp, DType inp_dtype, int N, int F,
                     cudaStream_t stream) {
  ZERONE_LAUNCH(grid_for(static_cast<size_t>(N) * F), kThreads, 0, stream, swiglu_backward_kernel)(dinp, dinp_dtype, dout, inp,
                                                                                        inp_dtype, N, F);
  ZERONE_CUDA_LAUNCHED();
}

void gelu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (n % 4 == 0 && aligned4(inp, inp_dtype) && aligned4(out, out_dtype)) {
    const size_t n4 = n / 4;
    with_dtype(inp_dtype, [&](auto in) {
      with_dtype(out_dtype, [&](auto o) {
        ZERONE_LAUNCH(grid_for(n4), kThreads, 0, stream, gelu_forward4_kernel<decltype(in)::value, decltype(o)::value>)(out, inp, n4);
      });
    });
  } else {
    ZERONE_LAUNCH(grid_for(n), kThreads, 0, stream, gelu_forward_kernel)(out, out_dtype, inp, inp_dtype, n);
  }
  ZERONE_CUDA_LAUNCHED();
}

void gelu_backward(float* dinp, const void* inp, DType inp_dtype, const float* dout, size_t n, cudaStream_t stream) {
  if (inp_dtype == DType::f32) return launch_binary<GeluBackward>(dinp, static_cast<const float*>(inp), dout, n, stream);
  if (n == 0) return;
  const bool by4 = f32_vectorizable4(n, {dinp, dout}) && aligned4(inp, inp_dtype);
  with_dtype(inp_dtype, [&](auto in) {
    constexpr DType kIn = decltype(in)::value;
    if (by4)
      ZERONE_LAUNCH(grid_for(n / 4), kThreads, 0, stream, gelu_backward4_kernel<kIn>)(
          reinterpret_cast<float4*>(dinp), inp, reinterpret_cast<const float4*>(dout), n / 4);
    else
      ZERONE_LAUNCH(grid_for(n), kThreads, 0, stream, gelu_backward_kernel<kIn>)(dinp, inp, dout, n);
  });
  ZERONE_CUDA_LAUNCHED();
}

bool gelu_bias_backward(float* dbias, const float* dgelu, const void* pre, DType pre_dtype, int N, int OC,
                        bool accumulate, void* rounded, float* partials, cudaStream_t stream) {
  if (pre_dtype == DType::f32 || !two_pass_column_sums(N, OC, {dgelu}) || !aligned4(pre, pre_dtype) ||
      !aligned4(rounded, pre_dtype))
    return false;
  with_dtype(pre_dtype, [&](auto dt) {
    constexpr DType kDt = decltype(dt)::value;
    if constexpr (kDt != DType::f32)
      column_sums<1>(dbias, nullptr, partials, GeluBiasRows<kDt, kDt>{dgelu, pre, rounded, OC}, N, OC, accumulate,
                     stream);
  });
  return true;
}

void residual_forward(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  launch_binary<Add>(out, a, b, n, stream);
}

void crossentropy_forward(float* losses, float* lse, const void* logits, DType logits_dtype, const int32_t* targets,
                          int N, int V, int Vp, cudaStream_t stream) {
  if (N == 0) return;
  const bool by4 = Vp % 4 == 0 && aligned4(logits, logits_dtype);
  with_dtype(logits_dtype, [&](auto in) {
    if (by4)
      ZERONE_LAUNCH(N, kThreads, 0, stream, crossentropy_forward4_kernel<in.value>)(losses, lse, logits, targets, V, Vp);
    else
      ZERONE_LAUNCH(N, kThreads, 0, stream, crossentropy_forward_kernel<in.value>)(losses, lse, logits, targets, V, Vp);
  });
  ZERONE_CUDA_LAUNCHED();
}

void crossentropy_backward(void* dlogits, DType dlogits_dtype, const void* logits, DType logits_dtype, const float* lse,
                           const int32_t* targets, float dloss, int N, int V, int Vp, cudaStream_t stream) {
  ZERONE_ASSERT(dlogits != logits || dlogits_dtype == logits_dtype, "dlogits written over logits of another dtype");
  const size_t total = static_cast<size_t>(N) * Vp;
  if (total == 0) return;
  // In place too: each element (each four) is read before it is written, by the same thread.
  const bool by4 = Vp % 4 == 0 && aligned4(logits, logits_dtype) && aligned4(dlogits, dlogits_dtype);
  with_dtype(logits_dtype, [&](auto in) {
    if (!by4) {
      ZERONE_LAUNCH(grid_for(total), kThreads, 0, stream, crossentropy_backward_kernel<in.value>)(
          dlogits, dlogits_dtype, logits, lse, targets, dloss, N, V, Vp);
      return;
    }
    with_dtype(dlogits_dtype, [&](auto out) {
      ZERONE_LAUNCH(grid_for(total / 4), kThreads, 0, stream, crossentropy_backward4_kernel<in.value, out.value>)(
          dlogits, logits, lse, targets, dloss, N, V, Vp);
    });
  });
  ZERONE_CUDA_LAUNCHED();
}

}  // namespace zerone::cuda
