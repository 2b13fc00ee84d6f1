// Does communication overlap computation? (issue 3: "OpenMPI does not progress non-blocking
// collectives in the background by itself; measure that it overlaps.")
//
//   mpiexec -n 2 build/bench/bench_comm_overlap [MiB]
//
// For the collectives the ZeRO engine issues (f32 reduce-scatter, bf16-sized all-gather, f32
// all-reduce) of one unit's size, rank 0 prints:
//   comm      the collective alone (started and waited for at once)
//   compute   work that takes about as long as the collective: a compute-bound loop (registers
//             only), which needs this rank's core, or a sleep, which leaves the core free (the
//             case of a rank with a spare core, or of a host thread waiting on a GPU)
//   both      the collective started, the loop run, then waited for
//   hidden    (comm + compute - both) / comm: the share of the communication hidden behind the loop
// once through zerone's communication thread (Communicator::*_async) and once the textbook way
// (MPI_I* on the calling thread, MPI_Wait after the loop), which OpenMPI does not progress in
// between. Each figure is the median of 15 repetitions. With as many ranks as cores, a busy loop
// leaves no core for the communication to run on, whoever drives it: expect ~0% hidden there, and
// the difference between the two drivers in the "sleep" rows.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include "zerone/comm/communicator.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Compute-bound: 8 independent FMA chains; the result is consumed so the loop stays.
volatile float g_sink;
void compute(long iterations) {
  float a[8] = {1, 1.1f, 1.2f, 1.3f, 1.4f, 1.5f, 1.6f, 1.7f};
  for (long i = 0; i < iterations; ++i)
    for (float& x : a) x = x * 0.9999999f + 1e-7f;
  g_sink = a[0] + a[7];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs `body` `reps` times between barriers and returns the median of rank 0's times.
double timed(zerone::comm::Communicator& comm, int reps, const std::function<void()>& body) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    comm.barrier();
    auto t0 = Clock::now();
    body();
    t.push_back(seconds_since(t0));
  }
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  const double mib = argc > 1 ? std::atof(argv[1]) : 16.0;
  auto comm = zerone::comm::make_communicator();
  const int world = comm->world_size(), rank = comm->rank();
  if (world < 2) {
    std::fprintf(stderr, "run under mpiexec with at least 2 ranks\n");
    return 2;
  }
  const size_t n = static_cast<size_t>(mib * 1024 * 1024 / 4) / world * world;  // f32 elements, divisible
  std::vector<float> grads(n, 1.0f), shard(n / world);
  std::vector<uint16_t> params(n);  // bf16-sized
  const int reps = 15;

  struct Op {
    const char* name;
    std::function<zerone::comm::Work()> thread;  // zerone: on the communication thread
    std::function<void(MPI_Request*)> start;     // textbook: non-blocking on this thread
  };
  const int shard_n = static_cast<int>(n / world), shard_bytes = static_cast<int>(n / world * 2);
  std::vector<Op> ops = {
      {"reduce-scatter f32",
       [&] { return comm->reduce_scatter_sum_async(grads.data(), shard.data(), n / world); },
       [&](MPI_Request* r) {
         MPI_Ireduce_scatter_block(grads.data(), shard.data(), shard_n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, r);
       }},
      {"reduce-scatter f32 in place",
       [&] { return comm->reduce_scatter_sum_async(grads.data(), grads.data(), n / world); },
       [&](MPI_Request* r) {
         MPI_Ireduce_scatter_block(MPI_IN_PLACE, grads.data(), shard_n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, r);
       }},
      {"all-gather bf16",
       [&] { return comm->all_gather_async(params.data() + rank * (n / world), params.data(), n / world * 2); },
       [&](MPI_Request* r) {
         MPI_Iallgather(MPI_IN_PLACE, 0, MPI_BYTE, params.data(), shard_bytes, MPI_BYTE, MPI_COMM_WORLD, r);
       }},
      {"all-reduce f32",
       [&] { return comm->all_reduce_sum_async(grads.data(), n); },
       [&](MPI_Request* r) {
         MPI_Iallreduce(MPI_IN_PLACE, grads.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, r);
       }},
  };

  if (rank == 0) {
    std::printf("world %d, %.1f MiB of f32 gradients per collective (%s)\n", world, mib, comm->description().c_str());
    std::printf("%-28s %-6s %-20s %9s %9s %9s %8s\n", "collective", "work", "progress", "comm ms", "work ms", "both ms",
                "hidden");
  }
  for (const Op& op : ops) {
    const double comm_s = timed(*comm, reps, [&] { op.thread().wait(); });
    // Size the loop to the collective (calibrated on rank 0, broadcast so every rank runs the same).
    long iterations = 1 << 20;
    double per_iteration = timed(*comm, 3, [&] { compute(iterations); }) / static_cast<double>(iterations);
    long target = static_cast<long>(comm_s / per_iteration);
    comm->broadcast(&target, sizeof target, 0);
    for (bool busy : {true, false}) {
      auto work = [&] {
        if (busy) compute(target);
        else std::this_thread::sleep_for(std::chrono::duration<double>(comm_s));
      };
      const double work_s = timed(*comm, reps, work);
      const double thread_s = timed(*comm, reps, [&] {
        zerone::comm::Work w = op.thread();
        work();
        w.wait();
      });
      // The textbook way, with the communication thread idle (every Work above was waited for, so
      // MPI_THREAD_SERIALIZED holds).
      const double textbook_s = timed(*comm, reps, [&] {
        MPI_Request request;
        op.start(&request);
        work();
        MPI_Wait(&request, MPI_STATUS_IGNORE);
      });
      if (rank == 0) {
        auto row = [&](const char* how, double both) {
          std::printf("%-28s %-6s %-20s %9.2f %9.2f %9.2f %7.0f%%\n", op.name, busy ? "busy" : "sleep", how, comm_s * 1e3,
                      work_s * 1e3, both * 1e3, 100.0 * (comm_s + work_s - both) / comm_s);
        };
        row("zerone comm thread", thread_s);
        row("MPI_I* + MPI_Wait", textbook_s);
      }
    }
  }
  return 0;
}
