// The CUDA backend (kernels/backend.h, `--device cuda`): device memory is GPU memory from a caching
// arena over CUDA's stream-ordered allocator, every operation a kernel of this folder (kernels.h)
// or a cuBLASLt GEMM, enqueued on the compute stream.
//
// Note [CUDA backend design]:
//  - Memory: CudaArena serves MemPlace::device Buffers with cudaMallocAsync from the device's
//    default memory pool (release threshold: never, so freed memory is cached for reuse), ordered
//    on the compute stream, zero-filled there; the ledger (core/memory.h) counts every Buffer as on
//    any backend. Out of memory returns null, so Buffer throws its Error. What the ledger cannot
//    see (the CUDA context) and what the estimate does not count (cuBLASLt's workspace) are
//    reserved by the fit checks (Note [Device memory the ledger cannot see], kernels/backend.h);
//    device_memory() reads the GPU's free and total memory (cudaMemGetInfo).
//  - Streams: compute, comm, host_to_device and device_to_host are CUDA streams. Every operation
//    and every device-to-device copy runs on the compute stream, so the order of the calls is the
//    order of the work. A copy with a host side runs on its direction's copy stream, after the
//    compute work submitted before it (an event), and returns when it is done (the caller may read
//    or reuse the host memory at once, and later work of any stream comes after it). NCCL's
//    collectives run on the comm stream (comm/nccl_communicator.h). record(s) on a stream other
//    than compute first makes s wait for compute, so an event of any stream covers the work
//    submitted before it.
//  - Host memory: MemPlace::host Buffers are pinned (Note [Pinned host memory], kernels/backend.h;
//    PinnedHostArena in cuda_backend.cc), so the copies above are DMAs of the copy engines.
//  - Attention: flash by default (Note [Flash attention on CUDA cores], attention.cu), saving
//    the rows' logsumexp in `att`; the plain kernels (the probabilities in `att`, a (B, NH, T, T)
//    scratch in backward) when made with CudaAttention::plain.
//  - Determinism: no atomics; every reduction has a fixed order (Note [CUDA kernels, correctness
//    first], kernels.h), cuBLASLt's algorithm is the heuristic's first for the shape, and f32 GEMMs
//    compute in f32 (CUBLAS_COMPUTE_32F: no TF32).
// Run on an H200 (2026-11-27): the op harness and whole training runs (docs/GPU.md).
// Thread-safety: as Backend. The arena and copy() may be used from the communication thread (each
// such call binds the backend's device to the calling thread first).
#pragma once

#include <memory>

#include "zerone/kernels/backend.h"

namespace zerone::cuda {

// The CUDA backend on this process's GPU: with several GPUs, the local rank's (the launcher's
// OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or SLURM_LOCALID) modulo their count, else GPU 0.
// Throws Error saying "no CUDA GPU found on this machine" when there is none. `options` picks the
// attention kernels (flash or plain; Note [Attention's saved state] in kernels/backend.h).
std::unique_ptr<kernels::Backend> make_cuda_backend(const kernels::DeviceOptions& options = {});

}  // namespace zerone::cuda
