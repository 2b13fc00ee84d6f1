// NcclCommunicator on the GPU (Note [NCCL collectives] in comm/nccl_communicator.h), at world 1
// (a SingleProcessCommunicator bootstraps it; the lent machine has one GPU): every collective of
// the interface over device buffers, the layouts it states, Work's event semantics, splits, and
// DeviceCommunicator handing device buffers to it and host buffers to the host communicator.
// The expected values are written for any world size. Part of kernels_test so that the GPU run's
// filters ('*Cuda*', '*Nccl*') pick it; SKIPPED without NCCL built or without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "zerone/comm/comm_choice.h"
#include "zerone/comm/device_communicator.h"
#include "zerone/core/memory.h"
#include "zerone/kernels/backend.h"

namespace zerone::comm {
namespace {

using kernels::DeviceKind;

bool gpu_present() {
  for (DeviceKind kind : kernels::available_devices())
    if (kind == DeviceKind::cuda) return true;
  return false;
}

#define ZERONE_SKIP_WITHOUT_NCCL_GPU()                                                      \
  do {                                                                                      \
    if (!nccl_compiled_in()) GTEST_SKIP() << "this build has no NCCL";                      \
    if (!gpu_present()) GTEST_SKIP() << "no CUDA GPU (or no CUDA backend) on this machine"; \
  } while (0)

// Device buffers of the cuda backend, filled from and read back to host vectors.
struct Gpu {
  kernels::Backend& device = kernels::backend(DeviceKind::cuda);
  Buffer make(size_t bytes) { return Buffer(bytes, MemCategory::scratch, MemPlace::device, 256, device.device_arena()); }
  template <typename T> Buffer from(const std::vector<T>& host) {
    Buffer b = make(host.size() * sizeof(T));
    device.copy_to_device(b.data(), host.data(), b.bytes());
    return b;
  }
  template <typename T> std::vector<T> read(const Buffer& b) {
    std::vector<T> host(b.bytes() / sizeof(T));
    device.copy_to_host(host.data(), b.data(), b.bytes());
    return host;
  }
};

TEST(NcclBuild, VersionIsTheLinkedLibrarys) {
  if (!nccl_compiled_in()) {
    EXPECT_EQ(nccl_version(), "");
    GTEST_SKIP() << "this build has no NCCL";
  }
  EXPECT_EQ(nccl_version().rfind("2.", 0), 0u) << nccl_version();
}

TEST(NcclCommunicatorCuda, EveryCollectiveOverDeviceBuffers) {
  ZERONE_SKIP_WITHOUT_NCCL_GPU();
  SingleProcessCommunicator host;
  Gpu gpu;
  std::unique_ptr<Communicator> nccl = make_nccl_communicator(host, gpu.device);
  const int world = nccl->world_size(), rank = nccl->rank();
  const size_t W = static_cast<size_t>(world), R = static_cast<size_t>(rank);
  EXPECT_EQ(world, host.world_size());
  EXPECT_EQ(rank, host.rank());
  EXPECT_NE(nccl->description().find("NCCL 2."), std::string::npos) << nccl->description();
  EXPECT_EQ(nccl->in_place_shard_offset(7), R * 7);  // NCCL's slot
  const float factor = static_cast<float>(world * (world + 1) / 2);  // sum over ranks of (r + 1)

  // All-reduce, f32 and f64, on an odd count; Work is event-like.
  const size_t n = 1001;
  std::vector<float> xs(n);
  for (size_t i = 0; i < n; ++i) xs[i] = static_cast<float>(i) * static_cast<float>(rank + 1);
  Buffer d_xs = gpu.from(xs);
  Work work = nccl->all_reduce_sum_async(d_xs.as<float>(), n);
  work.wait_on(gpu.device, kernels::Stream::compute);  // the read-back below is ordered after it
  std::vector<float> summed = gpu.read<float>(d_xs);
  EXPECT_TRUE(work.ready());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(summed[i], static_cast<float>(i) * factor) << i;
  std::vector<double> ds(3, 0.25 * (rank + 1));
  Buffer d_ds = gpu.from(ds);
  nccl->all_reduce_sum_async(d_ds.as<double>(), ds.size()).wait();
  for (double d : gpu.read<double>(d_ds)) EXPECT_EQ(d, 0.25 * factor);

  // Reduce-scatter: out of place to `out`, in place to rank * shard.
  const size_t shard = 130;
  std::vector<float> in(shard * W);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * static_cast<float>(rank + 1);
  Buffer d_in = gpu.from(in), d_out = gpu.make(shard * sizeof(float));
  nccl->reduce_scatter_sum(d_in.as<float>(), d_out.as<float>(), shard);
  std::vector<float> out = gpu.read<float>(d_out);
  for (size_t i = 0; i < shard; ++i) ASSERT_EQ(out[i], static_cast<float>(R * shard + i) * factor) << i;
  nccl->reduce_scatter_sum(d_in.as<float>(), d_in.as<float>(), shard);
  std::vector<float> inplace = gpu.read<float>(d_in);
  for (size_t i = 0; i < shard; ++i) ASSERT_EQ(inplace[R * shard + i], static_cast<float>(R * shard + i) * factor) << i;

  // All-gather: plain, in place (this rank's part already in its slot), and strided (the bytes
  // between the slots keep their values).
  const size_t S = 8, stride = 12;
  std::vector<float> mine(S);
  for (size_t i = 0; i < S; ++i) mine[i] = static_cast<float>(100 * rank + static_cast<int>(i));
  Buffer d_mine = gpu.from(mine), d_all = gpu.make(W * S * sizeof(float));
  nccl->all_gather(d_mine.data(), d_all.data(), S * sizeof(float));
  std::vector<float> all = gpu.read<float>(d_all);
  for (size_t r = 0; r < W; ++r)
    for (size_t i = 0; i < S; ++i) ASSERT_EQ(all[r * S + i], static_cast<float>(100 * r + i)) << r << " " << i;
  std::vector<float> slots_in(W * S, -1.0f);
  std::memcpy(slots_in.data() + R * S, mine.data(), S * sizeof(float));
  Buffer d_inplace = gpu.from(slots_in);
  nccl->all_gather(d_inplace.as<float>() + R * S, d_inplace.data(), S * sizeof(float));
  EXPECT_EQ(gpu.read<float>(d_inplace), all);
  Buffer d_slots = gpu.from(std::vector<float>(stride * W, -7.0f));
  nccl->all_gather_strided_async(d_mine.data(), d_slots.data(), S * sizeof(float), stride * sizeof(float)).wait();
  std::vector<float> gathered = gpu.read<float>(d_slots);
  for (size_t r = 0; r < W; ++r)
    for (size_t i = 0; i < stride; ++i)
      ASSERT_EQ(gathered[r * stride + i], i < S ? static_cast<float>(100 * r + i) : -7.0f) << r << " " << i;

  // Broadcast from rank 0; all-to-all of one block per rank.
  Buffer d_value = gpu.from(std::vector<float>(5, rank == 0 ? 2.5f : 0.0f));
  nccl->broadcast(d_value.data(), d_value.bytes(), 0);
  for (float x : gpu.read<float>(d_value)) EXPECT_EQ(x, 2.5f);
  std::vector<int32_t> blocks(W * 3);
  for (size_t b = 0; b < W; ++b)
    for (size_t i = 0; i < 3; ++i) blocks[b * 3 + i] = static_cast<int32_t>(1000 * R + 10 * b + i);  // to member b
  Buffer d_blocks = gpu.from(blocks), d_received = gpu.make(blocks.size() * sizeof(int32_t));
  nccl->all_to_all_async(d_blocks.data(), d_received.data(), 3 * sizeof(int32_t)).wait();
  std::vector<int32_t> received = gpu.read<int32_t>(d_received);
  for (size_t r = 0; r < W; ++r)
    for (size_t i = 0; i < 3; ++i) ASSERT_EQ(received[r * 3 + i], static_cast<int32_t>(1000 * r + 10 * R + i)) << r;

  // Sub-communicators: all ranks in one color, and the ranks of this host.
  std::unique_ptr<Communicator> same = nccl->split(0, rank);
  EXPECT_EQ(same->world_size(), world);
  Buffer d_one = gpu.from(std::vector<float>(4, 1.0f));
  same->all_reduce_sum(d_one.as<float>(), 4);
  for (float x : gpu.read<float>(d_one)) EXPECT_EQ(x, static_cast<float>(world));
  std::unique_ptr<Communicator> local = nccl->split_by_host();
  EXPECT_EQ(local->world_size(), world);  // every rank of this test runs on this machine
  nccl->barrier();
}

TEST(NcclCommunicatorCuda, DeviceCommunicatorSendsDeviceBuffersToNcclAndHostBuffersToTheHost) {
  ZERONE_SKIP_WITHOUT_NCCL_GPU();
  SingleProcessCommunicator host;
  Gpu gpu;
  std::unique_ptr<Communicator> nccl = make_nccl_communicator(host, gpu.device);
  DeviceCommunicator dcomm(host, gpu.device, nccl.get());
  EXPECT_TRUE(dcomm.native());
  EXPECT_FALSE(dcomm.staged());
  EXPECT_EQ(dcomm.in_place_shard_offset(9), nccl->in_place_shard_offset(9));
  EXPECT_EQ(dcomm.description(), nccl->description());
  const float world = static_cast<float>(dcomm.world_size());
  // Device memory: NCCL's Work (complete once its event is).
  Buffer d = gpu.from(std::vector<float>(33, 1.5f));
  Work work = dcomm.all_reduce_sum_async(d.as<float>(), 33);
  work.wait();
  EXPECT_TRUE(work.ready());
  for (float x : gpu.read<float>(d)) EXPECT_EQ(x, 1.5f * world);
  // A host scalar (the gradient norm's sum) and a host shard: through the host communicator.
  EXPECT_EQ(dcomm.all_reduce_sum(0.5), 0.5 * dcomm.world_size());
  std::vector<float> host_in(4 * static_cast<size_t>(dcomm.world_size()), 2.0f), host_out(4, 0.0f);
  dcomm.reduce_scatter_sum(host_in.data(), host_out.data(), 4);
  for (float x : host_out) EXPECT_EQ(x, 2.0f * world);
  // Mixed: a host shard gathered into device memory is staged.
  Buffer d_all = gpu.make(host_out.size() * static_cast<size_t>(dcomm.world_size()) * sizeof(float));
  dcomm.all_gather(host_out.data(), d_all.data(), host_out.size() * sizeof(float));
  for (float x : gpu.read<float>(d_all)) EXPECT_EQ(x, 2.0f * world);
}

}  // namespace
}  // namespace zerone::comm
