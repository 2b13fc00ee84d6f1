// Traffic: the bytes this process's collectives send, split into bytes to peers on the same host
// and bytes to peers on other hosts (Note [Counting traffic]). One process-wide counter, read per
// step by the trainer (metrics comm_bytes, comm_bytes_intra, comm_bytes_inter).
//
// Note [Counting traffic]: a collective is counted as the bytes this rank must send to each peer
// for it, the volume of the direct (one message per peer) algorithm, which for all-gather,
// reduce-scatter and all-to-all is also the ring algorithm's per-rank total:
//   all-gather of b bytes per rank    b to every peer
//   reduce-scatter of s elements      peer p's shard, 4 s bytes, to every peer
//   all-reduce of n elements of e B   2 n e / world to every peer (reduce-scatter + all-gather)
//   broadcast of b bytes              b to every peer, from the root only
//   all-to-all of b bytes per block   b to every peer
// Each peer's part is intra-host or inter-host by the peer's host (Note [Hosts of ranks] in
// communicator.h), so the split is the one a topology-aware library would see; the MPI library's
// own algorithm may route differently, the total per rank is the same. Counted when a collective
// is submitted (by the MPI communicator, so staged device collectives count once).
//
// Thread-safety: add() and totals() from any thread (relaxed atomics).
#pragma once

#include <atomic>
#include <cstdint>

#include "zerone/comm/communicator.h"

namespace zerone::comm {

struct TrafficBytes {
  uint64_t intra = 0, inter = 0;
  uint64_t total() const { return intra + inter; }
  TrafficBytes operator-(const TrafficBytes& o) const { return {intra - o.intra, inter - o.inter}; }
};

class Traffic {
 public:
  static Traffic& global();
  void add(bool same_host, uint64_t bytes) {
    (same_host ? intra_ : inter_).fetch_add(bytes, std::memory_order_relaxed);
  }
  TrafficBytes totals() const { return {intra_.load(std::memory_order_relaxed), inter_.load(std::memory_order_relaxed)}; }

 private:
  std::atomic<uint64_t> intra_{0}, inter_{0};
};

// Note [Counting traffic]: counts one collective of this member (`rank` of `hosts`' members):
// `to_peer(p)` bytes to each member p != rank, intra-host or inter-host by p's host.
template <typename F> void count_traffic(const Hosts& hosts, int rank, F to_peer) {
  Traffic& traffic = Traffic::global();
  const int mine = hosts.of_member[static_cast<size_t>(rank)];
  for (int p = 0; p < static_cast<int>(hosts.of_member.size()); ++p)
    if (p != rank) traffic.add(hosts.of_member[static_cast<size_t>(p)] == mine, static_cast<uint64_t>(to_peer(p)));
}

}  // namespace zerone::comm
