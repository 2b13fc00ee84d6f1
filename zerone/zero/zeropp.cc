#include "zerone/zero/zeropp.h"

#include <algorithm>
#include <utility>

#include "zerone/core/error.h"

namespace zerone::zero {

bool zeropp_enabled(const ZeroConfig& config) {
  return config.hpz_partition_size > 1 || config.quantized_weights || config.quantized_gradients_bits > 0;
}

void check_zeropp(const ZeroConfig& config, int world) {
  ZERONE_CHECK(config.hpz_partition_size >= 1, "--hpz-partition-size ", config.hpz_partition_size,
               " is out of range: expected 1 (off) or a number of ranks that divides the world size");
  ZERONE_CHECK(config.quantized_gradients_bits == 0 || config.quantized_gradients_bits == 4 ||
                   config.quantized_gradients_bits == 8,
               "--quantized-gradients ", config.quantized_gradients_bits, " is not supported: expected 8 or 4 (bits)");
  if (!zeropp_enabled(config)) return;
  const char* which = config.hpz_partition_size > 1 ? "--hpz-partition-size (zero_hpz_partition_size)"
                      : config.quantized_weights  ? "--quantized-weights (zero_quantized_weights)"
                                                  : "--quantized-gradients (zero_quantized_gradients)";
  ZERONE_CHECK(config.stage == 3, which, " needs --zero-stage 3 (ZeRO++ partitions and quantizes stage 3's "
               "parameter gathers and gradient reductions); this run has stage ", config.stage);
  ZERONE_CHECK(world % config.hpz_partition_size == 0, "--hpz-partition-size ", config.hpz_partition_size,
               " does not divide the world size ", world, ": expected a divisor, usually the ranks per host");
}

std::string describe_zeropp(const ZeroConfig& config, const comm::Hosts& hosts) {
  std::string out;
  auto add = [&](const std::string& s) { out += (out.empty() ? "" : ", ") + s; };
  const int world = static_cast<int>(hosts.of_member.size());
  if (config.hpz_partition_size > 1) {
    const int h = config.hpz_partition_size;
    bool within = true;
    for (int r = 0; r < world; ++r) within = within && hosts.of_member[r] == hosts.of_member[r / h * h];
    add(str_cat("hpZ groups of ", h, " ranks (", within ? "within hosts" : "spanning hosts", ")"));
  }
  if (config.quantized_weights) add("qwZ int8");
  if (config.quantized_gradients_bits > 0)
    add(str_cat("qgZ int", config.quantized_gradients_bits,
                uniform_hosts(hosts) && hosts.count() > 1 && hosts.count() < world ? " (within then across hosts)"
                                                                                   : " (one all-to-all)"));
  return out;
}

size_t secondary_partition_bytes(const std::vector<size_t>& unit_numels, int world, DType dtype,
                                 const ZeroConfig& config) {
  if (config.stage != 3 || config.hpz_partition_size <= 1) return 0;
  size_t bytes = 0;
  for (size_t n : unit_numels) {
    const UnitShard s = unit_shard(n, world, 0, config);
    if (!s.persistent) bytes += s.padded_numel / static_cast<size_t>(config.hpz_partition_size) * dtype_size(dtype);
  }
  return bytes;
}

WorkingSetBytes zeropp_working_set_bytes(const std::vector<size_t>& unit_numels, int world, DType dtype,
                                         const ZeroConfig& config) {
  WorkingSetBytes b;
  if (config.stage != 3 || (!config.quantized_weights && config.quantized_gradients_bits == 0)) return b;
  // The same sums as working_set_bytes (partition.cc): all units and the sharded ones.
  size_t top1 = 0, sum_p = 0, sharded1 = 0, sharded2 = 0, sum_sharded_p = 0;
  for (size_t numel : unit_numels) {
    const UnitShard s = unit_shard(numel, world, 0, config);
    top1 = std::max(top1, s.padded_numel);
    sum_p += s.padded_numel;
    if (s.persistent) continue;
    if (s.padded_numel > sharded1) sharded2 = std::exchange(sharded1, s.padded_numel);
    else if (s.padded_numel > sharded2) sharded2 = s.padded_numel;
    sum_sharded_p += s.padded_numel;
  }
  const size_t W = static_cast<size_t>(world);
  auto ceil_div = [](size_t a, size_t d) { return (a + d - 1) / d; };
  int64_t device = 0, shard_place = 0;
  if (config.quantized_weights) {  // qwZ
    const size_t gathered = std::min(sum_sharded_p, sharded1 + sharded2 + config.prefetch_numel);
    device += static_cast<int64_t>(ceil_div(17 * gathered, 16));
    shard_place = static_cast<int64_t>(ceil_div(17 * gathered, 16 * W));
  }
  if (const size_t bits = static_cast<size_t>(config.quantized_gradients_bits); bits > 0) {  // qgZ
    const size_t reducing = std::min(sum_p, std::max(config.reduce_bucket_numel, top1) + top1);
    device += static_cast<int64_t>(ceil_div((2 * bits + 1) * reducing, 8) + 4 * (reducing / W));
    device += static_cast<int64_t>(ceil_div((2 * bits + 1) * top1, 8) + 2 * top1);  // the within-host step
  }
  (void)dtype;  // the bound is in elements of the packed forms, whatever the compute dtype
  b.comm = device;
  if (config.offload_param == OffloadDevice::none) b.comm += shard_place;
  else b.host = shard_place;
  return b;
}

namespace {
std::vector<size_t> unit_numels(const std::vector<UnitShard>& shards) {
  std::vector<size_t> out;
  for (const UnitShard& s : shards) out.push_back(s.numel);
  return out;
}
}  // namespace

ZeroPlusPlus::ZeroPlusPlus(comm::Communicator& world, kernels::Backend& device, BufferPool& pool,
                           const ZeroConfig& config, DType dtype, const std::vector<UnitShard>& shards)
    : world_(world),
      device_(device),
      pool_(pool),
      host_pool_(static_cast<size_t>(zeropp_working_set_bytes(unit_numels(shards), world.world_size(), dtype, config).host),
                 MemCategory::comm, MemPlace::host),
      config_(config),
      dtype_(dtype),
      dsize_(dtype_size(dtype)),
      rank_(world.rank()),
      world_size_(world.world_size()),
      secondary_(shards.size()),
      secondary_current_(shards.size(), 0),
      bits_(config.quantized_gradients_bits) {
  check_zeropp(config, world_size_);
  const int h = config.hpz_partition_size;
  if (h > 1) {
    group_ = world.split(rank_ / h, rank_);
    // Note [Secondary partition]: allocated once, refilled by each step's first gather.
    for (size_t u = 0; u < shards.size(); ++u)
      if (!shards[u].persistent)
        secondary_[u] = Buffer(shards[u].padded_numel / static_cast<size_t>(h) * dsize_, MemCategory::param,
                               MemPlace::device);
  }
  if (bits_ > 0) {
    const comm::Hosts& hosts = world.hosts();
    if (uniform_hosts(hosts) && hosts.count() > 1 && hosts.count() < world_size_) {
      hosts_ = hosts.count();
      per_host_ = world_size_ / hosts_;
      within_ = world.split(rank_ / per_host_, rank_);
      across_owned_ = world.split(rank_ % per_host_, rank_);
      across_ = across_owned_.get();
    } else {
      hosts_ = world_size_;  // flat: every rank its own "host"
      per_host_ = 1;
      across_ = &world_;
    }
  }
}

void ZeroPlusPlus::drop_secondaries() { std::fill(secondary_current_.begin(), secondary_current_.end(), 0); }

// A pooled buffer that goes back to its pool when the last reference (the Work's continuation) drops.
std::shared_ptr<Buffer> ZeroPlusPlus::pooled(size_t bytes, MemPlace place) {
  BufferPool& from = place == MemPlace::host ? host_pool_ : pool_;
  return std::shared_ptr<Buffer>(new Buffer(from.acquire(bytes, MemCategory::comm, /*zeroed=*/false)),
                                 [&from](Buffer* b) {
                                   from.release(std::move(*b));
                                   delete b;
                                 });
}

// Note [Secondary partition]: member l of a group of H holds elements [l P/H, (l+1) P/H) of the
// unit's padded P; the group's all-gather of those slices is the whole unit, in order.
comm::Work ZeroPlusPlus::gather_params(int u, const void* shard, void* full, size_t shard_numel) {
  const size_t S = shard_numel, W = static_cast<size_t>(world_size_);
  if (secondary_current_[u]) return group_->all_gather_async(secondary_[u].data(), full, secondary_[u].bytes());
  if (!config_.quantized_weights) return world_.all_gather_async(shard, full, S * dsize_);
  // Note [Quantized gathers]: quantized where the shard lives (an offloaded shard on the host).
  const size_t Q = kernels::quantized_bytes(S, 8, kQuantBlock);
  const MemPlace shard_place = device_.place_of(shard);
  std::shared_ptr<Buffer> mine = pooled(Q, shard_place), all = pooled(W * Q, MemPlace::device);
  kernels::backend_for(shard_place).quantize_blockwise(shard, dtype_, S, 8, kQuantBlock, mine->data());
  comm::Work work = world_.all_gather_async(mine->data(), all->data(), Q);
  return comm::Work::then(std::move(work), [this, mine, all, full, S, Q, W] {
    for (size_t r = 0; r < W; ++r)
      device_.dequantize_blockwise(all->as<char>() + r * Q, S, 8, kQuantBlock,
                                   static_cast<char*>(full) + r * S * dsize_, dtype_, /*accumulate=*/false);
  });
}

void ZeroPlusPlus::gathered(int u, const void* full, size_t shard_numel) {
  if (!group_ || secondary_[u].empty() || secondary_current_[u]) return;
  const size_t slice_bytes = secondary_[u].bytes();
  ZERONE_ASSERT(slice_bytes == shard_numel * static_cast<size_t>(world_size_) / static_cast<size_t>(group_->world_size()) * dsize_,
                "hpZ: unit ", u, "'s secondary copy has ", slice_bytes, " bytes");
  device_.copy_on_device(secondary_[u].data(), static_cast<const char*>(full) + group_->rank() * slice_bytes, slice_bytes);
  secondary_current_[u] = 1;
}

// Note [Quantized reduce-scatter]: with N hosts of L ranks, rank n*L + l ends with shard n*L + l.
// Step 1 (within host n, all-to-all): member l' receives, from every member, the N shards
// {n'*L + l'} it will need, quantized one shard at a time, and sums their decodings: the host-sums
// of its column's shards. Step 2 (across the N ranks of local index l, all-to-all): member n'
// receives every host's host-sum of shard n'*L + l, quantized, and sums their decodings into its
// shard. Flat (L = 1, N = world): step 2 alone, on the raw gradients.
comm::Work ZeroPlusPlus::reduce_scatter(const float* in, float* out, size_t shard_numel) {
  ZERONE_ASSERT(bits_ > 0 && in != out, "quantized reduce-scatter: not configured, or in place");
  const size_t S = shard_numel, N = static_cast<size_t>(hosts_), L = static_cast<size_t>(per_host_);
  const size_t Q = kernels::quantized_bytes(S, bits_, kQuantBlock);
  auto quantize = [&](const float* src, char* dst) {
    device_.quantize_blockwise(src, DType::f32, S, bits_, kQuantBlock, dst);
  };
  std::shared_ptr<Buffer> host_sums;  // N shards (f32): the host-sums of shards n'*L + l
  const float* column = in;           // shard n' of this rank's column at column + n'*S
  if (L > 1) {
    std::shared_ptr<Buffer> send = pooled(L * N * Q, MemPlace::device), recv = pooled(L * N * Q, MemPlace::device);
    for (size_t dest = 0; dest < L; ++dest)
      for (size_t n = 0; n < N; ++n) quantize(in + (n * L + dest) * S, send->as<char>() + (dest * N + n) * Q);
    within_->all_to_all_async(send->data(), recv->data(), N * Q).wait();
    host_sums = pooled(N * S * sizeof(float), MemPlace::device);
    device_.fill_zero(host_sums->data(), host_sums->bytes());
    for (size_t src = 0; src < L; ++src)
      for (size_t n = 0; n < N; ++n)
        device_.dequantize_blockwise(recv->as<char>() + (src * N + n) * Q, S, bits_, kQuantBlock,
                                     host_sums->as<float>() + n * S, DType::f32, /*accumulate=*/true);
    column = host_sums->as<float>();
  }
  if (N == 1) {  // one host: its sum is the result
    device_.copy_any(out, column, S * sizeof(float));
    return comm::Work();
  }
  std::shared_ptr<Buffer> send = pooled(N * Q, MemPlace::device), recv = pooled(N * Q, MemPlace::device);
  for (size_t n = 0; n < N; ++n) quantize(column + n * S, send->as<char>() + n * Q);
  comm::Work work = across_->all_to_all_async(send->data(), recv->data(), Q);
  return comm::Work::then(std::move(work), [this, send, recv, out, S, Q, N] {
    std::shared_ptr<Buffer> sum = pooled(S * sizeof(float), MemPlace::device);
    device_.fill_zero(sum->data(), sum->bytes());
    for (size_t n = 0; n < N; ++n)
      device_.dequantize_blockwise(recv->as<char>() + n * Q, S, bits_, kQuantBlock, sum->as<float>(), DType::f32,
                                   /*accumulate=*/true);
    device_.copy_any(out, sum->data(), S * sizeof(float));
  });
}

}  // namespace zerone::zero
