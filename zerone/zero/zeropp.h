// ZeRO++ (Wang et al. 2023, DeepSpeed's zero_hpz_partition_size, zero_quantized_weights,
// zero_quantized_gradients): stage 3 with less communication across hosts.
//
//   hpZ  Note [Secondary partition]: after a unit's gather from the primary shards (all ranks),
//        each rank keeps a secondary copy of 1/H of the gathered unit, where H is
//        hpz_partition_size; the unit's later gathers (its backward, the next micro-steps) come
//        from the H ranks of its group only, consecutive ranks, so within a host when H divides
//        the ranks per host. The values are the gathered bits: the trajectory is plain stage 3's,
//        bit for bit. Costs P/H of each sharded unit in device memory (category param), allocated
//        with the engine and kept (as DeepSpeed's ds_secondary_tensor): model state in the ledger
//        and in `zerone estimate` (secondary_partition_bytes). A step's update makes the copies
//        stale; the next forward's primary gather refills them.
//   qwZ  Note [Quantized gathers]: the primary gather moves each rank's shard blockwise int8 (Note
//        [Blockwise quantization] in kernels/cpu/quantize.h) and every rank, its own slot too,
//        decodes all slots, so every rank computes with the same decoded parameters (the master
//        and the optimizer see the exact shard). Forward and backward decode the same values.
//   qgZ  Note [Quantized reduce-scatter]: the gradient reduce-scatter as all-to-alls of blockwise
//        int8 or int4: within each host (the host-sum of the shards the rank's column needs,
//        dequantized and summed in f32, in member order), then across hosts among the ranks of the
//        same local index (the host-sums of each shard, dequantized and summed into it). Hosts of
//        unequal size or interleaved ranks: one all-to-all over the world. The intra-host step is
//        waited for where the reduction starts (so every rank issues the inter-host all-to-all at
//        the same point of its program, Note [Communication thread]); the inter-host step overlaps
//        the backward like any reduction.
// Their communication buffers (quantized shards, all-to-all send and receive, decoded sums) come
// from the engine's working-set pool, within the bound of Note [ZeRO++ working set].
// Every feature is off by default and needs stage 3 (ZeroPlusPlus::check). They change results
// (but hpZ): the start-up line names them.
//
// Thread-safety: driven by the engine's training thread, as the engine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "zerone/comm/communicator.h"
#include "zerone/core/dtype.h"
#include "zerone/core/memory.h"
#include "zerone/kernels/backend.h"
#include "zerone/zero/partition.h"

namespace zerone::zero {

// Elements per quantization block (one f32 scale each: 1.6% of the int8 volume).
constexpr size_t kQuantBlock = 256;

// True when config asks for any of hpZ, qwZ, qgZ.
bool zeropp_enabled(const ZeroConfig& config);
// Throws Error for a request that cannot be honoured: a feature below stage 3, an hpZ group size
// that does not divide the world, quantized gradient bits other than 4 or 8.
void check_zeropp(const ZeroConfig& config, int world);
// "hpZ groups of 2 ranks (within hosts), qwZ int8, qgZ int4 (within then across hosts)", or "".
std::string describe_zeropp(const ZeroConfig& config, const comm::Hosts& hosts);
// Device bytes of hpZ's secondary partition (model state, category param): the sum over sharded
// units of padded_numel / H elements of `dtype`; 0 without hpZ or below stage 3. zerone estimate's
// term and what the engine allocates.
size_t secondary_partition_bytes(const std::vector<size_t>& unit_numels, int world, DType dtype, const ZeroConfig& config);

// Note [ZeRO++ working set]: the quantized communication buffers, pooled with the engine's other
// transients (Note [Working-set bound] in partition.h), are bounded per rank by (P, S = P / W the
// padded unit and shard, W the world, b the qgZ bits, Q_b(S) = quantized_bytes(S, b, kQuantBlock)):
//   qwZ    each gather in flight holds the rank's quantized shard Q_8(S) (on the shard's place:
//          the host with --offload-param) and all ranks' W Q_8(S) (device) until it is waited for.
//          The gathers in flight are among the gathered units, G = min(sum P, P_1 + P_2 + F)
//          elements (the param bound). S is a multiple of 64 and P >= 64 W, so
//          W Q_8(S) <= P + P/64 + 3W <= 17/16 P: device ceil(17 G / 16), shard place ceil(17 G / (16 W)).
//   qgZ    each reduction in flight holds its all-to-all's send and receive, at most 2 W Q_b(S)
//          <= (2b + 1) P / 8 (the same argument), and the decoded sum, 4 S; the reductions in
//          flight are those of the comm bound, R = min(sum P, max(B, P_1) + P_1) elements:
//          ceil((2b + 1) R / 8) + 4 R / W. Hierarchical (hosts of L >= 2 ranks) the within-host
//          step runs one unit at a time, before that unit's reduction is in flight: its send,
//          receive and host-sums (4 N S = 4 P / L <= 2 P) add at most ceil((2b + 1) P_1 / 8) + 2 P_1.
//          The estimate does not know the hosts: the bound holds for any layout.
// Stage 3 only, 0 without qwZ and qgZ. `comm` (device) and `host` fields; the rest 0.
WorkingSetBytes zeropp_working_set_bytes(const std::vector<size_t>& unit_numels, int world, DType dtype,
                                         const ZeroConfig& config);

class ZeroPlusPlus {
 public:
  // Collective over `world` (it splits the host groups): every rank constructs it. `world` is the
  // engine's device communicator, `pool` its working-set pool (device), both must outlive this
  // object. `shards`: every unit's shard; hpZ allocates the secondary copies of the sharded units
  // (not persistent) here, which throws Error like Buffer when device memory runs out.
  ZeroPlusPlus(comm::Communicator& world, kernels::Backend& device, BufferPool& pool, const ZeroConfig& config,
               DType dtype, const std::vector<UnitShard>& shards);

  // Starts the gather of unit u's full parameters (padded: world * shard_numel elements of dtype)
  // into `full`: from the group's secondary copies when this rank holds one (hpZ), else from the
  // primary shard `shard` (device or host memory), quantized with qwZ.
  comm::Work gather_params(int u, const void* shard, void* full, size_t shard_numel);
  // After the gather of u completed: refreshes the secondary copy (hpZ; no-op if current or off).
  void gathered(int u, const void* full, size_t shard_numel);
  // u's parameters are about to change (its update, or any step): its secondary copy is stale
  // (kept allocated; the next gather from the primary shards refills it).
  void drop_secondary(int u) { secondary_current_[u] = 0; }
  void drop_secondaries();

  bool quantizes_gradients() const { return bits_ > 0; }
  // The reduce-scatter of the gradients `in` (world * shard_numel, device) into `out` (shard_numel,
  // device or host; not `in`), with qgZ.
  comm::Work reduce_scatter(const float* in, float* out, size_t shard_numel);

 private:
  // `bytes` of the pool of `place` (device: the engine's; host: host_pool_), tagged comm; back to
  // that pool when the last reference drops (on the training thread: the Work's continuation).
  std::shared_ptr<Buffer> pooled(size_t bytes, MemPlace place);

  comm::Communicator& world_;
  kernels::Backend& device_;
  BufferPool& pool_;       // device: quantized gathers and reductions (Note [ZeRO++ working set])
  BufferPool host_pool_;   // host: qwZ's quantized shard when the shards are offloaded
  ZeroConfig config_;
  DType dtype_;
  size_t dsize_;
  int rank_, world_size_;
  // hpZ.
  std::unique_ptr<comm::Communicator> group_;  // the H consecutive ranks of this rank's group
  std::vector<Buffer> secondary_;              // per sharded unit (empty: persistent unit or no hpZ)
  std::vector<char> secondary_current_;        // per unit: holds the parameters of this step
  // qgZ: the hosts (within_: this host's ranks; across_: the ranks of this local index); flat
  // (one all-to-all over the world) when hosts are uneven or interleaved.
  int bits_ = 0;
  std::unique_ptr<comm::Communicator> within_, across_owned_;
  comm::Communicator* across_ = nullptr;
  int hosts_ = 1, per_host_ = 1;
};

}  // namespace zerone::zero
