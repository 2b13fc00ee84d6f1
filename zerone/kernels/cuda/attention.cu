// The CUDA backend's flash attention (kernels.h: flash_attention_forward / flash_attention_backward):
// causal grouped-query attention (GPT-2 is NKV == NH) without the (B, NH, T, T) matrix in memory.
// The tiling is flash_tiles.h's (Note [Flash attention tiles]); kernels/cpu/ops.h is the spec.
//
// Note [Flash attention on CUDA cores]: the first, plain-to-check form of FlashAttention-2
// (Dao 2023): shared-memory tiles, f32 everywhere, the products on CUDA cores (no tensor cores yet).
//  - forward: one block per (b, h, query warp tile). Each warp takes its rows one at a time; per
//    key lane tile, lane j scores key j against the row, the warp's max and sum (butterfly
//    shuffles) update the row's online softmax, and every lane adds P V for its own channels.
//    It writes out (B, T, NH*hs) and the rows' logsumexp lse (B, NH, T), all backward keeps.
//  - dQ: one block per (b, h, query warp tile), two sweeps over the keys it sees: the first sums
//    D = sum_j P_ij dP_ij (dP = dO V^T; D = dO . O, here from P; the tensor-core form reads the
//    output backward is handed instead), the second adds dS K with dS = P (dP - D). It writes dQ
//    and D (B, NH, T).
//  - dK/dV: one block per (b, kv head, key warp tile), sweeping the G query heads of the group in
//    order and, for each, the query lane tiles that see its keys; dK and dV accumulate in
//    registers and are written once, so the group's sum has a fixed order and nothing is atomic.
// P = exp(S - lse) is recomputed from the scores in both backward kernels. Every sum runs in a
// fixed order (per-lane loops, butterfly shuffles), so a run gives the same bits every time.
// Run on an H200 (2026-11-27); 16-bit runs use attention_tensor_cores.cu instead where it applies.
#include <cmath>

#include "zerone/kernels/cuda/common.cuh"
#include "zerone/kernels/cuda/flash_common.cuh"
#include "zerone/kernels/cuda/flash_tiles.h"
#include "zerone/kernels/cuda/kernels.h"

namespace zerone::cuda {
namespace {

using namespace flash;

constexpr unsigned kFullMask = 0xffffffffu;

// Butterfly reductions over a warp: every lane ends with the same value (each step combines a pair
// commutatively), in a fixed order.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

__device__ __forceinline__ float dot_smem(const float* a, const float* b, int hs) {
  float s = 0.0f;
  for (int d = 0; d < hs; ++d) s += a[d] * b[d];
  return s;
}

// Rows first..first+rows-1 of a (T, hs) head view (element (t, d) at src[at(t) + d]) into a tile
// of `rows` rows of stride ld; rows at or past T are zero. All threads of the block take part.
template <typename At>
__device__ void load_tile(float* tile, int ld, const float* src, At at, int first, int rows, int T, int hs) {
  for (int i = threadIdx.x; i < rows * hs; i += blockDim.x) {
    const int r = i / hs, d = i % hs, t = first + r;
    tile[r * ld + d] = t < T ? src[at(t) + d] : 0.0f;
  }
}

// The K and V rows first..first+rows-1 of KV head kv of batch b (forward, dQ and dK/dV all take
// them together).
__device__ void load_kv_tiles(float* k_s, float* v_s, int ld, const float* qkv, const FlashShape& s, int b, int kv,
                              int first, int rows, int T, int hs) {
  load_tile(k_s, ld, qkv, [=](int t) { return s.k(b, t, kv); }, first, rows, T, hs);
  load_tile(v_s, ld, qkv, [=](int t) { return s.v(b, t, kv); }, first, rows, T, hs);
}

// ---------------------------------------------------------------- forward

template <int kChunks>
__global__ void __launch_bounds__(kThreadsPerBlock)
    flash_forward_kernel(float* out, float* lse, const float* qkv, FlashShape s, float scale) {
  constexpr int kRows = rows_per_warp(kChunks), kBr = warp_tile_rows(kChunks);
  ZERONE_DYNAMIC_SHARED(float, smem);
  const int hs = s.hs, T = s.T, ld = smem_stride(hs);
  float* q_s = smem;             // (kBr, ld)
  float* k_s = q_s + kBr * ld;   // (kLanes, ld)
  float* v_s = k_s + kLanes * ld;
  const int b = blockIdx.x / s.NH, h = blockIdx.x % s.NH, kv = h / s.G();
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;  // the longest rows first
  const int warp = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;

  load_tile(q_s, ld, qkv, [=](int t) { return s.q(b, t, h); }, q0, kBr, T, hs);
  float o[kRows][kChunks], m[kRows], l[kRows];
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    m[rr] = -INFINITY, l[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) o[rr][c] = 0.0f;
  }
  const int key_tiles = key_tiles_seen(q0, kBr, T);
  for (int jt = 0; jt < key_tiles; ++jt) {
    const int k0 = jt * kLanes;
    __syncthreads();  // the previous tile's reads are done
    load_kv_tiles(k_s, v_s, ld, qkv, s, b, kv, k0, kLanes, T, hs);
    __syncthreads();
    const int key = k0 + lane;
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      const int r = warp * kRows + rr, query = q0 + r;
      if (query >= T) continue;  // the same for the whole warp
      const bool seen = sees(query, key, T);
      const float score = seen ? scale * dot_smem(q_s + r * ld, k_s + lane * ld, hs) : -INFINITY;
      float rescale;
      const float m_new = online_max(m[rr], warp_max(score), &rescale);
      const float p = seen ? expf(score - m_new) : 0.0f;
      l[rr] = l[rr] * rescale + warp_sum(p);
      m[rr] = m_new;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) o[rr][c] *= rescale;
#pragma unroll 4  // unrolled whole, the lane loops spill (ptxas -v)
      for (int j = 0; j < kLanes; ++j) {
        const float pj = __shfl_sync(kFullMask, p, j);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int d = lane + kLanes * c;
          if (d < hs) o[rr][c] += pj * v_s[j * ld + d];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    const int query = q0 + warp * kRows + rr;
    if (query >= T) continue;
    const float inv = 1.0f / l[rr];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = lane + kLanes * c;
      if (d < hs) out[s.o(b, query, h) + d] = o[rr][c] * inv;
    }
    if (lane == 0) lse[s.stat(b, h, query)] = m[rr] + logf(l[rr]);
  }
}

// ---------------------------------------------------------------- dQ (and D)

template <int kChunks>
__global__ void __launch_bounds__(kThreadsPerBlock)
    flash_dq_kernel(float* dqkv, float* dsum, const float* dout, const float* qkv, const float* lse, FlashShape s,
                    float scale) {
  constexpr int kRows = rows_per_warp(kChunks), kBr = warp_tile_rows(kChunks);
  ZERONE_DYNAMIC_SHARED(float, smem);
  const int hs = s.hs, T = s.T, ld = smem_stride(hs);
  float* q_s = smem;              // (kBr, ld)
  float* do_s = q_s + kBr * ld;   // (kBr, ld)
  float* k_s = do_s + kBr * ld;   // (kLanes, ld)
  float* v_s = k_s + kLanes * ld;
  const int b = blockIdx.x / s.NH, h = blockIdx.x % s.NH, kv = h / s.G();
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;
  const int warp = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;

  load_tile(q_s, ld, qkv, [=](int t) { return s.q(b, t, h); }, q0, kBr, T, hs);
  load_tile(do_s, ld, dout, [=](int t) { return s.o(b, t, h); }, q0, kBr, T, hs);
  float row_lse[kRows], D[kRows], dq[kRows][kChunks];
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    const int query = q0 + warp * kRows + rr;
    row_lse[rr] = query < T ? lse[s.stat(b, h, query)] : 0.0f;
    D[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) dq[rr][c] = 0.0f;
  }
  const int key_tiles = key_tiles_seen(q0, kBr, T);
  // Sweep 0 sums each lane's share of D, sweep 1 accumulates dS K.
  for (int sweep = 0; sweep < 2; ++sweep) {
    for (int jt = 0; jt < key_tiles; ++jt) {
      const int k0 = jt * kLanes;
      __syncthreads();
      load_kv_tiles(k_s, v_s, ld, qkv, s, b, kv, k0, kLanes, T, hs);
      __syncthreads();
      const int key = k0 + lane;
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        const int r = warp * kRows + rr, query = q0 + r;
        if (query >= T) continue;
        float p = 0.0f, dp = 0.0f;
        if (sees(query, key, T)) {
          p = expf(scale * dot_smem(q_s + r * ld, k_s + lane * ld, hs) - row_lse[rr]);
          dp = dot_smem(do_s + r * ld, v_s + lane * ld, hs);
        }
        if (sweep == 0) {
          D[rr] += p * dp;
          continue;
        }
        const float ds = p * (dp - D[rr]);
#pragma unroll 4  // unrolled whole, the lane loops spill (ptxas -v)
        for (int j = 0; j < kLanes; ++j) {
          const float dsj = __shfl_sync(kFullMask, ds, j);
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            const int d = lane + kLanes * c;
            if (d < hs) dq[rr][c] += dsj * k_s[j * ld + d];
          }
        }
      }
    }
    if (sweep == 0) {
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) D[rr] = warp_sum(D[rr]);  // the warp's lanes hold a row's shares
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    const int query = q0 + warp * kRows + rr;
    if (query >= T) continue;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = lane + kLanes * c;
      if (d < hs) dqkv[s.q(b, query, h) + d] = scale * dq[rr][c];
    }
    if (lane == 0) dsum[s.stat(b, h, query)] = D[rr];
  }
}

// ---------------------------------------------------------------- dK and dV

template <int kChunks>
__global__ void __launch_bounds__(kThreadsPerBlock)
    flash_dkv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* dsum,
                     FlashShape s, float scale) {
  constexpr int kRows = rows_per_warp(kChunks), kBc = warp_tile_rows(kChunks);
  ZERONE_DYNAMIC_SHARED(float, smem);
  const int hs = s.hs, T = s.T, ld = smem_stride(hs);
  float* k_s = smem;               // (kBc, ld)
  float* v_s = k_s + kBc * ld;     // (kBc, ld)
  float* q_s = v_s + kBc * ld;     // (kLanes, ld)
  float* do_s = q_s + kLanes * ld;  // (kLanes, ld)
  float* lse_s = do_s + kLanes * ld;  // (kLanes)
  float* d_s = lse_s + kLanes;        // (kLanes)
  const int b = blockIdx.x / s.NKV, kv = blockIdx.x % s.NKV, G = s.G();
  const int k0 = (gridDim.y - 1 - blockIdx.y) * kBc;  // the keys seen by the fewest queries last
  const int warp = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;

  load_kv_tiles(k_s, v_s, ld, qkv, s, b, kv, k0, kBc, T, hs);
  float dk[kRows][kChunks], dv[kRows][kChunks];
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr)
#pragma unroll
    for (int c = 0; c < kChunks; ++c) dk[rr][c] = 0.0f, dv[rr][c] = 0.0f;
  const int query_tiles = tiles_of(T, kLanes);
  for (int g = 0; g < G; ++g) {
    const int h = kv * G + g;
    for (int it = first_query_tile_seeing(k0); it < query_tiles; ++it) {
      const int q0 = it * kLanes;
      __syncthreads();
      load_tile(q_s, ld, qkv, [=](int t) { return s.q(b, t, h); }, q0, kLanes, T, hs);
      load_tile(do_s, ld, dout, [=](int t) { return s.o(b, t, h); }, q0, kLanes, T, hs);
      if (threadIdx.x < kLanes) {
        const int t = q0 + threadIdx.x;
        lse_s[threadIdx.x] = t < T ? lse[s.stat(b, h, t)] : 0.0f;
        d_s[threadIdx.x] = t < T ? dsum[s.stat(b, h, t)] : 0.0f;
      }
      __syncthreads();
      const int query = q0 + lane;
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        const int r = warp * kRows + rr, key = k0 + r;
        if (key >= T) continue;  // the same for the whole warp
        float p = 0.0f, ds = 0.0f;
        if (sees(query, key, T)) {
          p = expf(scale * dot_smem(q_s + lane * ld, k_s + r * ld, hs) - lse_s[lane]);
          ds = p * (dot_smem(do_s + lane * ld, v_s + r * ld, hs) - d_s[lane]);
        }
#pragma unroll 4  // unrolled whole, the lane loops spill (ptxas -v)
        for (int i = 0; i < kLanes; ++i) {
          const float pi = __shfl_sync(kFullMask, p, i), dsi = __shfl_sync(kFullMask, ds, i);
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            const int d = lane + kLanes * c;
            if (d < hs) {
              dv[rr][c] += pi * do_s[i * ld + d];
              dk[rr][c] += dsi * q_s[i * ld + d];
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    const int key = k0 + warp * kRows + rr;
    if (key >= T) continue;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = lane + kLanes * c;
      if (d < hs) {
        dqkv[s.k(b, key, kv) + d] = scale * dk[rr][c];
        dqkv[s.v(b, key, kv) + d] = dv[rr][c];
      }
    }
  }
}

// ---------------------------------------------------------------- launching

void check_shape(int NH, int NKV, int hs) {
  ZERONE_ASSERT(NKV >= 1 && NH % NKV == 0, "NH ", NH, " is not a multiple of NKV ", NKV);
  ZERONE_ASSERT(hs >= 1 && hs <= kMaxHeadSize, "flash attention takes head sizes 1..", kMaxHeadSize, ", got ", hs);
}

template <int kChunks>
void forward_with(float* out, float* lse, const float* qkv, const FlashShape& s, float scale, cudaStream_t stream) {
  const size_t bytes = request_smem(flash_forward_kernel<kChunks>, sizeof(float) * forward_smem_floats(s.hs));
  const dim3 grid(static_cast<unsigned>(s.B * s.NH), static_cast<unsigned>(tiles_of(s.T, warp_tile_rows(kChunks))));
  ZERONE_LAUNCH(grid, kThreadsPerBlock, bytes, stream, flash_forward_kernel<kChunks>)(out, lse, qkv, s, scale);
  ZERONE_CUDA_LAUNCHED();
}

template <int kChunks>
void backward_with(float* dqkv, float* dsum, const float* dout, const float* qkv, const float* lse,
                   const FlashShape& s, float scale, cudaStream_t stream) {
  const unsigned warp_tiles = static_cast<unsigned>(tiles_of(s.T, warp_tile_rows(kChunks)));
  const size_t dq_bytes = request_smem(flash_dq_kernel<kChunks>, sizeof(float) * dq_smem_floats(s.hs));
  ZERONE_LAUNCH(dim3(static_cast<unsigned>(s.B * s.NH), warp_tiles), kThreadsPerBlock, dq_bytes, stream, flash_dq_kernel<kChunks>)(
      dqkv, dsum, dout, qkv, lse, s, scale);
  ZERONE_CUDA_LAUNCHED();
  const size_t dkv_bytes = request_smem(flash_dkv_kernel<kChunks>, sizeof(float) * dkv_smem_floats(s.hs));
  ZERONE_LAUNCH(dim3(static_cast<unsigned>(s.B * s.NKV), warp_tiles), kThreadsPerBlock, dkv_bytes, stream, flash_dkv_kernel<kChunks>)(dqkv, dout, qkv, lse, dsum, s, scale);
  ZERONE_CUDA_LAUNCHED();
}

}  // namespace

bool flash_attention_takes_16bit(DType operands, int hs) { return tensor_core_flash_takes(operands, hs); }

size_t flash_attention_scratch_bytes(int B, int T, int NH, int NKV, int hs, DType operands, bool backward) {
  if (!tensor_core_flash_takes(operands, hs)) return 0;
  return sizeof(uint16_t) * tensor_core_flash_scratch_elems(FlashShape{B, T, NH, NKV, hs}, backward);
}

void flash_attention_forward(void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV, int hs,
                             DType operands, void* scratch, cudaStream_t stream) {
  check_shape(NH, NKV, hs);
  (void)scratch;  // forward needs none (Note [Operands rounded once])
  if (B == 0 || T == 0) return;
  const FlashShape s{B, T, NH, NKV, hs};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  if (operands != DType::f32) {
    ZERONE_ASSERT(tensor_core_flash_takes(operands, hs), "flash attention: 16-bit qkv at head size ", hs,
                  " is not taken on tensor cores (widen it: flash_attention_takes_16bit)");
    return tensor_core_flash_forward(static_cast<uint16_t*>(out), lse, static_cast<const uint16_t*>(qkv), s, operands,
                                     scale, stream);
  }
  float* out32 = static_cast<float*>(out);
  const float* qkv32 = static_cast<const float*>(qkv);
  switch (chunks_for(hs)) {
    case 1: return forward_with<1>(out32, lse, qkv32, s, scale, stream);
    case 2: return forward_with<2>(out32, lse, qkv32, s, scale, stream);
    case 4: return forward_with<4>(out32, lse, qkv32, s, scale, stream);
    default: return forward_with<8>(out32, lse, qkv32, s, scale, stream);
  }
}

void flash_attention_backward(float* dqkv, float* dsum, const float* dout, const void* qkv, const void* out,
                              const float* lse, int B, int T, int NH, int NKV, int hs, DType operands, void* scratch,
                              cudaStream_t stream, const FlashBackwardMarks* marks) {
  check_shape(NH, NKV, hs);
  if (B == 0 || T == 0) return;
  const FlashShape s{B, T, NH, NKV, hs};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  if (operands != DType::f32) {
    ZERONE_ASSERT(tensor_core_flash_takes(operands, hs), "flash attention: 16-bit qkv at head size ", hs,
                  " is not taken on tensor cores (widen it: flash_attention_takes_16bit)");
    return tensor_core_flash_backward(dqkv, dsum, dout, static_cast<const uint16_t*>(qkv),
                                      static_cast<const uint16_t*>(out), lse, s, operands, scale,
                                      static_cast<uint16_t*>(scratch), stream, marks);
  }
  const float* qkv32 = static_cast<const float*>(qkv);  // the f32 form forms D from P and dP: out unread
  switch (chunks_for(hs)) {
    case 1: return backward_with<1>(dqkv, dsum, dout, qkv32, lse, s, scale, stream);
    case 2: return backward_with<2>(dqkv, dsum, dout, qkv32, lse, s, scale, stream);
    case 4: return backward_with<4>(dqkv, dsum, dout, qkv32, lse, s, scale, stream);
    default: return backward_with<8>(dqkv, dsum, dout, qkv32, lse, s, scale, stream);
  }
}

}  // namespace zerone::cuda
