// The engine's own needs on the GPU (kernels.h): accumulate, the deterministic norms, casts,
// finiteness, blockwise quantization, and the optimizer updates. Note [CUDA kernels, correctness first].
#include <cmath>
#include <vector>

#include "zerone/core/rng.h"
#include "zerone/kernels/cpu/reduce.h"
#include "zerone/kernels/cuda/common.cuh"
#include "zerone/kernels/cuda/kernels.h"

namespace zerone::cuda {
namespace {

// One block per kNormBlock chunk: partials[blockIdx.x] = the sum over the chunk of f(x) in double
// (f the square, or x itself), thread t taking elements lo + t, lo + t + blockDim.x, ... and the
// block adding its threads' sums in a fixed tree. On the way, every element k is visited: `load(k)`
// reads what the visit needs beside x[k] (a value of any type), `apply(k, x[k], loaded)` computes
// and stores (Note [Updates that measure the norm]).
//
// Note [Loads in flight]: a thread walks kNormBlock / blockDim.x = 64 elements of its chunk. One at
// a time, each element's loads waited for the memory before the next element's were issued: W5's
// AdamW (four arrays read, three or four written) took 37 us a 16K-element-per-block launch on an
// H200, a fifth of the memory's speed (docs/BENCHMARKS.md, call 7's profile). So the walk takes
// kChunkUnroll elements at a time: every load of the group first, then every apply, in element
// order. The loads of a group precede its stores in program order (no element is stored before
// another of its group is loaded, and the elements are distinct), and the sum is taken in the
// same order as one at a time: the same bits.
constexpr int kChunkUnroll = 4;

// Chunk `chunk` (kNormBlock elements) of x (n elements), by the whole block: apply(k, x[k],
// load(k)) for each element, and *partial = the chunk's sum (of squares with kSquares).
template <bool kSquares, typename Load, typename Apply>
__device__ void chunk_sum(const float* x, size_t n, size_t chunk, double* partial, Load load, Apply apply) {
  __shared__ double shared[kThreads];
  const size_t lo = chunk * kernels::cpu::kNormBlock;
  const size_t hi = lo + kernels::cpu::kNormBlock < n ? lo + kernels::cpu::kNormBlock : n;
  const size_t stride = blockDim.x;
  const auto term = [](float v) { return kSquares ? static_cast<double>(v) * v : static_cast<double>(v); };
  double s = 0.0;
  size_t k = lo + threadIdx.x;
  for (; k + (kChunkUnroll - 1) * stride < hi; k += kChunkUnroll * stride) {
    float v[kChunkUnroll];
    decltype(load(k)) loaded[kChunkUnroll];
#pragma unroll
    for (int j = 0; j < kChunkUnroll; ++j) {
      v[j] = x[k + j * stride];
      loaded[j] = load(k + j * stride);
    }
#pragma unroll
    for (int j = 0; j < kChunkUnroll; ++j) {
      apply(k + j * stride, v[j], loaded[j]);
      s += term(v[j]);
    }
  }
  for (; k < hi; k += stride) {  // the chunk's tail (fewer than kChunkUnroll elements for this thread)
    const float v = x[k];
    apply(k, v, load(k));
    s += term(v);
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *partial = s;
}

struct NothingLoaded {};

template <bool kSquares>
__global__ void chunk_sum_kernel(const float* x, size_t n, float* copy_to, double* partials) {
  chunk_sum<kSquares>(
      x, n, blockIdx.x, partials + blockIdx.x, [](size_t) { return NothingLoaded{}; },
      [copy_to](size_t k, float v, NothingLoaded) {
        if (copy_to) copy_to[k] = v;
      });
}

template <bool kSquares>
void chunk_sums(const float* x, size_t n, float* copy_to, double* device_partials, cudaStream_t stream) {
  const size_t blocks = norm_blocks(n);
  if (blocks == 0) return;
  ZERONE_LAUNCH(static_cast<unsigned>(blocks), kThreads, 0, stream, chunk_sum_kernel<kSquares>)(x, n, copy_to, device_partials);
  ZERONE_CUDA_LAUNCHED();
}

__global__ void convert_kernel(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n) {
  ZERONE_GRID_STRIDE(i, n) store_param(dst, dst_dtype, i, load_param(src, src_dtype, i));
}

// f32 -> bf16 or f16, four elements a thread-step: 16-byte loads, 8-byte stores (store4: the
// roundings of store_param, so the same bits as convert_kernel; n4 = n / 4, vectorizable4).
template <DType kDst>
__global__ void narrow4_kernel(void* dst, const float4* src, size_t n4) {
  ZERONE_GRID_STRIDE(i, n4) {
    const float4 v = src[i];
    store4<kDst>(dst, i, v.x, v.y, v.z, v.w);
  }
}

__global__ void finite_kernel(const float* x, size_t n, int* flag) {
  ZERONE_GRID_STRIDE(i, n) {
    if (!isfinite(x[i])) *flag = 1;  // every writer writes the same value: no atomics needed
  }
}

// Note [Blockwise quantization]: one CUDA block per quantization block.
__global__ void quantize_kernel(const void* src, DType src_dtype, size_t n, int bits, size_t block, float* scales,
                                uint8_t* codes) {
  __shared__ float shared[kThreads];
  __shared__ int shared_bad[kThreads];
  const size_t b = blockIdx.x, begin = b * block, end = begin + block < n ? begin + block : n;
  const int qm = bits == 8 ? 127 : 7;
  float amax = 0.0f;
  int bad = 0;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float x = load_param(src, src_dtype, i);
    if (!isfinite(x)) bad = 1;
    amax = fmaxf(amax, fabsf(x));
  }
  amax = block_max(amax, shared);
  const bool finite = block_sum(bad, shared_bad) == 0;
  const float scale = finite ? amax / static_cast<float>(qm) : __int_as_float(0x7fc00000);
  if (threadIdx.x == 0) scales[b] = scale;
  const float inv = (finite && scale > 0.0f) ? 1.0f / scale : 0.0f;
  auto code_of = [&](size_t i) {
    const float q = fminf(fmaxf(rintf(load_param(src, src_dtype, i) * inv), -static_cast<float>(qm)), static_cast<float>(qm));
    return finite ? static_cast<int>(q) : 0;
  };
  if (bits == 8) {
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) codes[i] = static_cast<uint8_t>(static_cast<int8_t>(code_of(i)));
  } else {  // blocks are even-sized: each byte (elements 2j, 2j+1) belongs to one block and one thread
    for (size_t i = begin + 2 * threadIdx.x; i < end; i += 2 * blockDim.x) {
      const uint8_t lo = static_cast<uint8_t>(code_of(i) + 8);
      const uint8_t hi = i + 1 < end ? static_cast<uint8_t>(code_of(i + 1) + 8) : (codes[i / 2] >> 4);
      codes[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

__global__ void dequantize_kernel(const float* scales, const uint8_t* codes, size_t n, int bits, size_t block, void* dst,
                                  DType dst_dtype, bool accumulate) {
  ZERONE_GRID_STRIDE(i, n) {
    const float scale = scales[i / block];
    const int code = bits == 8 ? static_cast<int8_t>(codes[i])
                               : static_cast<int>((i % 2 == 0) ? (codes[i / 2] & 0x0F) : (codes[i / 2] >> 4)) - 8;
    const float x = isfinite(scale) ? static_cast<float>(code) * scale : __int_as_float(0x7fc00000);
    if (accumulate) static_cast<float*>(dst)[i] += x;
    else store_param(dst, dst_dtype, i, x);
  }
}

// Note [Updates that measure the norm]: Backend::adamw_update and sgd_update return the gradients'
// sum of squares (Note [Fused optimizer pass]). On the GPU the update kernels take the chunk
// layout of the norm's kernel (one block per kNormBlock chunk, chunk_sum), so that one pass over
// the gradients updates the parameters and leaves the chunk partials that sum_squares_partials
// would have: the same bits, without a second kernel reading every gradient again (W5 spent 4.6%
// of its GPU time in that second kernel, 112 launches a step). The backend copies the partials to
// the host behind an event and returns them pending (Note [Norms read once a step],
// core/pending_sum.h).
//
// Note [AdamW lanes] (kernels/cpu/adamw.cc) on the GPU: each element's arithmetic is the cpu
// kernel's, every operation rounded on its own as written (no contraction but the fmaf spelled
// out), so that the update is the same function of its inputs on both devices.
//
// Note [AdamW ranges in one launch]: a unit's update is several ranges (its weight-decay and
// no-decay runs: 9 for a GPT-2 block, most of them a bias or a norm's weight of one chunk), which
// took a launch each (111 a W5 step, of which some 90 one block long). One launch now takes up to
// kAdamWRangesPerLaunch of them: block b works on chunk b - first_block of the range whose blocks
// hold b, and leaves its partial where the range's own launch left it. The same arithmetic on the
// same chunks: the same bits. The ranges travel in the launch's parameters (__grid_constant__:
// read in place, never copied to local memory).
constexpr int kAdamWRangesPerLaunch = 16;
struct AdamWLaunchRange {
  float* master;
  float* m;
  float* v;
  const float* grad;
  void* param;  // may be null
  size_t n;
  kernels::AdamWScalars c;
  unsigned first_block;  // the launch's block that takes the range's first chunk
};
struct AdamWLaunch {
  AdamWLaunchRange range[kAdamWRangesPerLaunch];
  int count;
};

__global__ void adamw_kernel(const __grid_constant__ AdamWLaunch launch, DType param_dtype, double* partials) {
  int r = 0;
  while (r + 1 < launch.count && blockIdx.x >= launch.range[r + 1].first_block) ++r;
  const AdamWLaunchRange& a = launch.range[r];
  const kernels::AdamWScalars& c = a.c;
  float *master = a.master, *m = a.m, *v = a.v;
  void* param = a.param;
  struct State {
    float m, v, master;
  };
  chunk_sum<true>(
      a.grad, a.n, blockIdx.x - a.first_block, partials + blockIdx.x,
      [&](size_t i) { return State{m[i], v[i], master[i]}; },
      [&](size_t i, float raw, const State& st) {
        const float g = __fmul_rn(raw, c.grad_scale);
        const float mi = fmaf(c.one_minus_beta1, g, __fmul_rn(c.beta1, st.m));
        const float vi = fmaf(__fmul_rn(c.one_minus_beta2, g), g, __fmul_rn(c.beta2, st.v));
        const float q = __fdiv_rn(__fmul_rn(c.step_size, mi), fmaf(__fsqrt_rn(vi), c.inv_sqrt_bc2, c.eps));
        const float p = fmaf(st.master, c.decay, -q);
        m[i] = mi;
        v[i] = vi;
        master[i] = p;
        if (param) store_param(param, param_dtype, i, p);
      });
}

// Note [SGD arithmetic] (kernels/cpu/sgd.h): each operation rounded on its own (__fmul_rn and
// __fadd_rn are never fused into an FMA), in PyTorch's order.
// Its norm as AdamW's (Note [Updates that measure the norm]).
__global__ void sgd_kernel(float* master, float* momentum, const float* grad, void* param, DType param_dtype, size_t n,
                           float lr, float mu, float keep, float wd, float gs, bool nesterov, bool first,
                           double* partials) {
  struct State {
    float master, momentum;
  };
  chunk_sum<true>(
      grad, n, blockIdx.x, partials + blockIdx.x,
      [&](size_t i) { return State{master[i], momentum && !first ? momentum[i] : 0.0f}; },
      [&](size_t i, float raw, const State& st) {
        float d = __fmul_rn(raw, gs);
        if (wd != 0.0f) d = __fadd_rn(d, __fmul_rn(wd, st.master));
        if (momentum) {
          const float b = first ? d : __fadd_rn(__fmul_rn(st.momentum, mu), __fmul_rn(keep, d));
          momentum[i] = b;
          d = nesterov ? __fadd_rn(d, __fmul_rn(mu, b)) : b;
        }
        const float p = __fadd_rn(st.master, -__fmul_rn(lr, d));
        master[i] = p;
        if (param) store_param(param, param_dtype, i, p);
      });
}

}  // namespace

void accumulate(float* dst, const float* src, size_t n, cudaStream_t stream) {
  launch_binary<Add>(dst, dst, src, n, stream);  // dst[i] + src[i], as dst[i] += src[i]
}

void partials_to_host(const double* device_partials, double* host_partials, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  ZERONE_CUDA_CHECK(cudaMemcpyAsync(host_partials, device_partials, count * sizeof(double), cudaMemcpyDeviceToHost, stream));
  ZERONE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void sum_squares_partials(const float* x, size_t n, float* copy_to, double* device_partials, cudaStream_t stream) {
  chunk_sums<true>(x, n, copy_to, device_partials, stream);
}

void sum_partials(const float* x, size_t n, double* device_partials, cudaStream_t stream) {
  chunk_sums<false>(x, n, nullptr, device_partials, stream);
}

void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  ZERONE_ASSERT(src_dtype == DType::f32 || dst_dtype == DType::f32, "convert: one side must be f32");
  const bool narrowing = src_dtype == DType::f32 && dst_dtype != DType::f32;
  if (narrowing && vectorizable4(src, dst, dst_dtype, n)) {  // activations rounded for a GEMM or attention: the common case
    const size_t n4 = n / 4;
    if (dst_dtype == DType::bf16)
      ZERONE_LAUNCH(grid_for(n4), kThreads, 0, stream, narrow4_kernel<DType::bf16>)(dst, static_cast<const float4*>(src), n4);
    else
      ZERONE_LAUNCH(grid_for(n4), kThreads, 0, stream, narrow4_kernel<DType::f16>)(dst, static_cast<const float4*>(src), n4);
  } else {
    ZERONE_LAUNCH(grid_for(n), kThreads, 0, stream, convert_kernel)(dst, dst_dtype, src, src_dtype, n);
  }
  ZERONE_CUDA_LAUNCHED();
}

void mark_not_finite(const float* x, size_t n, int* flag, cudaStream_t stream) {
  if (n == 0) return;
  ZERONE_LAUNCH(grid_for(n), kThreads, 0, stream, finite_kernel)(x, n, flag);
  ZERONE_CUDA_LAUNCHED();
}

void quantize_blockwise(const void* src, DType src_dtype, size_t n, int bits, size_t block, void* out,
                        cudaStream_t stream) {
  if (n == 0) return;
  const size_t nb = (n + block - 1) / block;
  float* scales = static_cast<float*>(out);
  ZERONE_LAUNCH(static_cast<unsigned>(nb), kThreads, 0, stream, quantize_kernel)(src, src_dtype, n, bits, block, scales,
                                                                        reinterpret_cast<uint8_t*>(scales + nb));
  ZERONE_CUDA_LAUNCHED();
}

void dequantize_blockwise(const void* in, size_t n, int bits, size_t block, void* dst, DType dst_dtype,
                          bool accumulate, cudaStream_t stream) {
  if (n == 0) return;
  ZERONE_ASSERT(!accumulate || dst_dtype == DType::f32, "dequantize: accumulation needs an f32 destination");
  const size_t nb = (n + block - 1) / block;
  const float* scales = static_cast<const float*>(in);
  ZERONE_LAUNCH(grid_for(n), kThreads, 0, stream, dequantize_kernel)(scales, reinterpret_cast<const uint8_t*>(scales + nb), n, bits,
                                                           block, dst, dst_dtype, accumulate);
  ZERONE_CUDA_LAUNCHED();
}

void adamw_update_ranges(const kernels::AdamWRange* ranges, size_t count, DType param_dtype, double* device_partials,
                         cudaStream_t stream) {
  AdamWLaunch launch{};
  unsigned blocks = 0;  // of the launch being filled
  const auto flush = [&] {
    if (blocks == 0) return;
    ZERONE_LAUNCH(blocks, kThreads, 0, stream, adamw_kernel)(launch, param_dtype, device_partials);
    ZERONE_CUDA_LAUNCHED();
    device_partials += blocks;
    launch.count = 0;
    blocks = 0;
  };
  for (size_t i = 0; i < count; ++i) {
    const kernels::AdamWRange& r = ranges[i];
    ZERONE_ASSERT(r.hyper.step >= 1, "AdamW step must be 1-based, got ", r.hyper.step);
    if (r.n == 0) continue;
    const size_t range_blocks = norm_blocks(r.n);
    ZERONE_ASSERT(range_blocks < (1u << 31), "adamw: a range of ", r.n, " elements");
    if (launch.count == kAdamWRangesPerLaunch || blocks + range_blocks >= (1u << 31)) flush();
    launch.range[launch.count++] = {r.master, r.m,       r.v,
                                    r.grad,   r.param,   r.n,
                                    kernels::adamw_scalars(r.hyper),  // as the cpu forms them
                                    blocks};
    blocks += static_cast<unsigned>(range_blocks);
  }
  flush();
}

void sgd_update(float* master, float* momentum, const float* grad, void* param, DType param_dtype, size_t n,
                const kernels::SGDHyper& h, double* device_partials, cudaStream_t stream) {
  if (n == 0) return;
  ZERONE_LAUNCH(static_cast<unsigned>(norm_blocks(n)), kThreads, 0, stream, sgd_kernel)(
      master, momentum, grad, param, param_dtype, n, h.lr, h.momentum, 1.0f - h.dampening, h.weight_decay,
      h.grad_scale, h.nesterov, h.first, device_partials);
  ZERONE_CUDA_LAUNCHED();
}

}  // namespace zerone::cuda
