// Which library runs the collectives over device memory (`--comm nccl|mpi`), decided once at
// start-up from the device, the build and where the ranks' GPUs are.
//
// Note [Choosing NCCL]: NCCL moves GPU memory between GPUs directly, one rank per GPU: it refuses
// two ranks on one GPU. MPI moves host memory: device buffers reach it staged through pinned host
// buffers (DeviceCommunicator), which works for any placement, ranks sharing a GPU included (the
// lent machines have one GPU: that is how multi-rank GPU runs are tested). So:
//   --comm mpi             MPI (staged for a device that is not host memory).
//   --comm nccl            NCCL for device buffers; an error where it cannot run: a device other
//                          than cuda, a build without NCCL, ranks sharing a GPU.
//   not given              NCCL on cuda with NCCL built, more than one rank and every rank on its
//                          own GPU; with ranks sharing a GPU, MPI staged through host memory and a
//                          notice saying so; else MPI (a lone rank needs no library at all).
// Buffers of host memory (an offloaded shard, a host scalar) always go through MPI, staged.
// Thread-safety: the functions are pure, except gather_device_identities (a collective).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "zerone/comm/communicator.h"
#include "zerone/kernels/backend.h"

namespace zerone::comm {

enum class CommLibrary { mpi, nccl };

struct CommChoice {
  CommLibrary library = CommLibrary::mpi;
  std::string notice;  // for the user when the choice falls back (empty otherwise)
};

// True when this build has NCCL (ZERONE_HAVE_NCCL); nccl_version() is then "2.28.9" (the
// library loaded, ncclGetVersion), else "".
bool nccl_compiled_in();
std::string nccl_version();

// The first two ranks whose device identities (kernels::Backend::device_identity, one per rank in
// rank order) are equal and non-empty, or {-1, -1} when every rank has a device of its own.
std::pair<int, int> ranks_sharing_a_device(const std::vector<std::string>& identity_of_rank);

// Note [Choosing NCCL]. `requested`: "nccl", "mpi" or "" (not given). Throws Error (naming --comm
// and what would work) for an explicit nccl that cannot run.
CommChoice choose_comm_library(const std::string& requested, kernels::DeviceKind device, bool nccl_built, int world,
                               const std::vector<std::string>& identity_of_rank);

// Every rank's device identity in rank order (an all-gather over `host`, a host communicator).
std::vector<std::string> gather_device_identities(Communicator& host, const kernels::Backend& device);

// The NCCL communicator over `host`'s ranks for `device`'s buffers (nccl_communicator.h);
// collective over `host`. Throws Error where this build has no NCCL or NCCL cannot start.
// `host` and `device` must outlive the result.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, kernels::Backend& device);

}  // namespace zerone::comm
