// The Communicator contract (zerone/comm/communicator.h), checked on the real implementation: the
// same binary runs at world 1 (single-process communicator) and under `mpiexec -n 3` (MPI, odd
// world size). Every rank runs the same tests in the same order and uses only non-fatal EXPECTs,
// so a failure never leaves a peer waiting in a collective.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <memory>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "zerone/comm/communicator.h"
#include "zerone/comm/device_communicator.h"
#include "zerone/comm/mpi_communicator.h"
#include "zerone/core/error.h"
#include "zerone/kernels/backend.h"
#include "zerone/kernels/sim/sim_backend.h"

namespace zerone::comm {
namespace {

std::unique_ptr<Communicator> g_comm;

Communicator& comm() { return *g_comm; }

TEST(Communicator, RanksAreDistinctAndAgreeOnTheWorld) {
  const int world = comm().world_size(), rank = comm().rank();
  ASSERT_GE(world, 1);
  int32_t mine[2] = {rank, world};
  std::vector<int32_t> all(2 * world, -1);
  comm().all_gather(mine, all.data(), sizeof mine);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(all[2 * r], r);
    EXPECT_EQ(all[2 * r + 1], world);
  }
}

TEST(Communicator, AllReduceSumsFloatsAndDoubles) {
  const int world = comm().world_size(), rank = comm().rank();
  // 1001 elements: not a multiple of anything the implementation might chunk by.
  std::vector<float> f(1001);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i % 7) + static_cast<float>(rank);
  comm().all_reduce_sum(f.data(), f.size());
  const float rank_sum = static_cast<float>(world * (world - 1) / 2);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(f[i], static_cast<float>(world * (i % 7)) + rank_sum) << i;
  EXPECT_DOUBLE_EQ(comm().all_reduce_sum(0.25 * (rank + 1)), 0.25 * world * (world + 1) / 2);
}

TEST(Communicator, ReduceScatterOutOfPlaceAndInPlace) {
  const int world = comm().world_size(), rank = comm().rank();
  const size_t shard = 130;
  std::vector<float> in(shard * world);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * (rank + 1);
  const float factor = static_cast<float>(world * (world + 1) / 2);  // sum over r of (r + 1)
  std::vector<float> out(shard, -1.0f);
  comm().reduce_scatter_sum(in.data(), out.data(), shard);
  for (size_t i = 0; i < shard; ++i) EXPECT_EQ(out[i], static_cast<float>(rank * shard + i) * factor) << i;
  // In place: this rank's reduced shard lands at the start of the buffer.
  comm().reduce_scatter_sum(in.data(), in.data(), shard);
  for (size_t i = 0; i < shard; ++i) EXPECT_EQ(in[i], static_cast<float>(rank * shard + i) * factor) << i;
}

TEST(Communicator, AllGatherOutOfPlaceAndInPlace) {
  const int world = comm().world_size(), rank = comm().rank();
  const size_t shard = 37;  // bytes: gathers move raw bytes of any dtype
  std::vector<uint8_t> mine(shard), full(shard * world, 0xEE);
  for (size_t i = 0; i < shard; ++i) mine[i] = static_cast<uint8_t>(rank * 50 + i);
  comm().all_gather(mine.data(), full.data(), shard);
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < shard; ++i) EXPECT_EQ(full[r * shard + i], static_cast<uint8_t>(r * 50 + i));
  std::vector<uint8_t> in_place(shard * world, 0xEE);
  std::memcpy(in_place.data() + rank * shard, mine.data(), shard);
  comm().all_gather(in_place.data() + rank * shard, in_place.data(), shard);
  EXPECT_EQ(in_place, full);
}

TEST(Communicator, StridedAllGatherFillsOneSliceOfEverySlot) {
  // The engine's allgather_bucket_size slices: slot r of `full` is rank r's shard (S elements);
  // gathering slices [off, off + n) of every shard, slice by slice, rebuilds every slot, in place
  // (stages 1-2) and from a separate shard buffer (stage 3).
  const int world = comm().world_size(), rank = comm().rank();
  const size_t S = 100;
  auto value = [](int r, size_t i) { return static_cast<uint16_t>(1000 * r + i); };
  std::vector<uint16_t> shard(S), expected(S * world);
  for (size_t i = 0; i < S; ++i) shard[i] = value(rank, i);
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < S; ++i) expected[r * S + i] = value(r, i);
  for (size_t slice : {size_t{1}, size_t{33}, size_t{100}, size_t{250}}) {
    std::vector<uint16_t> from_shard(S * world, 0xFFFF), in_place(S * world, 0xFFFF);
    std::memcpy(in_place.data() + rank * S, shard.data(), S * 2);
    std::vector<Work> pending;
    for (size_t off = 0; off < S; off += slice) {
      const size_t n = std::min(slice, S - off);
      pending.push_back(comm().all_gather_strided_async(shard.data() + off, from_shard.data() + off, n * 2, S * 2));
      pending.push_back(comm().all_gather_strided_async(in_place.data() + rank * S + off, in_place.data() + off, n * 2,
                                                        S * 2));
    }
    for (Work& w : pending) w.wait();
    EXPECT_EQ(from_shard, expected) << "slice " << slice;
    EXPECT_EQ(in_place, expected) << "slice " << slice;
  }
}

TEST(Communicator, BroadcastFromTheLastRankAndBarrier) {
  const int world = comm().world_size(), rank = comm().rank();
  std::vector<double> data(17, rank == world - 1 ? 3.5 : -1.0);
  comm().broadcast(data.data(), data.size() * sizeof(double), world - 1);
  for (double x : data) EXPECT_EQ(x, 3.5);
  comm().barrier();
}

TEST(Communicator, ManyOutstandingOperationsCompleteInAnyWaitOrder) {
  const int world = comm().world_size();
  std::vector<std::vector<float>> buffers(20, std::vector<float>(4096, 1.0f));
  std::vector<Work> works;
  for (auto& b : buffers) works.push_back(comm().all_reduce_sum_async(b.data(), b.size()));
  for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();  // newest first
  for (const Work& w : works) EXPECT_TRUE(w.ready());
  for (const auto& b : buffers) EXPECT_EQ(b.front(), static_cast<float>(world));
  EXPECT_TRUE(Work().ready());  // an empty Work never blocks
}

TEST(Communicator, CountsBeyondMpiLimitsAreErrorsNotCrashes) {
  if (comm().world_size() == 1) GTEST_SKIP() << "world 1 moves no data";
  // Thrown on every rank before anything is submitted, so no peer is left waiting. The pointers
  // are never touched.
  float dummy = 0.0f;
  EXPECT_THROW(comm().all_reduce_sum_async(&dummy, size_t{INT_MAX} + 1), Error);
  EXPECT_THROW(comm().reduce_scatter_sum_async(&dummy, &dummy + 1, size_t{INT_MAX} + 1), Error);
  EXPECT_THROW(comm().all_gather_strided_async(&dummy, &dummy, 4, size_t{INT_MAX}), Error);
  comm().barrier();  // still usable
}

// Note [A failed worker fails fast] (mpi_communicator.cc): a worker of its own, no MPI calls.
TEST(MpiWorker, EverythingQueuedBehindAFailureFailsAtOnceWithItsMessage) {
  MpiWorker worker;
  std::atomic<int> ran{0};
  Work failing = worker.submit([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others queue meanwhile
    throw Error("all-gather #7 (step 2) timed out");
  });
  std::vector<Work> behind;
  for (int i = 0; i < 3; ++i) behind.push_back(worker.submit([&] { ++ran; }));
  auto message_of = [](Work& w) {
    try {
      w.wait();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  // Waited on in any order, every Work reports the first failure itself.
  for (Work& w : behind) EXPECT_EQ(message_of(w), "all-gather #7 (step 2) timed out");
  EXPECT_EQ(message_of(failing), "all-gather #7 (step 2) timed out");
  Work later = worker.submit([&] { ++ran; });  // submitted after the failure: fails the same way
  EXPECT_EQ(message_of(later), "all-gather #7 (step 2) timed out");
  EXPECT_EQ(ran.load(), 0);
}

TEST(Communicator, SplitGroupsRanksByColorInKeyOrder) {
  const int world = comm().world_size(), rank = comm().rank();
  // Even and odd ranks, each group ordered by descending rank (the key).
  std::unique_ptr<Communicator> group = comm().split(rank % 2, world - rank);
  const int members = (world + 1 - rank % 2) / 2;
  ASSERT_EQ(group->world_size(), members);
  std::vector<int> ranks_in_group;
  for (int r = world - 1; r >= 0; --r)
    if (r % 2 == rank % 2) ranks_in_group.push_back(r);
  EXPECT_EQ(ranks_in_group[group->rank()], rank);
  // A collective stays inside the group: the sum of the group's world ranks.
  float mine = static_cast<float>(rank);
  group->all_reduce_sum(&mine, 1);
  float want = 0.0f;
  for (int r : ranks_in_group) want += static_cast<float>(r);
  EXPECT_EQ(mine, want);
  // The ranks of one host: every rank here runs on this machine.
  std::unique_ptr<Communicator> host = comm().split_by_host();
  EXPECT_EQ(host->world_size(), world);
  EXPECT_EQ(host->rank(), rank);
  EXPECT_DOUBLE_EQ(host->all_reduce_sum(1.0), static_cast<double>(world));
  comm().barrier();
}

// Note [Collective endpoints]: the same collectives over device buffers of the simulated device,
// whose memory the host cannot touch (DeviceCommunicator stages them through host memory), and of
// the cpu device (handed straight through).
class DeviceCollectives : public ::testing::TestWithParam<kernels::DeviceKind> {};

TEST_P(DeviceCollectives, ReduceScatterAllGatherAllReduceBroadcast) {
  kernels::Backend& device = kernels::backend(GetParam());
  DeviceCommunicator dcomm(comm(), device);
  EXPECT_EQ(dcomm.staged(), !device.host_addressable() && comm().world_size() > 1);  // alone: copies on the device
  const int world = comm().world_size(), rank = comm().rank();
  const size_t shard = 130;
  auto on_device = [&](size_t bytes) { return Buffer(bytes, MemCategory::scratch, MemPlace::device, 64, device.device_arena()); };
  auto to_host = [&](const Buffer& b) {
    std::vector<float> h(b.bytes() / sizeof(float));
    device.copy_to_host(h.data(), b.data(), b.bytes());
    return h;
  };
  std::vector<float> in(shard * world);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * (rank + 1);
  const float factor = static_cast<float>(world * (world + 1) / 2);
  Buffer d_in = on_device(in.size() * sizeof(float)), d_out = on_device(shard * sizeof(float));
  device.copy_to_device(d_in.data(), in.data(), d_in.bytes());
  dcomm.reduce_scatter_sum(d_in.as<float>(), d_out.as<float>(), shard);
  std::vector<float> out = to_host(d_out);
  for (size_t i = 0; i < shard; ++i) EXPECT_EQ(out[i], static_cast<float>(rank * shard + i) * factor) << i;
  // In place: the shard lands at in_place_shard_offset (MPI: the start).
  dcomm.reduce_scatter_sum(d_in.as<float>(), d_in.as<float>(), shard);
  std::vector<float> inplace = to_host(d_in);
  const size_t at = dcomm.in_place_shard_offset(shard);
  for (size_t i = 0; i < shard; ++i) EXPECT_EQ(inplace[at + i], static_cast<float>(rank * shard + i) * factor) << i;
  // A strided all-gather writes only the slots: the bytes between them keep their values.
  const size_t S = 8, stride = 12;
  std::vector<float> slots(stride * world, -7.0f), mine(S);
  for (size_t i = 0; i < S; ++i) mine[i] = static_cast<float>(100 * rank + i);
  Buffer d_slots = on_device(slots.size() * sizeof(float)), d_mine = on_device(S * sizeof(float));
  device.copy_to_device(d_slots.data(), slots.data(), d_slots.bytes());
  device.copy_to_device(d_mine.data(), mine.data(), d_mine.bytes());
  dcomm.all_gather_strided_async(d_mine.data(), d_slots.data(), S * sizeof(float), stride * sizeof(float)).wait();
  std::vector<float> gathered = to_host(d_slots);
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < stride; ++i)
      EXPECT_EQ(gathered[r * stride + i], i < S ? static_cast<float>(100 * r + i) : -7.0f) << r << " " << i;
  // All-reduce and broadcast.
  std::vector<float> ones(1001, 1.0f);
  Buffer d_ones = on_device(ones.size() * sizeof(float));
  device.copy_to_device(d_ones.data(), ones.data(), d_ones.bytes());
  Work pending = dcomm.all_reduce_sum_async(d_ones.as<float>(), ones.size());
  pending.wait();
  EXPECT_TRUE(pending.ready());
  for (float x : to_host(d_ones)) EXPECT_EQ(x, static_cast<float>(world));
  std::vector<float> value(5, rank == 0 ? 2.5f : 0.0f);
  Buffer d_value = on_device(value.size() * sizeof(float));
  device.copy_to_device(d_value.data(), value.data(), d_value.bytes());
  dcomm.broadcast(d_value.data(), d_value.bytes(), 0);
  for (float x : to_host(d_value)) EXPECT_EQ(x, 2.5f);
  comm().barrier();
}

// Note [Asynchronous copies]: alone, a reduce-scatter into host memory (an offloaded gradient
// accumulator) and a gather from it (an offloaded parameter shard) are copies on the copy streams;
// their Work is the copy's end. The simulated device defers them (Note [Deferred copies]): the
// result reads as NaN until the Work is waited for.
TEST(DeviceCollectivesAlone, CopiesAcrossPlacesAreAsynchronous) {
  if (comm().world_size() != 1) GTEST_SKIP() << "a lone rank's collectives";
  auto& sim = dynamic_cast<kernels::sim::SimBackend&>(kernels::backend(kernels::DeviceKind::sim));
  DeviceCommunicator dcomm(comm(), sim);
  const size_t n = 77;
  std::vector<float> in(n), out(n, 0.0f);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>(i) + 0.5f;
  Buffer d(n * sizeof(float), MemCategory::scratch, MemPlace::device, 64, sim.device_arena());
  sim.copy_to_device(d.data(), in.data(), d.bytes());
  const uint64_t before = sim.copies_deferred();
  Work down = dcomm.reduce_scatter_sum_async(d.as<float>(), out.data(), n);  // device -> host
  EXPECT_EQ(sim.copies_deferred(), before + 1);
  EXPECT_TRUE(std::isnan(out[0]));
  down.wait();
  EXPECT_EQ(out, in);
  Buffer d2(n * sizeof(float), MemCategory::scratch, MemPlace::device, 64, sim.device_arena());
  Work up = dcomm.all_gather_strided_async(out.data(), d2.data(), d2.bytes(), d2.bytes());  // host -> device
  EXPECT_EQ(sim.copies_deferred(), before + 2);
  up.wait();
  std::vector<float> back(n);
  sim.copy_to_host(back.data(), d2.data(), d2.bytes());
  EXPECT_EQ(back, in);
  // Within the device: at once, nothing deferred.
  dcomm.reduce_scatter_sum_async(d.as<float>(), d2.as<float>(), n).wait();
  EXPECT_EQ(sim.copies_deferred(), before + 2);
}

INSTANTIATE_TEST_SUITE_P(Devices, DeviceCollectives,
                         ::testing::Values(kernels::DeviceKind::cpu, kernels::DeviceKind::sim),
                         [](const ::testing::TestParamInfo<kernels::DeviceKind>& info) {
                           return std::string(kernels::device_kind_name(info.param));
                         });

}  // namespace
}  // namespace zerone::comm

namespace {
// Ranks other than 0 report only their failures, prefixed with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed())
      std::fprintf(stderr, "rank %d: %s:%d: failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                   result.line_number(), result.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  zerone::comm::g_comm = zerone::comm::make_communicator();
  if (const int rank = zerone::comm::g_comm->rank(); rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  int result = RUN_ALL_TESTS();
  zerone::comm::g_comm.reset();  // MPI_Finalize before exit
  return result;
}
