// A GPU's threads emulated on the host, for tests of CUDA kernels on machines without a GPU (every
// dev machine and CI): the kernel's own source, compiled by the host compiler with the warp
// instructions of warp_instructions.cuh emulated here, run for every thread of every block.
//
// Note [Emulated warps]: a kernel's threads are fibers (Note [Fiber switches], emulated_gpu.cc), a
// block's run by one host thread, the lowest-numbered one that can run first, each until it
// reaches a point where it must wait for others: __syncthreads (the block's live threads; an
// exited thread counts as arrived, as on the GPU) or a warp instruction (its warp's 32 lanes
// exchange what each offers, then each computes its own result from all of them, as mma.sync,
// ldmatrix and shfl.sync do). Blocks run one after another, in order. The whole CUDA backend runs
// so (zerone_kernels_cuda_emulated: its launches through launch.cuh, the runtime calls and
// cuBLASLt emulated beside this file). What the emulation checks beyond the results:
//  - Shared memory starts each block filled with 0xff bytes (a NaN in f32, bf16 and f16), so a
//    read of what no thread stored shows up as NaN in the results.
//  - cp.async copies land only when their thread's cp.async.wait_group lets them (or the thread
//    exits), and their destination reads as 0xff bytes from the issue until then: a read before
//    the wait, or before the barrier that makes another thread's copies visible, or a copy issued
//    into a tile another warp still reads, changes the results.
//  - A warp instruction some lane of the warp never reaches (divergence, an exited lane), or a
//    barrier that never fills, is reported as a deadlock naming the block (abort).
//  - ldmatrix row addresses must lie in the block's shared memory, 16-byte aligned.
//  - Warp 0 runs ahead of the others as far as the barriers let it (the lowest-numbered runnable
//    thread runs), so a missing barrier between one warp's copies or stores and another's reads,
//    or between one warp's reads and another's next copies into the same tile, meets 0xff bytes.
// What it does not model: every order a real GPU may schedule in (this one is fixed: the same
// every run), memory consistency beyond barriers, and the tensor cores' exact summation (the
// emulated mma sums its 16 products in order with f32 fused multiply-adds; hardware sums them in
// an unspecified order): tests hold emulated kernels to a reference's tolerance, not to a GPU's
// bits.
// Thread-safety: one launch at a time per host thread (the running block is thread-local); the
// functions other than launch are called from inside a launched kernel's threads only.
#pragma once

#include <cuda_runtime.h>  // dim3, uint3

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

namespace zerone::cuda::emulated {

// Runs thread_body() as each thread of a `grid` x `block` launch with `shared_bytes` of dynamic
// shared memory, block after block (x fastest, then y, then z). Returns when every thread of every
// block has returned. Aborts (internal invariant) on a deadlock: a barrier or warp instruction that
// can never complete.
void launch(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& thread_body);

// The running thread's built-in variables (threadIdx, blockIdx, gridDim, blockDim below).
const uint3& thread_index();
const uint3& block_index();
const dim3& grid_shape();
const dim3& block_shape();
// The running thread's lane in its warp (threads numbered x fastest).
int lane_index();
// The running block's dynamic shared memory (shared_bytes of launch), 16-byte aligned.
void* dynamic_shared_memory();
// Aborts unless [p, p + bytes) lies in the running block's shared memory and p is aligned to bytes.
void check_shared(const void* p, size_t bytes, const char* instruction);

// __syncthreads.
void sync_block();
// Every lane of the running thread's warp offers `bytes` (at most 64) at `mine`; returns once all
// lanes have, with the offers in lane order in `all` (32 x bytes). The warp must be whole (32
// threads; aborts otherwise).
void warp_exchange(const void* mine, void* all, size_t bytes);

// __syncthreads_or: waits for the block's live threads; whether any passed a nonzero predicate.
int sync_block_or(int predicate);

// A launch written kernel<<<grid, block, shared_bytes, stream>>>(args...) under nvcc
// (ZERONE_LAUNCH, launch.cuh): the callable that runs it here, now, with those arguments.
template <typename... Params>
auto launcher(dim3 grid, dim3 block, size_t shared_bytes, void (*kernel)(Params...)) {
  return [=](auto&&... args) {
    launch(grid, block, shared_bytes, [&] { kernel(args...); });
  };
}

// cp.async: copies src_bytes (0 or bytes) of src to dst and zero-fills the rest of `bytes`, when
// this thread's wait_copies lets it land; dst reads as 0xff bytes until then.
void copy_async(void* dst, const void* src, size_t bytes, size_t src_bytes);
// cp.async.commit_group, cp.async.wait_group pending.
void commit_copies();
void wait_copies(int pending);

}  // namespace zerone::cuda::emulated

// CUDA's built-in variables, block barrier, warp votes and shuffles, and the device intrinsics
// the kernels use, for the host compiler. __shared__ variables are static: a block's threads share
// them, and blocks run one after another on the launching thread (thread_local: a launch per host
// thread).
#define threadIdx (::zerone::cuda::emulated::thread_index())
#define blockIdx (::zerone::cuda::emulated::block_index())
#define gridDim (::zerone::cuda::emulated::grid_shape())
#define blockDim (::zerone::cuda::emulated::block_shape())
inline void __syncthreads() { ::zerone::cuda::emulated::sync_block(); }
inline int __syncthreads_or(int predicate) { return ::zerone::cuda::emulated::sync_block_or(predicate); }
#if !defined(__launch_bounds__)
#define __launch_bounds__(...)
#endif
#undef __shared__
#define __shared__ static thread_local

template <typename T>
inline T __shfl_xor_sync(unsigned /*mask: the whole warp*/, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
  T all[32];
  ::zerone::cuda::emulated::warp_exchange(&v, all, sizeof v);
  return all[::zerone::cuda::emulated::lane_index() ^ lane_mask];
}
template <typename T>
inline T __shfl_sync(unsigned /*mask: the whole warp*/, T v, int source_lane) {
  static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
  T all[32];
  ::zerone::cuda::emulated::warp_exchange(&v, all, sizeof v);
  return all[source_lane & 31];
}
inline unsigned __ballot_sync(unsigned /*mask: the whole warp*/, int predicate) {
  int all[32];
  ::zerone::cuda::emulated::warp_exchange(&predicate, all, sizeof predicate);
  unsigned bits = 0;
  for (int lane = 0; lane < 32; ++lane) bits |= (all[lane] != 0 ? 1u : 0u) << lane;
  return bits;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
// The _rn intrinsics: one IEEE operation each, never fused (the emulated sources build with
// -ffp-contract=off).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
using std::isfinite;
using std::max;
using std::min;
