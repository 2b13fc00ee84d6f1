#include "zerone/comm/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "zerone/comm/traffic.h"
#include "zerone/core/error.h"

namespace zerone::comm {

Work::Work(std::shared_future<void> done, std::function<void()> on_complete)
    : state_(std::make_shared<State>()) {
  state_->done = std::move(done);
  state_->on_complete = std::move(on_complete);
}

Work::Work(kernels::Event done_on_device) : state_(std::make_shared<State>()) {
  state_->on_device = true;
  state_->event = std::move(done_on_device);
}

void Work::wait_on(kernels::Backend& backend, kernels::Stream stream) {
  if (state_ && state_->on_device) return backend.wait(stream, state_->event);
  wait();
}

Work Work::then(Work before, std::function<void()> on_complete) {
  Work work;
  work.state_ = std::make_shared<State>();
  work.state_->before = std::move(before.state_);
  work.state_->on_complete = std::move(on_complete);
  return work;
}

void Work::wait() {
  if (!state_) return;
  if (state_->before) {
    Work before;
    before.state_ = state_->before;
    before.wait();
  } else if (state_->on_device) {
    state_->event.wait();
  } else {
    state_->done.get();  // rethrows the collective's error
  }
  if (state_->on_complete) std::call_once(state_->completed, state_->on_complete);
}

bool Work::ready() const {
  if (!state_) return true;
  if (state_->before) {
    Work before;
    before.state_ = state_->before;
    return before.ready();
  }
  if (state_->on_device) return state_->event.ready();
  return state_->done.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

namespace {
// A finished Work, made once: world-1 collectives are called for every unit of every step.
Work done() {
  static const std::shared_future<void> ready = [] {
    std::promise<void> p;
    p.set_value();
    return p.get_future().share();
  }();
  static const Work work(ready);
  return work;
}
}  // namespace

Work SingleProcessCommunicator::all_reduce_sum_async(float*, size_t) { return done(); }
Work SingleProcessCommunicator::all_reduce_sum_async(double*, size_t) { return done(); }
Work SingleProcessCommunicator::reduce_scatter_sum_async(const float* in, float* out, size_t shard_n) {
  if (in != out) std::memmove(out, in, shard_n * sizeof(float));  // rank 0's shard is the start
  return done();
}
Work SingleProcessCommunicator::all_gather_strided_async(const void* in, void* out, size_t bytes, size_t) {
  if (in != out) std::memmove(out, in, bytes);
  return done();
}
Work SingleProcessCommunicator::broadcast_async(void*, size_t, int root) {
  ZERONE_ASSERT(root == 0);
  return done();
}
Work SingleProcessCommunicator::barrier_async() { return done(); }
Work SingleProcessCommunicator::all_to_all_async(const void* in, void* out, size_t bytes) {
  ZERONE_ASSERT(in != out, "all-to-all is not in place");
  std::memmove(out, in, bytes);
  return done();
}
const Hosts& SingleProcessCommunicator::hosts() const {
  if (hosts_.names.empty()) hosts_ = Hosts{{this_hostname()}, {0}};
  return hosts_;
}

Traffic& Traffic::global() {
  static Traffic traffic;
  return traffic;
}

std::string this_hostname() {
  char name[256] = "";
  ::gethostname(name, sizeof name - 1);
  return name;
}

bool uniform_hosts(const Hosts& hosts) {
  const int world = static_cast<int>(hosts.of_member.size()), n = hosts.count();
  if (n == 0 || world % n != 0) return false;
  const int per = world / n;
  for (int r = 0; r < world; ++r)
    if (hosts.of_member[r] != r / per) return false;
  return true;
}

std::string describe_topology(const Hosts& hosts) {
  const int world = static_cast<int>(hosts.of_member.size()), n = hosts.count();
  std::vector<std::vector<int>> ranks(n);
  for (int r = 0; r < world; ++r) ranks[hosts.of_member[r]].push_back(r);
  size_t lo = ranks.empty() ? 0 : ranks[0].size(), hi = lo;
  for (const auto& v : ranks) lo = std::min(lo, v.size()), hi = std::max(hi, v.size());
  std::string out = lo == hi ? str_cat(n, n == 1 ? " host" : " hosts", n == 1 ? ", " : " x ", lo, lo == 1 ? " rank" : " ranks")
                             : str_cat(n, " hosts, ", lo, "-", hi, " ranks each");
  out += " (";
  for (int h = 0; h < n; ++h) {
    out += str_cat(h ? ", " : "", hosts.names[h], ": rank", ranks[h].size() == 1 ? " " : "s ");
    // Consecutive ranks as ranges: 0-1, 4, 6-7.
    for (size_t i = 0; i < ranks[h].size();) {
      size_t j = i;
      while (j + 1 < ranks[h].size() && ranks[h][j + 1] == ranks[h][j] + 1) ++j;
      out += str_cat(i ? "," : "", ranks[h][i], j > i ? str_cat("-", ranks[h][j]) : "");
      i = j + 1;
    }
  }
  return out + ")";
}
std::unique_ptr<Communicator> SingleProcessCommunicator::split(int, int) {
  return std::make_unique<SingleProcessCommunicator>();
}
std::unique_ptr<Communicator> SingleProcessCommunicator::split_by_host() {
  return std::make_unique<SingleProcessCommunicator>();
}

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "SLURM_PROCID"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

}  // namespace zerone::comm
