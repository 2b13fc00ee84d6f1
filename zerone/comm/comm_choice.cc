#include "zerone/comm/comm_choice.h"

#include <algorithm>
#include <cstring>

#include "zerone/core/error.h"

#if ZERONE_HAVE_NCCL
#include "zerone/comm/nccl_communicator.h"
#endif

namespace zerone::comm {

bool nccl_compiled_in() {
#if ZERONE_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::string nccl_version() {
#if ZERONE_HAVE_NCCL
  return nccl_library_version();
#else
  return "";
#endif
}

std::pair<int, int> ranks_sharing_a_device(const std::vector<std::string>& identity_of_rank) {
  const int world = static_cast<int>(identity_of_rank.size());
  for (int a = 0; a < world; ++a)
    for (int b = a + 1; b < world; ++b)
      if (!identity_of_rank[a].empty() && identity_of_rank[a] == identity_of_rank[b]) return {a, b};
  return {-1, -1};
}

CommChoice choose_comm_library(const std::string& requested, kernels::DeviceKind device, bool nccl_built, int world,
                               const std::vector<std::string>& identity_of_rank) {
  ZERONE_CHECK(requested.empty() || requested == "nccl" || requested == "mpi", "--comm '", requested,
               "' is not a communication library: expected nccl or mpi");
  if (requested == "mpi") return {};
  const auto [a, b] = ranks_sharing_a_device(identity_of_rank);
  if (requested == "nccl") {
    ZERONE_CHECK(device == kernels::DeviceKind::cuda, "--comm nccl needs --device cuda (NCCL moves GPU memory), but ",
                 "the device is ", kernels::device_kind_name(device), "; use --comm mpi or --device cuda");
    ZERONE_CHECK(nccl_built, "--comm nccl: this build of zerone has no NCCL (CMake found no nccl.h and libnccl ",
                 "under the CUDA toolkit or NCCL_ROOT); use --comm mpi");
    ZERONE_CHECK(a < 0, "--comm nccl: ranks ", a, " and ", b, " share one GPU (", identity_of_rank[a],
                 ") and NCCL needs a GPU per rank; use --comm mpi (collectives staged through pinned host memory) ",
                 "or start at most one rank per GPU");
    return {CommLibrary::nccl, ""};
  }
  if (device != kernels::DeviceKind::cuda || !nccl_built || world <= 1) return {};
  if (a >= 0)
    return {CommLibrary::mpi, str_cat("ranks ", a, " and ", b, " share one GPU, and NCCL needs a GPU per rank: ",
                                      "collectives go through MPI staged through pinned host memory")};
  return {CommLibrary::nccl, ""};
}

std::vector<std::string> gather_device_identities(Communicator& host, const kernels::Backend& device) {
  constexpr size_t kBytes = 64;  // a UUID in hex is 32
  const std::string mine = device.device_identity();
  ZERONE_ASSERT(mine.size() < kBytes, "device identity too long: ", mine);
  const size_t world = static_cast<size_t>(host.world_size());
  std::vector<char> in(kBytes, '\0'), all(world * kBytes, '\0');
  std::memcpy(in.data(), mine.data(), mine.size());
  host.all_gather(in.data(), all.data(), kBytes);
  std::vector<std::string> out(world);
  for (size_t r = 0; r < world; ++r) out[r] = std::string(all.data() + r * kBytes, strnlen(all.data() + r * kBytes, kBytes));
  return out;
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, kernels::Backend& device) {
#if ZERONE_HAVE_NCCL
  return std::make_unique<NcclCommunicator>(host, device);
#else
  throw Error("--comm nccl: this build of zerone has no NCCL; use --comm mpi");
#endif
}

}  // namespace zerone::comm
