#include "zerone/core/sysinfo.h"

#include <cpuid.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>

namespace zerone {

CpuInfo cpu_info() {
  CpuInfo info;
  info.logical_cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) info.model_name = line.substr(colon + 2);
      break;
    }
  }
  __builtin_cpu_init();
  info.avx2 = __builtin_cpu_supports("avx2");
  info.avx512f = __builtin_cpu_supports("avx512f");
  unsigned eax, ebx, ecx, edx;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) info.avx512_bf16 = (eax >> 5) & 1;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    info.amx_bf16 = (edx >> 22) & 1;
    info.amx_tile = (edx >> 24) & 1;
  }
  return info;
}

long long physical_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<long long>(pages) * page_size : 0;
}

namespace {

// The first number in `path` (e.g. "max" gives none), or -1.
long long read_number(const char* path) {
  std::ifstream in(path);
  long long value = -1;
  if (in >> value) return value;
  return -1;
}

}  // namespace

long long last_level_cache_bytes() {
  long long best = std::max(0L, sysconf(_SC_LEVEL3_CACHE_SIZE));
  // sysfs: cpuN/cache/indexK with the highest level; one instance per distinct shared_cpu_list.
  std::set<std::string> instances;
  long long instance_bytes = 0;
  int top_level = 0;
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  for (long cpu = 0; cpu < cpus; ++cpu)
    for (int index = 0; index < 8; ++index) {
      const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cache/index" + std::to_string(index);
      const long long level = read_number((dir + "/level").c_str());
      if (level < 0) break;
      std::ifstream size_in(dir + "/size"), shared_in(dir + "/shared_cpu_list");
      long long kib = 0;
      std::string shared;
      if (!(size_in >> kib) || !(shared_in >> shared) || level < top_level) continue;
      if (level > top_level) {
        top_level = static_cast<int>(level);
        instances.clear();
      }
      instance_bytes = kib * 1024;  // "32768K"
      instances.insert(shared);
    }
  return std::max(best, instance_bytes * static_cast<long long>(instances.size()));
}

// Note [Memory available to this process]: MemAvailable is the host's view; a container or a
// systemd slice can cap the process far lower. The cap is read from this process's own cgroup
// (/proc/self/cgroup): with cgroup v2 the "0::/path" line, whose memory.max and memory.current apply
// at each level up to the root; with v1 the "memory" controller's memory.limit_in_bytes and
// memory.usage_in_bytes. The tightest room wins.
long long available_memory_bytes() {
  long long available = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemAvailable:", 0) == 0) {
      available = std::stoll(line.substr(13)) * 1024;  // "MemAvailable:   123456 kB"
      break;
    }
  }
  auto lower_to = [&](long long limit, long long used) {
    if (limit <= 0 || used < 0 || limit >= (1LL << 60)) return;  // "max" or no limit
    long long room = limit > used ? limit - used : 0;
    if (available == 0 || room < available) available = room;
  };
  std::ifstream groups("/proc/self/cgroup");
  for (std::string line; std::getline(groups, line);) {
    // "hierarchy-id:controllers:path"
    size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (controllers.empty()) {  // cgroup v2: every level from the process's group up to the root
      for (;;) {
        const std::string dir = "/sys/fs/cgroup" + (path == "/" ? std::string() : path);
        lower_to(read_number((dir + "/memory.max").c_str()), read_number((dir + "/memory.current").c_str()));
        if (path.empty() || path == "/") break;
        path = path.substr(0, path.rfind('/'));
        if (path.empty()) path = "/";
      }
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {  // cgroup v1
      const std::string dir = "/sys/fs/cgroup/memory" + (path == "/" ? std::string() : path);
      lower_to(read_number((dir + "/memory.limit_in_bytes").c_str()), read_number((dir + "/memory.usage_in_bytes").c_str()));
    }
  }
  return available;
}

}  // namespace zerone
