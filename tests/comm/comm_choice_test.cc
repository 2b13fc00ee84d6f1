// Note [Choosing NCCL] (comm/comm_choice.h) as pure functions: no GPU needed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "zerone/comm/comm_choice.h"
#include "zerone/core/error.h"

namespace zerone::comm {
namespace {

using kernels::DeviceKind;

std::string error_of(const std::string& requested, DeviceKind device, bool built, int world,
                     const std::vector<std::string>& gpus) {
  try {
    (void)choose_comm_library(requested, device, built, world, gpus);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CommChoice, RanksSharingADevice) {
  EXPECT_EQ(ranks_sharing_a_device({}), std::make_pair(-1, -1));
  EXPECT_EQ(ranks_sharing_a_device({"a", "b", "c"}), std::make_pair(-1, -1));
  EXPECT_EQ(ranks_sharing_a_device({"a", "b", "a"}), std::make_pair(0, 2));
  EXPECT_EQ(ranks_sharing_a_device({"a", "b", "b", "a"}), std::make_pair(0, 3));  // the first pair by lower rank
  EXPECT_EQ(ranks_sharing_a_device({"", ""}), std::make_pair(-1, -1));            // cpu/sim: each rank its own
}

TEST(CommChoice, DefaultIsNcclOnlyOnOwnGpus) {
  const std::vector<std::string> own = {"gpu0", "gpu1"}, shared = {"gpu0", "gpu0"};
  EXPECT_EQ(choose_comm_library("", DeviceKind::cuda, true, 2, own).library, CommLibrary::nccl);
  EXPECT_EQ(choose_comm_library("", DeviceKind::cuda, true, 2, own).notice, "");
  const CommChoice fallback = choose_comm_library("", DeviceKind::cuda, true, 2, shared);
  EXPECT_EQ(fallback.library, CommLibrary::mpi);
  EXPECT_NE(fallback.notice.find("ranks 0 and 1 share one GPU"), std::string::npos) << fallback.notice;
  EXPECT_EQ(choose_comm_library("", DeviceKind::cuda, true, 1, {}).library, CommLibrary::mpi);  // alone
  EXPECT_EQ(choose_comm_library("", DeviceKind::cuda, false, 2, own).library, CommLibrary::mpi);  // not built
  EXPECT_EQ(choose_comm_library("", DeviceKind::cpu, true, 2, {"", ""}).library, CommLibrary::mpi);
  EXPECT_EQ(choose_comm_library("", DeviceKind::sim, true, 2, {"", ""}).library, CommLibrary::mpi);
  EXPECT_EQ(choose_comm_library("mpi", DeviceKind::cuda, true, 2, own).library, CommLibrary::mpi);
  EXPECT_EQ(choose_comm_library("mpi", DeviceKind::cuda, true, 2, own).notice, "");
}

TEST(CommChoice, ExplicitNcclRefusesWhatCannotRun) {
  EXPECT_EQ(choose_comm_library("nccl", DeviceKind::cuda, true, 2, {"gpu0", "gpu1"}).library, CommLibrary::nccl);
  EXPECT_EQ(choose_comm_library("nccl", DeviceKind::cuda, true, 1, {}).library, CommLibrary::nccl);  // world 1 too
  EXPECT_NE(error_of("nccl", DeviceKind::cpu, true, 1, {}).find("--comm nccl needs --device cuda"), std::string::npos);
  EXPECT_NE(error_of("nccl", DeviceKind::sim, true, 1, {}).find("the device is sim"), std::string::npos);
  EXPECT_NE(error_of("nccl", DeviceKind::cuda, false, 1, {}).find("has no NCCL"), std::string::npos);
  const std::string shared = error_of("nccl", DeviceKind::cuda, true, 3, {"x", "y", "y"});
  EXPECT_NE(shared.find("ranks 1 and 2 share one GPU (y)"), std::string::npos) << shared;
  EXPECT_NE(shared.find("--comm mpi"), std::string::npos) << shared;
  EXPECT_NE(error_of("gloo", DeviceKind::cuda, true, 1, {}).find("expected nccl or mpi"), std::string::npos);
}

}  // namespace
}  // namespace zerone::comm
