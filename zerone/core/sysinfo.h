// Facts about the machine this process runs on (for `zerone info` and kernel dispatch).
// Thread-safety: pure queries, safe from any thread.
#pragma once

#include <string>

namespace zerone {

struct CpuInfo {
  std::string model_name;
  int logical_cores = 0;
  bool avx2 = false;
  bool avx512f = false;
  bool avx512_bf16 = false;
  bool amx_tile = false;
  bool amx_bf16 = false;
};

CpuInfo cpu_info();
// Physical memory in bytes (0 if unknown).
long long physical_memory_bytes();
// The last-level cache of the whole machine, in bytes: the largest of sysconf's figure (the CPU's
// own report, which in a VM can be the host package's) and sysfs's per-instance size times its
// instances among the online CPUs. 0 if unknown.
long long last_level_cache_bytes();
// Memory this process could still take, in bytes: /proc/meminfo's MemAvailable, lowered to the
// room left under a cgroup v2 limit (memory.max - memory.current) when one is set. 0 if unknown.
long long available_memory_bytes();

}  // namespace zerone
